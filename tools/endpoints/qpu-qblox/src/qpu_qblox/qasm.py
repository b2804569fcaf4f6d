"""OpenQASM 3 circuits (as qrtd's clients send them) into the device's
native operations: Rxy, Rz, CZ, Measure and Reset, the gate set the
calibration set's device configuration compiles.  Parsed by the reference
OpenQASM 3 parser (the `openqasm3` package); qblox-scheduler has no OpenQASM
frontend of its own.

What is taken: `include "stdgates.inc"`, qubit/qreg and bit/creg
declarations, physical qubits ($n), the standard gates listed in GATES (on
single qubits or broadcast over a register), measure (both spellings), reset
and barrier.  Gates run one after another in program order, so a barrier
holds by construction.  Anything else (gate definitions, classical control,
loops, other gates) is refused naming the line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import openqasm3
from openqasm3 import ast
from qrt_endpoint.handler import GATE_NOT_SUPPORTED, PROGRAM_INVALID, QUBIT_OUT_OF_RANGE, STAGE_COMPILE, STAGE_PARSE, ArmRefused


@dataclass(frozen=True)
class Op:
    """One native operation: kind is "Rxy" (theta, phi in degrees), "Rz"
    (theta), "CZ", "Measure" (clbit: the global classical bit written) or
    "Reset"."""

    kind: str
    qubits: tuple[int, ...]
    params: tuple[float, ...] = ()
    clbit: int = -1


@dataclass
class Circuit:
    ops: list[Op] = field(default_factory=list)
    # (register name, size) in declaration order, for Qiskit's count keys
    registers: list[tuple[str, int]] = field(default_factory=list)
    qubits_used: set[int] = field(default_factory=set)

    @property
    def num_clbits(self) -> int:
        return sum(n for _, n in self.registers)

    def count_key(self, bits: list[int]) -> str:
        """Qiskit's count key for these classical bit values (bit 0 of the
        first register rightmost, registers separated by a space, the last
        declared leftmost)."""
        out = []
        base = 0
        for _, n in self.registers:
            out.append("".join(str(bits[base + i]) for i in reversed(range(n))))
            base += n
        return " ".join(reversed(out))


def _deg(x: float) -> float:
    return math.degrees(x)


# name -> (number of parameters, number of qubits, decomposition)
def _h(q: int) -> list[Op]:
    return [Op("Rz", (q,), (180.0,)), Op("Rxy", (q,), (90.0, 90.0))]


def _u(q: int, th: float, ph: float, la: float) -> list[Op]:
    return [Op("Rz", (q,), (_deg(la),)), Op("Rxy", (q,), (_deg(th), 90.0)), Op("Rz", (q,), (_deg(ph),))]


GATES = {
    "id": (0, 1, lambda qs, a: []),
    "x": (0, 1, lambda qs, a: [Op("Rxy", qs, (180.0, 0.0))]),
    "y": (0, 1, lambda qs, a: [Op("Rxy", qs, (180.0, 90.0))]),
    "z": (0, 1, lambda qs, a: [Op("Rz", qs, (180.0,))]),
    "h": (0, 1, lambda qs, a: _h(qs[0])),
    "s": (0, 1, lambda qs, a: [Op("Rz", qs, (90.0,))]),
    "sdg": (0, 1, lambda qs, a: [Op("Rz", qs, (-90.0,))]),
    "t": (0, 1, lambda qs, a: [Op("Rz", qs, (45.0,))]),
    "tdg": (0, 1, lambda qs, a: [Op("Rz", qs, (-45.0,))]),
    "sx": (0, 1, lambda qs, a: [Op("Rxy", qs, (90.0, 0.0))]),
    "sxdg": (0, 1, lambda qs, a: [Op("Rxy", qs, (-90.0, 0.0))]),
    "rx": (1, 1, lambda qs, a: [Op("Rxy", qs, (_deg(a[0]), 0.0))]),
    "ry": (1, 1, lambda qs, a: [Op("Rxy", qs, (_deg(a[0]), 90.0))]),
    "rz": (1, 1, lambda qs, a: [Op("Rz", qs, (_deg(a[0]),))]),
    "p": (1, 1, lambda qs, a: [Op("Rz", qs, (_deg(a[0]),))]),
    "phase": (1, 1, lambda qs, a: [Op("Rz", qs, (_deg(a[0]),))]),
    "u1": (1, 1, lambda qs, a: [Op("Rz", qs, (_deg(a[0]),))]),
    "u": (3, 1, lambda qs, a: _u(qs[0], a[0], a[1], a[2])),
    "U": (3, 1, lambda qs, a: _u(qs[0], a[0], a[1], a[2])),
    "u3": (3, 1, lambda qs, a: _u(qs[0], a[0], a[1], a[2])),
    "cz": (0, 2, lambda qs, a: [Op("CZ", qs)]),
    "cx": (0, 2, lambda qs, a: [*_h(qs[1]), Op("CZ", qs), *_h(qs[1])]),
    "CX": (0, 2, lambda qs, a: [*_h(qs[1]), Op("CZ", qs), *_h(qs[1])]),
}

_CONST = {"pi": math.pi, "π": math.pi, "tau": 2 * math.pi, "τ": 2 * math.pi, "euler": math.e, "ℇ": math.e}


class _Reader:
    def __init__(self, device_qubits: int) -> None:
        self.device_qubits = device_qubits
        self.qregs: dict[str, tuple[int, int]] = {}   # name -> (first physical index, size)
        self.cregs: dict[str, tuple[int, int]] = {}   # name -> (first global clbit, size)
        self.next_qubit = 0
        self.c = Circuit()

    def refuse(self, node: ast.QASMNode, reason: str, what: str, stage: str = STAGE_COMPILE) -> ArmRefused:
        line = node.span.start_line if node.span is not None else 0
        return ArmRefused(stage, reason, f"line {line}: {what}")

    def value(self, e: ast.Expression) -> float:
        if isinstance(e, ast.IntegerLiteral | ast.FloatLiteral):
            return float(e.value)
        if isinstance(e, ast.Identifier) and e.name in _CONST:
            return _CONST[e.name]
        if isinstance(e, ast.UnaryExpression) and e.op.name == "-":
            return -self.value(e.expression)
        if isinstance(e, ast.BinaryExpression):
            a, b = self.value(e.lhs), self.value(e.rhs)
            op = e.op.name
            if op == "+":
                return a + b
            if op == "-":
                return a - b
            if op == "*":
                return a * b
            if op == "/" and b != 0:
                return a / b
        raise self.refuse(e, PROGRAM_INVALID, "only constant angle expressions of numbers and pi are taken")

    def index(self, e: Any) -> int:
        v = self.value(e)
        if v != int(v) or v < 0:
            raise self.refuse(e, PROGRAM_INVALID, f"index {v} is not a whole number")
        return int(v)

    def size(self, e: ast.Expression | None) -> int:
        return 1 if e is None else self.index(e)

    def qubits(self, ref: Any) -> list[int]:
        """The physical qubits `ref` names (a register broadcasts)."""
        if isinstance(ref, ast.Identifier):
            name = ref.name
            if name.startswith("$"):
                q = int(name[1:])
                return [self.check_qubit(ref, q)]
            if name not in self.qregs:
                raise self.refuse(ref, PROGRAM_INVALID, f"qubit {name} is not declared")
            base, n = self.qregs[name]
            return [base + i for i in range(n)]
        if isinstance(ref, ast.IndexedIdentifier):
            name = ref.name.name
            if name not in self.qregs:
                raise self.refuse(ref, PROGRAM_INVALID, f"qubit register {name} is not declared")
            base, n = self.qregs[name]
            if len(ref.indices) != 1 or not isinstance(ref.indices[0], list) or len(ref.indices[0]) != 1:
                raise self.refuse(ref, PROGRAM_INVALID, "only single indices into a register are taken")
            i = self.index(ref.indices[0][0])
            if i >= n:
                raise self.refuse(ref, QUBIT_OUT_OF_RANGE, f"{name}[{i}] is outside {name}[{n}]")
            return [base + i]
        raise self.refuse(ref, PROGRAM_INVALID, "unsupported qubit reference")

    def check_qubit(self, node: ast.QASMNode, q: int) -> int:
        if q >= self.device_qubits:
            raise self.refuse(node, QUBIT_OUT_OF_RANGE, f"physical qubit {q} is outside this device's "
                              f"{self.device_qubits} qubits (q0..q{self.device_qubits - 1})")
        return q

    def clbits(self, ref: Any) -> list[int]:
        if isinstance(ref, ast.Identifier) and ref.name in self.cregs:
            base, n = self.cregs[ref.name]
            return [base + i for i in range(n)]
        if isinstance(ref, ast.IndexedIdentifier) and ref.name.name in self.cregs:
            base, n = self.cregs[ref.name.name]
            if len(ref.indices) != 1 or not isinstance(ref.indices[0], list) or len(ref.indices[0]) != 1:
                raise self.refuse(ref, PROGRAM_INVALID, "only single indices into a bit register are taken")
            i = self.index(ref.indices[0][0])
            if i >= n:
                raise self.refuse(ref, PROGRAM_INVALID, f"{ref.name.name}[{i}] is outside {ref.name.name}[{n}]")
            return [base + i]
        raise self.refuse(ref, PROGRAM_INVALID, "measurement target is not a declared bit")

    def use(self, node: ast.QASMNode, qs: list[int]) -> None:
        for q in qs:
            self.check_qubit(node, q)
            self.c.qubits_used.add(q)

    def statement(self, s: Any) -> None:
        if isinstance(s, ast.Include):
            if s.filename != "stdgates.inc":
                raise self.refuse(s, PROGRAM_INVALID, f'only "stdgates.inc" may be included, not "{s.filename}"', STAGE_PARSE)
        elif isinstance(s, ast.QubitDeclaration):
            n = self.size(s.size)
            self.qregs[s.qubit.name] = (self.next_qubit, n)
            self.next_qubit += n
            if self.next_qubit > self.device_qubits:
                raise self.refuse(s, QUBIT_OUT_OF_RANGE,
                                  f"{self.next_qubit} qubits declared; this device has {self.device_qubits}")
        elif isinstance(s, ast.ClassicalDeclaration) and isinstance(s.type, ast.BitType) and s.init_expression is None:
            n = self.size(s.type.size)
            self.cregs[s.identifier.name] = (self.c.num_clbits, n)
            self.c.registers.append((s.identifier.name, n))
        elif isinstance(s, ast.QuantumGate):
            name = s.name.name
            if s.modifiers or name not in GATES:
                raise self.refuse(s, GATE_NOT_SUPPORTED,
                                  f"gate {'modified ' if s.modifiers else ''}{name} is not one this device runs "
                                  f"(it takes {', '.join(sorted(GATES))})")
            nparams, nqubits, decompose = GATES[name]
            if len(s.arguments) != nparams or len(s.qubits) != nqubits:
                raise self.refuse(s, PROGRAM_INVALID, f"{name} takes {nparams} parameters and {nqubits} qubits")
            args = [self.value(a) for a in s.arguments]
            refs = [self.qubits(q) for q in s.qubits]
            width = max(len(r) for r in refs)
            for i in range(width):
                qs = [r[i] if len(r) > 1 else r[0] for r in refs]
                if len(set(qs)) != len(qs):
                    raise self.refuse(s, PROGRAM_INVALID, f"{name} on the same qubit twice")
                self.use(s, qs)
                self.c.ops.extend(decompose(tuple(qs), args))
        elif isinstance(s, ast.QuantumMeasurementStatement):
            qs = self.qubits(s.measure.qubit)
            if s.target is None:
                raise self.refuse(s, PROGRAM_INVALID, "a measurement must write a bit")
            cs = self.clbits(s.target)
            if len(qs) != len(cs):
                raise self.refuse(s, PROGRAM_INVALID, f"measuring {len(qs)} qubits into {len(cs)} bits")
            self.use(s, qs)
            self.c.ops.extend(Op("Measure", (q,), (), c) for q, c in zip(qs, cs, strict=True))
        elif isinstance(s, ast.QuantumReset):
            qs = self.qubits(s.qubits)
            self.use(s, qs)
            self.c.ops.extend(Op("Reset", (q,)) for q in qs)
        elif isinstance(s, ast.QuantumBarrier):
            for ref in s.qubits:
                self.use(s, self.qubits(ref))
        else:
            raise self.refuse(s, GATE_NOT_SUPPORTED, f"{type(s).__name__} is not taken (straight-line circuits only)")


def read(text: str, device_qubits: int) -> Circuit:
    """The circuit `text` in native operations, or ArmRefused naming the
    line: program_invalid (parse), gate_not_supported, qubit_out_of_range
    (compile)."""
    try:
        program = openqasm3.parse(text)
    except Exception as e:  # the parser's errors are of several types
        raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, f"not OpenQASM 3: {e}") from None
    r = _Reader(device_qubits)
    for s in program.statements:
        r.statement(s)
    if not any(op.kind == "Measure" for op in r.c.ops):
        raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, "the circuit measures nothing")
    return r.c
