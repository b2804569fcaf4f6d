"""qrtd's endpoint wire, versions 1 and 2, as an endpoint reads and writes
it.  Every constant and the header's layout come from qrt_client.protocol,
which qrt-protogen writes from agent/proto/protocol.toml: nothing of the
wire is spelled here by hand.

A frame is a header (96 bytes in version 1, 128 in version 2) and
payload_len bytes of payload.  `Reader` takes frames off a blocking socket
and checks each header before it reads (or allocates) its payload:
a bad magic, a version the connection does not speak, a header_len that
is not the version's, a payload longer than the wire's (or a HELLO's)
limit, a type the version does not have, unknown flags or non-zero
reserved fields are a `BadFrame` naming what was wrong.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

from qrt_client import protocol as P

MAGIC = P.WIRE_MAGIC
FrameType = P.FrameType
WireError = P.WireError
WireStage = P.WireStage
WireFlag = P.WireFlag
MAX_PAYLOAD = P.WIRE_MAX_PAYLOAD

HEADERS: dict[int, struct.Struct] = {1: P.WIRE_HEADER_V1, 2: P.WIRE_HEADER_V2}
FIELDS: dict[int, tuple[str, ...]] = {1: P.WIRE_FIELDS_V1, 2: P.WIRE_FIELDS_V2}
HEADER_LEN: dict[int, int] = {v: n for v, (n, _) in P.WIRE_VERSIONS.items()}
MAX_HELLO: dict[int, int] = {v: n for v, (_, n) in P.WIRE_VERSIONS.items()}
VERSIONS = tuple(sorted(P.WIRE_VERSIONS))
MIN_HEADER_LEN = min(HEADER_LEN.values())
# The fields every version's header begins with, up to payload_len: enough
# to know the frame's version, type and length.
_PREFIX_N = P.WIRE_FIELDS_V1.index("payload_len") + 1
PREFIX = struct.Struct("<" + P.WIRE_HEADER_V1.format.lstrip("<@=!>")[:_PREFIX_N])
_RESERVED = tuple(f for f in P.WIRE_FIELDS_V2 if f.startswith("reserved"))

# The token of a version-1 HELLO identity that offers version 2.
WIRE2_OFFER = "wire=2"


def field_offset(version: int, name: str) -> int:
    """The byte offset of header field `name` in `version`'s header."""
    fmt = HEADERS[version].format.lstrip("<@=!>")
    i = FIELDS[version].index(name)
    return struct.calcsize("<" + fmt[:i])


class BadFrame(Exception):
    """A frame that breaks the wire: the ERROR status to answer with and
    the reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Closed(Exception):
    """The peer closed the connection (at a frame boundary, or inside one:
    `partial` says which)."""

    def __init__(self, partial: bool = False) -> None:
        super().__init__("closed inside a frame" if partial else "closed")
        self.partial = partial


class Stalled(Exception):
    """A frame began but did not complete within the reader's frame timeout."""


def header(version: int, type_: int, **fields: int) -> dict[str, int]:
    """A header of `version` for a frame of `type_`, every other field 0."""
    h = dict.fromkeys(FIELDS[version], 0)
    h.update(magic=MAGIC, version=version, type=int(type_), header_len=HEADER_LEN[version])
    h.update(fields)
    return h


