"""qpu-aer's handler (qrt_endpoint.handler.Handler): ARM reads the job's
OpenQASM 3 circuits into AerSimulator's circuits in the simulator process
and keeps them there; FIRE marks the job started; collect() runs it and
waits for the counts; DISARM drops it.

Each request to the simulator process is bounded: an ARM or a run by the
job's duration_ns plus --run-margin-s.  A request past its bound kills the
process; a warm spare takes over, the jobs still armed are armed again in
it from the programs kept here, and the job is refused (ARM) or failed
(run) with an ERROR naming the bound.  So one tenant's program holds the
simulator for at most its own bound.

The calibration check: a fixed --calibration-id, or the window in force of
a periodic schedule (--period-ns, the [[qpu]]'s): at a JOB's arrival
(version 1), at the ARM's fire_at (version 2).

The drifting device (--calibration-dir, qpu_aer_drift): ARM reads the set
of the job's calibration id and sends the simulator the drift's noise at
the job's start (arrival or fire_at) under that set; the run applies it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from qrt_client import protocol as P
from qrt_endpoint.handler import (
    CALIBRATION_MISMATCH,
    PROGRAM_REJECTED,
    STAGE_ARM,
    STAGE_PARSE,
    STAGE_RUN,
    Armed,
    ArmRefused,
    ArmRequest,
    InstrumentUnreachable,
    Result,
    RunFailed,
    UnknownJob,
)

from .runner import Runner


@dataclass
class Config:
    qubits: int = 32
    max_shots: int = 100_000
    calibration_id: int = 0
    period_ns: int = 0
    blackout_ns: int = 0
    phase_ns: int = 0
    seed: int | None = None
    max_operations: int = 1_000_000
    run_margin_s: float = 10.0
    max_armed: int = 16
    horizon_ns: int = 60 * 10**9
    min_lead_ns: int = 100_000_000
    calibration_dir: str = ""
    drift: Any = None     # qpu_aer_drift.Drift, with calibration_dir


class _Job:
    __slots__ = ("fired", "head", "lost", "program", "req", "started_ns")

    def __init__(self, req: ArmRequest, head: dict[str, Any]) -> None:
        self.req = req
        self.head = head
        self.program = req.program
        self.fired = False
        self.lost = ""
        self.started_ns = 0


class AerHandler:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.runner = Runner(cfg.qubits, cfg.max_shots, cfg.max_operations, cfg.seed)
        self._jobs: dict[int, _Job] = {}
        self._sets: Any = None
        if cfg.calibration_dir:
            import qpu_aer_drift
            self._sets = qpu_aer_drift.SetStore(cfg.calibration_dir)
        self._lock = threading.Lock()
        self.stopped = 0
        self.rearmed = 0

    def close(self) -> None:
        self.runner.stop()

    def summary(self) -> dict[str, Any]:
        return {"stopped": self.stopped, "rearmed": self.rearmed, "simulators_replaced": self.runner.replaced}

    def capabilities(self) -> dict[str, Any]:
        return {"two_phase": True, "max_armed": self.cfg.max_armed, "horizon_ns": self.cfg.horizon_ns,
                "min_lead_ns": self.cfg.min_lead_ns, "start": "on_fire"}

    def health(self) -> None:
        if not self.runner.alive():
            raise InstrumentUnreachable("the simulator process is gone")

    # ------------------------------------------------------------ calibration

    def expected_calibration(self, t_ns: int) -> int | None:
        """The window in force at t of the periodic schedule, None in a blackout."""
        c = self.cfg
        k = (t_ns - c.phase_ns) // c.period_ns
        if t_ns - (c.phase_ns + k * c.period_ns) < c.blackout_ns:
            return None
        return k + 1

    def _check_calibration(self, req: ArmRequest) -> None:
        at, what = (req.arrival_ns, "arrival") if req.one_phase else (req.fire_at_ns, "fire_at")
        want = self.cfg.calibration_id
        if self.cfg.period_ns:
            want = self.expected_calibration(at) or 0
            if not want:
                raise ArmRefused(STAGE_PARSE, CALIBRATION_MISMATCH, f"{what} {at} is inside a calibration blackout; "
                                 f"calibration_id {req.calibration_id} is not current")
        if want and req.calibration_id != want:
            raise ArmRefused(STAGE_PARSE, CALIBRATION_MISMATCH,
                             f"calibration_id {req.calibration_id} is not current ({want})")

    def _noise(self, req: ArmRequest) -> dict[str, Any] | None:
        """The drift's noise for the job at its start under the set of its
        calibration id (None without --calibration-dir); ArmRefused when the
        set cannot be read."""
        if self._sets is None:
            return None
        import qpu_aer_drift
        at = req.arrival_ns if req.one_phase else req.fire_at_ns
        try:
            s = self._sets.load(req.calibration_id)
        except qpu_aer_drift.SetError as e:
            raise ArmRefused(STAGE_PARSE, CALIBRATION_MISMATCH, f"qpu-aer: {e}") from None
        spec: dict[str, Any] = self.cfg.drift.noise_spec(s, at, self.cfg.qubits)
        return spec

    # ------------------------------------------------------------ the interface

    def _bound_s(self, req: ArmRequest) -> float:
        return max(0, req.slot_ns) / 1e9 + self.cfg.run_margin_s

    def _bound_text(self, req: ArmRequest) -> str:
        return (f"{self._bound_s(req):.3f} s (duration {req.slot_ns} ns + --run-margin-s "
                f"{self.cfg.run_margin_s:g})")

    def arm(self, req: ArmRequest) -> Armed:
        if req.job_id in self._jobs:
            raise ArmRefused(STAGE_ARM, PROGRAM_REJECTED, f"job {req.job_id} is already held")
        self._check_calibration(req)
        head: dict[str, Any] = {"op": "arm", "job": req.job_id, "shots": req.shots}
        noise = self._noise(req)
        if noise is not None:
            head["noise"] = noise
        reply = self._send(head, req.program, self._bound_s(req))
        if reply is None:
            self.stopped += 1
            raise ArmRefused(STAGE_PARSE, PROGRAM_REJECTED, f"qpu-aer: reading the program ran past its time "
                             f"bound, {self._bound_text(req)}, and was stopped{self._died()}")
        if "refused" in reply:
            stage, reason, detail = reply["refused"]
            raise ArmRefused(stage, reason, detail)
        if "failed" in reply:
            raise ArmRefused(STAGE_PARSE, PROGRAM_REJECTED, reply["failed"])
        with self._lock:
            self._jobs[req.job_id] = _Job(req, head)
        # A simulator has no program duration of its own: 0.
        return Armed(req.job_id, [(s, int(ns)) for s, ns in reply["armed"]], 0)

    def fire(self, job_id: int) -> int:
        job = self._jobs.get(job_id)
        if job is None or job.fired or job.lost:
            raise UnknownJob(job_id)
        job.fired = True
        job.started_ns = time.time_ns()
        return job.started_ns

    def disarm(self, job_id: int) -> None:
        with self._lock:
            job = self._jobs.pop(job_id, None)
        if job is None:
            raise UnknownJob(job_id)
        self._send({"op": "drop", "job": job_id}, b"", self.cfg.run_margin_s)

    def collect(self, job_id: int) -> Result:
        job = self._jobs.get(job_id)
        if job is None or not job.fired:
            raise UnknownJob(job_id)
        try:
            reply = None if job.lost else self._send({"op": "run", "job": job_id}, b"", self._bound_s(job.req))
        finally:
            with self._lock:
                self._jobs.pop(job_id, None)
        if job.lost:
            raise RunFailed(STAGE_RUN, job.lost)
        if reply is None:
            self.stopped += 1
            died = self._died()
            if died:
                raise RunFailed(STAGE_RUN, f"qpu-aer: the simulator process died running this job{died}; nothing "
                                "was run to completion")
            raise RunFailed(STAGE_RUN, f"qpu-aer: the job ran past its time bound, {self._bound_text(job.req)}, "
                            "and was stopped")
        if "failed" in reply:
            raise RunFailed(STAGE_RUN, reply["failed"])
        return Result(job_id, {"format": P.ENVELOPE_RESULT_FORMAT, "results": reply["results"]}, {}, 0,
                      int(reply["started_ns"]), int(reply["ended_ns"]))

    # ------------------------------------------------------------ the simulator process

    def _died(self) -> str:
        d = self.runner.died
        return "" if d is None else f" (exit status {d})"

    def _send(self, head: dict[str, Any], payload: bytes, timeout_s: float) -> dict[str, Any] | None:
        try:
            replaced = self.runner.replaced
            reply = self.runner.request(head, payload, timeout_s)
        except RuntimeError as e:
            raise InstrumentUnreachable(f"qpu-aer: no simulator process: {e}") from None
        if self.runner.replaced != replaced:
            self._rearm(skip=int(head["job"]))
        return reply

    def _rearm(self, skip: int) -> None:
        """The jobs held in a process that was killed (armed, or fired and
        not run yet), armed again in its replacement from the programs kept
        here."""
        with self._lock:
            jobs = [j for k, j in self._jobs.items() if k != skip and not j.lost]
        for j in jobs:
            reply = self.runner.request(j.head, j.program, self._bound_s(j.req))
            if reply is not None and "armed" in reply:
                self.rearmed += 1
            else:   # it armed once; failing again, it fails at its FIRE or its run
                j.lost = ("qpu-aer: the simulator process holding this job was replaced and arming it again "
                          f"failed: {(reply or {}).get('failed', 'past its bound')}")
