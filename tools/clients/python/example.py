#!/usr/bin/env python3
"""qrt_client usage example: what a Python scheduler tool does with qrtd.

  1. say hello (API version, our roles);
  2. ask for candidate slots starting at least --lead-s from now;
  3. reserve one under an idempotency key (retry-safe);
  4. submit a payload into it with the fencing token;
  5. read the job's status back, and show the events our calls caused.

Errors print the agent's stable reason and exit with qrtctl's status for it.

  python3 example.py --socket /run/qrtd/qrtd.sock --qpu qpu0 --duration-ns 2000000
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))
from qrt_client import Client, QrtError


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", help="agent socket (default $QRT_SOCKET or /run/qrtd/qrtd.sock)")
    ap.add_argument("--qpu", action="append", help="restrict to this QPU (repeatable)")
    ap.add_argument("--duration-ns", type=int, default=1_000_000)
    ap.add_argument("--lead-s", type=float, default=1.0,
                    help="the slot starts at least this long from now")
    ap.add_argument("--key", default=f"example-py-{os.getpid()}", help="idempotency key")
    ap.add_argument("--payload", default="example payload")
    args = ap.parse_args()

    try:
        with Client(args.socket) as c:
            hello = c.hello()
            print(f"hello agent={hello['agent']} version={hello['agent_version']} "
                  f"api={hello['api_version']} roles={','.join(hello['peer']['roles'])}")

            c.subscribe(["reservation.reserved", "reservation.committed"])

            not_before = time.time_ns() + int(args.lead_s * 1e9)
            q = c.slots_query(duration_ns=args.duration_ns, qpus=args.qpu,
                              not_before_ns=not_before)
            for cand in q["candidates"]:
                print(f"candidate qpu={cand['qpu']} start_ns={cand['start_ns']} "
                      f"fidelity={cand['predicted_fidelity']:.3f}")
            if not q["candidates"]:
                print(f"no slot fits: {q.get('why_none', '')}")

            r = c.slots_reserve(duration_ns=args.duration_ns, qpus=args.qpu,
                                idempotency_key=args.key, not_before_ns=not_before)
            print(f"reserved id={r['reservation_id']} token={r['fencing_token']} "
                  f"qpu={r['qpu']} start_ns={r['start_ns']}")

            job = c.jobs_submit(args.payload.encode(), reservation_id=r["reservation_id"],
                                fencing_token=r["fencing_token"])
            print(f"submitted job={job['job_id']} state={job['state']}")
            st = c.jobs_status(job["job_id"])
            print(f"status job={st['job_id']} state={st['state']}")

            for ev in c.events(timeout=0.5):
                print(f"event seq={ev['seq']} type={ev['type']} "
                      f"reservation={ev['data'].get('reservation_id')}")
    except QrtError as e:
        print(f"example.py: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
