"""The handler interface the endpoint framework calls, and that each
control stack (qpu-qblox, qpu-labone) and qpu-aer implements: ARM ahead of
T, FIRE at T, DISARM, and the RESULT's contents.

Times are CLOCK_REALTIME nanoseconds (``time.time_ns()``), the clock qrtd
states T in; durations are nanoseconds.

Who calls what, from which thread (qrt_endpoint.server):

- capabilities(), health(), arm(), disarm() and collect() are called from
  one thread, the endpoint's worker, one call at a time;
- fire() is called from the fire connection's own thread, at once when
  FIRE is read, and may run while the worker is in another call of the
  handler (never one about the same job: the framework hands a job to
  exactly one of fire() and disarm());
- arm() is called only while fewer than max_armed jobs are held (armed,
  or fired and not yet collected); an ARM that comes while the stack is
  full waits for a collect(), up to its fire_at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from qrt_client import protocol as P

# Why an ARM was refused.  Each names what the endpoint, the compiler or the
# instrument found; the wire's ERROR carries it (REASON_STATUS) with the
# stage and the compiler's or instrument's own words.
CALIBRATION_UNKNOWN = "calibration_unknown"
CALIBRATION_MISMATCH = "calibration_mismatch"
GATE_NOT_SUPPORTED = "gate_not_supported"
QUBIT_OUT_OF_RANGE = "qubit_out_of_range"
INSTRUCTION_MEMORY_EXCEEDED = "instruction_memory_exceeded"
WAVEFORM_MEMORY_EXCEEDED = "waveform_memory_exceeded"
SEQUENCER_NOT_CONFIGURED = "sequencer_not_configured"
PROGRAM_TOO_LONG = "program_too_long"
INSTRUMENT_UNREACHABLE = "instrument_unreachable"
PROGRAM_INVALID = "program_invalid"
PROGRAM_REJECTED = "program_rejected"
TOO_MANY_ARMED = "too_many_armed"
BEYOND_HORIZON = "beyond_horizon"

# The wire's ERROR status for each reason (qrt_client.protocol.WireError).
REASON_STATUS: dict[str, int] = {
    CALIBRATION_UNKNOWN: P.WireError.CALIBRATION_UNKNOWN,
    CALIBRATION_MISMATCH: P.WireError.CALIBRATION,
    GATE_NOT_SUPPORTED: P.WireError.PROGRAM_REFUSED,
    QUBIT_OUT_OF_RANGE: P.WireError.PROGRAM_REFUSED,
    INSTRUCTION_MEMORY_EXCEEDED: P.WireError.MEMORY_FULL,
    WAVEFORM_MEMORY_EXCEEDED: P.WireError.MEMORY_FULL,
    SEQUENCER_NOT_CONFIGURED: P.WireError.PROGRAM_REFUSED,
    PROGRAM_TOO_LONG: P.WireError.PROGRAM_REFUSED,
    INSTRUMENT_UNREACHABLE: P.WireError.UNREACHABLE,
    PROGRAM_INVALID: P.WireError.PROGRAM_REFUSED,
    PROGRAM_REJECTED: P.WireError.PROGRAM_REFUSED,
    TOO_MANY_ARMED: P.WireError.TOO_MANY_ARMED,
    BEYOND_HORIZON: P.WireError.PROGRAM_REFUSED,
}

# The stages of an ARM, in order, and of what follows (the wire's
# WireStage, by name).
STAGE_PARSE = P.WireStage.PARSE.name.lower()
STAGE_COMPILE = P.WireStage.COMPILE.name.lower()
STAGE_UPLOAD = P.WireStage.UPLOAD.name.lower()
STAGE_ARM = P.WireStage.ARM.name.lower()
STAGE_FIRE = P.WireStage.FIRE.name.lower()
STAGE_RUN = P.WireStage.RUN.name.lower()


def stage_code(name: str) -> int:
    """The wire's WireStage value of a stage name ("compile" -> 2); 0 for none."""
    try:
        return int(P.WireStage[name.upper()])
    except KeyError:
        return int(P.WireStage.NONE)


class ArmRefused(Exception):
    """An ARM the endpoint will not hold: the stage it failed in, the
    reason (one of the constants above) and the compiler's or the
    instrument's own words."""

    def __init__(self, stage: str, reason: str, detail: str) -> None:
        super().__init__(f"{stage}: {reason}: {detail}")
        self.stage = stage
        self.reason = reason
        self.detail = detail


class RunFailed(Exception):
    """A fired job that did not run to its result (stopped at a time bound,
    the instrument's error flags, a crash): the stage and why."""

    def __init__(self, stage: str, detail: str, status: int = P.WireError.INTERNAL) -> None:
        super().__init__(detail)
        self.stage = stage
        self.detail = detail
        self.status = status


class InstrumentUnreachable(Exception):
    """The instruments do not answer (health(), or a call on the way)."""


class UnknownJob(KeyError):
    """fire/disarm/collect named a job this handler does not hold."""


@dataclass(frozen=True)
class ArmRequest:
    job_id: int
    calibration_id: int
    fire_at_ns: int
    window_start_ns: int
    window_end_ns: int
    slot_ns: int
    shots: int
    tolerance_ns: int
    program: bytes
    # when the ARM (or a version-1 JOB) was read, and whether it is a
    # version-1 JOB: armed, fired and collected at once, at its arrival
    arrival_ns: int = 0
    one_phase: bool = False


@dataclass(frozen=True)
class Armed:
    job_id: int
    stages: list[tuple[str, int]]
    program_duration_ns: int


@dataclass
class Result:
    job_id: int
    # qrtd's answer envelope: {"format": "qasm3-counts", "results": [...]}
    # or {"format": "<stack>-raw", ...} for a precompiled program that asks
    # for its acquisitions.
    payload: dict[str, Any]
    # The instruments' own status flags, by sequencer or device.
    status: dict[str, Any] = field(default_factory=dict)
    armed_ns: int = 0
    started_ns: int = 0
    ended_ns: int = 0


class Handler(Protocol):
    def capabilities(self) -> dict[str, Any]:
        """two_phase, max_armed, horizon_ns, min_lead_ns, start (the keys of
        the wire's capabilities table; identity and session are the
        framework's)."""

    def arm(self, req: ArmRequest) -> Armed: ...

    def fire(self, job_id: int) -> int:
        """Starts the armed job; returns when the start command was issued
        (CLOCK_REALTIME ns)."""

    def disarm(self, job_id: int) -> None: ...

    def collect(self, job_id: int) -> Result:
        """Waits for the fired job's end; its Result, or RunFailed."""

    def health(self) -> None:
        """Raises InstrumentUnreachable when the instruments do not answer."""
