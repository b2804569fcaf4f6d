"""The programs the sequencers received, executed by q1simulator (Q1ASM with
its timing): the readout pulse and the acquisition of each readout
sequencer start at the offsets qblox-scheduler compiled (its timing
table), in every shot, and every sequencer's program runs exactly the
duration ARMED reported.

q1simulator starts each sequencer at its wait_sync; the schedule's time 0
is 8 ns later (the compiled preamble: wait_sync 4, upd_param 4), and it
renders outputs and stamps acquisitions from the sync."""

import logging
import time

import numpy as np
import pytest
from q1simulator import Cluster as Q1Cluster
from qblox_scheduler.backends.graph_compilation import SerialCompiler
from test_qblox import BELL, GHZ3, req

from qpu_qblox import calibration, qasm

PREAMBLE_NS = 8
Q1_TYPES = {"QCM": "QCM", "QCM_RF": "QCM-RF", "QRM": "QRM", "QRM_RF": "QRM-RF"}

logging.getLogger("q1simulator").setLevel(logging.ERROR)


def compiled(stack, text, shots):
    cal = stack.calibrations.load(1)
    return SerialCompiler("test").compile(stack.schedule(cal, [("c", qasm.read(text, 3))], shots), config=cal.config)


@pytest.mark.parametrize("text", [BELL, GHZ3], ids=["bell", "ghz3"])
def test_the_uploaded_programs_run_at_the_compiled_offsets_for_the_armed_duration(lab, text):
    stack, _ = lab
    shots = 3
    armed = stack.arm(req(1, text, shots=shots))
    job = stack._armed[1]
    sim = Q1Cluster("q1sim", modules={s: Q1_TYPES[t] for s, t in calibration.EXAMPLE_MODULES.items()})
    for slot, seq in job.sequencers:
        # what the dummy Cluster's sequencer holds: program, waveforms, weights, acquisitions
        dummy_seq = getattr(getattr(stack.cluster, f"module{slot}"), f"sequencer{seq}")
        s = sim._modules[slot].sequencers[seq]
        s.sequence(dummy_seq.sequence.cache())
        for name, par in dummy_seq.parameters.items():   # its output connections, as the dummy holds them
            if name.startswith("connect_out") and name in s.parameters:
                s.parameters[name].set(par.cache())
        s.sync_en(True)
        sim.arm_sequencer(slot, seq)
    sim.start_sequencer()
    give_up = time.monotonic() + 120
    for slot, seq in job.sequencers:
        while sim.get_sequencer_status(slot, seq).state.name != "STOPPED":
            assert time.monotonic() < give_up, f"module {slot} sequencer {seq} did not stop"
            time.sleep(0.01)
        st = sim.get_sequencer_status(slot, seq)
        assert not st.err_flags, st

    comp = compiled(stack, text, shots)
    period_ns = round(comp.duration * 1e9) // shots
    tt = comp.timing_table.data
    want = set()
    for port in sorted({p for p in tt.port if isinstance(p, str) and p.endswith(":res")}):
        rows = tt[tt.port == port]
        pulse = round(rows[~rows.is_acquisition].abs_time.min() * 1e9)
        acq = round(rows[rows.is_acquisition].abs_time.min() * 1e9)
        want.add(tuple((pulse + k * period_ns, acq + k * period_ns) for k in range(shots)))

    got = set()
    for slot, seq in job.sequencers:
        r = sim._modules[slot].sequencers[seq].rt_renderer
        assert r.time - r.t_sync - PREAMBLE_NS == armed.program_duration_ns, (slot, seq)
        if not r.acq_times or not any(r.acq_times.values()):
            continue
        out = np.abs(np.asarray(r.get_output(1.0)["I"].data))
        on = np.flatnonzero(np.diff((out > 0).astype(int)) == 1) + 1 - PREAMBLE_NS
        acqs = sorted(t - PREAMBLE_NS for times in r.acq_times.values() for t, _ in times)
        got.add(tuple(zip((int(t) for t in on[:shots]), acqs, strict=True)))
    assert len(want) == text.count("measure"), want   # one readout a measured qubit
    assert got == want
    assert armed.program_duration_ns == round(comp.duration * 1e9)
