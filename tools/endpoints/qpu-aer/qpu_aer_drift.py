"""qpu-aer's drifting device: what stands in for a real QPU's drift, and the
calibration set that corrects it.

The simulated device has, per qubit q, two parameters that drift with the
device's time t (hours since the drift's origin, scaled by time_scale so a
test can pass hours in minutes):

- the X gain g_q(t) = 1 + x_gain_per_hour * (1 + qubit_spread * q) * h(t):
  an X gate played with the set's amplitude x_amp rotates by
  pi * x_amp * g_q(t), a coherent over-rotation of
  pi * (x_amp * g_q(t) - 1) radians per X (only X: sx and rz are exact);
- the readout's discriminator offset s_q(t) = readout_shift_per_hour *
  (1 + qubit_spread * q) * h(t), in units of half the distance between the
  |0> and |1> signal blobs, each blob Gaussian of width readout_sigma.  With
  the set's threshold th, the threshold sits tau = s_q(t) - th off the
  middle, and a measurement reads 1 for |0> with p10 = Q((1 + tau) / sigma)
  and 0 for |1> with p01 = Q((1 - tau) / sigma), Q the normal tail.

So the error of a job grows with the time since its set was measured, and a
set measured now (x_amp = x_amp_old * pi / (pi + d_theta), th = th_old +
tau) takes both back to their baseline: no over-rotation, and the readout
error Q(1 / sigma) of the blobs' width.  Each job's noise is qiskit-aer's
own: a coherent unitary error RX(over-rotation) after every x, and a
ReadoutError of (p10, p01) on every measurement, for the job's calibration
set at the job's scheduled start.

The calibration set (one per calibration id, never changed once written):

    <root>/<qpu>/<calibration_id>/aer.json
    {"format": "qpu-aer-calibration", "version": 1, "calibration_id": 7,
     "measured_ns": 1767225600000000000,
     "qubits": {"0": {"x_amp": 0.99612, "readout_threshold": 0.213}, ...}}

A qubit the set does not name has the nominal parameters (x_amp 1,
readout_threshold 0).  The calibration service writes it (write_set, or
AerSetWriter for qrt-calibration: whole, into a temporary directory beside
it, then one rename, before its calibration.update), the endpoint only
reads it (load_set, SetStore).  A file writable by group or others is
refused, like the control stacks' sets (tools/endpoints/README.md).
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

DEFAULT_ROOT = Path("/var/lib/qrtd-calibration")
SET_FILE = "aer.json"
SET_FORMAT = "qpu-aer-calibration"
SET_VERSION = 1
MAX_CACHED = 8
MAX_QUBITS = 1024
NS_PER_HOUR = 3_600_000_000_000

# The steps qpu-aer's sets take measurements of (qrt-calibration's names).
STEP_X_AMPLITUDE = "x_amplitude"
STEP_READOUT = "readout"


class SetError(ValueError):
    """A calibration set that is missing or cannot be used (names the file and why)."""


@dataclass(frozen=True)
class QubitParams:
    x_amp: float = 1.0              # X amplitude, relative to the nominal pi pulse
    readout_threshold: float = 0.0  # discriminator threshold, in half blob separations

    def to_json(self) -> dict[str, float]:
        return {"x_amp": self.x_amp, "readout_threshold": self.readout_threshold}


NOMINAL = QubitParams()


@dataclass(frozen=True)
class AerSet:
    calibration_id: int
    measured_ns: int = 0
    qubits: Mapping[int, QubitParams] = field(default_factory=dict)

    def params(self, q: int) -> QubitParams:
        return self.qubits.get(q, NOMINAL)

    def to_json(self) -> dict[str, Any]:
        return {"format": SET_FORMAT, "version": SET_VERSION, "calibration_id": self.calibration_id,
                "measured_ns": self.measured_ns,
                "qubits": {str(q): p.to_json() for q, p in sorted(self.qubits.items())}}


def parse_set(data: Any, where: str) -> AerSet:
    """An AerSet from aer.json's object; SetError naming the field otherwise."""
    if not isinstance(data, dict):
        raise SetError(f"{where}: not a JSON object")
    if data.get("format") != SET_FORMAT or data.get("version") != SET_VERSION:
        raise SetError(f'{where}: format must be "{SET_FORMAT}" version {SET_VERSION}, not '
                       f'{data.get("format")!r} version {data.get("version")!r}')
    cid = data.get("calibration_id")
    if not isinstance(cid, int) or isinstance(cid, bool) or cid <= 0:
        raise SetError(f"{where}: calibration_id {cid!r} is not a positive integer")
    measured = data.get("measured_ns", 0)
    if not isinstance(measured, int) or isinstance(measured, bool) or measured < 0:
        raise SetError(f"{where}: measured_ns {measured!r} is not an integer >= 0")
    qubits = data.get("qubits", {})
    if not isinstance(qubits, dict) or len(qubits) > MAX_QUBITS:
        raise SetError(f"{where}: qubits must be an object of at most {MAX_QUBITS} qubits")
    out: dict[int, QubitParams] = {}
    for key, p in qubits.items():
        if not key.isdigit() or int(key) >= MAX_QUBITS:
            raise SetError(f"{where}: qubits.{key}: not a qubit index 0..{MAX_QUBITS - 1}")
        if not isinstance(p, dict) or set(p) - {"x_amp", "readout_threshold"}:
            raise SetError(f"{where}: qubits.{key} must be an object of x_amp and readout_threshold")
        x_amp = p.get("x_amp", 1.0)
        th = p.get("readout_threshold", 0.0)
        for name, v, lo, hi in (("x_amp", x_amp, 0.5, 2.0), ("readout_threshold", th, -1.0, 1.0)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
                raise SetError(f"{where}: qubits.{key}.{name} = {v!r} is not a number in [{lo}, {hi}]")
        out[int(key)] = QubitParams(float(x_amp), float(th))
    return AerSet(cid, measured, out)


def load_set(qdir: Path | str, calibration_id: int) -> AerSet:
    """The set of calibration_id in a QPU's directory (<root>/<qpu>):
    <qdir>/<id>/aer.json, checked."""
    path = Path(qdir) / str(calibration_id) / SET_FILE
    if calibration_id <= 0 or not path.is_file():
        raise SetError(f"no calibration set {calibration_id}: {path} does not exist")
    st = path.stat()
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SetError(f"{path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); only the "
                       "calibration service may write calibration sets")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SetError(f"{path}: {e}") from None
    s = parse_set(data, str(path))
    if s.calibration_id != calibration_id:
        raise SetError(f"{path}: holds calibration_id {s.calibration_id}, not {calibration_id}")
    return s


class SetStore:
    """The sets of one QPU, in its directory <root>/<qpu>.  Sets are
    immutable, so a loaded one is kept (the last MAX_CACHED)."""

    def __init__(self, qdir: Path | str) -> None:
        self.qdir = Path(qdir)
        self._cache: OrderedDict[int, AerSet] = OrderedDict()

    def load(self, calibration_id: int) -> AerSet:
        if calibration_id in self._cache:
            self._cache.move_to_end(calibration_id)
            return self._cache[calibration_id]
        s = load_set(self.qdir, calibration_id)
        self._cache[calibration_id] = s
        if len(self._cache) > MAX_CACHED:
            self._cache.popitem(last=False)
        return s


def write_set(qdir: Path | str, s: AerSet) -> Path:
    """Write a set (for the calibration service): whole or not at all, by one
    rename of a directory made beside it.  An id that exists is refused:
    sets are never changed; a new calibration is a new id."""
    parse_set(s.to_json(), f"calibration set {s.calibration_id}")
    qdir = Path(qdir)
    final = qdir / str(s.calibration_id)
    if final.exists():
        raise SetError(f"{final} exists: a calibration set is never changed; write a new id")
    qdir.mkdir(parents=True, exist_ok=True, mode=0o755)
    tmp = Path(tempfile.mkdtemp(prefix=f".{s.calibration_id}.", dir=qdir))
    try:
        with open(tmp / SET_FILE, "w") as f:
            json.dump(s.to_json(), f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp / SET_FILE, 0o644)
        os.chmod(tmp, 0o755)  # noqa: S103 -- read by the endpoint's group; written only by its owner
        os.rename(tmp, final)
    except BaseException:
        for p in tmp.glob("*"):
            p.unlink()
        tmp.rmdir()
        raise
    fd = os.open(qdir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return final


# ------------------------------------------------------------------ the drift

def q_tail(x: float) -> float:
    """The standard normal's upper tail, P(Z > x)."""
    return 0.5 * math.erfc(x / math.sqrt(2.0))


def q_tail_inverse(p: float) -> float:
    """x with P(Z > x) = p, for 0 < p < 1."""
    return -NormalDist().inv_cdf(p)


@dataclass(frozen=True)
class Drift:
    """The device's drift (module docstring).  Rates are per hour of device
    time; time_scale device seconds pass per second of CLOCK_REALTIME, from
    origin_ns on."""

    x_gain_per_hour: float = 0.0
    readout_shift_per_hour: float = 0.0
    readout_sigma: float = 0.43       # Q(1 / 0.43): 1.0 % readout error at the best threshold
    time_scale: float = 1.0
    origin_ns: int = 0
    qubit_spread: float = 0.25        # qubit q drifts (1 + spread * q) times as fast as qubit 0

    def __post_init__(self) -> None:
        if not 0.05 <= self.readout_sigma <= 2.0:
            raise ValueError(f"readout sigma {self.readout_sigma}: give 0.05..2")
        if not 0.0 < self.time_scale <= 1e6:
            raise ValueError(f"drift time scale {self.time_scale}: give (0, 1e6]")
        for name, v in (("x gain", self.x_gain_per_hour), ("readout shift", self.readout_shift_per_hour)):
            if not -1.0 <= v <= 1.0:
                raise ValueError(f"{name} drift {v} per hour: give -1..1")

    @property
    def active(self) -> bool:
        return self.x_gain_per_hour != 0.0 or self.readout_shift_per_hour != 0.0

    def hours(self, t_ns: int) -> float:
        return max(0, t_ns - self.origin_ns) * self.time_scale / NS_PER_HOUR

    def over_rotation(self, q: int, t_ns: int, p: QubitParams) -> float:
        gain = 1.0 + self.x_gain_per_hour * (1.0 + self.qubit_spread * q) * self.hours(t_ns)
        return math.pi * (p.x_amp * gain - 1.0)

    def readout(self, q: int, t_ns: int, p: QubitParams) -> tuple[float, float]:
        """(p10, p01): P(read 1 | prepared 0), P(read 0 | prepared 1)."""
        shift = self.readout_shift_per_hour * (1.0 + self.qubit_spread * q) * self.hours(t_ns)
        off = shift - p.readout_threshold
        return q_tail((1.0 + off) / self.readout_sigma), q_tail((1.0 - off) / self.readout_sigma)

    def noise_spec(self, s: AerSet, t_ns: int, qubits: int) -> dict[str, Any]:
        """What a job's simulator needs (JSON, sent to the worker process):
        per qubit, the X over-rotation and (p10, p01)."""
        return {"calibration_id": s.calibration_id, "t_ns": t_ns,
                "over_rotation": [self.over_rotation(q, t_ns, s.params(q)) for q in range(qubits)],
                "readout": [list(self.readout(q, t_ns, s.params(q))) for q in range(qubits)]}


def noise_model(spec: Mapping[str, Any]) -> Any:
    """qiskit-aer's NoiseModel for a noise_spec: a coherent RX(over-rotation)
    after each x, a ReadoutError on each measurement."""
    from qiskit.circuit.library import RXGate
    from qiskit_aer.noise import NoiseModel, ReadoutError, coherent_unitary_error

    nm = NoiseModel(basis_gates=["x", "sx", "rz", "cx", "measure"])
    for q, angle in enumerate(spec["over_rotation"]):
        if angle != 0.0:
            nm.add_quantum_error(coherent_unitary_error(RXGate(float(angle)).to_matrix()), ["x"], [q])
    for q, (p10, p01) in enumerate(spec["readout"]):
        nm.add_readout_error(ReadoutError([[1.0 - p10, p10], [p01, 1.0 - p01]]), [q])
    return nm


# ------------------------------------------------- the calibration service's side

class AerSetWriter:
    """qpu-aer's set writer for qrt-calibration (its SetWriter interface):
    reads the set in force, turns a step's measurement into new parameters,
    and writes the new set.

    Measurements (qrt-calibration's steps):
      x_amplitude: {"qubits": {q: {"d_theta": over-rotation per X, rad}}}
        -> x_amp * pi / (pi + d_theta)
      readout: {"qubits": {q: {"p10": ..., "p01": ...}}} (the assignment
        errors) -> the threshold moved by the offset the two Gaussian tails
        give: tau = (Qi(p10) - Qi(p01)) / (Qi(p10) + Qi(p01)), Qi = Q^-1."""

    def __init__(self, root: Path | str, qpu: str) -> None:
        self.qdir = Path(root) / qpu

    def read(self, calibration_id: int) -> AerSet:
        return load_set(self.qdir, calibration_id)

    def nominal(self, calibration_id: int) -> AerSet:
        return AerSet(calibration_id, 0, {})

    @staticmethod
    def readout_offset(p10: float, p01: float, shots: int = 1_000_000) -> float:
        """The threshold's offset from the middle, from the two assignment
        errors (clipped to what the shots can resolve)."""
        lo = 0.5 / max(1, shots)
        u = q_tail_inverse(min(max(p10, lo), 0.5 - 1e-9))
        v = q_tail_inverse(min(max(p01, lo), 0.5 - 1e-9))
        return (u - v) / (u + v)

    def apply(self, s: AerSet, step: str, measurement: Mapping[str, Any], calibration_id: int,
              measured_ns: int) -> AerSet:
        if step not in (STEP_X_AMPLITUDE, STEP_READOUT):
            raise SetError(f"qpu-aer's set has no parameter for step {step!r} (it takes "
                           f"{STEP_X_AMPLITUDE} and {STEP_READOUT})")
        qubits: dict[int, QubitParams] = dict(s.qubits)
        shots = int(measurement.get("shots", 1_000_000))
        for key, m in measurement["qubits"].items():
            q = int(key)
            p = s.params(q)
            if step == STEP_X_AMPLITUDE:
                qubits[q] = QubitParams(p.x_amp * math.pi / (math.pi + float(m["d_theta"])), p.readout_threshold)
            else:
                off = self.readout_offset(float(m["p10"]), float(m["p01"]), shots)
                qubits[q] = QubitParams(p.x_amp, max(-1.0, min(1.0, p.readout_threshold + off)))
        return AerSet(calibration_id, measured_ns, qubits)

    def write(self, s: AerSet) -> Path:
        return write_set(self.qdir, s)


