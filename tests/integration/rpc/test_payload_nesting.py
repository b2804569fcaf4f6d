#!/usr/bin/env python3
"""A job payload nested deeply is refused, naming the problem, and qrtd goes
on serving (the real daemon, its real socket).

jobs.submit reads a payload that is a JSON object (the envelope of qrtd(8),
JOB PAYLOADS).  With dispatch.max_payload_bytes at 1 MiB, one submit whose
envelope "format" was 100,000 arrays deep took qrtd down: the refusal wrote
the value into its message recursively and overflowed the event loop's
stack.  Here, with that setting:

  - a deeply nested "format", "shots", "circuits", an unknown member, and a
    JSON object without "format" are each refused with invalid_params
    (data.field "payload", data.limit the depth), the message naming the
    nesting and the limit and holding none of the payload;
  - a shallowly nested "format" is refused as the envelope error it is
    (invalid_argument, data.field "payload.format"), naming the field and
    its JSON type, never its value;
  - a payload that only looks like JSON (it begins with '{' and nests
    deeper, but does not parse) is opaque, as before, and acknowledged;
  - after every refusal qrtd still answers, on the same connection and a
    new one, and its process is alive.

The daemon runs as the invoking user (or as root with agent.user = "root"),
untuned, host untouched, with a write-only file:///dev/null endpoint.  Only
the PID this test started is signalled.  Environment: QRTD (the binary).
"""

import base64
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

QRTD = os.environ.get("QRTD", "")
DEPTH_LIMIT = 64          # engine_limits::max_depth, served by agent.hello
DEEP = 100_000            # levels (200 KB of brackets): what took the loop's stack down

CONFIG = """
[agent]
log_level = "info"
watchdog = false
user = "root"
[host]
apply_on_run = false
[dispatch]
mode = "untuned"
max_payload_bytes = 1_048_576
ring_capacity = 64
[timeline]
policy = "fifo"
default_lease_ns = 600_000_000_000
[rpc]
socket_path = "{dir}/qrtd.sock"
[roles]
reader = ["uid:{uid}"]
scheduler = ["uid:{uid}"]
calibration = []
admin = []
[probes]
enabled = false
[tenants]
max_requests_per_s = 0
[[qpu]]
name = "qpu0"
endpoint = "file:///dev/null"
calibration = "periodic"
period_ns = 1_000_000_000
blackout_ns = 100_000_000
fidelity_f0 = 0.99
"""

BELL = ('OPENQASM 3.0;\ninclude "stdgates.inc";\nbit[2] c;\nqubit[2] q;\nh q[0];\ncx q[0], q[1];\n'
        'c = measure q;\n')


def nested(depth, inner='"qasm3"'):
    """`depth` arrays around `inner`, as JSON text."""
    return "[" * depth + inner + "]" * depth


def envelope(format_='"qasm3"', shots="10", circuits=None, extra=""):
    if circuits is None:
        circuits = json.dumps([{"name": "bell", "qubits": 2, "qasm": BELL}])
    return ('{"format": ' + format_ + ', "shots": ' + shots + ', "circuits": ' + circuits + extra
            + "}").encode()


class conn:
    def __init__(self, path, timeout=30):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.f = self.s.makefile("rb")
        self.next_id = 0

    def call(self, method, params=None):
        self.next_id += 1
        req = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}}
        self.s.sendall((json.dumps(req) + "\n").encode())
        line = self.f.readline()
        if not line:
            raise EOFError("qrtd closed the connection")
        r = json.loads(line)
        assert r["id"] == self.next_id, r
        return r

    def close(self):
        self.f.close()
        self.s.close()


