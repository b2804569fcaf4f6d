"""The dummy Cluster of qblox-instruments: the official driver talking to
its in-process stand-in for the instrument (the SCPI transport answers as
the modules would: sequencer states, waveform memory, binned acquisitions
the test sets).

The dummy assembles each uploaded Q1ASM program with the assembler Qblox
bundles in qblox-instruments (assemblers/q1asm_linux), writing tmp.q1asm in
the current directory.  That binary needs glibc 2.38; on an older host
(Debian 12 has 2.36) it cannot start, and every upload would fail "Assembly
failed.".  There, and only there, the dummy's assembly step is done by
q1simulator's Q1ASM parser instead (the program is parsed instruction by
instruction, a syntax error fails the upload the same way), and the
program text is kept per sequencer, as the instrument's program memory
would hold it.  `ASSEMBLER` says which one is in use.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import qblox_instruments
from qblox_instruments import Cluster, ClusterType
from qblox_instruments.ieee488_2.module_dummy_transport import ModuleDummyTransport

MODULE_TYPES = {
    "QCM": ClusterType.CLUSTER_QCM,
    "QCM_RF": ClusterType.CLUSTER_QCM_RF,
    "QRM": ClusterType.CLUSTER_QRM,
    "QRM_RF": ClusterType.CLUSTER_QRM_RF,
}


def _bundled_assembler_runs() -> bool:
    path = os.path.join(os.path.dirname(qblox_instruments.__file__), "assemblers", "q1asm_linux")
    try:
        p = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return False
    return "GLIBC" not in p.stderr and "not found" not in p.stderr


ASSEMBLER = "qblox q1asm" if _bundled_assembler_runs() else "q1simulator parser"

_original_set_program = ModuleDummyTransport._set_sequencer_program


def _set_sequencer_program(self: Any, cmd_params: list[Any], cmd_args: list[Any], bin_in: bytes) -> None:
    from q1simulator.q1parser import Q1Parser

    text = self._decode_bin(bin_in).decode()
    programs = self.__dict__.setdefault("qrt_programs", {})
    try:
        Q1Parser().parse(text)
    except Exception as e:  # the parser raises several types, each naming the line
        self._asm_log = " ".join(str(a) for a in e.args)
        self._asm_status = False
        self._system_error.append("Assembly failed.")
        return
    self._asm_log = ""
    self._asm_status = True
    programs[int(cmd_params[0])] = text


if ASSEMBLER != "qblox q1asm":
    ModuleDummyTransport._set_sequencer_program = _set_sequencer_program


def dummy_cluster(name: str, modules: dict[int, str]) -> Cluster:
    """A dummy Cluster named `name` with `modules` ({slot: "QCM_RF", ...})."""
    cfg = {slot: MODULE_TYPES[kind] for slot, kind in modules.items()}
    return Cluster(name, dummy_cfg=cfg)


def uploaded_program(cluster: Cluster, slot: int, sequencer: int) -> str | None:
    """The Q1ASM the dummy module in `slot` holds for `sequencer` (only with
    the q1simulator stand-in; None otherwise)."""
    transport = cluster._transport._modules[str(slot)]
    programs: dict[int, str] = transport.__dict__.get("qrt_programs", {})
    return programs.get(sequencer)
