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

import json
import os
import subprocess
import time
from typing import Any

import qblox_instruments
from qblox_instruments import Cluster, ClusterType
from qblox_instruments.ieee488_2 import DummyBinnedAcquisitionData
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


# ------------------------------------------------------------ the dummy as qpu-qblox --dummy runs it

def parse_modules(text: str) -> dict[int, str]:
    """"2:QCM_RF,4:QCM_RF,6:QCM,8:QRM_RF" -> {2: "QCM_RF", ...} (ValueError naming what is wrong)."""
    out: dict[int, str] = {}
    for part in text.split(","):
        slot, _, kind = part.strip().partition(":")
        if not slot.isdigit() or not 1 <= int(slot) <= 20 or kind not in MODULE_TYPES:
            raise ValueError(f"{part.strip()!r}: give SLOT:TYPE, SLOT 1..20, TYPE one of {', '.join(MODULE_TYPES)}")
        out[int(slot)] = kind
    return out


class DummyLab:
    """The dummy Cluster behind qpu-qblox --dummy, with what a test bench
    around an instrument would have:

    - a power switch (`power_file`): while the file is absent, every call
      of the driver fails at the transport with ConnectionRefusedError, as
      on a Cluster that is off or off the network; connect() (the stack's
      reconnect) then fails too, and succeeds with a new dummy, its state
      lost as after a power cycle, once the file is back;
    - a journal (`journal`, JSON lines): each arm_sequencer with its time,
      the state after it and the program and waveforms (by index) the
      sequencer holds;
      each start_sequencer with its time and the states after it; each
      stop_sequencer;
    - acquisitions (`acquisitions`, a JSON file the test writes before the
      job: {"module8.seq0": {"0": [[I, Q], ...]}}): given to the dummy for
      that sequencer as it is armed, so the RESULT's counts come from them.
    """

    def __init__(self, name: str, modules: dict[int, str], power_file: str | None = None,
                 journal: str | None = None, acquisitions: str | None = None) -> None:
        self.name = name
        self.modules = modules
        self.power_file = power_file
        self.journal = journal
        self.acquisitions = acquisitions

    def powered(self) -> bool:
        return self.power_file is None or os.path.exists(self.power_file)

    def connect(self) -> Cluster:
        if not self.powered():
            raise ConnectionRefusedError(f"the dummy Cluster is off ({self.power_file} is absent)")
        cluster = dummy_cluster(self.name, self.modules)
        if self.power_file is not None:
            transports = [cluster._transport, *(t for t in cluster._transport._modules.values() if t is not None)]
            for t in transports:
                self._switch(t)
        if self.journal is not None or self.acquisitions is not None:
            self._instrument(cluster)
        return cluster

    def _switch(self, transport: Any) -> None:
        path = self.power_file
        for name in ("write", "write_binary", "read_binary", "readline"):
            real = getattr(transport, name)

            async def call(*a: Any, _real: Any = real, **kw: Any) -> Any:
                if not os.path.exists(path or ""):
                    raise ConnectionRefusedError(f"the dummy Cluster is off ({path} is absent)")
                return await _real(*a, **kw)
            setattr(transport, name, call)

    def _record(self, event: dict[str, Any]) -> None:
        if self.journal is None:
            return
        with open(self.journal, "a") as f:
            f.write(json.dumps(event, default=str) + "\n")

    def _instrument(self, cluster: Cluster) -> None:
        arm, start, stop = cluster.arm_sequencer, cluster.start_sequencer, cluster.stop_sequencer

        def armed(slot: int, seq: int) -> None:
            arm(slot, seq)
            t = time.time_ns()
            self._acquire(cluster, slot, seq)
            if self.journal is not None:
                held = getattr(getattr(cluster, f"module{slot}"), f"sequencer{seq}").sequence.cache()
                # by index, the program's reference (their names are the compiler's hashes)
                waves = {str(w["index"]): w["data"] for w in cluster.get_waveforms(slot, seq).values()}
                self._record({"t": t, "call": "arm_sequencer", "slot": slot, "seq": seq,
                              "state": cluster.get_sequencer_status(slot, seq).state.name,
                              "program": held.get("program"), "waveforms": waves})

        def started(*a: Any) -> None:
            t = time.time_ns()
            start(*a)
            if self.journal is not None:
                states = {f"module{m}.seq{s}": cluster.get_sequencer_status(m, s).state.name
                          for m in self.modules for s in range(2)}
                self._record({"t": t, "call": "start_sequencer", "args": list(a), "states": states})

        def stopped(slot: int | None = None, seq: int | None = None) -> None:
            stop(slot, seq)
            self._record({"t": time.time_ns(), "call": "stop_sequencer", "slot": slot, "seq": seq})

        cluster.arm_sequencer = armed
        cluster.start_sequencer = started
        cluster.stop_sequencer = stopped

    def _acquire(self, cluster: Cluster, slot: int, seq: int) -> None:
        if self.acquisitions is None or not os.path.exists(self.acquisitions):
            return
        with open(self.acquisitions) as f:
            data = json.load(f).get(f"module{slot}.seq{seq}", {})
        for acq, bins in data.items():
            cluster.set_dummy_binned_acquisition_data(slot, seq, acq, [
                DummyBinnedAcquisitionData(data=(float(i), float(q)), thres=0, avg_cnt=1) for i, q in bins])
