"""qpu-qblox: the instrument side of a qrtd endpoint for a Qblox Cluster."""

from qrt_endpoint.handler import Armed, ArmRefused, ArmRequest, Handler, InstrumentUnreachable, Result

from .calibration import CalibrationStore, write_set
from .stack import QbloxStack

__all__ = ["ArmRefused", "ArmRequest", "Armed", "CalibrationStore", "Handler", "InstrumentUnreachable",
           "QbloxStack", "Result", "write_set"]
__version__ = "0.1.0"
