#!/usr/bin/env python3
"""The job's side of spank_qrt, in Python (standard library + qrt_client).

Run as a task of a Slurm step given --qpu-duration: spank_qrt reserved the
slot before the task started and exported QRT_SOCKET, QRT_RESERVATION_ID
(comma-separated: one per QPU of a --qpu-count gang), QRT_FENCING_TOKEN,
QRT_SLOT_START_NS, QRT_SLOT_END_NS and QRT_QPUS.

It commits the payload into the reservation with jobs.submit (one submit
commits every member of a gang), waits for each member's job.finished
event, and prints the results, one JSON line per member.  The payload must
be in before QRT_SLOT_START_NS (less the dispatcher's lead); a late submit
is refused with reason lease_expired, and after QRT_SUBMIT_BY_NS it may end
`missed` (see spank_qrt(8)).

    python3 job_example.py [--payload TEXT] [--timeout-s N]

qrt_client is installed in /usr/share/qrtd/python/qrt-client/src (PYTHONPATH).
Exit 0 when every member completed, else the qrtctl status of the reason.
"""

import argparse
import json
import os
import sys
import time

for _p in (os.environ.get("QRT_PYTHON_DIR", ""), "/usr/share/qrtd/python/qrt-client/src",
           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src")):
    if _p and os.path.isfile(os.path.join(_p, "qrt_client", "__init__.py")):
        sys.path.insert(0, _p)
        break
import qrt_client


def qrt_env():
    """The step's reservation, from the QRT_* environment spank_qrt set."""
    missing = [v for v in ("QRT_SOCKET", "QRT_RESERVATION_ID", "QRT_FENCING_TOKEN",
                           "QRT_SLOT_START_NS", "QRT_QPUS") if not os.environ.get(v)]
    if missing:
        raise SystemExit(f"job_example.py: {', '.join(missing)} not set: run me as a task of "
                         "a step given --qpu-duration (spank_qrt)")
    return {
        "socket": os.environ["QRT_SOCKET"],
        "ids": [int(x) for x in os.environ["QRT_RESERVATION_ID"].split(",")],
        "qpus": os.environ["QRT_QPUS"].split(","),
        "token": int(os.environ["QRT_FENCING_TOKEN"]),
        "start_ns": int(os.environ["QRT_SLOT_START_NS"]),
    }


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payload", default="H 0; CX 0 1; MEASURE")
    ap.add_argument("--timeout-s", type=float, default=60.0)
    args = ap.parse_args(argv)
    env = qrt_env()
    try:
        with qrt_client.Client(env["socket"], timeout=10) as c:
            c.subscribe(["job.finished"])  # before submitting: no event slips past
            by = int(os.environ.get("QRT_SUBMIT_BY_NS", "0") or 0)
            if by and time.time_ns() > by:
                print("job_example.py: submitting after QRT_SUBMIT_BY_NS: the job may end "
                      "missed (see spank_qrt(8))", file=sys.stderr)
            c.jobs_submit(args.payload.encode(), reservation_id=env["ids"][0],
                          fencing_token=env["token"])
            print(f"qrt-job: committed {env['ids']} for start_ns {env['start_ns']} "
                  f"(in {(env['start_ns'] - time.time_ns()) / 1e9:.3f} s)", flush=True)
            pending = set(env["ids"])
            give_up = time.monotonic() + args.timeout_s
            while pending and time.monotonic() < give_up:
                ev = c.next_event(timeout=1.0)
                if ev is not None:
                    pending.discard(ev.get("data", {}).get("reservation_id"))
            status = 0
            for rid, qpu in zip(env["ids"], env["qpus"]):
                st = c.jobs_status(rid)
                out = {"reservation_id": rid, "qpu": qpu, "state": st["state"],
                       "start_ns": st["start_ns"], "reason": st.get("reason", "")}
                if st.get("has_result"):
                    out["result"] = c.jobs_result(rid)["result"].decode(errors="replace")
                if st["state"] != "completed":
                    status = qrt_client.exit_code_for_reason(st["state"]) or 1
                print(json.dumps(out), flush=True)
            return status
    except qrt_client.QrtError as e:
        print(f"job_example.py: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
