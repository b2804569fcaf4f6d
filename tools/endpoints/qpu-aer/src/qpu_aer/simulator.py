"""The simulator process of qpu-aer: it imports qiskit and qiskit-aer once,
warms up, then takes one request at a time over a socketpair from the
endpoint (runner.py): ARM a job (read its envelope, import each OpenQASM 3
circuit, check it against the device: the simulator's circuits, kept by
job id), RUN an armed job on AerSimulator, DROP one.

Messages: a 4-byte big-endian length, then the body; a request is a JSON
header line and, for ARM, the envelope after it; an answer is one JSON
object: {"ready": version}, {"armed": [[stage, ns], ...]}, {"refused":
[stage, reason, detail]}, {"results": [...], "started_ns", "ended_ns"},
{"dropped": true} or {"failed": why} (the process could not start).

Run as `python -m qpu_aer.simulator --fd N ...` by the endpoint only.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import struct
import sys
import time
from typing import Any

from qrt_client import protocol as P
from qrt_endpoint.handler import (
    INSTRUCTION_MEMORY_EXCEEDED,
    PROGRAM_INVALID,
    QUBIT_OUT_OF_RANGE,
    STAGE_COMPILE,
    STAGE_PARSE,
    ArmRefused,
)

from . import VERSION

MAX_MEMORY_SHOTS = 100_000   # per-shot bitstrings kept under the wire's 1 MiB
MAX_ARMED_JOBS = 4096        # jobs one process holds (the endpoint's max_armed is far below)

_LEN = struct.Struct(">I")


def send_msg(sock: socket.socket, body: bytes) -> None:
    sock.sendall(_LEN.pack(len(body)) + body)


def recv_msg(sock: socket.socket) -> bytes | None:
    """One message, or None when the peer closed."""
    def exactly(n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)
    head = exactly(_LEN.size)
    return None if head is None else exactly(_LEN.unpack(head)[0])


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
    declared: set[str] = set()
    used: set[str] = set()
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
        blocks: tuple[Any, ...] = getattr(op, "blocks", ())
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


class Armed:
    """A job's simulator circuits, ready to run."""

    def __init__(self, shots: int, memory: bool, seed: int | None, circuits: list[tuple[str, Any]],
                 noise: Any = None) -> None:
        self.shots = shots
        self.memory = memory
        self.seed = seed
        self.circuits = circuits
        self.noise = noise   # a qiskit-aer NoiseModel (the drifting device), or None


