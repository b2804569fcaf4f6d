#!/usr/bin/env python3
"""An acknowledgement is a promise, also while the QPU's endpoint is down.

qrtd runs the deployed way (as root it drops to user qrtd) and its QPU's
endpoint cannot be reached:

  * as root, qpu-sim runs as root with its socket 0600 (the mistake a new
    user makes): qrtd's connect fails with EACCES;
  * otherwise qpu-sim is not started at all: nothing listens.

Then:
  1. every jobs.submit at the minimum lead is refused at request time with
     endpoint_down, data naming since when, the connect error and the
     remedy; no job is acknowledged, so none can end `missed` or `failed:
     endpoint_down` later;
  2. a request further ahead than timeline.endpoint_down_horizon_ns is
     accepted, and its reply says the endpoint is down;
  3. qpu-sim is started the right way: subscribers get qpu.endpoint_up, and
     every job submitted at the minimum lead is accepted and completes.

Behaviour only, never timings.  Environment as for test_e2e.py.
"""

import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_e2e as base  # noqa: E402
from test_e2e import demo_client, qrt_client, wait_for  # noqa: E402

DURATION = 200_000
PAYLOAD = b'{"shots": 10}'
HORIZON = 20_000_000_000  # timeline.endpoint_down_horizon_ns for this test


class EndpointDown(base.E2E):
    test_500_jobs_then_kill9_and_restart = None
    test_pushed_calibration_reaches_the_dispatch_guard = None

    def setUp(self):
        self.unreachable = True
        super().setUp()
        self.edit_config("[timeline]\n", f"[timeline]\nendpoint_down_horizon_ns = {HORIZON}\n")

    def start_sim(self):
        if not self.unreachable:
            return super().start_sim()
        if os.geteuid() != 0:
            return None  # nothing listens: connect fails with ENOENT
        # Root's socket, 0600: user qrtd may not connect (EACCES).
        args = [base.QPU_SIM, "--listen", f"unix://{self.dir}/qpu0.sock", "--json",
                "--summary-file", self.summary + ".wrong", "--duration-s", "110",
                "--socket-mode", "0600"]
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        self.assertTrue(wait_for(lambda: os.path.exists(f"{self.dir}/qpu0.sock"), 10), "qpu-sim did not listen")
        return p

    def submit(self, c, key, **kw):
        return c.jobs_submit(PAYLOAD, duration_ns=DURATION, idempotency_key=key, qpus=["qpu0"], **kw)

    def test_jobs_at_the_min_lead_are_refused_while_down_and_complete_once_it_is_up(self):
        c = self.start_qrtd()
        self.assertTrue(wait_for(lambda: not c.status()["qpus"][0]["endpoint_up"] and
                                 "down" in c.status()["qpus"][0].get("endpoint_state", ""), 10),
                        c.status()["qpus"][0])
        ev = qrt_client.Client(self.sock, timeout=30)
        ev.subscribe(["qpu.endpoint_up", "qpu.endpoint_down"])
        lead = c.status()["dispatch"]["min_lead_ns"]

        # 1. Refused at request time, with the reason and its remedy.
        refused = 0
        for i in range(40):
            with self.assertRaises(qrt_client.RpcError) as cm:
                self.submit(c, f"down-{i}")
            e = cm.exception
            self.assertEqual(e.reason, "endpoint_down", str(e))
            self.assertEqual(e.data["qpu"], "qpu0", e.data)
            self.assertGreater(e.data["since_ns"], 0, e.data)
            self.assertTrue(e.data["remedy"], e.data)
            self.assertGreaterEqual(e.data["not_before_ns"], time.time_ns() + HORIZON - 5_000_000_000, e.data)
            if os.geteuid() == 0:
                self.assertIn("Permission denied", e.data["error"], e.data)
                self.assertIn("--socket-group", e.data["remedy"], e.data)
            refused += 1
        self.assertEqual(refused, 40)
        # A held reservation cannot be reserved within the horizon either.
        with self.assertRaises(qrt_client.RpcError) as cm:
            c.slots_reserve(DURATION, "down-held", qpus=["qpu0"])
        self.assertEqual(cm.exception.reason, "endpoint_down")

        # 2. Further ahead: accepted, and the reply says the endpoint is down.
        far = self.submit(c, "far", not_before_ns=time.time_ns() + HORIZON + 2_000_000_000)
        self.assertIn("endpoint_down", far, far)
        self.assertEqual(far["state"], "committed", far)

        # 3. The endpoint the right way: up, announced, and jobs complete.
        if self.sim is not None:
            self.sim.terminate()
            self.sim.wait(10)
            if os.path.exists(f"{self.dir}/qpu0.sock"):  # qpu-sim removes it itself
                os.unlink(f"{self.dir}/qpu0.sock")
        self.unreachable = False
        self.sim = self.start_sim()
        self.assertTrue(wait_for(lambda: self.endpoint_up(c), 20), self.log_tail())
        seen = None
        for _ in range(100):
            e = ev.next_event(timeout=5)
            if e is None or e["type"] == "qpu.endpoint_up":
                seen = e
                break
        self.assertIsNotNone(seen, "no qpu.endpoint_up event")
        self.assertEqual(seen["data"]["qpu"], "qpu0", seen)
        ev.close()
        ids = []
        for i in range(20):
            r = self.submit(c, f"up-{i}", not_before_ns=time.time_ns() + lead + (i + 1) * 20_000_000)
            self.assertNotIn("endpoint_down", r, r)
            ids.append(r["job_id"])
        c.jobs_cancel(far["job_id"])
        st = demo_client.wait_terminal(c, ids, 30)
        c.close()
        for j in ids:
            self.assertIsInstance(st[j], dict, st[j])
            if os.geteuid() == 0:  # tuned: every job completes
                self.assertEqual(st[j]["state"], "completed", f"job {j}: {st[j]}\n{self.outcomes(st)}")
            else:  # untuned on a shared host may miss its tolerance, never for the endpoint
                self.assertNotIn("endpoint_down", st[j].get("reason", ""), self.outcomes(st))
        self.qrtd.send_signal(base.signal.SIGTERM)
        self.assertEqual(self.qrtd.wait(20), 0, self.log_tail())
        summary = self.stop_sim()
        if os.geteuid() == 0:
            self.assertEqual(summary["jobs"], len(ids), summary)


if __name__ == "__main__":
    unittest.main(verbosity=2)
