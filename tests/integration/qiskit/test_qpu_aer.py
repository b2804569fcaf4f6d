#!/usr/bin/env python3
"""qpu-aer over qrt/proto/wire.h, without qrtd: what an agent sees on the wire.

A real qpu-aer process on a UNIX socket in a temp dir; the frames are packed
by hand from wire.h's layout (qpu_aer's own codec is not used to check
itself).  HELLO first; a JOB runs on qiskit-aer and its RESULT carries the
real counts and the arrival stamp; a JOB outside its window, with a stale
calibration id, wider than the QPU, or whose program does not parse is
answered with the wire's ERROR, the last naming the line.
Environment: QPU_AER (tools/qpu-aer/qpu_aer.py).
"""

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

QPU_AER = os.environ.get("QPU_AER", "")
HDR = struct.Struct("<IHBBHHIQQqqqqqqIIq")
FIELDS = ("magic", "version", "type", "flags", "header_len", "status", "payload_len", "job_id",
          "calibration_id", "scheduled_ns", "sent_ns", "window_start_ns", "window_end_ns",
          "duration_ns", "arrival_ns", "shots", "reserved", "tolerance_ns")
HELLO, JOB, RESULT, ERROR = 1, 2, 3, 4
BELL = ('OPENQASM 3.0;\ninclude "stdgates.inc";\nbit[2] c;\nqubit[2] q;\nh q[0];\ncx q[0], q[1];\n'
        'c[0] = measure q[0];\nc[1] = measure q[1];\n')


def frame(type_, payload=b"", **kw):
    h = {f: 0 for f in FIELDS}
    h.update(magic=0x57545251, version=1, type=type_, header_len=96, payload_len=len(payload))
    h.update(kw)
    return HDR.pack(*(h[f] for f in FIELDS)) + payload


def envelope(qasm, shots=200, qubits=2):
    return json.dumps({"format": "qasm3", "shots": shots,
                       "circuits": [{"name": "c0", "qubits": qubits, "qasm": qasm}]}).encode()


