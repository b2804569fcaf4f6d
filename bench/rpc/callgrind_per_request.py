#!/usr/bin/env python3
"""Instructions per request of the control socket, by callgrind: repeatable
where timings are not (a shared machine).

    bench/rpc/callgrind_per_request.py BEFORE/rpc-vs-echo AFTER/rpc-vs-echo [...]
        [--rtt-count 1000] [--pipelined-count 10000]

Runs each rpc-vs-echo binary under `valgrind --tool=callgrind`, once for
agent.hello and once for slots.query (`--only`, one round, no dispatch
part), and reads the call graph: for the event-loop thread, the
instructions of event_loop::run per request line (everything the server
does in user space for a request: reading, the engine, the handler, the
reply, the loop's own work) and of engine::handle_line per line, and the
parse and handler costs inside it.  The kernel's share (the syscalls) is not
counted; it is the same for every binary of one run.  Prints a table, the
change of each figure against the first binary, and ends with ONE JSON line.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

FIGURES = [
    # (name, pattern of the callee whose inclusive cost is summed)
    ("server thread", r"^qrt::event_loop::run\(\)"),
    ("engine::handle_line", r"^qrt::rpc::engine::handle_line\(std::basic_string_view<char, std::char_traits<char> >, qrt::rpc::session&, std::"),
    ("reading the line", r"^(qrt::rpc::read_line\(|nlohmann::json_abi_v3_11_2::basic_json<.*>::parse<|qrt::rpc::nesting_exceeds\()"),
    ("the request's checks and handler", r"^qrt::rpc::engine::write_request\("),
    ("the per-line charge", r"^qrt::rpc::engine::admit_line\("),
]
LINES = r"^qrt::rpc::engine::handle_line\(std::basic_string_view<char, std::char_traits<char> >, qrt::rpc::session&, std::"


def parse(path):
    """(calls, inclusive Ir) per callee name, summed over every call site."""
    names, calls, incl = {}, Counter(), Counter()
    cfn, pending = None, None

    def name_of(tok):
        m = re.match(r"\((\d+)\)(?: (.*))?", tok)
        if not m:
            return tok
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), m.group(1))

    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("fn="):
                name_of(line[3:].rstrip("\n"))
            elif line.startswith("cfn="):
                cfn = name_of(line[4:].rstrip("\n"))
            elif line.startswith("calls="):
                pending = int(line[6:].split()[0])
            elif pending is not None and line[:1] in "0123456789+-*":
                parts = line.split()
                if len(parts) >= 2:
                    calls[cfn] += pending
                    incl[cfn] += int(parts[1])
                pending = None
    return calls, incl


def summed(calls, incl, pattern):
    rx = re.compile(pattern)
    n = c = 0
    for fn in incl:
        if rx.search(fn):
            n += calls[fn]
            c += incl[fn]
    return n, c


def measure(binary, method, args, workdir):
    out = os.path.join(workdir, f"cg.{os.getpid()}.{len(os.listdir(workdir))}.out")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary, "--rounds", "1",
           "--rtt-count", str(args.rtt_count), "--pipelined-count", str(args.pipelined_count),
           "--skip-dispatch", "--only", method]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    calls, incl = parse(out)
    lines, _ = summed(calls, incl, LINES)
    if lines == 0:
        sys.exit(f"{binary}: no engine::handle_line calls in the profile (built without symbols?)")
    fig = {name: summed(calls, incl, pat)[1] / lines for name, pat in FIGURES}
    fig["lines"] = lines
    return fig


def label(binary):
    """The checkout a build/.../rpc-vs-echo belongs to, else the path."""
    parts = os.path.abspath(binary).split(os.sep)
    return parts[parts.index("build") - 1] if "build" in parts[1:] else binary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binaries", nargs="+", help="rpc-vs-echo binaries; the first is the reference")
    ap.add_argument("--rtt-count", type=int, default=1000)
    ap.add_argument("--pipelined-count", type=int, default=10000)
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="qrt-callgrind-") as d:
        for b in args.binaries:
            results[b] = {m: measure(b, m, args, d) for m in ("hello", "query")}
    ref = args.binaries[0]
    for method in ("hello", "query"):
        print(f"\n{'agent.hello' if method == 'hello' else 'slots.query'}: instructions per request")
        print(f"{'':34}" + "".join(f"{label(b):>16}" for b in args.binaries))
        for name, _ in FIGURES:
            row = f"{name:34}"
            for b in args.binaries:
                v = results[b][method][name]
                base = results[ref][method][name]
                change = "" if b == ref or base == 0 else f" {100 * (v - base) / base:+.0f}%"
                row += f"{v:>11,.0f}{change:>5}"
            print(row)
    print(json.dumps({"bench": "rpc_callgrind_per_request", "binaries": args.binaries,
                      "per_request": {b: results[b] for b in args.binaries}}))


if __name__ == "__main__":
    main()
