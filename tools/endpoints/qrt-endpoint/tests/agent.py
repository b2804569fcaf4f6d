"""The handler the framework's tests drive: it records what it was asked."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

from qrt_client import protocol as P

from qrt_endpoint import handler as H
from qrt_endpoint.testing import FLD, HDR, Agent, E, Peer, T, frame, job_fields  # noqa: F401


class LabHandler:
    """A handler that records every call (with its thread and the gc's state),
    refuses a program "refuse <reason>" with that reason, and can be told its
    instruments are down."""

    def __init__(self, max_armed: int = 4, horizon_ns: int = 60 * 10**9, two_phase: bool = True) -> None:
        self.max_armed = max_armed
        self.horizon_ns = horizon_ns
        self.two_phase = two_phase
        self.calls: list[tuple[str, int, str, bool, int]] = []
        self.held: dict[int, str] = {}
        self.down = False
        self.arm_delay_s = 0.0
        self.collect_delay_s = 0.0
        self.lock = threading.Lock()

    def _note(self, what: str, job_id: int) -> None:
        with self.lock:
            self.calls.append((what, job_id, threading.current_thread().name, gc.isenabled(), time.time_ns()))

    def names(self, job_id: int | None = None) -> list[str]:
        with self.lock:
            return [c[0] for c in self.calls if job_id is None or c[1] == job_id]

    def capabilities(self) -> dict[str, Any]:
        return {"two_phase": self.two_phase, "max_armed": self.max_armed, "horizon_ns": self.horizon_ns,
                "min_lead_ns": 1_000_000, "start": "on_fire"}

    def health(self) -> None:
        self._note("health", 0)
        if self.down:
            raise H.InstrumentUnreachable("the test switched the instruments off")

    def arm(self, req: H.ArmRequest) -> H.Armed:
        self._note("arm", req.job_id)
        time.sleep(self.arm_delay_s)
        text = req.program.decode()
        if text.startswith("refuse "):
            _, reason, stage = text.split(" ", 2)
            raise H.ArmRefused(stage, reason, f"the test refused it ({reason})")
        if text == "raise":
            raise ZeroDivisionError("a bug in the stack")
        if self.down:
            raise H.ArmRefused(H.STAGE_UPLOAD, H.INSTRUMENT_UNREACHABLE, "no answer")
        self.held[req.job_id] = "armed"
        return H.Armed(req.job_id, [(H.STAGE_COMPILE, 1000), (H.STAGE_UPLOAD, 2000), (H.STAGE_ARM, 3000)], 5000)

    def fire(self, job_id: int) -> int:
        self._note("fire", job_id)
        if self.held.get(job_id) != "armed":
            raise H.UnknownJob(job_id)
        self.held[job_id] = "fired"
        return time.time_ns()

    def disarm(self, job_id: int) -> None:
        self._note("disarm", job_id)
        if self.held.pop(job_id, None) is None:
            raise H.UnknownJob(job_id)

    def collect(self, job_id: int) -> H.Result:
        self._note("collect", job_id)
        time.sleep(self.collect_delay_s)
        if self.held.pop(job_id, None) != "fired":
            raise H.UnknownJob(job_id)
        now = time.time_ns()
        return H.Result(job_id, {"format": P.ENVELOPE_RESULT_FORMAT,
                                 "results": [{"name": "c", "shots": 10, "counts": {"0": 10}}]},
                        {"seq0": "STOPPED"}, 0, 0, now)
