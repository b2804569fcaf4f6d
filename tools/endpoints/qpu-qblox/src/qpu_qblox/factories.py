"""The device configuration's factory for a transmon's dispersive readout:
a square readout pulse on the readout port and an IQ integration starting
`acq_delay` after it, one bin per shot.  (qblox-scheduler ships its
transmon element, and its measurement factory, in qblox-applications, which
is not on PyPI; this factory is built only from qblox-scheduler's own
operations.)  `acq_rotation` and `acq_threshold` are not played: they are
the calibration set's state discrimination, read by the endpoint to turn
the integrated I/Q values into bits."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from qblox_scheduler.operations.acquisition_library import IQIntegration
from qblox_scheduler.operations.pulse_library import ResetClockPhase, SquarePulse
from qblox_scheduler.schedules.schedule import TimeableSchedule


def dispersive_measure(
    port: str,
    clock: str,
    pulse_amp: float,
    pulse_duration: float,
    acq_delay: float,
    acq_duration: float,
    acq_label: Hashable = None,
    acq_label_override: Hashable = None,
    coords: dict[str, Any] | None = None,
    acq_protocol: str | None = None,
    average_segment_repetitions: bool = False,
    feedback_trigger_label: str | None = None,
    acq_rotation: float = 0.0,
    acq_threshold: float = 0.0,
) -> TimeableSchedule:
    del acq_protocol, feedback_trigger_label, acq_rotation, acq_threshold
    s = TimeableSchedule("dispersive_measure")
    s.add(ResetClockPhase(clock=clock))
    s.add(SquarePulse(amplitude=pulse_amp, duration=pulse_duration, port=port, clock=clock), ref_pt="start")
    s.add(
        IQIntegration(
            port=port,
            clock=clock,
            duration=acq_duration,
            acq_label=acq_label_override if acq_label_override is not None else acq_label,
            coords=coords,
            average_segment_repetitions=average_segment_repetitions,
        ),
        rel_time=acq_delay,
        ref_pt="start",
    )
    return s
