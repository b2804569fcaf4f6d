#!/usr/bin/env python3
"""spank_qrt.so in slurmstepd's place, with a job environment the user wrote.

spank-harness (spank_harness.c) loads the built plugin and calls its
callbacks in slurmstepd's order and with its privileges: root, the job's
user around user_init and in the task.  qrtd and qpu-sim run as user nobody;
two tenants are ordinary users: the victim (bin) and the job's user, the
attacker (daemon).  The victim commits a job into a slot two minutes ahead;
the attacker reserves a slot of their own, and so learns a token next to
the victim's if tokens are predictable.

  1. The attacker's step environment names the victim's committed job
     (QRT_RESERVED_BY=srun, the step's own QRT_IDEMPOTENCY_KEY, and
     QRT_NODE_RESERVATIONS with the victim's id and the guessed token): the
     victim's job is untouched, and the plugin made no connection as root.
     Then the same with every check of the entry passed (qrtd_node= is set,
     qrtd listens on tcp:// with a real munged, and the entry names this
     node): the node's part is given back as the job's user, qrtd answers
     not_owner, the victim's job is untouched, no connection as root.
  2. The relay: with qrtd_node=tcp://%n:PORT, the entry names a host where
     the user runs a listener (127.0.0.2:PORT); the plugin never connects
     to it, nor anywhere else as root.
  3. A newline in the cluster name: SLURM_CLUSTER_NAME in the job's
     environment carrying whole state-file lines naming the victim's job
     injects nothing into root's state file (the name comes from slurm.conf),
     and the job epilog gives back only the step's own slot, as the user; a
     ClusterName with a newline fails the step with the reason, and no
     state file is written.
  4. A step's own slot is reserved and given back, every connection made
     as the job's user: none as root.

Asserts outcomes, never timings.  Skips (exit 77) with the reason without
root, the plugin, the harness, setpriv or the users.
"""

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.environ.get("QRT_PYTHON_DIR", os.path.join(os.path.dirname(__file__),
                                                                 "../../../tools/python")))
import qrt_client  # noqa: E402

SKIP = 77
MS = 1_000_000
S = 1_000_000_000
VICTIM = "bin"
ATTACKER = "daemon"
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
socket_path = "{dir}/qrtd.sock"
socket_group = "{group}"
socket_mode = "0666"
{listen}
[roles]
reader = ["uid:{victim}", "uid:{attacker}"]
scheduler = ["uid:{victim}", "uid:{attacker}"]
admin = ["uid:0"]
[probes]
enabled = false

[[qpu]]
name = "qpu0"
endpoint = "unix://{dir}/qpu0.sock"
calibration = "periodic"
period_ns = 1_000_000_000
blackout_ns = 100_000_000
fidelity_f0 = 0.99
"""

# A client call as one of the tenants: argv[1] is the method of Client,
# argv[2] its JSON arguments; the JSON result (or error) on stdout.
AS_TENANT = r"""
import json, os, sys
sys.path.insert(0, os.environ["QRT_PYTHON_DIR"])
import qrt_client
args = json.loads(sys.argv[3])
try:
    with qrt_client.Client(sys.argv[1], timeout=10) as c:
        if "payload" in args:
            args["payload"] = args["payload"].encode()
        print(json.dumps({"ok": getattr(c, sys.argv[2])(**args)}))
except qrt_client.RpcError as e:
    print(json.dumps({"reason": e.reason, "message": e.message}))
