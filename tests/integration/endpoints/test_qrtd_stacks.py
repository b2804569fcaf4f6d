#!/usr/bin/env python3
"""The control stacks end to end: Qiskit's QrtdBackend -> `qrtd run` ->
qpu-qblox on qblox-instruments' dummy Cluster (QrtdQblox), or qpu-labone on
LabOne Q's emulator (QrtdLabone), each compiling against the calibration
set of the job's id, which qrtd's pushed calibration (calibration.update)
names.

  1. The target qpus.list serves is the calibration set's: the [qpu.device]
     table comes from `--print-device` of set 1, and the test checks it
     against the set's own files (qubits, couplers); a circuit wider than
     the set is refused by qrtd at request time and reaches no instrument.
  2. A Bell and a 3-qubit GHZ circuit run: the instruments got exactly what
     the stack's compiler makes of that circuit and set (compiled again in
     the test, in the stack's venv); qblox: every sequencer armed, then one
     start; the counts come through the set's thresholds from acquisition
     data the test sets in the dummy (LabOne Q's emulator makes its own,
     thresholded by the set).
  3. calibration.update to set 2 between two jobs: the second job's program
     carries set 2's parameters.
  4. Refusals at ARM through qrtd: a gate outside the device, a program
     longer than its slot and a calibration id with no set fail the job
     naming the reason; nothing is started.
  5. The instruments switched off: qrtd sees its endpoint down and refuses
     at request time with endpoint_down; a job acknowledged before is run
     once they are back.

The wire: qrtd offers version 2 in its HELLO when it speaks it; the
endpoint logs the version it answered with.  On version 1 (JOB at T) the
stack arms, starts and collects when the JOB arrives; on version 2 the
sequencers are armed before T.  Each test asserts what the negotiated
version promises.  Behaviour only, never timings.

Runs in build/venv (the SDK venv); the stack's venv (QRT_STACK_VENV) runs
the endpoint and stack_lab.py.  Environment: QRTD, QRT_STACK_VENV,
QRT_SDK_TEST_DIR (tests/integration/qiskit), QRT_E2E_DIR.
"""

import json
import os
import re
import subprocess
import sys
import time
import unittest

import qrt_client
from qiskit import QuantumCircuit
from qrtd_qiskit import QrtdBackend, QrtdError, QrtdJobError
from qrtd_qiskit.backend import make_envelope

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("QRT_SDK_TEST_DIR", os.path.join(HERE, "../qiskit")))
from qrtd_lab import MS, QrtdLab, base  # noqa: E402

VENV = os.environ.get("QRT_STACK_VENV", "")
SHOTS = 20
# The slot each job books.  On wire version 1 the endpoint compiles,
# uploads and arms when the JOB arrives at T, and qrtd waits for the
# RESULT until the slot's end + 1 s: the slot covers a compilation on a
# loaded host.  (On version 2 that happens ahead of T.)
SLOT_NS = 60_000 * MS
DOWN_HORIZON_NS = 3000 * MS


def bell():
    qc = QuantumCircuit(2, 2, name="bell")
    qc.h(0)
    qc.cx(0, 1)
    qc.measure([0, 1], [0, 1])
    return qc


def ghz3():
    qc = QuantumCircuit(3, 3, name="ghz3")
    qc.h(0)
    qc.cx(0, 1)
    qc.cx(1, 2)
    qc.measure(range(3), range(3))
    return qc


def x0():
    qc = QuantumCircuit(1, 1, name="x0")
    qc.x(0)
    qc.measure(0, 0)
    return qc


