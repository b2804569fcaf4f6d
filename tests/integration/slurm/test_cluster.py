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
     get QRT_SOCKET=tcp://qpu1:7071 and its id; task 0 reads the
     reservation's status over TCP and ends, then task 1 submits the
     payload over TCP (MUNGE) into the slot that outlived task 0's node,
     and the job completes at qpu1's qpu-sim; a step whose tasks do not
     submit has its slot released when srun ends, and so does one that is
     scancel'ed while its tasks run; a step whose slot cannot be had runs
     no task on either node, each refusing with srun's reason.
  3. a -N2 step on the two QPU nodes (qrtd_node=tcp://%n:7071
     qrtd_nodes=qpu[1-2], in the same plugstack.conf line): qpu2 is booked
     up so its earliest start is later than qpu1's; both nodes'
     reservations still have the same start (the later one), each task
     gets its own node's reservation and socket, and both are released
     after the step, each by its node as the job's user (never root).  With qpu2 booked past --qpu-deadline the step fails
     before any task runs (its marker file never appears), with the
     reason, and no hold is left on either node.  With the user's quota
     full on qpu2 (tenants.max_reservations), qpu1's hold is made, qpu2
     refuses its own (quota_exceeded), and the step fails before any task
     with qpu2's reason, qpu1's hold released.
  4. the link between cn1 and the QPU node cut during a batch step (`ip
     link set cn1 down` on the switch): the task's submit fails with an
     error naming tcp://qpu1:7071; the acknowledged reservation is still
     on qpu1, held; the step's release cannot reach qpu1 either, and the
     slot ends by its lease (max_lease=8s here), expired.  The link is
     restored in a finally.
  5. kill -9 of qpu1's qrtd during a pipelined burst of slots.reserve that
     cn1 sends over TCP: after the restart every reservation qrtd
     acknowledged on the wire is there, held, with its start.
  6. lease=4s: srun renews the step's hold while the step runs past the
     lease (still held, its lease later than the first), and srun killed
     -9 leaves it to expire within that lease, though the job's time limit
     is minutes away.
  7. a calibration block qrtd grants over a lease=4s step's hold (qrtd asks
     it to yield): srun releases the hold and reserves the same request
     again at or after the block's end, under the step's key, and tells the
     user in one line naming the block and the new start; the block is
     then scheduled, not failed.  With no slot left before --qpu-deadline
     the step fails with qrtd's reason and its task is ended.

Asserts outcomes, never timings.  Skips (exit 77) with the reason when
network namespaces cannot be made, or Slurm, munge, root or the plugin are
missing.
"""

import json
import os
import re
import subprocess
import sys
import time
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

# cn1's side of the burst: every reply line as it arrives, flushed, into
# argv[2] (requests are pipelined: half written up front, the rest once the
# first reply is in); ends when qrtd's side of the connection goes away.
BURST = r"""
import json, os, sys, time
sys.path.insert(0, os.environ["QRT_PYTHON_DIR"])
import qrt_client
n = 300
c = qrt_client.Client(sys.argv[1], timeout=20)
base = time.time_ns() + 20_000_000_000
reqs = b"".join(json.dumps({
    "jsonrpc": "2.0", "id": 1000 + i, "method": "slots.reserve",
    "params": {"duration_ns": 1_000_000, "idempotency_key": f"burst-{i}",
               "not_before_ns": base + i * 2_000_000, "lease_ns": 120_000_000_000}}).encode()
    + b"\n" for i in range(n))
