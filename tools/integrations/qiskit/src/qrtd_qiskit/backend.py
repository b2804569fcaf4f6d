"""QrtdBackend (BackendV2) and QrtdJob (JobV1) over qrt_client."""

from __future__ import annotations

import base64
import copy
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import qrt_client
from qiskit import qasm3
from qiskit.circuit import Measure, QuantumCircuit
from qiskit.circuit.library import get_standard_gate_name_mapping
from qiskit.exceptions import QiskitError
from qiskit.providers import BackendV2, JobStatus, JobV1, Options
from qiskit.providers.exceptions import JobError
from qiskit.providers.jobstatus import JOB_FINAL_STATES
from qiskit.result import Result
from qiskit.result.models import ExperimentResult, ExperimentResultData
from qiskit.transpiler import InstructionProperties, Target
from qrt_client import protocol

ENVELOPE_FORMAT = protocol.ENVELOPE_FORMAT
RESULT_FORMAT = protocol.ENVELOPE_RESULT_FORMAT
MAX_CIRCUITS = protocol.ENVELOPE_MAX_CIRCUITS  # per job, as qrtd and qpu-aer take them
DEFAULT_DURATION_NS = 5_000_000
# What a QPU takes when its [qpu.device] states no max_shots (qrtd's own default).
DEFAULT_MAX_SHOTS = 100_000
MEAS_CLASSIFIED = 2  # qiskit's MeasLevel.CLASSIFIED: counts

# Every state of qrtd's protocol table (qrt_client.protocol.STATES) as
# Qiskit's job status.  tests/test_backend.py fails for a state of the table
# missing here, and for one whose finality is not the table's (an active
# state maps to a status Qiskit waits on, a terminal one to a final status).
JOB_STATUS: Mapping[str, JobStatus] = {
    "held": JobStatus.INITIALIZING,
    "committed": JobStatus.QUEUED,
    "dispatched": JobStatus.RUNNING,
    "completed": JobStatus.DONE,
    "sent": JobStatus.DONE,
    "failed": JobStatus.ERROR,
    "missed": JobStatus.ERROR,
    "expired": JobStatus.ERROR,
    "displaced": JobStatus.ERROR,
    "released": JobStatus.CANCELLED,
    "cancelled": JobStatus.CANCELLED,
}
_REASONS = frozenset(r.name for r in protocol.REASONS)


class QrtdError(QiskitError):
    """A request qrtd (or this backend, before asking it) refused.

    reason: qrtd's stable reason ("no_fit", "quota_exceeded", "invalid_argument",
    "endpoint_down", ...); data: the error's data (an option this backend
    refused: {"option": its name}); next_start_ns: for no_fit, the earliest
    start qrtd could give without the deadline (None if none)."""

    def __init__(self, reason: str, message: str, data: Any = None,
                 next_start_ns: int | None = None) -> None:
        super().__init__(f"{message} ({reason})")
        self.reason = reason
        self.message = message
        self.data = data
        self.next_start_ns = next_start_ns

    def __str__(self) -> str:
        # QiskitError prints repr(self.message): quoted, and without the reason.
        return f"{self.message} ({self.reason})"


class QrtdJobError(QrtdError, JobError):
    """A job that did not give a result: reason is the job's (e.g. "qpu_error",
    "missed", "cancelled") or the refusal of a cancel ("illegal_transition")."""


def job_status(state: str) -> JobStatus:
    """Qiskit's status of a qrtd reservation state; a state this package
    does not know (a newer qrtd) is refused, naming it, rather than guessed."""
    try:
        return JOB_STATUS[state]
    except KeyError:
        raise QrtdError("protocol_error", f"qrtd reports a job state {state!r} that this qrtd-qiskit does not "
                        f"know (it knows {', '.join(JOB_STATUS)}): upgrade qrt-client and qrtd-qiskit") from None


def _refusal(e: qrt_client.QrtError, what: str) -> QrtdError:
    data = getattr(e, "data", None)
    return QrtdError(e.reason, f"{what}: {e.message}", data)


