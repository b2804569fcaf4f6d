"""qpu-aer's command line: the framework's options (qrt_endpoint.cli) and
the simulator's.  See qpu-aer(1)."""

from __future__ import annotations

import argparse
import sys
import time

from qrt_endpoint import cli

from . import VERSION
from .handler import AerHandler, Config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="qpu-aer",
        description="A QPU control endpoint for qrtd that runs each job's OpenQASM 3 programs on qiskit-aer and "
                    "answers with the real counts: wire version 1 (JOB at T) and 2 (ARM ahead of T, FIRE at T).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n"
               "  qpu-aer --listen unix:///run/qrtd-qpu/qpu0.sock --qubits 3\n"
               "  qpu-aer --listen unix:///tmp/q.sock --period-ns 60000000000 --blackout-ns 5000000000\n"
               "  qpu-aer --listen tcp://127.0.0.1:7000 --seed 1 --duration-s 60 --json\n"
               "See qpu-aer(1); the job envelope is in qrtd(8), Job payloads.")
    cli.add_options(ap)
    g = ap.add_argument_group("the simulator")
    g.add_argument("--qubits", type=int, default=32, help="qubits of this QPU: wider circuits are refused "
                                                          "(default 32)")
    g.add_argument("--max-shots", type=int, default=100_000, help="most shots per job (default 100000)")
    g.add_argument("--calibration-id", type=int, default=0,
                   help="the current calibration id; others get ERROR (0: accept any)")
    g.add_argument("--period-ns", type=int, default=0,
                   help="follow a periodic calibration schedule (the [[qpu]]'s period_ns): a job must carry the "
                        "id of the window in force at its arrival (version 1) or its fire_at (version 2)")
    g.add_argument("--blackout-ns", type=int, default=0, help="the schedule's blackout_ns")
    g.add_argument("--phase-ns", type=int, default=0, help="the schedule's phase_ns")
    g.add_argument("--seed", type=int, help="seed_simulator for reproducible counts")
    g.add_argument("--max-operations", type=int, default=1_000_000,
                   help="operations one job's circuits may hold with their for loops unrolled, counted before "
                        "anything runs (default 1000000)")
    g.add_argument("--run-margin-s", type=float, default=10.0,
                   help="an ARM, or a run, takes at most the job's duration_ns plus this long, then the "
                        "simulator process is stopped (default 10)")
    g.add_argument("--max-armed", type=int, default=16, help="jobs held armed at once (version 2; default 16)")
    g.add_argument("--horizon-s", type=float, default=60.0,
                   help="how far ahead of its fire_at an ARM is taken (version 2; default 60)")
    g.add_argument("--min-lead-ms", type=float, default=100.0,
                   help="the least time between ARM and fire_at this endpoint states (version 2; default 100)")
    d = ap.add_argument_group("the drifting device (qpu_aer_drift)")
    d.add_argument("--calibration-dir", metavar="DIR",
                   help="this QPU's calibration sets (<root>/<qpu>: <id>/aer.json, written by the calibration "
                        "service): each job runs under the set of its calibration id, its X over-rotation and "
                        "readout error those of the drift at its start; a job whose set is missing is refused")
    d.add_argument("--drift-x-per-hour", type=float, default=0.0,
                   help="the X gain's drift per hour of device time (e.g. 0.01: 1 %% an hour; default 0)")
    d.add_argument("--drift-readout-per-hour", type=float, default=0.0,
                   help="the readout discriminator's drift per hour of device time, in half blob separations "
                        "(default 0)")
    d.add_argument("--drift-time-scale", type=float, default=1.0,
                   help="device seconds per wall second, from qpu-aer's start (default 1)")
    ap.add_argument("--version", action="version", version=f"qpu-aer {VERSION}")
    opt = ap.parse_args(argv)
    eopt = cli.options(ap, opt)
    if not 1 <= opt.qubits <= 1024:
        ap.error(f"--qubits {opt.qubits}: give 1..1024")
    if not 1 <= opt.max_shots <= 1_000_000:
        ap.error(f"--max-shots {opt.max_shots}: give 1..1000000 (what the wire carries)")
    if opt.period_ns < 0 or (opt.period_ns and not 0 <= opt.blackout_ns < opt.period_ns) or \
            (opt.period_ns and not 0 <= opt.phase_ns < opt.period_ns):
        ap.error("--period-ns must be > 0 with --blackout-ns and --phase-ns in [0, period)")
    if not 1 <= opt.max_operations <= 10**12:
        ap.error(f"--max-operations {opt.max_operations}: give 1..10^12")
    if not 0.1 <= opt.run_margin_s <= 86400:
        ap.error(f"--run-margin-s {opt.run_margin_s}: give 0.1..86400 seconds")
    if not 1 <= opt.max_armed <= 1024:
        ap.error(f"--max-armed {opt.max_armed}: give 1..1024")
    if not 0.001 <= opt.horizon_s <= 86400 or not 0 <= opt.min_lead_ms <= 3_600_000:
        ap.error("--horizon-s is 0.001..86400 and --min-lead-ms 0..3600000")
    drift = None
    if opt.calibration_dir:
        try:
            import qpu_aer_drift
            drift = qpu_aer_drift.Drift(x_gain_per_hour=opt.drift_x_per_hour,
                                        readout_shift_per_hour=opt.drift_readout_per_hour,
                                        time_scale=opt.drift_time_scale, origin_ns=time.time_ns())
        except ImportError as e:
            ap.error(f"--calibration-dir needs qpu-aer's drift model, qpu_aer_drift: {e}")
        except ValueError as e:
            ap.error(str(e))
    elif opt.drift_x_per_hour or opt.drift_readout_per_hour:
        ap.error("--drift-x-per-hour and --drift-readout-per-hour need --calibration-dir (the sets that "
                 "correct the drift)")
    cfg = Config(qubits=opt.qubits, max_shots=opt.max_shots, calibration_id=opt.calibration_id,
                 period_ns=opt.period_ns, blackout_ns=opt.blackout_ns, phase_ns=opt.phase_ns, seed=opt.seed,
                 max_operations=opt.max_operations, run_margin_s=opt.run_margin_s, max_armed=opt.max_armed,
                 horizon_ns=int(opt.horizon_s * 1e9), min_lead_ns=int(opt.min_lead_ms * 1e6),
                 calibration_dir=opt.calibration_dir or "", drift=drift)
    try:
        handler = AerHandler(cfg)
    except RuntimeError as e:
        print(f"qpu-aer: {e}", file=sys.stderr)
        return 1
    try:
        return cli.serve(handler, "qpu-aer", VERSION, opt, eopt)
    finally:
        handler.close()


if __name__ == "__main__":
    sys.exit(main())
