"""qrt-calibration: the command (qrt-calibration(8))."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any, TextIO

from . import __version__
from .config import DEFAULT_CONFIG, ConfigError, build_step, load
from .service import QpuSettings, Service
from .sets import load_writer

EPILOG = """\
examples:
  qrt-calibration run                          keep every [[qpu]] of /etc/qrtd/calibration.toml calibrated
  qrt-calibration run -c cal.toml --events ev.jsonl
                                               ... and log each action as one JSON line
  qrt-calibration check -c cal.toml            run each step's cheap check once and print the fidelity
  qrt-calibration run -c cal.toml --passes 1   one pass: check, and calibrate if due

The peer needs qrtd's calibration and scheduler roles ([roles] in qrtd.toml).
See qrt-calibration(8); the loop is in README "Calibration".
"""


def make_service(cfg_socket: str, q: QpuSettings, steps: list[Any], log: TextIO,
                 events: TextIO | None) -> Service:
    import qrt_client
    from qrtd_qiskit import QrtdBackend

    client = qrt_client.Client(cfg_socket, timeout=30)
    backend = QrtdBackend(qpu=q.name, client=client)
    writer = load_writer(q.set_writer, q.set_root, q.name)
    return Service(q, steps, client, backend, writer, log=log, events=events)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="qrt-calibration",
        description="The reference calibration service for qrtd: keeps each calibration step of a QPU fresh, "
                    "asks qrtd for calibration blocks before the parameters go stale, runs qiskit-experiments "
                    "into them through the Qiskit backend, writes the new calibration set and publishes it "
                    "with its measured fidelity model.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    ap.add_argument("--version", action="version", version=f"qrt-calibration {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, text in (("run", "keep the QPUs calibrated (the service)"),
                       ("check", "run every step's cheap check once, print the measurements and the fidelity")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("-c", "--config", default=DEFAULT_CONFIG, help=f"the configuration (default {DEFAULT_CONFIG})")
        p.add_argument("--socket", help="qrtd's socket, instead of the configuration's")
        p.add_argument("--qpu", action="append", help="only this [[qpu]] (repeatable)")
        p.add_argument("--events", help="append one JSON line per action to this file")
        if name == "run":
            p.add_argument("--passes", type=int, default=0, help="stop after this many passes (0: until SIGTERM)")
    opt = ap.parse_args(argv)
    try:
        cfg = load(opt.config)
    except ConfigError as e:
        print(f"qrt-calibration: {e}", file=sys.stderr)
        return 2
    qpus = [q for q in cfg.qpus if not opt.qpu or q.name in opt.qpu]
    if not qpus:
        print(f"qrt-calibration: no [[qpu]] named {', '.join(opt.qpu)} in {opt.config}", file=sys.stderr)
        return 2
    events = open(opt.events, "a") if opt.events else None
    services = []
    try:
        for q in qpus:
            steps = [build_step(f"step[{i}]", t) for i, t in enumerate(cfg.steps)]
            services.append(make_service(opt.socket or cfg.socket, q, steps, sys.stderr, events))
    except Exception as e:  # qrtd not reachable, a role missing, a writer that does not import
        print(f"qrt-calibration: {e}", file=sys.stderr)
        return 1
    if opt.command == "check":
        for s in services:
            st = s.in_force(s.clock())
            if st is None:
                print(f"{s.s.name}: no calibration in force")
                continue
            s.adopt(st)
            s.check(s.clock(), publish=False)
            for m in s.state.latest.values():
                print(f"{s.s.name}: calibration {st.calibration_id}: {m.step}: "
                      f"{'in spec' if m.in_spec else 'OUT OF SPEC'} (worst {m.worst:.4g})")
            f = s.fidelity()
            print(f"{s.s.name}: reference fidelity {'unknown' if f is None else f'{f:.4f}'}")
        return 0

    def on_signal(*_: Any) -> None:
        for s in services:
            s.stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threads = [threading.Thread(target=s.run, args=(opt.passes,), name=f"cal-{s.s.name}") for s in services]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
