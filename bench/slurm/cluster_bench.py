#!/usr/bin/env python3
"""bench/slurm/cluster_bench.py: what spank_qrt.so costs a multi-node step.

One command (root, Slurm and munge installed, the tree built):

    python3 bench/slurm/cluster_bench.py --build build [--rounds 15]

It starts the cluster of tests/integration/slurm/slurm_cluster.py (network
namespaces on a bridge: ctl, cn1, cn2, qpu1, qpu2; qrtd untuned on the QPU
nodes) and measures, as user nobody from the login node ctl, the wall time
of three -N2 steps, interleaved, --rounds times each:

  plain     srun -N2 -p compute true, no plugin in plugstack.conf
  remote    srun -N2 -p compute --qpu-duration=1ms true, the plugin with
            socket=tcp://qpu1:7071 (srun reserves once over TCP with
            MUNGE, releases at its exit)
  common    srun -N2 -p qpu --qpu-duration=1ms true, the plugin with
            qrtd_node=tcp://%n:7071 (the common start: a query, a hold and
            a release on each of the two QPU nodes' qrtd)

p50 and p95 of each, and each plugin variant's p50 against plain's, in one
run.  Prints the load average before and after (a busy machine moves every
number; the ratios less).  Ends with one JSON line.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration", "slurm"))
from slurm_bench import pct, set_env  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="example: python3 bench/slurm/cluster_bench.py "
                                        "--build build --rounds 15")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    set_env(a.build)
    import slurm_cluster
    why = slurm_cluster.why_not_here()
    if why:
        print(f"cannot run here: {why}", file=sys.stderr)
        return 77
    load_before = os.getloadavg()
    cl = slurm_cluster.Cluster()
    plugins = {
        "plain": (None, ["-p", "compute"]),
        "remote": (["socket=tcp://qpu1:7071", "setup_margin=1s"],
                   ["-p", "compute", "--qpu-duration=1ms"]),
        "common": (["socket=tcp://qpu1:7071", "qrtd_node=tcp://%n:7071",
                    "qrtd_nodes=qpu[1-2]", "setup_margin=1s"],
                   ["-p", "qpu", "--qpu-duration=1ms"]),
    }
    times = {k: [] for k in plugins}
    failed = {k: 0 for k in plugins}
    try:
        cl.start()
        for _ in range(a.rounds):
            for name, (plug, args) in plugins.items():
                cl.point_plugin(plug)
                t0 = time.perf_counter()
                r = cl.run("ctl", ["srun", "-N2", "-t", "1"] + args + ["true"], timeout=120)
                dt = (time.perf_counter() - t0) * 1e3
                if r.returncode != 0:
                    failed[name] += 1
                    print(f"{name}: {r.stderr.strip()[:300]}", file=sys.stderr)
                    continue
                times[name].append(dt)
    finally:
        cl.stop()
    load_after = os.getloadavg()
    out = {k: {"p50_ms": pct(v, 0.5), "p95_ms": pct(v, 0.95), "n": len(v), "failed": failed[k]}
           for k, v in times.items()}
    base = out["plain"]["p50_ms"]
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print(f"{'srun -N2 (ms)':<34} {'p50':>8} {'p95':>8} {'x plain':>8} {'n':>4}")
    for k, v in out.items():
        ratio = v["p50_ms"] / base if base and v["p50_ms"] else float("nan")
        v["p50_over_plain"] = ratio
        print(f"{k:<34} {v['p50_ms'] or 0:8.1f} {v['p95_ms'] or 0:8.1f} {ratio:8.2f} {v['n']:4d}")
    print(json.dumps({"bench": "slurm_cluster", "rounds": a.rounds, "srun_N2": out,
                      "loadavg_before": load_before, "loadavg_after": load_after}))
    return 0 if not any(failed.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
