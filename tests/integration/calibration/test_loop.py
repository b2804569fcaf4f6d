#!/usr/bin/env python3
"""The loop from a drifting device to its calibration, closed: real `qrtd
run`, qpu-aer with its drift model (tools/endpoints/qpu-aer, the device's X
over-rotation and readout offset grow with device time, corrected by the
calibration set in force), and qrt-calibration (tools/integrations/calibration)
running qiskit-experiments through QrtdBackend.

Device time runs TIME_SCALE times as fast as the wall clock, so the hours of
drift a calibration is for pass in about a minute.  A user submits a fixed
circuit (16 X gates on each of two qubits, then a measurement) every few
seconds, each booked ahead, and reads its error from the counts.

  - the error grows while the calibration in force ages;
  - the service asks for a block before the predicted fidelity (its fitted
    f0, tau_ns, pushed to qrtd) falls below its threshold; the block ends by
    needed_by and is granted around the committed jobs (it overlaps none);
  - after the calibration the error is back at its baseline, and the new
    window carries a fidelity model fitted from the measurements (tau_ns > 0);
  - no acknowledged job is missed or displaced: every job the user and the
    service submitted completed;
  - Prometheus reads the block (qrt_calibration_next_start_seconds and
    qrt_calibration_next_duration_seconds) once granted, and not after it
    ended.

Prints the error before drift, just before the calibration and after it.
Behaviour, not timings: seeded simulators, generous margins, bounded waits.
Environment: QRTD, QPU_AER (tools/endpoints/qpu-aer/qpu_aer.py),
QPU_AER_DRIFT (the folder of qpu-aer's drift module), QRT_E2E_DIR.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import qrt_client
from qiskit import QuantumCircuit
from qrtd_qiskit import QrtdBackend

sys.path.insert(0, os.environ.get("QRT_E2E_DIR", os.path.join(os.path.dirname(__file__), "../e2e")))
import test_e2e as base  # noqa: E402  (the sysusers set-up, wait_for, the config)

QRTD = os.environ.get("QRTD", "")
QPU_AER = os.environ.get("QPU_AER", "")
DRIFT_DIR = os.environ.get("QPU_AER_DRIFT", "")
S = 1_000_000_000
TIME_SCALE = 120.0          # one wall second is two device minutes: a device hour in 30 s
X_GAIN_PER_HOUR = 0.01      # the X amplitude gains 1 % an hour
READOUT_PER_HOUR = 0.15     # the discriminator drifts 0.15 half-separations an hour
THRESHOLD = 0.85
DEPTH = 16
SHOTS = 2000
USER_EVERY_S = 3.0          # a 50 ms job every 3 s: a 2.5 s block fits only between two
BOOK_AHEAD_S = 15.0         # booked this far ahead: committed before the block is asked for
DEADLINE_S = 240

QPU = """
[[qpu]]
name = "qpu0"
endpoint = "unix://{dir}/qpu0.sock"
calibration = "pushed"
[qpu.device]
qubits = 2
technology = "superconducting"
basis_gates = ["rz", "sx", "x", "cx", "measure"]
coupling_map = [[0, 1], [1, 0]]
max_shots = 20000
"""

SERVICE = f"""
socket = "{{dir}}/qrtd.sock"

[[qpu]]
name = "qpu0"
qubits = [0, 1]
set_writer = "qpu_aer_drift:AerSetWriter"
set_root = "{{dir}}/calibration"
threshold = {THRESHOLD}
reference_depth = {DEPTH}
check_interval_s = 2.0
request_lead_s = 12.0
window_s = 900.0
lead_s = 0.5
job_duration_s = 0.1
seed = 5

# Loose tolerances: the fidelity model, not a check, is what triggers here.
[[step]]
kind = "readout"
staleness_s = 3600.0
duration_s = 1.0
tolerance = 0.3
shots = 4000
check_shots = 2000

