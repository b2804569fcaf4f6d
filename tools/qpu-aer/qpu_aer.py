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
ERROR frame whose text names the circuit and the line.  See qpu-aer(1).
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
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

VERSION = "0.1.0"

# qrt/proto/wire.h
MAGIC = 0x57545251
WIRE_VERSION = 1
HEADER = struct.Struct("<IHBBHHIQQqqqqqqIIq")
assert HEADER.size == 96
MAX_PAYLOAD = 1 << 20
HELLO, JOB, RESULT, ERROR = 1, 2, 3, 4
FLAG_NO_RESULT_DATA, FLAG_OUT_OF_WINDOW, FLAG_LATE = 1, 2, 4
ERR_PROTOCOL, ERR_VERSION, ERR_OUT_OF_WINDOW, ERR_CALIBRATION, ERR_BUSY, ERR_INTERNAL = 1, 2, 3, 4, 5, 6
FIELDS = ("magic", "version", "type", "flags", "header_len", "status", "payload_len", "job_id",
          "calibration_id", "scheduled_ns", "sent_ns", "window_start_ns", "window_end_ns",
          "duration_ns", "arrival_ns", "shots", "reserved", "tolerance_ns")

MAX_CIRCUITS = 256
MAX_CONNECTIONS = 16
MAX_MEMORY_SHOTS = 100_000   # per-shot bitstrings kept under the wire's 1 MiB


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


_BIT_DECL = re.compile(r"^\s*bit(?:\[\s*\d+\s*\])?\s+([A-Za-z_]\w*)\s*;\s*(//.*)?$")
_ZERO_ASSIGN = re.compile(r'^\s*([A-Za-z_]\w*)\s*=\s*(?:0|"0+")\s*;\s*(//.*)?$')


def drop_zero_init(text: str) -> str:
    """The circuit with `c = 0;` dropped where c is a bit register not used
    before: the classical assignment MQT's OpenQASM 3 writer puts after each
    declaration, which the importer cannot take.  Aer starts every classical
    bit at 0, so dropping it changes nothing; any other assignment is left
    for the importer to refuse.  Lines are kept (blanked), so an error still
    names the line the client wrote."""
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
        for name in declared:
            if re.search(r"\b" + re.escape(name) + r"\b", line):
                used.add(name)
    return "\n".join(lines)


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
    """Runs envelopes on qiskit-aer (imported once, at start)."""

    def __init__(self, max_qubits: int, max_shots: int, seed: Optional[int]) -> None:
        import qiskit.qasm3
        from qiskit_aer import AerSimulator
        self._loads = qiskit.qasm3.loads
        self._sim = AerSimulator()
        self.max_qubits = max_qubits
        self.max_shots = max_shots
        self.seed = seed
        # Warm up: the first run pays for lazy imports, not a job.
        self.run(json.dumps({"format": "qasm3", "shots": 1, "circuits": [
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
        if not isinstance(env, dict) or env.get("format") != "qasm3":
            raise Refused(ERR_INTERNAL, 'payload: format must be "qasm3" (see qrtd(8), Job payloads)')
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


# ------------------------------------------------------------ the endpoint

class Endpoint:
    def __init__(self, opt: argparse.Namespace, executor: Executor) -> None:
        self.opt = opt
        self.ex = executor
        self.jobs: "queue.Queue[Optional[Tuple[socket.socket, threading.Lock, Dict[str, int], bytes]]]" = \
            queue.Queue(maxsize=opt.queue)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.c = {"connections": 0, "jobs": 0, "results": 0, "errors_sent": 0, "out_of_window": 0,
                  "late": 0, "calibration_mismatch": 0, "refused": 0, "protocol_errors": 0, "busy": 0}
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
                results = self.ex.run(payload, job["shots"])
            except Refused as e:
                self.count("refused")
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
                body = json.dumps({"format": "qasm3-counts", "endpoint": f"qpu-aer {VERSION}",
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
    ap.add_argument("--duration-s", type=float, default=0, help="exit after this many seconds (0: until SIGTERM)")
    ap.add_argument("--max-jobs", type=int, default=0, help="exit after answering this many jobs")
    ap.add_argument("--verbose", "-v", action="store_true", help="log each job and its answer to stderr")
    ap.add_argument("--json", action="store_true", help="print the exit summary as one JSON line")
    ap.add_argument("--summary-file", help="also write the JSON summary to this file")
    ap.add_argument("--version", action="version", version=f"qpu-aer {VERSION}")
    opt = ap.parse_args(argv)

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
        executor = Executor(opt.qubits, opt.max_shots, opt.seed)
    except ImportError as e:
        print(f"qpu-aer: cannot import the simulator ({e}): install the pinned requirements "
              "(tools/qpu-aer/requirements.txt)", file=sys.stderr)
        return 1
    # The reader threads stamp arrivals; the worker runs Python (the OpenQASM
    # import) between aer's C++ runs.  A short switch interval bounds how long
    # a reader waits for the interpreter lock: 0.5 ms, not the default 5 ms.
    sys.setswitchinterval(0.0005)
    ep = Endpoint(opt, executor)
    listeners = []
    paths = []
    for uri in opt.listen:
        try:
            s, path = listen(uri, mode, gid)
        except (OSError, ValueError) as e:
            print(f"qpu-aer: {uri}: {e}", file=sys.stderr)
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
