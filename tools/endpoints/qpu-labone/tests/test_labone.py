"""LabOne Q's emulator behind the handler: OpenQASM 3 -> LabOne Q's
importer -> compile -> upload and arm (the controller held before the start
trigger) -> FIRE -> counts through the calibration set's thresholds."""

import json
import time

import pytest
from qrt_endpoint.handler import ArmRefused, ArmRequest, InstrumentUnreachable

from qpu_labone import calibration

BELL = ('OPENQASM 3.0;\ninclude "stdgates.inc";\nbit[2] c;\nqubit[2] q;\nh q[0];\ncx q[0], q[1];\n'
        'c[0] = measure q[0];\nc[1] = measure q[1];\n')


# 4200 rotations by distinct angles: one command table entry each, past the
# 4096 a sequencer has.
MANY_ANGLES = ('OPENQASM 3.0;\nbit[1] c;\nqubit[1] q;\n' +
               "".join(f"rx({0.001 * (i + 1):.4f}) q[0];\n" for i in range(4200)) + "c[0] = measure q[0];\n")


def req(job, qasm=BELL, cal=1, shots=8, slot=10**9):
    env = {"format": "qasm3", "shots": shots, "circuits": [{"name": "c", "qubits": 2, "qasm": qasm}]}
    return ArmRequest(job, cal, time.time_ns() + 10**9, 0, 2**62, slot, shots, 10**6, json.dumps(env).encode())


def test_bell_armed_held_fired_counted(lab):
    stack, _, _ = lab
    armed = stack.arm(req(1))
    assert [s for s, _ in armed.stages] == ["compile", "upload", "arm"]
    assert all(ns > 0 for _, ns in armed.stages)
    assert armed.program_duration_ns > 0
    time.sleep(0.2)
    job = stack._armed[1]
    assert job.started_ns == 0, "the controller must not start before FIRE"
    t = stack.fire(1)
    r = stack.collect(1)
    assert r.armed_ns < t <= r.started_ns <= r.ended_ns
    assert r.status["execution_errors"] == []
    (res,) = r.payload["results"]
    assert sum(res["counts"].values()) == 8
    assert all(len(k) == 2 for k in res["counts"])


def test_a_fire_right_after_armed_is_collected(lab):
    """FIRE with no pause after ARM (a version-1 JOB is armed, fired and
    collected at once): the results still come back."""
    import threading

    stack, _, _ = lab
    stack.arm(req(1))
    stack.fire(1)
    out = []
    t = threading.Thread(target=lambda: out.append(stack.collect(1)), daemon=True)
    t.start()
    t.join(60)
    assert out, "collect() did not return within 60 s"
    assert sum(out[0].payload["results"][0]["counts"].values()) == 8


GHZ3 = ('OPENQASM 3.0;\ninclude "stdgates.inc";\nbit[3] c;\nqubit[3] q;\nh q[0];\ncx q[0], q[1];\n'
        'cx q[1], q[2];\nc[0] = measure q[0];\nc[1] = measure q[1];\nc[2] = measure q[2];\n')


def test_a_3_qubit_ghz_whose_qubits_come_free_apart_is_read_out_together(lab):
    """The last CNOT leaves q2 busy after q0 and q1: the three readouts
    share the SHFQC+'s multiplexed line and are played aligned."""
    stack, _, _ = lab
    stack.arm(req(1, qasm=GHZ3))
    stack.fire(1)
    (res,) = stack.collect(1).payload["results"]
    assert res["counts"] == {"111": 8}   # the emulator's readouts against threshold 0


def test_thresholds_come_from_the_calibration_set(lab, tmp_path):
    stack, root, _ = lab
    stack.arm(req(1))
    stack.fire(1)
    low = stack.collect(1).payload["results"][0]["counts"]
    qpu, _ = calibration.example(thresholds=(1e9, 1e9, 1e9))
    calibration.write_set(root, "qpu0", 2, qpu)
    stack.arm(req(2, cal=2))
    stack.fire(2)
    high = stack.collect(2).payload["results"][0]["counts"]
    assert low == {"11": 8}
    assert high == {"00": 8}


def test_calibration_switch_recompiles_with_new_amplitudes(lab):
    """The second job's compiled pulses carry the new set's pi amplitude."""
    import numpy as np
    from laboneq.openqasm3 import OpenQASMTranspiler

    stack, root, _ = lab
    qpu, _ = calibration.example(amplitude_pi=(0.31, 0.29, 0.33))
    calibration.write_set(root, "qpu0", 2, qpu)
    peaks = []
    for cal in (1, 2):
        q = stack.calibrations.load(cal).qubits[:1]
        exp = OpenQASMTranspiler(stack.calibrations.load(cal).qpu).experiment(
            "OPENQASM 3.0;\nqubit[1] q;\nx q[0];\n", qubit_map={"q": q})
        waves = stack.session.compile(exp).waves
        peaks.append(max(float(np.abs(np.asarray(w.samples)).max()) for w in waves.values()))
    assert peaks == pytest.approx([0.62, 0.31])
    stack.arm(req(1, cal=2))
    stack.fire(1)
    assert sum(stack.collect(1).payload["results"][0]["counts"].values()) == 8


