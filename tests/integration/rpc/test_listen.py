#!/usr/bin/env python3
"""`qrtd run` with its network listener (rpc.listen) and a real munged.

One munged (its own key from mungekey, its own socket, pid and seed files in
a temporary directory), one qpu-sim, one `qrtd run` (no partition applied,
dispatch untuned) listening on 127.0.0.1 with rpc.listen and
rpc.munge_socket from its qrtd.toml, so the configuration path of the
daemon is the one exercised:

  - qrtctl --socket tcp://... authenticates and gets the roles of its uid;
  - the Python client reserves, submits and sees the job complete at
    qpu-sim, all over TCP;
  - a request before auth.munge is refused (unauthenticated/auth_required);
  - kill -9 of qrtd during a pipelined burst of slots.reserve over TCP:
    after a restart every reservation that was acknowledged is there
    (its heartbeat succeeds over TCP again).

Only the processes this test started are signalled, by pid.  Skips (77)
naming why when munged, mungekey or a binary is missing.
Environment: QRTD, QPU_SIM, QRTCTL, PYTHONPATH (tools/clients/python/src).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import qrt_client

QRTD = os.environ.get("QRTD", "")
QPU_SIM = os.environ.get("QPU_SIM", "")
QRTCTL = os.environ.get("QRTCTL", "")
MS = 1_000_000

CONFIG = """
[agent]
log_level = "info"
watchdog = false
user = "root"
[host]
apply_on_run = false
[dispatch]
mode = "untuned"
miss_tolerance_ns = 5_000_000
[timeline]
policy = "edf-backfill"
default_lease_ns = 600_000_000_000
[rpc]
socket_path = "{dir}/qrtd.sock"
listen = "tcp://127.0.0.1:{port}"
munge_socket = "{munge}"
auth_timeout_ms = 5000
[roles]
reader = []
scheduler = ["uid:{uid}"]
calibration = []
admin = []
[probes]
enabled = false

