#!/usr/bin/env python3
"""A calibration update racing the send, counted job by job at qpu-sim.

calibration.update goes through the same gate as a cancel: a job whose
frame is already going out stays where it is and is sent under the
calibration it was placed in; every other job is re-placed into the new
window and sent there.  Never both, never neither.

Each round places one job at the minimum lead plus a little, sleeps until
a moment swept from 3 ms before its start to 0.3 ms after it (the Python
sleep adds the host's own noise), and pushes a new window (a new
calibration id) that starts 60 ms after the job's start, so a job that is
not yet out must move.  Then, for every acknowledged job:

  * qpu-sim received it exactly once (its --arrivals-file);
  * it completed, and the calibration id qrtd records is the one whose
    frame reached qpu-sim;
  * sent in place: the old id, at its first start; re-placed: the new id,
    at or after the new window's start;
  * nothing arrived out of its window.

Behaviour only, never timings.  Environment as for test_e2e.py.
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_e2e as base  # noqa: E402
from test_e2e import demo_client, wait_for  # noqa: E402

MS = 1_000_000
DURATION = 200_000
ROUNDS = 40
PAYLOAD = b'{"shots": 10}'


class CalibrationRace(base.E2E):
    test_500_jobs_then_kill9_and_restart = None
    test_pushed_calibration_reaches_the_dispatch_guard = None

    def test_pushed_calibration_racing_the_send_is_either_sent_in_place_or_re_placed_never_both(self):
        c = self.start_qrtd()
        self.require_tuned(c)
        self.assertTrue(wait_for(lambda: self.endpoint_up(c), 10), "endpoint never up")
        lead = c.status()["dispatch"]["min_lead_ns"]
        now = time.time_ns()
        cal = 1000
        c.calibration_update("qpu1", [{"calibration_id": cal, "valid_from_ns": now + 50 * MS,
                                       "valid_until_ns": now + 300_000 * MS}])
        time.sleep(0.06)
        jobs = {}  # job_id -> (first start, old id, new window start, new id)
        for r in range(ROUNDS):
            first = time.time_ns() + lead + 100 * MS
            rep = c.jobs_submit(PAYLOAD, duration_ns=DURATION, idempotency_key=f"race-{r}",
                                qpus=["qpu1"], not_before_ns=first)
            self.assertEqual(rep["calibration_id"], cal, rep)
            start = rep["start_ns"]
            # From 3 ms before the start to 0.3 ms after it.
            at = start - 3 * MS + (r * 3300 * 1000) // (ROUNDS - 1)
            time.sleep(max(0.0, (at - time.time_ns()) / 1e9))
            new_from = start + 60 * MS
            c.calibration_update("qpu1", [{"calibration_id": cal + 1, "valid_from_ns": new_from,
                                           "valid_until_ns": new_from + 300_000 * MS}])
            jobs[rep["job_id"]] = (start, cal, new_from, cal + 1)
            cal += 1
            # The next round starts after this job's last possible start.
            time.sleep(max(0.0, (new_from + 5 * MS - time.time_ns()) / 1e9))

        st = demo_client.wait_terminal(c, list(jobs), 30)
        c.close()
        self.qrtd.send_signal(base.signal.SIGTERM)
        self.assertEqual(self.qrtd.wait(20), 0, self.log_tail())
        summary = self.stop_sim()
        arrived = {}
        for a in self.arrived():
            arrived.setdefault(a["job_id"], []).append(a)

        in_place = moved = 0
        for j, (start, old, new_from, new) in jobs.items():
            s = st[j]
            self.assertIsInstance(s, dict, s)
            self.assertEqual(s["state"], "completed", f"job {j}: {s}\n{self.outcomes(st)}")
            got = arrived.get(j, [])
            self.assertEqual(len(got), 1, f"job {j} reached qpu-sim {len(got)} times: {got}")
            self.assertEqual(got[0]["calibration_id"], s["calibration_id"],
                             f"job {j}: qrtd records calibration {s['calibration_id']}, the frame carried "
                             f"{got[0]['calibration_id']}")
            if s["calibration_id"] == old:
                self.assertEqual(s["start_ns"], start, s)
                in_place += 1
            else:
                self.assertEqual(s["calibration_id"], new, s)
                self.assertGreaterEqual(s["start_ns"], new_from, s)
                moved += 1
        self.assertEqual(summary["out_of_window"], 0, summary)
        self.assertEqual(summary["jobs"], ROUNDS, summary)
        print(f"calibration race: {ROUNDS} rounds, {in_place} sent in place, {moved} re-placed", file=sys.stderr)


if __name__ == "__main__":
    prog = unittest.main(verbosity=2, exit=False)
    sys.exit(1 if not prog.result.wasSuccessful() else 77 if prog.result.skipped else 0)
