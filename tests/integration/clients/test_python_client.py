"""qrt_client.py against a real agent socket (qrt-test-server: the agent's
rpc server, engine, methods and SQLite ledger).

ctest sets QRT_TEST_SERVER (the server binary) and PYTHONPATH (tools/python).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

from qrt_client import Client, ClientError, RpcError, exit_code_for_reason

SERVER = os.environ.get("QRT_TEST_SERVER", "")
EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tools",
                       "python", "example.py")


@unittest.skipUnless(SERVER and os.access(SERVER, os.X_OK), "QRT_TEST_SERVER is not set")
class PythonClientIntegration(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="qrt-py-int-")
        cls.sock = os.path.join(cls.dir, "qrtd.sock")
        me = f"uid:{os.getuid()}"
        cls.server = subprocess.Popen(
            [SERVER, "--socket", cls.sock, "--store", os.path.join(cls.dir, "ledger.db"),
             "--scheduler", me, "--calibration", me, "--duration-s", "300"],
            stdout=subprocess.PIPE, text=True)
        line = cls.server.stdout.readline()
        if not line.startswith("ready "):
            cls.server.kill()
            raise RuntimeError(f"qrt-test-server did not start: {line!r}")
        cls.n = 0

    @classmethod
    def tearDownClass(cls):
        cls.server.terminate()
        try:
            cls.server.wait(10)
        except subprocess.TimeoutExpired:
            cls.server.kill()
            cls.server.wait()
        cls.server.stdout.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def key(self, what):
        type(self).n += 1
        return f"{what}-{os.getpid()}-{self.n}"

    def client(self):
        c = Client(self.sock, timeout=10)
        self.addCleanup(c.close)
        return c

    def test_hello_lists_every_method_and_our_roles(self):
        h = self.client().hello()
        self.assertEqual(h["agent"], "qrtd")
        self.assertIn("scheduler", h["peer"]["roles"])
        for m in ("slots.query", "slots.reserve", "jobs.submit", "events.subscribe", "metrics"):
            self.assertIn(m, h["capabilities"])

    def test_query_reserve_submit_status_result_round_trip(self):
        c = self.client()
        q = c.slots_query(duration_ns=2_000_000, qpus=["qpu0"], max_candidates=2)
        self.assertTrue(q["candidates"])
        self.assertLessEqual(len(q["candidates"]), 2)

        k = self.key("py")
        # 30 s ahead: nothing dispatches in the test agent, and a job whose
        # start passed is marked missed.
        later = time.time_ns() + 30_000_000_000
        r = c.slots_reserve(duration_ns=2_000_000, qpus=["qpu0"], idempotency_key=k,
                            lease_ns=60_000_000_000, not_before_ns=later)
        self.assertEqual(r["state"], "held")
        again = c.slots_reserve(duration_ns=2_000_000, qpus=["qpu0"], idempotency_key=k,
                                lease_ns=60_000_000_000, not_before_ns=later)
        self.assertEqual(again["reservation_id"], r["reservation_id"])

        hb = c.slots_heartbeat(r["reservation_id"], r["fencing_token"])
        self.assertEqual(hb["reservation_id"], r["reservation_id"])

        job = c.jobs_submit(bytes(range(256)), reservation_id=r["reservation_id"],
                            fencing_token=r["fencing_token"])
        self.assertEqual(job["state"], "committed")
        self.assertEqual(job["payload_bytes"], 256)
        self.assertEqual(c.jobs_status(job["job_id"])["state"], "committed")

        with self.assertRaises(RpcError) as cm:
            c.jobs_result(job["job_id"])  # it has not run
        self.assertEqual(cm.exception.exit_code, exit_code_for_reason(cm.exception.reason))
        self.assertEqual(c.jobs_cancel(job["job_id"])["state"], "cancelled")

    def test_one_shot_submit_places_and_commits(self):
        j = self.client().jobs_submit(b"one shot", duration_ns=1_000_000, qpus=["qpu0"],
                                      idempotency_key=self.key("oneshot"),
                                      not_before_ns=time.time_ns() + 30_000_000_000)
        self.assertEqual(j["state"], "committed")

    def test_errors_carry_the_stable_reason_and_its_exit_code(self):
        c = self.client()
        cases = [
            (lambda: c.slots_query(duration_ns=1000, qpus=["no-such-qpu"]), "unknown_qpu", 7),
            (lambda: c.slots_reserve(duration_ns=1000, qpus=["qpu1"],
                                     idempotency_key=self.key("nofit")), "no_fit", 8),
            (lambda: c.call("no.such.method"), "method_not_found", 3),
            (lambda: c.call("slots.query", {"duration_ns": "2ms"}), "invalid_params", 4),
            (lambda: c.call("slots.query", {"duration_ns": 1000, "dedline_ns": 5}),
             "invalid_params", 4),
            (lambda: c.jobs_status(999_999), "not_found", 7),
        ]
        for fn, reason, code in cases:
            with self.subTest(reason=reason):
                with self.assertRaises(RpcError) as cm:
                    fn()
                self.assertEqual(cm.exception.reason, reason)
                self.assertEqual(cm.exception.exit_code, code)
                self.assertLessEqual(cm.exception.code, -32000)
        r = c.slots_reserve(duration_ns=1000, qpus=["qpu0"], idempotency_key=self.key("tok"))
        with self.assertRaises(RpcError) as cm:
            c.slots_release(r["reservation_id"], r["fencing_token"] + 1000)
        self.assertEqual(cm.exception.reason, "bad_fencing_token")
        # The connection survives every error.
        self.assertEqual(c.hello()["agent"], "qrtd")

    def test_a_cancel_or_release_with_a_wrong_fencing_token_is_refused_naming_it(self):
        c = self.client()
        r = c.slots_reserve(duration_ns=1000, qpus=["qpu0"], idempotency_key=self.key("fence"),
                            not_before_ns=time.time_ns() + 30_000_000_000)
        rid, token = r["reservation_id"], r["fencing_token"]
        wrong = token ^ 1
        with self.assertRaises(RpcError) as cm:
            c.slots_release(rid, wrong)
        self.assertEqual(cm.exception.reason, "bad_fencing_token")
        c.jobs_submit(b"H 0", reservation_id=rid, fencing_token=token)
        with self.assertRaises(RpcError) as cm:
            c.call("jobs.cancel", {"job_id": rid, "fencing_token": wrong})
        self.assertEqual(cm.exception.reason, "bad_fencing_token")
        self.assertEqual(c.jobs_status(rid)["state"], "committed")
        self.assertEqual(c.jobs_cancel(rid, fencing_token=token)["state"], "cancelled")

    def test_events_arrive_in_order_on_the_subscribed_connection(self):
        c = self.client()
        sub = c.subscribe(["reservation.reserved", "reservation.released"])
        self.assertTrue(sub["subscribed"])
        r = c.slots_reserve(duration_ns=1000, qpus=["qpu0"], idempotency_key=self.key("ev"))
        c.slots_release(r["reservation_id"], r["fencing_token"])
        evs = list(c.events(timeout=1.0))
        self.assertEqual([e["type"] for e in evs],
                         ["reservation.reserved", "reservation.released"])
        self.assertEqual([e["seq"] for e in evs], [1, 2])
        self.assertEqual({e["data"]["reservation_id"] for e in evs}, {r["reservation_id"]})

    def test_pipelined_calls_are_answered_in_order(self):
        c = self.client()
        calls = [("agent.hello", {"client": f"p{i}"}) for i in range(200)]
        calls.insert(100, ("no.such.method", {}))
        out = c.call_many(calls)
        self.assertEqual(len(out), 201)
        self.assertIsInstance(out[100], RpcError)
        self.assertTrue(all(o["agent"] == "qrtd" for i, o in enumerate(out) if i != 100))

    def test_metrics_are_prometheus_text(self):
        text = self.client().metrics()
        self.assertIn("# TYPE ", text)
        self.assertIn("qrt_rpc_", text)

    def test_the_example_runs_against_the_agent(self):
        r = subprocess.run([sys.executable, EXAMPLE, "--socket", self.sock, "--qpu", "qpu0",
                            "--lead-s", "30", "--key", self.key("example")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("reserved id=", r.stdout)
        self.assertIn("state=committed", r.stdout)
        self.assertIn("event seq=1 type=reservation.reserved", r.stdout)

    def test_the_example_exits_69_without_an_agent(self):
        r = subprocess.run([sys.executable, EXAMPLE, "--socket",
                            os.path.join(self.dir, "none.sock")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 69, r.stderr)
        self.assertIn("is qrtd running?", r.stderr)

    def test_a_missing_agent_raises_client_error(self):
        with self.assertRaises(ClientError) as cm:
            Client(os.path.join(self.dir, "none.sock"))
        self.assertEqual(cm.exception.reason, "unreachable")


if __name__ == "__main__":
    prog = unittest.main(verbosity=2, exit=False)
    # ctest shows a skip as skipped (SKIP_RETURN_CODE 77), never as a pass.
    sys.exit(1 if not prog.result.wasSuccessful() else 77 if prog.result.skipped else 0)
