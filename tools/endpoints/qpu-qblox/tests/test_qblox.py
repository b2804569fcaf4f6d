"""The Qblox stack on the dummy Cluster, with qblox-scheduler compiling."""

import json
import time

import numpy as np
import pytest
from qblox_instruments import SequencerStates
from qblox_instruments.ieee488_2 import DummyBinnedAcquisitionData
from qblox_scheduler.backends.graph_compilation import SerialCompiler
from qrt_endpoint.handler import ArmRefused, ArmRequest, InstrumentUnreachable

from qpu_qblox import calibration, dummy, qasm
from qpu_qblox.stack import QbloxStack

BELL = ('OPENQASM 3.0;\ninclude "stdgates.inc";\nbit[2] c;\nqubit[2] q;\nh q[0];\ncx q[0], q[1];\n'
        'c[0] = measure q[0];\nc[1] = measure q[1];\n')
GHZ3 = ('OPENQASM 3.0;\ninclude "stdgates.inc";\nbit[3] c;\nqubit[3] q;\nh q[0];\ncx q[0], q[1];\n'
        'cx q[1], q[2];\nc[0] = measure q[0];\nc[1] = measure q[1];\nc[2] = measure q[2];\n')


def req(job, qasm_text=BELL, cal=1, shots=8, slot=10**9, name="c"):
    env = {"format": "qasm3", "shots": shots, "circuits": [{"name": name, "qubits": 3, "qasm": qasm_text}]}
    return ArmRequest(job, cal, time.time_ns() + 10**9, 0, 2**62, slot, shots, 10**6, json.dumps(env).encode())


def compile_in_test(stack, cal_id, text, shots):
    """An independent compilation of the same circuit and set."""
    cal = stack.calibrations.load(cal_id)
    sched = stack.schedule(cal, [("c", qasm.read(text, len(cal.qubits)))], shots)
    return SerialCompiler("test").compile(sched, config=cal.config).compiled_instructions["cluster0"]


def q1asm_text(program):
    lines = (line.split("#")[0].strip() for line in program.splitlines())
    return "\n".join(" ".join(x.split()) for x in lines if x)


class Spy:
    """Records the driver calls (the real call still happens)."""

    def __init__(self, cluster, names):
        self.calls = []
        for n in names:
            real = getattr(cluster, n)

            def call(*a, _n=n, _real=real, **kw):
                self.calls.append((_n, a, time.time_ns()))
                return _real(*a, **kw)
            setattr(cluster, n, call)


@pytest.mark.parametrize("text,nq", [(BELL, 2), (GHZ3, 3)], ids=["bell", "ghz3"])
def test_sequencers_hold_what_the_compiler_made_armed_then_started(lab, text, nq):
    stack, _ = lab
    cl = stack.cluster
    spy = Spy(cl, ["arm_sequencer", "start_sequencer"])
    stack._start = cl.start_sequencer
    armed = stack.arm(req(1, text))
    want = compile_in_test(stack, 1, text, 8)
    job = stack._armed[1]
    assert job.sequencers, "nothing armed"
    for slot, seq in job.sequencers:
        got = getattr(getattr(cl, f"module{slot}"), f"sequencer{seq}").sequence.cache()
        exp = want[f"cluster0_module{slot}"]["sequencers"][f"seq{seq}"].sequence
        assert got["program"] == exp["program"]
        if dummy.ASSEMBLER != "qblox q1asm":
            # the driver sends the program without comments and blank lines
            assert dummy.uploaded_program(cl, slot, seq) == q1asm_text(exp["program"])
        held = cl.get_waveforms(slot, seq)
        assert set(held) == set(exp["waveforms"])
        for name, w in exp["waveforms"].items():
            assert np.allclose(held[name]["data"], w["data"], atol=1e-4)
        assert cl.get_sequencer_status(slot, seq).state is SequencerStates.ARMED
    # the drive of every qubit used, the flux of the coupler and the readouts
    assert len({s for s, _ in job.sequencers}) >= 3
    assert [c[0] for c in spy.calls] == ["arm_sequencer"] * len(job.sequencers)
    t_fire = stack.fire(1)
    assert spy.calls[-1][0] == "start_sequencer" and spy.calls[-1][1] == ()
    assert max(c[2] for c in spy.calls[:-1]) < t_fire <= spy.calls[-1][2]
    r = stack.collect(1)
    for slot, seq in job.sequencers:
        assert r.status[f"module{slot}.seq{seq}"]["state"] == "STOPPED"
    assert r.armed_ns <= r.started_ns <= r.ended_ns
    assert armed.program_duration_ns > 200_000 * 1


