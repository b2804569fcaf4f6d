"""Unit tests of qrtd_qiskit against a scripted agent (a thread on a
temporary AF_UNIX socket that answers qpus.list, and records every line it
is sent): what the backend decides before anything reaches qrtd, and how
qrtd's states read in Qiskit.  The backend against a real qrtd and qpu-aer
is tests/integration/qiskit/test_qiskit.py.

Run with the SDK venv's python, where qrt-client and qrtd-qiskit are
installed (ctest sdk.qiskit_backend_unit):
    build/venv/bin/python -m unittest discover -s tools/integrations/qiskit/tests -v
"""

from __future__ import annotations

import base64
import json
import os
import socket
import tempfile
import threading
import unittest
from typing import Any

import qrt_client
from qiskit import QuantumCircuit
from qiskit.providers import JobStatus
from qiskit.providers.jobstatus import JOB_FINAL_STATES
from qrt_client import protocol

from qrtd_qiskit import JOB_STATUS, QrtdBackend, QrtdError, QrtdJob, job_status

DEVICE = {"qubits": 3, "basis_gates": ["h", "cx", "x", "measure"], "max_shots": 20000}


class ScriptedAgent:
    """One connection: qpus.list answered with qpu0 and DEVICE, jobs.submit
    with a committed job, jobs.status with the states of `states` in turn
    (the last one again once they are used up); every request is kept in `received`."""

    def __init__(self, states: list[str] | None = None) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="qrt-qiskit-")
        self.path = os.path.join(self.dir.name, "qrtd.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(1)
        self.listener.settimeout(5)
        self.received: list[dict[str, Any]] = []
        self.states = list(states or [])
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _answer(self, req: dict[str, Any]) -> Any:
        m = req["method"]
        if m == "qpus.list":
            return {"qpus": [{"name": "qpu0", "endpoint_up": True, "device": DEVICE}]}
        if m == "jobs.submit":
            return {"job_id": 7, "state": "committed", "start_ns": 1, "end_ns": 5_000_001}
        if m == "jobs.status":
            state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            return {"job_id": 7, "state": state, "start_ns": 1, "end_ns": 5_000_001}
        if m == "calibration.get":
            return {"windows": []}
        raise AssertionError(f"unexpected {m}")

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn, conn.makefile("rb") as f:
            for line in f:
                req = json.loads(line)
                self.received.append(req)
                conn.sendall(json.dumps({"jsonrpc": "2.0", "id": req["id"],
                                         "result": self._answer(req)}).encode() + b"\n")

    def methods(self) -> list[str]:
        return [r["method"] for r in self.received]

    def close(self) -> None:
        self.listener.close()
        self.thread.join(5)
        self.dir.cleanup()


def bell() -> QuantumCircuit:
    qc = QuantumCircuit(2, 2, name="bell")
    qc.h(0)
    qc.cx(0, 1)
    qc.measure([0, 1], [0, 1])
    return qc


class BackendUnitTest(unittest.TestCase):
    def backend(self, states: list[str] | None = None) -> tuple[QrtdBackend, ScriptedAgent]:
        agent = ScriptedAgent(states)
        client = qrt_client.Client(agent.path, timeout=5)
        b = QrtdBackend(client=client)

        def done() -> None:
            client.close()
            agent.close()
        self.addCleanup(done)
        return b, agent

    def test_every_state_of_the_protocol_table_is_a_qiskit_status_of_the_same_finality(self):
        for s in protocol.STATES:
            self.assertIn(s.name, JOB_STATUS, f"qrtd's state {s.name!r} has no Qiskit JobStatus: map it in "
                                              "qrtd_qiskit.backend.JOB_STATUS")
            final = JOB_STATUS[s.name] in JOB_FINAL_STATES
            self.assertEqual(final, not s.active, f"{s.name} ({'active' if s.active else 'terminal'} in the "
                                                  f"table) maps to {JOB_STATUS[s.name]}")
        self.assertEqual(set(JOB_STATUS), {s.name for s in protocol.STATES},
                         "JOB_STATUS maps a state the protocol table does not have")
        self.assertEqual(job_status("completed"), JobStatus.DONE)
        with self.assertRaises(QrtdError) as cm:
            job_status("a_state_of_the_future")
        self.assertEqual(cm.exception.reason, "protocol_error")
        self.assertIn("'a_state_of_the_future'", str(cm.exception))

    def test_a_bad_option_is_refused_by_name_before_anything_reaches_qrtd(self):
        b, agent = self.backend()
        bad: list[tuple[str, Any]] = [
            ("shots", 0), ("shots", 20001), ("shots", 1.5), ("shots", "many"), ("shots", True),
            ("memory", "yes"), ("duration_ns", 2.5e6), ("not_before_ns", "soon"), ("deadline_ns", 1.0),
            ("min_fidelity", 1.5), ("min_fidelity", -0.1), ("min_fidelity", "high"),
            ("priority", "high"), ("seed_simulator", 0.5), ("reservation_id", "7"), ("fencing_token", False),
            ("colour", "red"),
        ]
        for name, value in bad:
            with self.subTest(option=name, value=value):
                with self.assertRaises(QrtdError) as cm:
                    b.run(bell(), **{name: value})
                e = cm.exception
                self.assertEqual(e.reason, "invalid_argument", e)
                self.assertEqual(e.data, {"option": name}, e)
                self.assertIn(name, e.message)
                # What a user prints: the message and the reason, unquoted.
                self.assertEqual(str(e), f"{e.message} (invalid_argument)")
                # set_options refuses it the same way, and keeps the options.
                with self.assertRaises(QrtdError) as cm:
                    b.set_options(**{name: value})
                self.assertEqual(cm.exception.data, {"option": name})
        self.assertEqual(b.options.shots, 1024)
        self.assertEqual(agent.methods(), ["qpus.list"], "a refused option reached qrtd")
        # The QPU's own bound is stated by qrtd (its [qpu.device] max_shots).
        self.assertIn("shots is >= 1 and <= 20000", str(b.options))

    def test_good_options_reach_jobs_submit_as_qrtd_spells_them(self):
        b, agent = self.backend()
        b.set_options(priority=3)
        b.set_options(priority=None)  # back to qrtd's default: unstated
        b.run(bell(), shots=500, duration_ns=2_000_000, not_before_ns=10**18, min_fidelity=0.9, priority=2)
        b.run(bell(), shots=7, min_fidelity=1)
        submits = [r["params"] for r in agent.received if r["method"] == "jobs.submit"]
        self.assertEqual(len(submits), 2)
        first, second = submits
        self.assertEqual((first["duration_ns"], first["not_before_ns"], first["min_fidelity"], first["priority"]),
                         (2_000_000, 10**18, 0.9, 2))
        self.assertEqual(json.loads(base64.b64decode(first["payload"]))["shots"], 500)
        self.assertNotIn("priority", second)
        self.assertNotIn("not_before_ns", second)
        self.assertEqual(second["min_fidelity"], 1)

    def test_the_job_waits_with_qiskits_wait_for_final_state_until_a_final_status(self):
        b, agent = self.backend(states=["committed", "dispatched", "dispatched", "completed"])
        job = b.run(bell(), shots=10)
        self.assertIsInstance(job, QrtdJob)
        seen: list[JobStatus] = []
        job.wait_for_final_state(timeout=10, callback=lambda _id, status, _job: seen.append(status))
        self.assertEqual(seen, [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.RUNNING])
        self.assertEqual(agent.methods().count("jobs.status"), 4)
        self.assertTrue(job.done())
        # A quarter of the 5 ms slot between two looks.
        self.assertEqual(job.poll_interval(), 0.00125)


if __name__ == "__main__":
    unittest.main(verbosity=2)
