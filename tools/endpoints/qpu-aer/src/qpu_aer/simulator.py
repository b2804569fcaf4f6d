#!/usr/bin/env python3
"""qpu-aer: a QPU control endpoint that executes.  It speaks qrt/proto/wire.h like
qpu-sim, but runs each job's OpenQASM 3 programs on qiskit-aer and answers
with the real counts.

The job payload is the envelope of qrtd(8), "Job payloads":

    {"format": "qasm3", "shots": 1000, "memory": false,
     "circuits": [{"name": "bell", "qubits": 2, "qasm": "OPENQASM 3.0; ..."}]}

and the RESULT payload is one JSON object:

    {"format": "qasm3-counts", "endpoint": "qpu-aer 0.1.0",
     "job_id": 7, "calibration_id": 3, "scheduled_ns": ..., "arrival_ns": ...,
     "results": [{"name": "bell", "shots": 1000, "counts": {"00": 497, "11": 503},
                  "memory": ["00", "11", ...]}]}      # memory only when asked

Counts use Qiskit's bit order: classical bit 0 is the rightmost character,
registers are separated by a space.  Like qpu-sim it stamps each JOB's
arrival (CLOCK_REALTIME) as it is read, refuses one that arrives outside its
window, and checks the calibration id: a fixed --calibration-id, or the
window in force at arrival of a periodic schedule (--period-ns, the same
schedule as the [[qpu]]'s).  A payload it cannot run is refused with an
ERROR frame whose text names the circuit and the line.  Each job runs in a
simulator process of its own program, bounded in time (its duration_ns plus
--run-margin-s, then the process is killed and a warm spare takes the next
job) and in size (--max-operations, for loops unrolled, counted before it
runs), so one tenant's program cannot hold the QPU for the others.  See
qpu-aer(1).
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import queue
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from qrt_client import protocol as P

VERSION = "0.1.0"

# The wire, as qrt-protogen writes it from agent/proto/protocol.toml
# (qrt_client.protocol): this endpoint speaks version 1.
MAGIC = P.WIRE_MAGIC
WIRE_VERSION = 1
HEADER = P.WIRE_HEADER_V1
FIELDS = P.WIRE_FIELDS_V1
MAX_PAYLOAD = P.WIRE_MAX_PAYLOAD
HELLO, JOB, RESULT, ERROR = P.FrameType.HELLO, P.FrameType.JOB, P.FrameType.RESULT, P.FrameType.ERROR
FLAG_NO_RESULT_DATA = P.WireFlag.NO_RESULT_DATA
FLAG_OUT_OF_WINDOW = P.WireFlag.OUT_OF_WINDOW
FLAG_LATE = P.WireFlag.LATE
ERR_PROTOCOL, ERR_VERSION = P.WireError.PROTOCOL, P.WireError.VERSION
ERR_OUT_OF_WINDOW, ERR_CALIBRATION = P.WireError.OUT_OF_WINDOW, P.WireError.CALIBRATION
ERR_BUSY, ERR_INTERNAL = P.WireError.BUSY, P.WireError.INTERNAL

MAX_CIRCUITS = P.ENVELOPE_MAX_CIRCUITS
MAX_CONNECTIONS = 16
MAX_MEMORY_SHOTS = 100_000   # per-shot bitstrings kept under the wire's 1 MiB
WORKER_START_S = 300         # for a simulator process to import qiskit and warm up


def header(type_: int, **kw: int) -> Dict[str, int]:
    h = {f: 0 for f in FIELDS}
    h.update(magic=MAGIC, version=WIRE_VERSION, type=type_, header_len=HEADER.size)
    h.update(kw)
    return h


def encode(h: Dict[str, int], payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds the wire's {MAX_PAYLOAD}")
    h = dict(h, payload_len=len(payload))
    return HEADER.pack(*(h[f] for f in FIELDS)) + payload


class FrameReader:
    """Frames from a byte stream; error() names what was malformed."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.error: Optional[Tuple[int, str]] = None

    def feed(self, data: bytes) -> None:
        self.buf += data

    def next(self) -> Optional[Tuple[Dict[str, int], bytes]]:
        if self.error or len(self.buf) < HEADER.size:
            return None
        h = dict(zip(FIELDS, HEADER.unpack_from(self.buf)))
        if h["magic"] != MAGIC:
            self.error = (ERR_PROTOCOL, "protocol error: bad magic")
        elif h["version"] != WIRE_VERSION:
            self.error = (ERR_VERSION, f"protocol error: wire version {h['version']}, expected {WIRE_VERSION}")
        elif h["header_len"] != HEADER.size:
            self.error = (ERR_PROTOCOL, f"protocol error: header_len {h['header_len']}")
        elif h["payload_len"] > MAX_PAYLOAD:
            self.error = (ERR_PROTOCOL, f"protocol error: payload_len {h['payload_len']} > {MAX_PAYLOAD}")
        elif h["type"] not in (HELLO, JOB, RESULT, ERROR):
            self.error = (ERR_PROTOCOL, f"protocol error: unknown frame type {h['type']}")
        if self.error:
            return None
        end = HEADER.size + h["payload_len"]
        if len(self.buf) < end:
            return None
        payload = bytes(self.buf[HEADER.size:end])
        del self.buf[:end]
        return h, payload


