"""The fidelity model qrtd places by (f0, tau: f0 * exp(-age / tau)),
fitted from what the service measured, and the time it falls below a
threshold.

The service's fidelity is that of its reference circuit: on each calibrated
qubit, n X gates (n even, so ideally the identity) and a measurement, the
probability of reading 0, averaged over the qubits.  From a step's
measurements: an over-rotation d per X turns n of them into a rotation of
n * d, read right with probability cos^2(n d / 2) (1 - p10) +
sin^2(n d / 2) p01.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NS_PER_S = 1_000_000_000


def reference_fidelity(over_rotation: Mapping[int, float], readout: Mapping[int, tuple[float, float]],
                       depth: int) -> float:
    """The reference circuit's success probability (module docstring),
    averaged over the qubits either measurement names (a qubit without one
    counts as exact there)."""
    qubits = sorted(set(over_rotation) | set(readout))
    if not qubits:
        raise ValueError("no qubit measured")
    total = 0.0
    for q in qubits:
        half = depth * over_rotation.get(q, 0.0) / 2.0
        p10, p01 = readout.get(q, (0.0, 0.0))
        total += math.cos(half) ** 2 * (1.0 - p10) + math.sin(half) ** 2 * p01
    return total / len(qubits)


@dataclass(frozen=True)
class Point:
    """One measurement of the reference fidelity: age_ns after its window
    started."""

    age_ns: int
    fidelity: float


@dataclass(frozen=True)
class Model:
    """qrtd's model of a window: f0 at valid_from, tau_ns its decay (0: none
    known)."""

    f0: float
    tau_ns: int

    def at(self, age_ns: int) -> float:
        if self.tau_ns <= 0:
            return self.f0
        return self.f0 * math.exp(-max(0, age_ns) / self.tau_ns)

    def age_below(self, threshold: float) -> int | None:
        """The age at which the prediction falls below threshold (0 when it
        starts below; None when it never does)."""
        if self.f0 < threshold:
            return 0
        if self.tau_ns <= 0 or threshold <= 0.0:
            return None
        return int(self.tau_ns * math.log(self.f0 / threshold))


def clamp_fidelity(f: float) -> float:
    """Into qrtd's range for f0, (0, 1]."""
    return min(1.0, max(1e-6, f))


def fit(points: Sequence[Point], prior: Model | None) -> Model | None:
    """The model of a window from its measurements.

    f0 is the first measurement (the freshest after the calibration); tau is
    the least-squares fit of ln(f0 / F_i) = age_i / tau through it over the
    later ones (weighted as the fit weighs them: later ages count more,
    which is where the threshold is crossed).  With one measurement, tau is
    the prior's (the last window's fit: the drift is taken to repeat); with
    none, the prior itself.  A decay that does not show (no later
    measurement lower than f0) is tau 0: no drift known."""
    if not points:
        return prior
    pts = sorted(points, key=lambda p: p.age_ns)
    first = pts[0]
    f0 = clamp_fidelity(first.fidelity)
    later = [p for p in pts[1:] if p.age_ns > first.age_ns]
    if not later:
        return Model(f0, prior.tau_ns if prior else 0)
    # Ages from the first measurement, so that f0 is where the line starts.
    num = 0.0
    den = 0.0
    for p in later:
        a = (p.age_ns - first.age_ns) / NS_PER_S
        num += a * a
        den += a * math.log(f0 / clamp_fidelity(p.fidelity))
    if den <= 0.0:
        return Model(f0, 0)
    tau_s = num / den
    # Carried back to the window's start: f0 * exp(first.age / tau).
    f_start = clamp_fidelity(f0 * math.exp(first.age_ns / NS_PER_S / tau_s))
    return Model(f_start, max(1, int(tau_s * NS_PER_S)))
