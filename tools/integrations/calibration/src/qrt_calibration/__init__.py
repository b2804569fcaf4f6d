"""qrt-calibration: the reference calibration service for qrtd.

It keeps each calibration step of a QPU fresh (a staleness timeout and a
cheap check per step), asks qrtd for a calibration block before the
parameters go stale (calibration.request), runs the step's experiments into
the block through the Qiskit backend (qiskit-experiments: FineXAmplitude,
LocalReadoutError), writes the new calibration set and publishes it with
its measured fidelity model (calibration.update).  See qrt-calibration(8)."""

from .model import Model, Point, fit, reference_fidelity
from .service import QpuSettings, Service, Window
from .sets import SetWriter, load_writer, next_id
from .steps import Measurement, Readout, Step, StepFailed, XAmplitude

__version__ = "0.1.0"

__all__ = ["Measurement", "Model", "Point", "QpuSettings", "Readout", "Service", "SetWriter", "Step",
           "StepFailed", "Window", "XAmplitude", "fit", "load_writer", "next_id", "reference_fidelity"]