class Executor:
    """Envelopes into AerSimulator's circuits (arm), and their runs (run);
    qiskit and qiskit-aer imported once, at start."""

    def __init__(self, max_qubits: int, max_shots: int, seed: int | None, max_operations: int) -> None:
        import qiskit.qasm3
        from qiskit_aer import AerSimulator
        self._loads = qiskit.qasm3.loads
        self._sim = AerSimulator()
        self.max_qubits = max_qubits
        self.max_shots = max_shots
        self.seed = seed
        self.max_operations = max_operations
        self.armed: dict[int, Armed] = {}
        # Warm up: the first run pays for lazy imports, not a job.
        qasm = 'OPENQASM 3.0;\ninclude "stdgates.inc";\nbit[1] c;\nqubit[1] q;\nx q[0];\nc[0] = measure q[0];\n'
        warm = {"format": P.ENVELOPE_FORMAT, "shots": 1, "circuits": [{"name": "warm-up", "qubits": 1, "qasm": qasm}]}
        self.arm(0, json.dumps(warm).encode(), 1)
        self.run(0)

    def arm(self, job_id: int, payload: bytes, wire_shots: int,
            noise: dict[str, Any] | None = None) -> list[tuple[str, int]]:
        """Reads and checks the envelope; keeps the job's circuits (and the
        drifting device's noise for it, qpu_aer_drift's noise_spec).  The
        stages and their cost, or ArmRefused naming the circuit and line."""
        t0 = time.perf_counter_ns()
        shots, memory, seed, circuits = self._parse(payload, wire_shots)
        t1 = time.perf_counter_ns()
        self._check(circuits)
        model = None
        if noise is not None:
            import qpu_aer_drift
            model = qpu_aer_drift.noise_model(noise)
        t2 = time.perf_counter_ns()
        if len(self.armed) >= MAX_ARMED_JOBS:
            raise ArmRefused(STAGE_COMPILE, PROGRAM_INVALID, f"the simulator holds {MAX_ARMED_JOBS} jobs")
        self.armed[job_id] = Armed(shots, memory, seed, circuits, model)
        return [(STAGE_PARSE, t1 - t0), (STAGE_COMPILE, t2 - t1)]

    def _parse(self, payload: bytes, wire_shots: int) -> tuple[int, bool, int | None, list[tuple[str, Any]]]:
        def refuse(detail: str) -> ArmRefused:
            return ArmRefused(STAGE_PARSE, PROGRAM_INVALID, detail)
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError as e:
            raise refuse(f"payload is not UTF-8 (byte {e.start})") from None
        try:
            env = json.loads(text)
        except json.JSONDecodeError as e:
            raise refuse(f"payload is not a JSON envelope: line {e.lineno}, column {e.colno}: {e.msg} "
                         "(see qrtd(8), Job payloads)") from None
        if not isinstance(env, dict) or env.get("format") != P.ENVELOPE_FORMAT:
            raise refuse(f'payload: format must be "{P.ENVELOPE_FORMAT}" (see qrtd(8), Job payloads)')
        shots = env.get("shots")
        if not isinstance(shots, int) or isinstance(shots, bool) or shots < 1:
            raise refuse(f"payload: shots = {shots!r} is not an integer of 1 or more")
        if shots > self.max_shots:
            raise refuse(f"payload: shots = {shots} is more than this QPU takes ({self.max_shots})")
        if wire_shots and wire_shots != shots:
            raise refuse(f"payload: shots = {shots} but the job's frame says {wire_shots}")
        memory = env.get("memory", False) is True
        if memory and shots > MAX_MEMORY_SHOTS:
            raise refuse(f"payload: memory with {shots} shots; at most {MAX_MEMORY_SHOTS}")
        seed = env.get("seed", self.seed)
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
            raise refuse(f"payload: seed = {seed!r} is not an integer in 0..2^63-1")
        raw = env.get("circuits")
        if not isinstance(raw, list) or not raw or len(raw) > P.ENVELOPE_MAX_CIRCUITS:
            raise refuse(f"payload: circuits must be an array of 1..{P.ENVELOPE_MAX_CIRCUITS} circuits")
        out = []
        for i, c in enumerate(raw):
            if not isinstance(c, dict) or not isinstance(c.get("qasm"), str):
                raise refuse(f"payload: circuits[{i}] has no qasm string")
            name = str(c.get("name", f"circuit-{i}"))[:128]
            try:
                qc = self._loads(drop_zero_init(c["qasm"]))
            except Exception as e:  # the importer's errors are of several types
                raise refuse(f"circuits[{i}] ({name}) is not OpenQASM 3 this QPU can run: "
                             f"{qasm_error_text(e)}") from None
            out.append((name, qc))
        return shots, memory, seed, out

    def _check(self, circuits: list[tuple[str, Any]]) -> None:
        operations = 0
        for i, (name, qc) in enumerate(circuits):
            if qc.num_qubits > self.max_qubits:
                raise ArmRefused(STAGE_COMPILE, QUBIT_OUT_OF_RANGE, f"circuits[{i}] ({name}) uses {qc.num_qubits} "
                                 f"qubits; this QPU has {self.max_qubits}")
            if qc.num_clbits == 0:
                raise ArmRefused(STAGE_COMPILE, PROGRAM_INVALID, f"circuits[{i}] ({name}) measures nothing: no "
                                 "classical bits")
            operations += unrolled_operations(qc, self.max_operations - operations)
            if operations > self.max_operations:
                raise ArmRefused(STAGE_COMPILE, INSTRUCTION_MEMORY_EXCEEDED,
                                 f"circuits[{i}] ({name}) takes the job past {self.max_operations} operations with "
                                 "its for loops unrolled, more than this QPU runs for one job (--max-operations); "
                                 "nothing was run")

    def run(self, job_id: int) -> dict[str, Any]:
        job = self.armed.pop(job_id)
        kw: dict[str, Any] = {"shots": job.shots, "memory": job.memory}
        if job.seed is not None:
            kw["seed_simulator"] = job.seed
        if job.noise is not None:
            kw["noise_model"] = job.noise
        started = time.time_ns()
        result = self._sim.run([qc for _, qc in job.circuits], **kw).result()
        ended = time.time_ns()
        if not result.success:
            return {"failed": f"qiskit-aer failed: {result.status}"}
        out = []
        for i, (name, _) in enumerate(job.circuits):
            r: dict[str, Any] = {"name": name, "shots": job.shots, "counts": dict(result.get_counts(i))}
            if job.memory:
                r["memory"] = result.get_memory(i)
            out.append(r)
        return {"results": out, "started_ns": started, "ended_ns": ended}


def serve(fd: int, opt: argparse.Namespace) -> int:
    """The process: answer each request the endpoint sends."""
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the endpoint stops it
    # Killed with the endpoint even in the middle of a job (PR_SET_PDEATHSIG);
    # an idle process also ends when the endpoint's end of the socket closes.
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
        head, _, payload = msg.partition(b"\n")
        req = json.loads(head)
        job = int(req["job"])
        reply: dict[str, Any]
        try:
            if req["op"] == "arm":
                reply = {"armed": ex.arm(job, payload, int(req["shots"]), req.get("noise"))}
            elif req["op"] == "run":
                reply = ex.run(job)
            else:
                ex.armed.pop(job, None)
                reply = {"dropped": True}
        except ArmRefused as e:
            reply = {"refused": [e.stage, e.reason, e.detail]}
        except KeyError:
            reply = {"failed": f"job {job} is not armed in the simulator"}
        except Exception as e:  # never take the process down for one job
            reply = {"failed": f"qpu-aer: {type(e).__name__}: {e}"}
        send_msg(sock, json.dumps(reply, separators=(",", ":")).encode())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="qpu-aer simulator")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--qubits", type=int, required=True)
    ap.add_argument("--max-shots", type=int, required=True)
    ap.add_argument("--max-operations", type=int, required=True)
    ap.add_argument("--seed", type=int)
    opt = ap.parse_args(argv)
    return serve(opt.fd, opt)


if __name__ == "__main__":
    sys.exit(main())
