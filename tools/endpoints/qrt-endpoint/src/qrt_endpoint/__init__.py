"""qrt-endpoint: the framework of qrtd's Python QPU endpoints (qpu-aer,
qpu-qblox, qpu-labone).  It speaks qrtd's endpoint wire, versions 1 and 2
(qrt_client.protocol, generated from agent/proto/protocol.toml), on
unix:// and tcp:// listeners, pairs each agent's control and fire
connections, and calls a control stack's handler (handler.Handler):
capabilities, arm, fire, disarm, collect, health."""

from .handler import (
    Armed,
    ArmRefused,
    ArmRequest,
    Handler,
    InstrumentUnreachable,
    Result,
    RunFailed,
    UnknownJob,
)
from .server import Endpoint, Options

__all__ = ["ArmRefused", "ArmRequest", "Armed", "Endpoint", "Handler", "InstrumentUnreachable", "Options",
           "Result", "RunFailed", "UnknownJob"]
__version__ = "0.1.0"
