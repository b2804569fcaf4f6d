"""Micro-benchmark of the LabOne Q stack on its emulator: the arm cost by
stage for 1, 10 and 100 Bell circuits per job, and the FIRE path (the call
to fire() -> the controller released towards its start trigger), p50 and
p99.  Prints one JSON object.  (It moves under bench/ with the endpoint
framework.)"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import tempfile
import time
from typing import Any

from qrt_endpoint.handler import ArmRequest

from .calibration import CalibrationStore, example, write_set
from .stack import LabOneStack

BELL = ('OPENQASM 3.0;\ninclude "stdgates.inc";\nbit[2] c;\nqubit[2] q;\nh q[0];\ncx q[0], q[1];\n'
        'c[0] = measure q[0];\nc[1] = measure q[1];\n')


def _req(job: int, circuits: int, shots: int) -> ArmRequest:
    env = {"format": "qasm3", "shots": shots,
           "circuits": [{"name": f"bell{i}", "qubits": 2, "qasm": BELL} for i in range(circuits)]}
    return ArmRequest(job, 1, time.time_ns() + 10**9, 0, 2**62, 10**12, shots, 10**6, json.dumps(env).encode())


def _pct(xs: list[int], p: float) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))]


def main(argv: list[str] | None = None) -> int:
    from laboneq.simple import Session

    logging.disable(logging.WARNING)
    fires = int((argv or sys.argv[1:] or ["50"])[0])
    root = tempfile.mkdtemp(prefix="qpu-labone-bench.")
    qpu, setup = example()
    write_set(root, "qpu0", 1, qpu)
    session = Session(setup, log_level=logging.WARNING)
    session.connect(do_emulation=True)
    stack = LabOneStack(session, CalibrationStore(root, "qpu0"))
    out: dict[str, Any] = {"stack": "qpu-labone", "arm_ms": {}}
    job = 0
    stack.arm(_req(job, 1, 10))
    stack.fire(job)
    stack.collect(job)
    for n in (1, 10, 100):
        runs = []
        for _ in range(3 if n < 100 else 1):
            job += 1
            a = stack.arm(_req(job, n, 10))
            runs.append(dict(a.stages))
            stack.fire(job)
            stack.collect(job)
        out["arm_ms"][str(n)] = {k: round(statistics.median(r[k] for r in runs) / 1e6, 3) for k in runs[0]}
    to_release = []
    for _ in range(fires):
        job += 1
        stack.arm(_req(job, 1, 10))
        t0 = time.perf_counter_ns()
        stack.fire(job)
        to_release.append(time.perf_counter_ns() - t0)
        stack.collect(job)
    out["fire_to_release_us"] = {"p50": _pct(to_release, 0.5) / 1e3, "p99": _pct(to_release, 0.99) / 1e3,
                                 "n": fires}
    session.disconnect()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
