#!/usr/bin/env python3
"""Quantum SDKs through qrtd: real `qrtd run` + qpu-aer (qiskit-aer
executing OpenQASM 3) + the Qiskit backend qrtd_qiskit.

  1. qpus.list serves the [qpu.device] facts; the backend's target has them.
  2. Bell (1000 shots): only 00 and 11, each >= 35 %; GHZ: only 000 and 111;
     X on qubit 1 gives "10" (bit order); two circuits in one run each get
     their own counts.  BackendSamplerV2 gives the Bell distribution.
  3. A job asked for inside a blackout starts in the next window and carries
     that window's calibration id (qpu-aer follows the same schedule and
     checks it at arrival).
  4. An impossible deadline raises no_fit with the next possible start; a
     cancel before the start ends `cancelled` and never reaches qpu-aer.
  5. Bad input (not OpenQASM 3, too many qubits, shots 0 or too large) is a
     clear error at submit, by the backend and by qrtd (a raw envelope), with
     nothing dispatched; a program qpu-aer cannot parse fails the job with the
     wire's error naming the line.  str() of an error is "message (reason)".
  6. Over qrtd's network listener (QRT_SOCKET=tcp://..., as a Slurm step on a
     compute node has it; a munged of the test's own): the backend
     authenticates with MUNGE and runs a job; munged missing is said so.

Behaviour only, never timings.  Runs in build/venv (tools/integrations/qiskit/sdk_venv.sh).
As root qrtd runs the deployed way (user qrtd, from the shipped sysusers.d).
Environment: QRTD, QPU_AER (tools/endpoints/qpu-aer/qpu_aer.py), QRT_E2E_DIR.
"""

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import unittest

# qrt_client and qrtd_qiskit as pip installed them into the venv (first, so
# test_e2e's path to the source tree does not shadow them).
import qrt_client
from qiskit import QuantumCircuit
from qiskit.primitives import BackendSamplerV2
from qiskit.providers import JobStatus
from qrtd_qiskit import QrtdBackend, QrtdError, QrtdJobError

from qrtd_lab import QrtdLab, base  # noqa: E402  (the harness shared with the control stacks' tests)

QRTD = os.environ.get("QRTD", "")
QPU_AER = os.environ.get("QPU_AER", "")
MS = 1_000_000
PERIOD = 1_000_000_000
BLACKOUT = 200_000_000

DEVICE = """
[qpu.device]
qubits = 3
technology = "superconducting"
basis_gates = ["rz", "sx", "x", "h", "cx", "measure"]
coupling_map = [[0, 1], [1, 0], [1, 2], [2, 1]]
gate_durations_ns = { cx = 300, sx = 35, x = 35, rz = 0, measure = 1000 }
max_shots = 20000
"""


def bell():
    qc = QuantumCircuit(2, 2, name="bell")
    qc.h(0)
    qc.cx(0, 1)
    qc.measure([0, 1], [0, 1])
    return qc


def x_on_1():
    qc = QuantumCircuit(2, 2, name="x1")
    qc.x(1)
    qc.measure([0, 1], [0, 1])
    return qc


def envelope(qasm, qubits=2, shots=100):
    return json.dumps({"format": "qasm3", "shots": shots,
                       "circuits": [{"name": "raw", "qubits": qubits, "qasm": qasm}]}).encode()


BELL_QASM = ('OPENQASM 3.0;\ninclude "stdgates.inc";\nbit[2] c;\nqubit[2] q;\nh q[0];\ncx q[0], q[1];\n'
             'c[0] = measure q[0];\nc[1] = measure q[1];\n')


