"""The harness the SDK-level tests share: a temp dir, a QPU endpoint
process, `qrtd run` on a config the test writes, both stopped at the end.

A test class mixes in QrtdLab (beside unittest.TestCase) and, in its
setUpClass, calls lab_begin(), launch() for its endpoint, start_qrtd()
with its config, and lab_end() in tearDownClass.  As root, qrtd runs the
deployed way (user qrtd from the shipped sysusers.d, test_e2e's E2E does
that part), so an endpoint's socket is made group qrt, mode 0660
(endpoint_socket_args()).  Only the processes a test started are
signalled.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import qrt_client

sys.path.insert(0, os.environ.get("QRT_E2E_DIR", os.path.join(os.path.dirname(__file__), "../e2e")))
import test_e2e as base  # noqa: E402  (the sysusers set-up, wait_for, the config)

MS = 1_000_000


class QrtdLab:
    @classmethod
    def lab_begin(cls, prefix):
        """qrtd's users (as root), a temp dir readable by qrtd's user, its
        state dir and the paths of qrtd's socket and config."""
        base.E2E.setUpClass.__func__(cls)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        cls.dir = tempfile.mkdtemp(prefix=prefix, dir=shm)
        os.chmod(cls.dir, 0o755)
        cls.state = os.path.join(cls.dir, "state")
        os.mkdir(cls.state, 0o750)
        cls.sock = os.path.join(cls.dir, "qrtd.sock")
        cls.cfg = os.path.join(cls.dir, "qrtd.toml")
        cls.procs = []

    @classmethod
    def config(cls, qpu_tables, rpc_extra="", verbatim=""):
        """test_e2e's config (agent, dispatch, roles for this uid, ...) with
        these [[qpu]] tables ({dir} and {uid} filled in) and then verbatim
        (e.g. a [qpu.device] table, braces and all), written to cls.cfg."""
        text = base.CONFIG
        if rpc_extra:
            rpc = 'socket_path = "{dir}/qrtd.sock"\n'
            assert rpc in text
            text = text.replace(rpc, rpc + rpc_extra)
        with open(cls.cfg, "w") as f:
            f.write((text + qpu_tables).format(dir=cls.dir, uid=os.getuid(), submit="syscall",
                                               mode="tuned" if os.geteuid() == 0 else "untuned") + verbatim)

    @staticmethod
    def endpoint_socket_args():
        """An endpoint's socket options so that qrtd's user reaches it."""
        return ["--socket-group", "qrt", "--socket-mode", "0660"] if os.geteuid() == 0 else []

    @classmethod
    def launch(cls, name, args, sock, timeout_s=120, env=None):
        """Start an endpoint (its output in <dir>/<name>.log) and wait until
        it listens on sock; raises naming its output when it exits first."""
        log = open(os.path.join(cls.dir, name + ".log"), "w")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=cls.dir, env=env)
        log.close()
        cls.procs.append(p)
        if not base.wait_for(lambda: os.path.exists(sock) or p.poll() is not None, timeout_s):
            raise RuntimeError(f"{name} did not listen on {sock}: " + cls.tail(name + ".log"))
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited: " + cls.tail(name + ".log"))
        return p

    @classmethod
    def start_qrtd(cls, up_timeout_s=60):
        """`qrtd run` on cls.cfg; returns once it serves and every QPU's
        endpoint is up."""
        log = open(os.path.join(cls.dir, "qrtd-0.log"), "w")
        cls.qrtd = subprocess.Popen([base.QRTD or os.environ.get("QRTD", ""), "run", "-c", cls.cfg,
                                     "--state-dir", cls.state], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        cls.procs.append(cls.qrtd)

        def up():
            if cls.qrtd.poll() is not None:
                raise RuntimeError("qrtd exited: " + cls.tail("qrtd-0.log"))
            try:
                c = qrt_client.Client(cls.sock, timeout=5)
            except qrt_client.QrtError:
                return False
            try:
                return all(q.get("endpoint_up") for q in c.status()["qpus"])
            finally:
                c.close()
        if not base.wait_for(up, up_timeout_s):
            raise RuntimeError("qrtd or its endpoint did not come up: " + cls.tail("qrtd-0.log"))

    @classmethod
    def stop(cls, p, timeout_s=15):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    @classmethod
    def lab_end(cls):
        for p in reversed(getattr(cls, "procs", [])):
            cls.stop(p)
        if getattr(cls, "dir", None):
            shutil.rmtree(cls.dir, ignore_errors=True)
        base.E2E.tearDownClass.__func__(cls)

    @classmethod
    def tail(cls, name, lines=20):
        try:
            with open(os.path.join(cls.dir, name)) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def client(self):
        c = qrt_client.Client(self.sock, timeout=10)
        self.addCleanup(c.close)
        return c

    def start_in_window(self, qpu="qpu0", duration_ns=10 * MS, ahead_ns=300 * MS, margin_ns=150 * MS,
                        span_ns=3000 * MS):
        """A start at least ahead_ns from now and margin_ns inside a window
        (among those of the next span_ns) from both its ends: a send late by
        up to the tolerance still ends inside the window (as test_e2e plans
        its jobs with MARGIN)."""
        t = time.time_ns() + ahead_ns
        for w in sorted(self.client().calibration_get(qpu, until_ns=t + span_ns),
                        key=lambda w: w["valid_from_ns"]):
            s = max(t, w["valid_from_ns"] + margin_ns)
            if s + duration_ns + margin_ns <= w["valid_until_ns"]:
                return s
        self.fail("no window ahead")
