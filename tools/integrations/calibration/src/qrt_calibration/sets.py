"""Calibration sets: the SetWriter a device provides, and finding the next id.

The set's format is the endpoint's (it compiles or simulates against it):
qpu-aer's aer.json (qpu_aer_drift.AerSetWriter), the control stacks'
qblox-scheduler and LabOne Q files.  qrt-calibration names the writer by
import path in its configuration ("module:Class", built with the root and
the QPU) and never reads a set's fields itself.  Sets live in
<root>/<qpu>/<calibration_id>/, one directory per id, written whole by one
rename before calibration.update names the id, never changed afterwards.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from .steps import Measurement


class SetWriter(Protocol):
    """What a device's set writer provides (see the module docstring)."""

    def read(self, calibration_id: int) -> Any:
        """The set of that id; raises (ValueError or OSError) when there is none."""
        ...

    def nominal(self, calibration_id: int) -> Any:
        """The device's nominal set under that id (the service's first)."""
        ...

    def apply(self, s: Any, step: str, measurement: Mapping[str, Any], calibration_id: int,
              measured_ns: int) -> Any:
        """A new set: s corrected by one step's measurement (Measurement.to_json())."""
        ...

    def write(self, s: Any) -> Path:
        """Write the set whole and atomically; an id that exists is refused."""
        ...


def load_writer(spec: str, root: Path | str, qpu: str) -> SetWriter:
    """The writer named "module:Class", built as Class(root, qpu)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f'set_writer "{spec}": give "module:Class" (e.g. "qpu_aer_drift:AerSetWriter")')
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f'set_writer "{spec}": {e}') from None
    writer: SetWriter = cls(root, qpu)
    return writer


def next_id(root: Path | str, qpu: str, *seen: int) -> int:
    """One more than every id written under <root>/<qpu> and every id seen
    in qrtd's windows: a new calibration is a new id, never reused."""
    top = max(seen, default=0)
    qdir = Path(root) / qpu
    if qdir.is_dir():
        for p in qdir.iterdir():
            name = p.name.lstrip(".").split(".")[0]
            if name.isdigit():
                top = max(top, int(name))
    return top + 1


def apply_all(writer: SetWriter, s: Any, measurements: Mapping[str, Measurement], calibration_id: int,
              measured_ns: int) -> Any:
    for step, m in measurements.items():
        s = writer.apply(s, step, m.to_json(), calibration_id, measured_ns)
    return s
