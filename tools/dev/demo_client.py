#!/usr/bin/env python3
"""The quick start's scheduler client: places and submits jobs on a running
qrtd across several calibration windows, waits until every job is terminal,
and prints the outcomes.  Standard library only (tools/clients/python/src/qrt_client/__init__.py).

    demo_client.py --socket /run/qrtd/qrtd.sock --jobs 300 --spacing-ms 5

Like a real scheduler it reads the QPU's calibration windows first
(calibration.get) and asks for starts (not_before_ns) that keep a margin
from each window's edges, then submits one-shot jobs (jobs.submit: place +
commit), pipelined.  The agent picks the slot; the client never sends a
job itself.  Exit status 0 when every job reached a terminal state.

The functions are imported by tests/integration/e2e as well.
"""

import argparse
import base64
import collections
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python", "src"))
import qrt_client
from qrt_client.protocol import TERMINAL_STATES as TERMINAL


def plan_starts(windows, count, first_ns, spacing_ns, duration_ns, margin_ns):
    """Up to `count` start times from first_ns on, spacing_ns apart, each
    inside a window with margin_ns to spare at both ends."""
    out: list[int] = []
    t = first_ns
    ws = sorted(windows, key=lambda w: w["valid_from_ns"])
    for w in ws:
        lo = max(t, w["valid_from_ns"] + margin_ns)
        hi = w["valid_until_ns"] - margin_ns - duration_ns
        while lo <= hi and len(out) < count:
            out.append(lo)
            lo += spacing_ns
        t = max(t, lo)
        if len(out) >= count:
            break
    return out


def submit_jobs(client, qpu, starts, duration_ns, key_prefix, shots=100, batch=50):
    """jobs.submit for each start (pipelined in batches).  Returns the
    acknowledged job records and the errors."""
    acked: list[dict] = []
    errors: list[Exception] = []
    for i in range(0, len(starts), batch):
        calls = []
        for k, t in enumerate(starts[i:i + batch]):
            payload = json.dumps({"shots": shots, "program": "h q[0]; cx q[0], q[1]; measure"})
            calls.append(("jobs.submit", {
                "duration_ns": duration_ns, "not_before_ns": t, "qpus": [qpu],
                "idempotency_key": f"{key_prefix}-{i + k}",
                "payload": base64.b64encode(payload.encode()).decode()}))
        for r in client.call_many(calls):
            (errors if isinstance(r, Exception) else acked).append(r)
    return acked, errors


def statuses(client, ids, batch=100):
    out = {}
    ids = list(ids)
    for i in range(0, len(ids), batch):
        res = client.call_many([("jobs.status", {"job_id": j}) for j in ids[i:i + batch]])
        for j, r in zip(ids[i:i + batch], res):
            out[j] = r
    return out


def wait_terminal(client, ids, timeout_s):
    """Poll jobs.status until every id is terminal (or the timeout).  Asks
    again only for the jobs not terminal yet, and backs off when the agent
    says the tenant's request rate is used up (quota_exceeded: every line
    counts against it), as a well-behaved client does."""
    give_up = time.monotonic() + timeout_s
    st = {}
    pending = list(ids)
    while True:
        for j, s in statuses(client, pending).items():
            st[j] = s
        throttled = any(isinstance(s, Exception) and "quota_exceeded" in str(s) for s in st.values())
        pending = [j for j in ids
                   if isinstance(st.get(j), Exception) or st.get(j, {}).get("state") not in TERMINAL]
        if not pending or time.monotonic() > give_up:
            return {j: st[j] for j in ids}
        time.sleep(1.0 if throttled else 0.2)


def histogram(snapshot, name, qpu=None):
    for h in snapshot.get("histograms", []):
        if h.get("name") == name and (qpu is None or h.get("labels", {}).get("qpu") == qpu):
            return h
    return None


def held_up(snapshot, qpu, tolerance_ns):
    """How many times the dispatch thread of qpu measured itself held up
    beyond tolerance_ns: timer wake-ups later than it, plus sends later than
    it after their start (counted from the histograms' buckets, so a sample
    between the last bound below tolerance_ns and tolerance_ns counts too).
    A job missed by a host that stalls the thread (a hypervisor, a busy
    neighbour) shows here; a miss that this does not account for is the
    agent's."""
    n = 0
    for name in ("qrt_dispatch_wakeup_latency_seconds", "qrt_dispatch_lateness_seconds"):
        h = histogram(snapshot, name, qpu)
        if not h:
            continue
        below = max((b["count"] for b in h.get("buckets", []) if b["le_ns"] <= tolerance_ns), default=0)
        n += h.get("count", 0) - below
    return n


