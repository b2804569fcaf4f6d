"""An agent for tests and benches: it speaks the endpoint wire as qrtd
does, packing and reading frames with the table's own header layouts
(qrt_client.protocol) -- not the framework's codec, so that a test of the
framework does not check it against itself.  Not used by any endpoint."""

from __future__ import annotations

import json
import socket
import time

from qrt_client import protocol as P

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
