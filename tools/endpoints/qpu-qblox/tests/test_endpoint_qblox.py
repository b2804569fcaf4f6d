"""qpu-qblox, the program, over the wire as qrtd speaks it (version 2):
HELLO with the capabilities, ARM ahead of T compiled and armed on the dummy
Cluster (the journal shows the sequencers armed before T with exactly
what qblox-scheduler compiles), FIRE at T started (after the FIRE's
arrival), RESULT with the counts through the thresholds from the
acquisitions set in the dummy; a calibration switch between two jobs; the
refusals at ARM with nothing armed or started; the Cluster switched off
(ERROR unreachable, the agent closed, HELLOs refused) and on again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from qblox_scheduler.backends.graph_compilation import SerialCompiler
from qrt_client import protocol as P
from qrt_endpoint.testing import Agent, Peer, T, frame, job_fields
from test_qblox import BELL, GHZ3

from qpu_qblox import calibration, qasm
from qpu_qblox.calibration import CalibrationStore

MODULES = ",".join(f"{s}:{t}" for s, t in calibration.EXAMPLE_MODULES.items())
X1 = 'OPENQASM 3.0;\nbit[1] c;\nqubit[1] q;\nx q[0];\nc[0] = measure q[0];\n'


class Bench:
    def __init__(self, root):
        self.root = root
        self.sock = os.path.join(root, "q.sock")
        self.journal = os.path.join(root, "journal.jsonl")
        self.acq = os.path.join(root, "acq.json")
        self.power = os.path.join(root, "power")
        open(self.power, "w").close()
        self.log = open(os.path.join(root, "qpu-qblox.log"), "w")
        self.p = subprocess.Popen(
            [sys.executable, "-m", "qpu_qblox.main", "--listen", "unix://" + self.sock, "--qpu", "qpu0",
             "--calibration-dir", root, "--dummy", MODULES, "--dummy-journal", self.journal,
             "--dummy-acquisitions", self.acq, "--dummy-power-file", self.power, "--health-interval-s", "0.2",
             "--min-lead-ms", "200", "-v"],
            cwd=root, stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))
        give_up = time.monotonic() + 120
        while not os.path.exists(self.sock):
            assert self.p.poll() is None and time.monotonic() < give_up, self.output()
            time.sleep(0.1)

    def output(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def events(self, since=0):
        if not os.path.exists(self.journal):
            return []
        with open(self.journal) as f:
            return [e for e in map(json.loads, f) if e["t"] >= since]

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("qpu-qblox"))
    calibration.write_set(root, "qpu0", 1, calibration.example_device(), calibration.example_hardware())
    calibration.write_set(root, "qpu0", 2, calibration.example_device(f01=(5.20e9, 5.32e9, 5.55e9),
                                                                      amp180=(0.16, 0.29, 0.35)),
                          calibration.example_hardware())
    b = Bench(root)
    a = Agent(b.sock)   # warm-up: the first compilation in a process pays for lazy imports
    run_job(a, 1, X1, ahead_ns=60 * 10**9 // 2)
    a.close()
    yield b
    b.stop()


def envelope(text, shots=8):
    return json.dumps({"format": "qasm3", "shots": shots, "circuits": [{"name": "c", "qubits": 3, "qasm": text}]})


def compile_in_test(root, cal_id, text, shots):
    from qpu_qblox.stack import QbloxStack

    cal = CalibrationStore(root, "qpu0").load(cal_id)
    sched = QbloxStack.schedule(cal, [("c", qasm.read(text, len(cal.qubits)))], shots)
    return SerialCompiler("test").compile(sched, config=cal.config).compiled_instructions["cluster0"]


def run_job(a, job_id, text, cal=1, shots=8, ahead_ns=5 * 10**9):
    """ARM at T - ahead_ns (generous: a loaded host compiles slowly), FIRE at T."""
    f = job_fields(job_id, ahead_ns=ahead_ns, cal=cal, duration_ns=50_000_000, shots=shots)
    a.arm(f, envelope(text, shots).encode())
    h, body = a.read()
    assert (h["type"], h["job_id"]) == (T.ARMED, job_id), body
    armed = json.loads(body)
    time.sleep(max(0, f["scheduled_ns"] - time.time_ns()) / 1e9)
    a.do_fire(f)
    h, body = a.read()
    assert (h["type"], h["job_id"]) == (T.RESULT, job_id), body
    return f, armed, h, json.loads(body)


@pytest.mark.parametrize("text,nq", [(BELL, 2), (GHZ3, 3)], ids=["bell", "ghz3"])
def test_armed_before_t_with_what_the_compiler_made_started_on_fire_counted_through_thresholds(bench, text, nq):
    a = Agent(bench.sock)
    try:
        assert a.caps["two_phase"] and a.caps["max_armed"] == 1 and a.caps["start"] == "on_fire"
        assert a.caps["identity"].startswith("qpu-qblox ")
        want = compile_in_test(bench.root, 1, text, 8)
        readout = sorted((int(k.rsplit("module", 1)[1]), int(s[3:])) for k, m in want.items()
                         if k == "cluster0_module8" for s in m["sequencers"])
        assert len(readout) == nq
        th = 0.012 * 800   # q0's threshold in set 1, times the integration length (the raw integrator sum)
        above = [7, 4, 2][:nq]
        acq = {f"module{s}.seq{q}": {"0": [[th * 1.5, 0]] * n + [[th * 0.1, 0]] * (8 - n)}
               for (s, q), n in zip(readout, above, strict=True)}
        with open(bench.acq, "w") as f:
            json.dump(acq, f)
        t0 = time.time_ns()
        f, armed, h, result = run_job(a, 10 + nq, text)
        assert [s["name"] for s in armed["stages"]] == ["compile", "upload", "arm"]
        ev = bench.events(t0)
        arms = [e for e in ev if e["call"] == "arm_sequencer"]
        starts = [e for e in ev if e["call"] == "start_sequencer"]
        assert arms and len(starts) == 1
        for e in arms:   # armed before T, holding exactly what qblox-scheduler compiles for this circuit and set
            assert e["t"] < f["scheduled_ns"] and e["state"] == "ARMED"
            seq = want[f"cluster0_module{e['slot']}"]["sequencers"][f"seq{e['seq']}"].sequence
            assert e["program"] == seq["program"]
            held = {int(i): d for i, d in e["waveforms"].items()}
            assert held.keys() == {w["index"] for w in seq["waveforms"].values()}
            for w in seq["waveforms"].values():
                assert np.allclose(held[w["index"]], w["data"], atol=1e-4)
        assert h["arrival_ns"] >= f["scheduled_ns"]                      # FIRE at T
        assert h["arrival_ns"] <= h["started_ns"] <= starts[0]["t"] <= h["ended_ns"]   # started on FIRE
        assert h["armed_ns"] < f["scheduled_ns"]
        assert all(st == "STOPPED" for st in starts[0]["states"].values())
        counts = result["results"][0]["counts"]
        # bit k is 1 for the first above[k] shots
        exp: dict[str, int] = {}
        for shot in range(8):
            key = "".join("1" if shot < above[k] else "0" for k in reversed(range(nq)))
            exp[key] = exp.get(key, 0) + 1
        assert counts == exp
        assert result["status"]["module8.seq0"]["state"] == "STOPPED"
    finally:
        a.close()
        os.unlink(bench.acq)


def test_a_calibration_switch_uploads_the_new_sets_frequencies_and_amplitudes(bench):
    a = Agent(bench.sock)
    try:
        progs = {}
        for job, cal in ((30, 1), (31, 2)):
            t0 = time.time_ns()
            run_job(a, job, X1, cal=cal)
            drive = [e for e in bench.events(t0) if e["call"] == "arm_sequencer" and e["slot"] == 2]
            progs[cal] = drive[0]["program"]
            assert progs[cal] == compile_in_test(bench.root, cal, X1, 8)["cluster0_module2"]["sequencers"][
                f"seq{drive[0]['seq']}"].sequence["program"]
        gains = {c: max(int(ln.split()[1].split(",")[0]) for ln in p.splitlines() if "set_awg_gain" in ln)
                 for c, p in progs.items()}
        assert gains[2] == pytest.approx(gains[1] / 2, rel=0.01)
    finally:
        a.close()


@pytest.mark.parametrize("text,cal,slot_ns,status,stage,reason", [
    ('OPENQASM 3.0;\nbit[1] c;\nqubit[1] q;\nccx q[0], q[0], q[0];\nc[0] = measure q[0];\n', 1, 50_000_000,
     P.WireError.PROGRAM_REFUSED, "compile", "gate_not_supported"),
    ('OPENQASM 3.0;\nbit[1] c;\nqubit[4] q;\nx q[3];\nc[0] = measure q[3];\n', 1, 50_000_000,
     P.WireError.PROGRAM_REFUSED, "compile", "qubit_out_of_range"),
    ('OPENQASM 3.0;\nbit[1] c;\nqubit[1] q;\n' + "x q[0];\nz q[0];\n" * 9000 + "c[0] = measure q[0];\n", 1,
     50_000_000, P.WireError.MEMORY_FULL, "compile", "instruction_memory_exceeded"),
    (BELL, 7, 50_000_000, P.WireError.CALIBRATION_UNKNOWN, "compile", "calibration_unknown"),
    (BELL, 1, 1_000_000, P.WireError.PROGRAM_REFUSED, "compile", "program_too_long"),
], ids=["gate", "qubit", "instructions", "calibration", "too_long"])
def test_refusals_at_arm_are_named_and_nothing_is_armed_or_started(bench, text, cal, slot_ns, status, stage, reason):
    a = Agent(bench.sock)
    try:
        a.control.s.settimeout(300)   # 18000 gates take a while to compile before the refusal
        t0 = time.time_ns()
        f = job_fields(40, ahead_ns=3 * 10**9, cal=cal, duration_ns=slot_ns, shots=8)
        a.arm(f, envelope(text).encode())
        h, body = a.read()
        assert (h["type"], h["job_id"], h["status"], h["stage"]) == (T.ERROR, 40, status,
                                                                    P.WireStage[stage.upper()]), body
        assert body.decode().startswith(reason + ": ")
        assert not [e for e in bench.events(t0) if e["call"] in ("arm_sequencer", "start_sequencer")]
    finally:
        a.close()


def test_the_cluster_switched_off_is_unreachable_and_back_when_switched_on(bench):
    a = Agent(bench.sock)
    try:
        os.unlink(bench.power)
        h, body = a.read()
        assert (h["type"], h["job_id"], h["status"]) == (T.ERROR, 0, P.WireError.UNREACHABLE), body
        assert b"is absent" in body
        assert a.control.closed()
        p = Peer(bench.sock)
        p.send(frame(1, T.HELLO, b"qrtd-test wire=2"))
        h, _ = p.read()
        assert (h["type"], h["status"]) == (T.ERROR, P.WireError.UNREACHABLE)
        p.close()
    finally:
        a.close()
        open(bench.power, "w").close()
    give_up = time.monotonic() + 30
    while True:
        a = Agent(bench.sock)
        if a.caps is not None:
            break
        a.close()
        assert time.monotonic() < give_up, bench.output()
        time.sleep(0.3)
    try:
        run_job(a, 50, X1)
    finally:
        a.close()
