"""What the tests drive the framework with: an agent that packs and reads
frames with the table's own header layouts (qrt_client.protocol), not the
framework's codec, and a handler that records what it was asked."""

from __future__ import annotations

import gc
import json
import socket
import threading
import time
from typing import Any

from qrt_client import protocol as P

from qrt_endpoint import handler as H

HDR = {1: P.WIRE_HEADER_V1, 2: P.WIRE_HEADER_V2}
FLD = {1: P.WIRE_FIELDS_V1, 2: P.WIRE_FIELDS_V2}
T = P.FrameType
E = P.WireError


def frame(version: int, type_: int, payload: bytes = b"", **kw: int) -> bytes:
    h = dict.fromkeys(FLD[version], 0)
    h.update(magic=P.WIRE_MAGIC, version=version, type=int(type_), header_len=HDR[version].size,
             payload_len=len(payload))
    h.update(kw)
    return HDR[version].pack(*(h[f] for f in FLD[version])) + payload


def job_fields(job_id: int, ahead_ns: int = 2 * 10**9, cal: int = 1, duration_ns: int = 10**6,
               shots: int = 10) -> dict[str, int]:
    t = time.time_ns() + ahead_ns
    return dict(job_id=job_id, calibration_id=cal, scheduled_ns=t, sent_ns=time.time_ns(),
                window_start_ns=t - 10**9, window_end_ns=t + duration_ns + 10**9, duration_ns=duration_ns,
                shots=shots, tolerance_ns=10**9)


class Peer:
    """One connection to the endpoint."""

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)

    def send(self, data: bytes) -> None:
        self.s.sendall(data)

    def read(self) -> tuple[dict[str, int], bytes]:
        head = self._exactly(P.WIRE_VERSIONS[1][0])
        v = int.from_bytes(head[4:6], "little")
        if v == 2:
            head += self._exactly(P.WIRE_VERSIONS[2][0] - len(head))
        h = dict(zip(FLD[v], HDR[v].unpack(head)))
        return h, self._exactly(h["payload_len"])

    def closed(self, timeout: float = 10.0) -> bool:
        """True when the endpoint closed this connection (reads what comes first)."""
        self.s.settimeout(timeout)
        try:
            while True:
                if not self.s.recv(4096):
                    return True
        except (socket.timeout, OSError) as e:
            return not isinstance(e, socket.timeout)

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the endpoint closed the connection")
            buf += chunk
        return buf

    def close(self) -> None:
        self.s.close()


class Agent:
    """A version-2 agent: the control connection, then the fire connection."""

    def __init__(self, path: str, identity: str = "qrtd-test 0.2.0 qpu=0 wire=2") -> None:
        self.control = Peer(path)
        self.control.send(frame(1, T.HELLO, identity.encode()))
        self.hello, body = self.control.read()
        self.caps = json.loads(body) if self.hello["version"] == 2 else None
        self.fire: Peer | None = None
        if self.caps is not None:
            self.fire = Peer(path)
            self.fire.send(frame(2, T.HELLO, json.dumps({"channel": "fire", "session": self.caps["session"]}).encode()))
            self.fire_hello = self.fire.read()

    def arm(self, fields: dict[str, int], program: bytes = b"ok") -> None:
        self.control.send(frame(2, T.ARM, program, **fields))

    def do_fire(self, fields: dict[str, int]) -> None:
        assert self.fire is not None
        self.fire.send(frame(2, T.FIRE, job_id=fields["job_id"], calibration_id=fields["calibration_id"],
                             scheduled_ns=fields["scheduled_ns"], sent_ns=time.time_ns()))

    def read(self) -> tuple[dict[str, int], bytes]:
        return self.control.read()

    def close(self) -> None:
        self.control.close()
        if self.fire is not None:
            self.fire.close()


class LabHandler:
    """A handler that records every call (with its thread and the gc's state),
    refuses a program "refuse <reason>" with that reason, and can be told its
    instruments are down."""

    def __init__(self, max_armed: int = 4, horizon_ns: int = 60 * 10**9, two_phase: bool = True) -> None:
        self.max_armed = max_armed
        self.horizon_ns = horizon_ns
        self.two_phase = two_phase
        self.calls: list[tuple[str, int, str, bool, int]] = []
        self.held: dict[int, str] = {}
        self.down = False
        self.arm_delay_s = 0.0
        self.collect_delay_s = 0.0
        self.lock = threading.Lock()

    def _note(self, what: str, job_id: int) -> None:
        with self.lock:
            self.calls.append((what, job_id, threading.current_thread().name, gc.isenabled(), time.time_ns()))

    def names(self, job_id: int | None = None) -> list[str]:
        with self.lock:
            return [c[0] for c in self.calls if job_id is None or c[1] == job_id]

    def capabilities(self) -> dict[str, Any]:
        return {"two_phase": self.two_phase, "max_armed": self.max_armed, "horizon_ns": self.horizon_ns,
                "min_lead_ns": 1_000_000, "start": "on_fire"}

    def health(self) -> None:
        self._note("health", 0)
        if self.down:
            raise H.InstrumentUnreachable("the test switched the instruments off")

    def arm(self, req: H.ArmRequest) -> H.Armed:
        self._note("arm", req.job_id)
        time.sleep(self.arm_delay_s)
        text = req.program.decode()
        if text.startswith("refuse "):
            _, reason, stage = text.split(" ", 2)
            raise H.ArmRefused(stage, reason, f"the test refused it ({reason})")
        if text == "raise":
            raise ZeroDivisionError("a bug in the stack")
        if self.down:
            raise H.ArmRefused(H.STAGE_UPLOAD, H.INSTRUMENT_UNREACHABLE, "no answer")
        self.held[req.job_id] = "armed"
        return H.Armed(req.job_id, [(H.STAGE_COMPILE, 1000), (H.STAGE_UPLOAD, 2000), (H.STAGE_ARM, 3000)], 5000)

    def fire(self, job_id: int) -> int:
        self._note("fire", job_id)
        if self.held.get(job_id) != "armed":
            raise H.UnknownJob(job_id)
        self.held[job_id] = "fired"
        return time.time_ns()

    def disarm(self, job_id: int) -> None:
        self._note("disarm", job_id)
        if self.held.pop(job_id, None) is None:
            raise H.UnknownJob(job_id)

    def collect(self, job_id: int) -> H.Result:
        self._note("collect", job_id)
        time.sleep(self.collect_delay_s)
        if self.held.pop(job_id, None) != "fired":
            raise H.UnknownJob(job_id)
        now = time.time_ns()
        return H.Result(job_id, {"format": P.ENVELOPE_RESULT_FORMAT,
                                 "results": [{"name": "c", "shots": 10, "counts": {"0": 10}}]},
                        {"seq0": "STOPPED"}, 0, 0, now)
