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
    """The model of a window from its measurements, through the first and
    the latest: f0 is the first (the freshest after the calibration, taken
    at the window's start), tau makes f0 * exp(-age / tau) meet the latest,
    so qrtd's prediction always agrees with the last thing measured (a
    coherent drift decays slowly at first and faster later: a fit over all
    points would lag behind it).  With one measurement, or no decay seen yet
    (within noise: less than 0.2 %), tau is the prior's (the last window's:
    the drift is taken to repeat), else 0, no drift known; with none, the
    prior itself."""
    if not points:
        return prior
    pts = sorted(points, key=lambda p: p.age_ns)
    f0 = clamp_fidelity(pts[0].fidelity)
    last = pts[-1]
    fallback = Model(f0, prior.tau_ns if prior else 0)
    if len(pts) < 2 or last.age_ns <= 0:
        return fallback
    drop = math.log(f0 / clamp_fidelity(last.fidelity))
    if drop < 0.002:
        return fallback
    return Model(f0, max(1, int(last.age_ns / drop)))


def crossing(points: Sequence[Point], threshold: float, recent: int = 3) -> int | None:
    """The age at which the recent measurements, extrapolated, fall below
    threshold: the slope of ln F over the last `recent` points (least
    squares) from the latest on; the latest's age when it is below already;
    None without a decay.  Earlier than the model's own crossing while the
    decay steepens."""
    pts = sorted(points, key=lambda p: p.age_ns)[-recent:]
    if not pts:
        return None
    last = pts[-1]
    if last.fidelity < threshold:
        return last.age_ns
    if len(pts) < 2:
        return None
    xs = [p.age_ns / NS_PER_S for p in pts]
    ys = [math.log(clamp_fidelity(p.fidelity)) for p in pts]
    mx = sum(xs) / len(xs)
    my = sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    if den <= 0.0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den
    if slope >= 0.0:
        return None
    return last.age_ns + int(math.log(clamp_fidelity(last.fidelity) / threshold) / -slope * NS_PER_S)
