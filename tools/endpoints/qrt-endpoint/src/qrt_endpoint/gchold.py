"""The garbage collector held off while jobs are armed.

A cyclic collection stops every thread of the process for as long as it
scans (milliseconds with a compiler's object graph loaded), so a FIRE read
during one would wait for it.  While the endpoint holds a job (armed, or
fired and not collected), everything allocated so far is frozen (moved to
the permanent generation, never scanned again) and automatic collections
are off.  What is allocated while held (the next ARM's compilation, the
RESULTs) is collected by tidy(), which the worker calls only when no held
job fires soon: it scans the young generations, never the frozen heap.
When nothing is held any more, the heap is unfrozen and the collector is
on again.
"""

from __future__ import annotations

import gc
import time


class GcHold:
    def __init__(self) -> None:
        self.held = False
        self.holds = 0
        self.tidies = 0
        self.last_tidy_ns = 0
        self.max_tidy_ns = 0
        self._last_tidy_at = 0.0

    def hold(self) -> None:
        if not self.held:
            gc.freeze()
            gc.disable()
            self.held = True
            self.holds += 1
            self._last_tidy_at = time.monotonic()

    def release(self) -> None:
        if self.held:
            gc.unfreeze()
            gc.enable()
            self.held = False

    def due(self, interval_s: float) -> bool:
        return self.held and time.monotonic() - self._last_tidy_at >= interval_s

    def tidy(self) -> int:
        """Collects what was allocated since the hold (the frozen heap is
        not scanned); returns how long it took, ns."""
        t0 = time.perf_counter_ns()
        gc.collect()
        gc.freeze()
        ns = time.perf_counter_ns() - t0
        self.tidies += 1
        self.last_tidy_ns = ns
        self.max_tidy_ns = max(self.max_tidy_ns, ns)
        self._last_tidy_at = time.monotonic()
        return ns

    def summary(self) -> dict[str, int]:
        return {"holds": self.holds, "tidies": self.tidies, "max_tidy_ns": self.max_tidy_ns,
                "held": int(self.held)}
