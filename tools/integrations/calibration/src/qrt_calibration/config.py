"""qrt-calibration's configuration (TOML; qrt-calibration(8), CONFIGURATION)."""

from __future__ import annotations

import importlib
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .service import NS, QpuSettings
from .steps import KINDS, Step

DEFAULT_CONFIG = "/etc/qrtd/calibration.toml"


class ConfigError(ValueError):
    """A configuration that cannot be used: names the file, the key and why."""


@dataclass
class Config:
    socket: str
    qpus: list[QpuSettings]
    steps: list[dict[str, Any]]


def _settings(where: str, t: dict[str, Any]) -> QpuSettings:
    known = {f.name for f in fields(QpuSettings)}
    unknown = set(t) - known
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
    for key in ("name", "qubits"):
        if key not in t:
            raise ConfigError(f"{where}: {key} is missing")
    q = t["qubits"]
    if not isinstance(q, list) or not q or not all(isinstance(i, int) and 0 <= i < 1024 for i in q):
        raise ConfigError(f"{where}.qubits: give a list of qubit indices 0..1023, not {q!r}")
    try:
        return QpuSettings(**t)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


def build_step(where: str, t: dict[str, Any]) -> Step:
    """A step from its table: kind is a reference step (x_amplitude, readout)
    or "module:Class" of another framework's (built with the other keys);
    duration_s is the block it needs."""
    t = dict(t)
    kind = t.pop("kind", None)
    if not isinstance(kind, str):
        raise ConfigError(f"{where}: kind is missing (x_amplitude, readout, or module:Class)")
    if "duration_s" in t:
        t["duration_ns"] = int(float(t.pop("duration_s")) * NS)
    if kind in KINDS:
        cls: Any = KINDS[kind]
    else:
        module, _, name = kind.partition(":")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as e:
            raise ConfigError(f"{where}.kind {kind!r}: {e}") from None
    try:
        step: Step = cls(**t)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None
    for attr in ("name", "staleness_s", "duration_ns", "check", "run"):
        if not hasattr(step, attr):
            raise ConfigError(f"{where}: {kind} has no {attr}: not a calibration step")
    if step.staleness_s <= 0 or step.duration_ns <= 0:
        raise ConfigError(f"{where}: staleness_s and duration_s must be > 0")
    return step


def load(path: str | Path) -> Config:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from None
    unknown = set(data) - {"socket", "qpu", "step"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)} (known: socket, [[qpu]], [[step]])")
    qpus = [_settings(f"{path}: qpu[{i}]", t) for i, t in enumerate(data.get("qpu", []))]
    if not qpus:
        raise ConfigError(f"{path}: no [[qpu]] to calibrate")
    steps = data.get("step", [])
    if not steps:
        raise ConfigError(f"{path}: no [[step]]")
    names = [build_step(f"{path}: step[{i}]", t).name for i, t in enumerate(steps)]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: step names must differ: {names}")
    return Config(str(data.get("socket", "/run/qrtd/qrtd.sock")), qpus, steps)