@pytest.mark.parametrize("qasm,reason", [
    ('OPENQASM 3.0;\nbit[1] c;\nqubit[1] q;\nccz q[0];\nc[0] = measure q[0];\n', "gate_not_supported"),
    ('OPENQASM 3.0;\nbit[1] c;\nqubit[4] q;\nx q[3];\nc[0] = measure q[3];\n', "qubit_out_of_range"),
    (MANY_ANGLES, "instruction_memory_exceeded"),
], ids=["gate", "qubit", "instructions"])
def test_refusals_name_the_reason_and_nothing_runs(lab, qasm, reason):
    stack, _, _ = lab
    with pytest.raises(ArmRefused) as e:
        stack.arm(req(1, qasm=qasm))
    assert e.value.reason == reason
    assert not stack._armed and stack._current is None


def test_unknown_calibration_and_too_long(lab):
    stack, _, _ = lab
    with pytest.raises(ArmRefused) as e:
        stack.arm(req(1, cal=99))
    assert (e.value.stage, e.value.reason) == ("compile", "calibration_unknown")
    with pytest.raises(ArmRefused) as e:
        stack.arm(req(2, slot=1000))
    assert e.value.reason == "program_too_long" and "1000 ns" in e.value.detail
    assert not stack._armed


def test_unreachable(lab):
    stack, _, _ = lab
    stack.health()
    stack.session.disconnect()
    with pytest.raises(InstrumentUnreachable):
        stack.health()
    with pytest.raises(ArmRefused) as e:
        stack.arm(req(1))
    assert e.value.reason == "instrument_unreachable"


# ------------------------------------------------------------ precompiled programs

def native(stack, cal=1, shots=4, **kw):
    """A CompiledExperiment made off the endpoint (a lab's own tooling), in qrtd's envelope."""
    from laboneq.openqasm3 import MultiProgramOptions, OpenQASMTranspiler
    from laboneq.serializers import to_json
    from laboneq.simple import AcquisitionType, AveragingMode

    c = stack.calibrations.load(1)
    exp = OpenQASMTranspiler(c.qpu).batch_experiment(
        [BELL], qubit_map={"q": c.qubits[:2]},
        options=MultiProgramOptions(count=shots, acquisition_type=AcquisitionType.INTEGRATION,
                                    averaging_mode=AveragingMode.SINGLE_SHOT))
    compiled = stack.session.compile(exp)
    return compiled, {"format": "laboneq-compiled", "shots": shots, "calibration_id": cal, "raw": True,
                      "compiled": to_json(compiled).decode(), **kw}   # to_json gives bytes


def native_req(job, env, cal=1):
    return ArmRequest(job, cal, time.time_ns() + 10**9, 0, 2**62, 10**9, env["shots"], 10**6, json.dumps(env).encode())


def test_a_precompiled_experiment_runs_and_returns_its_raw_acquisitions(lab):
    stack, _, _ = lab
    compiled, env = native(stack, calibration_sha256=stack.calibrations.load(1).digest)
    armed = stack.arm(native_req(1, env))
    assert armed.program_duration_ns == pytest.approx(compiled.estimated_runtime * 1e9, abs=1)
    assert stack._armed[1].started_ns == 0
    stack.fire(1)
    r = stack.collect(1)
    assert r.payload["format"] == "laboneq-raw"
    # every handle the experiment acquires, among them the circuit's bits
    acq = r.payload["acquisitions"]
    assert {"c[0]", "c[1]"} <= set(acq), sorted(acq)
    assert all(len(acq[h]) == 4 and all(len(x) == 2 for x in acq[h]) for h in ("c[0]", "c[1]"))


@pytest.mark.parametrize("change,reason,text", [
    ({"calibration_id": 2}, "calibration_mismatch", "compiled for calibration 2; the job runs under calibration 1"),
    ({"calibration_sha256": "0" * 64}, "calibration_mismatch", "compiled against a calibration set 0000"),
    ({"raw": False}, "program_invalid", 'give "raw": true'),
    ({"compiled": "{}"}, "program_invalid", "compiled:"),
], ids=["calibration_id", "digest", "not_raw", "not_compiled"])
def test_a_precompiled_experiment_is_checked_against_the_calibration(lab, change, reason, text):
    stack, _, _ = lab
    _, env = native(stack)
    env.update(change)
    with pytest.raises(ArmRefused) as e:
        stack.arm(native_req(1, env))
    assert (e.value.stage, e.value.reason) == ("parse", reason), e.value.detail
    assert text in e.value.detail
    assert not stack._armed and stack._current is None


def test_switched_off_emulated_instruments_are_unreachable_and_reconnected_when_back(tmp_path):
    from qpu_labone.lab import Lab
    from qpu_labone.stack import LabOneStack

    qpu, setup = calibration.example(thresholds=(0.0, 0.0, 0.0))
    calibration.write_set(tmp_path, "qpu0", 1, qpu)
    power = tmp_path / "power"
    power.touch()
    lab_ = Lab(setup, emulate=True, power_file=str(power))
    stack = LabOneStack(lab_.connect(), calibration.CalibrationStore(tmp_path, "qpu0"), reconnect=lab_.connect,
                        probe=lab_.probe)
    try:
        stack.health()
        power.unlink()
        with pytest.raises(InstrumentUnreachable):
            stack.health()
        with pytest.raises(ArmRefused) as e:
            stack.arm(req(1))
        assert e.value.reason == "instrument_unreachable"
        first = stack.session
        power.touch()
        stack.health()
        assert stack.session is not first
        stack.arm(req(2))
        stack.fire(2)
        assert sum(stack.collect(2).payload["results"][0]["counts"].values()) == 8
    finally:
        stack.close()