def test_counts_through_the_thresholds(lab):
    stack, _ = lab
    cl = stack.cluster
    shots = 10
    stack.arm(req(1, BELL, shots=shots))
    job = stack._armed[1]
    readout = sorted((s, q) for s, q in job.sequencers if s == 8)
    assert len(readout) == 2
    th = 0.012 * 800  # q0's threshold in the set, times the integration length in ns
    # q0: 7 shots above its threshold, q1: 4 above (raw integrator values)
    i0 = [th * 1.5] * 7 + [th * 0.5] * 3
    i1 = [th * 1.5] * 4 + [th * 0.2] * 6
    for (slot, seq), vals in zip(readout, (i0, i1), strict=True):
        cl.set_dummy_binned_acquisition_data(slot, seq, "0", [
            DummyBinnedAcquisitionData(data=(v, 0.0), thres=0, avg_cnt=1) for v in vals])
    stack.fire(1)
    counts = stack.collect(1).payload["results"][0]["counts"]
    assert counts == {"11": 4, "01": 3, "00": 3}


def test_calibration_switch_uploads_new_frequencies_and_amplitudes(lab):
    stack, root = lab
    cl = stack.cluster
    calibration.write_set(root, "qpu0", 2, calibration.example_device(f01=(5.20e9, 5.32e9, 5.55e9),
                                                                     amp180=(0.16, 0.29, 0.35)),
                          calibration.example_hardware())
    amps, nco = [], []
    for job, cal in ((1, 1), (2, 2)):
        stack.arm(req(job, 'OPENQASM 3.0;\nbit[1] c;\nqubit[1] q;\nx q[0];\nc[0] = measure q[0];\n', cal=cal))
        prog = cl.module2.sequencer0.sequence.cache()["program"]
        gains = [int(line.split()[1].split(",")[0]) for line in prog.splitlines() if "set_awg_gain" in line]
        amps.append(max(gains))
        nco.append(cl.module2.out0_lo_freq())
        stack.fire(job)
        stack.collect(job)
    assert amps[1] == pytest.approx(amps[0] / 2, rel=0.01)
    assert nco == [5.05e9, 5.15e9]


@pytest.mark.parametrize("text,stage,reason", [
    ('OPENQASM 3.0;\nbit[1] c;\nqubit[1] q;\nccx q[0], q[0], q[0];\nc[0] = measure q[0];\n',
     "compile", "gate_not_supported"),
    ('OPENQASM 3.0;\nbit[2] c;\nqubit[3] q;\ncz q[0], q[2];\nc[0] = measure q[0];\n',
     "compile", "gate_not_supported"),
    ('OPENQASM 3.0;\nbit[1] c;\nqubit[4] q;\nx q[3];\nc[0] = measure q[3];\n', "compile", "qubit_out_of_range"),
    ('OPENQASM 3.0;\nbit[1] c;\nx $5;\nc[0] = measure $5;\n', "compile", "qubit_out_of_range"),
    ('OPENQASM 3.0;\nbit[1] c;\nqubit[1] q;\n' + "x q[0];\nz q[0];\n" * 9000 + "c[0] = measure q[0];\n",
     "compile", "instruction_memory_exceeded"),
], ids=["gate", "coupler", "qubit", "physical_qubit", "instructions"])
def test_refusals_are_named_and_nothing_is_armed(lab, text, stage, reason):
    stack, _ = lab
    with pytest.raises(ArmRefused) as e:
        stack.arm(req(1, text, shots=2))
    assert (e.value.stage, e.value.reason) == (stage, reason), e.value.detail
    assert not stack._armed
    for slot in calibration.EXAMPLE_MODULES:
        for seq in range(2):
            assert stack.cluster.get_sequencer_status(slot, seq).state is not SequencerStates.ARMED


def test_unknown_calibration_and_program_longer_than_slot(lab):
    stack, _ = lab
    with pytest.raises(ArmRefused) as e:
        stack.arm(req(1, cal=7))
    assert (e.value.stage, e.value.reason) == ("compile", "calibration_unknown")
    with pytest.raises(ArmRefused) as e:
        stack.arm(req(2, shots=8, slot=1_000_000))
    assert e.value.reason == "program_too_long"
    assert "the slot is 1000000 ns" in e.value.detail and "runs 16" in e.value.detail
    assert not stack._armed


