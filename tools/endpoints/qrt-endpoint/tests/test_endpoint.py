"""The framework over real UNIX sockets: the HELLO negotiation, the pairing
of control and fire connections, ARM / ARMED, FIRE, DISARM, RESULT, the
refusals and their statuses and stages, version 1 as it was, bad frames,
timeouts, several agents, the instruments unreachable, and the garbage
collector held off while a job is armed."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent import Agent, E, LabHandler, Peer, T, frame, job_fields
from qrt_client import protocol as P

from qrt_endpoint import Endpoint, Options
from qrt_endpoint import handler as H


class EndpointCase(unittest.TestCase):
    def start(self, handler: LabHandler | None = None, **kw) -> LabHandler:
        self.dir = tempfile.mkdtemp(prefix="qrt-endpoint-test.")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.path = os.path.join(self.dir, "qpu.sock")
        self.handler = handler or LabHandler()
        opt = Options(listen=["unix://" + self.path], health_interval_s=kw.pop("health_interval_s", 0.1), **kw)
        self.ep = Endpoint(self.handler, "qpu-test", "0.1.0", opt)
        self.ep.open()
        self.ep.start()
        self.addCleanup(self.ep.close)
        return self.handler

    def agent(self, **kw) -> Agent:
        a = Agent(self.path, **kw)
        self.addCleanup(a.close)
        return a

    def peer(self) -> Peer:
        p = Peer(self.path)
        self.addCleanup(p.close)
        return p

    def expect(self, a: Agent, type_: int, job_id: int | None = None):
        h, body = a.read()
        self.assertEqual(T(h["type"]), T(type_), body)
        if job_id is not None:
            self.assertEqual(h["job_id"], job_id)
        return h, body

    def wait_for(self, cond, what: str, timeout: float = 10.0) -> None:
        give_up = time.monotonic() + timeout
        while not cond():
            self.assertLess(time.monotonic(), give_up, what)
            time.sleep(0.01)


class Negotiation(EndpointCase):
    def test_wire2_offer_gets_capabilities_and_a_session_and_the_fire_connection_pairs(self):
        self.start()
        a = self.agent()
        self.assertEqual((a.hello["version"], a.hello["header_len"]), (2, 128))
        self.assertEqual(set(a.caps), {"identity", "two_phase", "max_armed", "horizon_ns", "min_lead_ns", "start",
                                       "session"})
        self.assertEqual(a.caps["identity"], "qpu-test 0.1.0")
        self.assertTrue(a.caps["two_phase"])
        self.assertEqual(len(a.caps["session"]), 32)
        fh, fbody = a.fire_hello
        self.assertEqual((fh["version"], fh["type"]), (2, T.HELLO))
        self.assertEqual(json.loads(fbody), {"channel": "fire", "session": a.caps["session"]})
        # Each control connection gets a session of its own.
        self.assertNotEqual(self.agent().caps["session"], a.caps["session"])

    def test_no_offer_or_a_one_phase_handler_speaks_version_1(self):
        self.start()
        a = self.agent(identity="qrtd 0.1.0 qpu=0")
        self.assertEqual((a.hello["version"], a.hello["header_len"]), (1, 96))
        self.assertIsNone(a.caps)

    def test_a_fire_hello_for_an_unknown_session_is_refused_and_closed(self):
        self.start()
        p = self.peer()
        p.send(frame(2, T.HELLO, b'{"channel":"fire","session":"nope"}'))
        h, body = p.read()
        self.assertEqual((h["type"], h["status"]), (T.ERROR, E.PROTOCOL))
        self.assertIn(b"no control connection has session 'nope'", body)
        self.assertTrue(p.closed())


class TwoPhase(EndpointCase):
    def test_arm_armed_fire_result_with_the_endpoints_times(self):
        lab = self.start()
        a = self.agent()
        f = job_fields(7, ahead_ns=300_000_000)
        a.arm(f)
        h, body = self.expect(a, T.ARMED, 7)
        self.assertEqual(json.loads(body), {"stages": [{"name": "compile", "ns": 1000}, {"name": "upload", "ns": 2000},
                                                       {"name": "arm", "ns": 3000}], "program_duration_ns": 5000})
        for k in ("calibration_id", "scheduled_ns", "window_start_ns", "window_end_ns", "duration_ns", "shots",
                  "tolerance_ns"):
            self.assertEqual(h[k], f[k], k)
        self.assertGreater(h["armed_ns"], 0)
        while time.time_ns() < f["scheduled_ns"]:
            time.sleep(0.001)
        a.do_fire(f)
        h, body = self.expect(a, T.RESULT, 7)
        self.assertEqual(h["header_len"], 128)
        self.assertTrue(f["scheduled_ns"] <= h["arrival_ns"] <= h["started_ns"] <= h["ended_ns"] <= h["sent_ns"],
                        h)
        self.assertLess(h["armed_ns"], f["scheduled_ns"])
        r = json.loads(body)
        self.assertEqual(r["results"][0]["counts"], {"0": 10})
        self.assertEqual((r["endpoint"], r["started_ns"], r["status"]), ("qpu-test 0.1.0", h["started_ns"],
                                                                         {"seq0": "STOPPED"}))
        # arm on the worker; fire on the fire connection's own thread, with the gc off.
        calls = {c[0]: c for c in lab.calls if c[1] == 7}
        self.assertEqual(calls["arm"][2], "qrt-endpoint-worker")
        self.assertTrue(calls["fire"][2].startswith("qrt-endpoint-conn"), calls["fire"])
        self.assertFalse(calls["fire"][3], "the gc ran while a job was armed")
        self.wait_for(lambda: self.ep.worker.occupancy() == 0 and not self.ep.worker.gc.held, "the hold released")
        self.assertEqual(self.ep.summary()["fire_read_to_handler_ns"]["count"], 1)

    def test_refusals_carry_the_status_and_stage_of_their_reason(self):
        lab = self.start()
        a = self.agent()
        cases = [
            (H.CALIBRATION_UNKNOWN, "compile", E.CALIBRATION_UNKNOWN),
            (H.GATE_NOT_SUPPORTED, "compile", E.PROGRAM_REFUSED),
            (H.QUBIT_OUT_OF_RANGE, "compile", E.PROGRAM_REFUSED),
            (H.INSTRUCTION_MEMORY_EXCEEDED, "compile", E.MEMORY_FULL),
            (H.WAVEFORM_MEMORY_EXCEEDED, "upload", E.MEMORY_FULL),
            (H.PROGRAM_TOO_LONG, "compile", E.PROGRAM_REFUSED),
            (H.PROGRAM_INVALID, "parse", E.PROGRAM_REFUSED),
            (H.SEQUENCER_NOT_CONFIGURED, "arm", E.PROGRAM_REFUSED),
        ]
        for i, (reason, stage, status) in enumerate(cases):
            a.arm(job_fields(100 + i), f"refuse {reason} {stage}".encode())
            h, body = self.expect(a, T.ERROR, 100 + i)
            self.assertEqual((h["status"], h["stage"]), (status, P.WireStage[stage.upper()]), body)
            self.assertTrue(body.decode().startswith(f"{reason}: the test refused it"), body)
        # A stack that raises something else: an ERROR, and the endpoint goes on.
        a.arm(job_fields(200), b"raise")
        h, body = self.expect(a, T.ERROR, 200)
        self.assertEqual(h["status"], E.PROGRAM_REFUSED)
        self.assertIn(b"ZeroDivisionError: a bug in the stack", body)
        self.assertNotIn("fire", lab.names())
        a.arm(job_fields(201))
        self.expect(a, T.ARMED, 201)

    def test_beyond_the_horizon_and_a_job_id_held_twice_are_refused(self):
        self.start(LabHandler(horizon_ns=10**9))
        a = self.agent()
        a.arm(job_fields(1, ahead_ns=5 * 10**9))
        h, body = self.expect(a, T.ERROR, 1)
        self.assertEqual((h["status"], h["stage"]), (E.PROGRAM_REFUSED, P.WireStage.ARM))
        self.assertIn(b"beyond_horizon: fire_at is 5.0", body)
        a.arm(job_fields(2, ahead_ns=5 * 10**8))
        self.expect(a, T.ARMED, 2)
        a.arm(job_fields(2, ahead_ns=5 * 10**8))
        h, body = self.expect(a, T.ERROR, 2)
        self.assertIn(b"job 2 is already held", body)

    def test_disarm_then_fire_is_not_armed_and_nothing_starts(self):
        lab = self.start()
        a = self.agent()
        f = job_fields(3)
        a.arm(f)
        self.expect(a, T.ARMED, 3)
        a.control.send(frame(2, T.DISARM, job_id=3, calibration_id=1, scheduled_ns=f["scheduled_ns"]))
        self.expect(a, T.DISARMED, 3)
        a.do_fire(f)
        h, body = self.expect(a, T.ERROR, 3)
        self.assertEqual((h["status"], h["stage"]), (E.NOT_ARMED, P.WireStage.FIRE), body)
        a.control.send(frame(2, T.DISARM, job_id=3))
        h, _ = self.expect(a, T.ERROR, 3)
        self.assertEqual(h["status"], E.NOT_ARMED)
        self.assertEqual(lab.names(3), ["arm", "disarm"])

    def test_fire_against_disarm_each_job_is_started_or_disarmed_never_both(self):
        lab = self.start(LabHandler(max_armed=64))
        a = self.agent()
        fields = [job_fields(1000 + i, ahead_ns=10**8) for i in range(40)]
        for f in fields:
            a.arm(f)
        for f in fields:
            self.expect(a, T.ARMED, f["job_id"])
        for f in fields:   # both at once: the fire connection and the control connection
            a.do_fire(f)
            a.control.send(frame(2, T.DISARM, job_id=f["job_id"], calibration_id=1,
                                 scheduled_ns=f["scheduled_ns"]))
        answers: dict[int, list[int]] = {}
        while sum(len(v) for v in answers.values()) < 80:
            h, _ = a.read()
            answers.setdefault(h["job_id"], []).append(h["type"])
        for f in fields:
            got = sorted(answers[f["job_id"]])
            self.assertIn(got, ([T.RESULT, T.ERROR], [T.ERROR, T.DISARMED]), f["job_id"])
            names = lab.names(f["job_id"])
            self.assertEqual(("fire" in names) + ("disarm" in names), 1, names)

    def test_an_arm_waits_while_the_stack_is_full_and_is_refused_if_its_fire_at_comes_first(self):
        lab = self.start(LabHandler(max_armed=1))
        lab.collect_delay_s = 0.3
        a = self.agent()
        f1, f2 = job_fields(1, ahead_ns=200_000_000), job_fields(2, ahead_ns=3 * 10**9)
        a.arm(f1)
        self.expect(a, T.ARMED, 1)
        a.arm(f2)   # waits: the stack holds job 1
        f3 = job_fields(3, ahead_ns=100_000_000)
        a.arm(f3)   # waits too, and its fire_at comes while job 1 is held
        h, body = self.expect(a, T.ERROR, 3)
        self.assertEqual(h["status"], E.TOO_MANY_ARMED)
        self.assertIn(b"held job 1 (max_armed 1) until past this job's fire_at", body)
        time.sleep(max(0, f1["scheduled_ns"] - time.time_ns()) / 1e9)
        a.do_fire(f1)
        self.expect(a, T.RESULT, 1)
        self.expect(a, T.ARMED, 2)
        arm2 = next(c[4] for c in lab.calls if c[:2] == ("arm", 2))
        collected1 = next(c[4] for c in lab.calls if c[:2] == ("collect", 1))
        self.assertGreater(arm2, collected1)

    def test_a_closed_control_connection_disarms_its_jobs_and_closes_its_fire_connection(self):
        lab = self.start()
        a = self.agent()
        a.arm(job_fields(5))
        self.expect(a, T.ARMED, 5)
        a.control.close()
        self.wait_for(lambda: lab.names(5) == ["arm", "disarm"], "job 5 disarmed")
        self.assertTrue(a.fire.closed())

    def test_several_agents_each_fire_only_their_own_jobs(self):
        self.start()
        a, b = self.agent(), self.agent()
        fa = job_fields(11, ahead_ns=10**8)
        a.arm(fa)
        self.expect(a, T.ARMED, 11)
        b.do_fire(fa)
        h, _ = self.expect(b, T.ERROR, 11)
        self.assertEqual(h["status"], E.NOT_ARMED)
        a.do_fire(fa)
        self.expect(a, T.RESULT, 11)


class VersionOne(EndpointCase):
    def test_a_job_is_armed_fired_and_collected_at_once(self):
        lab = self.start()
        a = self.agent(identity="qrtd 0.1.0 qpu=0")
        f = job_fields(9, ahead_ns=0)
        a.control.send(frame(1, T.JOB, b"ok", **f))
        h, body = self.expect(a, T.RESULT, 9)
        self.assertEqual(h["header_len"], 96)
        self.assertEqual(json.loads(body)["arrival_ns"], h["arrival_ns"])
        self.assertEqual(lab.names(9), ["arm", "fire", "collect"])

    def test_refusals_use_the_statuses_version_1_had(self):
        self.start()
        a = self.agent(identity="qrtd 0.1.0 qpu=0")
        a.control.send(frame(1, T.JOB, b"refuse gate_not_supported compile", **job_fields(1, ahead_ns=0)))
        h, body = self.expect(a, T.ERROR, 1)
        self.assertEqual(h["status"], E.INTERNAL, body)
        a.control.send(frame(1, T.JOB, b"refuse calibration_mismatch compile", **job_fields(2, ahead_ns=0)))
        self.assertEqual(self.expect(a, T.ERROR, 2)[0]["status"], E.CALIBRATION)
        late = job_fields(3, ahead_ns=-5 * 10**9)
        a.control.send(frame(1, T.JOB, b"ok", **late))
        h, body = self.expect(a, T.ERROR, 3)
        self.assertEqual(h["status"], E.OUT_OF_WINDOW)
        self.assertIn(b"outside window", body)


class BadFrames(EndpointCase):
    def hello_v2(self) -> Agent:
        return self.agent()

    def test_each_bad_frame_gets_an_error_and_the_connection_dropped(self):
        self.start()
        good = frame(2, T.ARM, b"ok", **job_fields(1))
        cases = [
            (good[:0] + (0x12345678).to_bytes(4, "little") + good[4:], E.PROTOCOL, b"bad magic"),
            (good[:4] + (3).to_bytes(2, "little") + good[6:], E.VERSION, b"wire version 3"),
            (frame(1, T.ARM, b"ok"), E.VERSION, b"wire version 1 on a version-2 connection"),
            (good[:8] + (120).to_bytes(2, "little") + good[10:], E.PROTOCOL, b"header_len 120"),
            (good[:6] + bytes([42]) + good[7:], E.PROTOCOL, b"unknown frame type 42"),
            (frame(2, T.ARM, b"", payload_len=P.WIRE_MAX_PAYLOAD + 1), E.PROTOCOL, b"payload_len 1048577"),
            (frame(2, T.ARM, b"ok", reserved=1), E.PROTOCOL, b"reserved is 1"),
            (frame(2, T.ARM, b"ok", flags=0x80), E.PROTOCOL, b"unknown flags 0x80"),
            (frame(2, T.RESULT, b""), E.PROTOCOL, b"unexpected frame type RESULT"),
        ]
        for data, status, text in cases:
            a = self.agent()
            a.control.send(data)
            h, body = a.read()
            self.assertEqual((h["type"], h["status"]), (T.ERROR, status), body)
            self.assertIn(text, body)
            self.assertTrue(a.control.closed(), text)
        # v2 frames on a version-1 connection, and a first frame that is not HELLO
        p = self.peer()
        p.send(frame(1, T.JOB, b"x", **job_fields(1)))
        h, body = p.read()
        self.assertEqual((h["type"], h["status"]), (T.ERROR, E.PROTOCOL))
        self.assertIn(b"first frame must be HELLO", body)
        v1 = self.agent(identity="qrtd 0.1.0")
        v1.control.send(frame(1, T.FIRE))
        h, body = v1.read()
        self.assertIn(b"frame type FIRE is not in wire version 1", body)
        # and the endpoint still serves
        self.assertTrue(self.agent().caps["two_phase"])

    def test_a_bad_frame_on_the_fire_connection_is_reported_on_the_control_one(self):
        lab = self.start()
        a = self.agent()
        f = job_fields(4)
        a.arm(f)
        self.expect(a, T.ARMED, 4)
        a.fire.send(frame(2, T.FIRE, b"xx", job_id=4))
        h, body = self.expect(a, T.ERROR, 0)
        self.assertEqual(h["status"], E.PROTOCOL)
        self.assertIn(b"fire connection: protocol error: a FIRE has a header only", body)
        self.assertTrue(a.fire.closed())
        self.assertNotIn("fire", lab.names(4))
        a.control.send(frame(2, T.DISARM, job_id=4))   # the control connection still serves
        self.expect(a, T.DISARMED, 4)

    def test_silence_and_half_frames_are_bounded(self):
        self.start(hello_timeout_s=0.5, frame_timeout_s=0.5, send_timeout_s=0.2)
        p = self.peer()
        t0 = time.monotonic()
        self.assertTrue(p.closed(10), "a connection with no HELLO stayed open")
        self.assertLess(time.monotonic() - t0, 5)
        a = self.agent()
        a.control.send(frame(2, T.ARM, b"ok", **job_fields(1))[:50])
        self.assertTrue(a.control.closed(10), "a half frame held the connection")

    def test_connections_are_capped(self):
        self.start(max_connections=3)
        peers = [self.peer() for _ in range(4)]
        answered = 0
        for p in peers:
            try:
                p.send(frame(1, T.HELLO, b"x"))
                p.s.settimeout(2)
                answered += bool(p.s.recv(96))
            except OSError:
                pass
        self.assertEqual(answered, 3)


class Instruments(EndpointCase):
    def test_unreachable_instruments_close_the_agents_until_they_answer_again(self):
        lab = self.start()
        a = self.agent()
        lab.down = True
        h, body = self.expect(a, T.ERROR, 0)
        self.assertEqual(h["status"], E.UNREACHABLE)
        self.assertIn(b"the test switched the instruments off", body)
        self.assertTrue(a.control.closed())
        p = self.peer()
        p.send(frame(1, T.HELLO, b"qrtd wire=2"))
        h, body = p.read()
        self.assertEqual((h["type"], h["status"], h["job_id"]), (T.ERROR, E.UNREACHABLE, 0))
        lab.down = False
        self.wait_for(lambda: self.ep.down is None, "back up")
        self.assertTrue(self.agent().caps["two_phase"])

    def test_an_arm_that_finds_the_instruments_gone_is_refused_unreachable(self):
        lab = self.start(health_interval_s=3600)
        a = self.agent()
        lab.down = True
        a.arm(job_fields(1))
        h, _body = self.expect(a, T.ERROR, 1)
        self.assertEqual((h["status"], h["stage"]), (E.UNREACHABLE, P.WireStage.UPLOAD))
        h, _ = self.expect(a, T.ERROR, 0)   # then the endpoint says it is down
        self.assertEqual(h["status"], E.UNREACHABLE)


if __name__ == "__main__":
    unittest.main(verbosity=2)
