"""Bounded measurements: a ring of the last N samples (allocated once) and
the endpoint's counters."""

from __future__ import annotations

import threading
from array import array


class Ring:
    """The last `size` int64 samples; add() writes in place."""

    def __init__(self, size: int) -> None:
        self._a = array("q", bytes(8 * size))
        self._size = size
        self._i = 0
        self.count = 0

    def add(self, v: int) -> None:
        self._a[self._i] = v
        self._i = (self._i + 1) % self._size
        self.count += 1

    def summary(self) -> dict[str, int]:
        n = min(self.count, self._size)
        xs = sorted(self._a[:n]) if self.count >= self._size else sorted(self._a[: self._i])

        def pct(p: float) -> int:
            return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else 0
        return {"count": self.count, "p50": pct(0.5), "p99": pct(0.99), "max": xs[-1] if xs else 0}


class Counters:
    def __init__(self, *names: str) -> None:
        self._lock = threading.Lock()
        self._c: dict[str, int] = dict.fromkeys(names, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._c[name] = self._c.get(name, 0) + n

    def get(self, name: str) -> int:
        with self._lock:
            return self._c.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._c)
