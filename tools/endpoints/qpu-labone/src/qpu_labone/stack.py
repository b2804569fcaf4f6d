"""The Zurich Instruments control stack through LabOne Q: ARM transpiles
the OpenQASM 3 circuits with LabOne Q's importer against the calibration
set's QPU, compiles, and submits the experiment to the controller, which
uploads the sequencer programs and waveforms and arms the instruments; the
controller then waits, before the start trigger (the PQSC's execution
enable), for FIRE.  RESULT thresholds the integrated readouts.

LabOne Q's public API runs upload, arm and start in one call
(Session.run).  The split is made at the one place between arming and
the start trigger: the controller's step that emits the start trigger
and waits for the end (Controller._wait_execution_to_stop, laboneq
26.7.0, pinned) is wrapped on this session's controller so that it first
waits for FIRE; the submission of the step's result collection, whose
deadline counts from it, is held to FIRE too.  One job is armed at a
time (max_armed 1).

Input is qrtd's OpenQASM 3 envelope, or a precompiled program
("laboneq-compiled": a CompiledExperiment in LabOne Q's serialization,
checked against the job's calibration id and, when it names one, the
set's digest), whose acquisitions come back raw.

health() checks the session (and `probe`, when given); after a failure,
with a `reconnect` (a function returning a connected Session), the next
health() connects anew.  `observe`, when given, is called with each ARM's
request and the CompiledExperiment about to be uploaded (the emulator's
journal, lab.Lab).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import openqasm3
from openqasm3 import ast
from qrt_client import protocol as P
from qrt_endpoint import envelope
from qrt_endpoint.handler import (
    CALIBRATION_MISMATCH,
    GATE_NOT_SUPPORTED,
    INSTRUCTION_MEMORY_EXCEEDED,
    INSTRUMENT_UNREACHABLE,
    PROGRAM_INVALID,
    PROGRAM_REJECTED,
    PROGRAM_TOO_LONG,
    QUBIT_OUT_OF_RANGE,
    STAGE_ARM,
    STAGE_COMPILE,
    STAGE_PARSE,
    STAGE_UPLOAD,
    TOO_MANY_ARMED,
    WAVEFORM_MEMORY_EXCEEDED,
    Armed,
    ArmRefused,
    ArmRequest,
    InstrumentUnreachable,
    Result,
    UnknownJob,
)

from .calibration import CalibrationSet, CalibrationStore

DEFAULT_HORIZON_NS = 60_000_000_000
DEFAULT_MIN_LEAD_NS = 500_000_000
ARM_TIMEOUT_S = 30.0
COLLECT_TIMEOUT_S = 30.0
NATIVE_FORMAT = "laboneq-compiled"
RAW_FORMAT = "laboneq-raw"


@dataclass
class _Job:
    job_id: int
    cal: CalibrationSet
    names: list[str]                          # none for a precompiled program (raw acquisitions)
    registers: list[list[tuple[str, int]]]
    measured: list[dict[str, int]]            # per circuit: handle -> device qubit
    shots: int
    duration_ns: int
    submission: Any = None
    armed: threading.Event = field(default_factory=threading.Event)
    fired: asyncio.Future[None] | None = None
    result_context: Any = None
    uploaded_pc: int = 0
    armed_pc: int = 0
    armed_ns: int = 0
    started_ns: int = 0
    ended_ns: int = 0


def _count_key(registers: list[tuple[str, int]], bits: list[int]) -> str:
    out, base = [], 0
    for _, n in registers:
        out.append("".join(str(bits[base + i]) for i in reversed(range(n))))
        base += n
    return " ".join(reversed(out))


class LabOneStack:
    """The handler (handler.Handler) for one LabOne Q QPU.  `session` is a
    connected laboneq Session on the lab's DeviceSetup
    (connect(do_emulation=True) for the emulator)."""

    def __init__(self, session: Any, calibrations: CalibrationStore, *,
                 horizon_ns: int = DEFAULT_HORIZON_NS, min_lead_ns: int = DEFAULT_MIN_LEAD_NS,
                 reconnect: Callable[[], Any] | None = None, probe: Callable[[], None] | None = None,
                 observe: Callable[[ArmRequest, Any], None] | None = None) -> None:
        self.calibrations = calibrations
        self.observe = observe
        self.horizon_ns = horizon_ns
        self.min_lead_ns = min_lead_ns
        self.reconnect = reconnect
        self.probe = probe
        self._armed: dict[int, _Job] = {}
        self._fired: dict[int, _Job] = {}
        self._current: _Job | None = None
        self._broken = ""
        self._attach(session)

    def _attach(self, session: Any) -> None:
        self.session = session
        controller = session._assert_connected()
        self._controller = controller
        self._loop: asyncio.AbstractEventLoop = controller._event_loop._loop
        prepare = controller._prepare_nt_step
        start_and_wait = controller._wait_execution_to_stop
        collector = controller._result_collector
        collect = collector.submit

        async def prepared(*a: Any, **kw: Any) -> Any:
            r = await prepare(*a, **kw)
            if self._current is not None:
                self._current.uploaded_pc = time.perf_counter_ns()
            return r

        async def deferred(context: Any) -> Any:
            # The result collection's deadline counts from its submission
            # (the execution's time and 2 s): it is submitted at FIRE, not
            # when the instruments are armed, or a job held armed longer
            # would lose its results.  A FIRE that came first (right after
            # ARMED, as a version-1 JOB does it) finds no context to
            # submit: it is submitted here, at once.  Both run on the
            # controller's event loop, so one of them does it.
            job = self._current
            if job is None or (job.fired is not None and job.fired.done()):
                return await collect(context)
            job.result_context = context
            return None

        async def gated(*a: Any, **kw: Any) -> Any:
            job = self._current
            if job is not None:
                job.fired = asyncio.get_running_loop().create_future()
                job.armed_pc = time.perf_counter_ns()
                job.armed.set()
                await job.fired
                if job.result_context is not None:
                    await collect(job.result_context)
                job.started_ns = time.time_ns()
            return await start_and_wait(*a, **kw)

        controller._prepare_nt_step = prepared
        controller._wait_execution_to_stop = gated
        collector.submit = deferred

    def close(self) -> None:
        try:
            if self.session.connection_state.connected:
                self.session.disconnect()
        except Exception:  # noqa: S110 -- already gone
            pass

    def capabilities(self) -> dict[str, Any]:
        return {"two_phase": True, "max_armed": 1, "horizon_ns": self.horizon_ns,
                "min_lead_ns": self.min_lead_ns, "start": "on_fire"}

    def health(self) -> None:
        if self._broken and self.reconnect is not None and not self._armed and not self._fired:
            self.close()
            try:
                session = self.reconnect()
            except Exception as e:  # LabOne Q's and the transport's errors
                raise InstrumentUnreachable(f"LabOne Q: cannot connect again: {type(e).__name__}: {e}") from None
            self._attach(session)
            self._broken = ""
        try:
            if self.probe is not None:
                self.probe()
        except Exception as e:  # the probe's errors: the instruments do not answer
            self._broken = f"{type(e).__name__}: {e}"
            raise InstrumentUnreachable(f"LabOne Q: {self._broken}") from None
        if not self.session.connection_state.connected:
            self._broken = "the session is not connected"
            raise InstrumentUnreachable("LabOne Q session is not connected to the instruments")

    # ------------------------------------------------------------ ARM

    @staticmethod
    def _qubit_map(text: str, n: int, cal: CalibrationSet) -> dict[str, Any]:
        try:
            program = openqasm3.parse(text)
        except Exception as e:  # the parser's errors are of several types
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, f"not OpenQASM 3: {e}") from None
        qmap: dict[str, Any] = {}
        nxt = 0
        for s in program.statements:
            if isinstance(s, ast.QubitDeclaration):
                size = 1 if s.size is None else int(getattr(s.size, "value", 0))
                if nxt + size > n:
                    raise ArmRefused(STAGE_COMPILE, QUBIT_OUT_OF_RANGE,
                                     f"line {s.span.start_line if s.span else 0}: {nxt + size} qubits declared; "
                                     f"this device has {n}")
                qmap[s.qubit.name] = cal.qubits[nxt] if s.size is None else cal.qubits[nxt:nxt + size]
                nxt += size
            elif isinstance(s, ast.QuantumGate):
                for ref in s.qubits:
                    if isinstance(ref, ast.Identifier) and ref.name.startswith("$") and int(ref.name[1:]) >= n:
                        raise ArmRefused(STAGE_COMPILE, QUBIT_OUT_OF_RANGE,
                                         f"physical qubit {ref.name} is outside this device's {n} qubits")
        if not qmap:  # physical qubits only
            qmap = {f"${i}": q for i, q in enumerate(cal.qubits)}
        return qmap

    @staticmethod
    def _aligned_readout(text: str) -> str:
        """The program with a barrier over its declared qubits before each
        run of consecutive measurements.  The qubits' readouts share one
        multiplexed line (the SHFQC+'s channel), whose readout pulses and
        integrations LabOne Q's compiler can only play aligned: measured as
        each qubit comes free (a GHZ's last CNOT delays one of them) it
        fails with "Cut points overlap intervals"."""
        program = openqasm3.parse(text)
        regs = [s.qubit.name for s in program.statements if isinstance(s, ast.QubitDeclaration)]
        if not regs:
            return text
        out: list[ast.Statement | ast.Pragma] = []
        before = False
        for s in program.statements:
            measure = isinstance(s, ast.QuantumMeasurementStatement)
            if measure and not before:
                out.append(ast.QuantumBarrier(qubits=[ast.Identifier(r) for r in regs]))
            out.append(s)
            before = measure
        program.statements = out
        return str(openqasm3.dumps(program))

    @staticmethod
    def _measured(text: str) -> tuple[list[tuple[str, int]], dict[str, int]]:
        """The bit registers, and the device qubit each handle ("c[0]")
        measured, from the program's own declarations."""
        program = openqasm3.parse(text)
        regs: list[tuple[str, int]] = []
        qbase: dict[str, int] = {}
        nxt = 0
        handles: dict[str, int] = {}

        def one(ref: Any) -> tuple[str, int]:
            if isinstance(ref, ast.IndexedIdentifier):
                index = ref.indices[0]
                # q[1] is a list of one expression; a DiscreteSet {1, 2} is not one qubit
                first = index[0] if isinstance(index, list) else None
                return ref.name.name, int(getattr(first, "value", 0))
            return ref.name, -1

        for s in program.statements:
            if isinstance(s, ast.ClassicalDeclaration) and isinstance(s.type, ast.BitType):
                size = 1 if s.type.size is None else int(getattr(s.type.size, "value", 1))
                regs.append((s.identifier.name, size))
            elif isinstance(s, ast.QubitDeclaration):
                qbase[s.qubit.name] = nxt
                nxt += 1 if s.size is None else int(getattr(s.size, "value", 0))
            elif isinstance(s, ast.QuantumMeasurementStatement) and s.target is not None:
                (cn, ci), (qn, qi) = one(s.target), one(s.measure.qubit)
                q = int(qn[1:]) if qn.startswith("$") else qbase.get(qn, 0) + max(qi, 0)
                handles[f"{cn}[{max(ci, 0)}]"] = q
        return regs, handles

    def arm(self, req: ArmRequest) -> Armed:
        if req.job_id in self._armed or req.job_id in self._fired:
            raise ArmRefused(STAGE_ARM, PROGRAM_REJECTED, f"job {req.job_id} is already held")
        if self._armed or self._fired:
            held = next(iter(self._armed or self._fired))
            raise ArmRefused(STAGE_ARM, TOO_MANY_ARMED, f"the instruments hold job {held} (max_armed 1)")
        try:
            self.health()
        except InstrumentUnreachable as e:
            raise ArmRefused(STAGE_UPLOAD, INSTRUMENT_UNREACHABLE, str(e)) from None
        t0 = time.perf_counter_ns()
        env = envelope.parse(req.program, req.shots)
        if env.fmt == NATIVE_FORMAT:
            compiled, job = self._native(req, env)
        elif env.fmt == P.ENVELOPE_FORMAT:
            compiled, job = self._compile(req, env)
        else:
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, f'payload format "{env.fmt}": this endpoint takes '
                             f'"{P.ENVELOPE_FORMAT}" or "{NATIVE_FORMAT}"')
        job.duration_ns = math.ceil(compiled.estimated_runtime * 1e9)
        if job.duration_ns > req.slot_ns:
            raise ArmRefused(STAGE_COMPILE, PROGRAM_TOO_LONG,
                             f"the compiled experiment runs {job.duration_ns} ns (LabOne Q's estimate); "
                             f"the slot is {req.slot_ns} ns")
        t1 = time.perf_counter_ns()
        if self.observe is not None:   # a test bench's record of what is uploaded (lab.Lab.journal)
            self.observe(req, compiled)
        self._current = job
        try:
            job.submission = self._controller.submit_compiled(compiled.scheduled_experiment)
        except Exception as e:  # the controller's errors
            self._current = None
            raise ArmRefused(STAGE_UPLOAD, PROGRAM_REJECTED, f"{type(e).__name__}: {e}") from None
        if not job.armed.wait(ARM_TIMEOUT_S):
            self._current = None
            raise ArmRefused(STAGE_ARM, INSTRUMENT_UNREACHABLE, f"not armed within {ARM_TIMEOUT_S} s")
        job.armed_ns = time.time_ns()
        upload = max(job.uploaded_pc - t1, 0)
        self._armed[req.job_id] = job
        return Armed(req.job_id, [(STAGE_COMPILE, t1 - t0), (STAGE_UPLOAD, upload),
                                  (STAGE_ARM, job.armed_pc - t1 - upload)], job.duration_ns)

    @classmethod
    def experiment(cls, cal: CalibrationSet, qasms: list[str], shots: int) -> Any:
        """The one LabOne Q experiment of a job's circuits against `cal`:
        a batch of the programs, single-shot integration, `shots`
        iterations (raises ArmRefused, or the importer's OpenQasmException
        and ValueError)."""
        from laboneq.openqasm3 import MultiProgramOptions, OpenQASMTranspiler
        from laboneq.simple import AcquisitionType, AveragingMode

        maps = [cls._qubit_map(q, len(cal.qubits), cal) for q in qasms]
        qasms = [cls._aligned_readout(q) for q in qasms]
        if any(m != maps[0] for m in maps[1:]):
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, "the circuits of one job must declare the same qubits")
        return OpenQASMTranspiler(cal.qpu).batch_experiment(
            qasms, qubit_map=maps[0],
            options=MultiProgramOptions(count=shots, acquisition_type=AcquisitionType.INTEGRATION,
                                        averaging_mode=AveragingMode.SINGLE_SHOT))

    def _compile(self, req: ArmRequest, env: envelope.Envelope) -> tuple[Any, _Job]:
        from laboneq.openqasm3 import OpenQasmException

        cal = self.calibrations.load(req.calibration_id)
        try:
            exp = self.experiment(cal, [c.qasm for c in env.circuits], env.shots)
        except OpenQasmException as e:
            text = str(e)
            reason = GATE_NOT_SUPPORTED if ("gate" in text.lower() or "operation" in text.lower()
                                            or "coupler" in text) else PROGRAM_INVALID
            raise ArmRefused(STAGE_COMPILE, reason, text) from None
        except ValueError as e:
            raise ArmRefused(STAGE_COMPILE, GATE_NOT_SUPPORTED if "gate_not_supported" in str(e) else PROGRAM_INVALID,
                             str(e)) from None
        measured = [self._measured(c.qasm) for c in env.circuits]   # parsed above: they read
        try:
            compiled = self.session.compile(exp)
        except Exception as e:  # LabOne Q's compiler raises its own exception types
            text = str(e)
            low = text.lower()
            if "resource limitation" in low and "waveform" not in low:
                # a sequencer's instructions or command table entries (ResourceLimitationError)
                reason = INSTRUCTION_MEMORY_EXCEEDED
            elif "memory" in low or "resource limitation" in low:
                reason = WAVEFORM_MEMORY_EXCEEDED
            else:
                reason = PROGRAM_INVALID
            raise ArmRefused(STAGE_COMPILE, reason, f"LabOne Q compiler: {text}") from None
        job = _Job(req.job_id, cal, [c.name for c in env.circuits], [m[0] for m in measured],
                   [m[1] for m in measured], env.shots, 0)
        return compiled, job

    def _native(self, req: ArmRequest, env: envelope.Envelope) -> tuple[Any, _Job]:
        """A precompiled program: {"format": "laboneq-compiled", "shots",
        "calibration_id", "calibration_sha256" (optional), "raw": true,
        "compiled": laboneq.serializers.to_json(CompiledExperiment)}."""
        from laboneq.core.types.compiled_experiment import CompiledExperiment
        from laboneq.serializers import from_json

        raw = env.raw
        if raw.get("calibration_id") != req.calibration_id:
            raise ArmRefused(STAGE_PARSE, CALIBRATION_MISMATCH,
                             f"the program was compiled for calibration {raw.get('calibration_id')!r}; the job runs "
                             f"under calibration {req.calibration_id}")
        cal = self.calibrations.load(req.calibration_id)
        digest = raw.get("calibration_sha256")
        if digest is not None and digest != cal.digest:
            raise ArmRefused(STAGE_PARSE, CALIBRATION_MISMATCH,
                             f"the program was compiled against a calibration set {str(digest)[:16]}..., this "
                             f"endpoint's set {req.calibration_id} is {cal.digest[:16]}...")
        if raw.get("raw") is not True:
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, 'a precompiled program\'s acquisitions come back raw: '
                             'give "raw": true')
        if not isinstance(raw.get("compiled"), str):
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, 'a precompiled program needs "compiled": the '
                             "CompiledExperiment in LabOne Q's serialization (laboneq.serializers.to_json)")
        try:
            compiled = from_json(raw["compiled"])
        except Exception as e:  # the deserializer's errors are of several types
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, f"compiled: not LabOne Q's serialization: "
                             f"{type(e).__name__}: {str(e)[:500]}") from None
        if not isinstance(compiled, CompiledExperiment):
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, f"compiled: a {type(compiled).__name__}, not a "
                             "CompiledExperiment")
        return compiled, _Job(req.job_id, cal, [], [], [], env.shots, 0)

    # ------------------------------------------------------------ FIRE ...

    def fire(self, job_id: int) -> int:
        job = self._armed.pop(job_id, None)
        if job is None or job.fired is None:
            raise UnknownJob(job_id)
        t = time.time_ns()
        self._loop.call_soon_threadsafe(job.fired.set_result, None)
        self._fired[job_id] = job
        return t

    def disarm(self, job_id: int) -> None:
        job = self._armed.pop(job_id, None)
        if job is None or job.fired is None:
            raise UnknownJob(job_id)
        fut = job.fired
        self._loop.call_soon_threadsafe(fut.cancel)
        try:
            self._controller.wait_submission(job.submission)
        except (asyncio.CancelledError, Exception):  # noqa: S110 -- the cancelled run ends here
            pass
        self._current = None

    def collect(self, job_id: int) -> Result:
        job = self._fired.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        try:
            self._controller.wait_submission(job.submission)
            job.ended_ns = time.time_ns()
            res = self._controller.submission_results(job.submission)
            payload = self._counts(job, res.acquired_results) if job.names else self._raw(job, res.acquired_results)
            status = {"execution_errors": [str(e) for e in res.execution_errors],
                      "emulation": bool(getattr(self.session.connection_state, "emulated", False))}
        finally:
            self._fired.pop(job_id, None)
            self._current = None
        return Result(job_id, payload, status, job.armed_ns, job.started_ns, job.ended_ns)

    @staticmethod
    def _raw(job: _Job, acquired: dict[str, Any]) -> dict[str, Any]:
        """A precompiled program's acquisitions, per handle: [re, im] per value."""
        out: dict[str, Any] = {}
        for handle, r in acquired.items():
            vals = np.asarray(r.data, dtype=np.complex128).reshape(-1)
            out[str(handle)] = [[float(v.real), float(v.imag)] for v in vals]
        return {"format": RAW_FORMAT, "shots": job.shots, "acquisitions": out}

    def _counts(self, job: _Job, acquired: dict[str, Any]) -> dict[str, Any]:
        """Handles are the importer's "<reg>[<i>]"; the data of a batch of
        programs is (shots, programs) in single-shot mode."""
        results = []
        nprog = len(job.names)
        for ci, name in enumerate(job.names):
            regs = job.registers[ci]
            nbits = sum(k for _, k in regs)
            bits = np.zeros((job.shots, max(nbits, 1)), dtype=np.int8)
            base = 0
            for reg, size in regs:
                for i in range(size):
                    handle = f"{reg}[{i}]"
                    if handle not in acquired:
                        continue
                    data = np.asarray(acquired[handle].data).reshape(job.shots, nprog) if nprog > 1 else \
                        np.asarray(acquired[handle].data).reshape(job.shots, 1)
                    iq = data[:, ci if nprog > 1 else 0]
                    q = job.measured[ci].get(handle, 0)
                    rot, th = job.cal.threshold(q)
                    bits[:, base + i] = ((iq * np.exp(-1j * math.radians(rot))).real > th).astype(np.int8)
                base += size
            counts: dict[str, int] = {}
            for row in bits:
                key = _count_key(regs, row.tolist())
                counts[key] = counts.get(key, 0) + 1
            results.append({"name": name, "shots": job.shots, "counts": counts})
        return envelope.counts_answer(results)