[[step]]
kind = "x_amplitude"
staleness_s = 3600.0
duration_s = 1.5
tolerance_rad = 0.3
shots = 2000
check_shots = 1000
"""


def fixed_circuit():
    qc = QuantumCircuit(2, 2, name="fixed")
    for _ in range(DEPTH):
        qc.x(0)
        qc.x(1)
    qc.measure([0, 1], [0, 1])
    return qc


def gauge(text, name, qpu):
    """A per-QPU gauge's value in Prometheus text, or None when absent."""
    m = re.search(rf'^{name}{{qpu="{qpu}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def error_of(counts):
    """The fraction of bits read 1 (the circuit is the identity)."""
    shots = sum(counts.values())
    ones = sum(n * bin(int(k, 16)).count("1") for k, n in counts.items())
    return ones / (2 * shots)


class Loop(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not QRTD or not QPU_AER or not DRIFT_DIR:
            raise unittest.SkipTest("QRTD, QPU_AER and QPU_AER_DRIFT must name the binaries")
        base.E2E.setUpClass.__func__(cls)
        try:
            cls.set_up()
        except BaseException:
            cls.tearDownClass()   # unittest does not when setUpClass fails
            raise

    @classmethod
    def set_up(cls):
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        cls.dir = tempfile.mkdtemp(prefix="qrt-calibration-", dir=shm)
        os.chmod(cls.dir, 0o755)
        cls.procs = []
        cls.state = os.path.join(cls.dir, "state")
        os.mkdir(cls.state, 0o750)
        cls.sock = os.path.join(cls.dir, "qrtd.sock")
        cls.events = os.path.join(cls.dir, "events.jsonl")
        os.mkdir(os.path.join(cls.dir, "calibration"), 0o755)
        with open(os.path.join(cls.dir, "qrtd.toml"), "w") as f:
            f.write((base.CONFIG + QPU).format(dir=cls.dir, uid=os.getuid(), submit="syscall",
                                               mode="tuned" if os.geteuid() == 0 else "untuned"))
        with open(os.path.join(cls.dir, "calibration.toml"), "w") as f:
            f.write(SERVICE.format(dir=cls.dir))
        args = [sys.executable, QPU_AER, "--listen", f"unix://{cls.dir}/qpu0.sock", "--qubits", "2",
                "--max-shots", "20000", "--seed", "7", "--verbose",
                "--calibration-dir", os.path.join(cls.dir, "calibration", "qpu0"),
                "--drift-x-per-hour", str(X_GAIN_PER_HOUR), "--drift-readout-per-hour", str(READOUT_PER_HOUR),
                "--drift-time-scale", str(TIME_SCALE), "--duration-s", str(DEADLINE_S + 60)]
        if os.geteuid() == 0:
            args += ["--socket-group", "qrt", "--socket-mode", "0660"]
        cls.start("qpu-aer", args)
        if not base.wait_for(lambda: os.path.exists(f"{cls.dir}/qpu0.sock") or cls.procs[-1].poll() is not None, 60):
            raise RuntimeError("qpu-aer did not listen")
        if cls.procs[-1].poll() is not None:
            raise RuntimeError("qpu-aer exited: " + cls.tail("qpu-aer"))
        cls.start("qrtd", [QRTD, "run", "-c", os.path.join(cls.dir, "qrtd.toml"), "--state-dir", cls.state])

        def up():
            try:
                c = qrt_client.Client(cls.sock, timeout=5)
            except qrt_client.QrtError:
                return False
            try:
                return all(q.get("endpoint_up") for q in c.status()["qpus"])
            finally:
                c.close()
        if not base.wait_for(up, 30):
            raise RuntimeError("qrtd or its endpoint did not come up: " + cls.tail("qrtd"))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (DRIFT_DIR, os.environ.get("PYTHONPATH")) if p))
        cls.start("qrt-calibration", [sys.executable, "-m", "qrt_calibration", "run", "-c",
                                      os.path.join(cls.dir, "calibration.toml"), "--events", cls.events], env=env)
        cls.client = qrt_client.Client(cls.sock, timeout=10)
        cls.backend = QrtdBackend(qpu="qpu0", socket=cls.sock)

    @classmethod
    def start(cls, name, args, env=None):
        with open(os.path.join(cls.dir, name + ".log"), "w") as log:
            cls.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env))

    @classmethod
    def tearDownClass(cls):
        for c in (getattr(cls, "backend", None), getattr(cls, "client", None)):
            if c is not None:
                c.close()
        for p in reversed(getattr(cls, "procs", [])):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if getattr(cls, "dir", None) and not os.environ.get("QRT_KEEP_TEST_DIR"):
            shutil.rmtree(cls.dir, ignore_errors=True)
        base.E2E.tearDownClass.__func__(cls)

    @classmethod
    def tail(cls, name):
        try:
            with open(os.path.join(cls.dir, name + ".log")) as f:
                return "".join(f.readlines()[-30:])
        except OSError:
            return ""

    def service_events(self, kind=None):
        try:
            with open(self.events) as f:
                evs = [json.loads(line) for line in f if line.strip()]
        except OSError:
            return []
        return [e for e in evs if kind is None or e["event"] == kind]

    def test_drift_is_calibrated_away_in_a_block_around_committed_jobs(self):
        # The service's first set and window (no calibration is in force before).
        self.assertTrue(base.wait_for(lambda: self.client.calibration_get("qpu0"), 120, 0.2),
                        "qrt-calibration opened no window:\n" + self.tail("qrt-calibration"))
        jobs = []
        give_up = time.monotonic() + DEADLINE_S
        next_user = time.monotonic()
        calibrated = None
        scraped = None
        while time.monotonic() < give_up:
            self.assertIsNone(self.procs[-1].poll(), "qrt-calibration exited: " + self.tail("qrt-calibration"))
            if time.monotonic() >= next_user:
                # The first at once (the error before drift), the others booked ahead.
                ahead = int(BOOK_AHEAD_S * S) if jobs else 0
                jobs.append(self.backend.run(fixed_circuit(), shots=SHOTS, seed_simulator=9, duration_ns=S // 20,
                                             not_before_ns=time.time_ns() + ahead))
                jobs[-1].acked_ns = time.time_ns()
                next_user += USER_EVERY_S
            granted = self.service_events("granted")
            if granted and scraped is None:
                # What Prometheus reads while the block is ahead or in force.
                scraped = (time.time_ns(), self.client.metrics())
            done = self.service_events("calibrated")
            if done and calibrated is None:
                calibrated = done[0]
            if calibrated is not None:
                new_id = calibrated["calibration_id"]
                after = [j for j in jobs if int(self.client.jobs_status(j.qrtd_job_id)["calibration_id"]) == new_id]
                if len(after) >= 3:
                    break
            time.sleep(0.2)
        self.assertIsNotNone(calibrated, "no calibration within the deadline:\n" + self.tail("qrt-calibration"))

        # Every job the user booked completed: none missed, none displaced.
        runs = []
        for j in jobs:
            r = j.result(timeout=60)
            st = self.client.jobs_status(j.qrtd_job_id)
            self.assertEqual(st["state"], "completed", st)
            runs.append((int(st["start_ns"]), int(st["end_ns"]), int(st["calibration_id"]),
                         error_of(r.get_counts()), j.acked_ns, int(j.ack["start_ns"]), int(j.ack["end_ns"])))
        runs.sort()
        old_id = calibrated["previous"]
        new_id = calibrated["calibration_id"]
        under_old = [r for r in runs if r[2] == old_id]
        under_new = [r for r in runs if r[2] == new_id]
        self.assertGreaterEqual(len(under_old), 3, runs)
        self.assertGreaterEqual(len(under_new), 3, runs)
        before, just_before, after = under_old[0][3], under_old[-1][3], under_new[0][3]
        print(f"fixed circuit error: {before:.4f} before drift (calibration {old_id}), {just_before:.4f} just "
              f"before the calibration ({(under_old[-1][0] - under_old[0][0]) / S * TIME_SCALE / 3600:.2f} device "
              f"hours later), {after:.4f} after it (calibration {new_id})", flush=True)

        # The error grew, and the calibration took it back to its baseline.
        self.assertGreater(just_before, before + 0.05)
        self.assertLess(after, before + 0.03)

        # The block: asked for before the predicted fidelity fell below the
        # threshold, ending by needed_by, around every committed job.
        block = self.service_events("granted")[-1]["block"]
        closed = [b for b in self.client.calibration_blocks("qpu0") if b["block_id"] == block["block_id"]]
        self.assertEqual([b["state"] for b in closed], ["completed"], closed)
        request = self.service_events("request")[-1]
        self.assertGreater(request["model"]["tau_ns"], 0, request)
        self.assertLess(block["created_ns"], block["needed_by_ns"])
        self.assertLessEqual(block["end_ns"], block["needed_by_ns"])
        self.assertGreaterEqual(block["predicted_fidelity_at_start"], THRESHOLD - 1e-9, block)
        # Announced to Prometheus: the QPU's next block, its start and length
        # (scraped as soon as it was granted, seconds before its end).
        self.assertIsNotNone(scraped)
        self.assertLess(scraped[0], block["end_ns"], "the metrics were read after the block's end")
        self.assertAlmostEqual(gauge(scraped[1], "qrt_calibration_next_start_seconds", "qpu0"),
                               block["start_ns"] / S, delta=1e-3)
        self.assertAlmostEqual(gauge(scraped[1], "qrt_calibration_next_duration_seconds", "qpu0"),
                               block["duration_ns"] / S, delta=1e-6)
        # Once it has ended it is no longer the next (absent, or a later block).
        after_end = gauge(self.client.metrics(), "qrt_calibration_next_start_seconds", "qpu0")
        self.assertTrue(after_end is None or after_end >= block["end_ns"] / S, after_end)
        windows = {w["calibration_id"]: w for w in self.client.calibration_get("qpu0")}
        b0, b1 = block["start_ns"], block["end_ns"]
        for start, end, _, _, _, ack_start, ack_end in runs:
            for s0, s1 in ((start, end), (ack_start, ack_end)):
                self.assertTrue(s1 <= b0 or s0 >= b1, f"job [{s0}, {s1}) lies in block [{b0}, {b1})")
        # Granted around committed jobs: jobs acknowledged before the request
        # sat right before and right after the time it got.
        near = int(USER_EVERY_S * S) + S // 2
        committed = [r for r in runs if r[4] < block["created_ns"]]
        self.assertTrue(any(b0 - near <= r[6] <= b0 for r in committed), (block, runs))
        self.assertTrue(any(b1 <= r[5] <= b1 + near for r in committed), (block, runs))

        # The service's own jobs (checks, the block's experiments) all gave
        # results, and the new window carries a fitted model.
        self.assertEqual(self.service_events("check_failed"), [])
        self.assertEqual(self.service_events("calibration_failed"), [])
        self.assertIn(new_id, windows)
        self.assertGreater(windows[new_id]["tau_ns"], 0, windows[new_id])
        self.assertTrue(0.5 < windows[new_id]["f0"] <= 1.0, windows[new_id])
        print(f"block {block['block_id']} ({block['step']}): asked at {block['created_ns']}, granted "
              f"[{block['start_ns']}, {block['end_ns']}), needed by {block['needed_by_ns']}; predicted fidelity "
              f"{block['predicted_fidelity_at_start']:.4f} at its start; new model f0 "
              f"{windows[new_id]['f0']:.4f}, tau {windows[new_id]['tau_ns'] / S:.1f} s; {len(runs)} user jobs, all "
              "completed", flush=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
