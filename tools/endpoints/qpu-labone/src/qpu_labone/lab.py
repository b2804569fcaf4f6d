"""How qpu-labone reaches the instruments: a LabOne Q Session on the lab's
DeviceSetup, connected to the Data Server (real instruments), or to LabOne
Q's emulator (do_emulation=True), which stands in for the Data Server and
the instruments.  The emulator has a power switch for tests: while
`power_file` is absent, the probe fails as unreachable instruments would,
and connect() fails too."""

from __future__ import annotations

import logging
import os
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


class Lab:
    def __init__(self, setup: Any, emulate: bool, power_file: str | None = None) -> None:
        self.setup = setup
        self.emulate = emulate
        self.power_file = power_file

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
