"""Calibration steps: what the service keeps fresh, one node each.

A step (the Step protocol below) is what any calibration framework provides
to qrt-calibration: a name, a staleness timeout, the block time a full run
needs, a cheap check and a full run, both run through a Qiskit backend
(qrtd's QrtdBackend: the check as an ordinary job, the run inside the
step's calibration block), both answering a Measurement.  What a
measurement means for the device's parameters is the set writer's (the
SetWriter protocol, sets.py): the step measures, the writer corrects.

The two reference steps use qiskit-experiments' gate-level
characterization: FineXAmplitude (the over-rotation per X gate, d_theta)
and LocalReadoutError (each qubit's assignment matrix).  A step of another
framework (Qibocal's protocols, QUAlibrate's nodes) is the same three
things: a check that says in or out of spec, a run that measures, and the
measurement in this shape, so that the set writer of the device can turn it
into parameters (README "Calibration").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

X_AMPLITUDE = "x_amplitude"
READOUT = "readout"


class StepFailed(RuntimeError):
    """A check or run that gave no usable measurement (names the step and why)."""


@dataclass(frozen=True)
class Measurement:
    """What one check or run of a step measured.

    qubits: per qubit, the step's quantities (x_amplitude: {"d_theta"};
    readout: {"p10", "p01"}); shots per circuit; in_spec: whether the
    quantities are within the step's tolerance."""

    step: str
    qubits: Mapping[int, Mapping[str, float]]
    shots: int
    in_spec: bool
    worst: float = 0.0    # the largest out-of-spec quantity (|d_theta|, mean assignment error)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "shots": self.shots, "in_spec": self.in_spec, "worst": self.worst,
                "qubits": {str(q): dict(v) for q, v in sorted(self.qubits.items())}}


class Step(Protocol):
    """The interface a calibration step provides (module docstring)."""

    name: str
    staleness_s: float   # recalibrate at the latest this long after the last run
    duration_ns: int     # the calibration block a run needs

    def check(self, backend: Any, qubits: Sequence[int], run_options: Mapping[str, Any]) -> Measurement: ...

    def run(self, backend: Any, qubits: Sequence[int], run_options: Mapping[str, Any]) -> Measurement: ...


def _run(experiment: Any, backend: Any, run_options: Mapping[str, Any], timeout_s: float, what: str) -> Any:
    # backend_run: the backend's own run() with every run option (qrtd's slot,
    # block_id, the seed); the default path wraps the backend in
    # qiskit-ibm-runtime's SamplerV2, which passes shots and a few options only.
    data = experiment.run(backend, backend_run=True, **dict(run_options))
    data.block_for_results(timeout=timeout_s)
    errors = data.errors()
    status = data.status().name
    if status != "DONE" or errors:
        raise StepFailed(f"{what}: the experiment ended {status}: {errors or 'no result'}")
    return data


@dataclass
class XAmplitude:
    """FineXAmplitude on each qubit (in parallel): d_theta, the over-rotation
    per X gate.  The check repeats X fewer times with fewer shots."""

    name: str = X_AMPLITUDE
    staleness_s: float = 7200.0
    duration_ns: int = 2_000_000_000
    tolerance_rad: float = 0.01
    shots: int = 2000
    check_shots: int = 500
    repetitions: list[int] = field(default_factory=lambda: list(range(1, 15)))
    check_repetitions: list[int] = field(default_factory=lambda: list(range(1, 8)))
    timeout_s: float = 300.0

    def _measure(self, backend: Any, qubits: Sequence[int], run_options: Mapping[str, Any],
                 repetitions: list[int], shots: int, what: str) -> Measurement:
        from qiskit_experiments.framework import ParallelExperiment
        from qiskit_experiments.library import FineXAmplitude

        exps = []
        for q in qubits:
            e = FineXAmplitude([q], backend=backend)
            e.set_experiment_options(repetitions=list(repetitions))
            exps.append(e)
        par = ParallelExperiment(exps, backend=backend, flatten_results=True)
        data = _run(par, backend, dict(run_options, shots=shots), self.timeout_s, f"{self.name} {what}")
        rows = data.analysis_results("d_theta", dataframe=True)
        out: dict[int, dict[str, float]] = {}
        for _, row in rows.iterrows():
            q = int(str(row["components"][0]).lstrip("Q"))
            out[q] = {"d_theta": float(row["value"].nominal_value)}
        missing = set(qubits) - set(out)
        if missing:
            raise StepFailed(f"{self.name} {what}: no d_theta for qubits {sorted(missing)}")
        worst = max(abs(v["d_theta"]) for v in out.values())
        return Measurement(self.name, out, shots, worst <= self.tolerance_rad, worst)

    def check(self, backend: Any, qubits: Sequence[int], run_options: Mapping[str, Any]) -> Measurement:
        return self._measure(backend, qubits, run_options, self.check_repetitions, self.check_shots, "check")

    def run(self, backend: Any, qubits: Sequence[int], run_options: Mapping[str, Any]) -> Measurement:
        return self._measure(backend, qubits, run_options, self.repetitions, self.shots, "run")


@dataclass
class Readout:
    """LocalReadoutError on the qubits: each one's assignment errors p10
    (prepared 0, read 1) and p01.  The check takes fewer shots."""

    name: str = READOUT
    staleness_s: float = 14400.0
    duration_ns: int = 1_000_000_000
    tolerance: float = 0.02       # mean assignment error (p10 + p01) / 2
    shots: int = 4000
    check_shots: int = 1000
    timeout_s: float = 300.0

    def _measure(self, backend: Any, qubits: Sequence[int], run_options: Mapping[str, Any], shots: int,
                 what: str) -> Measurement:
        from qiskit_experiments.library import LocalReadoutError

        exp = LocalReadoutError(list(qubits), backend=backend)
        data = _run(exp, backend, dict(run_options, shots=shots), self.timeout_s, f"{self.name} {what}")
        rows = data.analysis_results("Local Readout Mitigator", dataframe=True)
        if len(rows) != 1:
            raise StepFailed(f"{self.name} {what}: no assignment matrices in the analysis")
        mitigator = rows.iloc[0]["value"]
        out: dict[int, dict[str, float]] = {}
        for q in qubits:
            a = mitigator.assignment_matrix(q)
            out[q] = {"p10": float(a[1][0]), "p01": float(a[0][1])}
        worst = max((v["p10"] + v["p01"]) / 2 for v in out.values())
        return Measurement(self.name, out, shots, worst <= self.tolerance, worst)

    def check(self, backend: Any, qubits: Sequence[int], run_options: Mapping[str, Any]) -> Measurement:
        return self._measure(backend, qubits, run_options, self.check_shots, "check")

    def run(self, backend: Any, qubits: Sequence[int], run_options: Mapping[str, Any]) -> Measurement:
        return self._measure(backend, qubits, run_options, self.shots, "run")


KINDS = {X_AMPLITUDE: XAmplitude, READOUT: Readout}


def over_rotation_and_readout(measurements: Mapping[str, Measurement]) -> tuple[dict[int, float],
                                                                                 dict[int, tuple[float, float]]]:
    """The reference fidelity's inputs from the latest measurement of each step."""
    rot: dict[int, float] = {}
    ro: dict[int, tuple[float, float]] = {}
    for m in measurements.values():
        for q, v in m.qubits.items():
            if "d_theta" in v:
                rot[q] = v["d_theta"]
            if "p10" in v:
                ro[q] = (v["p10"], v["p01"])
    return rot, ro
