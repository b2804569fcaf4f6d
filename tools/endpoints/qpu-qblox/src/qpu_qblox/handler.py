"""The handler interface an endpoint program calls: ARM ahead of T, FIRE at
T, DISARM, and the RESULT's contents.  The endpoint framework (which speaks
qrtd's wire) adopts these names; each control stack implements them.

Times are CLOCK_REALTIME nanoseconds (``time.time_ns()``), the clock qrtd
states T in; durations are nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

# Why an ARM was refused.  Each names what the endpoint, the compiler or the
# instrument found; the wire's ERROR carries it with the stage.
CALIBRATION_UNKNOWN = "calibration_unknown"
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

# The stages of an ARM, in order.
STAGE_PARSE = "parse"
STAGE_COMPILE = "compile"
STAGE_UPLOAD = "upload"
STAGE_ARM = "arm"


class ArmRefused(Exception):
    """An ARM the endpoint will not hold: the stage it failed in, the
    reason (one of the constants above) and the compiler's or the
    instrument's own words."""

    def __init__(self, stage: str, reason: str, detail: str) -> None:
        super().__init__(f"{stage}: {reason}: {detail}")
        self.stage = stage
        self.reason = reason
        self.detail = detail


class InstrumentUnreachable(Exception):
    """The instruments do not answer (health(), or a call on the way)."""


class UnknownJob(KeyError):
    """fire/disarm/collect named a job this endpoint does not hold."""


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
    def capabilities(self) -> dict[str, Any]: ...

    def arm(self, req: ArmRequest) -> Armed: ...

    def fire(self, job_id: int) -> int: ...

    def disarm(self, job_id: int) -> None: ...

    def collect(self, job_id: int) -> Result: ...

    def health(self) -> None: ...
