"""Micro-benchmark of the Qblox stack on the dummy Cluster: the arm cost
by stage for 1, 10 and 100 Bell circuits per job, and the FIRE path (the
call to fire() -> the driver's start command issued), p50 and p99.
Prints one JSON object.  (It moves under bench/ with the endpoint
framework.)"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from qrt_endpoint.handler import ArmRequest

from . import calibration, dummy
from .stack import QbloxStack

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
    fires = int((argv or sys.argv[1:] or ["50"])[0])
    root = tempfile.mkdtemp(prefix="qpu-qblox-bench.")
    os.chdir(root)
    calibration.write_set(root, "qpu0", 1, calibration.example_device(), calibration.example_hardware())
    stack = QbloxStack(dummy.dummy_cluster("cluster0", calibration.EXAMPLE_MODULES),
                       calibration.CalibrationStore(root, "qpu0"))
    out: dict[str, Any] = {"stack": "qpu-qblox", "assembler": dummy.ASSEMBLER, "arm_ms": {}}
    job = 0
    stack.arm(_req(job, 1, 10))  # warm-up: lazy imports, the first compilation
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
    real_start = stack._start
    issued: list[int] = []

    def stamped() -> None:
        issued.append(time.perf_counter_ns())
        real_start()

    stack._start = stamped
    to_cmd, whole = [], []
    for _ in range(fires):
        job += 1
        stack.arm(_req(job, 1, 10))
        t0 = time.perf_counter_ns()
        stack.fire(job)
        t1 = time.perf_counter_ns()
        to_cmd.append(issued[-1] - t0)
        whole.append(t1 - t0)
        stack.collect(job)
    out["fire_to_start_command_us"] = {"p50": _pct(to_cmd, 0.5) / 1e3, "p99": _pct(to_cmd, 0.99) / 1e3, "n": fires}
    out["fire_call_with_dummy_start_us"] = {"p50": _pct(whole, 0.5) / 1e3, "p99": _pct(whole, 0.99) / 1e3}
    stack.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
