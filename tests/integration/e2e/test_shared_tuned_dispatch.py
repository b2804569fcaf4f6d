#!/usr/bin/env python3
"""More QPUs than spare cores, tuned: two QPUs share one dispatch thread.

With dispatch.qpus_per_cpu = 2 on this 2-CPU host (one core to spare), the
host plan puts both tuned QPUs on the same dispatch CPU, where one
SCHED_FIFO thread serves both (qrt/dispatch/dispatch_group.hpp).
host.apply_on_run = false: the host is not changed; the thread runs
SCHED_FIFO on that CPU without isolating it, as test_e2e.py runs tuned.

One qpu-sim listens on both QPUs' sockets and records each job frame
(--arrivals-file) with the agent's sent stamp.  Jobs on both QPUs at the
same start (a gang) and at starts 50 us apart are sent in start order
(equal starts in [[qpu]] order) by the frames' stamps, arrive in start order
on each endpoint, and all complete.  (Across the two sockets, qpu-sim may
read two frames 50 us apart in either order when it wakes once for both:
its read order is printed, not asserted.)

Skips, with the reason, where tuned dispatch cannot run (not root) or the
plan gives the QPUs a CPU each (a bigger host).  Behaviour only, never
timings.  Environment as for test_e2e.py.
"""

import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_e2e as base  # noqa: E402
from test_e2e import demo_client, wait_for  # noqa: E402

US = 1_000
TWO_QPUS = """
[[qpu]]
name = "qpu0"
endpoint = "unix://{dir}/qpu0.sock"
calibration = "periodic"
period_ns = 10_000_000_000
blackout_ns = 100_000_000
fidelity_f0 = 0.99

[[qpu]]
name = "qpu1"
endpoint = "unix://{dir}/qpu1.sock"
calibration = "periodic"
period_ns = 10_000_000_000
blackout_ns = 100_000_000
fidelity_f0 = 0.99
"""


class SharedTunedDispatch(base.E2E):
    test_500_jobs_then_kill9_and_restart = None
    test_pushed_calibration_reaches_the_dispatch_guard = None

    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("tuned dispatch (SCHED_FIFO, locked memory) needs root here")
        super().setUp()
        config = base.CONFIG.replace('submit_mode = "{submit}"', 'submit_mode = "{submit}"\nqpus_per_cpu = 2')
        text = (config + TWO_QPUS).format(dir=self.dir, uid=os.getuid(), submit="syscall", mode="tuned")
        with open(self.cfg, "w") as f:
            f.write(text)

    def test_two_tuned_qpus_on_one_cpu_send_in_start_order(self):
        c = self.start_qrtd()
        self.assertTrue(wait_for(lambda: self.endpoint_up(c), 20), self.log_tail())
        st = c.status()
        qpus = {q["name"]: q for q in st["qpus"]}
        self.assertEqual(sorted(qpus), ["qpu0", "qpu1"], st["qpus"])
        if qpus["qpu0"]["dispatch_cpu"] != qpus["qpu1"]["dispatch_cpu"]:
            self.skipTest(f"the host plan gives each QPU a CPU of its own here: {st['qpus']}")
        for q in qpus.values():
            if q["mode"] != "tuned" or not q["realtime"]:
                self.skipTest(f"dispatch is not tuned here ({q}): the shared thread is for tuned mode")
        with open(os.path.join(self.dir, "qrtd-1.log")) as f:
            self.assertIn("dispatch thread shared by 2 QPUs", f.read())
        lead = st["dispatch"]["min_lead_ns"]
        t0 = time.time_ns() + lead + 300 * base.MS
        placed = []  # (start_ns, qpu index, job id)
        # The same start: a gang of both.
        r = c.slots_reserve(20 * US, "gang", gang_size=2, not_before_ns=t0)
        members = r["gang"]
        self.assertEqual(len({m["start_ns"] for m in members}), 1, f"one common start: {r}")
        c.jobs_submit(b'{"shots": 1}', reservation_id=members[0]["reservation_id"],
                      fencing_token=members[0]["fencing_token"])
        for m in members:
            placed.append((m["start_ns"], int(m["qpu"][-1]), m["job_id"]))
        # Starts 50 us apart, alternating QPUs, placed latest first.
        t1 = t0 + 100 * base.MS
        for k in reversed(range(6)):
            q = f"qpu{k % 2}"
            r = c.slots_reserve(20 * US, f"near-{k}", qpus=[q], not_before_ns=t1 + k * 50 * US)
            sub = c.jobs_submit(b'{"shots": 1}', reservation_id=r["reservation_id"], fencing_token=r["fencing_token"])
            placed.append((r["start_ns"], k % 2, sub.get("job_id", r.get("job_id"))))
        starts = sorted(p[0] for p in placed)
        self.assertTrue(any(0 < b - a <= 100 * US for a, b in zip(starts, starts[1:])),
                        f"no two starts within 100 us: {placed}")
        ids = [p[2] for p in placed]
        done = demo_client.wait_terminal(c, ids, 30)
        c.close()
        for j in ids:
            self.assertIsInstance(done[j], dict, done[j])
            self.assertEqual(done[j]["state"], "completed", f"{done[j]}\n{self.log_tail()}")
        self.qrtd.send_signal(signal.SIGTERM)
        self.assertEqual(self.qrtd.wait(20), 0, self.log_tail())
        self.stop_sim()
        arrivals = self.arrived()
        arrived = [a["job_id"] for a in arrivals]
        # The one thread's send order: the frames' sent stamps (taken just
        # before each write, on one thread: they grow in send order).  qpu-sim
        # reads two sockets; frames 50 us apart on different ones may be
        # read in either order when it wakes once for both.
        sent = [a["job_id"] for a in sorted(arrivals, key=lambda a: a["sent_ns"])]
        expected = [p[2] for p in sorted(placed)]  # start, then [[qpu]] order
        print(f"\nplaced (start - t0 in us, qpu, job id): {[((p[0] - t0) // US, p[1], p[2]) for p in sorted(placed)]}"
              f"\nsent (by frame stamp): {sent}\nread by qpu-sim: {arrived}")
        self.assertEqual(len(arrivals), len(placed), arrivals)
        self.assertEqual(sent, expected, f"placed (start, qpu, id): {sorted(placed)}")
        # On each QPU's own endpoint, arrival order is start order too.
        for q in (0, 1):
            mine = {p[2] for p in placed if p[1] == q}
            self.assertEqual([j for j in arrived if j in mine], [j for j in expected if j in mine], q)

if __name__ == "__main__":
    prog = unittest.main(verbosity=2, exit=False)
    sys.exit(1 if not prog.result.wasSuccessful() else 77 if prog.result.skipped else 0)