def make_envelope(circuits: Sequence[QuantumCircuit], shots: int, memory: bool = False,
                  seed: int | None = None) -> bytes:
    """The job payload: every circuit as OpenQASM 3 and the shot count
    (qrtd(8), "Job payloads")."""
    env: dict[str, Any] = {"format": ENVELOPE_FORMAT, "shots": int(shots), "memory": bool(memory),
                           "circuits": [{"name": c.name, "qubits": max(1, c.num_qubits),
                                         "qasm": qasm3.dumps(c)} for c in circuits]}
    if seed is not None:
        env["seed"] = int(seed)
    return json.dumps(env, separators=(",", ":")).encode()


def _target_from_device(qpu: str, device: dict[str, Any]) -> Target:
    n = int(device["qubits"])
    target = Target(description=f"qrtd {qpu} ({device.get('technology') or 'unknown technology'})",
                    num_qubits=n)
    durations = device.get("gate_durations_ns") or {}
    pairs = [tuple(p) for p in device.get("coupling_map") or []]
    if not pairs:
        pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    gates = get_standard_gate_name_mapping()
    basis = device.get("basis_gates") or []
    if "measure" not in basis:
        basis = [*basis, "measure"]
    unknown = []
    for name in basis:
        gate = Measure() if name == "measure" else gates.get(name)
        if gate is None:
            unknown.append(name)
            continue
        ns = durations.get(name)
        duration = None if ns is None else ns * 1e-9
        if gate.num_qubits == 1:
            target.add_instruction(gate, {(q,): InstructionProperties(duration=duration) for q in range(n)})
        elif gate.num_qubits == 2:
            target.add_instruction(gate, {p: InstructionProperties(duration=duration) for p in pairs})
        else:
            unknown.append(name)
    if unknown:
        target.description += "; basis gates Qiskit does not know: " + ", ".join(unknown)
    return target


# The options whose default is None: None given for one means "not
# stated" (qrtd's default), and is taken as it is.
_UNSTATED = frozenset({"not_before_ns", "deadline_ns", "min_fidelity", "priority", "seed_simulator",
                       "reservation_id", "fencing_token", "block_id"})
# Counts and nanoseconds.  Qiskit's validators take a bool for an int, and
# any number within the range of shots: refused here.
_INTEGRAL = frozenset({"shots", "duration_ns", "not_before_ns", "deadline_ns", "priority", "seed_simulator",
                       "reservation_id", "fencing_token", "block_id", "meas_level"})


