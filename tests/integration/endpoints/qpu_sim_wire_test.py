"""qpu-sim speaks the wire as the Python endpoint framework does: version 2
when the agent offers it (ARM prepared for its configured cost and answered
ARMED with that cost by stage, FIRE starting an armed job, DISARM, the
refusals), version 1 when asked or when not offered.  Driven by the
framework's test agent (qrt_endpoint.testing: frames packed with the
table's own layouts, not qrtd's C++ codec), so the two implementations of
the endpoint side are held to one reading of the table.

    QPU_SIM=build/tools/endpoints/qpu-sim/qpu-sim python3 -m unittest qpu_sim_wire_test
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import unittest

from qrt_client import protocol as P
from qrt_endpoint.testing import Agent, E, Peer, T, frame, job_fields

QPU_SIM = os.environ.get("QPU_SIM", "")
STAGE = {s.name.lower(): int(s) for s in P.WireStage}


class QpuSim:
    def __init__(self, *args: str) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="qpu-sim-wire-")
        self.path = os.path.join(self.dir.name, "q.sock")
        self.summary = os.path.join(self.dir.name, "summary.json")
        self.proc = subprocess.Popen([QPU_SIM, "--listen", "unix://" + self.path, "--summary-file", self.summary,
                                      *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while not os.path.exists(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"qpu-sim did not listen: {self.proc.stderr.read().decode() if self.proc.stderr else ''}")
            time.sleep(0.01)

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)
        with open(self.summary) as f:
            s = json.load(f)
        self.dir.cleanup()
        return s

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.dir.cleanup()


@unittest.skipUnless(QPU_SIM, "set QPU_SIM to the qpu-sim binary")
class QpuSimWire(unittest.TestCase):
    def sim(self, *args: str) -> QpuSim:
        s = QpuSim(*args)
        self.addCleanup(s.kill)
        return s

    def test_version_2_is_negotiated_and_states_the_prepare_cost(self) -> None:
        sim = self.sim("--prepare-ms", "200", "--prepare-ns-per-byte", "15.2587890625", "--max-armed", "3",
                       "--horizon-ms", "5000")
        a = Agent(sim.path)
        self.assertEqual(a.hello["version"], 2)
        assert a.caps is not None
        self.assertIs(a.caps["two_phase"], True)
        self.assertEqual(a.caps["max_armed"], 3)
        self.assertEqual(a.caps["horizon_ns"], 5 * 10**9)
        # 200 ms, and 1 ms for each 64 KiB of the wire's largest payload (1 MiB).
        self.assertEqual(a.caps["min_lead_ns"], 216 * 10**6)
        self.assertEqual(a.caps["start"], "on_fire")
        self.assertTrue(a.caps["identity"].startswith("qpu-sim "))
        for k in a.caps:
            self.assertIn(k, P.CAPABILITIES)
        assert a.fire is not None
        self.assertEqual(a.fire_hello[0]["version"], 2)
        self.assertEqual(json.loads(a.fire_hello[1])["session"], a.caps["session"])
        a.close()

    def test_arm_is_prepared_for_its_cost_then_fire_starts_it_on_time(self) -> None:
        sim = self.sim("--prepare-ms", "200", "--prepare-ns-per-byte", "15.2587890625")
        a = Agent(sim.path)
        f = job_fields(11, ahead_ns=2 * 10**9)
        program = b"x" * (256 * 1024)  # 4 ms of upload
        sent = time.time_ns()
        a.arm(f, program)
        h, body = a.read()
        self.assertEqual(h["type"], T.ARMED, body)
        self.assertEqual(h["job_id"], 11)
        cost = json.loads(body)
        stages = {s["name"]: s["ns"] for s in cost["stages"]}
        self.assertEqual(sum(stages.values()), 204 * 10**6)
        self.assertGreater(stages["upload"], 4 * 10**6)
        self.assertGreaterEqual(h["armed_ns"] - sent, 204 * 10**6)
        while time.time_ns() < f["scheduled_ns"]:
            time.sleep(0.001)
        a.do_fire(f)
        r, data = a.read()
        self.assertEqual(r["type"], T.RESULT, data)
        self.assertEqual(r["armed_ns"], h["armed_ns"])
        self.assertGreaterEqual(r["started_ns"], r["arrival_ns"])
        self.assertEqual(r["ended_ns"] - r["started_ns"], f["duration_ns"])
        self.assertTrue(data.strip())
        a.close()
        s = sim.stop()
        v2 = s["two_phase"]
        self.assertEqual((v2["arms"], v2["armed"], v2["fires"], v2["fired_unarmed"], v2["results"]), (1, 1, 1, 0, 1))
        # Started at FIRE's arrival, not after an upload: well under the prepare cost.
        self.assertLess(s["start_lateness_ns"]["max"], 100 * 10**6)

    def test_fire_before_armed_is_not_armed_and_never_starts(self) -> None:
        sim = self.sim("--prepare-ms", "500")
        a = Agent(sim.path)
        f = job_fields(12, ahead_ns=0)
        a.arm(f)
        a.do_fire(f)
        h, why = a.read()
        self.assertEqual((h["type"], h["status"], h["stage"]), (T.ERROR, E.NOT_ARMED, STAGE["fire"]), why)
        self.assertIn(b"prepare has not ended", why)
        g = job_fields(13, ahead_ns=0)
        a.do_fire(g)
        h, why = a.read()
        self.assertEqual((h["job_id"], h["status"]), (13, E.NOT_ARMED), why)
        a.close()
        v2 = sim.stop()["two_phase"]
        self.assertEqual((v2["fired_unarmed"], v2["results"], v2["armed"]), (2, 0, 0))

    def test_disarm_drops_an_armed_job_and_a_later_fire_is_refused(self) -> None:
        sim = self.sim("--prepare-ms", "1")
        a = Agent(sim.path)
        f = job_fields(21)
        a.arm(f)
        self.assertEqual(a.read()[0]["type"], T.ARMED)
        a.control.send(frame(2, T.DISARM, job_id=21, calibration_id=f["calibration_id"],
                             scheduled_ns=f["scheduled_ns"]))
        h, _ = a.read()
        self.assertEqual((h["type"], h["job_id"]), (T.DISARMED, 21))
        a.control.send(frame(2, T.DISARM, job_id=21))
        h, _ = a.read()
        self.assertEqual((h["type"], h["status"]), (T.ERROR, E.NOT_ARMED))
        a.do_fire(f)
        self.assertEqual(a.read()[0]["status"], E.NOT_ARMED)
        a.close()
        v2 = sim.stop()["two_phase"]
        self.assertEqual((v2["disarmed"], v2["disarm_unknown"], v2["results"]), (1, 1, 0))

    def test_refusals_name_the_stage_and_the_reason(self) -> None:
        sim = self.sim("--prepare-ms", "1", "--max-armed", "1", "--refuse-marker", "cz_bad", "--calibration-id", "1",
                       "--horizon-ms", "10000")
        a = Agent(sim.path)
        a.arm(job_fields(31), b"OPENQASM 3;\ncz_bad q[0], q[1];\n")
        h, why = a.read()
        self.assertEqual((h["status"], h["stage"]), (E.PROGRAM_REFUSED, STAGE["parse"]), why)
        self.assertIn(b"line 2", why)
        a.arm(job_fields(32, cal=7))
        h, why = a.read()
        self.assertEqual((h["status"], h["stage"]), (E.CALIBRATION_UNKNOWN, STAGE["compile"]), why)
        a.arm(job_fields(33, ahead_ns=20 * 10**9))
        h, why = a.read()
        self.assertEqual((h["status"], h["stage"]), (E.PROGRAM_REFUSED, STAGE["arm"]), why)
        self.assertIn(b"horizon", why)
        a.arm(job_fields(34))
        self.assertEqual(a.read()[0]["type"], T.ARMED)
        a.arm(job_fields(35))
        h, why = a.read()
        self.assertEqual((h["status"], h["stage"]), (E.TOO_MANY_ARMED, STAGE["arm"]), why)
        a.close()

    def test_a_dropped_control_connection_takes_its_armed_jobs(self) -> None:
        sim = self.sim("--prepare-ms", "1")
        a = Agent(sim.path)
        for i in range(5):
            a.arm(job_fields(40 + i))
        for _ in range(5):
            self.assertEqual(a.read()[0]["type"], T.ARMED)
        a.close()
        b = Agent(sim.path)
        f = job_fields(40, ahead_ns=0)
        b.do_fire(f)
        self.assertEqual(b.read()[0]["status"], E.NOT_ARMED)
        b.close()
        v2 = sim.stop()["two_phase"]
        self.assertEqual((v2["dropped_armed"], v2["results"]), (5, 0))

    def test_version_1_when_asked_or_not_offered_and_the_upload_then_falls_inside_the_slot(self) -> None:
        for args, identity in ((("--wire", "1"), "qrtd 0.2.0 qpu=0 wire=2"), ((), "qrtd 0.1.0 qpu=0")):
            sim = self.sim("--prepare-ms", "50", *args)
            p = Peer(sim.path)
            p.send(frame(1, T.HELLO, identity.encode()))
            h, body = p.read()
            self.assertEqual(h["version"], 1)
            self.assertTrue(body.startswith(b"qpu-sim "))
            f = job_fields(50, ahead_ns=0)
            p.send(frame(1, T.JOB, b"program", **f))
            r, _ = p.read()
            self.assertEqual((r["version"], r["type"], r["job_id"]), (1, T.RESULT, 50))
            p.send(frame(2, T.ARM, b"x", **job_fields(51)))
            r, _ = p.read()
            self.assertEqual((r["type"], r["status"]), (T.ERROR, E.VERSION))
            p.close()
            s = sim.stop()
            self.assertEqual(s["wire"], int(args[1]) if args else 2)
            self.assertEqual(s["control_connections"], 0)
            # One phase: the program is prepared when it arrives, at T.
            self.assertGreaterEqual(s["start_lateness_ns"]["min"], 49 * 10**6)


if __name__ == "__main__":
    unittest.main()
