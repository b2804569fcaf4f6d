"""The gates of the device, as LabOne Q quantum operations on its Transmon
qubits: the OpenQASM 3 importer of LabOne Q calls them by gate name.  The
pulses are the qubits' calibrated parameters (the calibration set): a DRAG
pulse of `custom["amplitude_pi"]` for a pi rotation, scaled by the angle;
virtual Z by the drive oscillator's phase; CZ a flux pulse on the lower
qubit of a coupled pair (`custom["cz"][partner] = {"amplitude", "length"}`);
a square readout and integration; a passive reset."""

from __future__ import annotations

import math
from typing import Any

from laboneq.dsl.quantum import QuantumOperations
from laboneq.dsl.quantum.transmon import Transmon
from laboneq.simple import dsl


def _drive(q: Any, angle: float, phase: float) -> None:
    c = q.parameters.custom
    pulse = dsl.create_pulse({"function": "drag", "amplitude": c["amplitude_pi"] * angle / math.pi,
                              "length": c["pulse_length"], "beta": c.get("drag_beta", 0.0)}, name="rxy")
    dsl.play(q.signals["drive"], pulse, phase=phase)


def _phase(q: Any, angle: float) -> None:
    dsl.play(q.signals["drive"], None, increment_oscillator_phase=-angle)


class QrtOperations(QuantumOperations):
    QUBIT_TYPES = Transmon

    @dsl.quantum_operation
    def x(self, q: Transmon) -> None:
        _drive(q, math.pi, 0.0)

    @dsl.quantum_operation
    def y(self, q: Transmon) -> None:
        _drive(q, math.pi, math.pi / 2)

    @dsl.quantum_operation
    def sx(self, q: Transmon) -> None:
        _drive(q, math.pi / 2, 0.0)

    @dsl.quantum_operation
    def rx(self, q: Transmon, theta: float) -> None:
        _drive(q, theta, 0.0)

    @dsl.quantum_operation
    def ry(self, q: Transmon, theta: float) -> None:
        _drive(q, theta, math.pi / 2)

    @dsl.quantum_operation
    def rz(self, q: Transmon, theta: float) -> None:
        _phase(q, theta)

    @dsl.quantum_operation
    def z(self, q: Transmon) -> None:
        _phase(q, math.pi)

    @dsl.quantum_operation
    def s(self, q: Transmon) -> None:
        _phase(q, math.pi / 2)

    @dsl.quantum_operation
    def sdg(self, q: Transmon) -> None:
        _phase(q, -math.pi / 2)

    @dsl.quantum_operation
    def t(self, q: Transmon) -> None:
        _phase(q, math.pi / 4)

    @dsl.quantum_operation
    def tdg(self, q: Transmon) -> None:
        _phase(q, -math.pi / 4)

    @dsl.quantum_operation
    def h(self, q: Transmon) -> None:
        _phase(q, math.pi)
        _drive(q, math.pi / 2, math.pi / 2)

    @dsl.quantum_operation
    def cz(self, a: Transmon, b: Transmon) -> None:
        lo, hi = (a, b) if a.uid < b.uid else (b, a)
        cz = lo.parameters.custom.get("cz", {}).get(hi.uid)
        if cz is None:
            raise ValueError(f"gate_not_supported: no coupler between {lo.uid} and {hi.uid}")
        pulse = dsl.create_pulse({"function": "const", "amplitude": cz["amplitude"], "length": cz["length"]},
                                 name="cz")
        dsl.play(lo.signals["flux"], pulse)
        dsl.reserve(hi.signals["drive"])
        dsl.reserve(lo.signals["drive"])

    @dsl.quantum_operation
    def cx(self, c: Transmon, t: Transmon) -> None:
        self.h.omit_section(t)
        self.cz.omit_section(c, t)
        self.h.omit_section(t)

    @dsl.quantum_operation
    def measure(self, q: Transmon, handle: str) -> None:
        c = q.parameters.custom
        pulse = dsl.create_pulse({"function": "const", "amplitude": c["readout_amplitude"],
                                  "length": c["readout_length"]}, name="readout")
        dsl.measure(measure_signal=q.signals["measure"], measure_pulse=pulse, handle=handle,
                    acquire_signal=q.signals["acquire"], integration_length=c["readout_length"],
                    reset_delay=c["reset_delay_length"])

    @dsl.quantum_operation
    def reset(self, q: Transmon) -> None:
        dsl.delay(q.signals["drive"], q.parameters.custom["reset_delay_length"])
