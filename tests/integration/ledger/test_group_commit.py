#!/usr/bin/env python3
"""Group commit, on the real daemon through its real socket (#15 §1).

  1. kill -9 right after N pipelined slots.reserve acknowledgements from 4
     clients, restart on the same state directory: every acknowledged
     reservation is there (an acknowledgement follows its group's fsync).
  2. replies keep request order on a connection, with many changes in
     flight at once.
  3. a read is answered while a group is in flight: another process holds
     the database's write lock (as a stuck disk would hold the fsync), a
     slots.reserve waits for its commit, and slots.query / agent.status on
     another connection are answered meanwhile.
  4. a failing commit: the lock is held past the store's busy timeout, the
     writer's group fails; the waiting client gets store_error (never an
     acknowledgement), and the reservation is nowhere -- not in jobs.status,
     not after a restart.

The daemon runs as the invoking user (or as root with agent.user = "root"),
untuned, host untouched, with a write-only file:///dev/null endpoint.
Asserts behaviour, never timings.  Only the PIDs this test started are
signalled.  Environment: QRTD (the binary).
"""

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import unittest

QRTD = os.environ.get("QRTD", "")

CONFIG = """
[agent]
log_level = "info"
watchdog = false
user = "root"
[host]
apply_on_run = false
[dispatch]
mode = "untuned"
[timeline]
policy = "fifo"
horizon_ns = 600_000_000_000
default_lease_ns = 600_000_000_000
commit_group_max = 256
[rpc]
socket_path = "{dir}/qrtd.sock"
max_inflight = 64
[roles]
reader = ["uid:{uid}"]
scheduler = ["uid:{uid}"]
calibration = []
admin = []
[probes]
enabled = false
[tenants]
max_reservations = 1000000
max_requests_per_s = 0
[[qpu]]
name = "qpu0"
endpoint = "file:///dev/null"
calibration = "periodic"
period_ns = 1_000_000_000
blackout_ns = 100_000_000
fidelity_f0 = 0.99
"""


def wait_for(pred, timeout_s, step_s=0.05):
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if pred():
            return True
        time.sleep(step_s)
    return pred()


class conn:
    """A raw JSON-RPC line client: send without waiting, read in order."""

    def __init__(self, path, timeout=30):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.f = self.s.makefile("rb")
        self.next_id = 0

    def send(self, method, params=None):
        self.next_id += 1
        req = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}}
        self.s.sendall((json.dumps(req) + "\n").encode())
        return self.next_id

    def recv(self):
        line = self.f.readline()
        if not line:
            raise EOFError("qrtd closed the connection")
        return json.loads(line)

    def call(self, method, params=None):
        i = self.send(method, params)
        r = self.recv()
        assert r["id"] == i, r
        return r

    def close(self):
        self.f.close()
        self.s.close()


def reserve_params(key):
    return {"duration_ns": 1_000_000, "idempotency_key": key}


