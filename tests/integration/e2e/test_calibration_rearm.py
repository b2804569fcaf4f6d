#!/usr/bin/env python3
"""A calibration switch re-arms: a QPU with wire = 2 and pushed
calibration, its endpoint a qpu-sim.  A job is committed in window 101 and
armed with it; calibration.update then replaces the window by 202 over the
same span.  At the endpoint, for that job: ARM (101), DISARM, ARM (202),
FIRE (202) at its start, never a FIRE for 101; the job completes with
calibration 202.

Tuned (root) only, as test_two_phase.py.  Environment as for test_e2e.py.
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_e2e as base  # noqa: E402
from test_e2e import demo_client, wait_for  # noqa: E402

MS = 1_000_000
ARM_LEAD = 300 * MS
DURATION = 200_000


class CalibrationRearm(base.E2E):
    test_500_jobs_then_kill9_and_restart = None
    test_pushed_calibration_reaches_the_dispatch_guard = None
    SIM_ARGS = ["--prepare-ms", "20"]

    def setUp(self):
        super().setUp()
        self.use_wire_2("qpu1", ARM_LEAD)

    def test_pushed_calibration_switch_disarms_and_rearms_with_the_new_id(self):
        c = self.start_qrtd()
        self.require_tuned(c)
        self.assertTrue(wait_for(lambda: self.endpoint_up(c), 20), self.log_tail())
        now = time.time_ns()
        w1 = {"calibration_id": 101, "valid_from_ns": now + 200 * MS, "valid_until_ns": now + 8000 * MS}
        c.calibration_update("qpu1", [w1])
        job = c.jobs_submit('{"shots": 10}', duration_ns=DURATION, idempotency_key="switch", qpus=["qpu1"],
                            not_before_ns=now + 3000 * MS)
        self.assertEqual(job["calibration_id"], 101, job)

        # Armed with 101 (the hand-over reaches the arm lead + the horizon ahead).
        self.assertTrue(wait_for(lambda: c.status()["qpus"][0]["arm"]["armed"] >= 1, 10), c.status()["qpus"][0])
        self.assertLess(time.time_ns(), job["start_ns"] - 100 * MS, "armed too late to switch before the start")
        w2 = dict(w1, calibration_id=202, valid_from_ns=time.time_ns() + 20 * MS)
        rep = c.calibration_update("qpu1", [w2])
        self.assertGreater(rep["replaced"], 0, rep)

        st = demo_client.wait_terminal(c, [job["job_id"]], 30)[job["job_id"]]
        self.assertEqual(st["state"], "completed", f"{st}\n{self.log_tail()}")
        self.assertEqual(st["calibration_id"], 202, st)
        self.assertGreaterEqual(st["sent_ns"], st["start_ns"], st)
        arm = c.status()["qpus"][0]["arm"]
        self.assertEqual(arm["disarms_sent"], 1, arm)
        self.assertEqual(arm["not_armed"], 0, arm)
        c.close()
        self.qrtd.send_signal(base.signal.SIGTERM)
        self.assertEqual(self.qrtd.wait(20), 0, self.log_tail())
        summary = self.stop_sim()
        self.assertEqual(summary["two_phase"]["fired_unarmed"], 0, summary)
        frames = [(a.get("frame"), a["calibration_id"]) for a in self.arrived() if a["job_id"] == job["job_id"]]
        self.assertEqual(frames, [("ARM", 101), ("DISARM", 101), ("ARM", 202), ("FIRE", 202)], frames)
        fire = [a for a in self.arrived() if a["job_id"] == job["job_id"] and a.get("frame") == "FIRE"][0]
        self.assertEqual(fire["scheduled_ns"], st["start_ns"], fire)


if __name__ == "__main__":
    unittest.main()
