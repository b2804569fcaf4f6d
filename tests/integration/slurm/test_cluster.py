#!/usr/bin/env python3
"""spank_qrt.so and qrtd across the nodes of a real Slurm cluster.

One cluster (slurm_cluster.py: five network namespaces on a bridge, one
munged per node with the same key, slurmctld on ctl, slurmd on cn1 cn2
qpu1 qpu2, qrtd + qpu-sim on qpu1 and qpu2, listening on tcp://<node>:7071)
serves every case, in order:

  1. MUNGE across the veth: qrtctl on cn1, as user nobody, reaches qpu1's
     qrtd over TCP with a credential cn1's munged encoded and qpu1's
     decoded, and gets nobody's roles.
  2. a compute-node step reserves on the QPU node (plugstack.conf
     socket=tcp://qpu1:7071): `srun -N2 --qpu-duration` on cn1 and cn2 makes
     ONE reservation on qpu1 (srun makes it, before any task); both tasks
     get QRT_SOCKET=tcp://qpu1:7071 and its id; task 0 submits the payload
     from cn1 over TCP (MUNGE), the job completes at qpu1's qpu-sim, task 1
     reads the reservation's status from cn2; a step whose tasks do not
     submit has its slot released when srun ends.

Asserts outcomes, never timings.  Skips (exit 77) with the reason when
network namespaces cannot be made, or Slurm, munge, root or the plugin are
missing.
"""

import json
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slurm_cluster  # noqa: E402
from slurm_cluster import NOBODY, wait_for  # noqa: E402,F401

SKIP = 77
MS = 1_000_000
QRTCTL = os.environ.get("QRTCTL", "")
JOB_C = os.environ.get("JOB_EXAMPLE", "")
FINAL = {"completed", "failed", "missed", "released", "cancelled", "expired", "displaced"}

# A task of a step: its QRT_* env on stdout (srun -l labels the lines),
# then task $2 submits with the C job side (`submit RANK`), after the
# others have ended, and every other task reads the reservation's status
# over QRT_SOCKET.
TASK = """#!/bin/sh
env | grep '^QRT_' | sort
echo "host=$(hostname)"
if [ "$1" = submit ] && [ "$SLURM_PROCID" = "$2" ]; then
  sleep 2
  exec {job}
fi
exec python3 -c '
import os, sys
sys.path.insert(0, os.environ["QRT_PYTHON_DIR"])
import qrt_client
rid = int(os.environ["QRT_RESERVATION_ID"].split(",")[0])
with qrt_client.Client(os.environ["QRT_SOCKET"], timeout=10) as c:
    print("seen", rid, c.jobs_status(rid)["state"])
'
"""


def env_by_task(text):
    """{task: {QRT_NAME: value}} from srun -l output."""
    out = {}
    for m in re.finditer(r"^\s*(\d+): (QRT_[A-Z_]+|host)=(.*)$", text, re.M):
        out.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
    return out