def encode(h: dict[str, int], payload: bytes = b"") -> bytes:
    """The frame: h (its version's fields; payload_len is set here) and payload."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds the wire's {MAX_PAYLOAD}")
    v = h["version"]
    h = dict(h, payload_len=len(payload))
    return HEADERS[v].pack(*(h[f] for f in FIELDS[v])) + payload


def decode_header(data: bytes) -> dict[str, int]:
    """The header at the start of data (its version's fields)."""
    v = PREFIX.unpack_from(data)[1]
    return dict(zip(FIELDS[v], HEADERS[v].unpack_from(data)))


def check_prefix(magic: int, version: int, type_: int, flags: int, header_len: int, payload_len: int,
                 want_version: int | None) -> None:
    """Raises BadFrame when the fixed prefix of a header is not a frame this
    reader takes (want_version: the connection's version, None before
    HELLO)."""
    if magic != MAGIC:
        raise BadFrame(WireError.PROTOCOL, f"protocol error: bad magic 0x{magic:08x}")
    if version not in HEADER_LEN:
        raise BadFrame(WireError.VERSION, f"protocol error: wire version {version}; this endpoint speaks "
                                          f"{', '.join(map(str, VERSIONS))}")
    if want_version is not None and version != want_version:
        raise BadFrame(WireError.VERSION, f"protocol error: wire version {version} on a version-{want_version} "
                                          "connection")
    if header_len != HEADER_LEN[version]:
        raise BadFrame(WireError.PROTOCOL, f"protocol error: header_len {header_len}, version {version}'s is "
                                           f"{HEADER_LEN[version]}")
    try:
        since = P.FRAME_SINCE[type_]
    except KeyError:
        raise BadFrame(WireError.PROTOCOL, f"protocol error: unknown frame type {type_}") from None
    if since > version:
        raise BadFrame(WireError.PROTOCOL, f"protocol error: frame type {FrameType(type_).name} is not in "
                                           f"wire version {version}")
    if flags & ~P.WIRE_FLAGS_KNOWN:
        raise BadFrame(WireError.PROTOCOL, f"protocol error: unknown flags 0x{flags:02x}")
    limit = MAX_HELLO[version] if type_ == FrameType.HELLO else MAX_PAYLOAD
    if payload_len > limit:
        raise BadFrame(WireError.PROTOCOL, f"protocol error: payload_len {payload_len} > {limit}")


class Reader:
    """Frames off one blocking socket.  The socket's own timeout is the
    idle poll: a read that times out at a frame boundary returns None (the
    caller checks whether to go on); a frame that has begun must complete
    within frame_timeout_s, else Stalled."""

    def __init__(self, sock: socket.socket, frame_timeout_s: float) -> None:
        self.sock = sock
        self.frame_timeout_s = frame_timeout_s
        self._head = bytearray(HEADER_LEN[max(VERSIONS)])
        self._view = memoryview(self._head)
        self._have = 0
        self._began = 0.0

    def _fill(self, view: memoryview, have: int, want: int) -> int:
        """Reads into view[have:want]; returns how much is there.  Raises
        Closed, Stalled, and socket.timeout only at a frame boundary."""
        while have < want:
            try:
                n = self.sock.recv_into(view[have:want], want - have)
            except socket.timeout:
                if have == 0 and view.obj is self._head:
                    raise
                if time.monotonic() - self._began > self.frame_timeout_s:
                    raise Stalled(f"a frame began {self.frame_timeout_s:g} s ago and did not complete") from None
                continue
            if n == 0:
                raise Closed(partial=have > 0 or view.obj is not self._head)
            if have == 0 and view.obj is self._head:
                self._began = time.monotonic()
            have += n
        return have

    def next(self, want_version: int | None) -> tuple[dict[str, int], bytes, int] | None:
        """(header, payload, arrival_ns) of the next frame; None when the
        socket's timeout passed with no frame begun.  arrival_ns is the
        CLOCK_REALTIME stamp taken when the header was complete."""
        try:
            self._have = self._fill(self._view, self._have, MIN_HEADER_LEN)
        except socket.timeout:
            return None
        magic, version, type_, flags, header_len, _status, payload_len = PREFIX.unpack_from(self._head)
        check_prefix(magic, version, type_, flags, header_len, payload_len, want_version)
        self._have = self._fill(self._view, self._have, header_len)
        arrival = time.time_ns()
        h = dict(zip(FIELDS[version], HEADERS[version].unpack_from(self._head)))
        self._have = 0
        for f in _RESERVED:
            if h.get(f, 0):
                raise BadFrame(WireError.PROTOCOL, f"protocol error: {f} is {h[f]}, must be 0")
        payload = b""
        if payload_len:
            buf = bytearray(payload_len)
            self._fill(memoryview(buf), 0, payload_len)
            payload = bytes(buf)
        return h, payload, arrival


def hello_identity(payload: bytes) -> str:
    return payload.decode("utf-8", "replace")


def offers_wire2(identity: str) -> bool:
    """Whether a version-1 HELLO identity ("qrtd 0.2.0 qpu=0 wire=2") offers version 2."""
    return WIRE2_OFFER in identity.split()


def capabilities_json(caps: dict[str, Any]) -> bytes:
    """The version-2 HELLO payload: caps checked against the table's keys
    and types (wire.capabilities), at most the version's HELLO limit."""
    for k, v in caps.items():
        kind = P.CAPABILITIES.get(k)
        if kind is None:
            raise ValueError(f"capability {k!r} is not in the wire's table")
        ok = {"bool": isinstance(v, bool), "string": isinstance(v, str),
              "u32": isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32,
              "i64": isinstance(v, int) and not isinstance(v, bool) and -2**63 <= v < 2**63}.get(kind, False)
        if not ok:
            raise ValueError(f"capability {k} = {v!r} is not a {kind}")
    body = json.dumps(caps, separators=(",", ":")).encode()
    if len(body) > MAX_HELLO[2]:
        raise ValueError(f"capabilities of {len(body)} bytes exceed the HELLO limit {MAX_HELLO[2]}")
    return body
