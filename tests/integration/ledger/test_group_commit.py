#!/usr/bin/env python3
"""Group commit, on the real daemon through its real socket.

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
  5. acknowledged means dispatched: a job submitted at the
     minimum lead whose commit is held up past its start (the lock) is
     refused with a retryable error naming the next possible start, never
     acknowledged and then missed; the same behind another client's burst
     of 64 KiB jobs.
  6. slots.heartbeat is answered under a commit backlog: the
     lease it renews is not lost while client changes are refused.
  7. a job sent just before a kill -9, its mark_dispatched held up by the
     lock, is `failed` with dispatch_unknown after the restart, not
     `missed` (the QPU may have run it).
  8. a late job is refused even when a retry that changed nothing (an
     idempotent retry of an earlier submit, on another connection) waits
     for the same commit; in a batch, only the late job is refused, the
     kept one is acknowledged; and the hand-over plan holds a job before
     the connection its acknowledgement released is served again.

The daemon runs as the invoking user (or as root with agent.user = "root"),
untuned (its miss tolerance and calibration window stated below: the
commit path is judged, not the send's precision), host untouched, with a
write-only file:///dev/null endpoint.
Asserts behaviour, never timings.  Only the PIDs this test started are
signalled.  Environment: QRTD (the binary).
"""