class StackThroughQrtd(QrtdLab):
    """What both stacks share; a subclass names its endpoint, and the wire
    version qrtd is configured to speak to it ([[qpu]] wire)."""

    STACK = ""
    WIRE = 1
    # wire = 2: the ARM goes out this far ahead of the start (a compilation
    # on a loaded host, the first one paying for lazy imports)
    ARM_LEAD_NS = 20_000 * MS

    @classmethod
    def setUpClass(cls):
        if not base.QRTD or not VENV:
            raise unittest.SkipTest("QRTD and QRT_STACK_VENV must be set")
        if not os.access(os.path.join(VENV, "bin", "python"), os.X_OK):
            raise unittest.SkipTest(f"no {VENV}/bin/python: the stack's venv fixture could not install its pins")
        cls.lab_begin(f"qrt-{cls.STACK}-")
        cls.root = os.path.join(cls.dir, "calibration")
        os.mkdir(cls.root, 0o755)
        cls.lab("write-sets")
        cls.device = subprocess.run(
            [cls.program(), "--print-device", "1", "--qpu", "qpu0", "--calibration-dir", cls.root],
            check=True, capture_output=True, text=True, env=cls.env()).stdout
        wire = f"wire = {cls.WIRE}\n" + (f"arm_lead_ns = {cls.ARM_LEAD_NS}\n" if cls.WIRE == 2 else "")
        cls.config('\n[[qpu]]\nname = "qpu0"\nendpoint = "unix://{dir}/qpu0.sock"\ncalibration = "pushed"\n'
                   'fidelity_f0 = 0.99\n' + wire + cls.device.replace("{", "{{").replace("}", "}}"))
        with open(cls.cfg) as f:
            text = f.read()
        with open(cls.cfg, "w") as f:
            f.write(text.replace("[timeline]\n", f"[timeline]\nendpoint_down_horizon_ns = {cls.lead() + DOWN_HORIZON_NS}\n",
                                 1))
        cls.power = os.path.join(cls.dir, "power")
        open(cls.power, "w").close()
        cls.endpoint = cls.launch(cls.STACK, [cls.program(), "--listen", f"unix://{cls.dir}/qpu0.sock", "--qpu",
                                              "qpu0", "--calibration-dir", cls.root, "--health-interval-s", "0.2",
                                              "-v", *cls.instrument_args(), *cls.endpoint_socket_args()],
                                  f"{cls.dir}/qpu0.sock", env=cls.env())
        cls.start_qrtd()
        c = qrt_client.Client(cls.sock, timeout=10)
        now = time.time_ns()
        c.calibration_update("qpu0", [{"calibration_id": 1, "valid_from_ns": now + 100 * MS,
                                       "valid_until_ns": now + 3_600_000 * MS}])
        c.close()
        cls.backend = QrtdBackend(qpu="qpu0", socket=cls.sock)

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "backend", None):
            cls.backend.close()
        cls.lab_end()

    @classmethod
    def lead(cls):
        """The least lead qrtd takes for a job on this QPU, beyond its own."""
        return cls.ARM_LEAD_NS if cls.WIRE == 2 else 0

    @classmethod
    def program(cls):
        return os.path.join(VENV, "bin", f"qpu-{cls.STACK}")

    @classmethod
    def env(cls):
        return dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONDONTWRITEBYTECODE="1")

    @classmethod
    def lab(cls, cmd, *args, stdin=None):
        r = subprocess.run([os.path.join(VENV, "bin", "python"), os.path.join(HERE, "stack_lab.py"), cls.STACK,
                            cmd, cls.root, *map(str, args)], input=stdin, capture_output=True, text=True,
                           cwd=cls.dir, env=cls.env(), timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"stack_lab.py {cls.STACK} {cmd}: {r.stderr[-3000:]}")
        return r.stdout

    def compiled(self, circuits, cal_id, shots=SHOTS):
        """The independent compilation of what the backend sends."""
        env = make_envelope(circuits, shots)
        return json.loads(self.lab("compile", cal_id, stdin=env.decode()))

    def wire_version(self):
        """The version the endpoint answered qrtd's HELLO with (its log)."""
        found = re.findall(r"HELLO from '([^']*)': wire version (\d)", self.tail(self.STACK + ".log", 10_000))
        self.assertTrue(found, self.tail(self.STACK + ".log"))
        identity, version = found[-1]
        # qrtd offers version 2 in its identity when it speaks it; the
        # endpoint takes it, else version 1.
        self.assertEqual(int(version), 2 if re.search(r"\bwire=2\b", identity) else 1, identity)
        return int(version)

    def assert_armed_as_the_wire_promises(self, job, arm_times, start_t=None):
        """Version 2: armed before T (and started at or after it); version
        1: armed after qrtd sent the JOB (at T)."""
        st = self.client().jobs_status(job.qrtd_job_id)
        self.assertTrue(arm_times)
        if self.wire_version() == 2:
            self.assertTrue(all(t < st["start_ns"] for t in arm_times), (st, arm_times))
            if start_t is not None:
                self.assertGreaterEqual(start_t, st["start_ns"])
        else:
            self.assertTrue(all(t >= st["sent_ns"] > 0 for t in arm_times), (st, arm_times))

    def run_circuits(self, circuits, shots=SHOTS, duration_ns=SLOT_NS):
        job = self.backend.run(circuits, shots=shots, duration_ns=duration_ns,
                               not_before_ns=self.start_in_window("qpu0", duration_ns,
                                                                  ahead_ns=self.lead() + 2000 * MS,
                                                                  span_ns=self.lead() + 3000 * MS))
        return job

    def result(self, job):
        try:
            return job.result(timeout=120)
        except QrtdJobError as e:
            self.fail(f"{e}\nqrtd:\n{self.tail('qrtd-0.log')}\n{self.STACK}:\n{self.tail(self.STACK + '.log')}")

    def failure(self, job):
        with self.assertRaises(QrtdJobError) as cm:
            job.result(timeout=120)
        return cm.exception

    def switch_calibration(self, cal_id):
        """calibration.update: set cal_id in force from now on."""
        c = self.client()
        now = time.time_ns()
        c.calibration_update("qpu0", [{"calibration_id": cal_id, "valid_from_ns": now + 50 * MS,
                                       "valid_until_ns": now + 3_600_000 * MS}])
        self.assertTrue(base.wait_for(lambda: any(w["calibration_id"] == cal_id
                                                  for w in c.calibration_get("qpu0")), 10))

    # ------------------------------------------------------------ the target

    def set_facts(self):
        """(qubits, couplers) read from set 1's own files."""
        raise NotImplementedError

    def test_1_the_target_qpus_list_serves_is_the_calibration_sets(self):
        qubits, couplers = self.set_facts()
        q = next(q for q in self.client().qpus() if q["name"] == "qpu0")
        d = q["device"]
        self.assertEqual(d["qubits"], qubits, d)
        self.assertEqual(sorted(map(tuple, d["coupling_map"])),
                         sorted({(a, b) for a, b in couplers} | {(b, a) for a, b in couplers}), d)
        self.assertEqual(set(d["basis_gates"]), {"rz", "sx", "x", "cz", "measure"}, d)
        t = self.backend.target
        self.assertEqual(t.num_qubits, qubits)
        self.assertEqual(sorted(t.build_coupling_map().get_edges()), sorted(map(tuple, d["coupling_map"])))
        # Wider than the set: refused by qrtd at request time (and by the
        # backend before it), reaching no instrument.
        wide = QuantumCircuit(qubits + 1, 1)
        wide.x(qubits)
        wide.measure(qubits, 0)
        c = self.client()
        with self.assertRaises(qrt_client.RpcError) as cm:
            c.jobs_submit(make_envelope([wide], SHOTS), duration_ns=SLOT_NS, idempotency_key="too-wide",
                          qpus=["qpu0"], not_before_ns=self.start_in_window("qpu0", SLOT_NS, ahead_ns=self.lead() + 2000 * MS,
                                                                            span_ns=self.lead() + 3000 * MS))
        self.assertEqual(cm.exception.reason, "invalid_argument")
        self.assertIn(f"a circuit needs {qubits + 1} qubits; qpu0 has {qubits}", str(cm.exception))
        with self.assertRaises(QrtdError) as cm:
            self.backend.run(wide, shots=SHOTS)
        self.assertEqual(cm.exception.reason, "invalid_argument")

    # ------------------------------------------------------------ refusals and the instruments lost

    def started_since(self, t0):
        """What the instruments were told to start since t0 (stack's own record)."""
        raise NotImplementedError

    def test_4_refusals_at_arm_fail_the_job_naming_the_reason_and_start_nothing(self):
        ccx = QuantumCircuit(3, 1, name="ccx")
        ccx.ccx(0, 1, 2)
        ccx.measure(0, 0)
        shots, slot_ns = self.TOO_LONG
        cases = [(lambda: self.run_circuits(ccx), "gate_not_supported"),
                 (lambda: self.run_circuits(bell(), shots=shots, duration_ns=slot_ns), "program_too_long")]
        for submit, reason in cases:
            with self.subTest(reason):
                t0 = time.time_ns()
                e = self.failure(submit())
                self.assertIn(reason, str(e), e)
                self.assertEqual(self.started_since(t0), [], reason)
        # calibration.update names an id the endpoint has no set for.
        self.switch_calibration(3)
        try:
            t0 = time.time_ns()
            job = self.run_circuits(bell())
            e = self.failure(job)
            self.assertIn("calibration_unknown", str(e), e)
            self.assertIn("no calibration set 3", str(e), e)
            self.assertEqual(self.started_since(t0), [])
        finally:
            self.switch_calibration(1)

    def test_5_instruments_off_refused_at_request_time_and_the_acked_job_runs_once_back(self):
        c = self.client()
        acked = self.backend.run(x0(), shots=SHOTS, duration_ns=SLOT_NS,
                                 not_before_ns=self.start_in_window("qpu0", SLOT_NS,
                                                                    ahead_ns=self.lead() + 20_000 * MS,
                                                                    span_ns=self.lead() + 30_000 * MS))
        os.unlink(self.power)
        try:
            self.assertTrue(base.wait_for(lambda: not c.status()["qpus"][0]["endpoint_up"], 20),
                            self.tail(self.STACK + ".log"))
            self.assertIn("unreachable", self.tail(self.STACK + ".log"))
            with self.assertRaises(QrtdError) as cm:
                self.backend.run(x0(), shots=SHOTS, duration_ns=SLOT_NS)
            self.assertEqual(cm.exception.reason, "endpoint_down", cm.exception)
        finally:
            open(self.power, "w").close()
        self.assertTrue(base.wait_for(lambda: c.status()["qpus"][0]["endpoint_up"], 60),
                        self.tail("qrtd-0.log") + self.tail(self.STACK + ".log"))
        self.assertLess(time.time_ns(), acked.ack["start_ns"], "the endpoint came back after the job's start")
        counts = self.result(acked).get_counts()
        self.assertEqual(sum(counts.values()), SHOTS, counts)
        self.assertEqual(c.jobs_status(acked.qrtd_job_id)["state"], "completed")