class GroupCommit(unittest.TestCase):
    def setUp(self):
        if not QRTD:
            self.skipTest("QRTD must name the qrtd binary")
        # On the real disk, not tmpfs: the fsync is what this is about.
        self.dir = tempfile.mkdtemp(prefix="qrt-group-commit-")
        self.state = os.path.join(self.dir, "state")
        os.mkdir(self.state, 0o750)
        self.sock = os.path.join(self.dir, "qrtd.sock")
        self.cfg = os.path.join(self.dir, "qrtd.toml")
        with open(self.cfg, "w") as f:
            f.write(CONFIG.format(dir=self.dir, uid=os.getuid()))
        self.db = os.path.join(self.state, "ledger.sqlite")
        self.qrtd = None
        self.logs = 0

    def tearDown(self):
        self.stop(signal.SIGTERM)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self):
        self.logs += 1
        with open(os.path.join(self.dir, f"qrtd-{self.logs}.log"), "w") as log:
            self.qrtd = subprocess.Popen([QRTD, "run", "-c", self.cfg, "--state-dir", self.state],
                                         stdout=log, stderr=subprocess.STDOUT)

        def up():
            self.assertIsNone(self.qrtd.poll(), "qrtd exited: " + self.log_tail())
            try:
                c = conn(self.sock, timeout=5)
                c.call("agent.hello")
                c.close()
                return True
            except OSError:
                return False
        self.assertTrue(wait_for(up, 30), "qrtd socket did not come up: " + self.log_tail())

    def stop(self, sig):
        p, self.qrtd = self.qrtd, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(sig)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def log_tail(self):
        out = []
        for i in range(1, self.logs + 1):
            with open(os.path.join(self.dir, f"qrtd-{i}.log")) as f:
                out.append(f"qrtd-{i}.log:\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def status_of(self, c, rid):
        return c.call("jobs.status", {"job_id": rid})

    # ------------------------------------------------------------------

    def test_every_acknowledged_reservation_survives_kill_9(self):
        self.start()
        n_per_client, window = 400, 32
        acked = [[] for _ in range(4)]
        errors = []
        stop_at = threading.Event()

        def client(k):
            c = conn(self.sock)
            sent = got = 0
            try:
                while got < n_per_client:
                    while sent < n_per_client and sent - got < window:
                        c.send("slots.reserve", reserve_params(f"c{k}-{sent}"))
                        sent += 1
                    r = c.recv()
                    got += 1
                    if "result" not in r:
                        errors.append(r)
                        break
                    acked[k].append(r["result"]["reservation_id"])
                    if sum(len(a) for a in acked) >= 4 * n_per_client // 2:
                        stop_at.set()
            except (OSError, EOFError):
                pass  # the daemon was killed under it
            c.close()

        threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(4)]
        for t in threads:
            t.start()
        # kill -9 in the middle of the pipelined stream, right after half of
        # all the acknowledgements arrived.
        self.assertTrue(stop_at.wait(120), "the clients never got half their replies")
        snapshot = [list(a) for a in acked]
        self.qrtd.send_signal(signal.SIGKILL)
        self.qrtd.wait(15)
        for t in threads:
            t.join(30)
        self.assertEqual(errors, [], "a reserve was refused before the kill")
        ids = [i for a in snapshot for i in a]
        self.assertGreaterEqual(len(ids), 4 * n_per_client // 2)

        self.start()
        c = conn(self.sock)
        missing = [i for i in ids if "result" not in self.status_of(c, i)]
        self.assertEqual(missing, [], f"{len(missing)} of {len(ids)} acknowledged reservations "
                                      "were lost by kill -9")
        for i in ids[:20]:
            self.assertEqual(self.status_of(c, i)["result"]["state"], "held")
        c.close()

    def test_replies_keep_request_order_with_many_changes_in_flight(self):
        self.start()
        c = conn(self.sock)
        order = []
        for i in range(200):
            order.append(c.send("slots.reserve" if i % 3 else "slots.query",
                                reserve_params(f"o{i}") if i % 3 else {"duration_ns": 1_000_000}))
        got = [c.recv() for _ in order]
        self.assertEqual([r["id"] for r in got], order)
        self.assertTrue(all("result" in r for r in got), [r for r in got if "error" in r][:3])
        c.close()

    def hold_write_lock(self):
        db = sqlite3.connect(self.db, timeout=10, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        return db

    def test_a_read_is_answered_while_a_group_is_in_flight(self):
        self.start()
        writer, reader = conn(self.sock), conn(self.sock)
        lock = self.hold_write_lock()  # the writer's BEGIN now waits (busy timeout 2 s)
        try:
            wid = writer.send("slots.reserve", reserve_params("in-flight"))
            time.sleep(0.2)  # the reserve reached the writer
            q = reader.call("slots.query", {"duration_ns": 1_000_000})
            self.assertIn("result", q, q)
            st = reader.call("agent.status")
            self.assertIn("result", st, st)
            # The reserve is still waiting for its commit: nothing to read.
            writer.s.settimeout(0.2)
            with self.assertRaises((socket.timeout, TimeoutError)):
                writer.s.recv(1, socket.MSG_PEEK)
            writer.s.settimeout(30)
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        r = writer.recv()
        self.assertEqual(r["id"], wid)
        self.assertIn("result", r, r)
        writer.close()
        reader.close()

    def test_a_failing_commit_is_an_error_and_leaves_no_phantom(self):
        self.start()
        c = conn(self.sock)
        ok = c.call("slots.reserve", reserve_params("before"))
        self.assertIn("result", ok, ok)
        lock = self.hold_write_lock()
        try:
            # Past the busy timeout (2 s): the group fails.
            r = c.call("slots.reserve", reserve_params("doomed"))
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        self.assertIn("error", r, r)
        self.assertEqual(r["error"]["data"]["reason"], "store_error", r)
        # No phantom: the ids after the kept one do not exist, and the key
        # places a fresh reservation.
        kept = ok["result"]["reservation_id"]
        self.assertIn("error", self.status_of(c, kept + 1))
        again = c.call("slots.reserve", reserve_params("doomed"))
        self.assertIn("result", again, again)
        c.close()
        self.stop(signal.SIGKILL)
        self.start()
        c = conn(self.sock)
        self.assertIn("result", self.status_of(c, kept))
        self.assertIn("result", self.status_of(c, again["result"]["reservation_id"]))
        c.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
