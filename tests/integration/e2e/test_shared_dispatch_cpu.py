#!/usr/bin/env python3
"""More QPUs than spare cores: a 2-QPU gang on a host that can isolate one core.

dispatch.mode = "untuned" needs no isolated CPU per QPU, so on this 2-CPU
host (1 housekeeping core, at most 1 to spare) qrtd starts with two QPUs
sharing one dispatch CPU instead of refusing ("cannot isolate 2 cores").
Each QPU has its own qpu-sim.  A gang reservation of both QPUs gets one
common start; its job, committed once, completes on both, and each qpu-sim
ran exactly one job.

Behaviour only, never timings.  Environment as for test_e2e.py.
"""

import json
import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_e2e as base  # noqa: E402
from test_e2e import demo_client, wait_for  # noqa: E402

TWO_QPUS = """
[[qpu]]
name = "qpu0"
endpoint = "unix://{dir}/qpu0.sock"
calibration = "periodic"
period_ns = 1_000_000_000
blackout_ns = 100_000_000
fidelity_f0 = 0.99

[[qpu]]
name = "qpu1"
endpoint = "unix://{dir}/qpu1.sock"
calibration = "periodic"
period_ns = 1_000_000_000
blackout_ns = 100_000_000
fidelity_f0 = 0.99
"""


class SharedDispatchCpu(base.E2E):
    test_500_jobs_then_kill9_and_restart = None
    test_pushed_calibration_reaches_the_dispatch_guard = None

    def setUp(self):
        super().setUp()
        text = (base.CONFIG + TWO_QPUS).format(dir=self.dir, uid=os.getuid(), submit="syscall", mode="untuned")
        with open(self.cfg, "w") as f:
            f.write(text)

    def start_sim(self):
        self.sims = []
        for q in ("qpu0", "qpu1"):
            args = [base.QPU_SIM, "--listen", f"unix://{self.dir}/{q}.sock", "--json",
                    "--summary-file", os.path.join(self.dir, f"{q}.json"), "--duration-s", "110"]
            if os.geteuid() == 0:
                args += ["--socket-group", "qrt", "--socket-mode", "0660"]
            p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append(p)
            self.sims.append(p)
            sock = f"{self.dir}/{q}.sock"
            self.assertTrue(wait_for(lambda: os.path.exists(sock), 10), "qpu-sim did not listen")
        return self.sims[0]

    def test_two_qpus_share_one_dispatch_cpu_and_a_gang_runs_on_both(self):
        online = os.sched_getaffinity(0)
        c = self.start_qrtd()
        self.assertTrue(wait_for(lambda: self.endpoint_up(c), 20), self.log_tail())
        st = c.status()
        qpus = {q["name"]: q for q in st["qpus"]}
        self.assertEqual(sorted(qpus), ["qpu0", "qpu1"], st["qpus"])
        if len(online) <= 2:
            # The case this test is for: fewer spare cores than QPUs.
            self.assertEqual(qpus["qpu0"]["dispatch_cpu"], qpus["qpu1"]["dispatch_cpu"], st["qpus"])
        lead = st["dispatch"]["min_lead_ns"]
        r = c.slots_reserve(200_000, "gang", gang_size=2, not_before_ns=time.time_ns() + lead + 200_000_000)
        members = r["gang"]
        self.assertEqual(sorted(m["qpu"] for m in members), ["qpu0", "qpu1"], r)
        self.assertEqual(len({m["start_ns"] for m in members}), 1, f"one common start: {r}")
        first = members[0]
        c.jobs_submit(b'{"shots": 10}', reservation_id=first["reservation_id"],
                      fencing_token=first["fencing_token"])
        ids = [m["job_id"] for m in members]
        done = demo_client.wait_terminal(c, ids, 30)
        c.close()
        for j in ids:
            self.assertIsInstance(done[j], dict, done[j])
            if os.geteuid() == 0 or done[j]["state"] == "completed":
                self.assertEqual(done[j]["state"], "completed", f"{done[j]}\n{self.log_tail()}")
            else:  # untuned, not root, on a shared host: a miss is allowed, nothing else
                self.assertEqual(done[j]["state"], "missed", done[j])
        self.qrtd.send_signal(signal.SIGTERM)
        self.assertEqual(self.qrtd.wait(20), 0, self.log_tail())
        for p in self.sims:
            p.send_signal(signal.SIGTERM)
            p.wait(15)
        both = all(done[j].get("state") == "completed" for j in ids)
        for q in ("qpu0", "qpu1"):
            with open(os.path.join(self.dir, f"{q}.json")) as f:
                summary = json.load(f)
            if both:  # each member ran once, on its own QPU
                self.assertEqual(summary["jobs"], 1, (q, summary))
            self.assertEqual(summary["out_of_window"], 0, (q, summary))


if __name__ == "__main__":
    unittest.main(verbosity=2)