# ------------------------------------------------------------ the programs

class Refused(Exception):
    """A job this endpoint does not run: (wire error code, reason)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class Stopped(Refused):
    """A job whose simulator process was stopped (its time bound) or died."""


_BIT_DECL = re.compile(r"^\s*bit(?:\[\s*\d+\s*\])?\s+([A-Za-z_]\w*)\s*;\s*(//.*)?$")
_ZERO_ASSIGN = re.compile(r'^\s*([A-Za-z_]\w*)\s*=\s*(?:0|"0+")\s*;\s*(//.*)?$')


_WORD = re.compile(r"\w+")


def drop_zero_init(text: str) -> str:
    """The circuit with `c = 0;` dropped where c is a bit register not used
    before: the classical assignment MQT's OpenQASM 3 writer puts after each
    declaration, which the importer cannot take.  Aer starts every classical
    bit at 0, so dropping it changes nothing; any other assignment is left
    for the importer to refuse.  Lines are kept (blanked), so an error still
    names the line the client wrote.  One pass over the text: a register
    counts as used where it appears as a whole word (\\w+) on a line."""
    lines = text.split("\n")
    declared = set()
    used = set()
    for i, line in enumerate(lines):
        d = _BIT_DECL.match(line)
        if d:
            declared.add(d.group(1))
            continue
        z = _ZERO_ASSIGN.match(line)
        if z and z.group(1) in declared and z.group(1) not in used:
            lines[i] = ""
            continue
        if declared:
            used.update(w for w in _WORD.findall(line) if w in declared)
    return "\n".join(lines)


def unrolled_operations(qc: Any, budget: int) -> int:
    """The operations a circuit runs with every for loop unrolled (the loop's
    index set times its body), counted before anything is simulated; an
    if/else or switch counts its largest branch, a while loop its body once
    (how often it runs depends on measurements: the time bound covers it).
    Counting stops once it passes budget."""
    n = 0
    for inst in qc.data:
        op = inst.operation
        blocks = getattr(op, "blocks", ())
        if op.name == "for_loop":
            n += len(op.params[0]) * unrolled_operations(blocks[0], budget)
        elif blocks:
            n += max(unrolled_operations(b, budget) for b in blocks)
        else:
            n += 1
        if n > budget:
            return n
    return n


def qasm_error_text(exc: BaseException) -> str:
    """Where an OpenQASM 3 program failed to import: 'line L, column C: ...'."""
    import re
    text = str(exc).strip().strip('"')
    m = re.match(r"L(\d+):C(\d+):\s*(.*)", text, re.S)
    if m:
        return f"line {m.group(1)}, column {int(m.group(2)) + 1}: {m.group(3).strip()}"
    m = re.match(r"(\d+),(\d+):\s*(.*)", text, re.S)
    if m:
        return f"line {m.group(1)}, column {int(m.group(2)) + 1}: {m.group(3).strip()}"
    cause = exc.__cause__
    rec = cause.args[0] if cause is not None and cause.args else None
    tok = getattr(rec, "offendingToken", None)
    if tok is not None:
        near = "end of input" if tok.type == -1 else repr(tok.text)
        return f"line {tok.line}, column {tok.column + 1}: syntax error near {near}"
    return text or type(exc).__name__


class Executor:
    """Runs envelopes on qiskit-aer (imported once, at start), in a worker
    process (Runner)."""

    def __init__(self, max_qubits: int, max_shots: int, seed: Optional[int], max_operations: int) -> None:
        import qiskit.qasm3
        from qiskit_aer import AerSimulator
        self._loads = qiskit.qasm3.loads
        self._sim = AerSimulator()
        self.max_qubits = max_qubits
        self.max_shots = max_shots
        self.seed = seed
        self.max_operations = max_operations
        # Warm up: the first run pays for lazy imports, not a job.
        self.run(json.dumps({"format": P.ENVELOPE_FORMAT, "shots": 1, "circuits": [
            {"name": "warm-up", "qubits": 1,
             "qasm": 'OPENQASM 3.0;\ninclude "stdgates.inc";\nbit[1] c;\nqubit[1] q;\nx q[0];\nc[0] = measure q[0];\n'}]}).encode(), 1)

    def parse(self, payload: bytes, wire_shots: int) -> Tuple[int, bool, Optional[int], List[Tuple[str, Any]]]:
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Refused(ERR_INTERNAL, f"payload is not UTF-8 (byte {e.start})") from None
        try:
            env = json.loads(text)
        except ValueError as e:
            raise Refused(ERR_INTERNAL, f"payload is not a JSON envelope: line {e.lineno}, column {e.colno}: "
                                        f"{e.msg} (see qrtd(8), Job payloads)") from None
        if not isinstance(env, dict) or env.get("format") != P.ENVELOPE_FORMAT:
            raise Refused(ERR_INTERNAL, f'payload: format must be "{P.ENVELOPE_FORMAT}" (see qrtd(8), Job payloads)')
        shots = env.get("shots")
        if not isinstance(shots, int) or isinstance(shots, bool) or shots < 1:
            raise Refused(ERR_INTERNAL, f"payload: shots = {shots!r} is not an integer of 1 or more")
        if shots > self.max_shots:
            raise Refused(ERR_INTERNAL, f"payload: shots = {shots} is more than this QPU takes ({self.max_shots})")
        if wire_shots and wire_shots != shots:
            raise Refused(ERR_INTERNAL, f"payload: shots = {shots} but the JOB frame says {wire_shots}")
        memory = env.get("memory", False) is True
        if memory and shots > MAX_MEMORY_SHOTS:
            raise Refused(ERR_INTERNAL, f"payload: memory with {shots} shots; at most {MAX_MEMORY_SHOTS}")
        seed = env.get("seed", self.seed)
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
            raise Refused(ERR_INTERNAL, f"payload: seed = {seed!r} is not an integer in 0..2^63-1")
        circuits = env.get("circuits")
        if not isinstance(circuits, list) or not circuits or len(circuits) > MAX_CIRCUITS:
            raise Refused(ERR_INTERNAL, f"payload: circuits must be an array of 1..{MAX_CIRCUITS} circuits")
        out = []
        operations = 0
        for i, c in enumerate(circuits):
            if not isinstance(c, dict) or not isinstance(c.get("qasm"), str):
                raise Refused(ERR_INTERNAL, f"payload: circuits[{i}] has no qasm string")
            name = str(c.get("name", f"circuit-{i}"))[:128]
            try:
                qc = self._loads(drop_zero_init(c["qasm"]))
            except Exception as e:  # the importer's errors are of several types
                raise Refused(ERR_INTERNAL, f"circuits[{i}] ({name}) is not OpenQASM 3 this QPU can run: "
                                            f"{qasm_error_text(e)}") from None
            if qc.num_qubits > self.max_qubits:
                raise Refused(ERR_INTERNAL, f"circuits[{i}] ({name}) uses {qc.num_qubits} qubits; this QPU has "
                                            f"{self.max_qubits}")
            if qc.num_clbits == 0:
                raise Refused(ERR_INTERNAL, f"circuits[{i}] ({name}) measures nothing: no classical bits")
            operations += unrolled_operations(qc, self.max_operations - operations)
            if operations > self.max_operations:
                raise Refused(ERR_INTERNAL, f"circuits[{i}] ({name}) takes the job past {self.max_operations} "
                                            "operations with its for loops unrolled, more than this QPU runs for "
                                            "one job (--max-operations); nothing was run")
            out.append((name, qc))
        return shots, memory, seed, out

    def run(self, payload: bytes, wire_shots: int) -> List[Dict[str, Any]]:
        shots, memory, seed, circuits = self.parse(payload, wire_shots)
        kw: Dict[str, Any] = {"shots": shots, "memory": memory}
        if seed is not None:
            kw["seed_simulator"] = seed
        result = self._sim.run([qc for _, qc in circuits], **kw).result()
        if not result.success:
            raise Refused(ERR_INTERNAL, f"qiskit-aer failed: {result.status}")
        out = []
        for i, (name, _) in enumerate(circuits):
            r: Dict[str, Any] = {"name": name, "shots": shots,
                                 "counts": dict(result.get_counts(i))}
            if memory:
                r["memory"] = result.get_memory(i)
            out.append(r)
        return out


# ------------------------------------------------------------ the simulator processes
#
# Each job runs in a worker process (this file with --worker-fd): it imports
# qiskit once, warms up, then takes one job at a time over a socketpair.  The
# endpoint waits for each answer at most the job's duration_ns plus
# --run-margin-s; past that it kills the worker (SIGKILL), answers the job
# with an ERROR naming the bound, and goes on with a spare worker that is
# already warm, so the next job, whoever sent it, runs at once while another
# spare starts.  Messages: a 4-byte big-endian length, then the body; a job
# is its JOB frame's shots (4 bytes) and the payload, an answer one JSON
# object: {"ready": version}, {"results": [...]}, {"refused": [code, reason]}
# or {"failed": why} (the worker could not start).

_LEN = struct.Struct(">I")


def send_msg(sock: socket.socket, body: bytes) -> None:
    sock.sendall(_LEN.pack(len(body)) + body)


def recv_msg(sock: socket.socket) -> Optional[bytes]:
    """One message, or None when the peer closed."""
    def exactly(n: int) -> Optional[bytes]:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)
    head = exactly(_LEN.size)
    return None if head is None else exactly(_LEN.unpack(head)[0])


def worker_main(fd: int, opt: argparse.Namespace) -> int:
    """The worker process: run each job the endpoint sends, answer each."""
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the endpoint stops it
    # Killed with the endpoint even in the middle of a job (PR_SET_PDEATHSIG);
    # an idle worker also ends when the endpoint's end of the socket closes.
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    try:
        ex = Executor(opt.qubits, opt.max_shots, opt.seed, opt.max_operations)
    except ImportError as e:
        send_msg(sock, json.dumps({"failed": f"cannot import the simulator ({e}): install the pinned "
                                             "requirements (tools/integrations/qiskit/requirements-sdk.txt)"}).encode())
        return 1
    send_msg(sock, json.dumps({"ready": VERSION}).encode())
    while True:
        msg = recv_msg(sock)
        if msg is None:
            return 0
        shots = _LEN.unpack_from(msg)[0]
        try:
            reply: Dict[str, Any] = {"results": ex.run(msg[_LEN.size:], shots)}
        except Refused as e:
            reply = {"refused": [e.code, e.reason]}
        except Exception as e:  # never take the endpoint down for one job
            reply = {"refused": [ERR_INTERNAL, f"qpu-aer: {type(e).__name__}: {e}"]}
        send_msg(sock, json.dumps(reply, separators=(",", ":")).encode())


class Worker:
    """One worker process and the endpoint's end of its socketpair."""

    def __init__(self, argv: List[str]) -> None:
        mine, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(argv + ["--worker-fd", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.sock = mine

    def wait_ready(self, timeout_s: float) -> None:
        """Returns once the worker has warmed up; raises RuntimeError naming why it did not."""
        self.sock.settimeout(timeout_s)
        try:
            msg = recv_msg(self.sock)
        except socket.timeout:
            self.kill()
            raise RuntimeError(f"the simulator process did not start within {timeout_s:.0f} s") from None
        reply = json.loads(msg) if msg else {}
        if "ready" not in reply:
            self.kill()
            raise RuntimeError(reply.get("failed") or f"the simulator process exited ({self.proc.returncode})")

    def run(self, payload: bytes, shots: int, timeout_s: float) -> Optional[Dict[str, Any]]:
        """The worker's answer, or None when it took longer than timeout_s or died."""
        self.sock.settimeout(timeout_s)
        try:
            send_msg(self.sock, _LEN.pack(shots) + payload)
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
    """Runs each job in a worker process, bounded in time (see above)."""

    def __init__(self, opt: argparse.Namespace) -> None:
        self.argv = [sys.executable, os.path.abspath(__file__), "--qubits", str(opt.qubits),
                     "--max-shots", str(opt.max_shots), "--max-operations", str(opt.max_operations)]
        if opt.seed is not None:
            self.argv += ["--seed", str(opt.seed)]
        self.margin_s = opt.run_margin_s
        self.spares: "queue.Queue[Any]" = queue.Queue()
        self.lock = threading.Lock()
        self.workers: List[Worker] = []
        self.current = self.spawn()
        try:
            self.current.wait_ready(WORKER_START_S)   # RuntimeError: qpu-aer cannot run jobs
        except RuntimeError:
            self.forget(self.current)
            raise
        self.start_spare()

    def spawn(self) -> Worker:
        # In the calling thread (main, or the one that runs jobs), which lives
        # as long as qpu-aer: the worker's parent-death signal follows it.
        w = Worker(self.argv)
        with self.lock:
            self.workers.append(w)
        return w

    def forget(self, w: Worker) -> None:
        w.kill()
        with self.lock:
            if w in self.workers:
                self.workers.remove(w)

    def start_spare(self) -> None:
        w = self.spawn()

        def warm_up() -> None:
            try:
                w.wait_ready(WORKER_START_S)
                self.spares.put(w)
            except RuntimeError as e:
                self.forget(w)
                self.spares.put(e)
        threading.Thread(target=warm_up, daemon=True).start()

    def run(self, payload: bytes, shots: int, duration_ns: int) -> List[Dict[str, Any]]:
        """The job's results; Refused when it cannot run, or ran past its bound."""
        if self.current is None:
            spare = self.spares.get()
            self.start_spare()
            if isinstance(spare, RuntimeError):
                raise Refused(ERR_INTERNAL, f"qpu-aer: no simulator process: {spare}")
            self.current = spare
        bound_s = max(0, duration_ns) / 1e9 + self.margin_s
        reply = self.current.run(payload, shots, bound_s)
        if reply is None:
            died = self.current.proc.poll()
            self.forget(self.current)
            self.current = None
            if died is not None:
                raise Stopped(ERR_INTERNAL, f"qpu-aer: the simulator process died running this job (exit status "
                                            f"{died}); nothing was run to completion")
            raise Stopped(ERR_INTERNAL, f"qpu-aer: the job ran past its time bound, {bound_s:.3f} s (duration "
                                        f"{duration_ns} ns + --run-margin-s {self.margin_s:g}), and was stopped")
        if "refused" in reply:
            raise Refused(*reply["refused"])
        return reply["results"]

    def stop(self) -> None:
        with self.lock:
            workers = list(self.workers)
        for w in workers:
            self.forget(w)


# ------------------------------------------------------------ the endpoint

class Endpoint:
    def __init__(self, opt: argparse.Namespace, runner: Runner) -> None:
        self.opt = opt
        self.runner = runner
        self.jobs: "queue.Queue[Optional[Tuple[socket.socket, threading.Lock, Dict[str, int], bytes]]]" = \
            queue.Queue(maxsize=opt.queue)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.c = {"connections": 0, "jobs": 0, "results": 0, "errors_sent": 0, "out_of_window": 0,
                  "late": 0, "calibration_mismatch": 0, "refused": 0, "stopped": 0, "protocol_errors": 0,
                  "busy": 0}
        self.lateness: List[int] = []

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.c[key] += n

    def expected_calibration(self, t_ns: int) -> Optional[int]:
        """The window in force at t of the periodic schedule, None in a blackout."""
        o = self.opt
        k = (t_ns - o.phase_ns) // o.period_ns
        if t_ns - (o.phase_ns + k * o.period_ns) < o.blackout_ns:
            return None
        return k + 1

    def send(self, conn: socket.socket, wlock: threading.Lock, data: bytes) -> None:
        with wlock:
            try:
                conn.sendall(data)
            except OSError:
                pass  # peer gone; its reader notices

    def error(self, conn, wlock, job: Dict[str, int], code: int, why: str) -> None:
        h = header(ERROR, status=code, job_id=job.get("job_id", 0), calibration_id=job.get("calibration_id", 0),
                   scheduled_ns=job.get("scheduled_ns", 0), arrival_ns=job.get("arrival_ns", 0),
                   sent_ns=time.time_ns())
        self.send(conn, wlock, encode(h, why.encode()[:4096]))
        self.count("errors_sent")
        if job:
            self.log(job, f"ERROR {code}: {why}")

    def serve_connection(self, conn: socket.socket) -> None:
        wlock = threading.Lock()
        reader = FrameReader()
        hello = False
        self.count("connections")
        try:
            while not self.stop.is_set():
                try:
                    data = conn.recv(65536)
                except OSError:
                    break
                arrival = time.time_ns()   # as qpu-sim: stamped when read
                if not data:
                    break
                reader.feed(data)
                while True:
                    f = reader.next()
                    if f is None:
                        break
                    h, payload = f
                    if not hello:
                        if h["type"] != HELLO:
                            self.count("protocol_errors")
                            self.error(conn, wlock, {}, ERR_PROTOCOL, "protocol error: first frame must be HELLO")
                            return
                        hello = True
                        self.send(conn, wlock, encode(header(HELLO), f"qpu-aer {VERSION}".encode()))
                        continue
                    if h["type"] == HELLO:
                        continue
                    if h["type"] != JOB:
                        self.count("protocol_errors")
                        self.error(conn, wlock, {}, ERR_PROTOCOL, "protocol error: unexpected frame type")
                        return
                    h["arrival_ns"] = arrival
                    self.accept_job(conn, wlock, h, payload)
                if reader.error:
                    self.count("protocol_errors")
                    self.error(conn, wlock, {}, reader.error[0], reader.error[1])
                    return
        finally:
            conn.close()

    def log(self, job: Dict[str, int], what: str) -> None:
        if self.opt.verbose:
            print(f"qpu-aer: job {job['job_id']} calibration {job['calibration_id']} scheduled "
                  f"{job['scheduled_ns']} arrival {job['arrival_ns']}: {what}", file=sys.stderr, flush=True)

    def accept_job(self, conn, wlock, job: Dict[str, int], payload: bytes) -> None:
        self.count("jobs")
        arrival = job["arrival_ns"]
        with self.lock:
            if len(self.lateness) < 1_000_000:
                self.lateness.append(arrival - job["scheduled_ns"])
        if arrival < job["window_start_ns"] or arrival + job["duration_ns"] > job["window_end_ns"]:
            self.count("out_of_window")
            self.error(conn, wlock, job, ERR_OUT_OF_WINDOW,
                       f"arrival {arrival} outside window [{job['window_start_ns']}, {job['window_end_ns']} "
                       f"- duration {job['duration_ns']}]")
            return
        want = self.opt.calibration_id
        if self.opt.period_ns:
            want = self.expected_calibration(arrival)
            if want is None:
                self.count("calibration_mismatch")
                self.error(conn, wlock, job, ERR_CALIBRATION,
                           f"arrival {arrival} is inside a calibration blackout; calibration_id "
                           f"{job['calibration_id']} is not current")
                return
        if want and job["calibration_id"] != want:
            self.count("calibration_mismatch")
            self.error(conn, wlock, job, ERR_CALIBRATION,
                       f"calibration_id {job['calibration_id']} is not current ({want})")
            return
        try:
            self.jobs.put_nowait((conn, wlock, job, payload))
        except queue.Full:
            self.count("busy")
            self.error(conn, wlock, job, ERR_BUSY, f"{self.opt.queue} jobs already wait to run")

    def work(self) -> None:
        while True:
            item = self.jobs.get()
            if item is None:
                return
            conn, wlock, job, payload = item
            try:
                results = self.runner.run(payload, job["shots"], job["duration_ns"])
            except Refused as e:
                self.count("refused")
                if isinstance(e, Stopped):
                    self.count("stopped")
                self.error(conn, wlock, job, e.code, e.reason)
                continue
            except Exception as e:  # never take the endpoint down for one job
                self.count("refused")
                self.error(conn, wlock, job, ERR_INTERNAL, f"qpu-aer: {type(e).__name__}: {e}")
                continue
            flags = 0
            lateness = job["arrival_ns"] - job["scheduled_ns"]
            if job["tolerance_ns"] > 0 and lateness > job["tolerance_ns"]:
                flags |= FLAG_LATE
                self.count("late")
            body = b""
            if not job["flags"] & FLAG_NO_RESULT_DATA:
                body = json.dumps({"format": P.ENVELOPE_RESULT_FORMAT, "endpoint": f"qpu-aer {VERSION}",
                                   "job_id": job["job_id"], "calibration_id": job["calibration_id"],
                                   "scheduled_ns": job["scheduled_ns"], "arrival_ns": job["arrival_ns"],
                                   "results": results}, separators=(",", ":")).encode()
            if len(body) > MAX_PAYLOAD:
                self.error(conn, wlock, job, ERR_INTERNAL,
                           f"the result is {len(body)} bytes, more than the wire's {MAX_PAYLOAD}: ask fewer shots "
                           "or no memory")
                continue
            h = header(RESULT, flags=flags, job_id=job["job_id"], calibration_id=job["calibration_id"],
                       scheduled_ns=job["scheduled_ns"], window_start_ns=job["window_start_ns"],
                       window_end_ns=job["window_end_ns"], duration_ns=job["duration_ns"],
                       arrival_ns=job["arrival_ns"], shots=job["shots"], tolerance_ns=job["tolerance_ns"],
                       sent_ns=time.time_ns())
            self.send(conn, wlock, encode(h, body))
            self.count("results")
            self.log(job, "RESULT " + ", ".join(f"{r['name']}: {len(r['counts'])} outcomes" for r in results))
            if self.opt.max_jobs and self.c["results"] + self.c["errors_sent"] >= self.opt.max_jobs:
                self.stop.set()

    def summary(self) -> Dict[str, Any]:
        with self.lock:
            lat = sorted(self.lateness)
            c = dict(self.c)

        def pct(p: float) -> int:
            return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0
        c.update(tool="qpu-aer", arrival_lateness_ns={"count": len(lat), "p50": pct(0.5), "p99": pct(0.99),
                                                      "max": lat[-1] if lat else 0})
        return c


def listen(uri: str, mode: Optional[int], gid: Optional[int]) -> Tuple[socket.socket, str]:
    if uri.startswith("unix://"):
        path = uri[len("unix://"):]
        if not path.startswith("/"):
            raise ValueError(f"{uri}: the path must be absolute")
        if os.path.exists(path):
            os.unlink(path)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(~mode & 0o777) if mode is not None else None
        try:
            s.bind(path)
        finally:
            if old is not None:
                os.umask(old)
        if gid is not None:
            os.chown(path, -1, gid, follow_symlinks=False)
        s.listen(16)
        return s, path
    if uri.startswith("tcp://"):
        rest = uri[len("tcp://"):]
        host, _, port = rest.rpartition(":")
        host = host.strip("[]")
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
        s.listen(16)
        return s, ""
    raise ValueError(f"{uri}: the endpoint must be unix:///path or tcp://ADDRESS:PORT")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="qpu-aer",
        description="A QPU control endpoint for qrtd (qrt/proto/wire.h) that runs each job's OpenQASM 3 "
                    "programs on qiskit-aer and answers with the real counts.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n"
               "  qpu-aer --listen unix:///run/qrtd-qpu/qpu0.sock --qubits 3\n"
               "  qpu-aer --listen unix:///tmp/q.sock --period-ns 60000000000 --blackout-ns 5000000000\n"
               "  qpu-aer --listen tcp://127.0.0.1:7000 --seed 1 --duration-s 60 --json\n"
               "See qpu-aer(1); the job envelope is in qrtd(8), Job payloads.")
    ap.add_argument("--listen", "-l", action="append", default=[], metavar="URI",
                    help="unix:///path or tcp://127.x.x.x:port (repeatable)")
    ap.add_argument("--socket-group", help="group of the UNIX sockets (name or gid), set right after bind")
    ap.add_argument("--socket-mode", help="permission bits of the UNIX sockets, octal (e.g. 0660)")
    ap.add_argument("--qubits", type=int, default=32, help="qubits of this QPU: wider circuits are refused "
                                                           "(default 32)")
    ap.add_argument("--max-shots", type=int, default=100_000, help="most shots per job (default 100000)")
    ap.add_argument("--calibration-id", type=int, default=0,
                    help="the current calibration id; others get ERROR (0: accept any)")
    ap.add_argument("--period-ns", type=int, default=0,
                    help="follow a periodic calibration schedule (the [[qpu]]'s period_ns): a job must carry "
                         "the id of the window in force at its arrival")
    ap.add_argument("--blackout-ns", type=int, default=0, help="the schedule's blackout_ns")
    ap.add_argument("--phase-ns", type=int, default=0, help="the schedule's phase_ns")
    ap.add_argument("--seed", type=int, help="seed_simulator for reproducible counts")
    ap.add_argument("--queue", type=int, default=64, help="jobs waiting to run before ERROR busy (default 64)")
    ap.add_argument("--max-operations", type=int, default=1_000_000,
                    help="operations one job's circuits may hold with their for loops unrolled, counted "
                         "before anything runs (default 1000000)")
    ap.add_argument("--run-margin-s", type=float, default=10.0,
                    help="a job runs at most its duration_ns plus this long, then its simulator process is "
                         "stopped (default 10)")
    ap.add_argument("--worker-fd", type=int, help=argparse.SUPPRESS)   # a simulator process (Runner)
    ap.add_argument("--duration-s", type=float, default=0, help="exit after this many seconds (0: until SIGTERM)")
    ap.add_argument("--max-jobs", type=int, default=0, help="exit after answering this many jobs")
    ap.add_argument("--verbose", "-v", action="store_true", help="log each job and its answer to stderr")
    ap.add_argument("--json", action="store_true", help="print the exit summary as one JSON line")
    ap.add_argument("--summary-file", help="also write the JSON summary to this file")
    ap.add_argument("--version", action="version", version=f"qpu-aer {VERSION}")
    opt = ap.parse_args(argv)

    if opt.worker_fd is not None:
        return worker_main(opt.worker_fd, opt)
    if not opt.listen:
        ap.error("give at least one --listen endpoint")
    if not 1 <= opt.qubits <= 1024:
        ap.error(f"--qubits {opt.qubits}: give 1..1024")
    if not 1 <= opt.max_shots <= 1_000_000:
        ap.error(f"--max-shots {opt.max_shots}: give 1..1000000 (what the wire carries)")
    if opt.period_ns < 0 or (opt.period_ns and not 0 <= opt.blackout_ns < opt.period_ns) or \
            (opt.period_ns and not 0 <= opt.phase_ns < opt.period_ns):
        ap.error("--period-ns must be > 0 with --blackout-ns and --phase-ns in [0, period)")
    if not 1 <= opt.queue <= 10_000:
        ap.error(f"--queue {opt.queue}: give 1..10000")
    if not 1 <= opt.max_operations <= 10**12:
        ap.error(f"--max-operations {opt.max_operations}: give 1..10^12")
    if not 0.1 <= opt.run_margin_s <= 86400:
        ap.error(f"--run-margin-s {opt.run_margin_s}: give 0.1..86400 seconds")
    mode = gid = None
    if opt.socket_mode is not None:
        try:
            mode = int(opt.socket_mode, 8)
            if not 0 <= mode <= 0o777:
                raise ValueError
        except ValueError:
            ap.error(f'--socket-mode "{opt.socket_mode}": give octal permission bits, 0 to 0777 (e.g. 0660)')
    if opt.socket_group is not None:
        try:
            gid = int(opt.socket_group) if opt.socket_group.isdigit() else grp.getgrnam(opt.socket_group).gr_gid
        except KeyError:
            ap.error(f'--socket-group: no group "{opt.socket_group}"')

    try:
        runner = Runner(opt)
    except RuntimeError as e:
        print(f"qpu-aer: {e}", file=sys.stderr)
        return 1
    ep = Endpoint(opt, runner)
    listeners = []
    paths = []
    for uri in opt.listen:
        try:
            s, path = listen(uri, mode, gid)
        except (OSError, ValueError) as e:
            print(f"qpu-aer: {uri}: {e}", file=sys.stderr)
            runner.stop()
            return 1 if isinstance(e, OSError) else 2
        listeners.append(s)
        paths.append(path)
        print(f"qpu-aer: listening on {uri}", file=sys.stderr, flush=True)

    def on_signal(*_: Any) -> None:
        ep.stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    # One reader thread per connection, at most MAX_CONNECTIONS at once (qrtd
    # keeps one per QPU); one more is closed at once, its HELLO unanswered.
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def serve(conn: socket.socket) -> None:
        try:
            ep.serve_connection(conn)
        finally:
            slots.release()

    def accept(ls: socket.socket) -> None:
        ls.settimeout(0.2)
        while not ep.stop.is_set():
            try:
                conn, _ = ls.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if not slots.acquire(blocking=False):
                print(f"qpu-aer: refusing a connection: {MAX_CONNECTIONS} already open", file=sys.stderr,
                      flush=True)
                conn.close()
                continue
            conn.settimeout(None)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    for ls in listeners:
        threading.Thread(target=accept, args=(ls,), daemon=True).start()
    worker = threading.Thread(target=ep.work, daemon=True)
    worker.start()
    end = time.monotonic() + opt.duration_s if opt.duration_s > 0 else None
    while not ep.stop.is_set():
        ep.stop.wait(0.2 if end is None else max(0.0, min(0.2, end - time.monotonic())))
        if end is not None and time.monotonic() >= end:
            break
    ep.stop.set()
    for ls in listeners:
        ls.close()
    runner.stop()
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass
    summary = ep.summary()
    if opt.summary_file:
        with open(opt.summary_file, "w") as f:
            f.write(json.dumps(summary) + "\n")
    if opt.json:
        print(json.dumps(summary), flush=True)
    else:
        print(f"qpu-aer: {summary['jobs']} jobs, {summary['results']} results, {summary['errors_sent']} errors "
              f"sent, {summary['connections']} connections; refused {summary['refused']}, out-of-window "
              f"{summary['out_of_window']}, calibration-mismatch {summary['calibration_mismatch']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
