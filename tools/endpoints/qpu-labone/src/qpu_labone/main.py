"""qpu-labone's command line: the endpoint framework's options, the
calibration directory, and the instruments (the lab's DeviceSetup, or
LabOne Q's emulator).  See qpu-labone(8)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

from qrt_endpoint import cli

from . import __version__
from .calibration import DEFAULT_ROOT, CalibrationStore
from .lab import Lab, load_setup
from .stack import DEFAULT_HORIZON_NS, DEFAULT_MIN_LEAD_NS, LabOneStack

CONNECT_RETRY_S = 5.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="qpu-labone",
        description="A qrtd QPU endpoint for Zurich Instruments through LabOne Q: ARM imports the job's OpenQASM 3 "
                    "with LabOne Q against the calibration set of its id, compiles, uploads and arms, holding the "
                    "start trigger; FIRE releases it; RESULT counts through the set's thresholds.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n"
               "  qpu-labone --listen unix:///run/qpu-labone/qpu0.sock --qpu qpu0 --device-setup /etc/qpu-labone/setup.json\n"
               "  qpu-labone --listen unix:///tmp/q.sock --calibration-dir /tmp/cal --emulate\n"
               "See qpu-labone(8).")
    cli.add_options(ap)
    g = ap.add_argument_group("the instruments")
    g.add_argument("--qpu", default="qpu0", help="the QPU's name: its calibration sets are in "
                                                 "CALIBRATION_DIR/QPU/<id>/ (default qpu0)")
    g.add_argument("--calibration-dir", default=str(DEFAULT_ROOT),
                   help=f"the calibration sets' root (default {DEFAULT_ROOT})")
    g.add_argument("--device-setup", metavar="PATH",
                   help="the lab's DeviceSetup in LabOne Q's serialization (Data Server, instruments, wiring)")
    g.add_argument("--emulate", action="store_true",
                   help="LabOne Q's emulator instead of the Data Server and the instruments (without "
                        "--device-setup: the 3-qubit example setup, PQSC + SHFQC+ + HDAWG)")
    g.add_argument("--emulate-power-file", metavar="PATH",
                   help="with --emulate: the emulated instruments are off while PATH does not exist")
    g.add_argument("--emulate-journal", metavar="PATH",
                   help="with --emulate: append each compiled experiment armed (job, calibration id, seqc sources, "
                        "waveforms, command tables, oscillator frequencies) to PATH (JSON lines)")
    g.add_argument("--horizon-s", type=float, default=DEFAULT_HORIZON_NS / 1e9,
                   help=f"how far ahead of its fire_at an ARM is taken (default {DEFAULT_HORIZON_NS / 1e9:g})")
    g.add_argument("--min-lead-ms", type=float, default=DEFAULT_MIN_LEAD_NS / 1e6,
                   help=f"the least lead this endpoint states (default {DEFAULT_MIN_LEAD_NS / 1e6:g})")
    ap.add_argument("--print-device", type=int, metavar="ID",
                    help="print the [qpu.device] sub-table of qrtd.toml that calibration set ID implies (qubits, "
                         "basis gates, coupling, durations) and exit")
    ap.add_argument("--version", action="version", version=f"qpu-labone {__version__}")
    if argv is None:
        argv = sys.argv[1:]
    if "--print-device" in argv:   # no endpoint or instrument options needed: read the set and print
        pp = argparse.ArgumentParser(prog="qpu-labone")
        pp.add_argument("--print-device", type=int, required=True)
        pp.add_argument("--qpu", default="qpu0")
        pp.add_argument("--calibration-dir", default=str(DEFAULT_ROOT))
        po, _ = pp.parse_known_args(argv)
        return print_device(po.calibration_dir, po.qpu, po.print_device)
    opt = ap.parse_args(argv)
    eopt = cli.options(ap, opt)
    if not opt.device_setup and not opt.emulate:
        ap.error("give --device-setup (the lab's instruments) or --emulate")
    if (opt.emulate_power_file or opt.emulate_journal) and not opt.emulate:
        ap.error("--emulate-power-file and --emulate-journal go with --emulate")
    if not 0.001 <= opt.horizon_s <= 86400 or not 0 <= opt.min_lead_ms <= 3_600_000:
        ap.error("--horizon-s is 0.001..86400 and --min-lead-ms 0..3600000")
    logging.getLogger("laboneq").setLevel(logging.WARNING)
    if opt.device_setup:
        try:
            setup = load_setup(opt.device_setup)
        except (OSError, ValueError) as e:
            print(f"qpu-labone: --device-setup: {e}", file=sys.stderr)
            return 2
    else:
        from .calibration import example
        _, setup = example()
    if not os.path.isdir(os.path.join(opt.calibration_dir, opt.qpu)):
        print(f"qpu-labone: warning: no {os.path.join(opt.calibration_dir, opt.qpu)} yet: every ARM is refused "
              "calibration_unknown until the calibration service writes a set", file=sys.stderr)
    lab = Lab(setup, opt.emulate, opt.emulate_power_file, opt.emulate_journal)
    session: Any = None
    said = ""
    while session is None:   # until the instruments answer; SIGTERM ends it
        try:
            session = lab.connect()
        except Exception as e:  # LabOne Q's and the transport's errors
            why = f"{type(e).__name__}: {e}"
            if why != said:
                print(f"qpu-labone: cannot connect ({why}); trying again every {CONNECT_RETRY_S:g} s, not "
                      "listening until then", file=sys.stderr, flush=True)
                said = why
            time.sleep(CONNECT_RETRY_S)
    stack = LabOneStack(session, CalibrationStore(opt.calibration_dir, opt.qpu), horizon_ns=int(opt.horizon_s * 1e9),
                        min_lead_ns=int(opt.min_lead_ms * 1e6), reconnect=lab.connect, probe=lab.probe,
                        observe=lab.record if opt.emulate_journal else None)
    try:
        return cli.serve(stack, "qpu-labone", __version__, opt, eopt)
    finally:
        stack.close()


def print_device(root: str, qpu: str, calibration_id: int) -> int:
    from qrt_endpoint import device
    from qrt_endpoint.handler import ArmRefused

    from .calibration import device_facts
    try:
        cal = CalibrationStore(root, qpu).load(calibration_id)
    except ArmRefused as e:
        print(f"qpu-labone: --print-device: {e.detail}", file=sys.stderr)
        return 1
    print(device.toml(device_facts(cal), f"{os.path.join(root, qpu, str(calibration_id))} (qpu-labone --print-device)"),
          end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
