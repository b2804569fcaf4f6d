"""One connection from an agent, and the records of the jobs it brought."""

from __future__ import annotations

import socket
import threading

# What a connection is, once its HELLO is read.
NEW = "new"
V1 = "v1"            # one phase: JOB at T
CONTROL = "control"  # version 2: ARM, DISARM in; HELLO, ARMED, DISARMED, RESULT, ERROR out
FIRE = "fire"        # version 2: FIRE in, nothing out


class Conn:
    """A connected agent's socket.  send() may be called from any thread
    (one frame at a time, under the write lock); kill() makes the reader
    thread see the end.  A control connection knows its fire connection
    and its session."""

    def __init__(self, sock: socket.socket, peer: str, number: int) -> None:
        self.sock = sock
        self.peer = peer
        self.number = number
        self.kind = NEW
        self.version = 0
        self.session = ""
        self.identity = ""
        self.fire: Conn | None = None
        self.control: Conn | None = None
        self.alive = True
        self._wlock = threading.Lock()

    def send(self, data: bytes) -> bool:
        """Writes one frame whole (the socket's timeout bounds it); a
        failed or timed-out write kills the connection."""
        with self._wlock:
            if not self.alive:
                return False
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                self._kill_locked()
                return False

    def kill(self) -> None:
        with self._wlock:
            self._kill_locked()

    def _kill_locked(self) -> None:
        self.alive = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def __repr__(self) -> str:
        return f"connection {self.number} ({self.kind}{' ' + self.session[:8] if self.session else ''})"


class Job:
    """A job the endpoint holds: the header of its ARM (or JOB), which
    every answer echoes, and its times."""

    __slots__ = (
        "armed_ns",
        "arrival_ns",
        "call_pc",
        "conn",
        "done_pc",
        "duration_ns",
        "fire_arrival_ns",
        "fire_at_ns",
        "h",
        "job_id",
        "program_duration_ns",
        "recv_pc",
        "started_ns",
        "window_end_ns",
        "window_start_ns",
    )

    def __init__(self, conn: Conn, h: dict[str, int], arrival_ns: int) -> None:
        self.conn = conn
        self.h = h
        self.job_id = h["job_id"]
        self.fire_at_ns = h["scheduled_ns"]
        self.window_start_ns = h["window_start_ns"]
        self.window_end_ns = h["window_end_ns"]
        self.duration_ns = h["duration_ns"]
        self.arrival_ns = arrival_ns
        self.armed_ns = 0
        self.program_duration_ns = 0
        self.fire_arrival_ns = 0
        self.started_ns = 0
        self.recv_pc = 0
        self.call_pc = 0
        self.done_pc = 0
