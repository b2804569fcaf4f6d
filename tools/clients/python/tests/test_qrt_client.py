"""Unit tests of qrt_client against a scripted fake agent (a thread on a
temporary AF_UNIX socket): framing, ids, errors and their reasons, events
interleaved with replies, partial lines, timeouts, pipelining.  The real
agent is exercised by tests/integration/clients/test_python_client.py.

Run from tools/clients/python (ctest runs it as python_client_unit):
    PYTHONPATH=src python3 -m unittest discover -s tests -v
"""

import base64
import json
import os
import socket
import sys
import tempfile
import threading
import time
import unittest
from typing import Any

import qrt_client
from qrt_client import Client, ClientError, RpcError


class FakeAgent:
    """Accepts one connection and runs script(conn, reader) on it."""

    def __init__(self, script):
        self.dir = tempfile.TemporaryDirectory(prefix="qrt-py-")
        self.path = os.path.join(self.dir.name, "qrtd.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self.received = []
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self.thread.start()

    def _run(self, script):
        self.listener.settimeout(5)
        try:
            conn, _ = self.listener.accept()
        except OSError as e:
            self.error = e
            return
        with conn:
            conn.settimeout(5)
            reader = conn.makefile("rb")
            try:
                script(conn, self._reader(reader))
            except Exception as e:  # noqa: BLE001 -- any failure of the script is surfaced by close()
                self.error = e

    def _reader(self, f):
        def read_request():
            line = f.readline()
            if not line:
                return None
            req = json.loads(line)
            self.received.append(req)
            return req
        return read_request

    def close(self):
        self.thread.join(5)
        self.listener.close()
        self.dir.cleanup()
        if self.error is not None:
            raise self.error


def send(conn, obj):
    conn.sendall(json.dumps(obj).encode() + b"\n")


def answer(conn, req, result):
    send(conn, {"jsonrpc": "2.0", "id": req["id"], "result": result})


class ClientUnitTest(unittest.TestCase):
    def with_agent(self, script):
        agent = FakeAgent(script)
        self.addCleanup(agent.close)
        return agent

    def test_a_missing_agent_is_unreachable_with_a_hint_and_exit_69(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "none.sock")
            with self.assertRaises(ClientError) as cm:
                Client(path)
        self.assertEqual(cm.exception.reason, "unreachable")
        self.assertEqual(cm.exception.exit_code, 69)
        self.assertIn("cannot connect to " + path, str(cm.exception))
        self.assertIn("is qrtd running?", str(cm.exception))

    def test_socket_path_comes_from_argument_then_environment(self):
        old = os.environ.get("QRT_SOCKET")
        try:
            os.environ["QRT_SOCKET"] = "/nonexistent/from-env.sock"
            with self.assertRaises(ClientError) as cm:
                Client()
            self.assertIn("/nonexistent/from-env.sock", cm.exception.message)
        finally:
            if old is None:
                os.environ.pop("QRT_SOCKET", None)
            else:
                os.environ["QRT_SOCKET"] = old

    def test_a_call_sends_one_jsonrpc_line_and_returns_the_result(self):
        def script(conn, read):
            req = read()
            answer(conn, req, {"api_version": 1})
        agent = self.with_agent(script)
        with Client(agent.path) as c:
            self.assertEqual(c.hello(), {"api_version": 1})
        req = agent.received[0]
        self.assertEqual(req["jsonrpc"], "2.0")
        self.assertEqual(req["method"], "agent.hello")
        self.assertIsInstance(req["id"], int)
        self.assertEqual(req["params"], {"client": "qrt_client.py"})

    def test_an_error_reply_raises_rpc_error_with_its_reason_and_exit_code(self):
        def script(conn, read):
            req = read()
            send(conn, {"jsonrpc": "2.0", "id": req["id"],
                        "error": {"code": -32003, "message": "nothing fits duration_ns=5",
                                  "data": {"reason": "no_fit", "field": "duration_ns"}}})
        agent = self.with_agent(script)
        with Client(agent.path) as c, self.assertRaises(RpcError) as cm:
            c.slots_query(duration_ns=5)
        e = cm.exception
        self.assertEqual((e.code, e.reason, e.exit_code), (-32003, "no_fit", 8))
        self.assertEqual(e.data["field"], "duration_ns")
        self.assertIn("slots.query: nothing fits", str(e))

    def test_an_error_without_reason_gets_the_codes_default_reason(self):
        def script(conn, read):
            req = read()
            send(conn, {"jsonrpc": "2.0", "id": req["id"],
                        "error": {"code": -32601, "message": "no such method"}})
        agent = self.with_agent(script)
        with Client(agent.path) as c, self.assertRaises(RpcError) as cm:
            c.call("nope")
        self.assertEqual(cm.exception.reason, "method_not_found")
        self.assertEqual(cm.exception.exit_code, 3)

    def test_events_before_a_reply_are_queued_in_order(self):
        done = threading.Event()

        def script(conn, read):
            req = read()
            answer(conn, req, {"subscribed": True})
            req = read()
            for seq in (1, 2):
                send(conn, {"jsonrpc": "2.0", "method": "events.event",
                            "params": {"seq": seq, "type": "job.finished", "data": {}}})
            answer(conn, req, {"state": "held"})
            send(conn, {"jsonrpc": "2.0", "method": "events.event",
                        "params": {"seq": 3, "type": "reservation.expired", "data": {}}})
            done.wait(5)  # keep the connection open while the client reads
        agent = self.with_agent(script)
        with Client(agent.path) as c:
            c.subscribe()
            self.assertEqual(c.jobs_status(1), {"state": "held"})
            seqs = [ev["seq"] for ev in c.events(timeout=0.5)]
        done.set()
        self.assertEqual(seqs, [1, 2, 3])

    def test_replies_split_across_reads_are_reassembled(self):
        def script(conn, read):
            req = read()
            line = json.dumps({"jsonrpc": "2.0", "id": req["id"],
                               "result": {"text": "x" * 200000}}).encode() + b"\n"
            for i in range(0, len(line), 777):
                conn.sendall(line[i:i + 777])
        agent = self.with_agent(script)
        with Client(agent.path) as c:
            self.assertEqual(len(c.metrics()), 200000)

    def test_no_reply_in_time_is_a_timeout_with_exit_75(self):
        gate = threading.Event()

        def script(conn, read):
            read()
            gate.wait(5)
        agent = self.with_agent(script)
        with Client(agent.path, timeout=0.2) as c:
            t0 = time.monotonic()
            with self.assertRaises(ClientError) as cm:
                c.hello()
            self.assertLess(time.monotonic() - t0, 3.0)
        gate.set()
        self.assertEqual(cm.exception.reason, "timeout")
        self.assertEqual(cm.exception.exit_code, 75)

    def test_the_agent_closing_is_disconnected(self):
        def script(conn, read):
            read()
        agent = self.with_agent(script)
        with Client(agent.path) as c, self.assertRaises(ClientError) as cm:
            c.hello()
        self.assertEqual(cm.exception.reason, "disconnected")

    def test_a_reply_that_is_not_json_is_a_protocol_error(self):
        def script(conn, read):
            read()
            conn.sendall(b"HTTP/1.0 400 Bad Request\n")
        agent = self.with_agent(script)
        with Client(agent.path) as c, self.assertRaises(ClientError) as cm:
            c.hello()
        self.assertEqual(cm.exception.reason, "protocol_error")
        self.assertEqual(cm.exception.exit_code, 76)

    def test_call_many_writes_every_request_before_reading_and_matches_ids(self):
        def script(conn, read):
            reqs = [read() for _ in range(3)]
            for req in reversed(reqs):  # out of order: the client matches ids
                if req["method"] == "bad":
                    send(conn, {"jsonrpc": "2.0", "id": req["id"],
                                "error": {"code": -32601, "message": "no",
                                          "data": {"reason": "method_not_found"}}})
                else:
                    answer(conn, req, req["params"]["n"])
        agent = self.with_agent(script)
        with Client(agent.path) as c:
            out = c.call_many([("echo", {"n": 1}), ("bad", {"n": 2}), ("echo", {"n": 3})])
        self.assertEqual(out[0], 1)
        self.assertIsInstance(out[1], RpcError)
        self.assertEqual(out[1].reason, "method_not_found")
        self.assertEqual(out[2], 3)

    def test_payloads_go_out_base64_and_results_come_back_as_bytes(self):
        raw = bytes(range(256))

        def script(conn, read):
            req = read()
            self.assertEqual(base64.b64decode(req["params"]["payload"]), raw)
            answer(conn, req, {"reservation_id": 5, "state": "committed"})
            req = read()
            answer(conn, req, {"job_id": 5, "state": "completed",
                               "result": base64.b64encode(raw[::-1]).decode()})
        agent = self.with_agent(script)
        with Client(agent.path) as c:
            c.jobs_submit(raw, reservation_id=5, fencing_token=9)
            self.assertEqual(c.jobs_result(5)["result"], raw[::-1])
        self.assertEqual(agent.received[0]["params"]["fencing_token"], 9)

    def test_jobs_submit_refuses_half_given_targets_without_sending(self):
        def script(conn, read):
            self.assertIsNone(read())
        agent = self.with_agent(script)
        with Client(agent.path) as c:
            with self.assertRaises(ValueError):
                c.jobs_submit(b"x", reservation_id=5)
            with self.assertRaises(ValueError):
                c.jobs_submit(b"x", duration_ns=1000)
        self.assertEqual(agent.received, [])

    def test_a_challenge_that_is_not_an_object_of_params_is_a_protocol_error(self):
        # The network listener's first line is read before any MUNGE
        # credential is made: a malformed challenge is refused as such.
        bad: tuple[object, ...] = (None, [], "munge")
        for params in bad:
            srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            srv.bind(("127.0.0.1", 0))
            srv.listen(1)
            srv.settimeout(5)
            port = srv.getsockname()[1]

            def serve(srv=srv, params=params):
                conn, _ = srv.accept()
                with conn:
                    send(conn, {"jsonrpc": "2.0", "method": "auth.challenge", "params": params})
                    conn.settimeout(5)
                    conn.recv(1)  # until the client closes
            t = threading.Thread(target=serve, daemon=True)
            t.start()
            with self.assertRaises(ClientError) as cm:
                Client(f"tcp://127.0.0.1:{port}", connect_timeout=5)
            t.join(5)
            srv.close()
            self.assertEqual(cm.exception.reason, "protocol_error", params)
            self.assertIn("is not a MUNGE auth.challenge", cm.exception.message)

    def test_every_reason_of_the_protocol_table_maps_to_its_exit_status(self):
        from qrt_client import protocol
        raised = [r for r in protocol.REASONS if r.code is not None]
        self.assertGreater(len(raised), 20)
        for r in raised:
            self.assertEqual(qrt_client.exit_code_for_reason(r.name), r.exit_code, r.name)
        for cr in protocol.CLIENT_REASONS:
            self.assertEqual(qrt_client.exit_code_for_reason(cr.name), cr.exit_code, cr.name)
        self.assertEqual(qrt_client.exit_code_for_reason("a_reason_of_the_future"), 1)
        # What a network client's MUNGE credential signs.
        self.assertEqual(qrt_client.AUTH_PAYLOAD_VERSION, protocol.AUTH_PAYLOAD_VERSION)



def holder(start_ns, rid, log, refuse=None):
    """A fake agent that answers slots.reserve with a hold at start_ns (or
    refuses with reason `refuse`), then answers a release if one comes."""
    def script(conn, read):
        req = read()
        log.append(req)
        if refuse is not None:
            send(conn, {"jsonrpc": "2.0", "id": req["id"],
                        "error": {"code": -32000, "message": "nothing fits",
                                  "data": {"reason": refuse}}})
        else:
            answer(conn, req, {"reservation_id": rid, "fencing_token": rid * 10,
                               "start_ns": start_ns, "end_ns": start_ns + 1000,
                               "state": "held", "qpu": "qpu0"})
        rel = read()
        if rel is not None:
            log.append(rel)
            answer(conn, rel, {"reservation_id": rid, "state": "released"})
    return script


class PlaceBest(unittest.TestCase):
    def agents(self, specs):
        logs: list[list[dict[str, Any]]] = [[] for _ in specs]
        fakes = [FakeAgent(holder(s, i + 1, logs[i], refuse=r)) for i, (s, r) in enumerate(specs)]
        clients = [Client(f.path, timeout=5) for f in fakes]

        def done():
            for c in clients:
                c.close()
            for f in fakes:
                f.close()
        self.addCleanup(done)
        return clients, logs

    def test_the_earliest_hold_wins_and_the_others_are_released(self):
        clients, logs = self.agents([(300, None), (100, None), (200, None)])
        p = qrt_client.place_best(clients, 1000, "job-1", qpus=["qpu0"], lease_ns=5)
        self.assertEqual(p.chosen, 1)
        assert p.reservation is not None
        self.assertEqual(p.reservation["reservation_id"], 2)
        for log in logs:
            self.assertEqual(log[0]["method"], "slots.reserve")
            self.assertEqual(log[0]["params"]["idempotency_key"], "job-1")
            self.assertEqual(log[0]["params"]["lease_ns"], 5)
        self.assertEqual(len(logs[1]), 1, "the winner must not be released")
        for i in (0, 2):
            self.assertEqual(logs[i][1]["method"], "slots.release")
            self.assertEqual(logs[i][1]["params"],
                             {"reservation_id": i + 1, "fencing_token": (i + 1) * 10})

    def test_a_tie_goes_to_the_first_agent_listed(self):
        clients, _ = self.agents([(100, None), (100, None)])
        self.assertEqual(qrt_client.place_best(clients, 1000, "k").chosen, 0)

    def test_a_refusing_agent_is_skipped(self):
        clients, _ = self.agents([(100, "no_fit"), (200, None)])
        p = qrt_client.place_best(clients, 1000, "k")
        self.assertEqual(p.chosen, 1)
        err = p.errors[0]
        assert isinstance(err, RpcError)
        self.assertEqual(err.reason, "no_fit")

    def test_when_every_agent_refuses_the_first_answer_is_raised(self):
        clients, _ = self.agents([(0, "no_fit"), (0, "invalid_argument")])
        with self.assertRaises(RpcError) as cm:
            qrt_client.place_best(clients, 1000, "k")
        self.assertEqual(cm.exception.reason, "no_fit")

    def test_bad_arguments_are_refused_before_sending(self):
        with self.assertRaises(ClientError):
            qrt_client.place_best([], 1000, "k")
        clients, logs = self.agents([(100, None)])
        with self.assertRaises(ClientError):
            qrt_client.place_best(clients, 1000, "")
        with self.assertRaises(ClientError):
            qrt_client.place_best(clients, 1000, "k", colour="blue")
        # Now a real call, so the fake agent's script ends.
        self.assertEqual(qrt_client.place_best(clients, 1000, "k").chosen, 0)
        self.assertEqual(len(logs[0]), 1)


if __name__ == "__main__":
    prog = unittest.main(verbosity=2, exit=False)
    # ctest shows a skip as skipped (SKIP_RETURN_CODE 77), never as a pass.
    sys.exit(1 if not prog.result.wasSuccessful() else 77 if prog.result.skipped else 0)
