"""qrtd's job envelope (qrtd(8), "Job payloads"; the table's [envelope])
as the endpoints read it, and the answer envelope they return."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from qrt_client import protocol as P

from .handler import PROGRAM_INVALID, STAGE_PARSE, ArmRefused

MAX_NAME = 128


@dataclass(frozen=True)
class Circuit:
    name: str
    qubits: int
    qasm: str


@dataclass(frozen=True)
class Envelope:
    fmt: str
    shots: int
    circuits: list[Circuit]
    raw: dict[str, Any]


def parse(program: bytes, wire_shots: int) -> Envelope:
    """The envelope in `program`, or ArmRefused(parse, program_invalid)
    naming what is wrong.  A native (precompiled) envelope keeps its other
    fields in `raw` for the stack to read."""

    def refuse(detail: str) -> ArmRefused:
        return ArmRefused(STAGE_PARSE, PROGRAM_INVALID, detail)

    try:
        env = json.loads(program.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise refuse(f"payload is not UTF-8 (byte {e.start})") from None
    except ValueError as e:
        raise refuse(f"payload is not a JSON envelope: {e}") from None
    if not isinstance(env, dict) or not isinstance(env.get("format"), str):
        raise refuse('payload: no "format" (see qrtd(8), Job payloads)')
    shots = env.get("shots")
    if not isinstance(shots, int) or isinstance(shots, bool) or shots < 1:
        raise refuse(f"payload: shots = {shots!r} is not an integer of 1 or more")
    if wire_shots and wire_shots != shots:
        raise refuse(f"payload: shots = {shots} but the job says {wire_shots}")
    circuits: list[Circuit] = []
    if env["format"] == P.ENVELOPE_FORMAT:
        raw = env.get("circuits")
        if not isinstance(raw, list) or not raw or len(raw) > P.ENVELOPE_MAX_CIRCUITS:
            raise refuse(f"payload: circuits must be an array of 1..{P.ENVELOPE_MAX_CIRCUITS} circuits")
        for i, c in enumerate(raw):
            if not isinstance(c, dict) or not isinstance(c.get("qasm"), str):
                raise refuse(f"payload: circuits[{i}] has no qasm string")
            qubits = c.get("qubits", 0)
            if not isinstance(qubits, int) or isinstance(qubits, bool) or qubits < 0:
                raise refuse(f"payload: circuits[{i}].qubits = {qubits!r} is not a count")
            circuits.append(Circuit(str(c.get("name", f"circuit-{i}"))[:MAX_NAME], qubits, c["qasm"]))
    return Envelope(env["format"], shots, circuits, env)


def counts_answer(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": P.ENVELOPE_RESULT_FORMAT, "results": results}