class QrtdQblox(StackThroughQrtd, unittest.TestCase):
    STACK = "qblox"
    # 100000 shots of a Bell pair run ~20 s (200 us of reset each) in a
    # 10 s slot; the refusal is answered within the slot.
    TOO_LONG = (100_000, 10_000 * MS)
    MODULES = "2:QCM_RF,4:QCM_RF,6:QCM,8:QRM_RF"   # calibration.EXAMPLE_MODULES, the sets' wiring
    THRESHOLD = (0.012, 0.010, 0.011)              # calibration.example_device's acq_threshold
    ACQ_NS = 800                                   # its acq_duration: the integrator sums over it

    @classmethod
    def instrument_args(cls):
        cls.journal = os.path.join(cls.dir, "journal.jsonl")
        cls.acq = os.path.join(cls.dir, "acquisitions.json")
        return ["--dummy", cls.MODULES, "--dummy-journal", cls.journal, "--dummy-acquisitions", cls.acq,
                "--dummy-power-file", cls.power]

    def set_facts(self):
        with open(os.path.join(self.root, "qpu0", "1", "device_config.json")) as f:
            dev = json.load(f)
        couplers = [tuple(int(q[1:]) for q in e.split("_")) for e, ops in dev["edges"].items() if "CZ" in ops]
        return len(dev["elements"]), couplers

    def events(self, since):
        if not os.path.exists(self.journal):
            return []
        with open(self.journal) as f:
            return [e for e in map(json.loads, f) if e["t"] >= since]

    def started_since(self, t0):
        return [e for e in self.events(t0) if e["call"] in ("arm_sequencer", "start_sequencer")]

    def assert_ran_as_compiled(self, job, want, t0):
        """Every sequencer the compiler drives armed with exactly its program
        and waveforms, then one start; armed before T on version 2, after
        the JOB was sent on version 1."""
        ev = self.events(t0)
        arms = [e for e in ev if e["call"] == "arm_sequencer"]
        starts = [e for e in ev if e["call"] == "start_sequencer"]
        self.assertEqual({f"module{e['slot']}.seq{e['seq']}" for e in arms}, set(want["sequencers"]), arms)
        self.assertEqual(len(starts), 1, starts)
        for e in arms:
            seq = want["sequencers"][f"module{e['slot']}.seq{e['seq']}"]
            self.assertEqual(e["state"], "ARMED", e)
            self.assertEqual(e["program"], seq["program"])
            self.assertEqual(set(e["waveforms"]), set(seq["waveforms"]))
            for i, data in seq["waveforms"].items():
                self.assertEqual(len(e["waveforms"][i]), len(data))
                self.assertLess(max((abs(a - b) for a, b in zip(e["waveforms"][i], data)), default=0), 1e-4)
            self.assertLess(e["t"], starts[0]["t"])
        self.assert_armed_as_the_wire_promises(job, [e["t"] for e in arms], starts[0]["t"])

    def readout(self, want, nq):
        """The readout sequencer of each qubit 0..nq-1: the one whose NCO
        sits at that qubit's readout frequency less the readout LO (set 1's
        own files)."""
        with open(os.path.join(self.root, "qpu0", "1", "device_config.json")) as f:
            clocks = json.load(f)["clocks"]
        with open(os.path.join(self.root, "qpu0", "1", "hardware_config.json")) as f:
            hw = json.load(f)
        mod = hw["hardware_options"]["modulation_frequencies"]
        out = {}
        for q in range(nq):
            nco = clocks[f"q{q}.ro"] - mod[f"q{q}:res-q{q}.ro"]["lo_freq"]
            # the module whose output the connectivity graph wires to qN:res
            slot = next(src.split(".")[1] for src, dst in hw["connectivity"]["graph"]
                        if f"q{q}:res" in (dst if isinstance(dst, list) else [dst]))
            match = [n for n, s in want["sequencers"].items() if n.startswith(slot + ".")
                     and s["modulation_freq"] is not None and abs(s["modulation_freq"] - nco) < 1.0]
            self.assertEqual(len(match), 1, (q, nco, {n: s["modulation_freq"] for n, s in want["sequencers"].items()}))
            out[q] = match[0]
        return out

    def test_2_bell_and_ghz_run_as_compiled_and_count_through_the_thresholds(self):
        for qc, above in ((bell(), [13, 6]), (ghz3(), [15, 8, 3])):
            with self.subTest(qc.name):
                nq = qc.num_qubits
                want = self.compiled([qc], 1)
                acq = {}
                for q, seq in self.readout(want, nq).items():
                    hi, lo = 1.5 * self.THRESHOLD[q] * self.ACQ_NS, 0.2 * self.THRESHOLD[q] * self.ACQ_NS
                    acq[seq] = {"0": [[hi, 0.0]] * above[q] + [[lo, 0.0]] * (SHOTS - above[q])}
                with open(self.acq, "w") as f:
                    json.dump(acq, f)
                try:
                    t0 = time.time_ns()
                    job = self.run_circuits(qc)
                    counts = self.result(job).get_counts()
                finally:
                    os.unlink(self.acq)
                want_counts = {}
                for shot in range(SHOTS):
                    key = "".join("1" if shot < above[q] else "0" for q in reversed(range(nq)))
                    want_counts[key] = want_counts.get(key, 0) + 1
                self.assertEqual(counts, want_counts)
                self.assert_ran_as_compiled(job, want, t0)
                meta = self.result(job).metadata
                self.assertEqual(meta["calibration_id"], 1)
                self.assertTrue(meta["endpoint"].startswith("qpu-qblox "), meta)

    def test_3_a_calibration_switch_between_two_jobs_the_second_carries_set_2(self):
        progs = {}
        try:
            for cal in (1, 2):
                if cal == 2:
                    self.switch_calibration(2)
                want = self.compiled([x0()], cal)
                t0 = time.time_ns()
                job = self.run_circuits(x0())
                self.result(job)
                self.assertEqual(self.result(job).metadata["calibration_id"], cal)
                self.assert_ran_as_compiled(job, want, t0)
                drive = [e for e in self.events(t0) if e["call"] == "arm_sequencer" and e["slot"] == 2]
                self.assertEqual(len(drive), 1, drive)
                progs[cal] = drive[0]["program"]
        finally:
            self.switch_calibration(1)
        gains = {c: max(int(ln.split()[1].split(",")[0]) for ln in p.splitlines() if "set_awg_gain" in ln)
                 for c, p in progs.items()}
        # set 2: q0's pi amplitude halved (0.32 -> 0.16)
        self.assertAlmostEqual(gains[2] / gains[1], 0.5, delta=0.01)


