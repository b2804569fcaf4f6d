"""How qpu-labone reaches the instruments: a LabOne Q Session on the lab's
DeviceSetup, connected to the Data Server (real instruments), or to LabOne
Q's emulator (do_emulation=True), which stands in for the Data Server and
the instruments.  The emulator has, for tests, a power switch: while
`power_file` is absent, the probe fails as unreachable instruments would,
and connect() fails too; and a journal (`journal`, JSON lines): each
compiled experiment as it is uploaded at ARM (snapshot())."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any


def load_setup(path: str | Path) -> Any:
    """The DeviceSetup in `path` (LabOne Q's serialization, laboneq.serializers.to_json)."""
    from laboneq.dsl.device import DeviceSetup
    from laboneq.serializers import from_json

    setup = from_json(Path(path).read_bytes())
    if not isinstance(setup, DeviceSetup):
        raise ValueError(f"{path}: a {type(setup).__name__}, not a DeviceSetup")
    return setup


def snapshot(compiled: Any) -> dict[str, Any]:
    """What a CompiledExperiment puts on the instruments: the seqc sources
    by file, the waveforms' samples by name ([re, im] for complex ones),
    the command tables, and each oscillator's frequency by signal."""
    import numpy as np

    waves: dict[str, Any] = {}
    for name, w in compiled.waves.items():
        a = np.asarray(w.samples)
        waves[name] = a.round(9).tolist() if not np.iscomplexobj(a) else \
            np.stack([a.real, a.imag], axis=-1).round(9).tolist()
    return {"src": {s["filename"]: s["text"] for s in compiled.src},
            "waves": waves,
            "command_tables": compiled.command_tables,
            "oscillators": {o.signal_id: o.frequency
                            for o in compiled.scheduled_experiment.recipe.oscillator_params}}


class Lab:
    def __init__(self, setup: Any, emulate: bool, power_file: str | None = None,
                 journal: str | None = None) -> None:
        self.setup = setup
        self.emulate = emulate
        self.power_file = power_file
        self.journal = journal

    def record(self, req: Any, compiled: Any) -> None:
        """The stack's `observe`: one journal line per ARM compiled."""
        if self.journal is None:
            return
        line = {"t": time.time_ns(), "call": "arm", "job": req.job_id, "calibration_id": req.calibration_id,
                **snapshot(compiled)}
        with open(self.journal, "a") as f:
            f.write(json.dumps(line, default=str) + "\n")

    def _powered(self) -> None:
        if self.power_file is not None and not os.path.exists(self.power_file):
            raise ConnectionRefusedError(f"the emulated instruments are off ({self.power_file} is absent)")

    def connect(self) -> Any:
        from laboneq.simple import Session

        self._powered()
        session = Session(self.setup, log_level=logging.WARNING)
        session.connect(do_emulation=self.emulate)
        return session

    def probe(self) -> None:
        self._powered()