class Qiskit(QrtdLab, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not QRTD or not QPU_AER:
            raise unittest.SkipTest("QRTD and QPU_AER must name the binaries")
        cls.lab_begin("qrt-qiskit-")
        cls.summary = os.path.join(cls.dir, "aer.json")
        qpu = base.PERIODIC_QPU.replace("blackout_ns = 100_000_000", f"blackout_ns = {BLACKOUT}")
        assert f"period_ns = 1_000_000_000" in qpu and str(BLACKOUT) in qpu
        # The network listener, when munge is installed: a munged of our own.
        cls.url, cls.munge_sock = cls.start_munged()
        extra = f'listen = "{cls.url}"\nmunge_socket = "{cls.munge_sock}"\n' if cls.url else ""
        cls.config(qpu, rpc_extra=extra, verbatim=DEVICE)
        args = [sys.executable, QPU_AER, "--listen", f"unix://{cls.dir}/qpu0.sock", "--qubits", "3",
                "--max-shots", "20000", "--period-ns", str(PERIOD), "--blackout-ns", str(BLACKOUT),
                "--seed", "7", "--verbose", "--json", "--summary-file", cls.summary, "--duration-s", "300"]
        cls.aer = cls.launch("qpu-aer", args + cls.endpoint_socket_args(), f"{cls.dir}/qpu0.sock", timeout_s=60)
        cls.start_qrtd(up_timeout_s=30)
        cls.backend = QrtdBackend(qpu="qpu0", socket=cls.sock)

    @classmethod
    def start_munged(cls):
        """(tcp:// URL for qrtd to listen on, munged's socket), or (None, None)
        without munge installed.  munged is ended with the other processes."""
        path = "/usr/sbin:/usr/bin:/sbin:/bin"
        munged, mungekey = shutil.which("munged", path=path), shutil.which("mungekey", path=path)
        if not munged or not mungekey:
            return None, None
        d = os.path.join(cls.dir, "munge")
        os.mkdir(d, 0o755)
        key = os.path.join(d, "munge.key")
        subprocess.run([mungekey, "--create", "--keyfile=" + key], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.chmod(key, 0o400)
        sock = os.path.join(d, "munge.sock")
        cls.procs.append(subprocess.Popen(
            [munged, "--foreground", "--force", "--socket=" + sock, "--key-file=" + key,
             "--pid-file=" + os.path.join(d, "munged.pid"), "--seed-file=" + os.path.join(d, "seed"),
             "--log-file=" + os.path.join(d, "munged.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if not base.wait_for(lambda: os.path.exists(sock), 10):
            raise RuntimeError("munged did not create " + sock)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return f"tcp://127.0.0.1:{port}", sock

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "backend", None):
            cls.backend.close()
        cls.lab_end()

    def start(self, duration_ns=10 * MS):
        return self.start_in_window("qpu0", duration_ns, span_ns=3 * PERIOD)

    def run_job(self, circuits, **kw):
        kw.setdefault("not_before_ns", self.start())
        return self.backend.run(circuits, **kw)

    def assert_never_sent(self, job_id):
        st = self.client().jobs_status(job_id)
        self.assertEqual(st["sent_ns"], 0, st)

    def counts(self, job, i=0):
        try:
            return job.result(timeout=30).get_counts(i)
        except QrtdJobError as e:
            self.fail(f"{e}\nqrtd:\n{self.tail('qrtd-0.log')}\nqpu-aer:\n{self.tail('qpu-aer.log')}")

    # ------------------------------------------------------------ facts

    def test_qpus_list_serves_the_device_and_the_target_has_it(self):
        q = [q for q in self.client().qpus() if q["name"] == "qpu0"][0]
        self.assertEqual(q["device"], {"qubits": 3, "technology": "superconducting",
                                       "basis_gates": ["rz", "sx", "x", "h", "cx", "measure"],
                                       "coupling_map": [[0, 1], [1, 0], [1, 2], [2, 1]],
                                       "gate_durations_ns": {"cx": 300, "sx": 35, "x": 35, "rz": 0,
                                                             "measure": 1000},
                                       "max_shots": 20000})
        self.assertIn("calibration_id", q)
        self.assertIn("predicted_fidelity", q)
        t = self.backend.target
        self.assertEqual(t.num_qubits, 3)
        self.assertEqual(sorted(t.build_coupling_map().get_edges()), [(0, 1), (1, 0), (1, 2), (2, 1)])
        self.assertAlmostEqual(t["cx"][(0, 1)].duration, 300e-9)
        self.assertNotIn((0, 2), t["cx"])
        self.assertIn("measure", t.operation_names)

    def test_qpus_list_shows_no_window_inside_a_blackout(self):
        c = self.client()
        seen = {False: 0, True: 0}
        # A reading counts only when the answer came back within the phase it
        # was asked in (a loaded host may delay it); at most 5 periods.
        for _ in range(5):
            if all(seen.values()):
                break
            now = time.time_ns()
            ws = sorted(c.calibration_get("qpu0"), key=lambda w: w["valid_from_ns"])
            k = next(i for i in range(len(ws) - 1) if ws[i]["valid_until_ns"] > now + 50 * MS)
            for lo, hi, inside in ((ws[k]["valid_until_ns"], ws[k + 1]["valid_from_ns"], False),
                                   (ws[k + 1]["valid_from_ns"], ws[k + 1]["valid_until_ns"], True)):
                time.sleep(max(0, (lo + hi) // 2 - time.time_ns()) / 1e9)
                asked = time.time_ns()
                q = [q for q in c.qpus() if q["name"] == "qpu0"][0]
                if not (lo <= asked and time.time_ns() < hi):
                    continue
                seen[inside] += 1
                if inside:
                    self.assertEqual(q["window"]["calibration_id"], ws[k + 1]["calibration_id"], q)
                    # f0 = 0.99 at the window's start, decaying with the default tau.
                    self.assertTrue(0.9 < q["predicted_fidelity"] <= 0.99, q)
                else:
                    self.assertIsNone(q["window"], q)
                    self.assertIsNone(q["predicted_fidelity"], q)
        self.assertTrue(all(seen.values()), f"no timely reading inside and outside a window: {seen}")

    def test_inside_a_slurm_step_run_submits_into_the_steps_reservation(self):
        c = self.client()
        r = c.slots_reserve(duration_ns=2 * MS, idempotency_key="slurm-step-1", qpus=["qpu0"],
                            not_before_ns=self.start())
        env = {"QRT_RESERVATION_ID": str(r["reservation_id"]), "QRT_FENCING_TOKEN": str(r["fencing_token"])}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            job = self.backend.run(bell(), shots=300)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.assertEqual(job.qrtd_job_id, r["reservation_id"])
        self.assertEqual(job.ack["start_ns"], r["start_ns"])
        self.assertEqual(set(self.counts(job)), {"00", "11"})

    # ------------------------------------------------------------ counts

    def test_bell_1000_shots_gives_only_00_and_11_each_at_least_35_percent(self):
        job = self.run_job(bell(), shots=1000)
        counts = self.counts(job)
        self.assertEqual(set(counts), {"00", "11"}, counts)
        self.assertEqual(sum(counts.values()), 1000)
        for k in ("00", "11"):
            self.assertGreaterEqual(counts[k], 350, counts)
        self.assertEqual(job.status(), JobStatus.DONE)
        meta = job.result().metadata
        self.assertEqual(meta["qrtd_job_id"], int(job.job_id()))
        self.assertGreater(meta["calibration_id"], 0)
        self.assertEqual(meta["endpoint_calibration_id"], meta["calibration_id"])
        w = meta["window"]
        self.assertIsNotNone(w)
        self.assertTrue(w["valid_from_ns"] <= meta["start_ns"] < w["valid_until_ns"], meta)
        self.assertIsNotNone(meta["dispatch_lateness_ns"])
        self.assertIsNotNone(meta["arrival_lateness_ns"])
        self.assertTrue(meta["endpoint"].startswith("qpu-aer "), meta)

    def test_ghz_3_qubits_gives_only_000_and_111(self):
        qc = QuantumCircuit(3, 3, name="ghz")
        qc.h(0)
        qc.cx(0, 1)
        qc.cx(1, 2)
        qc.measure(range(3), range(3))
        counts = self.counts(self.run_job(qc, shots=500))
        self.assertEqual(set(counts), {"000", "111"}, counts)
        self.assertEqual(sum(counts.values()), 500)

    def test_x_on_qubit_1_gives_10(self):
        self.assertEqual(self.counts(self.run_job(x_on_1(), shots=200)), {"10": 200})

    def test_two_circuits_in_one_run_each_get_their_own_counts(self):
        job = self.run_job([x_on_1(), bell()], shots=400)
        r = job.result(timeout=30)
        self.assertEqual(r.get_counts(0), {"10": 400})
        self.assertEqual(set(r.get_counts(1)), {"00", "11"})
        self.assertEqual(r.get_counts("x1"), {"10": 400})
        self.assertEqual(len(r.results), 2)

    def test_backend_sampler_v2_gives_the_bell_distribution(self):
        sampler = BackendSamplerV2(backend=self.backend,
                                   options={"run_options": {"not_before_ns": self.start()}})
        res = sampler.run([bell()], shots=1000).result()
        counts = res[0].data.c.get_counts()
        self.assertEqual(set(counts), {"00", "11"}, counts)
        self.assertEqual(sum(counts.values()), 1000)
        for k in ("00", "11"):
            self.assertGreaterEqual(counts[k], 350, counts)

    # ------------------------------------------------------------ placement

    def test_a_job_asked_for_in_a_blackout_starts_in_the_next_window_with_its_id(self):
        c = self.client()
        now = time.time_ns()
        ws = sorted(c.calibration_get("qpu0"), key=lambda w: w["valid_from_ns"])
        # The first blackout at least 1.5 s ahead: [end of window k, start of k+1).
        k = next(i for i in range(len(ws) - 1) if ws[i]["valid_until_ns"] > now + 1500 * MS)
        blackout_mid = ws[k]["valid_until_ns"] + BLACKOUT // 2
        nxt = ws[k + 1]
        self.assertLess(blackout_mid, nxt["valid_from_ns"])
        job = self.backend.run(bell(), shots=100, not_before_ns=blackout_mid)
        self.assertGreaterEqual(job.ack["start_ns"], nxt["valid_from_ns"], job.ack)
        counts = self.counts(job)
        self.assertEqual(set(counts), {"00", "11"})
        meta = job.result().metadata
        self.assertEqual(meta["window"]["calibration_id"], nxt["calibration_id"])
        self.assertTrue(nxt["valid_from_ns"] <= meta["start_ns"] < nxt["valid_until_ns"], meta)
        self.assertEqual(meta["calibration_id"], nxt["calibration_id"])
        # qpu-aer checked the id against the window in force at arrival.
        self.assertEqual(meta["endpoint_calibration_id"], nxt["calibration_id"])

    def test_an_impossible_deadline_raises_no_fit_with_the_next_start(self):
        now = time.time_ns()
        with self.assertRaises(QrtdError) as cm:
            self.backend.run(bell(), shots=100, deadline_ns=now + 1000)
        e = cm.exception
        self.assertEqual(e.reason, "no_fit", e)
        self.assertIsNotNone(e.next_start_ns, e)
        self.assertGreater(e.next_start_ns, now)
        self.assertIn("next possible start", str(e))

    # ------------------------------------------------------------ over tcp://

    def test_over_the_network_listener_the_backend_runs_a_job(self):
        if not self.url:
            self.skipTest("munged and mungekey are not installed (tools/dev/deps.sh installs munge)")
        env = {"QRT_SOCKET": self.url, "QRT_MUNGE_SOCKET": self.munge_sock}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            b = QrtdBackend(qpu="qpu0")  # as a step on a compute node: from the environment
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.addCleanup(b.close)
        self.assertEqual(b.target.num_qubits, 3)
        job = b.run(bell(), shots=300, not_before_ns=self.start())
        self.assertEqual(set(self.counts(job)), {"00", "11"})
        # Named explicitly, and munged missing here: said so, with the reason.
        with self.assertRaises(QrtdError) as cm:
            QrtdBackend(qpu="qpu0", socket=self.url, munge_socket=os.path.join(self.dir, "no-munged.sock"))
        self.assertEqual(cm.exception.reason, "munge_error", cm.exception)
        self.assertIn("munged is not running", str(cm.exception))
        self.assertTrue(str(cm.exception).endswith("(munge_error)"), str(cm.exception))

    def test_cancel_before_the_start_is_cancelled_and_never_reaches_the_endpoint(self):
        job = self.backend.run(bell(), shots=100, not_before_ns=time.time_ns() + 4000 * MS)
        self.assertEqual(job.status(), JobStatus.QUEUED)
        self.assertTrue(job.cancel())
        self.assertEqual(job.status(), JobStatus.CANCELLED)
        with self.assertRaises(QrtdJobError) as cm:
            job.result(timeout=5)
        self.assertEqual(cm.exception.reason, "cancelled")
        # Cancelling again is too late, with qrtd's reason.
        with self.assertRaises(QrtdJobError) as cm:
            job.cancel()
        self.assertEqual(cm.exception.reason, "illegal_transition")
        time.sleep(max(0, (job.ack["end_ns"] - time.time_ns()) / 1e9) + 0.3)
        self.assert_never_sent(job.qrtd_job_id)
        with open(os.path.join(self.dir, "qpu-aer.log")) as f:
            self.assertNotIn(f"qpu-aer: job {job.qrtd_job_id} ", f.read())

    # ------------------------------------------------------------ bad input

    def test_bad_input_is_refused_at_submit_by_the_backend(self):
        wide = QuantumCircuit(4, 4)
        wide.measure(range(4), range(4))
        cases = [(lambda: self.backend.run(wide, shots=10), "needs 4 qubits; qpu0 has 3"),
                 (lambda: self.backend.run(bell(), shots=0), "shots = 0"),
                 (lambda: self.backend.run(bell(), shots=20001), "shots = 20001 is refused"),
                 (lambda: self.backend.run("OPENQASM 2.0; qreg q[2];", shots=10), "is not a QuantumCircuit"),
                 (lambda: self.backend.run(bell(), shots=10, colour="red"), "unknown option 'colour'")]
        for fn, text in cases:
            with self.assertRaises(QrtdError) as cm:
                fn()
            self.assertEqual(cm.exception.reason, "invalid_argument", cm.exception)
            self.assertIn(text, str(cm.exception))
            # What a user prints: the message and the reason, unquoted.
            self.assertEqual(str(cm.exception), f"{cm.exception.message} (invalid_argument)")

    def test_bad_input_is_refused_at_submit_by_qrtd_and_nothing_is_dispatched(self):
        c = self.client()
        cases = [(envelope(BELL_QASM.replace("OPENQASM 3.0", "OPENQASM 2.0")), "is not OpenQASM 3"),
                 (envelope("h q[0];"), "is not OpenQASM 3"),
                 (envelope(BELL_QASM, qubits=5), "a circuit needs 5 qubits; qpu0 has 3"),
                 (envelope(BELL_QASM, shots=0), "shots must be 1 or more"),
                 (envelope(BELL_QASM, shots=20001), "shots = 20001 is more than qpu0 takes (20000)"),
                 (json.dumps({"format": "qasm2", "shots": 1, "circuits": []}).encode(), "not one qrtd knows"),
                 (json.dumps({"format": "qasm3", "shots": 1, "circuits": []}).encode(), "non-empty array")]
        for i, (payload, text) in enumerate(cases):
            with self.assertRaises(qrt_client.RpcError) as cm:
                c.jobs_submit(payload, duration_ns=1 * MS, idempotency_key=f"bad-{i}", qpus=["qpu0"])
            self.assertEqual(cm.exception.reason, "invalid_argument", cm.exception)
            self.assertIn(text, str(cm.exception))
            # What a user prints: the message and the reason, unquoted.
            self.assertEqual(str(cm.exception), f"{cm.exception.message} (invalid_argument)")
            # Nothing was placed under that key: the same key with a good
            # payload is a new job, not the refused one.
        ok = c.jobs_submit(envelope(BELL_QASM), duration_ns=1 * MS, idempotency_key="bad-0", qpus=["qpu0"],
                           not_before_ns=self.start())
        self.assertEqual(ok["state"], "committed", ok)
        # A held reservation refuses it too, and stays held.
        r = c.slots_reserve(duration_ns=1 * MS, idempotency_key="held-bad", qpus=["qpu0"],
                            not_before_ns=self.start())
        with self.assertRaises(qrt_client.RpcError) as cm:
            c.jobs_submit(envelope(BELL_QASM, qubits=4), reservation_id=r["reservation_id"],
                          fencing_token=r["fencing_token"])
        self.assertIn("a circuit needs 4 qubits", str(cm.exception))
        self.assertEqual(c.jobs_status(r["reservation_id"])["state"], "held")
        c.slots_release(r["reservation_id"], r["fencing_token"])

    def test_a_program_qpu_aer_cannot_parse_fails_the_job_naming_the_line(self):
        c = self.client()
        bad = BELL_QASM.replace("cx q[0], q[1];", "cx q[0] q[1];")   # line 6
        ack = c.jobs_submit(envelope(bad), duration_ns=1 * MS, idempotency_key="unparsable", qpus=["qpu0"],
                            not_before_ns=self.start())
        st = base.wait_for(lambda: c.jobs_status(ack["job_id"])["state"] in ("failed", "completed"), 20)
        self.assertTrue(st)
        s = c.jobs_status(ack["job_id"])
        self.assertEqual(s["state"], "failed", s)
        self.assertIn("line 6", s["reason"], s)
        self.assertIn("circuits[0]", s["reason"], s)

    def test_a_circuit_openqasm3_cannot_say_is_refused_at_submit(self):
        from qiskit.circuit import Gate
        qc = QuantumCircuit(1, 1, name="opaque")
        qc.append(Gate("mystery", 1, []), [0])   # no definition: nothing to write
        qc.measure(0, 0)
        with self.assertRaises(QrtdError) as cm:
            self.backend.run(qc, shots=10)
        self.assertEqual(cm.exception.reason, "invalid_argument")
        self.assertIn("cannot write the circuits as OpenQASM 3", str(cm.exception))

    def test_a_job_that_failed_raises_from_result_with_the_endpoints_reason(self):
        from qrtd_qiskit import QrtdJob
        c = self.client()
        bad = BELL_QASM.replace("h q[0];", "hadamard q[0];")   # line 5: no such gate
        ack = c.jobs_submit(envelope(bad), duration_ns=1 * MS, idempotency_key="failing", qpus=["qpu0"],
                            not_before_ns=self.start())
        job = QrtdJob(self.backend, ack, [bell()], 100)
        with self.assertRaises(QrtdJobError) as cm:
            job.result(timeout=30)
        self.assertEqual(cm.exception.reason, "qpu_error", cm.exception)
        self.assertIn("line 5", str(cm.exception))
        self.assertEqual(job.status(), JobStatus.ERROR)

if __name__ == "__main__":
    unittest.main(verbosity=2)
