"""The endpoint's worker: the one thread that calls the handler's arm,
disarm, collect and health, in order, from a bounded queue.

What it holds (read by the fire threads too):

- armed: job id -> Job, ARMED sent, not fired or disarmed yet;
- running: job id -> Job, fired, not collected yet.

A job leaves `armed` by exactly one dict.pop(): the fire thread's (it then
calls handler.fire) or the worker's on DISARM (handler.disarm), so the two
never race on one job.  The fire thread puts a job in `running` before it
pops it from `armed`, so the worker never counts fewer jobs held than the
handler holds.  arm() is called only while fewer than max_armed are held;
an ARM that comes while the stack is full waits (deferred, at most
max_deferred) until a job is collected or disarmed, and is refused
too_many_armed if its fire_at comes first.

Tasks: "arm", "disarm", "job" (a version-1 JOB: arm, fire, collect at
once) come from the control connections' readers through a queue bounded
by Options.queue; "collect", "fire_failed", "abandon" (a FIRE refused:
the job is disarmed) from the fire threads, and "drop" (a control
connection closed: its armed jobs are disarmed) through
a second queue that is bounded by what the endpoint holds.  When the
worker has nothing to do it checks the instruments' health (every
health_interval_s, only with nothing held) and tidies the held garbage
collector (gchold).
"""

from __future__ import annotations

import collections
import json
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

from . import handler as H
from .conn import Conn, Job
from .gchold import GcHold
from .wire import FrameType, WireError

if TYPE_CHECKING:
    from .server import Endpoint

Task = tuple[str, Conn, dict[str, int], bytes, int]


