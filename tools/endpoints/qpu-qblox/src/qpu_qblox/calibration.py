"""Calibration sets, keyed by calibration id, in qblox-scheduler's own
serialization.

Layout (one directory per QPU, one per calibration id, decimal):

    <root>/<qpu>/<calibration_id>/device_config.json     DeviceCompilationConfig
    <root>/<qpu>/<calibration_id>/hardware_config.json   QbloxHardwareCompilationConfig

The default root is /var/lib/qrtd-calibration.  The calibration service
writes a set (write_set: into a temporary directory beside it, fsync, then
one rename, so an endpoint never sees half a set) before it calls qrtd's
calibration.update with that id; a set, once written, is never changed (a
new calibration is a new id).  The service's user owns the tree; the
endpoint's user only reads it, through its group.  The loader refuses a
file that is group- or world-writable, and a factory function outside
qblox-scheduler's operations or this package's factories (the device
configuration names Python functions by import path).

The qubits are the device configuration's elements q0, q1, ... (OpenQASM
physical qubit $n, or the n-th declared qubit, is element qn); couplers are
its edges "qa_qb" that define CZ.  Each element's "measure" factory holds
the readout's state discrimination: acq_rotation (degrees) and
acq_threshold (on the integrated, rotated I).
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

from qblox_scheduler.backends.graph_compilation import DeviceCompilationConfig, SerialCompilationConfig
from qblox_scheduler.backends.qblox_backend import QbloxHardwareCompilationConfig
from qrt_endpoint import device
from qrt_endpoint.handler import CALIBRATION_UNKNOWN, STAGE_COMPILE, ArmRefused

DEFAULT_ROOT = Path("/var/lib/qrtd-calibration")
DEVICE_FILE = "device_config.json"
HARDWARE_FILE = "hardware_config.json"
FACTORY_PREFIXES = ("qblox_scheduler.operations.", "qpu_qblox.factories.")
MAX_CACHED = 8


@dataclass(frozen=True)
class Threshold:
    rotation_deg: float
    threshold: float


@dataclass(frozen=True)
class CalibrationSet:
    calibration_id: int
    config: SerialCompilationConfig
    qubits: list[str]
    edges: list[tuple[int, int]]
    thresholds: dict[str, Threshold]
    # sha256 of the set's files as stored (device, then hardware
    # configuration): what a precompiled program names to say which set it
    # was compiled against
    digest: str = ""


class CalibrationError(ValueError):
    """A set that is there but cannot be used (names the file and why)."""


def _check_factories(device: dict[str, Any], where: Path) -> None:
    for group in ("elements", "edges"):
        for name, ops in device.get(group, {}).items():
            for op, cfg in ops.items():
                f = cfg.get("factory_func", "")
                if not isinstance(f, str) or not f.startswith(FACTORY_PREFIXES):
                    raise CalibrationError(f"{where}: {group}.{name}.{op}.factory_func {f!r} is outside "
                                           f"{' and '.join(FACTORY_PREFIXES)}")


def _read(path: Path) -> tuple[dict[str, Any], bytes]:
    st = path.stat()
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CalibrationError(f"{path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                               "only the calibration service may write calibration sets")
    raw = path.read_bytes()
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise CalibrationError(f"{path}: not a JSON object")
    return data, raw


def digest_of(device: bytes, hardware: bytes) -> str:
    """The digest of a set: sha256 of its two files as stored."""
    return hashlib.sha256(device + b"\0" + hardware).hexdigest()


def build(calibration_id: int, device: dict[str, Any], hardware: dict[str, Any], where: Path,
          digest: str = "") -> CalibrationSet:
    _check_factories(device, where)
    dev = DeviceCompilationConfig.model_validate(device)
    hw = QbloxHardwareCompilationConfig.model_validate(hardware)
    qubits = sorted(dev.elements, key=lambda n: (len(n), n))
    if qubits != [f"q{i}" for i in range(len(qubits))]:
        raise CalibrationError(f"{where}: elements must be q0..q{len(qubits) - 1}, not {qubits}")
    edges = []
    for name, ops in dev.edges.items():
        a, _, b = name.partition("_")
        if "CZ" in ops and a in qubits and b in qubits:
            edges.append((int(a[1:]), int(b[1:])))
    thresholds = {}
    for q in qubits:
        m = dev.elements[q].get("measure")
        kw = m.factory_kwargs if m is not None else {}
        thresholds[q] = Threshold(float(kw.get("acq_rotation", 0.0)), float(kw.get("acq_threshold", 0.0)))
    config = SerialCompilationConfig(name=f"qrtd calibration {calibration_id}", device_compilation_config=dev,
                                     hardware_compilation_config=hw)
    return CalibrationSet(calibration_id, config, qubits, sorted(edges), thresholds, digest)


# The native gates the set calibrates, in OpenQASM 3 / Qiskit spelling (what
# qasm.GATES turns into the set's Rxy, Rz, CZ and Measure without a
# decomposition): the basis an SDK transpiles to.
BASIS_GATES = ["rz", "sx", "x", "cz", "measure"]


def device_facts(cal: CalibrationSet) -> dict[str, Any]:
    """qrtd's [qpu.device] facts of this set (qrt_endpoint.device): its
    qubits, the native gates, the couplers with a CZ, and each gate's
    duration from the set's own pulses."""
    dev = cal.config.device_compilation_config
    assert dev is not None
    rxy = dev.elements[cal.qubits[0]]["Rxy"].factory_kwargs
    meas = dev.elements[cal.qubits[0]]["measure"].factory_kwargs
    ns = {"rz": 0, "sx": round(rxy["duration"] * 1e9), "x": round(rxy["duration"] * 1e9),
          "measure": round(max(meas["pulse_duration"], meas["acq_delay"] + meas["acq_duration"]) * 1e9)}
    cz = [dev.edges[f"q{a}_q{b}"]["CZ"].factory_kwargs.get("square_duration") for a, b in cal.edges]
    if cz and all(d is not None for d in cz):
        ns["cz"] = round(max(cz) * 1e9)
    return device.facts(len(cal.qubits), BASIS_GATES if cal.edges else [g for g in BASIS_GATES if g != "cz"],
                        cal.edges, ns)


