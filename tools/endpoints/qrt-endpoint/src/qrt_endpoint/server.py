"""The endpoint: listeners, connections, the HELLO negotiation, the pairing
of control and fire connections, the readers, and the answers.

Threads: one accept thread per listener; one reader thread per connection
(at most Options.max_connections at once; one more is closed as it is
accepted); the worker (worker.py), which calls the handler.  A fire
connection's thread is the FIRE path: it sleeps in recv() on a blocking
socket, and when a FIRE's 128 bytes are in, it looks the job up, pops it
from the armed table and calls handler.fire() -- no allocation but the
header's unpacked integers, no lock, no queue before the call.

The negotiation (agent/proto/protocol.toml, [wire]): the agent's first
HELLO on a connection is version 1; one whose identity offers "wire=2"
(and a handler that is two-phase) makes it a control connection, answered
with a version-2 HELLO carrying the capabilities and a new session; a
connection whose first HELLO is version 2, {"channel": "fire", "session":
S}, is the fire connection of session S's control connection, answered with
a version-2 HELLO.  Any other first HELLO is answered with a version-1
HELLO, and the connection speaks version 1 (JOB in, RESULT or ERROR out).

A bad frame is answered with ERROR (status protocol or version, naming
what was wrong) and its connection dropped; on a fire connection the ERROR
goes to its control connection.  While the instruments are unreachable
(health() failed), every control connection is told so (ERROR, job_id 0,
status unreachable) and closed, and a new one is answered the same way,
so that the agent sees its endpoint down; once health() passes, HELLOs are
answered again.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from . import handler as H
from . import wire
from .conn import CONTROL, FIRE, V1, Conn, Job
from .listen import listen
from .stats import Counters, Ring
from .wire import FrameType, WireError, WireFlag

# The fields of a FIRE the fire path reads: magic .. scheduled_ns.
_FIRE_N = wire.FIELDS[2].index("scheduled_ns") + 1
_FIRE = struct.Struct("<" + wire.HEADERS[2].format.lstrip("<@=!>")[:_FIRE_N])
# The job fields every answer echoes (qrt::wire::header_for).
ECHO = ("job_id", "calibration_id", "scheduled_ns", "window_start_ns", "window_end_ns", "duration_ns", "shots",
        "tolerance_ns")
MAX_REASON = 4096


@dataclass
class Options:
    listen: list[str]
    socket_mode: int | None = None
    socket_group: int | None = None
    max_connections: int = 16
    queue: int = 64                  # tasks (ARM, DISARM, JOB) waiting for the worker
    max_deferred: int = 64           # ARMs waiting for the stack to have room
    hello_timeout_s: float = 10.0    # a connection's first frame
    frame_timeout_s: float = 10.0    # a frame, once begun
    send_timeout_s: float = 10.0     # one frame written to an agent
    health_interval_s: float = 2.0
    gc_tidy_interval_s: float = 5.0
    gc_guard_ns: int = 50_000_000    # no tidy when a held job fires within this
    verbose: bool = False
    samples: int = 100_000           # measurements kept (rings)


def _reason(text: str) -> bytes:
    b = text.encode("utf-8", "replace")
    return b if len(b) <= MAX_REASON else b[:MAX_REASON].decode("utf-8", "ignore").encode()


class Endpoint:
    def __init__(self, handler: H.Handler, name: str, version: str, opt: Options) -> None:
        from .worker import Worker  # worker imports this module's names for typing only

        self.handler = handler
        self.name = name
        self.identity = f"{name} {version}"
        self.opt = opt
        caps = dict(handler.capabilities())
        caps["identity"] = self.identity
        self.caps = caps
        self.two_phase = bool(caps.get("two_phase", False))
        if self.two_phase:
            wire.capabilities_json(dict(caps, session="0" * 32))   # checked once, at start
        self.counters = Counters("connections", "jobs", "arms", "armed", "fires", "disarms", "results",
                                 "errors_sent", "refused", "out_of_window", "late", "calibration_mismatch",
                                 "protocol_errors", "busy", "not_armed", "run_failed", "unreachable")
        self.lateness = Ring(opt.samples)       # JOB or FIRE arrival - scheduled_ns
        self.fire_to_call = Ring(opt.samples)   # FIRE read -> handler.fire() called (perf_counter ns)
        self.fire_call = Ring(opt.samples)      # handler.fire() itself
        self.stopped = threading.Event()
        self.down: str | None = None
        self._lock = threading.Lock()
        self._conns: dict[int, Conn] = {}
        self._sessions: dict[str, Conn] = {}
        self._listeners: list[socket.socket] = []
        self._paths: list[str] = []
        self._slots = threading.BoundedSemaphore(opt.max_connections)
        self._next_conn = 0
        self._answered = 0
        self.max_jobs = 0
        self.worker = Worker(self)

    # ------------------------------------------------------------ logging

    def log(self, what: str) -> None:
        if self.opt.verbose:
            print(f"{self.name}: {what}", file=sys.stderr, flush=True)

    def log_always(self, what: str) -> None:
        print(f"{self.name}: {what}", file=sys.stderr, flush=True)

    def count(self, name: str, n: int = 1) -> None:
        self.counters.add(name, n)

    # ------------------------------------------------------------ life

    def open(self) -> None:
        """Binds every --listen address (OSError, ValueError naming it)."""
        for uri in self.opt.listen:
            try:
                s, path = listen(uri, self.opt.socket_mode, self.opt.socket_group)
            except (OSError, ValueError) as e:
                self.close()
                raise type(e)(f"{uri}: {e}") from None
            self._listeners.append(s)
            self._paths.append(path)
            self.log_always(f"listening on {uri}")

    def start(self) -> None:
        threading.Thread(target=self.worker.run, name="qrt-endpoint-worker", daemon=True).start()
        for ls in self._listeners:
            threading.Thread(target=self._accept, args=(ls,), name="qrt-endpoint-accept", daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()

    def close(self) -> None:
        self.stopped.set()
        for ls in self._listeners:
            ls.close()
        self._listeners = []
        with self._lock:
            conns = list(self._conns.values())
        for c in conns:
            c.kill()
        self.worker.stop()
        for p in self._paths:
            try:
                os.unlink(p)
            except OSError:
                pass
        self._paths = []

    def run(self, duration_s: float = 0.0) -> None:
        """Serves until stop(), or duration_s (0: no limit)."""
        end = time.monotonic() + duration_s if duration_s > 0 else None
        while not self.stopped.is_set():
            left = 0.5 if end is None else min(0.5, end - time.monotonic())
            if left <= 0:
                break
            self.stopped.wait(left)
        self.close()

    def summary(self) -> dict[str, Any]:
        c: dict[str, Any] = dict(self.counters.snapshot())
        c.update(tool=self.name, arrival_lateness_ns=self.lateness.summary(),
                 fire_read_to_handler_ns=self.fire_to_call.summary(), fire_handler_ns=self.fire_call.summary(),
                 gc=self.worker.gc.summary())
        more = getattr(self.handler, "summary", None)
        if callable(more):
            c.update(more())
        return c

    # ------------------------------------------------------------ accept and HELLO

    def _accept(self, ls: socket.socket) -> None:
        ls.settimeout(0.5)
        while not self.stopped.is_set():
            try:
                sock, addr = ls.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                self.log_always(f"refusing a connection: {self.opt.max_connections} already open")
                sock.close()
                continue
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._next_conn += 1
                conn = Conn(sock, str(addr or "unix"), self._next_conn)
                self._conns[conn.number] = conn
            self.count("connections")
            threading.Thread(target=self._serve, args=(conn,), name=f"qrt-endpoint-conn{conn.number}",
                             daemon=True).start()

    def _serve(self, conn: Conn) -> None:
        try:
            conn.sock.settimeout(self.opt.send_timeout_s)
            reader = wire.Reader(conn.sock, self.opt.frame_timeout_s)
            give_up = time.monotonic() + self.opt.hello_timeout_s
            first = None
            while first is None:
                first = reader.next(None)
                if first is None and (time.monotonic() > give_up or self.stopped.is_set()):
                    self.log(f"{conn}: no HELLO within {self.opt.hello_timeout_s:g} s")
                    return
            h, payload, _ = first
            if h["type"] != FrameType.HELLO:
                self.count("protocol_errors")
                self._send_error(conn, h["version"] if h["version"] in wire.HEADERS else 1, {}, WireError.PROTOCOL,
                                 "protocol error: first frame must be HELLO")
                return
            if h["version"] == 1:
                if self._hello_v1(conn, payload):
                    self._control_loop(conn, reader)
            elif self._hello_fire(conn, payload):
                self._fire_loop(conn)
        except wire.BadFrame as e:
            self.count("protocol_errors")
            self._send_error(conn, conn.version or 1, {}, e.status, e.reason)
        except (wire.Closed, wire.Stalled, OSError) as e:
            if conn.alive and not isinstance(e, wire.Closed):
                self.log(f"{conn}: {type(e).__name__}: {e}")
        finally:
            self._drop(conn)

    def _hello_v1(self, conn: Conn, payload: bytes) -> bool:
        conn.identity = wire.hello_identity(payload)
        if self.down is not None:
            self._send_error(conn, 1, {}, WireError.UNREACHABLE, f"{self.name}: the instruments are unreachable: "
                             f"{self.down}")
            return False
        if self.two_phase and wire.offers_wire2(conn.identity):
            conn.kind, conn.version = CONTROL, 2
            conn.session = secrets.token_hex(16)
            body = wire.capabilities_json(dict(self.caps, session=conn.session))
            with self._lock:
                self._sessions[conn.session] = conn
            ok = conn.send(wire.encode(wire.header(2, FrameType.HELLO), body))
        else:
            conn.kind, conn.version = V1, 1
            ok = conn.send(wire.encode(wire.header(1, FrameType.HELLO), self.identity.encode()))
        self.log_always(f"{conn}: HELLO from {conn.identity!r}: wire version {conn.version}")
        return ok

    def _hello_fire(self, conn: Conn, payload: bytes) -> bool:
        try:
            msg = json.loads(payload)
        except ValueError:
            msg = None
        if not isinstance(msg, dict) or msg.get("channel") != "fire" or not isinstance(msg.get("session"), str):
            self.count("protocol_errors")
            self._send_error(conn, 2, {}, WireError.PROTOCOL, 'protocol error: a version-2 HELLO opening a '
                             'connection must be {"channel": "fire", "session": ...}')
            return False
        with self._lock:
            control = self._sessions.get(msg["session"])
            old = control.fire if control is not None else None
            if control is not None:
                conn.kind, conn.version, conn.session, conn.control = FIRE, 2, control.session, control
                control.fire = conn
        if control is None or not control.alive:
            self.count("protocol_errors")
            self._send_error(conn, 2, {}, WireError.PROTOCOL, f"protocol error: no control connection has session "
                             f"{str(msg['session'])[:64]!r}")
            return False
        if old is not None:
            old.kill()
        body = json.dumps({"channel": "fire", "session": conn.session}, separators=(",", ":")).encode()
        self.log(f"{conn}: fire connection of {control}")
        return conn.send(wire.encode(wire.header(2, FrameType.HELLO), body))

    def _drop(self, conn: Conn) -> None:
        conn.kill()
        try:
            conn.sock.close()
        except OSError:
            pass
        with self._lock:
            known = self._conns.pop(conn.number, None) is not None
            if conn.kind == CONTROL and self._sessions.get(conn.session) is conn:
                del self._sessions[conn.session]
            fire = conn.fire if conn.kind == CONTROL else None
            if conn.kind == FIRE and conn.control is not None and conn.control.fire is conn:
                conn.control.fire = None
        if fire is not None:
            fire.kill()
        if conn.kind in (CONTROL, V1):
            self.worker.post("drop", conn)
        if known:
            self._slots.release()

    # ------------------------------------------------------------ control connections

    def _control_loop(self, conn: Conn, reader: wire.Reader) -> None:
        version = conn.version
        while conn.alive and not self.stopped.is_set():
            f = reader.next(version)
            if f is None:
                continue
            h, payload, arrival = f
            t = h["type"]
            if t == FrameType.HELLO:
                continue
            if version == 1 and t == FrameType.JOB:
                self._accept_job(conn, h, payload, arrival)
            elif version == 2 and t == FrameType.ARM:
                self.count("jobs")
                self.count("arms")
                if not self.worker.submit(("arm", conn, h, payload, arrival)):
                    self.refuse(conn, h, H.ArmRefused(H.STAGE_ARM, H.TOO_MANY_ARMED,
                                                      f"{self.opt.queue} requests already wait for the stack"),
                                arrival)
            elif version == 2 and t == FrameType.DISARM:
                if not self.worker.submit(("disarm", conn, h, b"", arrival)):
                    self.count("busy")
                    self.answer_error(conn, h, WireError.BUSY, f"{self.opt.queue} requests already wait for the "
                                      "stack", "none", arrival)
            else:
                self.count("protocol_errors")
                self._send_error(conn, version, h, WireError.PROTOCOL, f"protocol error: unexpected frame type "
                                 f"{FrameType(t).name} on a {conn.kind} connection")
                return

    def _accept_job(self, conn: Conn, h: dict[str, int], payload: bytes, arrival: int) -> None:
        self.count("jobs")
        h["arrival_ns"] = arrival
        self.lateness.add(arrival - h["scheduled_ns"])
        if arrival < h["window_start_ns"] or arrival + h["duration_ns"] > h["window_end_ns"]:
            self.count("out_of_window")
            self.answer_error(conn, h, WireError.OUT_OF_WINDOW,
                              f"arrival {arrival} outside window [{h['window_start_ns']}, {h['window_end_ns']} "
                              f"- duration {h['duration_ns']}]", "none", arrival)
            return
        if not self.worker.submit(("job", conn, h, payload, arrival)):
            self.count("busy")
            self.answer_error(conn, h, WireError.BUSY, f"{self.opt.queue} jobs already wait to run", "none", arrival)

    # ------------------------------------------------------------ the FIRE path

    def _fire_loop(self, conn: Conn) -> None:
        control = conn.control
        assert control is not None
        sock = conn.sock
        sock.settimeout(None)       # blocking: one recv() a FIRE, no poll before it
        n = wire.HEADER_LEN[2]
        buf = bytearray(n)
        view = memoryview(buf)
        recv_into = sock.recv_into
        unpack = _FIRE.unpack_from
        now, pc = time.time_ns, time.perf_counter_ns
        armed, running, fire, post = self.worker.armed, self.worker.running, self.handler.fire, self.worker.post
        magic_ok, fire_type = wire.MAGIC, int(FrameType.FIRE)
        while True:
            got = recv_into(buf, n)
            t_pc = pc()
            arrival = now()
            if got == 0:
                return
            if got < n:
                self._fire_rest(sock, view, got, n)
            magic, version, type_, flags, hlen, status, plen, job_id, cal, sched = unpack(buf)
            if magic != magic_ok or version != 2 or type_ != fire_type or hlen != n or plen or status or flags:
                self._fire_bad(conn, control, buf)
                return
            job = armed.get(job_id)
            if (job is not None and job.conn is control and job.h["calibration_id"] == cal
                    and job.window_start_ns <= arrival and arrival + job.duration_ns <= job.window_end_ns):
                running[job_id] = job
                if armed.pop(job_id, None) is job:
                    t_call = pc()
                    try:
                        started = fire(job_id)
                    except Exception as e:  # the start failed: an ERROR for this job, never a crash
                        job.fire_arrival_ns = arrival
                        st = WireError.UNREACHABLE if isinstance(e, H.InstrumentUnreachable) else WireError.INTERNAL
                        post("fire_failed", (job, st, f"{self.name}: start failed: {type(e).__name__}: {e}"))
                        continue
                    job.done_pc = pc()
                    job.recv_pc, job.call_pc = t_pc, t_call
                    job.fire_arrival_ns, job.started_ns = arrival, started
                    post("collect", job)
                    continue
                running.pop(job_id, None)
            self._fire_refused(control, job_id, cal, sched, arrival, job)

    def _fire_rest(self, sock: socket.socket, view: memoryview, got: int, n: int) -> None:
        sock.settimeout(self.opt.frame_timeout_s)
        try:
            while got < n:
                k = sock.recv_into(view[got:], n - got)
                if k == 0:
                    raise wire.Closed(partial=True)
                got += k
        except socket.timeout:
            raise wire.Stalled("a FIRE began and did not complete") from None
        finally:
            sock.settimeout(None)

    def _fire_bad(self, conn: Conn, control: Conn, buf: bytearray) -> None:
        self.count("protocol_errors")
        magic, version, type_, flags, hlen, _status, plen = wire.PREFIX.unpack_from(buf)
        try:
            wire.check_prefix(magic, version, type_, flags, hlen, plen, 2)
            why = (f"protocol error: {FrameType(type_).name} on the fire connection" if type_ != FrameType.FIRE
                   else "protocol error: a FIRE has a header only, status 0")
            st = int(WireError.PROTOCOL)
        except wire.BadFrame as e:
            why, st = e.reason, e.status
        self._send_error(control, 2, {}, st, f"fire connection: {why}")
        self.log(f"{conn}: {why}; dropped")

    def _fire_refused(self, control: Conn, job_id: int, cal: int, sched: int, arrival: int,
                      job: Job | None) -> None:
        h = dict.fromkeys(ECHO, 0)
        h.update(job_id=job_id, calibration_id=cal, scheduled_ns=sched)
        if job is None or job.conn is not control:
            self.count("not_armed")
            self.answer_error(control, h, WireError.NOT_ARMED, f"FIRE for job {job_id}, which is not armed here",
                              H.STAGE_FIRE, arrival)
            return
        if self.worker.armed.pop(job_id, None) is job:
            self.worker.post("abandon", job)   # never started: the handler disarms it
        if job.h["calibration_id"] != cal:
            self.count("calibration_mismatch")
            status, why = WireError.CALIBRATION, (f"FIRE names calibration {cal}; job {job_id} was armed with "
                                                  f"{job.h['calibration_id']}: not started")
        else:
            self.count("out_of_window")
            status, why = WireError.OUT_OF_WINDOW, (f"FIRE arrival {arrival} outside window "
                                                    f"[{job.window_start_ns}, {job.window_end_ns} - duration "
                                                    f"{job.duration_ns}]: not started")
        self.answer_error(control, job.h, status, why, H.STAGE_FIRE, arrival)

    def fire_path(self, job: Job) -> None:
        """Called by the worker as it collects a fired job: the FIRE path's
        measurements, off the path."""
        if job.recv_pc:
            self.fire_to_call.add(job.call_pc - job.recv_pc)
            self.fire_call.add(job.done_pc - job.call_pc)
            self.lateness.add(job.fire_arrival_ns - job.fire_at_ns)
            self.count("fires")

    # ------------------------------------------------------------ answers

    def answer(self, conn: Conn, type_: int, h: dict[str, int], payload: bytes, **extra: int) -> bool:
        out = wire.header(conn.version or 1, type_, **{k: h.get(k, 0) for k in ECHO})
        out["sent_ns"] = time.time_ns()
        for k, v in extra.items():
            if k in out:
                out[k] = v
        return conn.send(wire.encode(out, payload))

    def _send_error(self, conn: Conn, version: int, h: dict[str, int], status: int, why: str, stage: str = "",
                    arrival: int = 0) -> None:
        out = wire.header(version, FrameType.ERROR, **{k: h.get(k, 0) for k in ECHO})
        out.update(status=int(status), sent_ns=time.time_ns(), arrival_ns=arrival)
        if version >= 2:
            out["stage"] = H.stage_code(stage)
        if conn.send(wire.encode(out, _reason(why))):
            self.count("errors_sent")
        if h.get("job_id"):
            self.log(f"job {h['job_id']}: ERROR {WireError(status).name.lower()}"
                     f"{' at ' + stage if stage and stage != 'none' else ''}: {why}")
            self._job_answered()

    def answer_error(self, conn: Conn, h: dict[str, int], status: int, why: str, stage: str,
                     arrival: int = 0) -> None:
        """ERROR for a job: a version-1 peer gets the statuses version 1 had
        (a refusal of its program is `internal` there, as qpu-aer always
        answered)."""
        if conn.version < 2 and status > WireError.INTERNAL:
            status = WireError.INTERNAL
        if status == WireError.CALIBRATION:
            self.count("calibration_mismatch")
        if status == WireError.UNREACHABLE:
            self.count("unreachable")
        self._send_error(conn, conn.version or 1, h, status, why, stage, arrival)

    def refuse(self, conn: Conn, h: dict[str, int], e: H.ArmRefused, arrival: int) -> None:
        self.count("refused")
        status = H.REASON_STATUS.get(e.reason, WireError.PROGRAM_REFUSED)
        self.answer_error(conn, h, status, f"{e.reason}: {e.detail}", e.stage, arrival)

    def answer_result(self, job: Job, r: H.Result) -> None:
        conn, h = job.conn, job.h
        arrival = job.fire_arrival_ns
        started = r.started_ns or job.started_ns
        ended = r.ended_ns or time.time_ns()
        flags = 0
        if h["tolerance_ns"] > 0 and arrival - h["scheduled_ns"] > h["tolerance_ns"]:
            flags |= WireFlag.LATE
            self.count("late")
        body = b""
        if not h["flags"] & WireFlag.NO_RESULT_DATA:
            d: dict[str, Any] = {"format": r.payload.get("format"), "endpoint": self.identity,
                                 "job_id": job.job_id, "calibration_id": h["calibration_id"],
                                 "scheduled_ns": h["scheduled_ns"], "arrival_ns": arrival}
            if conn.version >= 2:
                d.update(armed_ns=job.armed_ns, started_ns=started, ended_ns=ended)
            d.update((k, v) for k, v in r.payload.items() if k != "format")
            if r.status:
                d["status"] = r.status
            body = json.dumps(d, separators=(",", ":"), default=str).encode()
        if len(body) > wire.MAX_PAYLOAD:
            self.answer_error(conn, h, WireError.INTERNAL, f"the result is {len(body)} bytes, more than the wire's "
                              f"{wire.MAX_PAYLOAD}: ask fewer shots or no memory", H.STAGE_RUN, arrival)
            return
        if self.answer(conn, FrameType.RESULT, h, body, flags=flags, arrival_ns=arrival, armed_ns=job.armed_ns,
                       started_ns=started, ended_ns=ended):
            self.count("results")
        self.log(f"job {job.job_id}: RESULT (started {started - h['scheduled_ns']:+d} ns from fire_at)")
        self._job_answered()

    def _job_answered(self) -> None:
        with self._lock:
            self._answered += 1
            done = self.max_jobs and self._answered >= self.max_jobs
        if done:
            self.stop()

    # ------------------------------------------------------------ the instruments' state

    def set_down(self, why: str) -> None:
        first = self.down is None
        self.down = why
        if first:
            self.log_always(f"the instruments are unreachable: {why}")
        with self._lock:
            conns = [c for c in self._conns.values() if c.kind in (CONTROL, V1)]
        for c in conns:
            if c.kind == CONTROL:
                self._send_error(c, 2, {}, WireError.UNREACHABLE, f"{self.name}: the instruments are unreachable: "
                                 f"{why}", "none")
            c.kill()

    def set_up(self) -> None:
        if self.down is not None:
            self.log_always(f"the instruments answer again (were: {self.down})")
            self.down = None