class Worker:
    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self.handler = ep.handler
        self.opt = ep.opt
        caps = ep.caps
        self.max_armed = int(caps.get("max_armed", 1))
        self.horizon_ns = int(caps.get("horizon_ns", 0))
        self.armed: dict[int, Job] = {}
        self.running: dict[int, Job] = {}
        self.deferred: list[Task] = []
        self.gc = GcHold()
        self.down: str | None = None
        self._cond = threading.Condition()
        self._tasks: collections.deque[Task] = collections.deque()
        self._prio: collections.deque[tuple[str, Any]] = collections.deque()
        self._stop = False
        self._next_health = 0.0

    # ------------------------------------------------------------ queues

    def submit(self, task: Task) -> bool:
        """Queues a reader's task; False when Options.queue tasks already wait."""
        with self._cond:
            if len(self._tasks) >= self.opt.queue:
                return False
            self._tasks.append(task)
            self._cond.notify()
        return True

    def post(self, kind: str, what: Any) -> None:
        """Queues a collect, fire_failed, drop or check: never refused (at
        most one collect a held job, one drop a connection)."""
        with self._cond:
            self._prio.append((kind, what))
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    def occupancy(self) -> int:
        return len(self.armed) + len(self.running)

    def waiting(self) -> int:
        with self._cond:
            return len(self._tasks)

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or self._prio or self._tasks or self._deferred_ready()):
                    if not self._cond.wait(self._idle_wait()):
                        break
                if self._stop:
                    return
                prio = self._prio.popleft() if self._prio else None
                task = None
                if prio is None and not self._deferred_ready() and self._tasks:
                    task = self._tasks.popleft()
            try:
                if prio is not None:
                    self._prio_task(*prio)
                elif self._deferred_ready():
                    self._arm(self._pop_deferred())
                elif task is not None:
                    self._task(task)
                self._expire_deferred()
                self._idle()
            except Exception:  # never take the endpoint down: log it and go on
                self.ep.log_always("worker: " + traceback.format_exc().strip().replace("\n", " | "))

    def _idle_wait(self) -> float:
        waits = [max(0.0, self._next_health - time.monotonic()), 0.2]
        return max(0.01, min(waits))

    def _idle(self) -> None:
        now = time.monotonic()
        if self.occupancy() == 0 and now >= self._next_health:
            self._next_health = now + self.opt.health_interval_s
            self.check_health()
        if self.gc.due(self.opt.gc_tidy_interval_s) and not self.running:
            guard = max(self.opt.gc_guard_ns, 4 * self.gc.last_tidy_ns)
            soonest = min((j.fire_at_ns for j in list(self.armed.values())), default=None)
            if soonest is None or soonest - time.time_ns() > guard:
                self.gc.tidy()

    def _prio_task(self, kind: str, what: Any) -> None:
        if kind == "collect":
            self._collect(what)
        elif kind == "fire_failed":
            job, status, text = what
            self._forget(job)
            self.ep.answer_error(job.conn, job.h, status, text, H.STAGE_FIRE, job.fire_arrival_ns)
        elif kind == "abandon":
            self._disarm_job(what, popped=True)
        elif kind == "drop":
            self._drop(what)
        elif kind == "check":
            self.check_health()

    def _task(self, task: Task) -> None:
        kind, conn, h, payload, arrival = task
        if not conn.alive:
            return
        if kind == "arm":
            self._arm(task)
        elif kind == "disarm":
            self._disarm(conn, h)
        elif kind == "job":
            self._one_phase(conn, h, payload, arrival)

    # ------------------------------------------------------------ health

    def check_health(self) -> None:
        try:
            self.handler.health()
        except Exception as e:  # InstrumentUnreachable, or whatever the driver raised on the way
            why = str(e) if isinstance(e, H.InstrumentUnreachable) else f"{type(e).__name__}: {e}"
            self.ep.set_down(why or type(e).__name__)
            return
        self.ep.set_up()

    # ------------------------------------------------------------ ARM

    def _deferred_ready(self) -> bool:
        return bool(self.deferred) and self.occupancy() < self.max_armed

    def _pop_deferred(self) -> Task:
        i = min(range(len(self.deferred)), key=lambda k: self.deferred[k][2]["scheduled_ns"])
        return self.deferred.pop(i)

    def _expire_deferred(self) -> None:
        now = time.time_ns()
        for t in [t for t in self.deferred if t[2]["scheduled_ns"] <= now or not t[1].alive]:
            self.deferred.remove(t)
            if t[1].alive:
                held = ", ".join(str(j) for j in list(self.running) + list(self.armed))
                self.ep.refuse(t[1], t[2], H.ArmRefused(
                    H.STAGE_ARM, H.TOO_MANY_ARMED, f"the instruments held job {held} (max_armed "
                    f"{self.max_armed}) until past this job's fire_at"), t[4])

    def _held(self, job_id: int) -> bool:
        return job_id in self.armed or job_id in self.running or any(
            t[2]["job_id"] == job_id for t in self.deferred)

    def _arm(self, task: Task) -> None:
        _, conn, h, payload, arrival = task
        if not conn.alive:
            return
        job_id = h["job_id"]
        if self.ep.down is not None:
            self.ep.refuse(conn, h, H.ArmRefused(H.STAGE_ARM, H.INSTRUMENT_UNREACHABLE, self.ep.down), arrival)
            return
        if self._held(job_id):
            self.ep.refuse(conn, h, H.ArmRefused(H.STAGE_ARM, H.PROGRAM_REJECTED,
                                                 f"job {job_id} is already held by this endpoint"), arrival)
            return
        ahead = h["scheduled_ns"] - time.time_ns()
        if self.horizon_ns and ahead > self.horizon_ns:
            self.ep.refuse(conn, h, H.ArmRefused(H.STAGE_ARM, H.BEYOND_HORIZON,
                                                 f"fire_at is {ahead / 1e9:.3f} s ahead; the horizon is "
                                                 f"{self.horizon_ns / 1e9:.3f} s"), arrival)
            return
        if self.occupancy() >= self.max_armed:
            if len(self.deferred) >= self.opt.max_deferred:
                self.ep.refuse(conn, h, H.ArmRefused(
                    H.STAGE_ARM, H.TOO_MANY_ARMED, f"{self.occupancy()} jobs held (max_armed {self.max_armed}) "
                    f"and {len(self.deferred)} ARMs waiting for them"), arrival)
                return
            self.deferred.append(task)
            return
        req = self._request(h, payload, arrival, one_phase=False)
        try:
            armed = self.handler.arm(req)
        except Exception as e:  # ArmRefused, or the stack's own failure: an ERROR, never a crash
            self._arm_failed(conn, h, e, arrival)
            return
        job = Job(conn, h, arrival)
        job.armed_ns = time.time_ns()
        job.program_duration_ns = armed.program_duration_ns
        self.gc.hold()
        self.armed[job_id] = job
        if not conn.alive:   # the agent went while this was armed
            self._disarm_job(job)
            return
        body = json.dumps({"stages": [{"name": n, "ns": int(ns)} for n, ns in armed.stages],
                           "program_duration_ns": int(armed.program_duration_ns)},
                          separators=(",", ":")).encode()
        self.ep.count("armed")
        self.ep.answer(conn, FrameType.ARMED, h, body, armed_ns=job.armed_ns, arrival_ns=arrival)
        self.ep.log(f"job {job_id}: ARMED in {', '.join(f'{n} {ns / 1e6:.1f} ms' for n, ns in armed.stages)}; "
                    f"program {armed.program_duration_ns} ns, fire_at {h['scheduled_ns']}")

    def _request(self, h: dict[str, int], payload: bytes, arrival: int, one_phase: bool) -> H.ArmRequest:
        return H.ArmRequest(h["job_id"], h["calibration_id"], h["scheduled_ns"], h["window_start_ns"],
                            h["window_end_ns"], h["duration_ns"], h["shots"], h["tolerance_ns"], payload,
                            arrival_ns=arrival, one_phase=one_phase)

    def _arm_failed(self, conn: Conn, h: dict[str, int], e: Exception, arrival: int) -> None:
        if isinstance(e, H.ArmRefused):
            refusal = e
        elif isinstance(e, H.InstrumentUnreachable):
            refusal = H.ArmRefused(H.STAGE_UPLOAD, H.INSTRUMENT_UNREACHABLE, str(e))
        else:
            refusal = H.ArmRefused(H.STAGE_ARM, H.PROGRAM_REJECTED, f"{self.ep.name}: {type(e).__name__}: {e}")
            self.ep.log_always(f"job {h['job_id']}: arm raised {type(e).__name__}: {e}")
        self.ep.refuse(conn, h, refusal, arrival)
        if refusal.reason == H.INSTRUMENT_UNREACHABLE:
            self.check_health()

    # ------------------------------------------------------------ DISARM

    def _disarm(self, conn: Conn, h: dict[str, int]) -> None:
        job_id = h["job_id"]
        for t in self.deferred:
            if t[2]["job_id"] == job_id and t[1] is conn:
                self.deferred.remove(t)
                self.ep.count("disarms")
                self.ep.answer(conn, FrameType.DISARMED, h, b"")
                return
        job = self.armed.get(job_id)
        if job is None or job.conn is not conn or self.armed.pop(job_id, None) is not job:
            self.ep.count("not_armed")
            self.ep.answer_error(conn, h, WireError.NOT_ARMED, f"job {job_id} is not armed here"
                                 + (" (it was fired)" if job_id in self.running else ""), "none")
            return
        self._disarm_job(job, popped=True)
        self.ep.count("disarms")
        self.ep.answer(conn, FrameType.DISARMED, job.h, b"", armed_ns=job.armed_ns)
        self.ep.log(f"job {job_id}: DISARMED")

    def _disarm_job(self, job: Job, popped: bool = False) -> None:
        if not popped and self.armed.pop(job.job_id, None) is not job:
            return
        try:
            self.handler.disarm(job.job_id)
        except Exception as e:  # the job is dropped either way; the stack says why it could not stop it
            self.ep.log_always(f"job {job.job_id}: disarm: {type(e).__name__}: {e}")
        self._settle()

    def _drop(self, conn: Conn) -> None:
        for job in [j for j in list(self.armed.values()) if j.conn is conn]:
            self._disarm_job(job)
            self.ep.log(f"job {job.job_id}: disarmed ({conn} closed)")
        self.deferred = [t for t in self.deferred if t[1] is not conn]

    # ------------------------------------------------------------ run

    def _forget(self, job: Job) -> None:
        self.running.pop(job.job_id, None)
        try:
            self.handler.disarm(job.job_id)
        except Exception:  # noqa: S110 -- the handler no longer holds it, which is what is wanted
            pass
        self._settle()

    def _collect(self, job: Job) -> None:
        self.ep.fire_path(job)
        try:
            r: H.Result | None = self.handler.collect(job.job_id)
            status, stage, text = 0, "", ""
        except H.RunFailed as e:
            r, status, stage, text = None, e.status, e.stage, e.detail
        except H.InstrumentUnreachable as e:
            r, status, stage, text = None, WireError.UNREACHABLE, H.STAGE_RUN, str(e)
        except Exception as e:  # the stack's own failure: an ERROR for this job, never a crash
            r, status, stage, text = None, WireError.INTERNAL, H.STAGE_RUN, f"{self.ep.name}: {type(e).__name__}: {e}"
        finally:
            self.running.pop(job.job_id, None)
            self._settle()
        if r is None:
            self.ep.count("run_failed")
            self.ep.answer_error(job.conn, job.h, status, text, stage, job.fire_arrival_ns)
            if status == WireError.UNREACHABLE:
                self.check_health()
            return
        self.ep.answer_result(job, r)

    def _one_phase(self, conn: Conn, h: dict[str, int], payload: bytes, arrival: int) -> None:
        """A version-1 JOB: armed, fired and collected at once."""
        if self.occupancy() >= self.max_armed:
            self.ep.count("busy")
            self.ep.answer_error(conn, h, WireError.BUSY, f"the instruments hold {self.occupancy()} jobs "
                                 f"(max_armed {self.max_armed})", "arm", arrival)
            return
        try:
            armed = self.handler.arm(self._request(h, payload, arrival, one_phase=True))
        except Exception as e:  # as _arm_failed
            self._arm_failed(conn, h, e, arrival)
            return
        job = Job(conn, h, arrival)
        job.armed_ns = time.time_ns()
        job.program_duration_ns = armed.program_duration_ns
        job.fire_arrival_ns = arrival
        self.running[job.job_id] = job
        job.recv_pc = job.call_pc = time.perf_counter_ns()
        try:
            job.started_ns = self.handler.fire(job.job_id)
        except Exception as e:  # as the fire thread's
            self._forget(job)
            status = WireError.UNREACHABLE if isinstance(e, H.InstrumentUnreachable) else WireError.INTERNAL
            self.ep.answer_error(conn, h, status, f"{type(e).__name__}: {e}", H.STAGE_FIRE, arrival)
            return
        job.done_pc = time.perf_counter_ns()
        self._collect(job)

    def _settle(self) -> None:
        if self.occupancy() == 0:
            self.gc.release()