class PayloadNesting(unittest.TestCase):
    def setUp(self):
        if not QRTD:
            self.skipTest("QRTD must name the qrtd binary")
        self.dir = tempfile.mkdtemp(prefix="qrt-payload-nesting-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.state = os.path.join(self.dir, "state")
        os.mkdir(self.state, 0o750)
        self.sock = os.path.join(self.dir, "qrtd.sock")
        cfg = os.path.join(self.dir, "qrtd.toml")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(dir=self.dir, uid=os.getuid()))
        self.log = os.path.join(self.dir, "qrtd.log")
        with open(self.log, "w") as log:
            self.qrtd = subprocess.Popen([QRTD, "run", "-c", cfg, "--state-dir", self.state],
                                         stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(self.stop_qrtd)
        give_up = time.monotonic() + 30
        while True:
            self.assertIsNone(self.qrtd.poll(), "qrtd exited at start: " + self.log_tail())
            try:
                c = conn(self.sock, timeout=5)
                c.call("agent.hello")
                c.close()
                break
            except OSError:
                self.assertLess(time.monotonic(), give_up, "qrtd socket did not come up: " + self.log_tail())
                time.sleep(0.05)

    def stop_qrtd(self):
        if self.qrtd.poll() is None:
            self.qrtd.send_signal(signal.SIGTERM)
            try:
                self.qrtd.wait(15)
            except subprocess.TimeoutExpired:
                self.qrtd.kill()
                self.qrtd.wait()

    def log_tail(self):
        with open(self.log, errors="replace") as f:
            return "\n" + "".join(f.readlines()[-20:])

    def submit(self, c, key, payload):
        self.assertLessEqual(len(payload), 1 << 20)
        try:
            # Well ahead: a commit on a busy host never makes it late.
            return c.call("jobs.submit", {"duration_ns": 1_000_000, "idempotency_key": key,
                                          "not_before_ns": time.time_ns() + 30 * 10**9,
                                          "payload": base64.b64encode(payload).decode()})
        except (OSError, EOFError) as e:
            self.qrtd.wait(5)
            self.fail(f"submit {key}: {e}; qrtd exit status {self.qrtd.returncode}" + self.log_tail())

    def assert_serving(self, c):
        self.assertIsNone(self.qrtd.poll(), "qrtd died" + self.log_tail())
        self.assertIn("result", c.call("agent.hello"))
        fresh = conn(self.sock)
        self.assertIn("result", fresh.call("agent.hello"))
        fresh.close()

    def test_a_deeply_nested_payload_is_refused_and_qrtd_keeps_serving(self):
        hello = conn(self.sock).call("agent.hello")["result"]
        self.assertEqual(hello["limits"]["max_depth"], DEPTH_LIMIT)
        deep_array = nested(DEEP, "1")
        cases = {
            "format": envelope(format_=nested(DEEP)),
            "shots": envelope(shots=deep_array),
            "circuits": envelope(circuits=nested(DEEP, json.dumps({"name": "bell", "qubits": 2,
                                                                    "qasm": BELL}))),
            "unknown member": envelope(extra=', "note": ' + deep_array),
            "object in object": envelope(extra=', "note": ' + '{"a": ' * DEEP + "1" + "}" * DEEP),
            "no format": ('{"shots": 10, "program": ' + deep_array + "}").encode(),
            "just past the limit": envelope(format_=nested(DEPTH_LIMIT)),
        }
        c = conn(self.sock)
        for what, payload in cases.items():
            with self.subTest(what):
                r = self.submit(c, what, payload)
                self.assertIn("error", r, f"{what}: acknowledged: {r}")
                e = r["error"]
                self.assertEqual(e["data"]["reason"], "invalid_params", e)
                self.assertEqual(e["data"]["field"], "payload", e)
                self.assertEqual(e["data"]["limit"], DEPTH_LIMIT, e)
                self.assertIn(f"nests deeper than {DEPTH_LIMIT}", e["message"])
                self.assertLess(len(json.dumps(r)), 1000, "the refusal carries the payload")
                self.assert_serving(c)
        # At the limit, the envelope is read: its format is not "qasm3".
        r = self.submit(c, "at the limit", envelope(format_=nested(DEPTH_LIMIT - 1)))
        self.assertEqual(r["error"]["data"]["reason"], "invalid_argument", r)
        self.assertEqual(r["error"]["data"]["field"], "payload.format", r)
        c.close()

    def test_a_format_that_is_not_a_string_is_named_by_its_type_never_dumped(self):
        c = conn(self.sock)
        for what, value, type_name in (("array", nested(40, '"qasm3"'), "an array"),
                                       ("object", '{"qasm": {"version": 3}}', "an object"),
                                       ("integer", "3", "an integer"),
                                       ("number", "0.5", "a number"),
                                       ("null", "null", "is null"),
                                       ("string", json.dumps("qasm2-" + "x" * 5000), "is not one qrtd knows")):
            with self.subTest(what):
                r = self.submit(c, "format-" + what, envelope(format_=value))
                e = r["error"]
                self.assertEqual(e["data"]["reason"], "invalid_argument", e)
                self.assertEqual(e["data"]["field"], "payload.format", e)
                self.assertIn(type_name, e["message"])
                self.assertNotIn("[[", e["message"])
                self.assertNotIn("xxxx", e["message"])
                self.assertNotIn("version", e["message"])
        self.assert_serving(c)
        c.close()

    def test_an_opaque_payload_that_only_looks_like_deep_json_is_still_acknowledged(self):
        c = conn(self.sock)
        for what, payload in (("unclosed", b'{"a": ' + b"[" * DEEP),
                              ("garbage after", b"{" + b"[" * (DEPTH_LIMIT * 4) + b" not json")):
            with self.subTest(what):
                r = self.submit(c, "opaque-" + what, payload)
                self.assertIn("result", r, r)
        self.assert_serving(c)
        c.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