class QrtdBackend(BackendV2):
    """One QPU that qrtd serves.

    qpu: its name (default: $QRT_QPUS' first, else qrtd's only QPU).
    socket: qrtd's socket (default $QRT_SOCKET, else /run/qrtd/qrtd.sock), or
    tcp://HOST:PORT for qrtd's network listener on another node (MUNGE-
    authenticated, as a Slurm step on a compute node has QRT_SOCKET).
    munge_socket: tcp:// only, munged's socket here (default
    $QRT_MUNGE_SOCKET, else libmunge's).
    client: an open qrt_client.Client to use instead.

    Options of run() (also set with set_options): shots, memory,
    duration_ns (the slot booked), not_before_ns, deadline_ns (absolute,
    CLOCK_REALTIME ns), min_fidelity, priority, seed_simulator (carried to
    an executing endpoint), reservation_id and fencing_token (submit into a
    held reservation; default $QRT_RESERVATION_ID / $QRT_FENCING_TOKEN, as a
    Slurm step has them), block_id (inside that calibration block: the
    calibration service's own experiments, qrtd(8) CALIBRATION BLOCKS),
    meas_level (2 only: counts, as qiskit-experiments passes it).  Each is checked by Qiskit's option validators
    (shots within the QPU's max_shots, min_fidelity within [0, 1], the
    others' types; print(backend.options) lists them) before anything
    reaches qrtd: an unknown or refused option raises QrtdError
    "invalid_argument" naming it (data {"option": name}); qrtd checks the
    rest (its ranges, quotas and the tenant's priority ceiling)."""

    def __init__(self, qpu: str | None = None, socket: str | None = None,
                 client: qrt_client.Client | None = None, timeout: float = 10.0,
                 munge_socket: str | None = None) -> None:
        path = socket or os.environ.get("QRT_SOCKET") or qrt_client.DEFAULT_SOCKET
        try:
            self._client = client or qrt_client.Client(path, timeout=timeout, munge_socket=munge_socket)
        except qrt_client.QrtError as e:
            raise _refusal(e, "connect") from None
        self._lock = threading.Lock()
        qpus = self._call("qpus.list", {})["qpus"]
        names = [q["name"] for q in qpus]
        if qpu is None:
            env = [q for q in os.environ.get("QRT_QPUS", "").split(",") if q]
            qpu = env[0] if env else (names[0] if len(names) == 1 else None)
            if qpu is None:
                raise QrtdError("invalid_argument", f"qrtd serves {len(names)} QPUs ({', '.join(names)}): "
                                                    "name one with QrtdBackend(qpu=...)")
        if qpu not in names:
            raise QrtdError("unknown_qpu", f"qrtd serves no QPU {qpu!r} (it has: {', '.join(names)})")
        self.qpu = qpu
        self.qpu_info = next(q for q in qpus if q["name"] == qpu)
        device = self.qpu_info.get("device")
        if not isinstance(device, dict):
            raise QrtdError("invalid_argument", f"qrtd states no device facts for {qpu}: add a [qpu.device] "
                                                "sub-table (qubits, basis_gates, ...) to its [[qpu]] in "
                                                "qrtd.toml; see qrtd.toml(5)")
        self.device = device
        super().__init__(name=f"qrtd-{qpu}", description=f"QPU {qpu} through qrtd",
                         backend_version="0.1.0")
        self._target = _target_from_device(qpu, device)
        # The one bound this backend knows of its QPU; qrtd checks the same.
        self.options.set_validator("shots", (1, int(device.get("max_shots", DEFAULT_MAX_SHOTS))))

    # ------------------------------------------------------------ plumbing

    def _call(self, method: str, params: dict[str, Any]) -> Any:
        with self._lock:
            return self._client.call(method, params)

    def close(self) -> None:
        with self._lock:
            self._client.close()

    # --------------------------------------------------------- BackendV2

    @property
    def target(self) -> Target:
        return self._target

    @property
    def max_circuits(self) -> int:
        return MAX_CIRCUITS

    @classmethod
    def _default_options(cls) -> Options:
        opts = Options(shots=1024, memory=False, duration_ns=DEFAULT_DURATION_NS, not_before_ns=None,
                       deadline_ns=None, min_fidelity=None, priority=None, seed_simulator=None,
                       reservation_id=None, fencing_token=None, block_id=None,
                       meas_level=MEAS_CLASSIFIED)
        opts.set_validator("shots", (1, DEFAULT_MAX_SHOTS))
        opts.set_validator("memory", bool)
        opts.set_validator("duration_ns", int)
        opts.set_validator("not_before_ns", int)
        opts.set_validator("deadline_ns", int)
        opts.set_validator("min_fidelity", (0.0, 1.0))
        opts.set_validator("priority", int)
        opts.set_validator("seed_simulator", int)
        opts.set_validator("reservation_id", int)
        opts.set_validator("fencing_token", int)
        opts.set_validator("block_id", int)
        opts.set_validator("meas_level", int)
        return opts

    def _with_options(self, given: Mapping[str, Any], what: str) -> Options:
        """The backend's options updated with given, each through Qiskit's
        validators (Options.update_options); an unknown name, or a value a
        validator refuses, raises QrtdError naming the option."""
        opts = copy.copy(self.options)
        for name, value in given.items():
            if name not in opts:
                raise QrtdError("invalid_argument", f"{what}: unknown option {name!r} (known: "
                                                    f"{', '.join(sorted(opts))})", {"option": name})
            try:
                if value is None and name in _UNSTATED:
                    setattr(opts, name, None)  # Options' attributes are set without a validator
                    continue
                if name in _INTEGRAL and (isinstance(value, bool) or not isinstance(value, int)):
                    raise TypeError(f"must be an integer, not {type(value).__name__}")
                opts.update_options(**{name: value})
            except (ValueError, TypeError) as e:
                raise QrtdError("invalid_argument", f"{what}: option {name} = {value!r} is refused: {e}",
                                {"option": name}) from None
        return opts

    def set_options(self, **fields: Any) -> None:
        """Set options for later runs, checked as run() checks them."""
        self._options = self._with_options(fields, "set_options")

    def run(self, run_input: QuantumCircuit | list[QuantumCircuit], **options: Any) -> QrtdJob:
        circuits = [run_input] if isinstance(run_input, QuantumCircuit) else list(run_input)
        opt = self._with_options(options, "run")
        shots = int(opt.shots)
        if int(opt.meas_level) != MEAS_CLASSIFIED:
            raise QrtdError("invalid_argument", f"run: meas_level = {opt.meas_level!r}: qrtd's endpoints answer "
                                                f"counts only (meas_level {MEAS_CLASSIFIED})", {"option": "meas_level"})
        # Refused here, before qrtd is asked: what the target cannot take.
        if not circuits or len(circuits) > MAX_CIRCUITS:
            raise QrtdError("invalid_argument", f"run: give 1..{MAX_CIRCUITS} circuits, got {len(circuits)}")
        for c in circuits:
            if not isinstance(c, QuantumCircuit):
                raise QrtdError("invalid_argument", f"run: {type(c).__name__} is not a QuantumCircuit")
            if c.num_qubits > self.target.num_qubits:
                raise QrtdError("invalid_argument", f"run: circuit {c.name!r} needs {c.num_qubits} qubits; "
                                                    f"{self.qpu} has {self.target.num_qubits}")
            if c.num_clbits == 0:
                raise QrtdError("invalid_argument", f"run: circuit {c.name!r} measures nothing")
        try:
            payload = make_envelope(circuits, shots, bool(opt.memory), opt.seed_simulator)
        except Exception as e:  # noqa: BLE001 -- qasm3.dumps refuses what OpenQASM 3 cannot say, in its own errors
            raise QrtdError("invalid_argument", f"run: cannot write the circuits as OpenQASM 3: {e}") from None
        rid = opt.reservation_id or os.environ.get("QRT_RESERVATION_ID")
        params: dict[str, Any]
        if rid:
            token = opt.fencing_token or os.environ.get("QRT_FENCING_TOKEN")
            if token is None:
                raise QrtdError("invalid_argument", "run: a reservation_id (QRT_RESERVATION_ID) needs its "
                                                    "fencing_token (QRT_FENCING_TOKEN)")
            params = {"reservation_id": int(rid), "fencing_token": int(token)}
        else:
            params = {"duration_ns": opt.duration_ns, "qpus": [self.qpu],
                      "idempotency_key": "qiskit-" + uuid.uuid4().hex}
            for k in ("not_before_ns", "deadline_ns", "priority", "min_fidelity", "block_id"):
                if opt[k] is not None:
                    params[k] = opt[k]
        params["payload"] = base64.b64encode(payload).decode("ascii")
        try:
            ack = self._submit(params)
        except qrt_client.RpcError as e:
            err = _refusal(e, "jobs.submit")
            if e.reason == "no_fit" and not rid:
                err.next_start_ns = self._next_start(params)
                if err.next_start_ns is not None:
                    err.message += f"; the next possible start is {err.next_start_ns}"
                    err.args = (f"{err.message} (no_fit)",)
            raise err from None
        except qrt_client.QrtError as e:
            raise _refusal(e, "jobs.submit") from None
        return QrtdJob(self, ack, circuits, shots)

    def _submit(self, params: dict[str, Any]) -> dict[str, Any]:
        """jobs.submit, tried again (at most 3 times in all, same idempotency
        key) when qrtd answers "unavailable": it kept nothing (e.g. the job
        became durable too late for its start) and says to retry."""
        for attempt in range(3):
            try:
                ack: dict[str, Any] = self._call("jobs.submit", params)
                return ack
            except qrt_client.RpcError as e:
                if e.reason != "unavailable" or attempt == 2:
                    raise
                time.sleep(0.005 * (attempt + 1))
        raise AssertionError("unreachable")

    def _next_start(self, params: dict[str, Any]) -> int | None:
        q: dict[str, Any] = {k: params[k] for k in ("duration_ns", "qpus", "not_before_ns", "priority",
                                                    "min_fidelity") if k in params}
        try:
            r = self._call("slots.query", q)
        except qrt_client.QrtError:
            return None
        if r.get("candidates"):
            return int(r["candidates"][0]["start_ns"])
        nw = r.get("next_window")
        return int(nw["valid_from_ns"]) if isinstance(nw, dict) and "valid_from_ns" in nw else None

    def window_of(self, start_ns: int) -> dict[str, Any] | None:
        """The calibration window holding start_ns (calibration.get), or None."""
        try:
            ws = self._call("calibration.get", {"qpu": self.qpu, "until_ns": int(start_ns) + 1})["windows"]
        except qrt_client.QrtError:
            return None
        return next((w for w in ws if w["valid_from_ns"] <= start_ns < w["valid_until_ns"]), None)


