#!/usr/bin/env python3
"""The control stacks' own costs, measured in the endpoint process over the
wire (version 2, as qrtd will speak it): qpu-qblox on the dummy Cluster or
qpu-labone on LabOne Q's emulator, started as programs, driven by
qrt_endpoint.testing.Agent on a UNIX socket.

  - ARM cost by stage (compile, upload, arm: the ARMED payload's own
    figures) for 1, 10 and 100 Bell circuits per job (median of 3 jobs, 1
    for 100);
  - FIRE received -> start command issued, p50 and p99 over --fires jobs:
    the RESULT's started_ns (stamped by the stack as it issues the start:
    qpu-qblox before start_sequencer(), qpu-labone before the controller's
    start trigger) less its arrival_ns (stamped by the framework when the
    FIRE's 128 bytes are read);
  - the reference, from the same run: the framework's own part of that
    path (its summary's fire_read_to_handler_ns: FIRE read -> the stack's
    fire() called), and the ratio.

Run with the stack's venv's python:
    build/venv-qblox/bin/python bench/endpoints/bench_stacks.py qblox [--fires 200]
    build/venv-labone/bin/python bench/endpoints/bench_stacks.py labone [--fires 200]
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from qrt_endpoint.testing import Agent, T, job_fields

BELL = ('OPENQASM 3.0;\ninclude "stdgates.inc";\nbit[2] c;\nqubit[2] q;\nh q[0];\ncx q[0], q[1];\n'
        'c[0] = measure q[0];\nc[1] = measure q[1];\n')


def envelope(n: int, shots: int) -> bytes:
    return json.dumps({"format": "qasm3", "shots": shots,
                       "circuits": [{"name": f"bell{i}", "qubits": 2, "qasm": BELL} for i in range(n)]}).encode()


def pct(xs: list[int], p: float) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stack", choices=("qblox", "labone"))
    ap.add_argument("--fires", type=int, default=200)
    ap.add_argument("--shots", type=int, default=10)
    opt = ap.parse_args()
    root = tempfile.mkdtemp(prefix=f"bench-{opt.stack}-")
    sock, summary = os.path.join(root, "q.sock"), os.path.join(root, "summary.json")
    if opt.stack == "qblox":
        from qpu_qblox import calibration as qcal
        qcal.write_set(root, "qpu0", 1, qcal.example_device(), qcal.example_hardware())
        where = ["--dummy", ",".join(f"{s}:{t}" for s, t in qcal.EXAMPLE_MODULES.items())]
    else:
        from qpu_labone import calibration as lcal
        lcal.write_set(root, "qpu0", 1, lcal.example()[0])
        where = ["--emulate"]
    log = open(os.path.join(root, "endpoint.log"), "w")
    p = subprocess.Popen([sys.executable, "-m", f"qpu_{opt.stack}.main", "--listen", "unix://" + sock, "--qpu",
                          "qpu0", "--calibration-dir", root, "--summary-file", summary, "--horizon-s", "3600", *where],
                         cwd=root, stdout=log, stderr=subprocess.STDOUT,
                         env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))
    try:
        give_up = time.monotonic() + 300
        while not os.path.exists(sock):
            if p.poll() is not None or time.monotonic() > give_up:
                raise SystemExit(f"the endpoint did not listen: {open(log.name).read()[-2000:]}")
            time.sleep(0.1)
        a = Agent(sock)
        a.control.s.settimeout(600)
        job = 0

        def one(n: int, ahead_ns: int) -> tuple[dict[str, int], dict[str, int]]:
            nonlocal job
            job += 1
            # fire_at ahead_ns ahead, its window open from now: FIRE is sent
            # as soon as ARMED is read
            f = job_fields(job, ahead_ns=ahead_ns, duration_ns=10**12, shots=opt.shots)
            f["window_start_ns"] = time.time_ns() - 10**9
            a.arm(f, envelope(n, opt.shots))
            h, body = a.read()
            if h["type"] != T.ARMED:
                raise SystemExit(f"job {job}: not ARMED: {body[:500]!r}")
            stages = {s["name"]: s["ns"] for s in json.loads(body)["stages"]}
            a.do_fire(f)
            h, body = a.read()
            if h["type"] != T.RESULT:
                raise SystemExit(f"job {job}: not RESULT: {body[:500]!r}")
            return stages, h

        one(1, 1200 * 10**9)   # warm-up: lazy imports, the first compilation
        arm_ms: dict[str, dict[str, float]] = {}
        for n in (1, 10, 100):
            runs = [one(n, 1200 * 10**9)[0] for _ in range(3 if n < 100 else 1)]
            arm_ms[str(n)] = {k: round(statistics.median(r[k] for r in runs) / 1e6, 3) for k in runs[0]}
        to_start = []
        for _ in range(opt.fires):
            _, h = one(1, 1200 * 10**9)
            to_start.append(h["started_ns"] - h["arrival_ns"])
        a.close()
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.close()
    with open(summary) as f:
        s = json.load(f)
    ref = s["fire_read_to_handler_ns"]
    out = {"bench": "endpoint_stack", "stack": f"qpu-{opt.stack}", "arm_ms_by_circuits": arm_ms,
           "fire_received_to_start_command_us": {"p50": pct(to_start, 0.5) / 1e3, "p99": pct(to_start, 0.99) / 1e3,
                                                 "n": len(to_start)},
           "framework_fire_read_to_handler_us": {"p50": ref.get("p50", 0) / 1e3, "p99": ref.get("p99", 0) / 1e3},
           "gc": s.get("gc")}
    if ref.get("p50"):
        out["ratio_p50_to_framework"] = round(pct(to_start, 0.5) / ref["p50"], 2)
    for n, st in arm_ms.items():
        print(f"qpu-{opt.stack}: ARM of {n:>3} circuit(s): " + ", ".join(f"{k} {v:.1f} ms" for k, v in st.items()))
    f50, f99 = out["fire_received_to_start_command_us"]["p50"], out["fire_received_to_start_command_us"]["p99"]
    print(f"qpu-{opt.stack}: FIRE received -> start command issued: p50 {f50:.1f} us, p99 {f99:.1f} us "
          f"({len(to_start)} FIREs; the framework's own part p50 {out['framework_fire_read_to_handler_us']['p50']:.1f} us)")
    print(json.dumps(out))
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