import base64
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
miss_tolerance_ns = {miss_tolerance_ns}
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
period_ns = {period_ns}
phase_ns = {phase_ns}
blackout_ns = 100_000_000
fidelity_f0 = 0.99
"""


# What these tests judge is the commit path: an acknowledged job reaches its
# dispatch thread in time, a late commit is refused.  Not the send's
# precision: the dispatch thread runs untuned (SCHED_OTHER) on a shared host,
# where hypervisor steal and CPU hogs hold it for milliseconds, past the
# default 100 us (or, the whole VM held by its hypervisor, for seconds), and
# the job would be `missed` (not sent) for the host's sake.  The tolerance is
# stated here, in the config the daemon judges by: the largest it takes
# (10 s, below wait_terminal's 20 s); a job handed over later than that is
# still missed, and fails the test.
MISS_TOLERANCE_NS = 10_000_000_000
# One calibration window around the whole test (a day, its middle now): a
# job sent late near a window's end would be refused by the window ("would
# not end inside the window; not sent"), which is not what is judged here.
PERIOD_NS = 86_400_000_000_000


def config_text(directory):
    now = time.time_ns()
    return CONFIG.format(dir=directory, uid=os.getuid(), miss_tolerance_ns=MISS_TOLERANCE_NS,
                         period_ns=PERIOD_NS, phase_ns=(now + PERIOD_NS // 2) % PERIOD_NS)


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

    def send_lines(self, calls):
        """One request line per (method, params), written at once."""
        lines = []
        for method, params in calls:
            self.next_id += 1
            lines.append(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}))
        self.s.sendall(("\n".join(lines) + "\n").encode())

    def send_batch(self, calls):
        """One line holding a batch of (method, params); returns the ids."""
        reqs = []
        for method, params in calls:
            self.next_id += 1
            reqs.append({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        self.s.sendall((json.dumps(reqs) + "\n").encode())
        return [r["id"] for r in reqs]

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
            f.write(config_text(self.dir))
        self.db = os.path.join(self.state, "ledger.sqlite")
        self.qrtd = None
        self.logs = 0

    def tearDown(self):
        self.stop(signal.SIGTERM)
        shutil.rmtree(self.dir, ignore_errors=True)

    def configure(self, section, **changes):
        """Set `key = value` in [section] of the config (replaced, or added)."""
        with open(self.cfg) as f:
            lines = f.read().split("\n")
        head = next(i for i, line in enumerate(lines) if line in (f"[{section}]", f"[[{section}]]"))
        end = next((i for i in range(head + 1, len(lines)) if lines[i].startswith("[")), len(lines))
        for key, value in changes.items():
            for i in range(head + 1, end):
                if lines[i].startswith(key + " = "):
                    lines[i] = f"{key} = {value}"
                    break
            else:
                lines.insert(head + 1, f"{key} = {value}")
                end += 1
        with open(self.cfg, "w") as f:
            f.write("\n".join(lines))

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

    # ------------------------------------ acknowledged means dispatched

    TERMINAL = ("completed", "failed", "sent", "missed", "cancelled", "displaced", "expired",
                "released")

    def wait_terminal(self, c, job_id, timeout_s=20):
        last = {}

        def done():
            nonlocal last
            last = self.status_of(c, job_id)
            return "result" in last and last["result"]["state"] in self.TERMINAL
        self.assertTrue(wait_for(done, timeout_s), f"job {job_id} never ended: {last}")
        return last["result"]

    def submit_params(self, key, payload=b'{"shots": 1}', **kw):
        p = {"duration_ns": 1_000_000, "idempotency_key": key,
             "payload": base64.b64encode(payload).decode()}
        p.update(kw)
        return p

    def assert_dispatched_or_refused(self, c, r, key):
        """An acknowledged job is dispatched (`sent` on this write-only
        endpoint); a refused one is refused with a retryable error that names
        the next possible start, and nothing of it is left."""
        if "result" in r:
            st = self.wait_terminal(c, r["result"]["job_id"])
            self.assertEqual(st["state"], "sent",
                             f"job {key} was acknowledged ({r['result']}) and then {st}\n" + self.log_tail())
            return None
        err = r["error"]
        self.assertEqual(err["data"]["reason"], "unavailable", r)
        self.assertIn(err["data"].get("cause"), ("commit_late", "commit_backlog"), r)
        if err["data"]["cause"] == "commit_late":
            self.assertGreater(err["data"]["next_start_ns"], 0, r)
            gone = self.status_of(c, err["data"]["job_id"])
            self.assertIn("error", gone, f"a refused job is still there: {gone}")
        return err

    def test_a_job_durable_after_its_start_is_refused_never_acknowledged_then_missed(self):
        self.start()
        c = conn(self.sock)
        lead = c.call("agent.status")["result"]["dispatch"]["min_lead_ns"]
        self.assertGreater(lead, 0)
        lock = self.hold_write_lock()
        try:
            # At the minimum lead; its commit waits for the lock far past
            # its start (within the store's busy timeout, so it commits).
            c.send("jobs.submit", self.submit_params("b"))
            time.sleep(max(0.8, 20 * lead / 1e9))
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        r = c.recv()
        err = self.assert_dispatched_or_refused(c, r, "b")
        self.assertIsNotNone(err, "the job was acknowledged after its start and still sent?")
        self.assertEqual(err["data"]["cause"], "commit_late", r)
        # The retry the error invites, with the same key, is acknowledged
        # and dispatched.
        again = c.call("jobs.submit", self.submit_params("b", not_before_ns=err["data"]["next_start_ns"]))
        self.assertIn("result", again, again)
        self.assertGreaterEqual(again["result"]["start_ns"], err["data"]["next_start_ns"])
        fin = self.wait_terminal(c, again["result"]["job_id"])
        self.assertEqual(fin["state"], "sent", f"{fin}\n{self.log_tail()}")
        c.close()

    def test_a_job_at_the_minimum_lead_behind_a_burst_is_dispatched_or_refused(self):
        # Backfill: the job at the minimum lead goes before the burst's,
        # placed five minutes ahead.
        self.configure("timeline", policy='"edf-backfill"')
        self.start()
        lead_c = conn(self.sock)
        lead = lead_c.call("agent.status")["result"]["dispatch"]["min_lead_ns"]
        n_per_client, window, payload = 60, 16, os.urandom(48 * 1024)
        replies = []
        started = threading.Event()

        def burst(k):
            c = conn(self.sock, timeout=120)
            ahead = time.time_ns() + 300 * 1_000_000_000
            sent = got = 0
            while got < n_per_client:
                while sent < n_per_client and sent - got < window:
                    c.send("jobs.submit", self.submit_params(f"a{k}-{sent}", payload, not_before_ns=ahead))
                    sent += 1
                replies.append(c.recv())
                got += 1
                started.set()
            c.close()

        threads = [threading.Thread(target=burst, args=(k,), daemon=True) for k in range(4)]
        for t in threads:
            t.start()
        self.assertTrue(started.wait(60), "the burst got no reply")
        b = conn(self.sock, timeout=120)
        r = b.call("jobs.submit", self.submit_params("b"))
        for t in threads:
            t.join(120)
        self.assertEqual(len(replies), 4 * n_per_client)
        for x in replies:
            if "error" in x:
                self.assertEqual(x["error"]["data"].get("cause"), "commit_backlog", x)
        self.assert_dispatched_or_refused(b, r, "b")
        self.assertGreater(lead, 0)
        b.close()
        lead_c.close()

    def submits_handled(self, c):
        """jobs.submit requests the daemon has handled (its metrics)."""
        text = c.call("metrics")["result"]["text"]
        for line in text.splitlines():
            if line.startswith('qrt_rpc_requests_total{method="jobs.submit"}'):
                return int(float(line.split()[-1]))
        return 0

    def test_a_late_job_is_refused_although_a_retry_that_changed_nothing_waits_for_its_commit(self):
        # Backfill: the late job goes before the earlier one, placed ahead.
        self.configure("timeline", policy='"edf-backfill"')
        self.start()
        early, late, retry, reader = (conn(self.sock) for _ in range(4))
        lead = reader.call("agent.status")["result"]["dispatch"]["min_lead_ns"]
        ahead = time.time_ns() + 300 * 1_000_000_000
        lock = self.hold_write_lock()
        try:
            # An earlier submit (far ahead, on time), then the late job at the
            # minimum lead, both waiting behind the lock; then the idempotent
            # retry of the earlier one on another connection: it changes
            # nothing, and waits for what is in flight before it.
            early.send("jobs.submit", self.submit_params("early", not_before_ns=ahead))
            self.assertTrue(wait_for(lambda: self.submits_handled(reader) == 1, 20))
            late.send("jobs.submit", self.submit_params("late"))
            self.assertTrue(wait_for(lambda: self.submits_handled(reader) == 2, 20))
            retry.send("jobs.submit", self.submit_params("early", not_before_ns=ahead))
            self.assertTrue(wait_for(lambda: self.submits_handled(reader) == 3, 20))
            time.sleep(max(0.8, 20 * lead / 1e9))
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        first, again, r = early.recv(), retry.recv(), late.recv()
        self.assertIn("result", first, first)
        self.assertIn("result", again, again)
        self.assertEqual(again["result"]["job_id"], first["result"]["job_id"])
        if "result" in r:
            gone = self.status_of(reader, r["result"]["job_id"])
            self.fail(f"the late job was acknowledged ({r['result']}), and jobs.status says {gone}")
        self.assertEqual(r["error"]["data"].get("cause"), "commit_late", r)
        self.assertIn("error", self.status_of(reader, r["error"]["data"]["job_id"]))
        self.assertEqual(self.status_of(reader, first["result"]["job_id"])["result"]["state"], "committed")
        for c in (early, late, retry, reader):
            c.close()

    def test_a_late_job_in_a_batch_is_refused_alone_and_the_kept_one_is_acknowledged(self):
        self.configure("timeline", policy='"edf-backfill"')
        self.start()
        c = conn(self.sock)
        lead = c.call("agent.status")["result"]["dispatch"]["min_lead_ns"]
        ahead = time.time_ns() + 300 * 1_000_000_000
        lock = self.hold_write_lock()
        try:
            ids = c.send_batch([("jobs.submit", self.submit_params("late")),
                                ("jobs.submit", self.submit_params("kept", not_before_ns=ahead))])
            time.sleep(max(0.8, 20 * lead / 1e9))
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        got = c.recv()
        self.assertIsInstance(got, list, got)
        by_id = {x["id"]: x for x in got}
        late, kept = by_id[ids[0]], by_id[ids[1]]
        self.assertEqual(late.get("error", {}).get("data", {}).get("cause"), "commit_late", late)
        self.assertIn("result", kept, f"the kept job was reported not kept: {kept}")
        st = self.status_of(c, kept["result"]["job_id"])
        self.assertEqual(st["result"]["state"], "committed", st)
        self.assertIn("error", self.status_of(c, late["error"]["data"]["job_id"]))
        c.close()

    def test_the_plan_holds_a_job_before_the_connection_it_released_is_served_again(self):
        # One request in flight per connection: the agent.status written with
        # the submit (one write) waits in the daemon's input buffer until the
        # submit's acknowledgement went out, and is served right after it.
        # A margin of 2 s keeps the job on time whatever this host's fsync.
        self.configure("rpc", max_inflight=1)
        self.configure("dispatch", handover_margin_ns="2_000_000_000")
        self.start()
        c = conn(self.sock)
        c.send_lines([("jobs.submit", self.submit_params("planned")), ("agent.status", {})])
        r, st = c.recv(), c.recv()
        self.assertIn("result", r, r)
        pump = st["result"]["dispatch"]["pump"]
        self.assertGreaterEqual(pump.get("plan_published_jobs", 0), 1,
                                f"the job {r['result']['job_id']} was acknowledged, and its connection "
                                f"served again, before a plan held it: {pump}")
        c.close()

    def test_a_heartbeat_is_answered_under_a_commit_backlog(self):
        self.configure("timeline", commit_queue_max=8)
        self.start()
        c, filler = conn(self.sock), conn(self.sock)
        held = c.call("slots.reserve", reserve_params("mine"))["result"]
        lock = self.hold_write_lock()
        try:
            # More changes than commit_queue_max wait behind the lock.
            for i in range(12):
                filler.send("slots.reserve", reserve_params(f"fill-{i}"))
            time.sleep(0.3)
            refused = c.call("slots.reserve", reserve_params("refused"))
            self.assertEqual(refused.get("error", {}).get("data", {}).get("cause"), "commit_backlog",
                             f"test setup: no backlog: {refused}")
            hid = c.send("slots.heartbeat", {"reservation_id": held["reservation_id"],
                                             "fencing_token": held["fencing_token"]})
            time.sleep(0.5)
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        hb = c.recv()
        self.assertEqual(hb["id"], hid)
        self.assertIn("result", hb, f"slots.heartbeat refused under the backlog: {hb}")
        self.assertGreater(hb["result"]["lease_expires_ns"], held["lease_expires_ns"])
        for _ in range(12):
            filler.recv()
        self.assertEqual(self.status_of(c, held["reservation_id"])["result"]["state"], "held")
        c.close()
        filler.close()

    def test_a_job_sent_before_a_kill_9_is_dispatch_unknown_not_missed(self):
        # A FIFO endpoint (write-only): this test reads what reached it.
        # file:// endpoints live under /dev.
        if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
            self.skipTest("needs a writable /dev/shm for a FIFO endpoint")
        fifo = f"/dev/shm/qrt-group-commit-{os.getpid()}.fifo"
        if os.path.exists(fifo):
            os.unlink(fifo)
        os.mkfifo(fifo, 0o600)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            self.configure("qpu", endpoint=f'"file://{fifo}"')
            self.start()
            c = conn(self.sock)
            start = time.time_ns() + 1500 * 1_000_000
            r = c.call("jobs.submit", self.submit_params("crash", not_before_ns=start))
            self.assertIn("result", r, r)
            job = r["result"]
            # Handed to the dispatch thread (250 ms ahead at least), then
            # the database is locked: its mark_dispatched cannot commit.
            time.sleep(max(0.0, (job["start_ns"] - 150 * 1_000_000 - time.time_ns()) / 1e9))
            lock = self.hold_write_lock()
            try:
                time.sleep(max(0.0, (job["start_ns"] + 300 * 1_000_000 - time.time_ns()) / 1e9))
                frames = b""
                try:
                    frames = os.read(reader, 1 << 16)
                except BlockingIOError:
                    pass
                if not frames:
                    # The set-up's timing window (hand-over, then the lock,
                    # then the send) did not happen on this loaded machine:
                    # nothing to test this run.  Sending itself is asserted
                    # by the other tests.
                    self.skipTest("set-up not reached: the job's frame was not at the endpoint 300 ms after "
                                  "its start (a loaded host; see the log):\n" + self.log_tail()[-400:])
                self.qrtd.send_signal(signal.SIGKILL)
                self.qrtd.wait(15)
            finally:
                lock.execute("ROLLBACK")
                lock.close()
            c.close()
            self.start()
            c = conn(self.sock)
            st = self.status_of(c, job["job_id"])["result"]
            self.assertNotEqual(st["state"], "missed", f"a job the QPU got is recorded missed: {st}")
            self.assertEqual(st["state"], "failed", st)
            self.assertTrue(st["reason"].startswith("dispatch_unknown"), st)
            c.close()
        finally:
            os.close(reader)
            os.unlink(fifo)


if __name__ == "__main__":
    unittest.main(verbosity=2)