"""


def why_not_here():
    if os.geteuid() != 0:
        return "needs root (slurmstepd's privileges)"
    for var in ("QRTD", "QPU_SIM", "SPANK_QRT", "SPANK_HARNESS"):
        if not os.environ.get(var) or not os.path.exists(os.environ[var]):
            return f"{var} must name the built binary (spank_qrt.so needs libslurm-dev)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is needed to run as the tenants"
    for user in (VICTIM, ATTACKER, DAEMON_USER):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"user {user} does not exist"
    # The tenants load the Python client, qrtd its binary, from the tree.
    for path in (os.environ["QRTD"], os.environ["SPANK_QRT"]):
        r = subprocess.run(["setpriv", "--reuid", DAEMON_USER, "--regid", "nogroup",
                            "--clear-groups", "test", "-r", path], capture_output=True)
        if r.returncode != 0:
            return f"user {DAEMON_USER} cannot read {path} (a parent directory is not searchable)"
    return None


def wait_for(pred, timeout_s, step_s=0.1):
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        v = pred()
        if v:
            return v
        time.sleep(step_s)
    return pred()


class Relay:
    """A listener the job's user could run: counts who connects and what
    they send; answers nothing."""

    def __init__(self, host):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = []
        self.received = b""
        self.stop = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stop:
            try:
                conn, peer = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.accepted.append(peer)
            conn.settimeout(3)
            try:
                while True:
                    data = conn.recv(4096)
                    if not data:
                        break
                    self.received += data
            except OSError:
                pass
            conn.close()

    def close(self):
        self.stop = True
        self.thread.join(5)
        self.sock.close()


class SpankHarness(unittest.TestCase):
    dir = None
    procs = []

    @classmethod
    def setUpClass(cls):
        cls.victim = pwd.getpwnam(VICTIM)
        cls.attacker = pwd.getpwnam(ATTACKER)
        owner = pwd.getpwnam(DAEMON_USER)
        cls.dir = tempfile.mkdtemp(prefix="qrt-spank-harness-")
        os.chmod(cls.dir, 0o755)
        for sub in ("state", "journal", "log"):
            os.mkdir(os.path.join(cls.dir, sub), 0o755)
            os.chown(os.path.join(cls.dir, sub), owner.pw_uid, owner.pw_gid)
        os.chown(cls.dir, owner.pw_uid, owner.pw_gid)
        cls.sock = os.path.join(cls.dir, "qrtd.sock")
        cls.cfg = os.path.join(cls.dir, "qrtd.toml")
        as_daemon = ["setpriv", "--reuid", DAEMON_USER, "--regid", "nogroup", "--clear-groups"]
        try:
            listen = cls.start_munge()
            with open(cls.cfg, "w") as f:
                f.write(QRTD_CONFIG.format(dir=cls.dir, group="nogroup", victim=cls.victim.pw_uid,
                                           attacker=cls.attacker.pw_uid, listen=listen))
            cls.spawn("qpu-sim", as_daemon + [os.environ["QPU_SIM"], "--listen",
                                              f"unix://{cls.dir}/qpu0.sock", "--duration-s", "900"])
            if not wait_for(lambda: os.path.exists(f"{cls.dir}/qpu0.sock"), 10):
                raise RuntimeError("qpu-sim did not listen: " + cls.tail("qpu-sim"))
            cls.spawn("qrtd", as_daemon + [os.environ["QRTD"], "run", "-c", cls.cfg,
                                           "--state-dir", os.path.join(cls.dir, "state"),
                                           "--journal-dir", os.path.join(cls.dir, "journal")])

            def up():
                if cls.procs[-1].poll() is not None:
                    raise RuntimeError("qrtd exited: " + cls.tail("qrtd"))
                try:
                    with qrt_client.Client(cls.sock, timeout=5) as c:
                        return all(q.get("endpoint_up") for q in c.status()["qpus"])
                except qrt_client.QrtError:
                    return False
            if not wait_for(up, 30):
                raise RuntimeError("qrtd did not come up: " + cls.tail("qrtd"))
        except Exception:
            cls.tearDownClass()
            raise
        cls.state_dir = os.path.join(cls.dir, "slurm-state")
        cls.next_job = 100

    @classmethod
    def start_munge(cls):
        """munged (root, its own key and socket) and qrtd's network
        listener on 127.0.0.1, when munge is installed: the rpc.listen
        lines of qrtd.toml, or none."""
        cls.port = None
        if shutil.which("munged") is None or shutil.which("mungekey") is None:
            return ""
        d = os.path.join(cls.dir, "munge")
        os.mkdir(d, 0o755)
        key = os.path.join(d, "munge.key")
        subprocess.run(["mungekey", "--create", "--keyfile=" + key], check=True)
        os.chmod(key, 0o400)
        cls.munge_sock = os.path.join(d, "munge.sock")
        cls.spawn("munged", ["munged", "--foreground", "--force", "--socket=" + cls.munge_sock,
                             "--key-file=" + key, "--pid-file=" + os.path.join(d, "munged.pid"),
                             "--seed-file=" + os.path.join(d, "seed"),
                             "--log-file=" + os.path.join(cls.dir, "log", "munged.log")])
        if not wait_for(lambda: os.path.exists(cls.munge_sock), 10):
            raise RuntimeError("munged did not start: " + cls.tail("munged"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            cls.port = s.getsockname()[1]
        return f'listen = "tcp://127.0.0.1:{cls.port}"\nmunge_socket = "{cls.munge_sock}"'

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

    def as_tenant(self, user, method, **args):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "QRT_PYTHON_DIR": os.path.dirname(os.path.abspath(qrt_client.__file__)),
               "PYTHONDONTWRITEBYTECODE": "1"}
        r = subprocess.run(["setpriv", "--reuid", user.pw_name, "--regid", str(user.pw_gid),
                            "--init-groups", sys.executable, "-c", AS_TENANT, self.sock, method,
                            json.dumps(args)], capture_output=True, text=True, env=env,
                           timeout=60, cwd="/")
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def status(self, rid):
        with qrt_client.Client(self.sock, timeout=10) as c:  # the test, as root: admin
            return c.jobs_status(rid)

    def victim_commits(self):
        """The victim's committed job, two minutes ahead, and a guess of
        its token made from the attacker's own (the next one)."""
        key = f"victim-{time.time_ns()}"
        held = self.as_tenant(self.victim, "slots_reserve", duration_ns=MS, idempotency_key=key,
                              not_before_ns=time.time_ns() + 120 * S)["ok"]
        done = self.as_tenant(self.victim, "jobs_submit", payload="H 0; MEASURE",
                              reservation_id=held["reservation_id"],
                              fencing_token=held["fencing_token"])["ok"]
        self.assertEqual(done["state"], "committed", done)
        mine = self.as_tenant(self.attacker, "slots_reserve", duration_ns=MS,
                              idempotency_key=f"mine-{time.time_ns()}",
                              not_before_ns=time.time_ns() + 180 * S)["ok"]
        guess = mine["fencing_token"] - 1
        print(f"victim's job {held['reservation_id']} token {held['fencing_token']}; the "
              f"attacker's own token {mine['fencing_token']}, guess {guess}", file=sys.stderr)
        return held["reservation_id"], guess, self.status(held["reservation_id"])

    def harness(self, plugstack, env=(), cluster="lab", step_nodes="localhost", job=None,
                context="remote", stop_after=None, options=("qpu-duration=1ms",),
                process_env=None):
        if job is None:
            SpankHarness.next_job += 1
            job = SpankHarness.next_job
        log = os.path.join(self.dir, f"connect-{job}-{context}.log")
        argv = [os.environ["SPANK_HARNESS"], os.environ["SPANK_QRT"], "--context", context,
                "--job", str(job), "--step", "0", "--node-id", "0",
                "--uid", str(self.attacker.pw_uid), "--gid", str(self.attacker.pw_gid),
                "--step-nodes", step_nodes, "--connect-log", log]
        if cluster is not None:
            argv += ["--cluster", cluster]
        for o in options:
            argv += ["--option", o]
        for e in env:
            argv += ["--env", e]
        if stop_after:
            argv += ["--stop-after", stop_after]
        argv += ["--", *plugstack]
        # slurmstepd's own environment (not the job's): the site's.
        penv = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        penv.update(process_env or {})
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=penv)
        print(r.stdout + r.stderr, file=sys.stderr)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        try:
            with open(log) as f:
                connects = f.read().splitlines()
        except FileNotFoundError:
            connects = []
        return job, r.stdout + r.stderr, connects

    def assert_never_root(self, connects, out):
        root = [c for c in connects if " euid=0 " in c]
        self.assertEqual(root, [], "the plugin connected as root (admin):\n" + out)

    def plugstack(self, *more):
        # The harness's task has every CPU: no cpuset check here.
        return [f"socket={self.sock}", f"state_dir={self.state_dir}", "timeout=1s",
                "cpuset_check=no", *more]

    # ------------------------------------------------------------ cases

    def test_1_a_hostile_job_env_cannot_make_root_cancel_another_tenants_job(self):
        vid, guess, before = self.victim_commits()
        job = SpankHarness.next_job + 1
        _, out, connects = self.harness(self.plugstack(), env=[
            "QRT_RESERVED_BY=srun", f"QRT_IDEMPOTENCY_KEY=slurm:lab:{job}.0",
            f"QRT_NODE_RESERVATIONS=localhost|{vid}|{guess}|qpu0", "SLURM_CLUSTER_NAME=lab"])
        after = self.status(vid)
        self.assertEqual(after["state"], "committed", out)
        self.assertEqual(after, before, out)
        self.assertNotIn("cancelled committed job", out)
        self.assert_never_root(connects, out)

    def test_1b_an_entry_for_this_node_is_given_back_as_the_jobs_user_only(self):
        if self.port is None:
            self.skipTest("munged or mungekey is not installed: no tcp:// qrtd_node")
        vid, guess, before = self.victim_commits()
        job = SpankHarness.next_job + 1
        # This node is 127.0.0.1 (slurmctld says so), and so is the entry.
        _, out, connects = self.harness(
            self.plugstack(f"qrtd_node=tcp://%n:{self.port}"), step_nodes="127.0.0.1",
            env=["QRT_RESERVED_BY=srun", f"QRT_IDEMPOTENCY_KEY=slurm:lab:{job}.0",
                 f"QRT_NODE_RESERVATIONS=127.0.0.1|{vid}|{guess}|qpu0",
                 "SLURM_CLUSTER_NAME=lab"],
            process_env={"QRT_MUNGE_SOCKET": self.munge_sock})
        self.assertEqual(self.status(vid), before, out)
        self.assertNotIn("cancelled committed job", out)
        self.assertIn("not_owner", out)
        tcp = [c for c in connects if f"127.0.0.1:{self.port}" in c]
        self.assertTrue(tcp, "the node's part was never given back: " + out)
        self.assertTrue(all(f" euid={self.attacker.pw_uid} " in c for c in tcp), tcp)
        self.assert_never_root(connects, out)

    def test_2_a_relay_named_by_the_job_env_is_never_dialled(self):
        vid, guess, before = self.victim_commits()
        relay = Relay("127.0.0.2")
        try:
            job = SpankHarness.next_job + 1
            _, out, connects = self.harness(
                self.plugstack(f"qrtd_node=tcp://%n:{relay.port}"), env=[
                    "QRT_RESERVED_BY=srun", f"QRT_IDEMPOTENCY_KEY=slurm:lab:{job}.0",
                    f"QRT_NODE_RESERVATIONS=127.0.0.2|{vid}|{guess}|qpu0",
                    "SLURM_CLUSTER_NAME=lab"])
        finally:
            relay.close()
        self.assertEqual(relay.accepted, [], "root's client connected to the relay:\n" + out)
        self.assertEqual(relay.received, b"")
        self.assertEqual([c for c in connects if "127.0.0.2" in c], [], out)
        self.assert_never_root(connects, out)
        self.assertEqual(self.status(vid), before)

    def read_state(self, job):
        path = os.path.join(self.state_dir, f"{job}.0")
        try:
            with open(path) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def test_3_a_newline_in_the_cluster_name_injects_no_line_into_roots_state_file(self):
        vid, guess, before = self.victim_commits()
        # Short enough for the plugin's 64-byte cluster name.
        lines = f"lab\nids={vid}\nfencing_token={guess}\n#"
        # slurmstepd killed -9 after the state file is written: the job
        # epilog finds it.
        job, out, connects = self.harness(self.plugstack(), env=[f"SLURM_CLUSTER_NAME={lines}"],
                                          stop_after="task_post_fork")
        text = self.read_state(job)
        self.assertIsNotNone(text, "no state file: " + out)
        fields = [ln.split("=", 1)[0] for ln in text.splitlines()
                  if ln and not ln.startswith("#")]
        self.assertEqual(sorted(fields), sorted(["key", "ids", "qpus", "fencing_token",
                                                 "start_ns", "end_ns", "lease_expires_ns"]),
                         "root's state file has lines the job's environment wrote:\n" + text)
        own = dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln)
        self.assertEqual(own["key"], f"slurm:lab:{job}.0", text)
        self.assertNotEqual(own["ids"], str(vid), text)
        mine = int(own["ids"])
        self.assertEqual(self.status(mine)["state"], "held")
        self.assertEqual(self.status(mine)["tenant"], ATTACKER)
        # The job epilog (slurmd, root) gives back the step's own slot only.
        _, out, epilog_connects = self.harness(self.plugstack(), job=job, context="job_epilog")
        self.assertEqual(self.status(mine)["state"], "released", out)
        self.assertEqual(self.status(vid), before, out)
        self.assertIsNone(self.read_state(job), out)
        self.assert_never_root(connects + epilog_connects, out)

        # A ClusterName (slurm.conf) with a newline: the step fails with the
        # reason; nothing is reserved, no state file written.
        job, out, connects = self.harness(self.plugstack(), cluster=lines)
        self.assertIn("task: exit 1", out)
        self.assertIn("ClusterName", out)
        self.assertIsNone(self.read_state(job))
        self.assertEqual(self.status(vid), before)

    def test_4_a_steps_own_slot_is_made_and_given_back_as_the_jobs_user(self):
        # srun puts SLURM_CLUSTER_NAME into every job's environment.
        job, out, connects = self.harness(self.plugstack(), env=["SLURM_CLUSTER_NAME=lab"])
        self.assertIn("task: exit 0", out)
        self.assertIn("task: QRT_RESERVATION_ID=", out)
        rid = int(out.split("task: QRT_RESERVATION_ID=")[1].split()[0])
        st = self.status(rid)
        self.assertEqual(st["state"], "released", out)
        self.assertEqual(st["tenant"], ATTACKER)
        self.assertEqual(st["idempotency_key"], f"slurm:lab:{job}.0")
        self.assertTrue(connects, "the plugin never connected: " + out)
        self.assert_never_root(connects, out)
        self.assertIsNone(self.read_state(job))


if __name__ == "__main__":
    why = why_not_here()
    if why:
        print(f"SKIP: {why}", file=sys.stderr)
        sys.exit(SKIP)
    unittest.main(verbosity=2)
