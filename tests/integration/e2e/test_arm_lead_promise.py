#!/usr/bin/env python3
"""The learned arm lead moves the promise: a QPU with wire = 2 and a small
arm_lead_ns (100 ms), its endpoint a qpu-sim whose prepare costs 1 s.

  1. jobs one at a time until the link has learned the endpoint's arm cost
     (agent.status qpus[].arm.lead_ns at least the prepare time) and one
     was armed in time and completed: the hand-over reaches as far ahead as
     the learned lead, not only arm_lead_ns;
  2. then the earliest start slots.query offers and the start a submit
     asking for "now" gets are at least the learned lead away, and that job
     completes (armed before its T, fired);
  3. a held reservation committed when its start is inside the learned
     lead (but well outside the static minimum lead) is refused at request
     time, unavailable, with next_start_ns at least the learned lead away:
     it is never acknowledged and then left unarmed.

Tuned (root) only, as test_two_phase.py.  Environment as for test_e2e.py.
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_e2e as base  # noqa: E402
from test_e2e import demo_client, qrt_client, wait_for  # noqa: E402

MS = 1_000_000
ARM_LEAD = 100 * MS
PREPARE_MS = 1000
DURATION = 200_000
PAYLOAD = b'{"shots": 10}'


class ArmLeadPromise(base.E2E):
    test_500_jobs_then_kill9_and_restart = None
    test_pushed_calibration_reaches_the_dispatch_guard = None
    SIM_ARGS = ["--prepare-ms", str(PREPARE_MS)]

    def setUp(self):
        super().setUp()
        self.use_wire_2("qpu0", ARM_LEAD)

    def arm(self, c):
        return c.status()["qpus"][0]["arm"]

    def test_learned_arm_lead_moves_the_earliest_start_and_refuses_inside_it(self):
        c = self.start_qrtd()
        self.require_tuned(c)
        self.assertTrue(wait_for(lambda: self.endpoint_up(c), 20), self.log_tail())
        static_lead = c.status()["dispatch"]["min_lead_ns"]
        self.assertLess(static_lead, PREPARE_MS * MS // 2, "the static minimum lead must be well below the prepare")

        # A held reservation for step 3, placed before anything is learned.
        held = c.slots_reserve(DURATION, "held", qpus=["qpu0"], not_before_ns=time.time_ns() + 40_000 * MS)

        # 1. Learn: one job at a time, each at the earliest start offered.
        learned = None
        for i in range(12):
            r = c.jobs_submit(PAYLOAD, duration_ns=DURATION, idempotency_key=f"learn{i}", qpus=["qpu0"],
                              not_before_ns=time.time_ns() + 1 * MS)
            st = demo_client.wait_terminal(c, [r["job_id"]], 30)[r["job_id"]]
            arm = self.arm(c)
            if arm["lead_ns"] >= PREPARE_MS * MS and st["state"] == "completed":
                learned = arm["lead_ns"]
                break
        self.assertIsNotNone(learned, f"the arm lead was never learned and met: {self.arm(c)}\n{self.log_tail()}")

        # 2. The earliest start offered, and the one a submit for "now" gets.
        before = time.time_ns()
        cands = c.slots_query(DURATION, qpus=["qpu0"])["candidates"]
        self.assertTrue(cands)
        for cand in cands:
            self.assertGreaterEqual(cand["start_ns"], before + learned, cand)
        soon = c.jobs_submit(PAYLOAD, duration_ns=DURATION, idempotency_key="soon", qpus=["qpu0"],
                             not_before_ns=time.time_ns() + 1 * MS)
        self.assertGreaterEqual(soon["start_ns"], before + learned, soon)
        st = demo_client.wait_terminal(c, [soon["job_id"]], 30)[soon["job_id"]]
        self.assertEqual(st["state"], "completed", f"{st}\n{self.log_tail()}")

        # 3. The held reservation, committed once its start is inside the
        #    learned lead: half of it away, still far beyond the static one.
        commit_at = held["start_ns"] - learned // 2
        while time.time_ns() < commit_at:
            time.sleep(min(1.0, max(0.0, (commit_at - time.time_ns()) / 1e9)))
        sent = time.time_ns()
        self.assertGreater(held["start_ns"] - sent, static_lead + 200 * MS, "committed too late to tell")
        with self.assertRaises(qrt_client.RpcError) as e:
            c.jobs_submit(PAYLOAD, reservation_id=held["reservation_id"], fencing_token=held["fencing_token"])
        self.assertEqual(e.exception.reason, "unavailable", e.exception)
        self.assertGreaterEqual(e.exception.data["next_start_ns"], sent + learned, e.exception.data)
        c.close()


if __name__ == "__main__":
    unittest.main()