class Cluster(unittest.TestCase):
    cl = None

    @classmethod
    def setUpClass(cls):
        cls.cl = slurm_cluster.Cluster()
        try:
            cls.cl.start()
        except Exception:
            cls.cl.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.cl is not None:
            cls.cl.stop()

    def qrtctl(self, node, *args, user=True):
        return self.cl.run(node, [QRTCTL, "--json", *args], user=user, timeout=30)

    def task_script(self):
        path = os.path.join(self.cl.scripts, "task.sh")
        with open(path, "w") as f:
            f.write(TASK.format(job=JOB_C))
        os.chmod(path, 0o755)
        return path

    def srun(self, *args, timeout=120):
        return self.cl.run("ctl", ["srun", "-l", *args], timeout=timeout)

    def ledger(self, node):
        """Every reservation qrtd on node has (ids count up from 1)."""
        found = {}
        misses = 0
        rid = 0
        with self.cl.client(node) as c:
            while misses < 20 and rid < 10000:
                rid += 1
                try:
                    found[rid] = c.jobs_status(rid)
                    misses = 0
                except slurm_cluster.qrt_client.QrtError:
                    misses += 1
        return found

    def of_step(self, node, key):
        return {i: st for i, st in self.ledger(node).items()
                if st.get("idempotency_key", "").split("#")[0] == key}

    def status(self, node, rid):
        with self.cl.client(node) as c:
            return c.jobs_status(rid)

    def test_1_munge_crosses_the_veth(self):
        r = self.qrtctl("cn1", "--socket", slurm_cluster.qrtd_url("qpu1"), "agent", "hello")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        hello = json.loads(r.stdout)
        self.assertEqual(hello["peer"]["uid"], NOBODY, hello)
        self.assertIn("scheduler", hello["peer"]["roles"], hello)
        # No qrtd at an address of the subnet that no node has: a clear
        # connect error, not a hang.
        r = self.cl.run("cn1", [QRTCTL, "--socket", "tcp://10.77.0.99:7071",
                                "--connect-timeout", "1s", "agent", "hello"], timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("10.77.0.99", r.stdout + r.stderr)

    def test_2_compute_nodes_reserve_on_the_qpu_node(self):
        self.cl.point_plugin(["socket=" + slurm_cluster.qrtd_url("qpu1"), "setup_margin=2s"])
        task = self.task_script()
        # Task 1 submits after task 0 has ended: the slot is the step's,
        # not a node's, and outlives the first node's end.
        r = self.srun("-N2", "-p", "compute", "-t", "2", "--qpu-duration=5ms",
                      "--qpu-not-before=+4s", task, "submit", "1")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr + self.cl.tail("slurmd-cn1.log"))
        env = env_by_task(r.stdout)
        self.assertEqual(sorted(env), [0, 1], r.stdout)
        self.assertEqual({env[0]["host"], env[1]["host"]}, {"cn1", "cn2"})
        for t in (0, 1):
            self.assertEqual(env[t]["QRT_SOCKET"], "tcp://qpu1:7071", env[t])
        rid = int(env[0]["QRT_RESERVATION_ID"])
        self.assertEqual(env[1]["QRT_RESERVATION_ID"], str(rid))
        self.assertEqual(env[0]["QRT_FENCING_TOKEN"], env[1]["QRT_FENCING_TOKEN"])
        self.assertIn("qrt-job: committed 1 reservation", r.stdout)
        self.assertRegex(r.stdout, rf"0: seen {rid} held")
        self.assertEqual(env[0]["QRT_RESERVED_BY"], "srun")
        key = env[0]["QRT_IDEMPOTENCY_KEY"]
        self.assertRegex(key, r"^slurm:qrtc:\d+\.0$")
        # One reservation for the two-node step, on qpu1; none on qpu2.
        self.assertEqual(list(self.of_step("qpu1", key)), [rid])
        self.assertEqual(self.of_step("qpu2", key), {})
        st = wait_for(lambda: self.status("qpu1", rid)["state"] in FINAL and
                      self.status("qpu1", rid), 30, 0.2)
        self.assertEqual(st["state"], "completed", st)
        self.assertEqual(st["idempotency_key"], key)
        self.assertEqual(st["tenant"], "nobody")

        # A step that never submits: srun releases its slot at its end.
        r = self.srun("-N2", "-p", "compute", "-t", "2", "--qpu-duration=5ms", task, "look")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        env = env_by_task(r.stdout)
        rid = int(env[0]["QRT_RESERVATION_ID"])
        self.assertEqual(env[1]["QRT_RESERVATION_ID"], str(rid))
        self.assertEqual(self.status("qpu1", rid)["state"], "released")


if __name__ == "__main__":
    why = slurm_cluster.why_not_here()
    if why:
        print(f"SKIP: {why}", file=sys.stderr)
        sys.exit(SKIP)
    unittest.main(verbosity=2)
