#!/usr/bin/env python3
"""Arm ahead, fire at T, through qrtd: a QPU with wire = 2 and arm_lead_ns,
its endpoint a qpu-sim whose prepare costs 200 ms plus 1 ms per 64 KiB.

  1. agent.status says wire 2, and the minimum lead, the earliest start
     slots.query offers and the start a submit asking for "now" gets all
     include the arm lead;
  2. jobs of 16 to 60 KiB, acknowledged at the minimum lead and one prepare
     apart: every one is armed before its T and completes, none starts late
     by its upload (qpu-sim's start lateness), none is fired unarmed, and
     the learned arm lead is at least the endpoint's stated one;
  3. a job cancelled once it is armed is disarmed at the endpoint: ARM and
     DISARM reach qpu-sim, never a FIRE; the endpoint's arm cost by stage
     is in agent.status and telemetry.snapshot.

Counted at the endpoint (qpu-sim's summary and arrivals file).  Tuned
(root) only: every job completing is only promised tuned.  Environment as
for test_e2e.py.
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_e2e as base  # noqa: E402
from test_e2e import demo_client, wait_for  # noqa: E402

MS = 1_000_000
ARM_LEAD = 400 * MS
DURATION = 200_000
PREPARE = ["--prepare-ms", "200", "--prepare-ns-per-byte", "15.2587890625"]


def payload(kib):
    body = b'{"shots": 10'
    return body + b" " * (kib * 1024 - len(body) - 1) + b"}"


class TwoPhase(base.E2E):
    test_500_jobs_then_kill9_and_restart = None
    test_pushed_calibration_reaches_the_dispatch_guard = None
    SIM_ARGS = PREPARE

    def setUp(self):
        super().setUp()
        self.use_wire_2("qpu0", ARM_LEAD)

    def test_armed_ahead_fired_on_time_and_a_cancel_disarms(self):
        c = self.start_qrtd()
        self.require_tuned(c)
        self.assertTrue(wait_for(lambda: self.endpoint_up(c), 20), self.log_tail())
        q = c.status()["qpus"][0]
        self.assertEqual(q["wire"], 2, q)
        lead = c.status()["dispatch"]["min_lead_ns"]
        self.assertGreaterEqual(lead, ARM_LEAD)

        # 1. The earliest start offered includes the arm lead.
        before = time.time_ns()
        for cand in c.slots_query(DURATION, qpus=["qpu0"])["candidates"]:
            self.assertGreaterEqual(cand["start_ns"], before + ARM_LEAD, cand)
        soon = c.jobs_submit(payload(1), duration_ns=DURATION, idempotency_key="soon", qpus=["qpu0"],
                             not_before_ns=time.time_ns() + 1 * MS)
        self.assertGreaterEqual(soon["start_ns"], before + ARM_LEAD, soon)

        # 2. One prepare (200 ms + up to 1 ms) apart, at the minimum lead.
        ids = []
        t0 = time.time_ns() + lead + 400 * MS
        for i in range(16):
            r = c.jobs_submit(payload(16 + (i * 11) % 45), duration_ns=DURATION, idempotency_key=f"j{i}",
                              qpus=["qpu0"], not_before_ns=t0 + i * 240 * MS)
            ids.append(r["job_id"])
        ids.append(soon["job_id"])
        st = demo_client.wait_terminal(c, ids, 60)
        for j in ids:
            self.assertEqual(st[j]["state"], "completed", f"job {j}: {st[j]}\n{self.outcomes(st)}")

        # 3. Cancelled once armed: DISARM, never FIRE.
        armed_before = c.status()["qpus"][0]["arm"]["armed"]
        r = c.jobs_submit(payload(8), duration_ns=DURATION, idempotency_key="cancel-me", qpus=["qpu0"],
                          not_before_ns=time.time_ns() + lead + 1_500 * MS)
        self.assertTrue(wait_for(lambda: c.status()["qpus"][0]["arm"]["armed"] > armed_before, 10),
                        c.status()["qpus"][0])
        # The hand-over table holds it armed (its arm column), the one job in flight.
        held = c.status()["qpus"][0]
        self.assertEqual((held["arm"]["now_armed"], held["arm"]["now_arming"], held["in_flight"]), (1, 0, 1), held)
        c.jobs_cancel(r["job_id"])
        arm = c.status()["qpus"][0]["arm"]
        self.assertGreaterEqual(arm["lead_ns"], 216 * MS, arm)
        self.assertEqual(arm["not_armed"], 0, arm)
        # The endpoint's arm cost by stage (qpu-sim: compile, upload, arm),
        # in agent.status and in telemetry.snapshot for qrt-jitter-report.
        self.assertEqual(sorted(arm["endpoint_cost_by_stage"]), ["arm", "compile", "upload"], arm)
        self.assertGreaterEqual(arm["endpoint_cost_by_stage"]["upload"]["p50_ns"], 60 * MS, arm)
        stages = sorted(h["labels"]["stage"] for h in c.call("telemetry.snapshot")["histograms"]
                        if h["name"] == "qrt_dispatch_arm_cost_seconds")
        self.assertEqual(stages, ["arm", "compile", "total", "upload"], stages)
        self.assertTrue(wait_for(lambda: c.status()["qpus"][0]["arm"]["disarms_sent"] == 1, 10),
                        c.status()["qpus"][0])
        # Every arm event of every job (ARM sent, ARMED, FIRE sent) was a
        # transition the hand-over table allows: none refused.
        self.assertEqual(c.status()["dispatch"]["pump"]["refused_transitions"], 0, c.status()["dispatch"]["pump"])
        self.assertTrue(wait_for(lambda: c.status()["qpus"][0]["arm"]["now_armed"] == 0, 10), c.status()["qpus"][0])
        time.sleep(0.2)  # the DISARMED on its way; counted at the endpoint below
        c.close()
        self.qrtd.send_signal(base.signal.SIGTERM)
        self.assertEqual(self.qrtd.wait(20), 0, self.log_tail())
        summary = self.stop_sim()
        v2 = summary["two_phase"]
        self.assertEqual(v2["fired_unarmed"], 0, summary)
        self.assertEqual(v2["fires"], len(ids), summary)
        self.assertEqual(v2["disarmed"], 1, summary)
        self.assertLess(summary["start_lateness_ns"]["max"], 200 * MS, summary)
        frames = [a.get("frame") for a in self.arrived() if a["job_id"] == r["job_id"]]
        self.assertEqual(frames, ["ARM", "DISARM"], frames)


if __name__ == "__main__":
    unittest.main()
