#!/usr/bin/env python3
"""spank_qrt.so against a real Slurm (slurm-wlm 22.05) on loopback.

One lab (slurm_lab.py: munged, qpu-sim, qrtd as root with its partition
applied and one QPU per isolatable core, at most two; slurmctld and slurmd
configured from `qrtd host plan --slurm`) serves every case, in order.  Jobs
run as user nobody.

  1. sbatch and srun jobs reserve, submit their payload into the
     reservation (C and Python job sides), qrtd dispatches it to qpu-sim in
     the slot, the job prints the results; every slot is in the ledger
     with the job's key, is over by the end, and concurrent jobs never
     overlap on a QPU.
  2. --qpu-count=2: one start on two QPUs (through qrtd when it dispatches
     two QPUs here, else through qrt-test-server, its socket side).
  3. scancel of a running job releases its held slot, as the job's user
     (slurmd's log: "(as uid 65534)"), never as root.
  4. a reservation qrtd cannot make fails the step at once, with the reason
     and the next possible start in the job's stderr; the task never runs.
  5. kill -9 of the job's slurmstepd: the acknowledged reservation stays,
     its lease ends by the job's end, and the job epilog releases it, as
     the job's user.
  6. kill -9 of qrtd: after the restart every acknowledged reservation is
     there, and the step's end releases it.
  7. qrtd stopped: the health check drains the node with the reason; qrtd
     back: the node is resumed.
  8. a site whose slurm.conf lacks the plan's CpuSpecList: a step whose
     cpuset reaches the isolated CPU is refused with the message.
  9. --gres=qpu:N runs where the node has N QPUs, and is refused beyond.
 10. without SPANK, qrt-slurm-prolog as Prolog/TaskProlog/Epilog gives a
     job the same slot and QRT_* variables, idempotently, keyed by job id.
 11. the README's example batch script (tools/integrations/slurm/job.sbatch) runs as written.
 12. a step asking for a start inside a calibration block qrtd granted is
     refused, naming the block and the earliest start after it.

Asserts outcomes, never timings.  Skips (exit 77) with the reason when
Slurm, munge, root or the plugin are missing.
"""

import calendar
import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slurm_lab  # noqa: E402
from slurm_lab import wait_for  # noqa: E402

SKIP = 77
MS = 1_000_000
JOB_C = os.environ.get("JOB_EXAMPLE", "")
JOB_PY = os.path.join(os.environ.get("QRT_SLURM_TOOLS", ""), "job_example.py")
FINAL = {"completed", "failed", "missed", "released", "cancelled", "expired", "displaced"}


def env_of(text):
    """QRT_* lines a job printed with `env`."""
    return dict(m.groups() for m in re.finditer(r"^(QRT_[A-Z_]+)=(.*)$", text, re.M))


