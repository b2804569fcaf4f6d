"""The endpoint's side of the simulator processes (simulator.py): the one
that takes requests, and a spare, started and warmed up beforehand, that
takes over at once when the current one is killed (a request past its time
bound) or dies.  Requests go one at a time, from the endpoint's worker
thread; each waits at most its bound."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
from typing import Any

from .simulator import recv_msg, send_msg

START_S = 300   # for a simulator process to import qiskit and warm up


def _pythonpath() -> str:
    """The directories this process imported qpu_aer, qrt_endpoint and
    qrt_client (and qpu_aer_drift, when loaded) from, for the simulator
    process to import the same."""
    import qrt_client
    import qrt_endpoint

    from . import __file__ as mine
    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(f)))
            for f in (mine, qrt_endpoint.__file__, qrt_client.__file__) if f]
    drift = sys.modules.get("qpu_aer_drift")
    if drift is not None and drift.__file__:
        dirs.append(os.path.dirname(os.path.abspath(drift.__file__)))
    old = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(dict.fromkeys([*dirs, *([old] if old else [])]))


class Process:
    """One simulator process and the endpoint's end of its socketpair."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        mine, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen([*argv, "--fd", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
                                         cwd="/")
        finally:
            theirs.close()
        self.sock = mine

    def wait_ready(self, timeout_s: float) -> None:
        """Returns once the process has warmed up; RuntimeError naming why it did not."""
        self.sock.settimeout(timeout_s)
        try:
            msg = recv_msg(self.sock)
        except socket.timeout:
            self.kill()
            raise RuntimeError(f"the simulator process did not start within {timeout_s:.0f} s") from None
        reply = json.loads(msg) if msg else {}
        if "ready" not in reply:
            self.kill()
            raise RuntimeError(reply.get("failed") or f"the simulator process exited ({self.proc.poll()})")

    def request(self, head: dict[str, Any], payload: bytes, timeout_s: float) -> dict[str, Any] | None:
        """The answer, or None when it took longer than timeout_s or the process died."""
        self.sock.settimeout(timeout_s)
        try:
            send_msg(self.sock, json.dumps(head).encode() + b"\n" + payload)
            msg = recv_msg(self.sock)
        except (socket.timeout, OSError):
            return None
        return None if msg is None else json.loads(msg)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.sock.close()


class Runner:
    def __init__(self, qubits: int, max_shots: int, max_operations: int, seed: int | None) -> None:
        self.argv = [sys.executable, "-m", "qpu_aer.simulator", "--qubits", str(qubits), "--max-shots",
                     str(max_shots), "--max-operations", str(max_operations)]
        if seed is not None:
            self.argv += ["--seed", str(seed)]
        self.env = dict(os.environ, PYTHONPATH=_pythonpath())
        self.spares: queue.Queue[Process | RuntimeError] = queue.Queue()
        self.lock = threading.Lock()
        self.processes: list[Process] = []
        self.replaced = 0
        self.current: Process | None = self._spawn()
        try:
            self.current.wait_ready(START_S)   # RuntimeError: qpu-aer cannot run jobs
        except RuntimeError:
            self._forget(self.current)
            raise
        self._start_spare()

    def _spawn(self) -> Process:
        # In the calling thread (main, or the worker), which lives as long as
        # qpu-aer: the process's parent-death signal follows it.
        p = Process(self.argv, self.env)
        with self.lock:
            self.processes.append(p)
        return p

    def _forget(self, p: Process) -> None:
        p.kill()
        with self.lock:
            if p in self.processes:
                self.processes.remove(p)

    def _start_spare(self) -> None:
        p = self._spawn()

        def warm_up() -> None:
            try:
                p.wait_ready(START_S)
                self.spares.put(p)
            except RuntimeError as e:
                self._forget(p)
                self.spares.put(e)
        threading.Thread(target=warm_up, name="qpu-aer-spare", daemon=True).start()

    def process(self) -> Process:
        """The process taking requests: the spare, once the last one was killed."""
        if self.current is None:
            spare = self.spares.get()
            self._start_spare()
            if isinstance(spare, RuntimeError):
                raise spare
            self.current = spare
        return self.current

    def request(self, head: dict[str, Any], payload: bytes, timeout_s: float) -> dict[str, Any] | None:
        """The current process's answer; None when it was past timeout_s or
        died: it is killed, and the next request goes to the spare
        (`died` then says how it ended, None for killed at the bound)."""
        p = self.process()
        reply = p.request(head, payload, timeout_s)
        if reply is None:
            self.died = p.proc.poll()
            self._forget(p)
            self.current = None
            self.replaced += 1
        return reply

    died: int | None = None

    def alive(self) -> bool:
        return self.current is None or self.current.proc.poll() is None

    def stop(self) -> None:
        with self.lock:
            procs = list(self.processes)
        for p in procs:
            self._forget(p)
