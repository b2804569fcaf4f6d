#!/usr/bin/env python3
"""MQT Core's QDMI driver (the pinned mqt.core from PyPI) on libqrtd-qdmi.so.

The driver loads the library through its manifest (qrtd-qdmi.qdmi.json,
mqt.core.qdmi.builtin_driver.add_manifest) and talks to a real `qrtd run`
whose QPU qpu0 runs on qpu-aer (OpenQASM 3 on qiskit-aer) or, where this
tree has no qpu-aer, on qpu-sim (pseudo-random counts: the mechanics only):

  - it lists the device with its name and qubit count (sites, operations
    and coupling map from qrtd's [qpu.device] facts);
  - status reads CALIBRATION during a blackout, IDLE inside a window;
  - a Bell circuit through QDMI comes back with 1000 shots, only 00 and 11
    each >= 35 % on qpu-aer;
  - a job asked for during a blackout waits (wait(1) times out) and starts
    in the next window, with that window's calibration id;
  - a reservation booked beforehand, carried in the session's custom1 and
    custom2, takes the job into its slot;
  - a program that is not OpenQASM 3 and shots 0 are refused at submit;
  - MQT Core's Qiskit backend (mqt.core.plugins.qiskit.QDMIBackend) on the
    device: its target has the QPU's qubits and basis gates, and a Bell
    circuit run through it gives 00/11 (needs Qiskit: run_mqt.sh runs this
    file with the SDK venv's python when there is one).

  - the same device over tcp:// (the lab's rpc.listen, MUNGE) runs a Bell
    circuit, where munge is installed.

Run by ctest (qdmi.mqt_driver) through run_mqt.sh: the pinned mqt.core
unpacked in the cache (tools/integrations/qdmi/qdmi-cache.sh) on the path.  Asserts
behaviour, never timings.  Environment: QRTD, QPU_SIM (or QPU_AER),
QRT_PYTHON_DIR, QRTD_QDMI_MANIFEST.
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qdmi_lab  # noqa: E402

try:
    import mqt.core.qdmi as qdmi
    from mqt.core.qdmi import builtin_driver
except ImportError as e:  # pragma: no cover - the venv holds it
    print(f"SKIP: mqt.core is not importable here: {e}")
    sys.exit(77)

MANIFEST = os.environ.get("QRTD_QDMI_MANIFEST", "")
DEVICE_ID = "qrtd.default"
BELL = """OPENQASM 3.0;
include "stdgates.inc";
qubit[2] q;
bit[2] c;
h q[0];
cx q[0], q[1];
c = measure q;
"""


class MqtDriver(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not MANIFEST or not os.path.exists(MANIFEST):
            raise unittest.SkipTest("QRTD_QDMI_MANIFEST does not name the built manifest")
        cls.lab = qdmi_lab.Lab()
        try:
            cls.lab.start()
        except Exception:
            cls.lab.close()
            raise
        builtin_driver.add_manifest(MANIFEST)

    @classmethod
    def tearDownClass(cls):
        cls.lab.close()

    def device(self, **kw):
        return builtin_driver.open_device(DEVICE_ID, base_url=self.lab.sock, **kw)

    def duration_ns(self):
        # qpu-aer simulates in Python and qrtd waits 1 s past a job's end for
        # its result: on a loaded host the slot must be longer (custom3).
        return 3 * qdmi_lab.NS if self.lab.endpoint == "aer" else 10_000_000

    def submit(self, d, program, shots, **kw):
        return d.submit_job(program, qdmi.ProgramFormat.QASM3, shots, custom3=str(self.duration_ns()), **kw)

    def test_lists_the_device_with_its_qubit_count(self):
        self.assertIn(DEVICE_ID, builtin_driver.registered_device_ids())
        d = self.device()
        self.assertEqual(d.name(), "qrtd/qpu0")
        self.assertEqual(d.id, DEVICE_ID)
        self.assertTrue(d.library_version().startswith("1."))
        self.assertEqual(d.supported_program_formats(), [qdmi.ProgramFormat.QASM3])
        if not self.lab.device:
            self.skipTest("this qrtd serves no [qpu.device] facts: no qubit count to list")
        self.assertEqual(d.qubits_num(), qdmi_lab.QUBITS)
        self.assertEqual(sorted(s.index() for s in d.sites()), list(range(qdmi_lab.QUBITS)))
        ops = {o.name(): o for o in d.operations()}
        self.assertEqual(set(ops), {"rz", "sx", "x", "cx", "measure"})
        self.assertEqual(ops["cx"].qubits_num(), 2)
        self.assertEqual(ops["cx"].duration(), 300)
        self.assertEqual(ops["rz"].parameters_num(), 1)
        pairs = sorted((a.index(), b.index()) for a, b in d.coupling_map())
        self.assertEqual(pairs, [(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2), (3, 4), (4, 3)])

    def test_status_is_calibration_in_a_blackout(self):
        self.lab.push([(3, 600, 11)])
        d = self.device()
        self.assertEqual(d.status(), qdmi.Device.Status.CALIBRATION)
        self.lab.push([(-1, 600, 12)])
        self.assertEqual(d.status(), qdmi.Device.Status.IDLE)

    def run_bell(self, d, booked=False):
        job = d.submit_job(BELL, qdmi.ProgramFormat.QASM3, 1000) if booked else self.submit(d, BELL, 1000)
        self.assertTrue(job.wait(60), "the job did not finish")
        self.assertEqual(job.check(), qdmi.Job.Status.DONE)
        counts = job.get_counts()
        self.assertEqual(sum(counts.values()), 1000)
        self.assertTrue(all(len(k) == 2 for k in counts), counts)
        return job, counts

    def test_bell_runs_through_qdmi(self):
        self.lab.push([(-1, 600, 21)])
        _, counts = self.run_bell(self.device())
        if self.lab.endpoint != "aer":
            self.skipTest("the endpoint is qpu-sim (" + (self.lab.why_sim or "no qpu-aer in this tree") +
                          "): its counts are pseudo-random, so only the mechanics were checked")
        self.assertEqual(set(counts) - {"00", "11"}, set(), counts)
        for k in ("00", "11"):
            self.assertGreaterEqual(counts.get(k, 0), 350, counts)

    def test_a_job_asked_for_in_a_blackout_starts_in_the_next_window(self):
        self.lab.push([(3, 600, 31)])
        d = self.device()
        self.assertEqual(d.status(), qdmi.Device.Status.CALIBRATION)
        job = self.submit(d, BELL, 100)
        self.assertGreaterEqual(d.queue_length(), 1)
        self.assertFalse(job.wait(1), "the job finished inside the blackout")
        self.assertEqual(job.check(), qdmi.Job.Status.QUEUED)
        self.assertTrue(job.wait(60))
        self.assertEqual(job.check(), qdmi.Job.Status.DONE)
        with self.lab.client() as c:
            rec = c.jobs_status(int(job.id))
            windows = c.calibration_get("qpu0")
        win = [w for w in windows if w["calibration_id"] == 31][0]
        self.assertGreaterEqual(rec["start_ns"], win["valid_from_ns"])
        self.assertLess(rec["start_ns"], win["valid_until_ns"])
        self.assertEqual(rec["calibration_id"], 31)

    def test_a_reservation_booked_beforehand_carries_the_job(self):
        self.lab.push([(-1, 600, 41)])
        with self.lab.client() as c:
            r = c.slots_reserve(self.duration_ns(), idempotency_key="mqt-driver-booked", qpus=["qpu0"],
                                not_before_ns=time.time_ns() + 2 * qdmi_lab.NS)
        d = self.device(custom1=str(r["reservation_id"]), custom2=str(r["fencing_token"]))
        job, _ = self.run_bell(d, booked=True)
        self.assertEqual(job.id, str(r["reservation_id"]))
        with self.lab.client() as c:
            self.assertEqual(c.jobs_status(r["reservation_id"])["state"], "completed")

    def test_bad_programs_and_shots_are_refused_at_submit(self):
        self.lab.push([(-1, 600, 51)])
        d = self.device()
        before = d.queue_length()
        with self.assertRaises(Exception):
            d.submit_job("qreg q[2]; h q[0];", qdmi.ProgramFormat.QASM3, 100)
        with self.assertRaises(Exception):
            d.submit_job(BELL, qdmi.ProgramFormat.QASM3, 0)
        with self.assertRaises(Exception):
            d.submit_job(BELL, qdmi.ProgramFormat.QASM2, 100)
        if self.lab.device:
            with self.assertRaises(Exception):
                d.submit_job("OPENQASM 3.0;\nqubit[9] q;\n", qdmi.ProgramFormat.QASM3, 100)
        self.assertEqual(d.queue_length(), before)

    def test_a_device_over_tcp_runs_bell(self):
        # A compute node: the QPU node's qrtd at tcp://, MUNGE-authenticated
        # by libqrt-client with this node's munged.
        if not self.lab.url:
            self.skipTest("munged or mungekey is not installed: the lab's qrtd has no tcp:// listener")
        os.environ["QRT_MUNGE_SOCKET"] = self.lab.munge_sock
        self.lab.push([(-1, 600, 71)])
        d = builtin_driver.open_device(DEVICE_ID, base_url=self.lab.url)
        self.assertEqual(d.name(), "qrtd/qpu0")
        job = self.submit(d, BELL, 500)
        self.assertTrue(job.wait(60), "the job did not finish")
        self.assertEqual(job.check(), qdmi.Job.Status.DONE)
        self.assertEqual(sum(job.get_counts().values()), 500)
        with self.lab.client() as c:
            self.assertEqual(c.jobs_status(int(job.id))["state"], "completed")

    def test_mqt_qiskit_backend_runs_bell(self):
        try:
            from mqt.core.plugins.qiskit import QDMIBackend
            from qiskit import QuantumCircuit, transpile
        except ImportError as e:
            self.skipTest(f"Qiskit is not importable here ({e}): the SDK venv was not made")
        if not self.lab.device:
            self.skipTest("this qrtd serves no [qpu.device] facts: no target to build")
        self.lab.push([(-1, 600, 61)])
        backend = QDMIBackend(device=self.device(), device_id=DEVICE_ID)
        self.assertEqual(backend.target.num_qubits, qdmi_lab.QUBITS)
        self.assertEqual(set(backend.target.operation_names), {"rz", "sx", "x", "cx", "measure"})
        if self.lab.endpoint != "aer":
            self.skipTest("the endpoint is qpu-sim: a Bell distribution needs qpu-aer")
        # MQT's OpenQASM 3 zeroes the classical bits first (`c = 0;`, a
        # classical assignment); say so if the endpoint's parser cannot.
        probe = self.submit(self.device(), 'OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[1] q;\nbit[1] c;\n'
                            'c = 0;\nc[0] = measure q[0];\n', 10)
        probe.wait(60)
        if probe.check() != qdmi.Job.Status.DONE:
            with self.lab.client() as c:
                why = c.jobs_status(int(probe.id)).get("reason", "")
            self.skipTest("qpu-aer cannot run the OpenQASM 3 that MQT's Qiskit backend writes "
                          f"(a classical assignment): {why}")
        qc = QuantumCircuit(2, 2)
        qc.h(0)
        qc.cx(0, 1)
        qc.measure([0, 1], [0, 1])
        counts = backend.run(transpile(qc, backend), shots=1000).result().get_counts()
        self.assertEqual(set(counts) - {"00", "11"}, set(), counts)
        self.assertEqual(sum(counts.values()), 1000)
        self.assertGreaterEqual(counts.get("00", 0), 350, counts)
        self.assertGreaterEqual(counts.get("11", 0), 350, counts)


if __name__ == "__main__":
    unittest.main()
