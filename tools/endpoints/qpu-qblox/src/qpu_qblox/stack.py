"""The Qblox control stack: qblox-scheduler compiles, qblox-instruments
uploads to the Cluster's sequencers and arms them at ARM; FIRE is one
start command; RESULT thresholds the binned acquisitions.

The Cluster's sequencers hold one program each, so one job is held at a
time (max_armed 1): the endpoint framework takes the next ARM after the
previous job's collect.  Input is qrtd's OpenQASM 3 envelope, or a
precompiled program ("qblox-compiled": a serialized CompiledSchedule,
checked against the job's calibration id and, when it names one, the
set's digest), whose acquisitions come back raw.

When the Cluster stops answering, health() raises InstrumentUnreachable;
given a `reconnect` (a function opening the Cluster again), the next
health() closes the old connection and opens a new one, so the endpoint
is up again once the instrument is.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from qblox_instruments import Cluster, SequencerStates
from qblox_scheduler import CZ, Measure, Reset, Rxy, Rz, Schedule
from qblox_scheduler.backends.circuit_to_device import ConfigKeyError
from qblox_scheduler.backends.graph_compilation import SerialCompiler
from qblox_scheduler.instrument_coordinator.components.qblox import ClusterComponent
from qblox_scheduler.schedules.schedule import CompiledSchedule
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
    SEQUENCER_NOT_CONFIGURED,
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

from . import qasm
from .calibration import CalibrationSet, CalibrationStore

NAME = "qpu-qblox"
DEFAULT_HORIZON_NS = 60_000_000_000
# The least lead this stack states: compile + upload + arm of a small job on
# the dummy is ~0.1-0.3 s (bench/); a real Cluster adds the network.
DEFAULT_MIN_LEAD_NS = 500_000_000
COLLECT_TIMEOUT_S = 10.0
NATIVE_FORMAT = "qblox-compiled"
RAW_FORMAT = "qblox-raw"


@dataclass
class _Job:
    job_id: int
    cal: CalibrationSet
    circuits: list[tuple[str, qasm.Circuit]]   # none for a precompiled program (raw acquisitions)
    shots: int
    program: dict[str, Any]
    sequencers: list[tuple[int, int]]          # (slot, sequencer index) armed
    duration_ns: int
    armed_ns: int = 0
    started_ns: int = 0
    ended_ns: int = 0
    fire_call_ns: int = 0
    times: dict[str, int] = field(default_factory=dict)


def _ns() -> int:
    return time.time_ns()


class QbloxStack:
    """The handler (see handler.Handler) for one Cluster.

    `cluster` is a connected qblox_instruments.Cluster (a real one:
    Cluster("cluster0", identifier="192.168.0.2"); or dummy.dummy_cluster);
    its name must be the one the calibration sets' hardware configuration
    uses.  `calibrations` reads the QPU's calibration sets."""

    def __init__(self, cluster: Cluster, calibrations: CalibrationStore, *,
                 horizon_ns: int = DEFAULT_HORIZON_NS, min_lead_ns: int = DEFAULT_MIN_LEAD_NS,
                 reconnect: Callable[[], Cluster] | None = None) -> None:
        self.calibrations = calibrations
        self.horizon_ns = horizon_ns
        self.min_lead_ns = min_lead_ns
        self.reconnect = reconnect
        self._armed: dict[int, _Job] = {}
        self._fired: dict[int, _Job] = {}
        self._broken = ""
        self._attach(cluster)

    def _attach(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.component = ClusterComponent(cluster)
        self._start = cluster.start_sequencer

    def close(self) -> None:
        """Release the driver objects (qcodes instruments are named, once)."""
        for inst in (self.component, self.cluster):
            try:
                inst.close()
            except Exception:  # noqa: S110 -- already closed
                pass

    # ------------------------------------------------------------ interface

    def capabilities(self) -> dict[str, Any]:
        return {"two_phase": True, "max_armed": 1, "horizon_ns": self.horizon_ns,
                "min_lead_ns": self.min_lead_ns, "start": "on_fire"}

    def health(self) -> None:
        """Raises InstrumentUnreachable when the Cluster does not answer.
        Its system status (flags such as a past temperature excursion) is
        not a reason to refuse: it goes into each RESULT's status.  After a
        failure, with a `reconnect`, the connection is opened anew first."""
        if self._broken and self.reconnect is not None and not self._armed and not self._fired:
            self.close()
            try:
                cluster = self.reconnect()
            except Exception as e:  # the transport's errors are of several types
                raise InstrumentUnreachable(f"cluster: cannot connect again: {type(e).__name__}: {e}") from None
            self._attach(cluster)
            self._broken = ""
        self._system_status()

    def _system_status(self) -> str:
        try:
            return str(self.cluster.get_system_status())
        except Exception as e:  # the transport's errors are of several types
            self._broken = f"{type(e).__name__}: {e}"
            raise InstrumentUnreachable(f"cluster {self.cluster.name}: {self._broken}") from None

    def arm(self, req: ArmRequest) -> Armed:
        if req.job_id in self._armed or req.job_id in self._fired:
            raise ArmRefused(STAGE_ARM, PROGRAM_REJECTED, f"job {req.job_id} is already held")
        if self._armed or self._fired:
            held = next(iter(self._armed or self._fired))
            raise ArmRefused(STAGE_ARM, TOO_MANY_ARMED, f"the sequencers hold job {held} (max_armed 1)")
        try:
            self.health()
        except InstrumentUnreachable as e:
            raise ArmRefused(STAGE_UPLOAD, INSTRUMENT_UNREACHABLE, str(e)) from None

        t0 = time.perf_counter_ns()
        job = self._compile(req)
        t1 = time.perf_counter_ns()
        self._upload(job)
        t2 = time.perf_counter_ns()
        self._arm(job)
        t3 = time.perf_counter_ns()
        job.armed_ns = _ns()
        self._armed[req.job_id] = job
        return Armed(req.job_id, [(STAGE_COMPILE, t1 - t0), (STAGE_UPLOAD, t2 - t1), (STAGE_ARM, t3 - t2)],
                     job.duration_ns)

    def fire(self, job_id: int) -> int:
        job = self._armed.pop(job_id, None)
        if job is None:
            raise UnknownJob(job_id)
        self._fired[job_id] = job
        t = _ns()
        self._start()
        job.started_ns = t
        return t

    def disarm(self, job_id: int) -> None:
        job = self._armed.pop(job_id, None)
        if job is None:
            raise UnknownJob(job_id)
        self._stop(job)

    def collect(self, job_id: int) -> Result:
        job = self._fired.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        try:
            status = self._wait_stopped(job)
            job.ended_ns = _ns()
            status["system"] = self._system_status()
            dataset = self.component.retrieve_acquisition()
            payload = self._counts(job, dataset) if job.circuits else self._raw(job, dataset)
        except InstrumentUnreachable:
            raise
        except Exception as e:  # the driver's errors on the way: the instrument went
            self._broken = f"{type(e).__name__}: {e}"
            raise InstrumentUnreachable(f"cluster {self.cluster.name}: {self._broken}") from None
        finally:
            self._fired.pop(job_id, None)
        return Result(job_id, payload, status, job.armed_ns, job.started_ns, job.ended_ns)

    # ------------------------------------------------------------ the stages

    @staticmethod
    def schedule(cal: CalibrationSet, circuits: list[tuple[str, qasm.Circuit]], shots: int) -> Schedule:
        """One schedule for the job: its circuits one after another, each
        from a reset of the qubits it uses, repeated `shots` times."""
        s = Schedule("qrtd job", repetitions=shots)
        for ci, (_, c) in enumerate(circuits):
            used = sorted(c.qubits_used)
            s.add(Reset(*(cal.qubits[q] for q in used)))
            m = 0
            for op in c.ops:
                names = [cal.qubits[q] for q in op.qubits]
                if op.kind == "Rxy":
                    s.add(Rxy(op.params[0], op.params[1], names[0]))
                elif op.kind == "Rz":
                    s.add(Rz(op.params[0], names[0]))
                elif op.kind == "CZ":
                    a, b = sorted(op.qubits)
                    if (a, b) not in cal.edges:
                        raise ArmRefused(STAGE_COMPILE, GATE_NOT_SUPPORTED,
                                         f"{names[0]}, {names[1]}: no coupler between q{a} and q{b} "
                                         f"(this device couples {', '.join(f'q{x}-q{y}' for x, y in cal.edges)})")
                    s.add(CZ(f"q{a}", f"q{b}"))
                elif op.kind == "Measure":
                    s.add(Measure(names[0], acq_label=f"{ci}:{m}", average_segment_repetitions=False))
                    m += 1
                elif op.kind == "Reset":
                    s.add(Reset(names[0]))
        return s

    def _compile(self, req: ArmRequest) -> _Job:
        env = envelope.parse(req.program, req.shots)
        if env.fmt == NATIVE_FORMAT:
            return self._native(req, env)
        if env.fmt != P.ENVELOPE_FORMAT:
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, f'payload format "{env.fmt}": this endpoint takes '
                             f'"{P.ENVELOPE_FORMAT}" or "{NATIVE_FORMAT}"')
        cal = self.calibrations.load(req.calibration_id)
        circuits = []
        for i, c in enumerate(env.circuits):
            try:
                circuits.append((c.name, qasm.read(c.qasm, len(cal.qubits))))
            except ArmRefused as e:
                raise ArmRefused(e.stage, e.reason, f"circuits[{i}] ({c.name}): {e.detail}") from None
        sched = self.schedule(cal, circuits, env.shots)
        try:
            compiled = SerialCompiler("qrtd").compile(sched, config=cal.config)
        except ConfigKeyError as e:
            raise ArmRefused(STAGE_COMPILE, GATE_NOT_SUPPORTED, str(e)) from None
        except (ValueError, KeyError, RuntimeError) as e:
            text = str(e)
            if "Number of instructions" in text:
                raise ArmRefused(STAGE_COMPILE, INSTRUCTION_MEMORY_EXCEEDED, text) from None
            if "waveform" in text.lower() and ("limit" in text or "exceed" in text):
                raise ArmRefused(STAGE_COMPILE, WAVEFORM_MEMORY_EXCEEDED, text) from None
            raise ArmRefused(STAGE_COMPILE, PROGRAM_INVALID, f"qblox-scheduler: {type(e).__name__}: {text}") from None
        return self._place(req, cal, circuits, env.shots, compiled)

    def _native(self, req: ArmRequest, env: envelope.Envelope) -> _Job:
        """A precompiled program: {"format": "qblox-compiled", "shots",
        "calibration_id", "calibration_sha256" (optional), "raw": true,
        "schedule": CompiledSchedule.to_json()}."""
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
        if not isinstance(raw.get("schedule"), str):
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, 'a precompiled program needs "schedule": the '
                             "CompiledSchedule's JSON (CompiledSchedule.to_json())")
        try:
            compiled = CompiledSchedule.from_json(raw["schedule"])
        except Exception as e:  # the decoder's errors are of several types
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, f"schedule: not a CompiledSchedule: {type(e).__name__}: "
                             f"{str(e)[:500]}") from None
        if not isinstance(compiled, CompiledSchedule):
            raise ArmRefused(STAGE_PARSE, PROGRAM_INVALID, f"schedule: a {type(compiled).__name__}, not a "
                             "CompiledSchedule")
        return self._place(req, cal, [], env.shots, compiled)

    def _place(self, req: ArmRequest, cal: CalibrationSet, circuits: list[tuple[str, qasm.Circuit]], shots: int,
               compiled: CompiledSchedule) -> _Job:
        """The compiled program's duration against the slot, and the
        modules and sequencers it drives against the Cluster's."""
        duration_ns = math.ceil(compiled.duration * 1e9 - 1e-3)
        if duration_ns > req.slot_ns:
            raise ArmRefused(STAGE_COMPILE, PROGRAM_TOO_LONG,
                             f"the compiled program runs {duration_ns} ns; the slot is {req.slot_ns} ns")
        program = compiled.compiled_instructions.get(self.cluster.name)
        if program is None:
            raise ArmRefused(STAGE_COMPILE, SEQUENCER_NOT_CONFIGURED,
                             f"the program drives no cluster named {self.cluster.name!r} (it has "
                             f"{', '.join(compiled.compiled_instructions)})")
        sequencers = []
        present = {int(m.slot_idx) for m in self.cluster.get_connected_modules().values()}
        for key, mod in program.items():
            if not key.startswith(f"{self.cluster.name}_module") or not isinstance(mod, dict):
                continue
            slot = int(key.rsplit("module", 1)[1])
            if slot not in present:
                raise ArmRefused(STAGE_COMPILE, SEQUENCER_NOT_CONFIGURED,
                                 f"the program drives module {slot} of {self.cluster.name}; no module is there")
            for seq_name in mod.get("sequencers", {}):
                sequencers.append((slot, int(seq_name.removeprefix("seq"))))
        return _Job(req.job_id, cal, circuits, shots, program, sorted(sequencers), duration_ns)

    def _upload(self, job: _Job) -> None:
        try:
            self.component.prepare(job.program)
        except Exception as e:  # the driver raises RuntimeError with the instrument's errors, and others
            text = " ".join(str(a) for a in e.args)[:2000]
            if "Assembly failed" in text:
                raise ArmRefused(STAGE_UPLOAD, PROGRAM_REJECTED, f"the sequencer's assembler: {text}") from None
            raise ArmRefused(STAGE_UPLOAD, INSTRUMENT_UNREACHABLE if isinstance(e, OSError | TimeoutError)
                             else PROGRAM_REJECTED, f"{type(e).__name__}: {text}") from None

    def _arm(self, job: _Job) -> None:
        try:
            for slot, seq in job.sequencers:
                self.cluster.arm_sequencer(slot, seq)
                job.times[f"arm module{slot}.seq{seq}"] = _ns()
            for slot, seq in job.sequencers:
                st = self.cluster.get_sequencer_status(slot, seq)
                if st.state is not SequencerStates.ARMED:
                    raise ArmRefused(STAGE_ARM, SEQUENCER_NOT_CONFIGURED,
                                     f"module {slot} sequencer {seq} is {st.state.name} after arm: {st}")
        except ArmRefused:
            self._stop(job)
            raise
        except Exception as e:  # the driver's errors
            self._stop(job)
            raise ArmRefused(STAGE_ARM, INSTRUMENT_UNREACHABLE if isinstance(e, OSError | TimeoutError)
                             else SEQUENCER_NOT_CONFIGURED, f"{type(e).__name__}: {e}") from None

    def _stop(self, job: _Job) -> None:
        for slot, seq in job.sequencers:
            try:
                self.cluster.stop_sequencer(slot, seq)
            except Exception:  # noqa: S110 -- best effort on the way out of a refusal
                pass

    def _wait_stopped(self, job: _Job) -> dict[str, Any]:
        deadline = time.monotonic() + COLLECT_TIMEOUT_S + job.duration_ns / 1e9
        out: dict[str, Any] = {}
        for slot, seq in job.sequencers:
            while True:
                st = self.cluster.get_sequencer_status(slot, seq)
                if st.state is SequencerStates.STOPPED or time.monotonic() > deadline:
                    break
                time.sleep(0.001)
            out[f"module{slot}.seq{seq}"] = {
                "status": st.status.name, "state": st.state.name,
                "info": [f.name for f in st.info_flags], "warnings": [f.name for f in st.warn_flags],
                "errors": [f.name for f in st.err_flags]}
        return out

    @staticmethod
    def _raw(job: _Job, dataset: Any) -> dict[str, Any]:
        """A precompiled program's acquisitions, per label: [re, im] per bin
        (null where the instrument acquired nothing)."""
        out: dict[str, Any] = {}
        for label in dataset.data_vars:
            vals = np.asarray(dataset[label].values, dtype=np.complex128).reshape(-1)
            out[str(label)] = [[None, None] if np.isnan(v) else [float(v.real), float(v.imag)] for v in vals]
        return {"format": RAW_FORMAT, "shots": job.shots, "acquisitions": out}

    def _counts(self, job: _Job, dataset: Any) -> dict[str, Any]:
        results = []
        for ci, (name, c) in enumerate(job.circuits):
            bits = np.zeros((job.shots, max(c.num_clbits, 1)), dtype=np.int8)
            m = 0
            for op in c.ops:
                if op.kind != "Measure":
                    continue
                label = f"{ci}:{m}"
                m += 1
                th = job.cal.thresholds[job.cal.qubits[op.qubits[0]]]
                iq = np.asarray(dataset[label].values, dtype=np.complex128).reshape(-1)[: job.shots]
                rotated = (iq * np.exp(-1j * math.radians(th.rotation_deg))).real
                bits[:, op.clbit] = (rotated > th.threshold).astype(np.int8)
            counts: dict[str, int] = {}
            for row in bits:
                key = c.count_key(row.tolist())
                counts[key] = counts.get(key, 0) + 1
            results.append({"name": name, "shots": job.shots, "counts": counts})
        return envelope.counts_answer(results)
