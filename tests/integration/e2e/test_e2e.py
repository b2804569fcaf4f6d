#!/usr/bin/env python3
"""End to end: qpu-sim + `qrtd run` + the Python client over the socket.

  1. 500 jobs placed and submitted across several short calibration
     windows; every job ends terminal with a reason, qpu-sim saw zero
     out-of-window arrivals, telemetry.snapshot has dispatch lateness
     percentiles, and the metrics text parses.
  2. kill -9 of qrtd with acknowledged reservations (held and committed)
     and restart on the same state directory: every acknowledged
     reservation is still there, held ones still held, and committed jobs
     whose start passed while it was down are `missed`, never sent.

Asserts behaviour, never timings.  Only the PIDs this test started are
signalled.  host.apply_on_run = false: the host is not changed.  As root,
qrtd runs the deployed way: user qrtd and group qrt come from the shipped
sysusers.d file (and go again if this test created them), qrtd run binds its
socket as root and then runs as qrtd with four capabilities.

Environment: QRTD, QPU_SIM (binaries), QRT_PYTHON_DIR, QRT_QUICKSTART_DIR.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.environ.get("QRT_PYTHON_DIR", os.path.join(os.path.dirname(__file__), "../../../tools/clients/python/src")))
sys.path.insert(0, os.environ.get("QRT_QUICKSTART_DIR", os.path.join(os.path.dirname(__file__), "../../../tools/dev")))
import qrt_client  # noqa: E402
import demo_client  # noqa: E402

QRTD = os.environ.get("QRTD", "")
SYSUSERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../systemd/sysusers.d/qrtd.conf")
QPU_SIM = os.environ.get("QPU_SIM", "")
MS = 1_000_000
# Jobs keep this far from their window's ends: more than miss_tolerance_ns,
# so a late (but tolerated) send still ends inside the window.
MARGIN = 25 * MS

CONFIG = """
[agent]
log_level = "info"
watchdog = false
[host]
apply_on_run = false
[dispatch]
mode = "{mode}"
submit_mode = "{submit}"
# A shared, unisolated test host can wake even a SCHED_FIFO thread a few ms
# late; jobs are planned with more margin than this to their window's ends.
miss_tolerance_ns = 20_000_000
[timeline]
policy = "edf-backfill"
horizon_ns = 600_000_000_000
default_lease_ns = 600_000_000_000
[rpc]
socket_path = "{dir}/qrtd.sock"
[roles]
reader = []
scheduler = ["uid:{uid}"]
calibration = ["uid:{uid}"]
admin = []
[probes]
enabled = false
"""

# One QPU per test (this 2-CPU host isolates one core: one dispatch CPU).
PERIODIC_QPU = """
[[qpu]]
name = "qpu0"
endpoint = "unix://{dir}/qpu0.sock"
calibration = "periodic"
period_ns = 1_000_000_000
blackout_ns = 100_000_000
fidelity_f0 = 0.99
"""
PUSHED_QPU = """
[[qpu]]
name = "qpu1"
endpoint = "unix://{dir}/qpu1.sock"
calibration = "pushed"
fidelity_f0 = 0.99
"""


def wait_for(pred, timeout_s, step_s=0.05):
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if pred():
            return True
        time.sleep(step_s)
    return pred()


def getent(db, name):
    return subprocess.run(["getent", db, name], capture_output=True, text=True).returncode == 0


def proc_status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return line.split(":", 1)[1].split()
    return []


class E2E(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.created = []
        if os.geteuid() != 0:
            return
        had = {("passwd", "qrtd"): getent("passwd", "qrtd"), ("group", "qrt"): getent("group", "qrt")}
        r = subprocess.run(["systemd-sysusers", SYSUSERS], capture_output=True, text=True)
        if r.returncode != 0:
            raise unittest.SkipTest("systemd-sysusers failed: " + r.stderr)
        cls.created = [k for k, v in had.items() if not v]

    @classmethod
    def tearDownClass(cls):
        for db, name in cls.created:
            subprocess.run(["userdel" if db == "passwd" else "groupdel", name], capture_output=True)

    def setUp(self):
        if not QRTD or not QPU_SIM:
            self.skipTest("QRTD and QPU_SIM must name the binaries")
        # State on tmpfs when there is one: each ledger operation is one
        # fsync, and the test is about behaviour, not disk speed.
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = tempfile.mkdtemp(prefix="qrt-e2e-", dir=base)
        # qrtd (the daemon's user) must reach its state and the sockets here.
        os.chmod(self.dir, 0o755)
        self.state = os.path.join(self.dir, "state")
        os.mkdir(self.state, 0o750)
        self.sock = os.path.join(self.dir, "qrtd.sock")
        self.cfg = os.path.join(self.dir, "qrtd.toml")
        with open(self.cfg, "w") as f:
            pushed = "pushed" in self._testMethodName
            qpu = PUSHED_QPU if pushed else PERIODIC_QPU
            # One test per submission mode: the 500-job run with syscall
            # submission (the default), the pushed-calibration run with an
            # SQPOLL poller on the dispatch CPU.
            self.submit_mode = "sqpoll" if pushed else "syscall"
            f.write((CONFIG + qpu).format(dir=self.dir, uid=os.getuid(), submit=self.submit_mode,
                                          mode="tuned" if os.geteuid() == 0 else "untuned"))
        self.summary = os.path.join(self.dir, "sim.json")
        self.arrivals = os.path.join(self.dir, "arrivals.jsonl")  # one line per job frame at qpu-sim
        self.procs = []
        self.sim = self.start_sim()
        self.qrtd = None

    def tearDown(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    # A subclass's qpu-sim options beyond these (its prepare cost, a
    # refusal marker, ...).
    SIM_ARGS: list[str] = []

    def edit_config(self, old, new):
        """The test's qrtd.toml with the first `old` replaced by `new`."""
        with open(self.cfg) as f:
            text = f.read()
        self.assertIn(old, text)
        with open(self.cfg, "w") as f:
            f.write(text.replace(old, new, 1))

    def use_wire_2(self, qpu, arm_lead_ns):
        """[[qpu]] `qpu` speaks wire version 2 with this arm lead."""
        self.edit_config(f'name = "{qpu}"\n', f'name = "{qpu}"\nwire = 2\narm_lead_ns = {arm_lead_ns}\n')

    def start_sim(self):
        args = [QPU_SIM, "--listen", f"unix://{self.dir}/qpu0.sock",
                "--listen", f"unix://{self.dir}/qpu1.sock", "--json",
                "--summary-file", self.summary, "--duration-s", "110",
                "--arrivals-file", self.arrivals, *self.SIM_ARGS]
        if os.geteuid() == 0:
            # Prompt arrival stamps on a loaded host; the control
            # electronics' endpoint for group qrt (the daemon), set by
            # qpu-sim as it creates the socket.
            args += ["--fifo", "50", "--socket-group", "qrt", "--socket-mode", "0660"]
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        for name in ("qpu0.sock", "qpu1.sock"):
            sock = f"{self.dir}/{name}"
            self.assertTrue(wait_for(lambda: os.path.exists(sock), 10), "qpu-sim did not listen")
        return p

    def start_qrtd(self):
        log = open(os.path.join(self.dir, f"qrtd-{len(self.procs)}.log"), "w")
        p = subprocess.Popen([QRTD, "run", "-c", self.cfg, "--state-dir", self.state],
                             stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        self.qrtd = p

        def up():
            self.assertIsNone(p.poll(), "qrtd exited: " + self.log_tail())
            try:
                qrt_client.Client(self.sock, timeout=5).close()
                return True
            except qrt_client.QrtError:
                return False
        self.assertTrue(wait_for(up, 20), "qrtd socket did not come up: " + self.log_tail())
        c = qrt_client.Client(self.sock, timeout=30)
        c.status()  # served: every start-up step is done
        if os.geteuid() == 0:
            # Started as root, running as qrtd with four capabilities.
            uid = subprocess.run(["id", "-u", "qrtd"], capture_output=True, text=True).stdout.strip()
            self.assertEqual(proc_status(p.pid, "Uid"), [uid] * 4, self.log_tail())
            self.assertEqual(proc_status(p.pid, "CapEff"), ["000000c000804000"], self.log_tail())
        return c

    def log_tail(self):
        out = []
        for name in sorted(os.listdir(self.dir)):
            if name.startswith("qrtd-"):
                with open(os.path.join(self.dir, name)) as f:
                    out.append(name + ":\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def stop_sim(self):
        self.sim.send_signal(signal.SIGTERM)
        self.sim.wait(15)
        with open(self.summary) as f:
            return json.load(f)

    def arrived(self):
        """qpu-sim's arrivals (after stop_sim): one dict per job frame."""
        with open(self.arrivals) as f:
            return [json.loads(line) for line in f if line.strip()]

    def require_tuned(self, c):
        """These runs assert that every job completes: that holds for the
        tuned dispatch thread (SCHED_FIFO) only.  Skip, saying why, rather
        than run untuned and excuse misses."""
        q = c.status()["qpus"][0]
        if q["mode"] != "tuned" or not q["realtime"]:
            self.skipTest(f"dispatch is not tuned here (mode {q['mode']}, realtime {q['realtime']}; "
                          "tuned needs root): every job completing is only promised tuned")

    def outcomes(self, st):
        """Terminal states with their reasons, counted, and the log tail."""
        n = {}
        for s in st.values():
            key = f"{s['state']}: {s.get('reason', '')[:70]}" if isinstance(s, dict) else repr(s)
            n[key] = n.get(key, 0) + 1
        return f"{n}\n{self.log_tail()}"

    def endpoint_up(self, c):
        st = c.status()
        return all(q.get("endpoint_up") for q in st["qpus"])

    # ------------------------------------------------------------------

    def test_500_jobs_then_kill9_and_restart(self):
        c = self.start_qrtd()
        self.require_tuned(c)
        self.assertTrue(wait_for(lambda: self.endpoint_up(c), 10), "endpoint never up")

        # 1. 500 jobs, 8 ms apart, across several 900 ms windows.
        windows = c.calibration_get("qpu0")
        first = time.time_ns() + 4000 * MS
        starts = demo_client.plan_starts(windows, 500, first, 8 * MS, 200_000, MARGIN)
        self.assertEqual(len(starts), 500)
        ids_of_window = {w["calibration_id"] for w in windows for t in starts
                         if w["valid_from_ns"] <= t < w["valid_until_ns"]}
        self.assertGreaterEqual(len(ids_of_window), 4, "jobs should span several windows")
        sub = c.subscribe(["job.finished"])
        self.assertTrue(sub is not None)
        acked, errors = demo_client.submit_jobs(c, "qpu0", starts, 200_000, "e2e")
        self.assertEqual(errors, [])
        self.assertEqual(len(acked), 500)
        ids = [r["job_id"] for r in acked]
        self.assertEqual(len(set(ids)), 500)
        last_end = max(r["end_ns"] for r in acked)
        st = demo_client.wait_terminal(c, ids, (last_end - time.time_ns()) / 1e9 + 20)
        states = {}
        for j, s in st.items():
            self.assertIsInstance(s, dict, f"jobs.status {j}: {s}")
            self.assertIn(s["state"], demo_client.TERMINAL, f"job {j} not terminal: {s}")
            states[s["state"]] = states.get(s["state"], 0) + 1
            if s["state"] != "completed":
                self.assertTrue(s["reason"], f"job {j} is {s['state']} without a reason")
            else:
                self.assertGreater(s["sent_ns"], 0)
                self.assertTrue(s["has_result"])
            if s["state"] == "missed":
                self.assertEqual(s["sent_ns"], 0, f"missed job {j} was sent")
        # On an idle host, tuned: every acknowledged job completes, except
        # one the host held the dispatch thread up for beyond the tolerance
        # (never sent, as checked above).  The thread measures such hold-ups
        # itself; a miss they do not account for is the agent's, and fails
        # (a VM stall must not decide CI by chance).
        self.assertEqual(set(states) - {"completed", "missed"}, set(), self.outcomes(st))
        missed = states.get("missed", 0)
        held = demo_client.held_up(c.telemetry(), "qpu0", 20_000_000)  # the config's miss_tolerance_ns
        self.assertLessEqual(missed, held, f"misses the dispatch thread did not measure: {self.outcomes(st)}")
        if missed:
            print(f"\nnote: {missed} of 500 missed while the host held the dispatch thread up "
                  f"({held} late wake-ups or sends)", file=sys.stderr)
        # A result is readable.
        done = next(j for j, s in st.items() if s["state"] == "completed")
        res = c.jobs_result(done)
        self.assertTrue(res["result"], "empty result")

        # Events: job.finished notifications arrived on this connection.
        finished = 0
        while True:
            ev = c.next_event(timeout=0.5)
            if ev is None:
                break
            if ev.get("type") == "job.finished":
                finished += 1
        self.assertGreater(finished, 0)

        # telemetry.snapshot: dispatch lateness percentiles.
        snap = c.telemetry()
        h = demo_client.histogram(snap, "qrt_dispatch_lateness_seconds", "qpu0")
        self.assertIsNotNone(h, "no qrt_dispatch_lateness_seconds{qpu=qpu0}")
        self.assertGreater(h["count"], 0)
        for k in ("p50_ns", "p95_ns", "p99_ns", "p999_ns", "max_ns"):
            self.assertIn(k, h)
        self.assertLessEqual(h["p50_ns"], h["p99_ns"])
        # metrics: Prometheus text that parses.
        text = c.metrics()
        self.check_metrics_text(text)
        self.assertIn('qrt_dispatch_lateness_seconds_bucket{', text)
        # agent.status: QPUs, health, probes (disabled here).
        status = c.status()
        # The one known degradation of this setup: host.apply_on_run = false
        # leaves no isolated CPU.  Anything else is a fault.
        expected = [] if status["partition"]["isolated_cpus"] else [
            "no isolated CPU: dispatch shares CPUs with housekeeping"]
        self.assertEqual(status["health"], {"status": "degraded" if expected else "ok", "reasons": expected})
        self.assertTrue(status["probes"].startswith("unavailable ("), status["probes"])
        self.assertEqual([q["name"] for q in status["qpus"]], ["qpu0"])

        # 2. Acknowledged reservations, then kill -9.
        now = time.time_ns()
        held = []
        for i in range(5):
            r = c.slots_reserve(1 * MS, f"held-{i}", qpus=["qpu0"], not_before_ns=now + 60_000 * MS)
            held.append(r)
        windows = c.calibration_get("qpu0")
        soon = demo_client.plan_starts(windows, 40, now + 1500 * MS, 10 * MS, 200_000, 2 * MS)
        acked2, errors2 = demo_client.submit_jobs(c, "qpu0", soon, 200_000, "crash")
        self.assertEqual(errors2, [])
        ids2 = [r["job_id"] for r in acked2]
        c.close()
        self.qrtd.send_signal(signal.SIGKILL)
        self.qrtd.wait(10)
        # Down until every start of the second batch has passed.
        latest = max(r["start_ns"] for r in acked2)
        time.sleep(max(0.0, (latest - time.time_ns()) / 1e9) + 0.5)
        c = self.start_qrtd()
        for r in held:
            s = c.jobs_status(r["reservation_id"])
            self.assertEqual(s["state"], "held", s)
            self.assertEqual(s["fencing_token"], r["fencing_token"])
        st2 = demo_client.statuses(c, ids2)
        for j in ids2:
            s = st2[j]
            self.assertIsInstance(s, dict, f"acknowledged job {j} lost after kill -9: {s}")
            self.assertIn(s["state"], demo_client.TERMINAL, s)
            self.assertTrue(s["reason"] or s["state"] == "completed", s)
            if s["state"] == "missed":
                self.assertEqual(s["sent_ns"], 0, f"job {j} sent late: {s}")
        self.assertTrue(any(st2[j]["state"] == "missed" for j in ids2),
                        "no job was missed across the kill -9")
        # A held reservation still commits after the restart.
        r0 = held[0]
        sub = c.jobs_submit(b'{"shots": 10}', reservation_id=r0["reservation_id"],
                            fencing_token=r0["fencing_token"])
        self.assertEqual(sub["state"], "committed")
        c.close()
        # Clean stop, then qpu-sim's verdict.
        self.qrtd.send_signal(signal.SIGTERM)
        self.assertEqual(self.qrtd.wait(20), 0, self.log_tail())
        summary = self.stop_sim()
        self.assertEqual(summary["out_of_window"], 0, summary)
        self.assertGreater(summary["results"], 0, summary)

    def test_pushed_calibration_reaches_the_dispatch_guard(self):
        """calibration.update re-places committed jobs into the new window
        (new calibration id), including jobs already handed to the
        dispatcher: they complete, none fails on the calibration guard."""
        c = self.start_qrtd()
        self.require_tuned(c)
        self.assertTrue(wait_for(lambda: self.endpoint_up(c), 10), "endpoint never up")
        q = next(q for q in c.status()["qpus"] if q["name"] == "qpu1")
        # SQPOLL may be refused by a kernel or seccomp policy: then qrtd says
        # so in its log and falls back; the rest of the test holds either way.
        self.assertIn(q["submit_mode"], ("sqpoll", "syscall"), q)
        if q["submit_mode"] != "sqpoll":
            self.assertIn("IORING_SETUP_SQPOLL", self.log_tail())
        now = time.time_ns()
        w1 = {"calibration_id": 101, "valid_from_ns": now + 500 * MS, "valid_until_ns": now + 4000 * MS}
        c.calibration_update("qpu1", [w1])
        windows = c.calibration_get("qpu1")
        self.assertEqual([w["calibration_id"] for w in windows], [101])
        starts = demo_client.plan_starts(windows, 60, now + 1500 * MS, 20 * MS, 200_000, MARGIN)
        acked, errors = demo_client.submit_jobs(c, "qpu1", starts, 200_000, "pushed")
        self.assertEqual(errors, [])
        self.assertTrue(all(r["calibration_id"] == 101 for r in acked))
        # Wait until the first jobs have been handed over (the pump's
        # horizon is 250 ms), then recalibrate: same span, new id.
        first = min(r["start_ns"] for r in acked)
        time.sleep(max(0.0, (first - 150 * MS - time.time_ns()) / 1e9))
        w2 = dict(w1, calibration_id=202, valid_from_ns=time.time_ns() + 20 * MS)
        rep = c.calibration_update("qpu1", [w2])
        self.assertGreater(rep["replaced"] + rep["displaced"], 0, rep)
        ids = [r["job_id"] for r in acked]
        last_end = max(r["end_ns"] for r in acked)
        st = demo_client.wait_terminal(c, ids, (last_end - time.time_ns()) / 1e9 + 15)
        states = {}
        for j, s in st.items():
            self.assertIn(s["state"], demo_client.TERMINAL, s)
            states[s["state"]] = states.get(s["state"], 0) + 1
            if s["state"] == "completed":
                self.assertEqual(s["calibration_id"], 202, s)
            else:
                self.assertTrue(s["reason"], s)
                self.assertNotIn("calibration_changed", s["reason"], s)
        self.assertEqual(states, {"completed": len(ids)}, self.outcomes(st))
        c.close()
        self.qrtd.send_signal(signal.SIGTERM)
        self.assertEqual(self.qrtd.wait(20), 0, self.log_tail())
        summary = self.stop_sim()
        self.assertEqual(summary["out_of_window"], 0, summary)
        self.assertEqual(summary["calibration_mismatch"], 0, summary)

    def check_metrics_text(self, text):
        sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
                            r'(-?[0-9.eE+-]+|NaN|\+Inf|-Inf)$')
        n = 0
        for line in text.splitlines():
            if not line or line.startswith("# HELP ") or line.startswith("# TYPE "):
                continue
            self.assertRegex(line, sample)
            n += 1
        self.assertGreater(n, 0)


if __name__ == "__main__":
    prog = unittest.main(verbosity=2, exit=False)
    # ctest shows a skip as skipped (SKIP_RETURN_CODE 77), never as a pass.
    sys.exit(1 if not prog.result.wasSuccessful() else 77 if prog.result.skipped else 0)