c._sock.sendall(reqs[:len(reqs) // 2])
rest = reqs[len(reqs) // 2:]
with open(sys.argv[2], "w") as out:
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        try:
            line = c._read_line(give_up)
        except qrt_client.QrtError:
            break
        if line is None:
            break
        out.write(line.decode() if isinstance(line, bytes) else line)
        out.write("\n")
        out.flush()
        if rest:
            try:
                c._sock.sendall(rest)
            except OSError:
                pass
            rest = b""
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
        # One plugstack.conf line for the whole cluster: steps on the QPU
        # nodes use their own qrtd with a common start, steps elsewhere the
        # QPU node qpu1.
        cls.cl.point_plugin(["socket=" + slurm_cluster.qrtd_url("qpu1"),
                             "qrtd_node=tcp://%n:7071", "qrtd_nodes=qpu[1-2]",
                             "setup_margin=2s"])

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

        # One qrtd cannot meet the step's deadline: every node refuses its
        # tasks with srun's reason, and none runs.
        marker = os.path.join(self.cl.jobs, "ran-compute")
        r = self.srun("-N2", "-p", "compute", "-t", "2", "--qpu-duration=5ms",
                      "--qpu-not-before=+3s", "--qpu-deadline=+2s", "sh", "-c", f"touch {marker}")
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertFalse(os.path.exists(marker), "a task ran although the step had no slot")
        self.assertIn("no QPU slot for this step", r.stdout + r.stderr)
        self.assertRegex(r.stderr, r"(?m)^\s*0: qrt: no QPU slot")
        self.assertRegex(r.stderr, r"(?m)^\s*1: qrt: no QPU slot")

    def test_2b_scancel_releases_the_step_slot(self):
        out = os.path.join(self.cl.jobs, "cancel.out")
        script = os.path.join(self.cl.scripts, "long.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nenv | grep '^QRT_' > " + out + ".$SLURM_PROCID\nsleep 120\n")
        os.chmod(script, 0o755)
        argv = self.cl.in_node("ctl", ["srun", "-N2", "-p", "compute", "-t", "2",
                                       "--qpu-duration=5ms", "--qpu-not-before=+30s", script],
                               user=True)
        p = subprocess.Popen(argv, env=self.cl.env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, cwd=self.cl.jobs)
        try:
            env = wait_for(lambda: all("QRT_RESERVATION_ID=" in self.read(f"{out}.{t}")
                                       for t in (0, 1)) and self.read(f"{out}.0"), 60, 0.2)
            self.assertTrue(env, "the step's tasks never started")
            rid = int(re.search(r"^QRT_RESERVATION_ID=(\d+)$", env, re.M).group(1))
            self.assertEqual(self.status("qpu1", rid)["state"], "held")
            r = self.cl.run("ctl", ["scancel", "-u", "nobody"], user=False, timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        st = wait_for(lambda: self.status("qpu1", rid)["state"] != "held" and
                      self.status("qpu1", rid), 30, 0.2)
        self.assertTrue(st, "the slot is still held after scancel")
        self.assertEqual(st["state"], "released", st)

    def book_up(self, node, until_ns):
        """Hold every free gap of node's QPU from now until until_ns (as
        root): its earliest start for a short slot is then past until_ns."""
        held = []
        last_error = None
        with self.cl.client(node) as c:
            for i in range(200):
                cands = c.slots_query(5 * MS, max_candidates=1)["candidates"]
                if not cands or cands[0]["start_ns"] >= until_ns:
                    return held
                # qrtd places each block: from the start it offered, or
                # from its minimum lead when the hold arrives later than
                # that (a loaded host delays it by any amount), to the
                # calibration window's end at the latest.  Blocks of at
                # most 200 ms, halved where one no longer fits what is
                # left of the window (no_fit); a gap that time passed is
                # not offered by the next query.
                start, until = cands[0]["start_ns"], cands[0]["window_until_ns"]
                length = min(until - start, 200 * MS)
                while length >= 5 * MS:
                    try:
                        r = c.slots_reserve(length, f"block-{node}-{until_ns}-{i}-{length}",
                                            not_before_ns=start, deadline_ns=until)
                        held.append((r["reservation_id"], r["fencing_token"]))
                        break
                    except slurm_cluster.qrt_client.RpcError as e:
                        last_error = e
                        length //= 2
        self.fail(f"could not book {node} up to {until_ns}: last refusal {last_error}")

    def book_ahead(self, node, ahead_ns):
        """node booked up to at least ahead_ns past the moment this returns:
        booking takes time on a loaded host, so what it took is booked too."""
        held = []
        for _ in range(20):
            more = self.book_up(node, self.now_ns() + ahead_ns)
            held += more
            if not more:
                return held
        self.unbook(node, held)
        self.fail(f"{node} was never booked {ahead_ns} ns ahead in 20 rounds")

    def unbook(self, node, held):
        with self.cl.client(node) as c:
            for rid, token in held:
                c.slots_release(rid, token)

    def now_ns(self):
        return time.time_ns()

    def test_3_common_start_on_two_qpu_nodes(self):
        task = self.task_script()
        blocks = self.book_ahead("qpu2", 5_000_000_000)
        try:
            with self.cl.client("qpu2") as c:
                later = c.slots_query(5 * MS, max_candidates=1)["candidates"][0]["start_ns"]
            r = self.srun("-N2", "-p", "qpu", "-t", "2", "--qpu-duration=5ms", task, "look")
        finally:
            self.unbook("qpu2", blocks)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr + self.cl.tail("slurmd-qpu1.log"))
        env = env_by_task(r.stdout)
        self.assertEqual({env[0]["host"], env[1]["host"]}, {"qpu1", "qpu2"})
        starts = {}
        for t in (0, 1):
            node = env[t]["host"]
            self.assertEqual(env[t]["QRT_SOCKET"], f"tcp://{node}:7071", env[t])
            rid = int(env[t]["QRT_RESERVATION_ID"])
            self.assertRegex(r.stdout, rf"{t}: seen {rid} held")
            st = self.status(node, rid)
            self.assertEqual(st["idempotency_key"].split("#")[0], env[t]["QRT_IDEMPOTENCY_KEY"])
            starts[node] = st["start_ns"]
            self.assertEqual(str(st["start_ns"]), env[t]["QRT_SLOT_START_NS"])
            # Released after the step, by its node or by srun.
            self.assertEqual(st["state"], "released", st)
            # A node gives its part back as the job's user, never as root
            # (spank_qrt(8), WHO TALKS TO QRTD).
            gave_back = wait_for(lambda: re.search(
                rf"released reservation {rid} \(as uid (\d+)\)",
                self.read(os.path.join(self.cl.dir, "log", f"slurmd-{node}.log"))), 10, 0.2)
            self.assertTrue(gave_back, f"{node} never gave back its part {rid}: " +
                            self.cl.tail(f"slurmd-{node}.log"))
            self.assertEqual(int(gave_back.group(1)), NOBODY)
        self.assertEqual(starts["qpu1"], starts["qpu2"], starts)
        # The common start is qpu2's (the later one), not qpu1's earliest.
        self.assertGreaterEqual(starts["qpu1"], later)

        # qpu2 booked past the deadline: the step fails before any task.
        marker = os.path.join(self.cl.jobs, "ran")
        blocks = self.book_ahead("qpu2", 8_000_000_000)
        try:
            r = self.srun("-N2", "-p", "qpu", "-t", "2", "--qpu-duration=5ms",
                          "--qpu-deadline=+4s", "sh", "-c", f"touch {marker}")
        finally:
            self.unbook("qpu2", blocks)
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertFalse(os.path.exists(marker), "a task ran although the step had no slot")
        self.assertIn("no common start", r.stderr)
        self.assertIn("qpu2", r.stderr)
        # No hold on either node: every reservation either qrtd has is over
        # (the blocks were released above, the earlier steps' ended).
        for node in ("qpu1", "qpu2"):
            left = {i: (st["state"], st.get("idempotency_key"))
                    for i, st in self.ledger(node).items() if st["state"] not in FINAL}
            self.assertEqual(left, {}, f"holds left on {node}")

    def test_3b_a_refused_hold_undoes_the_others(self):
        fills = []
        try:
            for i in range(slurm_cluster.QPU2_MAX_RESERVATIONS):
                r = self.qrtctl("cn1", "--socket", slurm_cluster.qrtd_url("qpu2"), "slots",
                                "reserve", "--duration", "1ms", "--not-before", "+60s",
                                "-k", f"fill-{i}", "--lease", "60s")
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                got = json.loads(r.stdout)
                fills.append((got["reservation_id"], got["fencing_token"]))
            before = set(self.ledger("qpu1"))
            marker = os.path.join(self.cl.jobs, "ran-quota")
            r = self.srun("-N2", "-p", "qpu", "-t", "2", "--qpu-duration=5ms", "sh", "-c",
                          f"touch {marker}")
        finally:
            with self.cl.client("qpu2") as c:
                for rid, token in fills:
                    c.slots_release(rid, token)
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertFalse(os.path.exists(marker), "a task ran although the step had no slot")
        self.assertIn("no common start", r.stderr)
        self.assertIn("qpu2 refused the hold", r.stderr)
        self.assertIn("quota_exceeded", r.stderr)
        # qpu1 held its part first; srun gave it back.
        made = {i: st for i, st in self.ledger("qpu1").items() if i not in before}
        self.assertEqual(len(made), 1, made)
        self.assertEqual([st["state"] for st in made.values()], ["released"])

    def test_4_link_cut_leaves_the_slot_to_its_lease(self):
        j = self.cl.jobs
        script = os.path.join(self.cl.scripts, "cut.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\n"
                    f"env | grep '^QRT_' > {j}/cut.env\n"
                    f"i=0; while [ ! -e {j}/cut.go ] && [ $i -lt 300 ]; do sleep 0.1; "
                    "i=$((i+1)); done\n"
                    f"{JOB_C} > {j}/cut.out 2>&1\n"
                    f"echo rc=$? >> {j}/cut.out\n")
        os.chmod(script, 0o755)
        self.cl.point_plugin(["socket=" + slurm_cluster.qrtd_url("qpu1"), "setup_margin=2s",
                              "max_lease=8s", "timeout=2s"])
        cut = False
        try:
            r = self.cl.run("ctl", ["sbatch", "--parsable", "-p", "compute", "-w", "cn1", "-t",
                                    "2", "-o", f"{j}/cut.slurm", "--qpu-duration=5ms", script],
                            timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            job = int(r.stdout.strip().split(";")[0])
            env = wait_for(lambda: "QRT_RESERVATION_ID=" in self.read(f"{j}/cut.env") and
                           dict(line.split("=", 1) for line in
                                self.read(f"{j}/cut.env").splitlines() if "=" in line), 60, 0.2)
            self.assertTrue(env, self.read(f"{j}/cut.slurm") + self.cl.tail("slurmd-cn1.log"))
            rid = int(env["QRT_RESERVATION_ID"])
            self.assertEqual(self.status("qpu1", rid)["state"], "held")
            self.cl.link("cn1", up=False)
            cut = True
            with open(f"{j}/cut.go", "w"):
                pass
            out = wait_for(lambda: "rc=" in self.read(f"{j}/cut.out") and
                           self.read(f"{j}/cut.out"), 60, 0.2)
            self.assertTrue(out, "the task never finished its submit attempt")
            self.assertNotIn("rc=0", out)
            self.assertIn("qpu1", out)  # the error names the host it could not reach
            # Acknowledged, so still there: held on qpu1 until its lease.
            st = self.status("qpu1", rid)
            self.assertIn(st["state"], ("held", "expired"), st)
            st = wait_for(lambda: self.status("qpu1", rid)["state"] != "held" and
                          self.status("qpu1", rid), 30, 0.5)
            self.assertTrue(st, "the slot outlived its lease")
            self.assertEqual(st["state"], "expired", st)
            self.assertIn("lease", st.get("reason", ""), st)
        finally:
            if cut:
                self.cl.link("cn1", up=True)
            self.cl.point_plugin(["socket=" + slurm_cluster.qrtd_url("qpu1"),
                                  "qrtd_node=tcp://%n:7071", "qrtd_nodes=qpu[1-2]",
                                  "setup_margin=2s"])
        done = wait_for(lambda: self.cl.job_state(job) not in (None, "RUNNING", "PENDING",
                                                               "COMPLETING"), 60, 0.5)
        self.assertTrue(done, f"job {job} did not end after the link came back")

    def test_5_kill_9_during_a_remote_burst(self):
        script = os.path.join(self.cl.scripts, "burst.py")
        with open(script, "w") as f:
            f.write(BURST)
        replies = os.path.join(self.cl.jobs, "burst.out")
        argv = self.cl.in_node("cn1", ["python3", script, slurm_cluster.qrtd_url("qpu1"),
                                       replies], user=True)
        p = subprocess.Popen(argv, env=self.cl.env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        try:
            some = wait_for(lambda: self.read(replies).count("\n") >= 40, 60, 0.02)
            self.assertTrue(some, self.read(replies)[-2000:])
            self.cl.kill_qrtd("qpu1")
            out, _ = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        acked = {}
        for line in self.read(replies).splitlines():
            obj = json.loads(line)
            if "result" in obj:
                acked[obj["id"]] = obj["result"]
        self.assertGreaterEqual(len(acked), 40, out)
        print(f"kill -9 after {len(acked)} of 300 remote reservations acknowledged",
              file=sys.stderr)
        self.cl.start_qrtd("qpu1")
        with self.cl.client("qpu1") as c:
            for _, res in sorted(acked.items()):
                st = c.jobs_status(res["reservation_id"])
                self.assertEqual(st["state"], "held", st)
                self.assertEqual(st["start_ns"], res["start_ns"], st)
                self.assertEqual(st["tenant"], "nobody", st)

    def test_6_srun_heartbeats_a_short_lease(self):
        out = os.path.join(self.cl.jobs, "hb.out")
        script = os.path.join(self.cl.scripts, "hb.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nenv | grep '^QRT_' > " + out + ".$SLURM_PROCID\nsleep 60\n")
        os.chmod(script, 0o755)
        self.cl.point_plugin(["socket=" + slurm_cluster.qrtd_url("qpu1"), "setup_margin=2s",
                              "lease=4s"])
        argv = self.cl.in_node("ctl", ["srun", "-N2", "-p", "compute", "-t", "5",
                                       "--qpu-duration=5ms", "--qpu-not-before=+60s", script],
                               user=True)
        p = subprocess.Popen(argv, env=self.cl.env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, cwd=self.cl.jobs)
        try:
            env = wait_for(lambda: all("QRT_RESERVATION_ID=" in self.read(f"{out}.{t}")
                                       for t in (0, 1)) and self.read(f"{out}.0"), 60, 0.2)
            self.assertTrue(env, "the step's tasks never started")
            rid = int(re.search(r"^QRT_RESERVATION_ID=(\d+)$", env, re.M).group(1))
            first = int(re.search(r"^QRT_LEASE_EXPIRES_NS=(\d+)$", env, re.M).group(1))
            # Past the first lease's end: still held, renewed by srun.
            wait_for(lambda: time.time_ns() > first + 2_000_000_000, 15, 0.2)
            st = self.status("qpu1", rid)
            self.assertEqual(st["state"], "held", st)
            self.assertGreater(st["lease_expires_ns"], first, st)
            # srun dies: nobody renews, the hold expires by its short lease.
            p.kill()
            p.wait(10)
            st = wait_for(lambda: self.status("qpu1", rid)["state"] != "held" and
                          self.status("qpu1", rid), 20, 0.5)
            self.assertTrue(st, "the hold outlived srun by more than its lease")
            self.assertEqual(st["state"], "expired", st)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            self.cl.run("ctl", ["scancel", "-u", "nobody"], user=False, timeout=30)
            self.cl.point_plugin(["socket=" + slurm_cluster.qrtd_url("qpu1"),
                                  "qrtd_node=tcp://%n:7071", "qrtd_nodes=qpu[1-2]",
                                  "setup_margin=2s"])

    def yield_step(self, name, deadline):
        """A lease=4s step on qpu1 holding 20 s from 10 s ahead (qpu1's
        window is a week long), then a 15 s calibration block due by the
        hold's end: nothing before the hold is long enough, so qrtd asks
        the step to yield.  (srun, its stderr file, env, rid, key, block)."""
        out = os.path.join(self.cl.jobs, f"{name}.out")
        err = os.path.join(self.cl.jobs, f"{name}.err")
        script = os.path.join(self.cl.scripts, f"{name}.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\nenv | grep '^QRT_' > {out}\nsleep 120\n")
        os.chmod(script, 0o755)
        self.cl.point_plugin(["socket=" + slurm_cluster.qrtd_url("qpu1"), "setup_margin=2s",
                              "lease=4s"])
        argv = self.cl.in_node("ctl", ["srun", "-N1", "-p", "compute", "-t", "5",
                                       "--qpu-duration=20s", "--qpu-not-before=+10s",
                                       f"--qpu-deadline={deadline}", script], user=True)
        errf = open(err, "w")
        p = subprocess.Popen(argv, env=self.cl.env, stdout=subprocess.DEVNULL, stderr=errf,
                             cwd=self.cl.jobs)
        errf.close()
        env = wait_for(lambda: "QRT_RESERVATION_ID=" in self.read(out) and self.read(out), 60, 0.2)
        self.assertTrue(env, "the step's task never started: " + self.read(err))
        rid = int(re.search(r"^QRT_RESERVATION_ID=(\d+)$", env, re.M).group(1))
        key = re.search(r"^QRT_IDEMPOTENCY_KEY=(.+)$", env, re.M).group(1)
        end = int(re.search(r"^QRT_SLOT_END_NS=(\d+)$", env, re.M).group(1))
        with self.cl.client("qpu1") as c:
            block = c.calibration_request("qpu1-q0", "slurm_yield", 15_000_000_000, end,
                                          f"slurm-yield-{name}")
        self.assertEqual(block["state"], "yielding", block)
        return p, err, rid, key, block

    def test_7_a_held_step_moves_past_a_calibration_block(self):
        p = block = None
        try:
            p, err, rid, key, block = self.yield_step("yield", "+300s")
            # Moved: the first hold released, one held at or after the block.
            moved = wait_for(lambda: [(i, st) for i, st in self.of_step("qpu1", key).items()
                                      if i != rid and st["state"] == "held"], 30, 0.5)
            self.assertTrue(moved, self.of_step("qpu1", key))
            self.assertEqual(len(moved), 1, moved)
            new_id, new = moved[0]
            self.assertGreaterEqual(new["start_ns"], block["end_ns"], (new, block))
            self.assertEqual(self.status("qpu1", rid)["state"], "released")
            line = wait_for(lambda: re.search(
                rf"calibration block {block['block_id']} \(step slurm_yield\) on qpu qpu1-q0 "
                rf"took the step's slot; it moved to start \S+ \({new['start_ns']}\), "
                rf"reservation {new_id}",
                self.read(err)), 10, 0.2)
            self.assertTrue(line, self.read(err))
            # The block leaves `yielding` once qrtd has placed it over the
            # released slot (after the release is durable, not with its answer).
            def block_now():
                with self.cl.client("qpu1") as c:
                    return [x for x in c.calibration_blocks("qpu1-q0") if x["block_id"] == block["block_id"]]
            b = wait_for(lambda: (lambda bs: bs if bs and bs[0]["state"] != "yielding" else None)(block_now()),
                         10, 0.2) or block_now()
            self.assertEqual(b[0]["state"], "scheduled", b)
            # srun still renews and, at its end, gives back the new hold.
            p.terminate()
            p.wait(30)
            st = wait_for(lambda: self.status("qpu1", new_id)["state"] != "held" and
                          self.status("qpu1", new_id), 20, 0.5)
            self.assertTrue(st, "srun's end left the moved hold")
            self.assertEqual(st["state"], "released", st)
        finally:
            self.end_yield_step(p, block)

    def test_8_a_step_with_no_slot_after_the_block_fails_with_the_reason(self):
        p = block = None
        try:
            # The hold ends 30 s ahead, the deadline 2 s later: after the
            # block nothing of 20 s fits.
            p, err, rid, key, block = self.yield_step("noroom", "+32s")
            rc = wait_for(lambda: p.poll() is not None, 60, 0.5)
            self.assertTrue(rc, "the step outlived the loss of its slot")
            self.assertNotEqual(p.returncode, 0)
            text = self.read(err)
            self.assertIn(f"calibration block {block['block_id']} (step slurm_yield) on qpu "
                          "qpu1-q0 took the step's slot, and no other is left", text)
            # qrtd's own reason: no start after the block leaves the
            # duration before the deadline.
            self.assertRegex(text, r"took the step's slot, and no other is left: qrt: no QPU "
                                   r"slot for this step: .*\(reason [a-z_]+\)")
            self.assertIn("task 0: Killed", text)
            self.assertFalse([st for st in self.of_step("qpu1", key).values()
                              if st["state"] == "held"], self.of_step("qpu1", key))
        finally:
            self.end_yield_step(p, block)

    def end_yield_step(self, p, block):
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
        self.cl.run("ctl", ["scancel", "-u", "nobody"], user=False, timeout=30)
        if block is not None:
            with self.cl.client("qpu1") as c:
                try:
                    c.calibration_cancel(block["block_id"])
                except slurm_cluster.qrt_client.QrtError:
                    pass  # over already
        self.cl.point_plugin(["socket=" + slurm_cluster.qrtd_url("qpu1"),
                              "qrtd_node=tcp://%n:7071", "qrtd_nodes=qpu[1-2]",
                              "setup_margin=2s"])

    def read(self, path):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""


if __name__ == "__main__":
    why = slurm_cluster.why_not_here()
    if why:
        print(f"SKIP: {why}", file=sys.stderr)
        sys.exit(SKIP)
    unittest.main(verbosity=2)
