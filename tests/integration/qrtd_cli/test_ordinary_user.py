#!/usr/bin/env python3
"""`qrtd run` started by an ordinary user (nobody: uid 65534, its own group
only, no capabilities), untuned, the host untouched, a write-only
file:///dev/null endpoint:

  - the state directory named with --state-dir is created (mode 0750) when
    its parent is the user's, and the daemon serves;
  - in a directory that is not the user's it is not, and the refusal names
    the parent's owner and what to do, not "pass --state-dir" (it was);
  - rpc.socket_group naming a group the user is not in (root) does not stop
    the daemon: the socket keeps the user's group and the log says why;
  - rpc.socket_group = "" is accepted (check-config and run) and leaves the
    socket's group alone, without a warning.

Only the PIDs this test started are signalled.  Skips (77), naming why, when
not root (it cannot become nobody) or without user nobody or setpriv.
Environment: QRTD (the binary).
"""

import grp
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

QRTD = os.environ.get("QRTD", "")

CONFIG = """
[agent]
user = "nobody"
watchdog = false
[host]
apply_on_run = false
[dispatch]
mode = "untuned"
[rpc]
socket_path = "{dir}/qrtd.sock"
{group}
[roles]
scheduler = ["uid:65534"]
[probes]
enabled = false
[[qpu]]
name = "qpu0"
endpoint = "file:///dev/null"
calibration = "periodic"
period_ns = 1_000_000_000
blackout_ns = 100_000_000
"""


class OrdinaryUser(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not QRTD:
            raise unittest.SkipTest("QRTD must name the qrtd binary")
        if os.geteuid() != 0:
            raise unittest.SkipTest("runs qrtd as user nobody, which only root can become")
        try:
            cls.user = pwd.getpwnam("nobody")
        except KeyError:
            raise unittest.SkipTest("no user nobody")
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise unittest.SkipTest("setpriv (util-linux) is missing")
        cls.as_nobody = [setpriv, f"--reuid={cls.user.pw_uid}", f"--regid={cls.user.pw_gid}", "--clear-groups",
                         "--inh-caps=-all", "--"]

    def setUp(self):
        # The user's own directory, as `mktemp -d` run by them makes it.
        self.dir = tempfile.mkdtemp(prefix="qrt-ordinary-user-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        os.chmod(self.dir, 0o700)

    def write_config(self, group_line):
        cfg = os.path.join(self.dir, "qrtd.toml")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(dir=self.dir, group=group_line))
        os.chown(cfg, self.user.pw_uid, self.user.pw_gid)
        return cfg

    def own_state_dir(self):
        """A state directory the user made beforehand."""
        state = os.path.join(self.dir, "state")
        os.mkdir(state, 0o750)
        os.chown(state, self.user.pw_uid, self.user.pw_gid)
        return state

    def run_qrtd(self, cfg, state_dir):
        """Starts qrtd as nobody; returns (process, log path)."""
        log = os.path.join(self.dir, "qrtd.log")
        with open(log, "w") as f:
            p = subprocess.Popen(self.as_nobody + [QRTD, "run", "-c", cfg, "--state-dir", state_dir],
                                 stdout=f, stderr=subprocess.STDOUT)

        def stop():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.addCleanup(stop)
        return p, log

    def wait_serving(self, p, log):
        sock = os.path.join(self.dir, "qrtd.sock")
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up and p.poll() is None:
            if os.path.exists(sock):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.settimeout(5)
                    s.connect(sock)
                    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"agent.hello"}\n')
                    if "result" in json.loads(s.makefile().readline()):
                        return sock
                except OSError:
                    pass
                finally:
                    s.close()
            time.sleep(0.1)
        self.fail(f"qrtd did not serve as nobody (exit status {p.poll()}):\n" + read(log))

    def test_the_state_directory_is_created_in_the_users_own_directory(self):
        cfg = self.write_config("")
        state = os.path.join(self.dir, "state")
        p, log = self.run_qrtd(cfg, state)
        self.wait_serving(p, log)
        st = os.stat(state)
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (self.user.pw_uid, 0o750))
        self.assertTrue(os.path.exists(os.path.join(state, "ledger.sqlite")))

    def test_a_state_directory_in_someone_elses_directory_is_refused_saying_what_to_do(self):
        cfg = self.write_config("")
        roots = tempfile.mkdtemp(prefix="qrt-not-nobodys-")   # root's, 0755
        self.addCleanup(shutil.rmtree, roots, True)
        os.chmod(roots, 0o755)
        state = os.path.join(roots, "state")
        p, log = self.run_qrtd(cfg, state)
        self.assertEqual(p.wait(30), 1, read(log))
        text = read(log)
        self.assertIn(f"state directory {state} does not exist", text)
        self.assertIn(f"{roots} belongs to uid 0 (root)", text)
        self.assertIn(f"mkdir -m 0750 {state}", text)
        self.assertIn("pass --state-dir a path in a directory of yours", text)
        self.assertFalse(os.path.exists(state))

    def test_a_socket_group_the_user_is_not_in_leaves_the_socket_to_the_users_group(self):
        cfg = self.write_config('socket_group = "root"')
        p, log = self.run_qrtd(cfg, self.own_state_dir())
        sock = self.wait_serving(p, log)
        self.assertEqual(os.stat(sock).st_gid, self.user.pw_gid)
        self.assertIn("rpc.socket_group 'root': this process (uid 65534) is not a member of it and lacks "
                      "CAP_CHOWN", read(log))
        self.assertIn(f"the socket keeps the group {grp.getgrgid(self.user.pw_gid).gr_name}", read(log))

    def test_an_empty_socket_group_is_accepted_and_leaves_the_group_alone(self):
        cfg = self.write_config('socket_group = ""')
        check = subprocess.run(self.as_nobody + [QRTD, "check-config", "-c", cfg], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        self.assertEqual(check.returncode, 0, check.stdout)
        p, log = self.run_qrtd(cfg, self.own_state_dir())
        sock = self.wait_serving(p, log)
        self.assertEqual(os.stat(sock).st_gid, self.user.pw_gid)
        self.assertNotIn("socket_group", read(log))


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


if __name__ == "__main__":
    unittest.main(verbosity=2)
