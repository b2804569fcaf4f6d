#!/usr/bin/env python3
"""spank_qrt.so and qrtd across the nodes of a real Slurm cluster.

One cluster (slurm_cluster.py: five network namespaces on a bridge, one
munged per node with the same key, slurmctld on ctl, slurmd on cn1 cn2
qpu1 qpu2, qrtd + qpu-sim on qpu1 and qpu2, listening on tcp://<node>:7071)
serves every case, in order:

  1. MUNGE across the veth: qrtctl on cn1, as user nobody, reaches qpu1's
     qrtd over TCP with a credential cn1's munged encoded and qpu1's
     decoded, and gets nobody's roles.

Asserts outcomes, never timings.  Skips (exit 77) with the reason when
network namespaces cannot be made, or Slurm, munge, root or the plugin are
missing.
"""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slurm_cluster  # noqa: E402
from slurm_cluster import NOBODY, wait_for  # noqa: E402,F401

SKIP = 77
MS = 1_000_000
QRTCTL = os.environ.get("QRTCTL", "")


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


if __name__ == "__main__":
    why = slurm_cluster.why_not_here()
    if why:
        print(f"SKIP: {why}", file=sys.stderr)
        sys.exit(SKIP)
    unittest.main(verbosity=2)
