"""qrt_client: a Python client for qrtd, the QPU host agent.

Standard library only (socket, json, base64, ctypes).  The agent speaks
JSON-RPC 2.0 over an AF_UNIX stream socket, one JSON object per line; see
qrtctl(1) for the methods.  A path "tcp://HOST:PORT" reaches an agent's
network listener instead (qrtd(8), NETWORK LISTENER): the client has the
local munged encode a MUNGE credential over the agent's challenge, through
libmunge (libmunge2) by ctypes, and authenticates before the first call
($QRT_MUNGE_SOCKET or munge_socket= names munged's socket; default
/run/munge/munge.socket.2).

    from qrt_client import Client, RpcError

    with Client() as c:                      # $QRT_SOCKET or /run/qrtd/qrtd.sock
        print(c.hello()["api_version"])
        slots = c.slots_query(duration_ns=2_000_000, qpus=["qpu0"])
        r = c.slots_reserve(duration_ns=2_000_000, qpus=["qpu0"],
                            idempotency_key="slurm-1234")
        c.jobs_submit(b"...", reservation_id=r["reservation_id"],
                      fencing_token=r["fencing_token"])
        try:
            c.slots_query(duration_ns=2_000_000, qpus=["nope"])
        except RpcError as e:
            print(e.reason, e.exit_code)      # unknown_qpu 7

Errors: RpcError for errors the agent sent (code, reason = the stable
data.reason, message, data); ClientError for failures on this side
(reason "unreachable", "timeout", "disconnected", "protocol_error",
"munge_error" when no MUNGE credential can be made here).  Both
carry exit_code, the status qrtctl exits with for the same reason.

A Client is not thread-safe; use one per thread.  Events pushed by the
agent (after subscribe()) are queued while a reply is awaited and read with
events().
"""

from __future__ import annotations

import base64
import collections
import ctypes
import json
import os
import random
import socket
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only read by type checkers: the client needs nothing but the standard library
    from typing_extensions import Self

from . import protocol as _protocol

__all__ = [
    "DEFAULT_SOCKET",
    "EXIT_CODES",
    "REASONS",
    "Client",
    "ClientError",
    "QrtError",
    "RpcError",
    "YieldRequest",
    "exit_code_for_reason",
    "yield_request",
]

DEFAULT_SOCKET = "/run/qrtd/qrtd.sock"

# (reason, JSON-RPC code, qrtctl exit status) of every reason the agent
# raises, and (reason, exit status) of the client's own: the protocol's one
# table (agent/proto/protocol.toml), through its generated copy.
REASONS = [(r.name, r.code, r.exit_code) for r in _protocol.REASONS if r.code is not None]
LOCAL_REASONS = [(r.name, r.exit_code) for r in _protocol.CLIENT_REASONS]
EXIT_CODES: dict[str, int] = {r: e for r, _, e in REASONS}
EXIT_CODES.update(dict(LOCAL_REASONS))

# The reason to assume when a (foreign) server omits data.reason: the first
# listed for the code.
_DEFAULT_REASON: dict[int, str] = {}
for _r, _c, _ in REASONS:
    _DEFAULT_REASON.setdefault(_c, _r)


def exit_code_for_reason(reason: str) -> int:
    """qrtctl's exit status for a reason (1 when unknown)."""
    return EXIT_CODES.get(reason, 1)