def test_unreachable(lab):
    stack, _ = lab
    stack.health()
    stack.cluster.close()
    with pytest.raises(InstrumentUnreachable):
        stack.health()
    with pytest.raises(ArmRefused) as e:
        stack.arm(req(1))
    assert e.value.reason == "instrument_unreachable"


# ------------------------------------------------------------ precompiled programs

def native(stack, text=BELL, shots=4, cal=1, **kw):
    """A CompiledSchedule made off the endpoint (as a lab's own tooling
    would), in qrtd's envelope."""
    c = stack.calibrations.load(1)
    compiled = SerialCompiler("lab").compile(stack.schedule(c, [("c", qasm.read(text, 3))], shots), config=c.config)
    env = {"format": "qblox-compiled", "shots": shots, "calibration_id": cal, "raw": True,
           "schedule": compiled.to_json(), **kw}
    return compiled, env


def native_req(job, env, cal=1):
    return ArmRequest(job, cal, time.time_ns() + 10**9, 0, 2**62, 10**9, env["shots"], 10**6,
                      json.dumps(env).encode())


def test_a_precompiled_schedule_is_uploaded_as_compiled_and_returns_its_raw_acquisitions(lab):
    stack, _ = lab
    cl = stack.cluster
    compiled, env = native(stack, calibration_sha256=stack.calibrations.load(1).digest)
    armed = stack.arm(native_req(1, env))
    assert armed.program_duration_ns == round(compiled.duration * 1e9)
    job = stack._armed[1]
    want = compiled.compiled_instructions["cluster0"]
    for slot, seq in job.sequencers:
        got = getattr(getattr(cl, f"module{slot}"), f"sequencer{seq}").sequence.cache()
        assert got["program"] == want[f"cluster0_module{slot}"]["sequencers"][f"seq{seq}"].sequence["program"]
    readout = sorted((s, q) for s, q in job.sequencers if s == 8)
    for k, (slot, seq) in enumerate(readout):
        cl.set_dummy_binned_acquisition_data(slot, seq, "0", [
            DummyBinnedAcquisitionData(data=(float(k * 10 + i), -1.0), thres=0, avg_cnt=1) for i in range(4)])
    stack.fire(1)
    r = stack.collect(1)
    assert r.payload["format"] == "qblox-raw"
    acq = r.payload["acquisitions"]
    assert sorted(acq) == ["0:0", "0:1"]
    # the integrator's sums, divided by the integration length, as the driver returns them
    firsts = sorted(v[0][0] for v in acq.values())
    assert firsts[0] == pytest.approx(0.0) and firsts[1] == pytest.approx(10.0 / 800)
    assert all(len(v) == 4 for v in acq.values())


@pytest.mark.parametrize("change,reason,text", [
    ({"calibration_id": 2}, "calibration_mismatch", "compiled for calibration 2; the job runs under calibration 1"),
    ({"calibration_sha256": "0" * 64}, "calibration_mismatch", "compiled against a calibration set 0000"),
    ({"raw": False}, "program_invalid", 'give "raw": true'),
    ({"schedule": "{}"}, "program_invalid", "schedule:"),
])
def test_a_precompiled_schedule_is_checked_against_the_calibration(lab, change, reason, text):
    stack, _ = lab
    _, env = native(stack)
    env.update(change)
    with pytest.raises(ArmRefused) as e:
        stack.arm(native_req(1, env))
    assert (e.value.stage, e.value.reason) == ("parse", reason), e.value.detail
    assert text in e.value.detail
    assert not stack._armed


# ------------------------------------------------------------ the instrument lost and back

def test_a_powered_off_dummy_is_unreachable_and_the_stack_reconnects_when_it_is_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calibration.write_set(tmp_path, "qpu0", 1, calibration.example_device(), calibration.example_hardware())
    power = tmp_path / "power"
    power.touch()
    bench = dummy.DummyLab("cluster0", calibration.EXAMPLE_MODULES, power_file=str(power))
    stack = QbloxStack(bench.connect(), calibration.CalibrationStore(tmp_path, "qpu0"), reconnect=bench.connect)
    try:
        stack.health()
        power.unlink()
        with pytest.raises(InstrumentUnreachable) as e:
            stack.health()
        assert "is absent" in str(e.value)
        with pytest.raises(ArmRefused) as r:
            stack.arm(req(1))
        assert r.value.reason == "instrument_unreachable"
        first = stack.cluster
        power.touch()
        stack.health()
        assert stack.cluster is not first, "a new connection, as after a power cycle"
        stack.arm(req(2))
        stack.fire(2)
        assert sum(stack.collect(2).payload["results"][0]["counts"].values()) == 8
    finally:
        stack.close()