class QrtdJob(JobV1):
    """One qrtd job: its job_id() is qrtd's job id.

    status() is its qrtd state as Qiskit's JobStatus (JOB_STATUS);
    result(timeout) waits with JobV1.wait_for_final_state from the slot's
    start, polling jobs.status every quarter of the slot's length (1 ms to
    50 ms)."""

    def __init__(self, backend: QrtdBackend, ack: dict[str, Any], circuits: list[QuantumCircuit],
                 shots: int) -> None:
        super().__init__(backend, str(ack["job_id"]))
        self._b = backend
        self.qrtd_job_id = int(ack["job_id"])
        self.ack = ack
        self._circuits = circuits
        self._shots = shots
        self._last: dict[str, Any] = ack
        self._result: Result | None = None
        self.window = backend.window_of(int(ack["start_ns"]))

    def submit(self) -> None:
        raise JobError("a QrtdJob is submitted by QrtdBackend.run")

    def qrtd_status(self) -> dict[str, Any]:
        try:
            self._last = self._b._call("jobs.status", {"job_id": self.qrtd_job_id})
        except qrt_client.QrtError as e:
            raise _refusal(e, "jobs.status") from None
        return self._last

    def status(self) -> JobStatus:
        return job_status(self.qrtd_status()["state"])

    def cancel(self) -> bool:
        """Cancel before the job's start.  Raises QrtdJobError (reason
        "illegal_transition") when it is too late: the job was handed to the
        QPU or is over."""
        try:
            self._last = self._b._call("jobs.cancel", {"job_id": self.qrtd_job_id})
        except qrt_client.RpcError as e:
            raise QrtdJobError(e.reason, f"jobs.cancel {self.qrtd_job_id}: too late: {e.message}"
                               if e.reason == "illegal_transition" else f"jobs.cancel: {e.message}",
                               e.data) from None
        except qrt_client.QrtError as e:
            raise QrtdJobError(e.reason, f"jobs.cancel: {e.message}") from None
        return bool(self._last.get("state") == "cancelled")

    def poll_interval(self) -> float:
        """Seconds between two jobs.status of wait_for_final_state: a quarter
        of the slot's length, within [1 ms, 50 ms]."""
        duration = int(self.ack.get("end_ns", 0)) - int(self.ack.get("start_ns", 0))
        return min(max(duration / 4e9, 0.001), 0.05)

    def wait_for_final_state(self, timeout: float | None = None, wait: float | None = None,
                             callback: Callable[..., Any] | None = None) -> None:
        """JobV1's, from the slot's start (a job's state changes before it
        only by a cancel or a displacement), polling every poll_interval()
        unless wait says otherwise.  timeout: seconds from now."""
        give_up = None if timeout is None else time.monotonic() + timeout
        until_start = (int(self.ack["start_ns"]) - time.time_ns()) / 1e9
        if until_start > 0 and self.status() not in JOB_FINAL_STATES:
            time.sleep(until_start if give_up is None else min(until_start, max(give_up - time.monotonic(), 0)))
        left = None if give_up is None else max(give_up - time.monotonic(), 0.0)
        super().wait_for_final_state(timeout=left, wait=self.poll_interval() if wait is None else wait,
                                     callback=callback)

    def result(self, timeout: float | None = None) -> Result:
        """The job's Result, once it completed.  timeout: seconds from now
        (None: until the slot's end plus 30 s); JobTimeoutError past it.
        Raises QrtdJobError with the job's reason when it ended otherwise."""
        if self._result is not None:
            return self._result
        if timeout is None:
            timeout = max(0.0, (int(self.ack.get("end_ns") or 0) - time.time_ns()) / 1e9) + 30.0
        self.wait_for_final_state(timeout=timeout)
        st = self._last
        if st["state"] != "completed":
            raise self._ended_otherwise(st)
        try:
            r = self._b._call("jobs.result", {"job_id": self.qrtd_job_id})
        except qrt_client.QrtError as e:
            raise QrtdJobError(e.reason, f"jobs.result: {e.message}") from None
        raw = base64.b64decode(r.get("result", ""))
        try:
            body = json.loads(raw)
            if body.get("format") != RESULT_FORMAT or len(body["results"]) != len(self._circuits):
                raise ValueError("not one qasm3-counts result per circuit")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise QrtdJobError("protocol_error", f"qrtd job {self.qrtd_job_id}: the endpoint's result is not "
                                                 f"{RESULT_FORMAT} ({e}): {raw[:120]!r}") from None
        start = int(st["start_ns"])
        sent = int(st.get("sent_ns") or 0)
        arrival = int(body.get("arrival_ns") or 0)
        meta = {"qrtd_job_id": self.qrtd_job_id, "qpu": st["qpu"], "calibration_id": st["calibration_id"],
                "window": self.window, "start_ns": start, "end_ns": st["end_ns"], "sent_ns": sent,
                "arrival_ns": arrival, "dispatch_lateness_ns": sent - start if sent else None,
                "arrival_lateness_ns": arrival - start if arrival else None,
                "endpoint": body.get("endpoint"), "endpoint_calibration_id": body.get("calibration_id")}
        exps = []
        for c, res in zip(self._circuits, body["results"]):
            counts = {hex(int(k.replace(" ", ""), 2)): int(v) for k, v in res["counts"].items()}
            data: dict[str, Any] = {"counts": counts}
            if "memory" in res:
                data["memory"] = [hex(int(m.replace(" ", ""), 2)) for m in res["memory"]]
            header = {"name": c.name, "memory_slots": c.num_clbits,
                      "creg_sizes": [[r.name, r.size] for r in c.cregs],
                      "metadata": c.metadata}
            exps.append(ExperimentResult(shots=int(res.get("shots", self._shots)), success=True,
                                         data=ExperimentResultData(**data), header=header, status="done"))
        self._result = Result(backend_name=self._b.name, backend_version=self._b.backend_version,
                              job_id=self.job_id(), success=True, results=exps, status="done",
                              metadata=meta)
        return self._result

    def _ended_otherwise(self, st: dict[str, Any]) -> QrtdJobError:
        """The error of a job that ended without a result: a failed job's
        reason is the reason qrtd's text leads with ("qpu_error: ..."), one
        of the protocol table's; any other end is its state ("cancelled",
        "missed", ...)."""
        state = st["state"]
        detail = st.get("reason") or ""
        word, sep, rest = detail.partition(": ")
        reason = word if state == "failed" and sep and word in _REASONS else state
        if word == state and sep:
            detail = rest
        return QrtdJobError(reason, f"qrtd job {self.qrtd_job_id} ended {state}"
                            + (f": {detail}" if detail else ""), st)

