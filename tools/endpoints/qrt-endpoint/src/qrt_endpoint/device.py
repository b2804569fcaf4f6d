"""The device facts a control stack's calibration set implies, as qrtd's
[qpu.device] sub-table (qrtd.toml(5)): qubits, technology, basis_gates,
coupling_map, gate_durations_ns.  qpus.list serves that table and the SDKs
build their targets from it (the Qiskit backend's Target, QDMI's sites and
operations), so a stack prints it from the set it compiles against
(`qpu-qblox --print-device ID`) and the lab pastes it under the QPU's
[[qpu]]: the set is the one home of these facts, and a circuit that needs
more qubits than the set has is refused by qrtd at jobs.submit."""

from __future__ import annotations

import json
from typing import Any


def facts(qubits: int, basis_gates: list[str], pairs: list[tuple[int, int]],
          durations_ns: dict[str, int], technology: str = "superconducting") -> dict[str, Any]:
    """The [qpu.device] facts: `pairs` are the set's couplers, undirected;
    coupling_map lists each both ways (a CZ is symmetric)."""
    coupling = sorted({(a, b) for a, b in pairs} | {(b, a) for a, b in pairs})
    return {"qubits": qubits, "technology": technology, "basis_gates": list(basis_gates),
            "coupling_map": [list(p) for p in coupling],
            "gate_durations_ns": {g: int(durations_ns[g]) for g in basis_gates if g in durations_ns}}


def toml(device: dict[str, Any], calibration: str = "") -> str:
    """`device` as the [qpu.device] sub-table, with a comment naming the
    set it came from."""
    out = []
    if calibration:
        out.append(f"# from {calibration}")
    out.append("[qpu.device]")
    for k, v in device.items():
        if isinstance(v, dict):
            out.append(f"{k} = {{ " + ", ".join(f"{g} = {n}" for g, n in v.items()) + " }")
        else:
            out.append(f"{k} = {json.dumps(v)}")
    return "\n".join(out) + "\n"
