"""qpu-labone, the program, over the wire as qrtd speaks it (version 2), on
LabOne Q's emulator: HELLO with the capabilities, ARM compiled, uploaded
and armed with the start trigger held, nothing started before FIRE, RESULT
after it; a calibration switch between two jobs (the second set's
thresholds in its counts); the refusals at ARM; the instruments switched
off (ERROR unreachable, HELLOs refused) and on again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from qrt_client import protocol as P
from qrt_endpoint.testing import Agent, Peer, T, frame, job_fields
from test_labone import BELL, MANY_ANGLES

from qpu_labone import calibration


class Bench:
    def __init__(self, root):
        self.root = root
        self.sock = os.path.join(root, "q.sock")
        self.power = os.path.join(root, "power")
        open(self.power, "w").close()
        self.log = open(os.path.join(root, "qpu-labone.log"), "w")
        self.p = subprocess.Popen(
            [sys.executable, "-m", "qpu_labone.main", "--listen", "unix://" + self.sock, "--qpu", "qpu0",
             "--calibration-dir", root, "--emulate", "--emulate-power-file", self.power, "--health-interval-s",
             "0.2", "--min-lead-ms", "200", "-v"],
            cwd=root, stdout=self.log, stderr=subprocess.STDOUT)
        give_up = time.monotonic() + 120
        while not os.path.exists(self.sock):
            assert self.p.poll() is None and time.monotonic() < give_up, self.output()
            time.sleep(0.1)

    def output(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


def envelope(text, shots=8):
    return json.dumps({"format": "qasm3", "shots": shots, "circuits": [{"name": "c", "qubits": 2, "qasm": text}]})


def run_job(a, job_id, text=BELL, cal=1, shots=8, ahead_ns=5 * 10**9):
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


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("qpu-labone"))
    calibration.write_set(root, "qpu0", 1, calibration.example(thresholds=(0.0, 0.0, 0.0))[0])
    calibration.write_set(root, "qpu0", 2, calibration.example(thresholds=(1e9, 1e9, 1e9),
                                                               amplitude_pi=(0.31, 0.29, 0.33))[0])
    b = Bench(root)
    a = Agent(b.sock)   # warm-up: the first compilation in a process pays for lazy imports
    run_job(a, 1, ahead_ns=30 * 10**9)
    a.close()
    yield b
    b.stop()


def test_armed_with_the_trigger_held_started_on_fire_and_the_calibration_switch(bench):
    a = Agent(bench.sock)
    try:
        assert a.caps["two_phase"] and a.caps["max_armed"] == 1 and a.caps["identity"].startswith("qpu-labone ")
        f, armed, h, result = run_job(a, 10)
        assert [s["name"] for s in armed["stages"]] == ["compile", "upload", "arm"]
        assert armed["program_duration_ns"] > 0
        assert h["armed_ns"] < f["scheduled_ns"] <= h["arrival_ns"] <= h["started_ns"] <= h["ended_ns"]
        assert result["status"]["execution_errors"] == [] and result["status"]["emulation"] is True
        assert result["results"][0]["counts"] == {"11": 8}      # set 1: threshold 0
        _, _, _, result = run_job(a, 11, cal=2)
        assert result["results"][0]["counts"] == {"00": 8}      # set 2: threshold 1e9
    finally:
        a.close()


@pytest.mark.parametrize("text,cal,slot_ns,status,reason", [
    ('OPENQASM 3.0;\nbit[1] c;\nqubit[1] q;\nccz q[0];\nc[0] = measure q[0];\n', 1, 50_000_000,
     P.WireError.PROGRAM_REFUSED, "gate_not_supported"),
    ('OPENQASM 3.0;\nbit[1] c;\nqubit[4] q;\nx q[3];\nc[0] = measure q[3];\n', 1, 50_000_000,
     P.WireError.PROGRAM_REFUSED, "qubit_out_of_range"),
    (MANY_ANGLES, 1, 50_000_000, P.WireError.MEMORY_FULL, "instruction_memory_exceeded"),
    (BELL, 7, 50_000_000, P.WireError.CALIBRATION_UNKNOWN, "calibration_unknown"),
    (BELL, 1, 1_000, P.WireError.PROGRAM_REFUSED, "program_too_long"),
], ids=["gate", "qubit", "instructions", "calibration", "too_long"])
def test_refusals_at_arm_are_named(bench, text, cal, slot_ns, status, reason):
    a = Agent(bench.sock)
    try:
        a.control.s.settimeout(300)   # 4200 rotations take a while to compile before the refusal
        f = job_fields(40, ahead_ns=3 * 10**9, cal=cal, duration_ns=slot_ns, shots=8)
        a.arm(f, envelope(text).encode())
        h, body = a.read()
        assert (h["type"], h["job_id"], h["status"], h["stage"]) == (T.ERROR, 40, status, P.WireStage.COMPILE), body
        assert body.decode().startswith(reason + ": ")
        run_job(a, 41)   # nothing was left armed
    finally:
        a.close()


def test_the_instruments_switched_off_are_unreachable_and_back_when_switched_on(bench):
    a = Agent(bench.sock)
    try:
        os.unlink(bench.power)
        h, body = a.read()
        assert (h["type"], h["job_id"], h["status"]) == (T.ERROR, 0, P.WireError.UNREACHABLE), body
        assert a.control.closed()
        p = Peer(bench.sock)
        p.send(frame(1, T.HELLO, b"qrtd-test wire=2"))
        h, _ = p.read()
        assert (h["type"], h["status"]) == (T.ERROR, P.WireError.UNREACHABLE)
        p.close()
    finally:
        a.close()
        open(bench.power, "w").close()
    give_up = time.monotonic() + 60
    while True:
        a = Agent(bench.sock)
        if a.caps is not None:
            break
        a.close()
        assert time.monotonic() < give_up, bench.output()
        time.sleep(0.3)
    try:
        run_job(a, 50)
    finally:
        a.close()
