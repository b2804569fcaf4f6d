"""The maintenance loop of one QPU: check, ask for a block, calibrate, publish.

Each pass (every check_interval_s):

1. The window in force (calibration.get).  None: the first set, the
   device's nominal one, is written and pushed for window_s (its model is
   unknown until the first checks: f0 1, tau 0).
2. The cheap checks of every step, as ordinary jobs.  Their measurements give
   the reference fidelity now (model.reference_fidelity); the window's
   points give its model (model.fit: through the first and the latest
   measurement), pushed to qrtd (calibration.update of
   the same window, f0 and tau_ns) whenever it moved, so that min_fidelity
   placement uses what was measured.
3. needed_by: the earliest of the window's end, each step's last run plus
   its staleness timeout, the time the model, or the trend of the last
   measurements (model.crossing), falls below threshold, and,
   for a check out of spec, now plus the block and out_of_spec_grace_s.
   Within request_lead_s of it, a calibration.request for the due steps
   (the block's step is their names joined by "/").  A no_fit answer's
   earliest block is asked for instead (the calibration in force runs
   degraded until then; the answer's predicted fidelity is logged).
4. In the block: each due step's run through QrtdBackend with block_id;
   the new set (the writer's, from the set in force and the measurements)
   is written under a new id; calibration.update with block_id ends the old
   window and opens the new one from now + lead_s for window_s, with the
   model of the window just ended as its prior (the next checks refit it).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TextIO

from . import model as M
from .sets import SetWriter, apply_all, next_id
from .steps import Measurement, Step, StepFailed, over_rotation_and_readout

NS = 1_000_000_000


@dataclass
class QpuSettings:
    name: str
    qubits: list[int]
    set_writer: str = "qpu_aer_drift:AerSetWriter"
    set_root: str = "/var/lib/qrtd-calibration"
    threshold: float = 0.9           # the reference fidelity below which the calibration is stale
    reference_depth: int = 16        # X gates in the reference circuit (even)
    check_interval_s: float = 300.0
    request_lead_s: float = 900.0    # ask for a block this long before needed_by
    out_of_spec_grace_s: float = 600.0
    window_s: float = 86400.0        # a new calibration's window
    lead_s: float = 0.5              # a new window opens this long after its update
    urgency: int = 0
    job_duration_s: float = 0.2      # the slot each experiment's job books
    seed: int | None = None       # seed_simulator for the jobs (a simulated QPU)


@dataclass
class Window:
    calibration_id: int
    valid_from_ns: int
    valid_until_ns: int
    f0: float
    tau_ns: int

    @staticmethod
    def of(w: Mapping[str, Any]) -> Window:
        return Window(int(w["calibration_id"]), int(w["valid_from_ns"]), int(w["valid_until_ns"]),
                      float(w.get("f0", 1.0)), int(w.get("tau_ns", 0)))

    def to_json(self) -> dict[str, Any]:
        return {"calibration_id": self.calibration_id, "valid_from_ns": self.valid_from_ns,
                "valid_until_ns": self.valid_until_ns, "f0": self.f0, "tau_ns": self.tau_ns}


@dataclass
class QpuState:
    window: Window | None = None
    points: list[M.Point] = field(default_factory=list)
    prior: M.Model | None = None
    last_run_ns: dict[str, int] = field(default_factory=dict)
    latest: dict[str, Measurement] = field(default_factory=dict)
    out_of_spec: dict[str, bool] = field(default_factory=dict)
    calibrations: int = 0


class Service:
    """Keeps one QPU calibrated (module docstring).

    client: a qrt_client.Client with the calibration and scheduler roles;
    backend: builds the QrtdBackend for the QPU (the same client); log: text
    lines; events: one JSON object per action (None: none)."""

    def __init__(self, settings: QpuSettings, steps: Sequence[Step], client: Any, backend: Any,
                 writer: SetWriter, log: TextIO = sys.stderr, events: TextIO | None = None,
                 clock: Callable[[], int] = time.time_ns) -> None:
        if settings.reference_depth < 2 or settings.reference_depth % 2:
            raise ValueError(f"reference_depth {settings.reference_depth}: give an even number of 2 or more")
        if not 0.0 < settings.threshold < 1.0:
            raise ValueError(f"threshold {settings.threshold}: give a fidelity in (0, 1)")
        self.s = settings
        self.steps = list(steps)
        self.client = client
        self.backend = backend
        self.writer = writer
        self.log_file = log
        self.events = events
        self.clock = clock
        self.state = QpuState()
        self.stop = threading.Event()

    # ------------------------------------------------------------- output

    def log(self, text: str) -> None:
        print(f"qrt-calibration: {self.s.name}: {text}", file=self.log_file, flush=True)

    def emit(self, kind: str, **data: Any) -> None:
        if self.events is not None:
            self.events.write(json.dumps({"time_ns": self.clock(), "qpu": self.s.name, "event": kind, **data},
                                         sort_keys=True) + "\n")
            self.events.flush()

    # ------------------------------------------------------------- windows

    def windows(self) -> list[Window]:
        return [Window.of(w) for w in self.client.calibration_get(self.s.name)]

    def in_force(self, now: int) -> Window | None:
        return next((w for w in self.windows() if w.valid_from_ns <= now < w.valid_until_ns), None)

    def bootstrap(self, now: int) -> Window:
        cid = next_id(self.s.set_root, self.s.name, *(w.calibration_id for w in self.windows()))
        path = self.writer.write(self.writer.nominal(cid))
        w = Window(cid, now + int(self.s.lead_s * NS), now + int((self.s.lead_s + self.s.window_s) * NS), 1.0, 0)
        self.client.calibration_update(self.s.name, [w.to_json()])
        self.log(f"no calibration in force: wrote the nominal set {cid} ({path}) and opened its window")
        self.emit("bootstrap", calibration_id=cid, window=w.to_json())
        return w

    def adopt(self, w: Window) -> None:
        st = self.state
        if st.window is None or st.window.calibration_id != w.calibration_id:
            st.points = []
            st.latest = {}
            st.out_of_spec = {}
            for step in self.steps:
                st.last_run_ns.setdefault(step.name, w.valid_from_ns)
        st.window = w

    # --------------------------------------------------------------- checks

    def run_options(self, block_id: int | None = None) -> dict[str, Any]:
        opt: dict[str, Any] = {"duration_ns": int(self.s.job_duration_s * NS)}
        if self.s.seed is not None:
            opt["seed_simulator"] = self.s.seed
        if block_id is not None:
            opt["block_id"] = block_id
        return opt

    def fidelity(self) -> float | None:
        if len(self.state.latest) < len(self.steps):
            return None
        rot, ro = over_rotation_and_readout(self.state.latest)
        return M.reference_fidelity(rot, ro, self.s.reference_depth)

    def check(self, now: int, publish: bool = True) -> None:
        """Every step's cheap check; the window's model refitted and, with
        publish, pushed to qrtd when it moved."""
        st = self.state
        assert st.window is not None
        # The steps at once: their jobs queue on the QPU together.
        with ThreadPoolExecutor(max_workers=len(self.steps)) as pool:
            futures = [(step, pool.submit(step.check, self.backend, self.s.qubits, self.run_options()))
                       for step in self.steps]
        for step, fut in futures:
            try:
                m = fut.result()
            except Exception as e:  # a failed check is logged, never fatal
                self.log(f"check {step.name} failed: {e}")
                self.emit("check_failed", step=step.name, error=str(e))
                continue
            st.latest[step.name] = m
            st.out_of_spec[step.name] = not m.in_spec
            self.emit("check", step=step.name, measurement=m.to_json(), calibration_id=st.window.calibration_id)
        f = self.fidelity()
        if f is None:
            return
        age = max(0, self.clock() - st.window.valid_from_ns)
        st.points.append(M.Point(age, f))
        fitted = M.fit(st.points, st.prior)
        self.emit("fidelity", calibration_id=st.window.calibration_id, age_ns=age, fidelity=f,
                  f0=fitted.f0 if fitted else None, tau_ns=fitted.tau_ns if fitted else None)
        if publish and fitted is not None and self.model_moved(st.window, fitted):
            w = Window(st.window.calibration_id, st.window.valid_from_ns, st.window.valid_until_ns,
                       fitted.f0, fitted.tau_ns)
            # An update replaces every window ending after now: the others go again as they are.
            ahead = [x for x in self.windows() if x.calibration_id != w.calibration_id]
            self.client.calibration_update(self.s.name, [x.to_json() for x in [w, *ahead]])
            st.window = w
            self.log(f"calibration {w.calibration_id}: fidelity {f:.4f} at {age / NS:.1f} s; model f0 "
                     f"{w.f0:.4f}, tau {w.tau_ns / NS:.1f} s")
            self.emit("model", window=w.to_json())

    @staticmethod
    def model_moved(w: Window, m: M.Model) -> bool:
        if abs(w.f0 - m.f0) > 1e-3:
            return True
        if (w.tau_ns <= 0) != (m.tau_ns <= 0):
            return True
        return w.tau_ns > 0 and abs(w.tau_ns - m.tau_ns) > 0.02 * w.tau_ns

    # -------------------------------------------------------------- due

    def needed_by(self, now: int) -> tuple[int, list[str], str]:
        """(needed_by_ns, the due steps, why)."""
        st = self.state
        assert st.window is not None
        w = st.window
        candidates: list[tuple[int, list[str], str]] = [(w.valid_until_ns, [s.name for s in self.steps],
                                                         "the window ends")]
        for step in self.steps:
            stale = st.last_run_ns.get(step.name, w.valid_from_ns) + int(step.staleness_s * NS)
            candidates.append((stale, [step.name], f"{step.name} goes stale"))
            if st.out_of_spec.get(step.name):
                soon = now + self.block_ns([step.name]) + int(self.s.out_of_spec_grace_s * NS)
                candidates.append((soon, [step.name], f"the {step.name} check is out of spec"))
        age = M.Model(w.f0, w.tau_ns).age_below(self.s.threshold) if w.tau_ns > 0 else None
        if age is not None:
            candidates.append((w.valid_from_ns + age, [s.name for s in self.steps],
                               f"the predicted fidelity falls below {self.s.threshold}"))
        trend = M.crossing(st.points, self.s.threshold)
        if trend is not None:
            candidates.append((w.valid_from_ns + trend, [s.name for s in self.steps],
                               f"the measured fidelity's trend falls below {self.s.threshold}"))
        t = min(c[0] for c in candidates)
        due: list[str] = []
        whys: list[str] = []
        lead = int(self.s.request_lead_s * NS)
        for c in candidates:
            if c[0] <= t + lead:
                due += [n for n in c[1] if n not in due]
                whys.append(c[2])
        order = [s.name for s in self.steps]
        return t, sorted(due, key=order.index), "; ".join(whys)

    def block_ns(self, names: Sequence[str]) -> int:
        return sum(s.duration_ns for s in self.steps if s.name in names)

    # --------------------------------------------------------------- blocks

    def request(self, needed_by: int, due: list[str], why: str) -> dict[str, Any] | None:
        import qrt_client

        st = self.state
        assert st.window is not None
        step = "/".join(due)
        key = f"qrt-calibration-{self.s.name}-{st.window.calibration_id}-{uuid.uuid4().hex[:12]}"
        duration = self.block_ns(due)
        self.emit("request", step=step, duration_ns=duration, needed_by_ns=needed_by, why=why,
                  model={"f0": st.window.f0, "tau_ns": st.window.tau_ns})
        try:
            block: dict[str, Any] = self.client.calibration_request(
                self.s.name, step, duration, needed_by, key, urgency=self.s.urgency)
        except qrt_client.RpcError as e:
            data = e.data if isinstance(e.data, dict) else {}
            earliest = data.get("earliest")
            self.log(f"calibration.request {step} by {needed_by}: {e.message} ({e.reason}); predicted fidelity "
                     f"then {data.get('predicted_fidelity_at_needed_by')}")
            self.emit("refused", step=step, reason=e.reason, data=data)
            if e.reason != "no_fit" or not isinstance(earliest, dict):
                return None
            block = self.client.calibration_request(self.s.name, step, duration, int(earliest["end_ns"]),
                                                    key + "-later", urgency=self.s.urgency)
        self.log(f"block {block['block_id']} ({step}, {why}) {block['state']} from {block['start_ns']} to "
                 f"{block['end_ns']}, needed by {needed_by}")
        self.emit("granted", block=block)
        return block

    def wait_live(self, block: dict[str, Any]) -> dict[str, Any] | None:
        """The block once it is scheduled or started (a yielding one waits
        for its holders), None when it failed or was given back."""
        give_up = time.monotonic() + max(5.0, (int(block["end_ns"]) - self.clock()) / NS)
        while block["state"] == "yielding" and time.monotonic() < give_up and not self.stop.is_set():
            time.sleep(0.1)
            found = [b for b in self.client.calibration_blocks(self.s.name) if b["block_id"] == block["block_id"]]
            if found:
                block = found[0]
        if block["state"] in ("scheduled", "started"):
            return block
        self.log(f"block {block['block_id']} is {block['state']}: {block.get('reason', '')}")
        self.emit("block_lost", block=block)
        return None

    def calibrate(self, block: dict[str, Any], due: list[str]) -> None:
        import qrt_client

        st = self.state
        assert st.window is not None
        old = st.window
        measured: dict[str, Measurement] = {}
        steps = [step for step in self.steps if step.name in due]
        # Every due step's experiments into the block at once (a failure raises here).
        with ThreadPoolExecutor(max_workers=len(steps)) as pool:
            futures = [(step, pool.submit(step.run, self.backend, self.s.qubits, self.run_options(block["block_id"])))
                       for step in steps]
        for step, fut in futures:
            measured[step.name] = fut.result()
            self.emit("run", step=step.name, measurement=measured[step.name].to_json(), block_id=block["block_id"])
        now = self.clock()
        # The stale end of the old window, measured by the runs: its model's last point.
        merged = dict(st.latest)
        merged.update(measured)
        if len(merged) == len(self.steps):
            rot, ro = over_rotation_and_readout(merged)
            st.points.append(M.Point(max(0, now - old.valid_from_ns),
                                     M.reference_fidelity(rot, ro, self.s.reference_depth)))
        ended = M.fit(st.points, st.prior) or M.Model(old.f0, old.tau_ns)
        try:
            base = self.writer.read(old.calibration_id)
        except (OSError, ValueError) as e:
            self.log(f"the set in force ({old.calibration_id}) cannot be read ({e}); correcting the nominal one")
            base = self.writer.nominal(old.calibration_id)
        cid = next_id(self.s.set_root, self.s.name, *(w.calibration_id for w in self.windows()))
        path = self.writer.write(apply_all(self.writer, base, measured, cid, now))
        start = self.clock() + int(self.s.lead_s * NS)
        cut = Window(old.calibration_id, old.valid_from_ns, start, ended.f0, ended.tau_ns)
        new = Window(cid, start, start + int(self.s.window_s * NS), ended.f0, ended.tau_ns)
        try:
            answer = self.client.calibration_update(self.s.name, [cut.to_json(), new.to_json()],
                                                    block_id=block["block_id"])
        except qrt_client.RpcError as e:
            if e.reason != "illegal_transition":
                raise
            # The block ended before the runs' results came back: the set is
            # measured and written all the same; it goes into force without it.
            self.log(f"block {block['block_id']} ended before its update ({e.message}); updating without it")
            answer = self.client.calibration_update(self.s.name, [cut.to_json(), new.to_json()])
        st.prior = ended
        st.calibrations += 1
        points = len(st.points)
        for name in due:
            st.last_run_ns[name] = start
        self.adopt(new)
        self.log(f"calibration {cid} ({'/'.join(due)}) written to {path}, in force from {start}; model "
                 f"f0 {new.f0:.4f} tau {new.tau_ns / NS:.1f} s (from calibration {old.calibration_id}'s "
                 f"{points} points); {answer.get('replaced', 0)} re-placed, "
                 f"{answer.get('displaced', 0)} displaced")
        self.emit("calibrated", calibration_id=cid, previous=old.calibration_id, steps=due, path=str(path),
                  window=new.to_json(), block=answer.get("block"), replaced=answer.get("replaced"),
                  displaced=answer.get("displaced"))

    # ------------------------------------------------------------ the loop

    def maintain(self) -> None:
        """One pass (the module docstring's 1 to 4)."""
        now = self.clock()
        st = self.state
        if st.window is not None and st.window.valid_from_ns > now:
            # A calibration of ours opens shortly: its checks are the next ones.
            time.sleep((st.window.valid_from_ns - now) / NS)
            now = self.clock()
        w = self.in_force(now)
        if w is None:
            upcoming = [x for x in self.windows() if x.valid_from_ns > now]
            w = upcoming[0] if upcoming else self.bootstrap(now)
            if w.valid_from_ns > now:
                time.sleep((w.valid_from_ns - now) / NS)
        self.adopt(w)
        self.check(self.clock())
        now = self.clock()
        needed_by, due, why = self.needed_by(now)
        if now < needed_by - int(self.s.request_lead_s * NS) or not due:
            return
        block = self.request(max(needed_by, now + self.block_ns(due) + int(self.s.lead_s * NS)), due, why)
        if block is None:
            return
        live = self.wait_live(block)
        if live is None:
            return
        try:
            self.calibrate(live, due)
        except (StepFailed, Exception) as e:  # the calibration in force stays; the block is given back
            self.log(f"calibration in block {live['block_id']} failed: {e}; giving the block back")
            self.emit("calibration_failed", block_id=live["block_id"], error=str(e))
            try:
                self.client.calibration_cancel(live["block_id"])
            except Exception as c:
                self.log(f"calibration.cancel {live['block_id']}: {c}")

    def run(self, passes: int = 0) -> None:
        """Pass after pass, check_interval_s apart, until stop (or passes done)."""
        done = 0
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                self.maintain()
            except Exception as e:  # qrtd restarting, a refused update: the next pass tries again
                self.log(f"pass failed: {type(e).__name__}: {e}")
                self.emit("pass_failed", error=f"{type(e).__name__}: {e}")
            done += 1
            if passes and done >= passes:
                return
            self.stop.wait(max(0.0, self.s.check_interval_s - (time.monotonic() - t0)))