class QrtdLabone(StackThroughQrtd, unittest.TestCase):
    STACK = "labone"
    # 100000 shots of a Bell pair run ~10 s (100 us of reset each) in a 5 s
    # slot; the refusal is answered within the slot.
    TOO_LONG = (100_000, 5_000 * MS)

    @classmethod
    def instrument_args(cls):
        cls.journal = os.path.join(cls.dir, "journal.jsonl")
        return ["--emulate", "--emulate-power-file", cls.power, "--emulate-journal", cls.journal]

    def set_facts(self):
        f = json.loads(self.lab("facts", 1))
        return f["qubits"], [tuple(p) for p in f["couplers"]]

    def events(self, since):
        if not os.path.exists(self.journal):
            return []
        with open(self.journal) as f:
            return [e for e in map(json.loads, f) if e["t"] >= since]

    def started_since(self, t0):
        return self.events(t0)

    @staticmethod
    def canonical(snap):
        """A snapshot with its pulses named by their samples: LabOne Q names
        a pulse (its waveforms "<stem>_i.wave", "<stem>_q.wave" or
        "<stem>.wave", and the stem in the seqc) with a counter and a hash
        of its uid, which differ between processes for the same samples."""
        stems = {}
        for n in snap["waves"]:
            stem = n.removesuffix(".wave")
            stem = stem[:-2] if stem.endswith(("_i", "_q")) else stem
            stems.setdefault(stem, []).append(n)
        order = sorted(stems, key=lambda st: json.dumps([snap["waves"][n] for n in sorted(stems[st])]))
        token = {st: f"pulse{k}" for k, st in enumerate(order)}
        src = {}
        for f, text in snap["src"].items():
            for stem in sorted(token, key=len, reverse=True):
                text = text.replace(stem, token[stem])
            src[f] = text
        return {"src": src, "waves": [[snap["waves"][n] for n in sorted(stems[st])] for st in order],
                "command_tables": snap["command_tables"], "oscillators": snap["oscillators"]}

    def assert_ran_as_compiled(self, job, want, t0, cal):
        ev = self.events(t0)
        self.assertEqual(len(ev), 1, [e["job"] for e in ev])
        got = ev[0]
        self.assertEqual((got["job"], got["calibration_id"]), (job.qrtd_job_id, cal))
        g, w = self.canonical(got), self.canonical(want)
        for k in ("src", "waves", "command_tables", "oscillators"):
            self.assertEqual(g[k], w[k], k)
        self.assert_armed_as_the_wire_promises(job, [got["t"]])
        return got

    def test_2_bell_and_ghz_run_as_compiled_and_count_through_the_thresholds(self):
        for qc in (bell(), ghz3()):
            with self.subTest(qc.name):
                want = self.compiled([qc], 1)
                t0 = time.time_ns()
                job = self.run_circuits(qc)
                r = self.result(job)
                # the emulator's readouts against set 1's thresholds (0): every bit 1
                self.assertEqual(r.get_counts(), {"1" * qc.num_qubits: SHOTS})
                self.assert_ran_as_compiled(job, want, t0, 1)
                self.assertEqual(r.metadata["calibration_id"], 1)
                self.assertTrue(r.metadata["endpoint"].startswith("qpu-labone "), r.metadata)

    def test_3_a_calibration_switch_between_two_jobs_the_second_carries_set_2(self):
        got = {}
        try:
            for cal, counts in ((1, {"1": SHOTS}), (2, {"0": SHOTS})):
                if cal == 2:
                    self.switch_calibration(2)
                want = self.compiled([x0()], cal)
                t0 = time.time_ns()
                job = self.run_circuits(x0())
                r = self.result(job)
                self.assertEqual(r.metadata["calibration_id"], cal)
                self.assertEqual(r.get_counts(), counts)   # set 2's thresholds: no readout reaches them
                got[cal] = self.assert_ran_as_compiled(job, want, t0, cal)
        finally:
            self.switch_calibration(1)
        # set 2: q0 driven 50 MHz higher (the same LO), its pi pulse at half the amplitude
        osc = {c: got[c]["oscillators"]["q0/drive"] for c in got}
        self.assertAlmostEqual(osc[2] - osc[1], 50e6, delta=1.0)

        def peak(c):
            return max(max(abs(x) if not isinstance(x, list) else abs(complex(*x)) for x in w)
                       for n, w in got[c]["waves"].items() if "rxy" in n or "drive" in n)
        self.assertAlmostEqual(peak(2) / peak(1), 0.5, delta=0.01)



class QrtdQbloxWire2(QrtdQblox):
    """The same through qrtd speaking wire version 2 ([[qpu]] wire = 2):
    ARM ahead of T, FIRE at T."""
    WIRE = 2


class QrtdLaboneWire2(QrtdLabone):
    WIRE = 2


if __name__ == "__main__":
    unittest.main(verbosity=2)