class QrtError(Exception):
    """Base of every error this module raises."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{message} ({reason})")
        self.reason = reason
        self.message = message

    @property
    def exit_code(self) -> int:
        return exit_code_for_reason(self.reason)


class RpcError(QrtError):
    """An error the agent answered with."""

    def __init__(self, code: int, reason: str, message: str, data: Any = None,
                 method: str = "") -> None:
        super().__init__(reason, f"{method}: {message}" if method else message)
        self.code = code
        self.data = data
        self.method = method


class ClientError(QrtError):
    """A failure on this side of the socket (connect, timeout, bad reply)."""

    def __init__(self, reason: str, message: str, errno: int = 0) -> None:
        super().__init__(reason, message)
        self.errno = errno


# What the MUNGE credential signs (agent/proto/include/qrt/proto/auth_binding.hpp;
# the version is protocol.toml's [auth], checked by test_qrt_client.py):
# "qrtd-auth-v2 <nonce> <address>", the address being the listener this
# socket is connected to, so that another qrtd refuses the credential should
# this listener have relayed its challenge.
AUTH_PAYLOAD_VERSION = _protocol.AUTH_PAYLOAD_VERSION


def tcp_address_text(peer: tuple[Any, ...]) -> str:
    """tcp://ADDR:PORT of a getpeername() result, as qrtd writes it: an
    IPv6 address in brackets, an IPv4-mapped one as IPv4."""
    host, port = str(peer[0]), int(peer[1])
    if ":" in host:
        if host.lower().startswith("::ffff:") and "." in host:
            return f"tcp://{host[7:]}:{port}"
        return f"tcp://[{socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, host))}]:{port}"
    return f"tcp://{host}:{port}"


def munge_encode(payload: bytes, munge_socket: str | None = None) -> str:
    """A MUNGE credential over payload from the local munged (libmunge)."""
    try:
        lib = ctypes.CDLL("libmunge.so.2")
    except OSError as e:
        raise ClientError("munge_error", f"libmunge is not installed (Debian: libmunge2): {e}") from None
    libc = ctypes.CDLL(None)
    lib.munge_ctx_create.restype = ctypes.c_void_p
    lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
    lib.munge_ctx_strerror.restype = ctypes.c_char_p
    lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
    lib.munge_strerror.restype = ctypes.c_char_p
    lib.munge_strerror.argtypes = [ctypes.c_int]
    lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                 ctypes.c_char_p, ctypes.c_int]
    lib.munge_encode.restype = ctypes.c_int
    libc.free.argtypes = [ctypes.c_void_p]
    where = munge_socket or os.environ.get("QRT_MUNGE_SOCKET") or ""
    ctx = lib.munge_ctx_create()
    if not ctx:
        raise ClientError("munge_error", "munge_ctx_create: out of memory")
    try:
        if where:
            # munge_ctx_set(ctx, MUNGE_OPT_SOCKET, const char *): variadic.
            lib.munge_ctx_set(ctypes.c_void_p(ctx), ctypes.c_int(8), ctypes.c_char_p(where.encode()))
        cred = ctypes.c_void_p()
        err = lib.munge_encode(ctypes.byref(cred), ctx, payload, len(payload))
        why = (lib.munge_ctx_strerror(ctx) or lib.munge_strerror(err) or b"").decode(errors="replace")
        if err != 0 or not cred.value:
            shown = where or "the default socket /run/munge/munge.socket.2"
            hint = (f" (munged is not running here, or not at {shown}: start munge.service, "
                    "or set QRT_MUNGE_SOCKET)") if err == 6 else ""
            raise ClientError("munge_error", f"cannot get a MUNGE credential from munged at "
                              f"{shown}: {why}{hint}")
        try:
            return ctypes.string_at(cred.value).decode()
        finally:
            libc.free(cred)
    finally:
        lib.munge_ctx_destroy(ctx)


def _split_tcp(path: str) -> tuple[str, int]:
    rest = path[len("tcp://"):]
    if rest.startswith("["):
        host, sep, port = rest[1:].partition("]:")
    else:
        host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ClientError("client_error", f"'{path}' is not tcp://HOST:PORT "
                          "(an IPv6 address goes in brackets: tcp://[::1]:7470)")
    return host, int(port)



class Client:
    """One connection to the agent.

    path: the socket (default $QRT_SOCKET, else /run/qrtd/qrtd.sock), or
    tcp://HOST:PORT for an agent's MUNGE-authenticated network listener.
    timeout: seconds for connecting and for each call's reply.
    munge_socket: tcp:// only, munged's socket here (default
    $QRT_MUNGE_SOCKET, else libmunge's).
    """

    MAX_LINE = 64 << 20

    def __init__(self, path: str | None = None, timeout: float = 5.0,
                 connect_timeout: float = 2.0, munge_socket: str | None = None) -> None:
        self.path = path or os.environ.get("QRT_SOCKET") or DEFAULT_SOCKET
        self.timeout = timeout
        self._next_id = 1
        self._buf = bytearray()
        self._replies: dict[Any, dict[str, Any]] = {}
        self._events: collections.deque[dict[str, Any]] = collections.deque()
        self.authenticated_as: dict[str, Any] | None = None
        if self.path.startswith("tcp://"):
            self._open_tcp(connect_timeout, munge_socket)
            return
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(connect_timeout)
        try:
            self._sock.connect(self.path)
        except OSError as e:
            self._sock.close()
            hint = ""
            if isinstance(e, (FileNotFoundError, ConnectionRefusedError)):
                hint = " (is qrtd running?)"
            elif isinstance(e, PermissionError):
                hint = " (is this user in the socket's group?)"
            reason = "timeout" if isinstance(e, socket.timeout) else "unreachable"
            raise ClientError(reason, f"cannot connect to {self.path}: "
                              f"{e.strerror or e}{hint}", e.errno or 0) from None
        self._sock.settimeout(None)

    def _open_tcp(self, connect_timeout: float, munge_socket: str | None) -> None:
        # A refusal for the agent's pool of connections not yet authenticated
        # (its cap per host, or in all) passes within milliseconds: many
        # clients of one node connecting at once meet it.  Tried again, with
        # a growing pause, until connect_timeout.
        deadline = time.monotonic() + connect_timeout
        pause = 0.002
        while True:
            try:
                self._open_tcp_once(max(deadline - time.monotonic(), 0.001), munge_socket)
                return
            except RpcError as e:
                cause = e.data.get("cause", "") if isinstance(e.data, dict) else ""
                wait = pause + random.uniform(0, pause)
                if (e.reason != "overloaded"
                        or cause not in ("unauthenticated_per_host", "unauthenticated_connections")
                        or time.monotonic() + wait >= deadline):
                    raise
                time.sleep(wait)
                pause = min(pause * 2, 0.1)

    def _open_tcp_once(self, connect_timeout: float, munge_socket: str | None) -> None:
        host, port = _split_tcp(self.path)
        try:
            self._sock = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as e:
            hint = " (is qrtd running there with rpc.listen set?)" \
                if isinstance(e, ConnectionRefusedError) else ""
            reason = "timeout" if isinstance(e, socket.timeout) else "unreachable"
            raise ClientError(reason, f"cannot connect to {self.path}: "
                              f"{e.strerror or e}{hint}", e.errno or 0) from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._authenticate(connect_timeout, munge_socket)
        except BaseException:
            self.close()
            raise

    def _authenticate(self, timeout: float, munge_socket: str | None) -> None:
        deadline = time.monotonic() + timeout
        line = self._read_line(deadline)
        if line is None:
            raise ClientError("timeout", f"{self.path}: no auth.challenge within {timeout}s "
                              "(is this qrtd's network listener?)")
        try:
            first = json.loads(line)
        except ValueError:
            first = None
        if isinstance(first, dict) and "error" in first:
            _result_of(first, self.path)  # a refusal at accept (a connection cap): raises
        params = first.get("params") if isinstance(first, dict) else None
        if not isinstance(params, dict):
            params = {}
        nonce = params.get("nonce")
        if (not isinstance(first, dict) or first.get("method") != "auth.challenge"
                or params.get("mechanism") != "munge" or not isinstance(nonce, str) or not nonce
                or len(nonce) > 128 or any(ch not in "0123456789abcdef" for ch in nonce)):
            raise ClientError("protocol_error", f"{self.path}: the first line is not a MUNGE "
                              f"auth.challenge: {line[:160]!r}")
        version = params.get("payload_version", "")
        if version != AUTH_PAYLOAD_VERSION:
            shown = version or "qrtd-auth-v1, which binds no address"
            raise ClientError("protocol_error", f"{self.path}: the agent's challenge asks for a "
                              f"credential of {shown}, not {AUTH_PAYLOAD_VERSION}: upgrade qrtd there")
        payload = f"{AUTH_PAYLOAD_VERSION} {nonce} {tcp_address_text(self._sock.getpeername())}"
        cred = munge_encode(payload.encode(), munge_socket)
        try:
            self.authenticated_as = self.call("auth.munge", {"credential": cred})
        except RpcError as e:
            cause = e.data.get("cause", "") if isinstance(e.data, dict) else ""
            hint = ""
            if cause in ("expired", "rewound"):
                hint = (f" -- the clocks of this host and {self.path}'s host disagree: check "
                        "that both keep time (chrony, ntpd, systemd-timesyncd)")
            elif cause == "invalid":
                hint = " -- this host's munge key is not the agent's"
            elif cause == "munge_unavailable":
                hint = " -- munged is not running on the agent's host"
            elif cause == "address_mismatch":
                hint = (f" -- {self.path} is not the qrtd that answered: dial qrtd's own address "
                        "(rpc.listen), or name the translated one in its rpc.listen_aliases")
            raise RpcError(e.code, e.reason, f"{self.path} refused the MUNGE credential: "
                           f"{e.message}{hint}", e.data) from None

    # ------------------------------------------------------------ plumbing

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None  # type: ignore[assignment]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        return self._sock.fileno()

    def _send(self, obj: Any) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        self._sock.settimeout(self.timeout)
        try:
            self._sock.sendall(data)
        except TimeoutError:
            raise ClientError("timeout", f"the agent at {self.path} did not read "
                              f"the request within {self.timeout}s") from None
        except OSError as e:
            raise ClientError("disconnected", f"send to {self.path}: {e}", e.errno or 0) from None

    def _read_line(self, deadline: float | None) -> bytes | None:
        """The next line (without newline), or None when the deadline passed."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[:nl + 1]
                return line.rstrip(b"\r")
            if len(self._buf) > self.MAX_LINE:
                raise ClientError("protocol_error", f"reply line from {self.path} "
                                  f"exceeds {self.MAX_LINE} bytes")
            if deadline is None:
                self._sock.settimeout(None)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(65536)
            except TimeoutError:
                return None
            except OSError as e:
                raise ClientError("disconnected", f"recv from {self.path}: {e}",
                                  e.errno or 0) from None
            if not chunk:
                raise ClientError("disconnected",
                                  f"the agent at {self.path} closed the connection")
            self._buf += chunk

    def _route(self, line: bytes) -> None:
        try:
            obj = json.loads(line)
        except ValueError:
            raise ClientError("protocol_error", f"reply from {self.path} is not JSON: "
                              f"{line[:120]!r}") from None
        items = obj if isinstance(obj, list) else [obj]
        for item in items:
            if not isinstance(item, dict):
                raise ClientError("protocol_error", "reply is not a JSON object")
            if "id" not in item:
                if "method" in item:
                    self._events.append(item)
                    continue
                raise ClientError("protocol_error", f"reply has no id: {line[:120]!r}")
            self._replies[item["id"]] = item

    def _wait(self, req_id: Any, method: str) -> Any:
        deadline = time.monotonic() + self.timeout
        while req_id not in self._replies and None not in self._replies:
            line = self._read_line(deadline)
            if line is None:
                raise ClientError("timeout", f"{method}: no reply from {self.path} "
                                  f"within {self.timeout}s")
            self._route(line)
        reply = self._replies.pop(req_id if req_id in self._replies else None)
        return _result_of(reply, method)

    # ---------------------------------------------------------------- calls

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Call one method and return its result; raise RpcError on error."""
        req_id = self._next_id
        self._next_id += 1
        req: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            req["params"] = params
        self._send(req)
        return self._wait(req_id, method)

    def call_many(self, calls: list[tuple[str, dict[str, Any] | None]]) -> list[Any]:
        """Pipeline several (method, params) calls: every request is written
        before the first reply is read.  Returns each result or, in its
        place, the RpcError instance."""
        ids: list[tuple[int, str]] = []
        for method, params in calls:
            req_id = self._next_id
            self._next_id += 1
            req: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
            if params is not None:
                req["params"] = params
            ids.append((req_id, method))
            self._send(req)
        out: list[Any] = []
        for req_id, method in ids:
            try:
                out.append(self._wait(req_id, method))
            except RpcError as e:
                out.append(e)
        return out

    # -------------------------------------------------------- typed helpers

    def hello(self, client: str = "qrt_client.py") -> dict[str, Any]:
        return self.call("agent.hello", {"client": client})

    def status(self) -> dict[str, Any]:
        return self.call("agent.status", {})

    def qpus(self) -> list[dict[str, Any]]:
        return self.call("qpus.list", {})["qpus"]

    def calibration_get(self, qpu: str, until_ns: int | None = None) -> list[dict[str, Any]]:
        """The QPU's windows ending after now; with until_ns only those
        starting before it and the first starting at or after it."""
        p: dict[str, Any] = {"qpu": qpu}
        if until_ns is not None:
            p["until_ns"] = int(until_ns)
        return self.call("calibration.get", p)["windows"]

    def calibration_update(self, qpu: str, windows: list[dict[str, Any]],
                           block_id: int | None = None) -> dict[str, Any]:
        """Replace a QPU's windows from now on; with block_id, also close
        that calibration block (completed; the answer carries "block")."""
        p: dict[str, Any] = {"qpu": qpu, "windows": windows}
        if block_id is not None:
            p["block_id"] = int(block_id)
        return self.call("calibration.update", p)

    # ------------------------------------------------- calibration blocks

    def calibration_request(self, qpu: str, step: str, duration_ns: int, needed_by_ns: int,
                            idempotency_key: str, urgency: int = 0) -> dict[str, Any]:
        """Ask for a calibration block (qrtd(8), CALIBRATION BLOCKS): the
        block (block_id, state "scheduled" or "yielding", start_ns, end_ns,
        predicted_fidelity_at_needed_by, ...).  When needed_by cannot be
        met, RpcError reason "no_fit" whose data holds "earliest" (the
        earliest block, or None) and "predicted_fidelity_at_needed_by"."""
        return self.call("calibration.request", {
            "qpu": qpu, "step": step, "duration_ns": int(duration_ns),
            "needed_by_ns": int(needed_by_ns), "urgency": int(urgency),
            "idempotency_key": idempotency_key})

    def calibration_cancel(self, block_id: int) -> dict[str, Any]:
        """Give a live calibration block back (state "cancelled")."""
        return self.call("calibration.cancel", {"block_id": int(block_id)})

    def calibration_blocks(self, qpu: str | None = None) -> list[dict[str, Any]]:
        """The calibration blocks qrtd holds (of one QPU), by start."""
        return self.call("calibration.blocks", {"qpu": qpu} if qpu else {})["blocks"]

    @staticmethod
    def _request(duration_ns: int, qpus: list[str] | None, not_before_ns: int | None,
                 deadline_ns: int | None, priority: int | None,
                 min_fidelity: float | None) -> dict[str, Any]:
        p: dict[str, Any] = {"duration_ns": int(duration_ns)}
        if qpus:
            p["qpus"] = list(qpus)
        if not_before_ns is not None:
            p["not_before_ns"] = int(not_before_ns)
        if deadline_ns is not None:
            p["deadline_ns"] = int(deadline_ns)
        if priority is not None:
            p["priority"] = int(priority)
        if min_fidelity is not None:
            p["min_fidelity"] = float(min_fidelity)
        return p

    def slots_query(self, duration_ns: int, qpus: list[str] | None = None,
                    not_before_ns: int | None = None, deadline_ns: int | None = None,
                    priority: int | None = None, min_fidelity: float | None = None,
                    max_candidates: int | None = None,
                    gang_size: int | None = None) -> dict[str, Any]:
        """{"candidates": [...]} and, when none fits, "why_none" and
        "next_window".  With gang_size k > 1 the candidates are the k
        members of the gang slots_reserve(gang_size=k) would take now."""
        p = self._request(duration_ns, qpus, not_before_ns, deadline_ns, priority, min_fidelity)
        if max_candidates is not None:
            p["max_candidates"] = int(max_candidates)
        if gang_size is not None:
            p["gang_size"] = int(gang_size)
        return self.call("slots.query", p)

    def slots_reserve(self, duration_ns: int, idempotency_key: str,
                      qpus: list[str] | None = None, not_before_ns: int | None = None,
                      deadline_ns: int | None = None, priority: int | None = None,
                      min_fidelity: float | None = None, lease_ns: int | None = None,
                      gang_size: int | None = None,
                      block_id: int | None = None) -> dict[str, Any]:
        """A held reservation (reservation_id, fencing_token, start_ns, ...).
        The same idempotency_key returns the same reservation.  block_id:
        inside that calibration block (the block's tenant, calibration
        role)."""
        p = self._request(duration_ns, qpus, not_before_ns, deadline_ns, priority, min_fidelity)
        p["idempotency_key"] = idempotency_key
        if lease_ns is not None:
            p["lease_ns"] = int(lease_ns)
        if gang_size is not None:
            p["gang_size"] = int(gang_size)
        if block_id is not None:
            p["block_id"] = int(block_id)
        return self.call("slots.reserve", p)

    def slots_heartbeat(self, reservation_id: int, fencing_token: int) -> dict[str, Any]:
        return self.call("slots.heartbeat", {"reservation_id": reservation_id,
                                             "fencing_token": fencing_token})

    def slots_release(self, reservation_id: int, fencing_token: int) -> dict[str, Any]:
        return self.call("slots.release", {"reservation_id": reservation_id,
                                           "fencing_token": fencing_token})

    def jobs_submit(self, payload: bytes | str, reservation_id: int | None = None,
                    fencing_token: int | None = None, duration_ns: int | None = None,
                    idempotency_key: str | None = None,
                    qpus: list[str] | None = None, not_before_ns: int | None = None,
                    deadline_ns: int | None = None, priority: int | None = None,
                    min_fidelity: float | None = None,
                    block_id: int | None = None) -> dict[str, Any]:
        """Commit payload into a held reservation (reservation_id +
        fencing_token), or place and commit in one step (duration_ns +
        idempotency_key + request fields; block_id: inside that calibration
        block, for the block's own calibration service)."""
        if isinstance(payload, str):
            payload = payload.encode()
        encoded = base64.b64encode(bytes(payload)).decode("ascii")
        if reservation_id is not None:
            if fencing_token is None:
                raise ValueError("jobs_submit: reservation_id needs fencing_token")
            return self.call("jobs.submit", {"reservation_id": reservation_id,
                                             "fencing_token": fencing_token,
                                             "payload": encoded})
        if duration_ns is None or not idempotency_key:
            raise ValueError("jobs_submit: give reservation_id + fencing_token, or "
                             "duration_ns + idempotency_key")
        p = self._request(duration_ns, qpus, not_before_ns, deadline_ns, priority, min_fidelity)
        p["idempotency_key"] = idempotency_key
        p["payload"] = encoded
        if block_id is not None:
            p["block_id"] = int(block_id)
        return self.call("jobs.submit", p)

    def jobs_status(self, job_id: int) -> dict[str, Any]:
        return self.call("jobs.status", {"job_id": job_id})

    def jobs_result(self, job_id: int) -> dict[str, Any]:
        """The result record; "result" is decoded to bytes."""
        r = self.call("jobs.result", {"job_id": job_id})
        r["result"] = base64.b64decode(r.get("result", ""), validate=True)
        return r

    def jobs_cancel(self, job_id: int, fencing_token: int | None = None) -> dict[str, Any]:
        """Cancel a committed job.  With fencing_token, a token that is not
        the job's is refused (bad_fencing_token)."""
        p: dict[str, Any] = {"job_id": job_id}
        if fencing_token is not None:
            p["fencing_token"] = fencing_token
        return self.call("jobs.cancel", p)

    def telemetry(self, prefix: str | None = None) -> dict[str, Any]:
        return self.call("telemetry.snapshot", {"prefix": prefix} if prefix else {})

    def metrics(self) -> str:
        return self.call("metrics", {})["text"]

    # --------------------------------------------------------------- events

    def subscribe(self, topics: list[str] | None = None) -> dict[str, Any]:
        """Start events on this connection (all types when topics is None)."""
        return self.call("events.subscribe", {"topics": list(topics)} if topics else {})

    def next_event(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next event's params ({"seq", "type", "data"}), or None when
        none came within timeout seconds (None: wait forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._events:
            line = self._read_line(deadline)
            if line is None:
                return None
            self._route(line)
        note = self._events.popleft()
        if note.get("method") == "events.event":
            return note.get("params")
        return note

    def events(self, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Iterate over events; stops when none comes within timeout seconds
        (None: never stops)."""
        while True:
            ev = self.next_event(timeout)
            if ev is None:
                return
            yield ev


class YieldRequest:
    """A reservation.yield_requested event, read: qrtd asks the holder of a
    held reservation to give its time to a calibration block by deadline_ns
    (qrtd(8), CALIBRATION BLOCKS).  Release it, or move: reserve again at
    or after free_start_ns (0: no free start known) and release it.
    at_deadline says what happens otherwise: "revoke" (the reservation is
    displaced, its fencing token dead) or "keep"."""

    def __init__(self, data: dict[str, Any]) -> None:
        block = data.get("block") or {}
        self.reservation_id: int = int(data["reservation_id"])
        self.qpu: str = str(data.get("qpu", ""))
        self.start_ns: int = int(data.get("start_ns", 0))
        self.deadline_ns: int = int(data["deadline_ns"])
        self.free_start_ns: int = int(data.get("free_start_ns", 0))
        self.at_deadline: str = str(data.get("at_deadline", "keep"))
        self.reason: str = str(data.get("reason", ""))
        self.block: dict[str, Any] = dict(block)
        self.block_id: int = int(block.get("block_id", 0))
        self.block_start_ns: int = int(block.get("start_ns", 0))
        self.block_end_ns: int = int(block.get("end_ns", 0))
        self.step: str = str(block.get("step", ""))

    def __repr__(self) -> str:
        return (f"YieldRequest(reservation_id={self.reservation_id}, qpu={self.qpu!r}, "
                f"block_id={self.block_id}, deadline_ns={self.deadline_ns}, "
                f"free_start_ns={self.free_start_ns}, at_deadline={self.at_deadline!r})")


_YIELD_EVENT = "reservation.yield_requested"
assert _YIELD_EVENT in _protocol.EVENTS


def yield_request(event: dict[str, Any]) -> YieldRequest | None:
    """The YieldRequest an event (Client.next_event's {"seq", "type",
    "data"}) carries, or None for any other event."""
    if not isinstance(event, dict) or event.get("type") != _YIELD_EVENT:
        return None
    return YieldRequest(event.get("data") or {})


def _slot_span(reservation: dict[str, Any]) -> tuple[int, int]:
    """(start_ns, end_ns) of a slots.reserve result (a gang: its first member)."""
    m = reservation["gang"][0] if "gang" in reservation else reservation
    return (int(m["start_ns"]), int(m["end_ns"]))


class Placement:
    """What place_best did: chosen (index), reservation (the winner's
    slots.reserve result), errors (per agent: None, or the QrtError its
    reserve failed with) and release_errors (per agent)."""

    def __init__(self, n: int) -> None:
        self.chosen: int | None = None
        self.reservation: dict[str, Any] | None = None
        self.errors: list[QrtError | None] = [None] * n
        self.release_errors: list[QrtError | None] = [None] * n


def place_best(agents: list[Client], duration_ns: int, idempotency_key: str,
               **request: Any) -> Placement:
    """Multi-agent placement (power-of-d, qrt-fleet-sim's limited-sharing
    structure): ask every agent at once to hold a slot for one request under
    one idempotency key, keep the hold that starts first (then ends first,
    then comes first in agents), release the others.  request: the
    keyword arguments of Client.slots_reserve (qpus, not_before_ns,
    deadline_ns, priority, min_fidelity, lease_ns, gang_size).

    Raises the first agent's RpcError (e.g. reason "no_fit"), else the first
    ClientError, when no agent holds a slot.  A failed release is recorded
    in release_errors, not raised: the loser's lease runs out by itself.
    Retrying with the same key is safe: each agent returns the same hold."""
    if not 1 <= len(agents) <= 16:
        raise ClientError("client_error", f"place_best: 1..16 agents, got {len(agents)}")
    if not idempotency_key:
        raise ClientError("client_error", "place_best: idempotency_key is required")
    lease_ns = request.pop("lease_ns", None)
    gang_size = request.pop("gang_size", None)
    params = Client._request(duration_ns, request.pop("qpus", None),
                             request.pop("not_before_ns", None), request.pop("deadline_ns", None),
                             request.pop("priority", None), request.pop("min_fidelity", None))
    if request:
        raise ClientError("client_error", f"place_best: unknown arguments {sorted(request)}")
    params["idempotency_key"] = idempotency_key
    if lease_ns is not None:
        params["lease_ns"] = int(lease_ns)
    if gang_size is not None:
        params["gang_size"] = int(gang_size)
    out = Placement(len(agents))
    held: list[dict[str, Any] | None] = [None] * len(agents)
    ids: list[int | None] = [None] * len(agents)
    # Every request out first, then the replies: about one round trip.
    for i, a in enumerate(agents):
        sent_id = a._next_id
        a._next_id += 1
        try:
            a._send({"jsonrpc": "2.0", "id": sent_id, "method": "slots.reserve",
                     "params": params})
            ids[i] = sent_id
        except QrtError as e:
            out.errors[i] = e
    for i, a in enumerate(agents):
        req_id = ids[i]
        if req_id is None:
            continue
        try:
            h = a._wait(req_id, "slots.reserve")
            _slot_span(h)
            held[i] = h
            # A retried key returns what it got the first time, in its
            # current state: a released or expired hold holds nothing.
            state = (h["gang"][0] if "gang" in h else h).get("state")
            if state not in ("held", "committed", "dispatched", "completed", "sent"):
                out.errors[i] = ClientError("not_held", "this idempotency key's "
                                            f"reservation is {state}")
                held[i] = None
        except QrtError as e:
            out.errors[i] = e
            held[i] = None
        except (KeyError, TypeError, ValueError, IndexError):
            out.errors[i] = ClientError("protocol_error",
                                        "slots.reserve reply has no start_ns/end_ns")
            held[i] = None
    best: tuple[int, int] | None = None
    for i, h in enumerate(held):
        if h is not None and (best is None or _slot_span(h) < best):
            out.chosen, best = i, _slot_span(h)
    if out.chosen is None:
        remote = [e for e in out.errors if isinstance(e, RpcError)]
        raise remote[0] if remote else next(e for e in out.errors if e is not None)
    for i, h in enumerate(held):
        if h is None or i == out.chosen:
            continue
        m = h["gang"][0] if "gang" in h else h
        try:
            agents[i].slots_release(m["reservation_id"], m["fencing_token"])
        except QrtError as e:
            out.release_errors[i] = e
    out.reservation = held[out.chosen]
    return out


def _result_of(reply: dict[str, Any], method: str) -> Any:
    if "result" in reply:
        return reply["result"]
    err = reply.get("error")
    if not isinstance(err, dict):
        raise ClientError("protocol_error", f"{method}: reply has neither result nor error")
    code = err.get("code")
    if not isinstance(code, int):
        code = _protocol.CODE_INTERNAL_ERROR
    data = err.get("data")
    reason = data.get("reason") if isinstance(data, dict) else None
    if not isinstance(reason, str) or not reason:
        reason = _DEFAULT_REASON.get(code, "internal_error")
    raise RpcError(code, reason, str(err.get("message", "")), data, method)
