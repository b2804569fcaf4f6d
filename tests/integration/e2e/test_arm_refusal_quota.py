#!/usr/bin/env python3
"""A program the endpoint refuses at ARM gives the tenant's quota back: a
QPU with wire = 2, its endpoint a qpu-sim that refuses at ARM a program
containing a marker (--refuse-marker), the tenant allowed one reservation
at a time ([tenants] max_reservations = 1).

  1. a job whose program holds the marker takes the tenant's only
     reservation: a second submit is refused, quota_exceeded;
  2. the first ends at ARM, before its slot, arm_refused naming the
     endpoint's stage and line, and it was never fired (counted at
     qpu-sim);
  3. the next job is then accepted, and completes.

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
ARM_LEAD = 200 * MS
DURATION = 200_000
MARKER = "NOT_A_GATE"


class ArmRefusalQuota(base.E2E):
    test_500_jobs_then_kill9_and_restart = None
    test_pushed_calibration_reaches_the_dispatch_guard = None
    SIM_ARGS = ["--prepare-ms", "20", "--refuse-marker", MARKER]

    def setUp(self):
        super().setUp()
        self.use_wire_2("qpu0", ARM_LEAD)
        self.edit_config("[rpc]\n", "[tenants]\nmax_reservations = 1\n[rpc]\n")

    def test_refused_at_arm_gives_the_quota_back(self):
        c = self.start_qrtd()
        self.require_tuned(c)
        self.assertTrue(wait_for(lambda: self.endpoint_up(c), 20), self.log_tail())
        lead = c.status()["dispatch"]["min_lead_ns"]

        # 1. The refused program takes the tenant's only reservation.
        bad = c.jobs_submit('{"shots": 10, "program": "h q[0];\\n' + MARKER + ' q[0];"}', duration_ns=DURATION,
                            idempotency_key="bad", qpus=["qpu0"], not_before_ns=time.time_ns() + lead + 2_000 * MS)
        with self.assertRaises(qrt_client.RpcError) as e:
            c.jobs_submit('{"shots": 10}', duration_ns=DURATION, idempotency_key="full", qpus=["qpu0"],
                          not_before_ns=time.time_ns() + lead + 4_000 * MS)
        self.assertEqual(e.exception.reason, "quota_exceeded", e.exception)

        # 2. Refused at ARM, with the endpoint's stage, before its slot.
        st = demo_client.wait_terminal(c, [bad["job_id"]], 30)[bad["job_id"]]
        self.assertEqual(st["state"], "failed", f"{st}\n{self.log_tail()}")
        self.assertTrue(st["reason"].startswith("arm_refused: "), st)
        self.assertIn("stage parse: line 1", st["reason"], st)
        self.assertLess(st["updated_ns"], bad["start_ns"], st)
        self.assertEqual(c.status()["qpus"][0]["arm"]["refused"], 1, c.status()["qpus"][0]["arm"])

        # 3. The quota is back: the next job is accepted and completes.
        good = c.jobs_submit('{"shots": 10}', duration_ns=DURATION, idempotency_key="good", qpus=["qpu0"],
                             not_before_ns=time.time_ns() + lead + 1_000 * MS)
        st = demo_client.wait_terminal(c, [good["job_id"]], 30)[good["job_id"]]
        self.assertEqual(st["state"], "completed", f"{st}\n{self.log_tail()}")
        c.close()
        self.qrtd.send_signal(base.signal.SIGTERM)
        self.assertEqual(self.qrtd.wait(20), 0, self.log_tail())
        summary = self.stop_sim()
        self.assertEqual(summary["two_phase"]["fired_unarmed"], 0, summary)
        frames = [a.get("frame") for a in self.arrived() if a["job_id"] == bad["job_id"]]
        self.assertNotIn("FIRE", frames, frames)


if __name__ == "__main__":
    unittest.main()
