"""qpu-labone: the instrument side of a qrtd endpoint for Zurich
Instruments through LabOne Q."""

from qrt_endpoint.handler import Armed, ArmRefused, ArmRequest, Handler, InstrumentUnreachable, Result

from .calibration import CalibrationStore, write_set
from .stack import LabOneStack

__all__ = ["ArmRefused", "ArmRequest", "Armed", "CalibrationStore", "Handler", "InstrumentUnreachable",
           "LabOneStack", "Result", "write_set"]
__version__ = "0.1.0"
