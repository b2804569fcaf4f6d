#!/usr/bin/env python3
"""qrt-slurm-prolog (the C program) as slurmd runs it, against a real qrtd.

qrtd and qpu-sim run as user nobody.  Root has qrtd's reader role only:
any reservation, release or cancel made as root is refused, so every one
that succeeds was made as the job's user.  Two tenants are ordinary users:
the victim (bin) and the job's user (daemon), who read their own records.  slurmctld's answer to
`scontrol show job` comes from a stand-in on PATH (the job's StartTime and
EndTime), as the Prolog's only Slurm call.

  1. The Prolog reserves as the job's user, keyed slurm:lab:<job>.job, the
     deadline and lease ending at the job's EndTime, and writes root's
     record; run again, it gets the same reservation back.  The TaskProlog,
     as the user, prints the QRT_* exports.  The Epilog releases it as the
     user, and removes the record; run again, it is harmless.
  2. A committed job of the user's is cancelled by the Epilog, with its
     fencing token, as the user.
  3. What the user writes cannot make root act for it: a comment with
     newlines naming the victim's job, and a cluster name with newlines,
     add no line to root's record (an error record: key, reason, error);
     the TaskProlog hands the error to the job on one line; the Epilog
     leaves the victim's job alone.
  4. A record that is not root's alone (the user's, holding the victim's
     job) is ignored by the Epilog and the TaskProlog.

Asserts outcomes, never timings.  Skips (exit 77) with the reason without
root, the binaries, setpriv or the users.
"""

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.environ.get("QRT_PYTHON_DIR", os.path.join(os.path.dirname(__file__),
                                                                 "../../../tools/clients/python/src")))
import qrt_client  # noqa: E402

SKIP = 77
MS = 1_000_000
S = 1_000_000_000
VICTIM = "bin"
USER = "daemon"
DAEMON_USER = "nobody"

QRTD_CONFIG = """
[agent]
log_level = "debug"
watchdog = false
[host]
apply_on_run = false
isolation = "none"
[dispatch]
mode = "untuned"
miss_tolerance_ns = 50_000_000
[timeline]
policy = "edf-backfill"
horizon_ns = 600_000_000_000
default_lease_ns = 60_000_000_000
[rpc]
socket_path = "{dir}/run/qrtd.sock"
socket_mode = "0666"
[roles]
reader = ["uid:0", "uid:{victim}", "uid:{user}"]
scheduler = ["uid:{victim}", "uid:{user}"]
admin = []
[probes]
enabled = false

[[qpu]]
name = "qpu0"
endpoint = "unix://{dir}/run/qpu0.sock"
calibration = "periodic"
period_ns = 1_000_000_000
blackout_ns = 100_000_000
fidelity_f0 = 0.99
"""

# slurmctld's answer, for the job the Prolog asks about.
SCONTROL = """#!/bin/sh
[ "$1 $2" = "show job" ] || exit 1
echo "JobId=$3 JobName=job UserId={user}({uid}) JobState=RUNNING StartTime={start} EndTime={end} Partition=x"
"""

AS_TENANT = r"""
import json, os, sys
sys.path.insert(0, os.environ["QRT_PYTHON_DIR"])
import qrt_client
args = json.loads(sys.argv[3])
with qrt_client.Client(sys.argv[1], timeout=10) as c:
    if "payload" in args:
        args["payload"] = args["payload"].encode()
    print(json.dumps(getattr(c, sys.argv[2])(**args)))
"""


def why_not_here():
    if os.geteuid() != 0:
        return "needs root (slurmd runs the Prolog and Epilog as root)"
    for var in ("QRTD", "QPU_SIM", "QRT_SLURM_PROLOG"):
        if not os.environ.get(var) or not os.path.exists(os.environ[var]):
            return f"{var} must name the built binary"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is needed to run as the tenants"
    for user in (VICTIM, USER, DAEMON_USER):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"user {user} does not exist"
    for path in (os.environ["QRTD"], os.environ["QRT_SLURM_PROLOG"]):
        r = subprocess.run(["setpriv", "--reuid", DAEMON_USER, "--regid", "nogroup",
                            "--clear-groups", "test", "-x", path], capture_output=True)
        if r.returncode != 0:
            return f"user {DAEMON_USER} cannot run {path} (a parent directory is not searchable)"
    # The TaskProlog runs as the job's user, with the build's libqrt-client.
    r = subprocess.run(["setpriv", "--reuid", USER, "--regid", "nogroup", "--clear-groups",
                        "test", "-x", os.environ["QRT_SLURM_PROLOG"]], capture_output=True)
    if r.returncode != 0:
        return (f"user {USER} (the job's) cannot run {os.environ['QRT_SLURM_PROLOG']} "
                "(a parent directory is not searchable; CI grants it by ACL, tools/dev/test_access.sh)")
    return None