[[qpu]]
name = "qpu0"
endpoint = "unix://{sim}"
calibration = "periodic"
period_ns = 2_000_000_000
blackout_ns = 100_000_000
"""


def which(name):
    return shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin")


def wait_for(pred, timeout_s, step_s=0.05):
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if pred():
            return True
        time.sleep(step_s)
    return False


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Listen(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.procs = []
        cls.qrtd = None
        cls.dir = tempfile.mkdtemp(prefix="qrt-listen-")
        os.chmod(cls.dir, 0o755)
        cls.munge_dir = os.path.join(cls.dir, "munge")
        os.mkdir(cls.munge_dir, 0o755)
        key = os.path.join(cls.munge_dir, "munge.key")
        subprocess.run([which("mungekey"), "--create", "--keyfile=" + key], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.chmod(key, 0o400)
        cls.munge_sock = os.path.join(cls.munge_dir, "munge.sock")
        cls.procs.append(subprocess.Popen(
            [which("munged"), "--foreground", "--force", "--socket=" + cls.munge_sock,
             "--key-file=" + key, "--pid-file=" + os.path.join(cls.munge_dir, "munged.pid"),
             "--seed-file=" + os.path.join(cls.munge_dir, "seed"),
             "--log-file=" + os.path.join(cls.munge_dir, "munged.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        sim = os.path.join(cls.dir, "qpu0.sock")
        cls.procs.append(subprocess.Popen(
            [QPU_SIM, "--json", "--summary-file", os.path.join(cls.dir, "sim.json"),
             "--duration-s", "170", "--listen", f"unix://{sim}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if not wait_for(lambda: os.path.exists(cls.munge_sock) and os.path.exists(sim), 10):
            cls.tearDownClass()
            raise AssertionError("munged or qpu-sim did not start")
        cls.port = free_port()
        cls.url = f"tcp://127.0.0.1:{cls.port}"
        cls.cfg = os.path.join(cls.dir, "qrtd.toml")
        with open(cls.cfg, "w") as f:
            f.write(CONFIG.format(dir=cls.dir, port=cls.port, munge=cls.munge_sock, sim=sim,
                                  uid=os.getuid()))
        os.mkdir(os.path.join(cls.dir, "state"), 0o750)
        cls.start_qrtd()

    @classmethod
    def start_qrtd(cls):
        log = open(os.path.join(cls.dir, "qrtd.log"), "a")
        cls.qrtd = subprocess.Popen([QRTD, "run", "-c", cls.cfg, "--state-dir",
                                     os.path.join(cls.dir, "state")],
                                    stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def up():
            if cls.qrtd.poll() is not None:
                return True
            try:
                cls.client().close()
                return True
            except qrt_client.QrtError:
                return False
        if not wait_for(up, 20) or cls.qrtd.poll() is not None:
            tail = cls.log_tail()
            cls.tearDownClass()
            raise AssertionError(f"qrtd did not come up on {cls.url}:\n{tail}")

    @classmethod
    def stop_proc(cls, p):
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    @classmethod
    def tearDownClass(cls):
        cls.stop_proc(cls.qrtd)
        for p in reversed(cls.procs):
            cls.stop_proc(p)
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def log_tail(cls):
        try:
            with open(os.path.join(cls.dir, "qrtd.log")) as f:
                return "".join(f.readlines()[-25:])
        except OSError:
            return ""

    @classmethod
    def client(cls):
        return qrt_client.Client(cls.url, timeout=10, munge_socket=cls.munge_sock)

    def test_qrtctl_over_tcp_gets_the_roles_of_its_uid(self):
        env = dict(os.environ, QRT_MUNGE_SOCKET=self.munge_sock)
        r = subprocess.run([QRTCTL, "--json", "--socket", self.url, "agent", "hello"],
                           capture_output=True, text=True, env=env, timeout=30)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        hello = json.loads(r.stdout)
        self.assertEqual(hello["peer"]["uid"], os.getuid())
        self.assertEqual(hello["peer"]["roles"], ["scheduler"])
        # munged not running here: said so, exit status 23.
        env["QRT_MUNGE_SOCKET"] = os.path.join(self.dir, "absent.sock")
        r = subprocess.run([QRTCTL, "--socket", self.url, "agent", "hello"],
                           capture_output=True, text=True, env=env, timeout=30)
        self.assertEqual(r.returncode, 23, r.stdout + r.stderr)
        self.assertIn("munged is not running", r.stderr)

    def test_a_job_reserved_and_submitted_over_tcp_completes(self):
        with self.client() as c:
            r = c.slots_reserve(duration_ns=2 * MS, idempotency_key="listen-job-1",
                                qpus=["qpu0"], not_before_ns=time.time_ns() + 300 * MS)
            s = c.jobs_submit(b"hello over tcp", reservation_id=r["reservation_id"],
                              fencing_token=r["fencing_token"])
            job = s.get("job_id", r["reservation_id"])

            def done():
                return c.call("jobs.status", {"job_id": job})["state"] in (
                    "completed", "failed", "missed")
            self.assertTrue(wait_for(done, 20), c.call("jobs.status", {"job_id": job}))
            self.assertEqual(c.call("jobs.status", {"job_id": job})["state"], "completed")

    def test_a_request_before_auth_is_refused(self):
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            f = s.makefile("rwb")
            challenge = json.loads(f.readline())
            self.assertEqual(challenge["method"], "auth.challenge")
            f.write(b'{"jsonrpc":"2.0","id":3,"method":"slots.query","params":{"duration_ns":1000000}}\n')
            f.flush()
            reply = json.loads(f.readline())
            self.assertEqual(reply["id"], 3)
            self.assertEqual(reply["error"]["data"]["reason"], "unauthenticated")
            self.assertEqual(reply["error"]["data"]["cause"], "auth_required")
            self.assertEqual(f.readline(), b"")  # closed, nothing served

    def test_socket_activation_passes_the_tcp_listener(self):
        sa = which("systemd-socket-activate")
        if not sa:
            self.skipTest("systemd-socket-activate is not installed")
        d = os.path.join(self.dir, "activated")
        os.mkdir(d, 0o755)
        os.mkdir(os.path.join(d, "state"), 0o750)
        port = free_port()
        cfg = os.path.join(d, "qrtd.toml")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(dir=d, port=port, munge=self.munge_sock,
                                  sim=os.path.join(d, "no-sim.sock"), uid=os.getuid()))
        log_path = os.path.join(d, "qrtd.log")
        with open(log_path, "w") as log:
            # As qrtd.socket with a second ListenStream= would: the UNIX
            # socket first, then the TCP one.
            p = subprocess.Popen([sa, "-l", os.path.join(d, "qrtd.sock"), "-l", f"127.0.0.1:{port}",
                                  QRTD, "run", "-c", cfg, "--state-dir", os.path.join(d, "state")],
                                 stdout=log, stderr=subprocess.STDOUT)
        try:
            def up():
                try:
                    with qrt_client.Client(f"tcp://127.0.0.1:{port}", timeout=5,
                                           munge_socket=self.munge_sock) as c:
                        return c.hello()["peer"]["uid"] == os.getuid()
                except qrt_client.QrtError:
                    return False
            ok = wait_for(lambda: p.poll() is not None or up(), 20)
            with open(log_path) as f:
                text = f.read()
            self.assertTrue(ok and p.poll() is None, text[-3000:])
            self.assertIn("network listener", text)
            self.assertIn("(systemd)", text)
        finally:
            self.stop_proc(p)

    def test_zz_kill_9_during_a_remote_burst_keeps_every_acknowledged_reservation(self):
        n, kill_after = 300, 40
        c = self.client()
        base = time.time_ns() + 5_000 * MS
        reqs = b"".join(json.dumps({
            "jsonrpc": "2.0", "id": 1000 + i, "method": "slots.reserve",
            "params": {"duration_ns": MS, "idempotency_key": f"burst-{i}", "qpus": ["qpu0"],
                       "not_before_ns": base + i * 2 * MS}}).encode() + b"\n" for i in range(n))
        c._sock.settimeout(20)
        c._sock.sendall(reqs[:len(reqs) // 2])  # the rest while replies arrive
        acked = {}
        rest = reqs[len(reqs) // 2:]
        deadline = time.monotonic() + 30
        while len(acked) < kill_after and time.monotonic() < deadline:
            line = c._read_line(deadline)
            if line is None:
                break
            obj = json.loads(line)
            if "result" in obj:
                acked[obj["id"]] = obj["result"]
            if rest:
                try:
                    c._sock.sendall(rest)
                except OSError:
                    pass
                rest = b""
        self.assertGreaterEqual(len(acked), kill_after, self.log_tail())
        os.kill(self.qrtd.pid, signal.SIGKILL)
        self.qrtd.wait(10)
        # Replies already on the wire were acknowledged too.
        try:
            c._sock.settimeout(2)
            while True:
                line = c._read_line(time.monotonic() + 2)
                if line is None:
                    break
                obj = json.loads(line)
                if "result" in obj:
                    acked[obj["id"]] = obj["result"]
        except qrt_client.QrtError:
            pass
        c.close()
        print(f"kill -9 after {len(acked)} of {n} reservations acknowledged", file=sys.stderr)
        self.start_qrtd()
        with self.client() as again:
            for rid, res in sorted(acked.items()):
                hb = again.slots_heartbeat(res["reservation_id"], res["fencing_token"])
                self.assertIn("lease_expires_ns", json.dumps(hb), (rid, hb))


if __name__ == "__main__":
    missing = [n for n in ("munged", "mungekey") if not which(n)]
    if missing:
        print(f"SKIP: {' and '.join(missing)} not installed (tools/dev/deps.sh installs munge)")
        sys.exit(77)
    if not (QRTD and QPU_SIM and QRTCTL):
        print("SKIP: QRTD, QPU_SIM and QRTCTL must name the binaries")
        sys.exit(77)
    unittest.main(verbosity=2)
