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
waits for FIRE.  One job is armed at a time (max_armed 1).
"""

from __future__ import annotations

import asyncio
import gc
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import openqasm3
from openqasm3 import ast
from qrt_endpoint import envelope
from qrt_endpoint.handler import (
    BEYOND_HORIZON,
    GATE_NOT_SUPPORTED,
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


@dataclass
class _Job:
    job_id: int
    cal: CalibrationSet
    names: list[str]
    registers: list[list[tuple[str, int]]]
    measured: list[dict[str, int]]            # per circuit: handle -> device qubit
    shots: int
    duration_ns: int
    submission: Any = None
    armed: threading.Event = field(default_factory=threading.Event)
    fired: asyncio.Future[None] | None = None
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
                 horizon_ns: int = DEFAULT_HORIZON_NS, min_lead_ns: int = DEFAULT_MIN_LEAD_NS) -> None:
        self.session = session
        self.calibrations = calibrations
        self.horizon_ns = horizon_ns
        self.min_lead_ns = min_lead_ns
        self._armed: dict[int, _Job] = {}
        self._fired: dict[int, _Job] = {}
        self._current: _Job | None = None
        controller = session._assert_connected()
        self._controller = controller
        self._loop: asyncio.AbstractEventLoop = controller._event_loop._loop
        prepare = controller._prepare_nt_step
        start_and_wait = controller._wait_execution_to_stop

        async def prepared(*a: Any, **kw: Any) -> Any:
            r = await prepare(*a, **kw)
            if self._current is not None:
                self._current.uploaded_pc = time.perf_counter_ns()
            return r

        async def gated(*a: Any, **kw: Any) -> Any:
            job = self._current
            if job is not None:
                job.fired = asyncio.get_running_loop().create_future()
                job.armed_pc = time.perf_counter_ns()
                job.armed.set()
                await job.fired
                job.started_ns = time.time_ns()
            return await start_and_wait(*a, **kw)

        controller._prepare_nt_step = prepared
        controller._wait_execution_to_stop = gated

    def capabilities(self) -> dict[str, Any]:
        return {"two_phase": True, "max_armed": 1, "horizon_ns": self.horizon_ns,
                "min_lead_ns": self.min_lead_ns, "start": "on_fire"}

    def health(self) -> None:
        if not self.session.connection_state.connected:
            raise InstrumentUnreachable("LabOne Q session is not connected to the instruments")

    # ------------------------------------------------------------ ARM

    def _qubit_map(self, text: str, n: int, cal: CalibrationSet) -> dict[str, Any]:
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
                return ref.name.name, int(getattr(ref.indices[0][0], "value", 0))  # type: ignore[index]
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
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, f"job {req.job_id} is already held")
        if self._armed or self._fired:
            held = next(iter(self._armed or self._fired))
            raise ArmRefused(STAGE_ARM, TOO_MANY_ARMED, f"the instruments hold job {held} (max_armed 1)")
        if req.fire_at_ns - time.time_ns() > self.horizon_ns:
            raise ArmRefused(STAGE_PARSE, BEYOND_HORIZON, f"fire_at is beyond the {self.horizon_ns} ns horizon")
        try:
            self.health()
        except InstrumentUnreachable as e:
            raise ArmRefused(STAGE_UPLOAD, INSTRUMENT_UNREACHABLE, str(e)) from None
        from laboneq.openqasm3 import MultiProgramOptions, OpenQasmException, OpenQASMTranspiler
        from laboneq.simple import AcquisitionType, AveragingMode

        t0 = time.perf_counter_ns()
        env = envelope.parse(req.program, req.shots)
        if env.fmt != "qasm3":
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, f'payload format "{env.fmt}": this endpoint takes "qasm3"')
        cal = self.calibrations.load(req.calibration_id)
        n = len(cal.qubits)
        maps = [self._qubit_map(c.qasm, n, cal) for c in env.circuits]
        measured = [self._measured(c.qasm) for c in env.circuits]
        if any(m != maps[0] for m in maps[1:]):
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, "the circuits of one job must declare the same qubits")
        try:
            exp = OpenQASMTranspiler(cal.qpu).batch_experiment(
                [c.qasm for c in env.circuits], qubit_map=maps[0],
                options=MultiProgramOptions(count=env.shots, acquisition_type=AcquisitionType.INTEGRATION,
                                            averaging_mode=AveragingMode.SINGLE_SHOT))
        except OpenQasmException as e:
            text = str(e)
            reason = GATE_NOT_SUPPORTED if ("gate" in text.lower() or "operation" in text.lower()
                                            or "coupler" in text) else PROGRAM_INVALID
            raise ArmRefused(STAGE_COMPILE, reason, text) from None
        except ValueError as e:
            raise ArmRefused(STAGE_COMPILE, GATE_NOT_SUPPORTED if "gate_not_supported" in str(e) else PROGRAM_INVALID,
                             str(e)) from None
        try:
            compiled = self.session.compile(exp)
        except Exception as e:  # LabOne Q's compiler raises its own exception types
            text = str(e)
            reason = WAVEFORM_MEMORY_EXCEEDED if "memory" in text.lower() else PROGRAM_INVALID
            raise ArmRefused(STAGE_COMPILE, reason, f"LabOne Q compiler: {text}") from None
        duration_ns = math.ceil(compiled.estimated_runtime * 1e9)
        if duration_ns > req.slot_ns:
            raise ArmRefused(STAGE_COMPILE, PROGRAM_TOO_LONG,
                             f"the compiled experiment runs {duration_ns} ns (LabOne Q's estimate); "
                             f"the slot is {req.slot_ns} ns")
        job = _Job(req.job_id, cal, [c.name for c in env.circuits], [m[0] for m in measured],
                   [m[1] for m in measured], env.shots, duration_ns)
        t1 = time.perf_counter_ns()
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
        if not self._armed and not self._fired:
            gc.collect()
            gc.freeze()
            gc.disable()
        self._armed[req.job_id] = job
        return Armed(req.job_id, [(STAGE_COMPILE, t1 - t0), (STAGE_UPLOAD, upload),
                                  (STAGE_ARM, job.armed_pc - t1 - upload)], duration_ns)

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
        self._settle_gc()

    def collect(self, job_id: int) -> Result:
        job = self._fired.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        try:
            self._controller.wait_submission(job.submission)
            job.ended_ns = time.time_ns()
            res = self._controller.submission_results(job.submission)
            payload = self._counts(job, res.acquired_results)
            status = {"execution_errors": [str(e) for e in res.execution_errors],
                      "emulation": bool(getattr(self.session.connection_state, "emulated", False))}
        finally:
            self._fired.pop(job_id, None)
            self._current = None
            self._settle_gc()
        return Result(job_id, payload, status, job.armed_ns, job.started_ns, job.ended_ns)

    def _settle_gc(self) -> None:
        if not self._armed and not self._fired:
            gc.enable()
            gc.unfreeze()

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
