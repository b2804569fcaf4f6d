#!/usr/bin/env python3
"""bench/slurm: what spank_qrt.so costs a Slurm job, on a real Slurm.

One command (root, Slurm and munge installed, the tree built):

    flock /tmp/qrt-host.lock python3 bench/slurm/slurm_bench.py --build build

It starts the lab of tests/integration/slurm (munged, slurmctld, slurmd,
qpu-sim, qrtd as root) and measures, as user nobody:

  1. job start: the wall time of `srun true`, the same job three ways,
     interleaved: no plugin in plugstack.conf (the reference), the plugin
     loaded but not asked, and `--qpu-duration=1ms` (reserve at start,
     release at the end).  p50 and p95 of each, and the plugin's cost.
  2. reservations per second through the plugin path: W workers each
     running `srun --qpu-duration=1ms true` back to back for D seconds
     (each srun that exits 0 made and released one reservation), against
     plain `srun true` from the same workers (steps per second).
  3. scancel to slot free: a running job holds a slot; the time from just
     before `scancel` to the release as qrtd recorded it (the reservation's
     updated_ns, CLOCK_REALTIME on the same host).

and compares 3 with the polling intervals the public QPU integrations
publish (a poller sees a change after half its interval on average).
Ends with one JSON line.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration", "slurm"))

# Published polling intervals of the public QPU integrations for Slurm.
PUBLISHED_POLL_S = {
    # qiskit-community/qrmi examples/qrmi/python/pasqal_local/example.py:
    # the job waits for its task with task_status() and time.sleep(1).
    "qrmi_task_status_example": 1.0,
    # qrmi-community/slurm_poller_daemon_example poller/config.json.example:
    # "poll_interval": 60 (the backend's state into Slurm dynamic licenses).
    "qrmi_slurm_license_poller": 60.0,
}


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    k = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[k]


def set_env(build):
    b = os.path.abspath(build)
    env = {
        "QRTD": f"{b}/agent/qrtd", "QPU_SIM": f"{b}/tools/endpoints/qpu-sim/qpu-sim",
        "QRTCTL": f"{b}/tools/operator/qrtctl/qrtctl", "SPANK_QRT": f"{b}/tools/integrations/slurm/spank_qrt.so",
        "JOB_EXAMPLE": f"{b}/tools/integrations/slurm/qrt-slurm-job-example",
        "QRT_TEST_SERVER": f"{b}/tests/integration/clients/qrt-test-server",
        "QRT_SLURM_TOOLS": f"{ROOT}/tools/integrations/slurm", "QRT_PYTHON_DIR": f"{ROOT}/tools/clients/python/src",
    }
    for k, v in env.items():
        os.environ.setdefault(k, v)


def timed_srun(lab, args):
    t0 = time.perf_counter()
    r = lab.run(["srun", "-t", "1"] + args + ["true"], timeout=120)
    return time.perf_counter() - t0, r


def job_start(lab, n):
    variants = {"none": (None, []), "loaded": (lab.sock, []),
                "qpu": (lab.sock, ["--qpu-duration=1ms"])}
    times = {k: [] for k in variants}
    failures = {k: 0 for k in variants}
    for _ in range(n):
        for name, (plug, args) in variants.items():
            lab.point_plugin_at(plug)
            dt, r = timed_srun(lab, args)
            if r.returncode != 0:
                failures[name] += 1
                continue
            times[name].append(dt * 1e3)
    lab.point_plugin_at(lab.sock)
    out = {k: {"p50": pct(v, 0.5), "p95": pct(v, 0.95), "n": len(v), "failed": failures[k]}
           for k, v in times.items()}
    return out


def throughput(lab, workers, seconds, args):
    done = [0] * workers
    failed = [0] * workers
    stop = time.monotonic() + seconds

    def work(i):
        while time.monotonic() < stop:
            r = lab.run(["srun", "-t", "1"] + args + ["true"], timeout=120)
            if r.returncode == 0:
                done[i] += 1
            else:
                failed[i] += 1
    t0 = time.monotonic()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - t0
    return sum(done) / elapsed, sum(done), sum(failed)


def scancel_to_free(lab, reps):
    from slurm_lab import wait_for
    out = []
    for i in range(reps):
        path = os.path.join(lab.jobs, f"hold{i}.sh")
        with open(path, "w") as f:
            f.write("#!/bin/sh\nenv | grep '^QRT_RESERVATION_ID='\nsleep 300\n")
        os.chmod(path, 0o755)
        log = os.path.join(lab.jobs, f"hold{i}.out")
        r = lab.run(["sbatch", "--parsable", "-t", "3", "-o", log, "--qpu-duration=5ms",
                     "--qpu-not-before=+120s", path])
        job = int(r.stdout.strip().split(";")[0])

        def rid():
            try:
                with open(log) as f:
                    for line in f:
                        if line.startswith("QRT_RESERVATION_ID="):
                            return int(line.split("=", 1)[1])
            except OSError:
                return None
        res = wait_for(rid, 60, 0.1)
        if not res:
            raise RuntimeError(f"job {job} never held a slot")
        with lab.client() as c:
            t0 = time.time_ns()
            subprocess.run(["scancel", str(job)], env=lab.env, check=True)
            st = wait_for(lambda: (lambda s: s["state"] == "released" and s)(c.jobs_status(res)),
                          30, 0.002)
        if not st:
            raise RuntimeError(f"reservation {res} of job {job} was not released")
        out.append((st["updated_ns"] - t0) / 1e6)
        lab.wait_job_done(job)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=20, help="sruns per job-start variant")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--cancels", type=int, default=5)
    args = ap.parse_args()
    set_env(args.build)
    import slurm_lab
    why = slurm_lab.why_not_here()
    if why:
        print(f"slurm_bench: cannot run here: {why}", file=sys.stderr)
        return 2
    lab = slurm_lab.Lab()
    try:
        lab.start()
        print(f"lab up: node {lab.node}, {lab.nqpus} QPU(s) through qrtd", flush=True)
        start = job_start(lab, args.runs)
        for k, v in start.items():
            print(f"job start {k:7s}: p50 {v['p50']:.1f} ms  p95 {v['p95']:.1f} ms  "
                  f"(n={v['n']}, failed {v['failed']})", flush=True)
        over50 = start["qpu"]["p50"] - start["none"]["p50"]
        over95 = start["qpu"]["p95"] - start["none"]["p95"]
        print(f"plugin cost at job start: p50 +{over50:.1f} ms, p95 +{over95:.1f} ms "
              f"({start['qpu']['p50'] / start['none']['p50']:.2f}x the plain srun p50)", flush=True)

        ref, ref_n, ref_f = throughput(lab, args.workers, args.seconds, [])
        qps, q_n, q_f = throughput(lab, args.workers, args.seconds, ["--qpu-duration=1ms"])
        print(f"steps/s without QPU: {ref:.2f} ({ref_n} ok, {ref_f} failed); "
              f"reservations/s through the plugin: {qps:.2f} ({q_n} ok, {q_f} failed); "
              f"ratio {qps / ref:.2f}", flush=True)

        free = scancel_to_free(lab, args.cancels)
        p50 = statistics.median(free)
        print(f"scancel to slot free: p50 {p50:.1f} ms, max {max(free):.1f} ms "
              f"({', '.join(f'{x:.0f}' for x in free)})", flush=True)
        for name, s in PUBLISHED_POLL_S.items():
            print(f"  vs {name}: polls every {s:.0f} s, sees a change after {s / 2 * 1e3:.0f} ms "
                  f"on average = {s / 2 * 1e3 / p50:.1f}x this", flush=True)
        print(json.dumps({
            "bench": "slurm_spank",
            "job_start_ms": start,
            "plugin_overhead_ms": {"p50": round(over50, 2), "p95": round(over95, 2)},
            "plugin_start_ratio_p50": round(start["qpu"]["p50"] / start["none"]["p50"], 3),
            "steps_per_s_without_qpu": round(ref, 2),
            "reservations_per_s": round(qps, 2),
            "reservations_vs_steps": round(qps / ref, 3),
            "throughput_failures": {"without": ref_f, "with": q_f},
            "scancel_to_free_ms": {"p50": round(p50, 1), "max": round(max(free), 1),
                                   "all": [round(x, 1) for x in free]},
            "published_poll_s": PUBLISHED_POLL_S,
            "poll_half_interval_over_free_p50": {k: round(v / 2 * 1e3 / p50, 1)
                                                 for k, v in PUBLISHED_POLL_S.items()},
        }))
        return 0
    finally:
        lab.stop()
        lab.leftover_qrt_cgroups()
        lab.cleanup()


if __name__ == "__main__":
    sys.exit(main())