def us(ns):
    return f"{ns / 1000.0:.1f} us"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", default=os.environ.get("QRT_SOCKET", qrt_client.DEFAULT_SOCKET))
    ap.add_argument("--qpu", default="qpu0")
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--spacing-ms", type=float, default=20.0)
    ap.add_argument("--duration-us", type=int, default=200)
    ap.add_argument("--margin-ms", type=float, default=2.0)
    ap.add_argument("--lead-in-ms", type=float, default=0.0,
                    help="first start this long after now (default 1 s + 8 ms per job: "
                         "each submit is one fsync of the ledger)")
    ap.add_argument("--connect-timeout-s", type=float, default=10.0)
    ap.add_argument("--json", action="store_true", help="also print one JSON summary line")
    a = ap.parse_args()

    give_up = time.monotonic() + a.connect_timeout_s
    while True:
        try:
            c = qrt_client.Client(a.socket, timeout=30.0)
            c.hello("demo_client.py")
            break
        except qrt_client.QrtError as e:
            if time.monotonic() > give_up:
                print(f"[client] {e}", file=sys.stderr)
                return 2
            time.sleep(0.1)

    duration_ns = a.duration_us * 1000
    spacing_ns = int(a.spacing_ms * 1e6)
    windows = c.calibration_get(a.qpu)
    lead_in_ms = a.lead_in_ms or 1000.0 + 8.0 * a.jobs
    first = time.time_ns() + int(lead_in_ms * 1e6)
    starts = plan_starts(windows, a.jobs, first, spacing_ns, duration_ns, int(a.margin_ms * 1e6))
    span_windows = {w["calibration_id"] for w in windows
                    for t in starts if w["valid_from_ns"] <= t < w["valid_until_ns"]}
    print(f"[client] {len(starts)} jobs of {a.duration_us} us on {a.qpu}, {a.spacing_ms} ms apart, "
          f"across {len(span_windows)} calibration windows")
    t0 = time.monotonic()
    acked, errors = submit_jobs(c, a.qpu, starts, duration_ns, f"demo-{os.getpid()}-{first}")
    print(f"[client] submitted: {len(acked)} acknowledged, {len(errors)} refused "
          f"in {time.monotonic() - t0:.2f} s")
    for refused in errors[:3]:
        print(f"[client]   refused: {refused}")
    ids = [r["job_id"] for r in acked]
    last_end = max((r["end_ns"] for r in acked), default=time.time_ns())
    wait_s = max(0.0, (last_end - time.time_ns()) / 1e9) + 5.0
    st = wait_terminal(c, ids, wait_s)
    states = collections.Counter(s.get("state") if isinstance(s, dict) else "error" for s in st.values())
    reasons = collections.Counter((s.get("reason") or "").split(":")[0]
                                  for s in st.values()
                                  if isinstance(s, dict) and s.get("state") != "completed")
    print("[client] outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
    for r, n in reasons.most_common(5):
        print(f"[client]   not completed: {n} x {r or '(no reason)'}")
    snap = c.telemetry()
    h = histogram(snap, "qrt_dispatch_lateness_seconds", a.qpu)
    if h:
        print(f"[client] dispatch lateness ({h['count']} sent): p50 {us(h['p50_ns'])}, "
              f"p95 {us(h['p95_ns'])}, p99 {us(h['p99_ns'])}, max {us(h['max_ns'])}")
    arr = histogram(snap, "qrt_dispatch_arrival_lateness_seconds", a.qpu)
    if arr:
        print(f"[client] arrival lateness at the QPU: p50 {us(arr['p50_ns'])}, "
              f"p99 {us(arr['p99_ns'])}, max {us(arr['max_ns'])}")
    not_terminal = sum(1 for s in st.values() if not isinstance(s, dict) or s.get("state") not in TERMINAL)
    if a.json:
        lateness = {k: v for k, v in (h or {}).items() if k.endswith("_ns") or k == "count"}
        print(json.dumps({"jobs": len(starts), "acknowledged": len(acked), "refused": len(errors),
                          "states": states, "not_terminal": not_terminal,
                          "dispatch_lateness": lateness, "windows": len(span_windows)}, default=str))
    return 0 if not_terminal == 0 and acked else 1


if __name__ == "__main__":
    sys.exit(main())
