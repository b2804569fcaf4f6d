"""The command line every endpoint program shares (qpu-aer, qpu-qblox,
qpu-labone): where it listens, its sockets' owner and mode, its bounds, how
long it runs, and its exit summary.  Each program adds its own options,
builds its handler, and calls serve()."""

from __future__ import annotations

import argparse
import grp
import json
import signal
import sys
from typing import Any, Callable

from .handler import Handler
from .server import Endpoint, Options


def add_options(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("endpoint (qrt-endpoint)")
    g.add_argument("--listen", "-l", action="append", default=[], metavar="URI",
                   help="unix:///path or tcp://ADDRESS:PORT (repeatable)")
    g.add_argument("--socket-group", help="group of the UNIX sockets (name or gid), set right after bind")
    g.add_argument("--socket-mode", help="permission bits of the UNIX sockets, octal (e.g. 0660)")
    g.add_argument("--queue", type=int, default=64,
                   help="ARM, DISARM and JOB frames waiting for the stack before ERROR (default 64)")
    g.add_argument("--max-connections", type=int, default=16,
                   help="connections open at once; one more is closed as it is accepted (default 16)")
    g.add_argument("--health-interval-s", type=float, default=2.0,
                   help="how often the instruments are checked while nothing is armed (default 2)")
    g.add_argument("--duration-s", type=float, default=0, help="exit after this many seconds (0: until SIGTERM)")
    g.add_argument("--max-jobs", type=int, default=0, help="exit after answering this many jobs")
    g.add_argument("--verbose", "-v", action="store_true", help="log each job and its answer to stderr")
    g.add_argument("--json", action="store_true", help="print the exit summary as one JSON line")
    g.add_argument("--summary-file", help="also write the JSON summary to this file")


def options(ap: argparse.ArgumentParser, opt: argparse.Namespace) -> Options:
    """The framework's Options from the parsed command line (ap.error on a bad one)."""
    if not opt.listen:
        ap.error("give at least one --listen endpoint")
    if not 1 <= opt.queue <= 10_000:
        ap.error(f"--queue {opt.queue}: give 1..10000")
    if not 2 <= opt.max_connections <= 1024:
        ap.error(f"--max-connections {opt.max_connections}: give 2..1024 (an agent uses two)")
    if not 0.1 <= opt.health_interval_s <= 3600:
        ap.error(f"--health-interval-s {opt.health_interval_s}: give 0.1..3600")
    if opt.max_jobs < 0 or opt.duration_s < 0:
        ap.error("--max-jobs and --duration-s are 0 or more")
    mode = gid = None
    if opt.socket_mode is not None:
        try:
            mode = int(opt.socket_mode, 8)
            if not 0 <= mode <= 0o777:
                raise ValueError
        except ValueError:
            ap.error(f'--socket-mode "{opt.socket_mode}": give octal permission bits, 0 to 0777 (e.g. 0660)')
    if opt.socket_group is not None:
        try:
            gid = int(opt.socket_group) if opt.socket_group.isdigit() else grp.getgrnam(opt.socket_group).gr_gid
        except KeyError:
            ap.error(f'--socket-group: no group "{opt.socket_group}"')
    return Options(listen=list(opt.listen), socket_mode=mode, socket_group=gid, queue=opt.queue,
                   max_connections=opt.max_connections, health_interval_s=opt.health_interval_s,
                   verbose=opt.verbose)


def serve(handler: Handler, name: str, version: str, opt: argparse.Namespace, eopt: Options,
          text_summary: Callable[[dict[str, Any]], str] | None = None) -> int:
    """Serves until SIGTERM, SIGINT, --duration-s or --max-jobs; prints the
    summary.  Exit status 0, or 1 when a socket cannot be opened, 2 for a
    bad address."""
    ep = Endpoint(handler, name, version, eopt)
    ep.max_jobs = opt.max_jobs
    try:
        ep.open()
    except (OSError, ValueError) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 1 if isinstance(e, OSError) else 2

    def on_signal(*_: Any) -> None:
        ep.stop()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ep.start()
    ep.run(opt.duration_s)
    summary = ep.summary()
    if opt.summary_file:
        with open(opt.summary_file, "w") as f:
            f.write(json.dumps(summary) + "\n")
    if opt.json:
        print(json.dumps(summary), flush=True)
    else:
        line = text_summary(summary) if text_summary else (
            f"{summary['jobs']} jobs, {summary['results']} results, {summary['errors_sent']} errors sent, "
            f"{summary['connections']} connections; refused {summary['refused']}, out-of-window "
            f"{summary['out_of_window']}, calibration-mismatch {summary['calibration_mismatch']}, unreachable "
            f"{summary['unreachable']}")
        print(f"{name}: {line}", flush=True)
    return 0