class SlurmQrt(unittest.TestCase):
    lab = None

    @classmethod
    def setUpClass(cls):
        cls.lab = slurm_lab.Lab()
        try:
            cls.lab.start()
        except Exception:
            cls.lab.stop()
            cls.lab.leftover_qrt_cgroups()
            print(cls.lab.tail("slurmd.log") + cls.lab.tail("slurmctld.log"), file=sys.stderr)
            cls.lab.cleanup()
            raise
        cls.reservations = {}  # id -> job label

    @classmethod
    def tearDownClass(cls):
        if cls.lab is not None:
            cls.lab.stop()
            left = cls.lab.leftover_qrt_cgroups()
            if left:
                print(f"note: qrtd's restore left {left} (tasks forked after its sweep); "
                      "removed by the test", file=sys.stderr)
            cls.lab.cleanup()

    # ---------------------------------------------------------------- helpers

    def sbatch(self, script, *opts, name="job"):
        path = os.path.join(self.lab.scripts, name + ".sh")
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + script)
        os.chmod(path, 0o755)
        out = os.path.join(self.lab.jobs, name + ".out")
        err = os.path.join(self.lab.jobs, name + ".err")
        r = self.lab.run(["sbatch", "--parsable", "-t", "3", "-o", out, "-e", err, *opts, path])
        self.assertEqual(r.returncode, 0, f"sbatch {name}: {r.stderr}")
        return int(r.stdout.strip().split(";")[0]), out, err

    def read(self, path):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""

    def status(self, rid):
        with self.lab.client() as c:  # root: admin, sees every tenant
            return c.jobs_status(rid)

    def diag(self):
        return self.lab.tail("slurmd.log", 40) + self.lab.tail(
            [k for k in sorted(os.listdir(os.path.join(self.lab.dir, "log"))) if k.startswith("qrtd-")][-1], 20)

    def wait_running_with_env(self, job_id, out):
        """The QRT_* env the job printed once it runs."""
        got = wait_for(lambda: "QRT_RESERVATION_ID=" in self.read(out) and env_of(self.read(out)),
                       60, 0.2)
        self.assertTrue(got, f"job {job_id} never printed its QRT_* env: {self.read(out)}"
                             + self.diag())
        return got

    # ---------------------------------------------------------------- cases

    def test_01_jobs_reserve_submit_and_read_results_without_overlap(self):
        c_job = (f"env | grep '^QRT_'\n"
                 f"srun {JOB_C} --payload 'bell pair' --timeout-s 60\n")
        py_job = (f"env | grep '^QRT_'\n"
                  f"python3 {JOB_PY} --payload 'ghz' --timeout-s 60\n")
        jobs = []
        # Concurrent jobs (the partition oversubscribes its one CPU).
        for i in range(3):
            jobs.append(("c", i, *self.sbatch(c_job, "--qpu-duration=20ms", name=f"c{i}")))
            jobs.append(("py", i, *self.sbatch(py_job, "--qpu-duration=20ms", name=f"py{i}")))
        srun = self.lab.run(["srun", "-t", "2", "--qpu-duration=5ms", "sh", "-c",
                             f"env | grep '^QRT_'; {JOB_C} --payload srun-direct"], timeout=120)
        self.assertEqual(srun.returncode, 0, srun.stdout + srun.stderr + self.diag())
        self.assertIn("state completed", srun.stdout)

        by_qpu = {}
        for kind, i, job_id, out, err in jobs:
            state = self.lab.wait_job_done(job_id)
            text = self.read(out)
            self.assertEqual(state, "COMPLETED", f"{kind}{i} job {job_id}: {text}{self.read(err)}"
                             + self.diag())
            env = env_of(text)
            rid = int(env["QRT_RESERVATION_ID"])
            self.assertEqual(env["QRT_SOCKET"], self.lab.sock)
            self.assertEqual(env["QRT_IDEMPOTENCY_KEY"], f"slurm:{slurm_lab.CLUSTER}:{job_id}.batch")
            if kind == "c":
                self.assertRegex(text, rf"qrt-job: reservation {rid} qpu qpu\d state completed")
            else:
                res = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
                self.assertEqual([r["state"] for r in res], ["completed"], text)
                self.assertTrue(res[0].get("result"), text)
            st = self.status(rid)
            # The ledger has it, under the job's key, over by now.
            self.assertEqual(st["idempotency_key"], env["QRT_IDEMPOTENCY_KEY"])
            self.assertEqual(st["tenant"], "nobody")
            self.assertEqual(st["state"], "completed", st)
            self.assertEqual(st["start_ns"], int(env["QRT_SLOT_START_NS"]))
            by_qpu.setdefault(st["qpu"], []).append((st["start_ns"], st["end_ns"], job_id))
        for qpu, slots in by_qpu.items():
            slots.sort()
            for (s0, e0, j0), (s1, e1, j1) in zip(slots, slots[1:]):
                self.assertLessEqual(e0, s1, f"jobs {j0} and {j1} overlap on {qpu}")
        # The step state files are gone: every step released at its end.
        self.assertEqual(os.listdir(os.path.join(self.lab.dir, "spank-state")), [])

    def test_02_a_gang_of_two_gets_one_start_on_both_qpus(self):
        if self.lab.nqpus >= 2:
            sock, dispatched = self.lab.sock, True
        else:
            # qrtd dispatches one QPU on this host (one isolated core); the
            # gang goes to qrtd's socket side with two QPUs, undispatched.
            sock, dispatched = self.lab.start_test_server(), False
            now = time.time_ns()
            with slurm_lab.qrt_client.Client(sock, timeout=10) as c:
                c.calibration_update("qpu1", [{"calibration_id": 9001, "valid_from_ns": now,
                                               "valid_until_ns": now + 600_000 * MS}])
            self.lab.point_plugin_at(sock)
        try:
            job = (f"{JOB_C} --payload gang" if dispatched else
                   f"python3 -c \"import os,sys; sys.path.insert(0,'{os.environ['QRT_PYTHON_DIR']}'); "
                   "import qrt_client as q; c=q.Client(); e=os.environ; "
                   "r=c.jobs_submit(b'gang', reservation_id=int(e['QRT_RESERVATION_ID'].split(',')[0]), "
                   "fencing_token=int(e['QRT_FENCING_TOKEN'])); print('submitted', r['state'])\"")
            r = self.lab.run(["srun", "-t", "2", "--qpu-duration=10ms", "--qpu-count=2", "sh",
                              "-c", f"env | grep '^QRT_'; {job}"], timeout=120)
        finally:
            self.lab.point_plugin_at(self.lab.sock)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr + self.diag())
        env = env_of(r.stdout)
        self.assertEqual(env["QRT_SOCKET"], sock)
        ids = [int(x) for x in env["QRT_RESERVATION_ID"].split(",")]
        self.assertEqual(len(ids), 2)
        self.assertEqual(sorted(env["QRT_QPUS"].split(",")), ["qpu0", "qpu1"])
        with slurm_lab.qrt_client.Client(sock, timeout=10) as c:
            sts = [c.jobs_status(i) for i in ids]
        self.assertEqual(sts[0]["start_ns"], sts[1]["start_ns"])
        self.assertEqual(sts[0]["start_ns"], int(env["QRT_SLOT_START_NS"]))
        self.assertNotEqual(sts[0]["qpu"], sts[1]["qpu"])
        self.assertEqual(sts[0]["gang_id"], sts[1]["gang_id"])
        if dispatched:
            self.assertEqual([s["state"] for s in sts], ["completed", "completed"], sts)
            self.assertEqual(len(re.findall(r"state completed", r.stdout)), 2, r.stdout)
        else:
            self.assertIn("submitted committed", r.stdout)
            # Never dispatched: the step's end gave both slots back.
            self.assertEqual([s["state"] for s in sts], ["cancelled", "cancelled"], sts)

    def test_03_scancel_releases_the_running_jobs_slot(self):
        job_id, out, _ = self.sbatch("env | grep '^QRT_'\nsleep 300\n", "--qpu-duration=5ms",
                                     "--qpu-not-before=+120s", name="cancel")
        env = self.wait_running_with_env(job_id, out)
        rid = int(env["QRT_RESERVATION_ID"])
        self.assertEqual(self.status(rid)["state"], "held")
        subprocess.run(["scancel", str(job_id)], env=self.lab.env, check=True)
        self.assertTrue(wait_for(lambda: self.status(rid)["state"] == "released", 30, 0.2),
                        f"{self.status(rid)}" + self.diag())
        self.assert_given_back_as_the_user(rid)

    def assert_given_back_as_the_user(self, rid, by=""):
        """slurmstepd (or the job epilog) gave rid back as the job's user,
        never as root (spank_qrt(8), WHO TALKS TO QRTD)."""
        log = os.path.join(self.lab.dir, "log", "slurmd.log")
        got = wait_for(lambda: re.search(rf"{by}.*released reservation {rid} \(as uid (\d+)\)",
                                         self.read(log)), 10, 0.2)
        self.assertTrue(got, f"reservation {rid} was not given back as the user" + self.diag())
        self.assertEqual(int(got.group(1)), slurm_lab.NOBODY)

    def test_04_a_reservation_that_cannot_be_made_fails_the_step_with_the_next_start(self):
        with self.lab.client() as c:
            windows = c.calibration_get("qpu0")
        now = time.time_ns()
        w = next(w for w in windows if w["valid_from_ns"] > now + 5_000 * MS)
        # A 100 ms slot from 50 ms before a window opens, due 50 ms after:
        # no window holds it; without the deadline it starts when W opens.
        nb = (w["valid_from_ns"] - 50 * MS) / 1e9
        dl = (w["valid_from_ns"] + 50 * MS) / 1e9
        r = self.lab.run(["srun", "-t", "2", "--qpu-duration=100ms",
                          f"--qpu-not-before=@{nb:.3f}", f"--qpu-deadline=@{dl:.3f}",
                          "sh", "-c", "echo TASK-RAN"], timeout=60)
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("TASK-RAN", r.stdout)
        self.assertIn("qrt: no QPU slot for this step", r.stderr)
        self.assertIn("reason no_fit", r.stderr)
        at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(w["valid_from_ns"] // 1_000_000_000))
        self.assertIn(f"the next possible start is {at}", r.stderr)

        # Through sbatch: the message is in the job's stderr file, the job failed.
        job_id, out, err = self.sbatch("echo TASK-RAN\n", "--qpu-duration=5ms",
                                       "--qpu-min-fidelity=0.9999", name="nofit")
        self.assertEqual(self.lab.wait_job_done(job_id), "FAILED")
        self.assertNotIn("TASK-RAN", self.read(out))
        self.assertIn("reason no_fit", self.read(err))
        self.assertIn("min_fidelity", self.read(err))

        # A bad option is refused at submission, before any job exists.
        bad = self.lab.run(["srun", "--qpu-duration=soon", "true"])
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--qpu-duration: 'soon' is not a duration", bad.stderr)

    def test_05_kill9_of_slurmstepd_keeps_the_reservation_and_the_epilog_releases_it(self):
        job_id, out, _ = self.sbatch("env | grep '^QRT_'\nsleep 300\n", "--qpu-duration=5ms",
                                     "--qpu-not-before=+120s", name="stepd")
        env = self.wait_running_with_env(job_id, out)
        rid = int(env["QRT_RESERVATION_ID"])
        pids = [int(p) for p in subprocess.run(
            ["pgrep", "-f", rf"^slurmstepd: \[{job_id}\.batch\]"], capture_output=True,
            text=True).stdout.split()]
        self.assertEqual(len(pids), 1, "the batch step's slurmstepd")
        os.kill(pids[0], signal.SIGKILL)
        st = self.status(rid)
        self.assertEqual(st["state"], "held")  # acknowledged: not lost
        # The lease never outlives the job (3 min limit, plus the clock's
        # second of rounding): no slot is booked forever.
        self.assertLessEqual(st["lease_expires_ns"], time.time_ns() + 181 * 1_000_000_000)
        state_file = os.path.join(self.lab.dir, "spank-state", f"{job_id}.batch")
        self.assertTrue(os.path.exists(state_file))
        subprocess.run(["scancel", str(job_id)], env=self.lab.env, check=True)
        self.assertTrue(wait_for(lambda: self.status(rid)["state"] == "released", 60, 0.5),
                        f"{self.status(rid)}" + self.diag())
        self.assertFalse(os.path.exists(state_file))
        self.assert_given_back_as_the_user(rid, by="job epilog: ")

    def test_06_kill9_of_qrtd_loses_no_acknowledged_reservation(self):
        job_id, out, _ = self.sbatch("env | grep '^QRT_'\nsleep 300\n", "--qpu-duration=5ms",
                                     "--qpu-not-before=+120s", name="qrtd9")
        env = self.wait_running_with_env(job_id, out)
        rid = int(env["QRT_RESERVATION_ID"])
        before = self.status(rid)
        self.lab.stop_qrtd(signal.SIGKILL)
        try:
            self.lab.start_qrtd()
        except Exception:
            subprocess.run(["scancel", str(job_id)], env=self.lab.env)
            raise
        after = self.status(rid)
        self.assertEqual(after["state"], "held")
        for k in ("start_ns", "end_ns", "fencing_token", "lease_expires_ns", "idempotency_key"):
            self.assertEqual(after[k], before[k], k)
        subprocess.run(["scancel", str(job_id)], env=self.lab.env, check=True)
        self.assertTrue(wait_for(lambda: self.status(rid)["state"] == "released", 60, 0.5),
                        f"{self.status(rid)}" + self.diag())

    def test_07_health_check_drains_without_qrtd_and_resumes_after(self):
        self.lab.stop_qrtd()
        drained = wait_for(lambda: (lambda s: s and "DRAIN" in s[0] and s)(self.lab.node_state()),
                           40, 0.5)
        self.assertTrue(drained, f"node never drained: {self.lab.node_state()}")
        self.assertTrue(drained[1].startswith("qrtd:"), drained)
        self.assertIn("exit 69", drained[1])  # unreachable
        self.lab.start_qrtd()
        resumed = wait_for(lambda: (lambda s: s and "DRAIN" not in s[0] and s)(self.lab.node_state()),
                           40, 0.5)
        self.assertTrue(resumed, f"node never resumed: {self.lab.node_state()}")

    def test_08_a_step_whose_cpuset_reaches_the_isolated_cpu_is_refused(self):
        with self.lab.client() as c:
            isolated = c.status()["partition"]["isolated_cpus"]
        self.assertTrue(isolated, "qrtd isolated no CPU")
        # With the plan's CpuSpecList a step cannot get both CPUs...
        ok = self.lab.run(["srun", "-t", "1", "--qpu-duration=1ms", "sh", "-c",
                           "grep Cpus_allowed_list /proc/self/status"], timeout=60)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        # ...without it (a site that skipped the plan), a 2-CPU step can.
        self.lab.restart_slurm(cpuspec=False)
        try:
            r = self.lab.run(["srun", "-t", "1", "-c", "2", "--qpu-duration=1ms", "sh", "-c",
                              "echo TASK-RAN"], timeout=60)
            self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertNotIn("TASK-RAN", r.stdout)
            self.assertIn("qrt: refusing this step: its cpuset", r.stderr)
            self.assertIn(f"isolated: {isolated}", r.stderr)
            self.assertIn("CpuSpecList", r.stderr)
        finally:
            self.lab.restart_slurm(cpuspec=True)


    def test_09_the_qpu_gres_places_jobs_on_nodes_that_have_one(self):
        have = self.lab.nqpus
        ok = self.lab.run(["srun", "-t", "1", f"--gres=qpu:{have}", "sh", "-c",
                           "echo GRES-OK"], timeout=60)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertIn("GRES-OK", ok.stdout)
        more = self.lab.run(["srun", "-t", "1", "--immediate=5", f"--gres=qpu:{have + 1}",
                             "true"], timeout=60)
        self.assertNotEqual(more.returncode, 0)
        self.assertIn("Requested node configuration is not available", more.stderr)


    def test_10_without_spank_the_prolog_scripts_give_the_same_slot(self):
        wrapper = self.lab.use_prolog_scripts(True)
        state = os.path.join(self.lab.dir, "prolog-state")
        try:
            job_id, out, err = self.sbatch(f"env | grep '^QRT_'\n{JOB_C} --payload prolog\n",
                                           "--comment=qpu:duration=20ms", name="prolog")
            self.assertEqual(self.lab.wait_job_done(job_id), "COMPLETED",
                             self.read(out) + self.read(err) + self.diag())
            text = self.read(out)
            env = env_of(text)
            rid = int(env["QRT_RESERVATION_ID"])
            self.assertEqual(env["QRT_IDEMPOTENCY_KEY"], f"slurm:{slurm_lab.CLUSTER}:{job_id}.job")
            self.assertRegex(text, rf"qrt-job: reservation {rid} qpu qpu0 state completed")
            st = self.status(rid)
            self.assertEqual((st["tenant"], st["state"]), ("nobody", "completed"))
            self.assertTrue(wait_for(lambda: not os.path.exists(f"{state}/{job_id}.job"), 30))

            # A request qrtd cannot meet reaches the job as QRT_ERROR.
            job_id, out, _ = self.sbatch("echo \"error=$QRT_ERROR\"\n",
                                         "--comment=qpu:duration=5ms,min-fidelity=0.9999",
                                         name="prolog-nofit")
            self.assertEqual(self.lab.wait_job_done(job_id), "COMPLETED")
            self.assertIn("error=qrt: no QPU slot for this job", self.read(out))
            self.assertIn("(reason no_fit)", self.read(out))

            # Idempotent, keyed by SLURM_JOB_ID: the Prolog run again for a
            # running job gets its reservation back; scancel, and the Epilog
            # releases it (run again, it is harmless).
            job_id, out, _ = self.sbatch("env | grep '^QRT_'\nsleep 300\n",
                                         "--comment=qpu:duration=5ms,not-before=+60s",
                                         name="prolog-again")
            rid = int(self.wait_running_with_env(job_id, out)["QRT_RESERVATION_ID"])
            env = dict(self.lab.env, SLURM_JOB_ID=str(job_id), SLURM_JOB_UID=str(slurm_lab.NOBODY),
                       SLURM_JOB_GID=str(slurm_lab.NOGROUP), SLURM_JOB_USER="nobody",
                       SLURM_CLUSTER_NAME=slurm_lab.CLUSTER,
                       SLURM_JOB_COMMENT="qpu:duration=5ms,not-before=+60s")
            subprocess.run([wrapper, "prolog"], env=env, check=True)
            with open(f"{state}/{job_id}.job") as f:
                rec = dict(ln.split("=", 1) for ln in f.read().splitlines()
                           if "=" in ln and not ln.startswith("#"))
            self.assertEqual(rec.get("ids"), str(rid), rec)
            self.assertEqual(self.status(rid)["state"], "held")
            subprocess.run(["scancel", str(job_id)], env=self.lab.env, check=True)
            self.assertTrue(wait_for(lambda: self.status(rid)["state"] == "released", 60, 0.5),
                            f"{self.status(rid)}" + self.diag())
            self.assertTrue(wait_for(lambda: not os.path.exists(f"{state}/{job_id}.job"), 30))
            subprocess.run([wrapper, "epilog"], env=env, check=True)
        finally:
            self.lab.use_prolog_scripts(False)


    def test_11_the_readme_example_job_runs_as_written(self):
        script = os.path.join(os.environ["QRT_SLURM_TOOLS"], "job.sbatch")
        r = self.lab.run(["sbatch", "--parsable", f"--export=ALL,PATH={os.path.dirname(JOB_C)}:"
                          + os.environ.get("PATH", "/usr/bin:/bin"), script])
        self.assertEqual(r.returncode, 0, r.stderr)
        job_id = int(r.stdout.strip().split(";")[0])
        self.assertEqual(self.lab.wait_job_done(job_id), "COMPLETED")
        text = self.read(os.path.join(self.lab.jobs, f"qpu-example-{job_id}.out"))
        self.assertRegex(text, r"slot: qpu\d from \d+ to \d+ \(reservation \d+\)")
        self.assertRegex(text, r"qrt-job: reservation \d+ qpu qpu\d state completed")


    def test_12_a_step_inside_a_calibration_block_is_refused_naming_it(self):
        # A calibration block on every QPU (root holds the calibration role
        # here), 800 ms of a 900 ms window, ending by needed_by 30 s ahead.
        needed_by = time.time_ns() + 30_000 * MS
        qpus = [f"qpu{i}" for i in range(self.lab.nqpus)]
        with self.lab.client() as c:
            blocks = [c.calibration_request(q, "slurm_probe", 800 * MS, needed_by, f"slurm-probe-{q}")
                      for q in qpus]
        try:
            for b in blocks:
                self.assertEqual(b["state"], "scheduled", b)
            start = max(b["start_ns"] for b in blocks)
            end = min(b["end_ns"] for b in blocks)
            self.assertGreater(end - start, 500 * MS, blocks)
            # A 100 ms step from 200 ms into the block, due 300 ms later:
            # the window holds it; only the block stands in its way.
            nb, dl = (start + 200 * MS) / 1e9, (start + 500 * MS) / 1e9
            r = self.lab.run(["srun", "-t", "2", "--qpu-duration=100ms", f"--qpu-not-before=@{nb:.3f}",
                              f"--qpu-deadline=@{dl:.3f}", "sh", "-c", "echo TASK-RAN"], timeout=60)
            self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertNotIn("TASK-RAN", r.stdout)
            self.assertIn("qrt: no QPU slot for this step", r.stderr)
            self.assertIn("reason no_fit", r.stderr)
            # It names each block, and the earliest start after it.
            for b in blocks:
                m = re.search(rf"calibration block {b['block_id']} \(step slurm_probe\) holds qpu {b['qpu']} "
                              rf"from {b['start_ns']} to {b['end_ns']}; the earliest start after it is (\d+)",
                              r.stderr)
                self.assertTrue(m, r.stderr)
                self.assertGreaterEqual(int(m.group(1)), b["end_ns"], r.stderr)
            # The plugin's next possible start lies after the blocks.
            m = re.search(r"the next possible start is (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z", r.stderr)
            self.assertTrue(m, r.stderr)
            at_ms = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) * 1000 + int(m.group(2))
            self.assertGreaterEqual(at_ms, end // MS, r.stderr)
        finally:
            with self.lab.client() as c:
                for b in blocks:
                    c.calibration_cancel(b["block_id"])


def main():
    why = slurm_lab.why_not_here()
    if why:
        print(f"SKIP: {why}")
        return SKIP
    prog = unittest.main(exit=False, verbosity=2)
    # A skipped test shows as skipped in ctest, never as a pass.
    return 1 if not prog.result.wasSuccessful() else SKIP if prog.result.skipped else 0


if __name__ == "__main__":
    sys.exit(main())
