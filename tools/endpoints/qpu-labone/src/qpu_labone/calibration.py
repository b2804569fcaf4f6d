"""Calibration sets, keyed by calibration id, in LabOne Q's own
serialization (laboneq.serializers: to_json / from_json).

Layout (one directory per QPU, one per calibration id, decimal):

    <root>/<qpu>/<calibration_id>/qpu.json   the QPU: its Transmon qubits and their parameters

The DeviceSetup (instruments, Data Server, wiring) is the lab's, not a
calibration's: the endpoint is given it at start (README).

The default root is /var/lib/qrtd-calibration.  The calibration service
writes a set (write_set: a temporary directory beside it, fsync, one
rename) before it calls qrtd's calibration.update with that id, and never
changes it afterwards.  The service's user owns the tree; the endpoint's
user only reads it, through its group.  The loader refuses a group- or
world-writable file, and a serialized class outside laboneq and this
package (LabOne Q's serializer imports the classes the file names).

Qubits: the QPU's quantum elements in order are the device's qubits 0..n-1
(OpenQASM $n, or the n-th declared qubit).  Each qubit's parameters.custom
holds amplitude_pi, pulse_length, readout_amplitude, readout_length,
reset_delay_length, the readout's readout_threshold and
readout_rotation_deg, and, on the lower qubit of a coupled pair, "cz":
{partner uid: {"amplitude", "length"}}.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qrt_endpoint import device
from qrt_endpoint.handler import CALIBRATION_UNKNOWN, STAGE_COMPILE, ArmRefused

DEFAULT_ROOT = Path("/var/lib/qrtd-calibration")
QPU_FILE = "qpu.json"
CLASS_PREFIXES = ("laboneq.", "qpu_labone.")
MAX_CACHED = 8


@dataclass(frozen=True)
class CalibrationSet:
    calibration_id: int
    qpu: Any            # laboneq.dsl.quantum.QPU
    qubits: list[Any]   # its Transmon qubits, in order
    # sha256 of qpu.json as stored: what a precompiled program names to say
    # which set it was compiled against
    digest: str = ""

    def threshold(self, q: int) -> tuple[float, float]:
        c = self.qubits[q].parameters.custom
        return float(c.get("readout_rotation_deg", 0.0)), float(c.get("readout_threshold", 0.0))


class CalibrationError(ValueError):
    pass


def _check_classes(o: Any, where: Path, key: str = "") -> None:
    if isinstance(o, dict):
        for k, v in o.items():
            _check_classes(v, where, k)
    elif isinstance(o, list):
        for v in o:
            _check_classes(v, where, key)
    elif isinstance(o, str) and (key.endswith("class") or key in ("__serializer__", "quantum_operations")):
        if not o.startswith(CLASS_PREFIXES):
            raise CalibrationError(f"{where}: {key} names {o!r}, outside {' and '.join(CLASS_PREFIXES)}")


def _read(path: Path) -> bytes:
    st = path.stat()
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CalibrationError(f"{path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                               "only the calibration service may write calibration sets")
    data = path.read_bytes()
    _check_classes(json.loads(data), path)
    return data


def _build(calibration_id: int, qpu_json: bytes, where: Path) -> CalibrationSet:
    from laboneq.serializers import from_json

    qpu = from_json(qpu_json)
    qubits = list(qpu.quantum_elements)
    for i, q in enumerate(qubits):
        missing = [k for k in ("amplitude_pi", "pulse_length", "readout_amplitude", "readout_length",
                               "reset_delay_length") if k not in q.parameters.custom]
        if missing:
            raise CalibrationError(f"{where}: qubit {i} ({q.uid}) lacks {', '.join(missing)}")
    return CalibrationSet(calibration_id, qpu, qubits, hashlib.sha256(qpu_json).hexdigest())


# The native gates the set calibrates, in OpenQASM 3 / Qiskit spelling
# (operations.QrtOperations plays each from the qubit's own parameters):
# the basis an SDK transpiles to.
BASIS_GATES = ["rz", "sx", "x", "cz", "measure"]


def device_facts(cal: CalibrationSet) -> dict[str, Any]:
    """qrtd's [qpu.device] facts of this set (qrt_endpoint.device): its
    qubits, the native gates, the pairs with a calibrated CZ, and each
    gate's duration from the set's own parameters."""
    index = {q.uid: i for i, q in enumerate(cal.qubits)}
    pairs: list[tuple[int, int]] = []
    cz_ns = 0
    for i, q in enumerate(cal.qubits):
        for partner, p in (q.parameters.custom.get("cz") or {}).items():
            if partner in index:
                pairs.append((min(i, index[partner]), max(i, index[partner])))
                cz_ns = max(cz_ns, round(float(p["length"]) * 1e9))
    c = [q.parameters.custom for q in cal.qubits]
    pulse = max(round(float(x["pulse_length"]) * 1e9) for x in c)
    ns = {"rz": 0, "sx": pulse, "x": pulse, "measure": max(round(float(x["readout_length"]) * 1e9) for x in c)}
    if pairs:
        ns["cz"] = cz_ns
    return device.facts(len(cal.qubits), BASIS_GATES if pairs else [g for g in BASIS_GATES if g != "cz"],
                        sorted(set(pairs)), ns)


class CalibrationStore:
    def __init__(self, root: Path | str, qpu: str) -> None:
        self.dir = Path(root) / qpu
        self._cache: OrderedDict[int, CalibrationSet] = OrderedDict()

    def load(self, calibration_id: int) -> CalibrationSet:
        if calibration_id in self._cache:
            self._cache.move_to_end(calibration_id)
            return self._cache[calibration_id]
        where = self.dir / str(calibration_id)
        if calibration_id <= 0 or not (where / QPU_FILE).is_file():
            raise ArmRefused(STAGE_COMPILE, CALIBRATION_UNKNOWN,
                             f"no calibration set {calibration_id} in {self.dir} ({QPU_FILE})")
        try:
            cal = _build(calibration_id, _read(where / QPU_FILE), where)
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ArmRefused(STAGE_COMPILE, CALIBRATION_UNKNOWN, f"calibration set {calibration_id}: {e}") from None
        self._cache[calibration_id] = cal
        if len(self._cache) > MAX_CACHED:
            self._cache.popitem(last=False)
        return cal


def write_set(root: Path | str, qpu_name: str, calibration_id: int, qpu: Any) -> Path:
    """Write a calibration set from a LabOne Q QPU (for the
    calibration service); whole or not at all, never over an existing id."""
    from laboneq.serializers import to_json

    if not isinstance(calibration_id, int) or calibration_id <= 0:
        raise CalibrationError(f"calibration id {calibration_id!r} is not a positive integer")
    qdir = Path(root) / qpu_name
    final = qdir / str(calibration_id)
    blobs = {QPU_FILE: to_json(qpu)}
    _build(calibration_id, blobs[QPU_FILE], final)
    if final.exists():
        raise CalibrationError(f"{final} exists: a calibration set is never changed; write a new id")
    qdir.mkdir(parents=True, exist_ok=True, mode=0o755)
    tmp = Path(tempfile.mkdtemp(prefix=f".{calibration_id}.", dir=qdir))
    for name, data in blobs.items():
        with open(tmp / name, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp / name, 0o644)
    os.chmod(tmp, 0o755)  # noqa: S103 -- read by the endpoint's group; written only by its owner
    os.rename(tmp, final)
    fd = os.open(qdir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return final


def example(
    f_ge: tuple[float, ...] = (4.10e9, 4.32e9, 4.55e9),
    f_ro: tuple[float, ...] = (6.05e9, 6.15e9, 6.25e9),
    amplitude_pi: tuple[float, ...] = (0.62, 0.58, 0.66),
    thresholds: tuple[float, ...] = (0.0, 0.0, 0.0),
    cz_amplitude: tuple[float, ...] = (0.41, 0.38),
    server_host: str = "localhost",
) -> tuple[Any, Any]:
    """(QPU, DeviceSetup) of three transmons q0-q1-q2 coupled in a line,
    on a PQSC, an SHFQC+ (drive and multiplexed readout) and an HDAWG
    (flux)."""
    from laboneq.contrib.example_helpers.generate_device_setup import generate_device_setup_qubits
    from laboneq.dsl.quantum import QPU

    from .operations import QrtOperations

    n = len(f_ge)
    setup, qubits = generate_device_setup_qubits(
        number_qubits=n, pqsc=[{"serial": "DEV10001"}],
        shfqc=[{"serial": "DEV12001", "number_of_channels": 6, "readout_multiplex": n, "options": None}],
        hdawg=[{"serial": "DEV8001", "number_of_channels": 8, "options": None}],
        include_flux_lines=True, server_host=server_host, setup_name="qrtd_qpu")
    for i, q in enumerate(qubits):
        p = q.parameters
        p.resonance_frequency_ge = f_ge[i]
        p.drive_lo_frequency = 4.2e9 if f_ge[i] < 4.4e9 else 4.6e9  # 200 MHz grid
        p.readout_resonator_frequency = f_ro[i]
        p.readout_lo_frequency = 6.2e9
        p.custom.update({"amplitude_pi": amplitude_pi[i], "pulse_length": 40e-9, "readout_amplitude": 0.5,
                         "readout_length": 1e-6, "reset_delay_length": 100e-6,
                         "readout_threshold": thresholds[i], "readout_rotation_deg": 0.0})
        if i + 1 < n:
            p.custom["cz"] = {qubits[i + 1].uid: {"amplitude": cz_amplitude[i], "length": 60e-9}}
    return QPU(qubits, QrtOperations()), setup