class CalibrationStore:
    """The sets of one QPU: <root>/<qpu>/<id>/.  Sets are immutable, so a
    loaded one is kept (the last MAX_CACHED)."""

    def __init__(self, root: Path | str, qpu: str) -> None:
        self.dir = Path(root) / qpu
        self._cache: OrderedDict[int, CalibrationSet] = OrderedDict()

    def load(self, calibration_id: int) -> CalibrationSet:
        if calibration_id in self._cache:
            self._cache.move_to_end(calibration_id)
            return self._cache[calibration_id]
        where = self.dir / str(calibration_id)
        if calibration_id <= 0 or not (where / DEVICE_FILE).is_file() or not (where / HARDWARE_FILE).is_file():
            raise ArmRefused(STAGE_COMPILE, CALIBRATION_UNKNOWN,
                             f"no calibration set {calibration_id} in {self.dir} "
                             f"({DEVICE_FILE} and {HARDWARE_FILE})")
        try:
            (device, dev_raw), (hardware, hw_raw) = _read(where / DEVICE_FILE), _read(where / HARDWARE_FILE)
            cal = build(calibration_id, device, hardware, where, digest_of(dev_raw, hw_raw))
        except (OSError, ValueError) as e:
            raise ArmRefused(STAGE_COMPILE, CALIBRATION_UNKNOWN, f"calibration set {calibration_id}: {e}") from None
        self._cache[calibration_id] = cal
        if len(self._cache) > MAX_CACHED:
            self._cache.popitem(last=False)
        return cal