def wait_for(pred, timeout_s, step_s=0.1):
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        v = pred()
        if v:
            return v
        time.sleep(step_s)
    return pred()


def fields(text):
    return [ln.split("=", 1)[0] for ln in text.splitlines() if ln and not ln.startswith("#")]


class Prolog(unittest.TestCase):
    dir = None
    procs = []

    @classmethod
    def setUpClass(cls):
        cls.victim = pwd.getpwnam(VICTIM)
        cls.user = pwd.getpwnam(USER)
        owner = pwd.getpwnam(DAEMON_USER)
        cls.dir = tempfile.mkdtemp(prefix="qrt-slurm-prolog-")
        os.chmod(cls.dir, 0o755)
        # The daemons' sockets, state and logs in folders of nobody's; the
        # top (where the prolog's state directory goes) stays root's, as /run.
        for sub in ("state", "journal", "log", "bin", "run"):
            os.mkdir(os.path.join(cls.dir, sub), 0o755)
        for sub in ("state", "journal", "log", "run"):
            os.chown(os.path.join(cls.dir, sub), owner.pw_uid, owner.pw_gid)
        cls.pydir = os.path.join(cls.dir, "py")
        shutil.copytree(os.path.dirname(os.path.abspath(qrt_client.__file__)),
                        os.path.join(cls.pydir, "qrt_client"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        for root, _, files in os.walk(cls.pydir):
            os.chmod(root, 0o755)
            for f in files:
                os.chmod(os.path.join(root, f), 0o644)
        cls.sock = os.path.join(cls.dir, "run", "qrtd.sock")
        cls.state_dir = os.path.join(cls.dir, "prolog-state")
        cfg = os.path.join(cls.dir, "qrtd.toml")
        with open(cfg, "w") as f:
            f.write(QRTD_CONFIG.format(dir=cls.dir, victim=cls.victim.pw_uid, user=cls.user.pw_uid))
        as_daemon = ["setpriv", "--reuid", DAEMON_USER, "--regid", "nogroup", "--clear-groups"]
        try:
            cls.spawn("qpu-sim", as_daemon + [os.environ["QPU_SIM"], "--listen",
                                              f"unix://{cls.dir}/run/qpu0.sock", "--duration-s", "900"])
            if not wait_for(lambda: os.path.exists(f"{cls.dir}/run/qpu0.sock"), 10):
                raise RuntimeError("qpu-sim did not listen")
            cls.spawn("qrtd", as_daemon + [os.environ["QRTD"], "run", "-c", cfg,
                                           "--state-dir", os.path.join(cls.dir, "state"),
                                           "--journal-dir", os.path.join(cls.dir, "journal")])

            def up():
                if cls.procs[-1].poll() is not None:
                    raise RuntimeError("qrtd exited")
                try:
                    with qrt_client.Client(cls.sock, timeout=5) as c:
                        return all(q.get("endpoint_up") for q in c.status()["qpus"])
                except qrt_client.QrtError:
                    return False
            if not wait_for(up, 30):
                raise RuntimeError("qrtd did not come up")
        except Exception:
            print(cls.tail("qrtd") + cls.tail("qpu-sim"), file=sys.stderr)
            cls.tearDownClass()
            raise
        cls.next_job = 200

    @classmethod
    def spawn(cls, name, argv):
        log = open(os.path.join(cls.dir, "log", name + ".out"), "ab")
        cls.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        log.close()

    @classmethod
    def tail(cls, name, n=40):
        try:
            with open(os.path.join(cls.dir, "log", name + ".out"), errors="replace") as f:
                return f"\n--- {name} ---\n" + "".join(f.readlines()[-n:])
        except OSError:
            return f"(no {name} log)"

    @classmethod
    def tearDownClass(cls):
        for p in reversed(cls.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        cls.procs = []
        if cls.dir is not None:
            shutil.rmtree(cls.dir, ignore_errors=True)

    # ------------------------------------------------------------ helpers

    def new_job(self, end_in_s=600):
        """A job id, with scontrol's answer for it: started now, ending in
        end_in_s (whole seconds, local time, as scontrol prints them)."""
        Prolog.next_job += 1
        t = int(time.time())
        fmt = "%Y-%m-%dT%H:%M:%S"
        with open(os.path.join(self.dir, "bin", "scontrol"), "w") as f:
            f.write(SCONTROL.format(user=USER, uid=self.user.pw_uid,
                                    start=time.strftime(fmt, time.localtime(t)),
                                    end=time.strftime(fmt, time.localtime(t + end_in_s))))
        os.chmod(os.path.join(self.dir, "bin", "scontrol"), 0o755)
        return Prolog.next_job, (t + end_in_s) * S

    def slurmd_env(self, job, comment, cluster="lab"):
        """A Prolog's or Epilog's environment, as slurmd gives it."""
        return {"PATH": f"{self.dir}/bin:" + os.environ.get("PATH", "/usr/bin:/bin"),
                "SLURM_JOB_ID": str(job), "SLURM_JOB_UID": str(self.user.pw_uid),
                "SLURM_JOB_GID": str(self.user.pw_gid), "SLURM_JOB_USER": USER,
                "SLURM_CLUSTER_NAME": cluster, "SLURM_JOB_COMMENT": comment}

    def run_prolog(self, mode, env, as_user=False):
        argv = [os.environ["QRT_SLURM_PROLOG"], mode, "--socket", self.sock,
                "--state-dir", self.state_dir, "--setup-margin", "1"]
        if as_user:
            argv = ["setpriv", "--reuid", USER, "--regid", str(self.user.pw_gid),
                    "--init-groups"] + argv
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd="/")
        print(f"{mode}: rc {r.returncode}\n{r.stdout}{r.stderr}", file=sys.stderr)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout, r.stderr

    def record(self, job):
        try:
            with open(os.path.join(self.state_dir, f"{job}.job")) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def status(self, rid, owner=None):
        """A reservation's record, read by its owner (root may not)."""
        return self.as_tenant(owner or self.user, "jobs_status", job_id=rid)

    def as_tenant(self, user, method, **args):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "QRT_PYTHON_DIR": self.pydir,
               "PYTHONDONTWRITEBYTECODE": "1"}
        r = subprocess.run(["setpriv", "--reuid", user.pw_name, "--regid", str(user.pw_gid),
                            "--init-groups", sys.executable, "-c", AS_TENANT, self.sock, method,
                            json.dumps(args)], capture_output=True, text=True, env=env,
                           timeout=60, cwd="/")
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def victim_commits(self):
        held = self.as_tenant(self.victim, "slots_reserve", duration_ns=MS,
                              idempotency_key=f"victim-{time.time_ns()}",
                              not_before_ns=time.time_ns() + 120 * S)
        done = self.as_tenant(self.victim, "jobs_submit", payload="H 0; MEASURE",
                              reservation_id=held["reservation_id"],
                              fencing_token=held["fencing_token"])
        self.assertEqual(done["state"], "committed", done)
        return held, self.status(held["reservation_id"], self.victim)

    # ------------------------------------------------------------ cases

    def test_1_the_slot_is_reserved_and_given_back_as_the_jobs_user(self):
        job, end_ns = self.new_job()
        env = self.slurmd_env(job, "nightly qpu:duration=1ms,not-before=+60s")
        self.run_prolog("prolog", env)
        text = self.record(job)
        self.assertIsNotNone(text, "no record")
        st = os.stat(os.path.join(self.state_dir, f"{job}.job"))
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (0, 0o644))
        rec = dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln and ln[0] != "#")
        rid = int(rec["ids"])
        got = self.status(rid)
        self.assertEqual((got["tenant"], got["state"]), (USER, "held"), got)
        self.assertEqual(got["idempotency_key"], f"slurm:lab:{job}.job")
        self.assertEqual(rec["socket"], self.sock)
        self.assertLessEqual(int(rec["lease_expires_ns"]), end_ns + S, rec)
        # Run again (a retried Prolog): the same reservation.
        self.run_prolog("prolog", env)
        again = dict(ln.split("=", 1) for ln in self.record(job).splitlines() if "=" in ln and ln[0] != "#")
        self.assertEqual(again["ids"], rec["ids"])
        # The TaskProlog, as the user, with the job's own environment.
        out, _ = self.run_prolog("task-prolog", {"SLURM_JOB_ID": str(job), "PATH": "/usr/bin:/bin"},
                                 as_user=True)
        exports = dict(ln[len("export "):].split("=", 1) for ln in out.splitlines()
                       if ln.startswith("export "))
        self.assertEqual(exports["QRT_RESERVATION_ID"], str(rid), out)
        self.assertEqual(exports["QRT_SOCKET"], self.sock)
        self.assertEqual(exports["QRT_IDEMPOTENCY_KEY"], f"slurm:lab:{job}.job")
        self.assertEqual(int(exports["QRT_SUBMIT_BY_NS"]), int(exports["QRT_SLOT_START_NS"]) - 300 * MS)
        # The Epilog: released, as the user (root could not).
        _, err = self.run_prolog("epilog", env)
        self.assertEqual(self.status(rid)["state"], "released", err)
        self.assertIn(f"(as uid {self.user.pw_uid})", err)
        self.assertIsNone(self.record(job))
        self.run_prolog("epilog", env)

    def test_2_a_committed_job_is_cancelled_with_its_token_as_the_user(self):
        job, _ = self.new_job()
        env = self.slurmd_env(job, "qpu:duration=1ms,not-before=+90s")
        self.run_prolog("prolog", env)
        rec = dict(ln.split("=", 1) for ln in self.record(job).splitlines() if "=" in ln and ln[0] != "#")
        rid = int(rec["ids"])
        done = self.as_tenant(self.user, "jobs_submit", payload="H 0; MEASURE", reservation_id=rid,
                              fencing_token=int(rec["fencing_token"]))
        self.assertEqual(done["state"], "committed")
        _, err = self.run_prolog("epilog", env)
        self.assertEqual(self.status(rid)["state"], "cancelled", err)
        self.assertIsNone(self.record(job))

    def test_3_what_the_user_writes_adds_no_line_to_roots_record(self):
        held, before = self.victim_commits()
        vid = held["reservation_id"]
        lines = f"\nids={vid}\nfencing_token={held['fencing_token']}\nsocket=/tmp/evil.sock\n"
        job, _ = self.new_job()
        env = self.slurmd_env(job, f"qpu:duration=1ms,priority=x{lines}")
        self.run_prolog("prolog", env)
        text = self.record(job)
        self.assertEqual(sorted(fields(text)), ["error", "key", "reason"], text)
        self.assertIn("priority: 'x' is not an integer", text)
        out, _ = self.run_prolog("task-prolog", {"SLURM_JOB_ID": str(job)}, as_user=True)
        want = "qrt: the job comment's qpu: request: priority: 'x' is not an integer in [-2147483648, 2147483647]"
        self.assertEqual(out.splitlines(), [f"export QRT_ERROR={want}", f"print {want}"], out)
        self.run_prolog("epilog", env)
        self.assertIsNone(self.record(job))
        self.assertEqual(self.status(vid, self.victim), before)

        # A cluster name with lines of its own: no reservation, no line.
        job, _ = self.new_job()
        self.run_prolog("prolog", self.slurmd_env(job, "qpu:duration=1ms", cluster="lab" + lines))
        text = self.record(job)
        self.assertEqual(sorted(fields(text)), ["error", "key", "reason"], text)
        self.assertIn("ClusterName", text)
        self.run_prolog("epilog", self.slurmd_env(job, "qpu:duration=1ms"))
        self.assertEqual(self.status(vid, self.victim), before)

    def test_4_a_record_that_is_not_roots_alone_is_not_acted_on(self):
        held, before = self.victim_commits()
        job, _ = self.new_job()
        os.makedirs(self.state_dir, exist_ok=True)
        path = os.path.join(self.state_dir, f"{job}.job")
        with open(path, "w") as f:
            f.write(f"socket={self.sock}\nkey=slurm:lab:{job}.job\nids={held['reservation_id']}\nqpus=qpu0\n"
                    f"fencing_token={held['fencing_token']}\nstart_ns=0\nend_ns=0\nlease_expires_ns=0\n")
        os.chown(path, self.user.pw_uid, self.user.pw_gid)
        _, err = self.run_prolog("epilog", self.slurmd_env(job, ""))
        self.assertIn("is not root's alone; ignored", err)
        self.assertEqual(self.status(held["reservation_id"], self.victim), before)
        self.assertTrue(os.path.exists(path))
        out, _ = self.run_prolog("task-prolog", {"SLURM_JOB_ID": str(job)}, as_user=True)
        self.assertTrue(out.startswith("export QRT_ERROR=qrt: the job's reservation record"), out)
        self.assertNotIn("QRT_RESERVATION_ID", out)
        os.unlink(path)


if __name__ == "__main__":
    why = why_not_here()
    if why:
        print(f"SKIP: {why}", file=sys.stderr)
        sys.exit(SKIP)
    unittest.main(verbosity=2)