class QpuAerWire(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not QPU_AER:
            raise unittest.SkipTest("QPU_AER must name tools/qpu-aer/qpu_aer.py")
        cls.dir = tempfile.mkdtemp(prefix="qrt-qpu-aer-")
        cls.path = os.path.join(cls.dir, "q.sock")
        cls.summary = os.path.join(cls.dir, "s.json")
        cls.p = subprocess.Popen([sys.executable, QPU_AER, "--listen", "unix://" + cls.path, "--qubits", "2",
                                  "--calibration-id", "5", "--seed", "3", "--summary-file", cls.summary,
                                  "--duration-s", "100"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        give_up = time.monotonic() + 60
        while not os.path.exists(cls.path) and time.monotonic() < give_up and cls.p.poll() is None:
            time.sleep(0.05)
        if not os.path.exists(cls.path):
            raise RuntimeError("qpu-aer did not listen: " + (cls.p.stderr.read().decode() if cls.p.poll() else ""))

    @classmethod
    def tearDownClass(cls):
        if cls.p.poll() is None:
            cls.p.send_signal(signal.SIGTERM)
            cls.p.wait(15)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def connect(self, hello=True):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect(self.path)
        self.addCleanup(s.close)
        if hello:
            s.sendall(frame(HELLO, b"test"))
            h, p = self.read(s)
            self.assertEqual(h["type"], HELLO)
            self.assertTrue(p.startswith(b"qpu-aer "), p)
        return s

    def read(self, s):
        buf = b""
        while len(buf) < 96:
            chunk = s.recv(96 - len(buf))
            self.assertTrue(chunk, "qpu-aer closed the connection")
            buf += chunk
        h = dict(zip(FIELDS, HDR.unpack(buf)))
        payload = b""
        while len(payload) < h["payload_len"]:
            chunk = s.recv(h["payload_len"] - len(payload))
            self.assertTrue(chunk)
            payload += chunk
        return h, payload

    def job(self, s, payload, job_id, calibration_id=5, shots=200, window_from=None, window_to=None):
        now = time.time_ns()
        s.sendall(frame(JOB, payload, job_id=job_id, calibration_id=calibration_id, scheduled_ns=now,
                        sent_ns=now, window_start_ns=now - 10**9 if window_from is None else window_from,
                        window_end_ns=now + 10**9 if window_to is None else window_to,
                        duration_ns=1000, shots=shots, tolerance_ns=10**9))
        h, p = self.read(s)
        self.assertEqual(h["job_id"], job_id)
        return h, p

    def test_a_job_runs_and_its_result_has_the_real_counts_and_the_arrival(self):
        s = self.connect()
        before = time.time_ns()
        h, p = self.job(s, envelope(BELL), 11)
        self.assertEqual(h["type"], RESULT, p)
        self.assertEqual(h["calibration_id"], 5)
        self.assertGreaterEqual(h["arrival_ns"], before)
        self.assertGreaterEqual(h["sent_ns"], h["arrival_ns"])
        body = json.loads(p)
        self.assertEqual(body["format"], "qasm3-counts")
        self.assertEqual(body["arrival_ns"], h["arrival_ns"])
        counts = body["results"][0]["counts"]
        self.assertEqual(set(counts), {"00", "11"}, counts)
        self.assertEqual(sum(counts.values()), 200)

    def test_a_register_zeroed_after_its_declaration_runs_as_mqt_writes_it(self):
        # MQT Core's OpenQASM 3 writer zeroes each bit register (`c = 0;`),
        # which the importer cannot take; Aer starts bits at 0, so it runs.
        s = self.connect()
        zeroed = BELL.replace("bit[2] c;\n", "bit[2] c;\nc = 0;\n")
        h, p = self.job(s, envelope(zeroed), 12)
        self.assertEqual(h["type"], RESULT, p)
        counts = json.loads(p)["results"][0]["counts"]
        self.assertEqual(set(counts), {"00", "11"}, counts)
        # Any other classical assignment is still refused, naming the line.
        later = BELL + "c = 1;\n"
        h, p = self.job(s, envelope(later), 13)
        self.assertNotEqual(h["type"], RESULT, p)

    def test_refusals_are_wire_errors_with_their_code_and_reason(self):
        s = self.connect()
        now = time.time_ns()
        cases = [
            (dict(payload=envelope(BELL), calibration_id=4), 4, "calibration_id 4 is not current (5)"),
            (dict(payload=envelope(BELL), window_from=now - 2 * 10**9, window_to=now - 10**9), 3, "outside window"),
            (dict(payload=envelope(BELL.replace("cx q[0], q[1];", "cx q[0] q[1];"))), 6, "line 6"),
            (dict(payload=envelope(BELL.replace("h q[0];", "hadamard q[0];"))), 6, "line 5"),
            (dict(payload=envelope(BELL.replace("qubit[2]", "qubit[3]"), qubits=3)), 6, "uses 3 qubits; this QPU has 2"),
            (dict(payload=b"{not json\n"), 6, "not a JSON envelope: line 1"),
            (dict(payload=envelope(BELL, shots=0), shots=0), 6, "shots = 0"),
        ]
        for i, (kw, code, text) in enumerate(cases):
            h, p = self.job(s, job_id=100 + i, **kw)
            self.assertEqual((h["type"], h["status"]), (ERROR, code), f"{kw}: {p}")
            self.assertIn(text, p.decode(), kw)
        # The connection still serves.
        h, _ = self.job(s, envelope(BELL), 200)
        self.assertEqual(h["type"], RESULT)

    def test_a_periodic_schedule_decides_which_calibration_id_is_current(self):
        # A second qpu-aer following qrtd's periodic schedule: 1 s cycles, the
        # first 500 ms calibration; window k + 1 from k s + 500 ms to (k + 1) s.
        path = os.path.join(self.dir, "p.sock")
        p = subprocess.Popen([sys.executable, QPU_AER, "--listen", "unix://" + path, "--qubits", "2",
                              "--period-ns", "1000000000", "--blackout-ns", "500000000", "--duration-s", "60"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: (p.send_signal(signal.SIGTERM), p.wait(15)))
        give_up = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < give_up and p.poll() is None:
            time.sleep(0.05)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect(path)
        self.addCleanup(s.close)
        s.sendall(frame(HELLO, b"test"))
        self.read(s)

        def at(offset_ns):
            """Sleep to offset_ns into the next cycle; that cycle's window id."""
            now = time.time_ns()
            k = now // 10**9 + 1
            time.sleep((k * 10**9 + offset_ns - now) / 1e9)
            return k + 1
        # Each reading counts only if it was answered within its phase (a
        # loaded host may delay it); three tries.
        for _ in range(3):
            want = at(750_000_000)
            t0 = time.time_ns()
            ok, _ = self.job(s, envelope(BELL), 1, calibration_id=want)
            stale, why = self.job(s, envelope(BELL), 2, calibration_id=want - 1)
            if time.time_ns() - t0 > 200_000_000:
                continue
            self.assertEqual(ok["type"], RESULT)
            self.assertEqual((stale["type"], stale["status"]), (ERROR, 4))
            self.assertIn(f"is not current ({want})", why.decode())
            want = at(250_000_000)   # inside the blackout before window `want`
            t0 = time.time_ns()
            blackout, why = self.job(s, envelope(BELL), 3, calibration_id=want)
            if time.time_ns() - t0 > 200_000_000:
                continue
            self.assertEqual((blackout["type"], blackout["status"]), (ERROR, 4))
            self.assertIn("inside a calibration blackout", why.decode())
            return
        self.skipTest("the host never answered within 200 ms of a phase: nothing to judge")

    def test_connections_are_capped_at_16_and_freed_when_closed(self):
        def hello_answered(s):
            try:
                s.sendall(frame(HELLO, b"test"))
                return len(s.recv(96)) > 0
            except OSError:
                return False
        socks = []
        try:
            answered = 0
            for _ in range(17):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(10)
                s.connect(self.path)
                socks.append(s)
                answered += hello_answered(s)
            self.assertLessEqual(answered, 16)
            self.assertLess(answered, 17, "the 17th connection was served")
        finally:
            for s in socks:
                s.close()
        # Closed connections give their places back.
        give_up = time.monotonic() + 10
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(self.path)
            ok = hello_answered(s)
            s.close()
            if ok or time.monotonic() > give_up:
                break
            time.sleep(0.1)
        self.assertTrue(ok, "no connection served after the others closed")

    def test_the_first_frame_must_be_hello(self):
        s = self.connect(hello=False)
        s.sendall(frame(JOB, envelope(BELL), job_id=1))
        h, p = self.read(s)
        self.assertEqual((h["type"], h["status"]), (ERROR, 1))
        self.assertIn(b"first frame must be HELLO", p)


if __name__ == "__main__":
    unittest.main(verbosity=2)