def write_set(root: Path | str, qpu: str, calibration_id: int, device: dict[str, Any],
              hardware: dict[str, Any]) -> Path:
    """Write a calibration set (for the calibration service): checked by
    qblox-scheduler's own models first, then written whole or not at all.
    An id that exists is refused: sets are never changed."""
    if not isinstance(calibration_id, int) or calibration_id <= 0:
        raise CalibrationError(f"calibration id {calibration_id!r} is not a positive integer")
    qdir = Path(root) / qpu
    final = qdir / str(calibration_id)
    build(calibration_id, device, hardware, final)
    if final.exists():
        raise CalibrationError(f"{final} exists: a calibration set is never changed; write a new id")
    qdir.mkdir(parents=True, exist_ok=True, mode=0o755)
    tmp = Path(tempfile.mkdtemp(prefix=f".{calibration_id}.", dir=qdir))
    for name, data in ((DEVICE_FILE, device), (HARDWARE_FILE, hardware)):
        with open(tmp / name, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
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


# ------------------------------------------------------- the example device

def example_device(
    f01: tuple[float, ...] = (5.10e9, 5.32e9, 5.55e9),
    f_ro: tuple[float, ...] = (7.05e9, 7.15e9, 7.25e9),
    amp180: tuple[float, ...] = (0.32, 0.29, 0.35),
    pi_duration: float = 20e-9,
    thresholds: tuple[float, ...] = (0.012, 0.010, 0.011),
    rotations: tuple[float, ...] = (0.0, 0.0, 0.0),
    cz_amp: tuple[float, ...] = (0.41, 0.38),
) -> dict[str, Any]:
    """A device configuration for three transmons q0-q1-q2, coupled in a
    line (CZ on q0_q1 and q1_q2 by a flux pulse on the first qubit):
    DRAG pi pulses, virtual Z, passive reset, dispersive readout."""
    n = len(f01)
    clocks: dict[str, float] = {}
    elements: dict[str, Any] = {}
    for i in range(n):
        q = f"q{i}"
        clocks[f"{q}.01"] = f01[i]
        clocks[f"{q}.ro"] = f_ro[i]
        elements[q] = {
            "reset": {"factory_func": "qblox_scheduler.operations.pulse_library.IdlePulse",
                      "factory_kwargs": {"duration": 200e-6}},
            "Rxy": {"factory_func": "qblox_scheduler.operations.pulse_factories.rxy_drag_pulse",
                    "gate_info_factory_kwargs": ["theta", "phi"],
                    "factory_kwargs": {"amp180": amp180[i], "beta": 0.0, "port": f"{q}:mw",
                                       "clock": f"{q}.01", "duration": pi_duration}},
            "Rz": {"factory_func": "qblox_scheduler.operations.pulse_factories.phase_shift",
                   "gate_info_factory_kwargs": ["theta"], "factory_kwargs": {"clock": f"{q}.01"}},
            "measure": {"factory_func": "qpu_qblox.factories.dispersive_measure",
                        "gate_info_factory_kwargs": ["acq_label_override", "coords", "acq_protocol",
                                                     "average_segment_repetitions", "feedback_trigger_label"],
                        "factory_kwargs": {"port": f"{q}:res", "clock": f"{q}.ro", "pulse_amp": 0.1,
                                           "pulse_duration": 1e-6, "acq_delay": 100e-9, "acq_duration": 800e-9,
                                           "acq_label": q, "acq_rotation": rotations[i],
                                           "acq_threshold": thresholds[i]}},
        }
    edges: dict[str, Any] = {}
    for i in range(n - 1):
        a, b = f"q{i}", f"q{i + 1}"
        edges[f"{a}_{b}"] = {"CZ": {
            "factory_func": "qblox_scheduler.operations.pulse_factories.composite_square_pulse",
            "factory_kwargs": {"square_amp": cz_amp[i], "square_duration": 40e-9, "square_port": f"{a}:fl",
                               "square_clock": "cl0.baseband", "virt_z_parent_qubit_phase": 12.0,
                               "virt_z_parent_qubit_clock": f"{a}.01", "virt_z_child_qubit_phase": 7.5,
                               "virt_z_child_qubit_clock": f"{b}.01"}}}
    return {"clocks": clocks, "elements": elements, "edges": edges}


EXAMPLE_MODULES = {2: "QCM_RF", 4: "QCM_RF", 6: "QCM", 8: "QRM_RF"}


def example_hardware(cluster: str = "cluster0", qubits: int = 3, readout_lo: float = 7.0e9) -> dict[str, Any]:
    """The wiring of the example: drive on two QCM-RF (slot 2 outputs 0 and
    1, slot 4 output 0), flux on a QCM (slot 6, real outputs 0..2), readout
    multiplexed on one QRM-RF (slot 8) with a common LO."""
    drive = [("2", "complex_output_0"), ("2", "complex_output_1"), ("4", "complex_output_0")]
    graph: list[list[Any]] = []
    for i in range(qubits):
        slot, out = drive[i]
        graph.append([f"{cluster}.module{slot}.{out}", f"q{i}:mw"])
        graph.append([f"{cluster}.module6.real_output_{i}", f"q{i}:fl"])
    graph.append([f"{cluster}.module8.complex_output_0", [f"q{i}:res" for i in range(qubits)]])
    return {
        "config_type": "QbloxHardwareCompilationConfig",
        "hardware_description": {cluster: {
            "instrument_type": "Cluster", "ref": "internal",
            "modules": {str(s): {"instrument_type": t} for s, t in EXAMPLE_MODULES.items()}}},
        "hardware_options": {"modulation_frequencies": {
            **{f"q{i}:mw-q{i}.01": {"interm_freq": 50e6} for i in range(qubits)},
            **{f"q{i}:res-q{i}.ro": {"lo_freq": readout_lo} for i in range(qubits)}}},
        "connectivity": {"graph": graph},
    }
