"""qpu-qblox's command line: the endpoint framework's options, the
calibration directory, and the Cluster (its address, or the dummy).  See
qpu-qblox(8)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from qrt_endpoint import cli

from . import __version__
from .calibration import DEFAULT_ROOT, CalibrationStore
from .stack import DEFAULT_HORIZON_NS, DEFAULT_MIN_LEAD_NS, QbloxStack

CONNECT_RETRY_S = 5.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="qpu-qblox",
        description="A qrtd QPU endpoint for a Qblox Cluster: ARM compiles the job's OpenQASM 3 with "
                    "qblox-scheduler against the calibration set of its id, uploads to the sequencers and arms "
                    "them; FIRE starts them; RESULT counts through the set's thresholds.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n"
               "  qpu-qblox --listen unix:///run/qpu-qblox/qpu0.sock --qpu qpu0 --cluster 192.168.0.2\n"
               "  qpu-qblox --listen unix:///tmp/q.sock --calibration-dir /tmp/cal --dummy 2:QCM_RF,8:QRM_RF\n"
               "See qpu-qblox(8).")
    cli.add_options(ap)
    g = ap.add_argument_group("the Cluster")
    g.add_argument("--qpu", default="qpu0", help="the QPU's name: its calibration sets are in "
                                                 "CALIBRATION_DIR/QPU/<id>/ (default qpu0)")
    g.add_argument("--calibration-dir", default=str(DEFAULT_ROOT),
                   help=f"the calibration sets' root (default {DEFAULT_ROOT})")
    where = g.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster", metavar="ADDRESS", help="the Cluster's IP address or host name")
    where.add_argument("--dummy", metavar="MODULES",
                       help="qblox-instruments' dummy Cluster with these modules, SLOT:TYPE,... "
                            "(TYPE: QCM, QCM_RF, QRM, QRM_RF), e.g. 2:QCM_RF,4:QCM_RF,6:QCM,8:QRM_RF")
    g.add_argument("--cluster-name", default="cluster0",
                   help="the Cluster's name in the calibration sets' hardware configuration (default cluster0)")
    g.add_argument("--cluster-timeout-s", type=float, default=10.0,
                   help="the driver's timeout for one call to the Cluster (default 10)")
    g.add_argument("--dummy-power-file", metavar="PATH",
                   help="with --dummy: the dummy is off while PATH does not exist (its calls fail as an "
                        "unreachable Cluster's)")
    g.add_argument("--dummy-journal", metavar="PATH",
                   help="with --dummy: append each arm, start and stop of a sequencer, with its time, state and "
                        "program, to PATH (JSON lines)")
    g.add_argument("--dummy-acquisitions", metavar="PATH",
                   help='with --dummy: binned acquisitions the dummy returns, {"module8.seq0": {"0": [[I, Q], '
                        '...]}}, read as each sequencer is armed')
    g.add_argument("--horizon-s", type=float, default=DEFAULT_HORIZON_NS / 1e9,
                   help=f"how far ahead of its fire_at an ARM is taken (default {DEFAULT_HORIZON_NS / 1e9:g})")
    g.add_argument("--min-lead-ms", type=float, default=DEFAULT_MIN_LEAD_NS / 1e6,
                   help=f"the least lead this endpoint states (default {DEFAULT_MIN_LEAD_NS / 1e6:g})")
    ap.add_argument("--print-device", type=int, metavar="ID",
                    help="print the [qpu.device] sub-table of qrtd.toml that calibration set ID implies (qubits, "
                         "basis gates, coupling, durations) and exit")
    ap.add_argument("--version", action="version", version=f"qpu-qblox {__version__}")
    if argv is None:
        argv = sys.argv[1:]
    if "--print-device" in argv:   # no endpoint or Cluster options needed: read the set and print
        pp = argparse.ArgumentParser(prog="qpu-qblox")
        pp.add_argument("--print-device", type=int, required=True)
        pp.add_argument("--qpu", default="qpu0")
        pp.add_argument("--calibration-dir", default=str(DEFAULT_ROOT))
        po, _ = pp.parse_known_args(argv)
        return print_device(po.calibration_dir, po.qpu, po.print_device)
    opt = ap.parse_args(argv)
    eopt = cli.options(ap, opt)
    if not 0.1 <= opt.cluster_timeout_s <= 600:
        ap.error(f"--cluster-timeout-s {opt.cluster_timeout_s}: give 0.1..600")
    if opt.cluster and (opt.dummy_power_file or opt.dummy_journal or opt.dummy_acquisitions):
        ap.error("--dummy-power-file, --dummy-journal and --dummy-acquisitions go with --dummy")
    if not 0.001 <= opt.horizon_s <= 86400 or not 0 <= opt.min_lead_ms <= 3_600_000:
        ap.error("--horizon-s is 0.001..86400 and --min-lead-ms 0..3600000")
    if not os.path.isdir(os.path.join(opt.calibration_dir, opt.qpu)):
        print(f"qpu-qblox: warning: no {os.path.join(opt.calibration_dir, opt.qpu)} yet: every ARM is refused "
              "calibration_unknown until the calibration service writes a set", file=sys.stderr)

    connect: Any
    if opt.dummy:
        from .dummy import DummyLab, parse_modules
        try:
            modules = parse_modules(opt.dummy)
        except ValueError as e:
            ap.error(f"--dummy: {e}")
        connect = DummyLab(opt.cluster_name, modules, opt.dummy_power_file, opt.dummy_journal,
                           opt.dummy_acquisitions).connect
    else:
        def connect() -> Any:
            from qblox_instruments import Cluster
            cluster = Cluster(opt.cluster_name, identifier=opt.cluster)
            transport = getattr(cluster, "_transport", None)
            if transport is not None and hasattr(transport, "timeout"):
                transport.timeout = opt.cluster_timeout_s
            return cluster
    cluster = None
    said = ""
    while cluster is None:   # until the Cluster answers (it may come up after this host); SIGTERM ends it
        try:
            cluster = connect()
        except Exception as e:  # the driver's errors are of several types
            why = f"{type(e).__name__}: {e}"
            if why != said:
                print(f"qpu-qblox: cannot connect to the Cluster ({why}); trying again every "
                      f"{CONNECT_RETRY_S:g} s, not listening until then", file=sys.stderr, flush=True)
                said = why
            time.sleep(CONNECT_RETRY_S)
    stack = QbloxStack(cluster, CalibrationStore(opt.calibration_dir, opt.qpu),
                       horizon_ns=int(opt.horizon_s * 1e9), min_lead_ns=int(opt.min_lead_ms * 1e6),
                       reconnect=connect)
    try:
        return cli.serve(stack, "qpu-qblox", __version__, opt, eopt)
    finally:
        stack.close()


def print_device(root: str, qpu: str, calibration_id: int) -> int:
    from qrt_endpoint import device
    from qrt_endpoint.handler import ArmRefused

    from .calibration import device_facts
    try:
        cal = CalibrationStore(root, qpu).load(calibration_id)
    except ArmRefused as e:
        print(f"qpu-qblox: --print-device: {e.detail}", file=sys.stderr)
        return 1
    print(device.toml(device_facts(cal), f"{os.path.join(root, qpu, str(calibration_id))} (qpu-qblox --print-device)"),
          end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
