"""What the end-to-end tests through qrtd (test_qrtd_stacks.py, in the SDK's
venv) do in a control stack's own venv, where its compiler is:

  stack_lab.py STACK write-sets ROOT
      the calibration sets 1 and 2 of QPU qpu0 under ROOT, as the
      calibration service writes them (set 2: another drive frequency on
      q0 and half its pi amplitude; labone: and thresholds no readout
      reaches, so every count is 0);
  stack_lab.py STACK compile ROOT ID  < envelope.json
      an independent compilation of the envelope's circuits against set ID,
      as JSON on stdout: what each sequencer (qblox: "module<slot>.seq<n>"
      with its program, waveforms by index and its NCO frequency) or the
      instruments (labone: qpu_labone.lab.snapshot, the seqc sources,
      waveforms, command tables and oscillator frequencies) must hold;
  stack_lab.py labone facts ROOT ID
      set ID's qubits and couplers, read by LabOne Q's deserializer.

STACK is qblox or labone.  Run with the stack's venv's python, in a
scratch directory (the dummy's assembler writes there)."""

from __future__ import annotations

import json
import sys
from typing import Any


def qblox_write_sets(root: str) -> None:
    from qpu_qblox import calibration

    calibration.write_set(root, "qpu0", 1, calibration.example_device(), calibration.example_hardware())
    calibration.write_set(root, "qpu0", 2, calibration.example_device(f01=(5.20e9, 5.32e9, 5.55e9),
                                                                      amp180=(0.16, 0.29, 0.35)),
                          calibration.example_hardware())


def qblox_compile(root: str, cal_id: int, env: dict[str, Any]) -> dict[str, Any]:
    from qblox_scheduler.backends.graph_compilation import SerialCompiler

    from qpu_qblox import qasm
    from qpu_qblox.calibration import CalibrationStore
    from qpu_qblox.stack import QbloxStack

    cal = CalibrationStore(root, "qpu0").load(cal_id)
    circuits = [(c["name"], qasm.read(c["qasm"], len(cal.qubits))) for c in env["circuits"]]
    compiled = SerialCompiler("test").compile(QbloxStack.schedule(cal, circuits, env["shots"]), config=cal.config)
    out: dict[str, Any] = {"duration_ns": round(compiled.duration * 1e9), "sequencers": {}}
    for key, mod in compiled.compiled_instructions["cluster0"].items():
        if not key.startswith("cluster0_module") or not isinstance(mod, dict):
            continue
        slot = int(key.rsplit("module", 1)[1])
        for name, seq in mod.get("sequencers", {}).items():
            s = seq.sequence
            out["sequencers"][f"module{slot}.{name}"] = {
                "program": s["program"],
                "waveforms": {str(w["index"]): list(map(float, w["data"])) for w in s["waveforms"].values()},
                "modulation_freq": seq.modulation_freq}
    return out


def labone_write_sets(root: str) -> None:
    from qpu_labone import calibration

    calibration.write_set(root, "qpu0", 1, calibration.example()[0])
    calibration.write_set(root, "qpu0", 2, calibration.example(f_ge=(4.15e9, 4.32e9, 4.55e9),
                                                               amplitude_pi=(0.31, 0.58, 0.66),
                                                               thresholds=(1e9, 1e9, 1e9))[0])


def labone_compile(root: str, cal_id: int, env: dict[str, Any]) -> dict[str, Any]:
    import logging

    from laboneq.simple import Session

    from qpu_labone import calibration
    from qpu_labone.lab import snapshot
    from qpu_labone.stack import LabOneStack

    cal = calibration.CalibrationStore(root, "qpu0").load(cal_id)
    session = Session(calibration.example()[1], log_level=logging.WARNING)
    session.connect(do_emulation=True)
    exp = LabOneStack.experiment(cal, [c["qasm"] for c in env["circuits"]], env["shots"])
    return json.loads(json.dumps(snapshot(session.compile(exp)), default=str))


def labone_facts(root: str, cal_id: int) -> dict[str, Any]:
    """The set's qubits and couplers, read by LabOne Q's deserializer."""
    from qpu_labone import calibration

    cal = calibration.CalibrationStore(root, "qpu0").load(cal_id)
    uids = [q.uid for q in cal.qubits]
    couplers = [(i, uids.index(p)) for i, q in enumerate(cal.qubits) for p in (q.parameters.custom.get("cz") or {})]
    return {"qubits": len(uids), "couplers": couplers}


def main(argv: list[str]) -> int:
    stack, cmd, root = argv[:3]
    if stack == "qblox" and cmd == "write-sets":
        qblox_write_sets(root)
    elif stack == "qblox" and cmd == "compile":
        json.dump(qblox_compile(root, int(argv[3]), json.load(sys.stdin)), sys.stdout)
    elif stack == "labone" and cmd == "write-sets":
        labone_write_sets(root)
    elif stack == "labone" and cmd == "compile":
        json.dump(labone_compile(root, int(argv[3]), json.load(sys.stdin)), sys.stdout)
    elif stack == "labone" and cmd == "facts":
        json.dump(labone_facts(root, int(argv[3])), sys.stdout)
    else:
        print(f"stack_lab.py: {stack} {cmd}: not a command (see the docstring)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
