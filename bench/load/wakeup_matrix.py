#!/usr/bin/env python3
"""The send's cross-CPU wake-up, by endpoint type (bench/README.md "load").

For each endpoint (unix, tcp), reader (sleeping SCHED_FIFO qpu-sim, busy-polling
qpu-sim), reader CPU (idle, or a SCHED_OTHER stress-ng on it) and submit mode
(syscall, sqpoll) it runs `dispatch-vs-cyclictest --only MODE` under
qrt-wakeup-trace and prints what the dispatch CPU's tasks did to wake the
reader: cross-CPU wake-ups, IPIs sent, wake-ups that needed no IPI (target CPU
polling), NET_RX softirq time on the dispatch CPU, with dispatch and arrival
lateness.  Run under the host lock (it pins CPUs):

    flock /tmp/qrt-host.lock bench/load/wakeup_matrix.py --build build [--loops 1000]

Ends with one JSON line.
"""
import argparse, json, os, subprocess, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build")
ap.add_argument("--loops", type=int, default=1000)
ap.add_argument("--interval-us", type=int, default=1000)
ap.add_argument("--dispatch-cpu", type=int, default=1)
ap.add_argument("--reader-cpu", type=int, default=0)
ap.add_argument("--endpoints", default="unix,tcp")
ap.add_argument("--partition", metavar="CONFIG",
                help="qrtd host apply -c CONFIG first (isolates the dispatch CPU), restore at the end")
a = ap.parse_args()

dvc = os.path.join(a.build, "bench/dispatch/dispatch-vs-cyclictest")
trace = os.path.join(a.build, "bench/load/qrt-wakeup-trace")
for p in (dvc, trace):
    if not os.access(p, os.X_OK):
        print(f"wakeup_matrix: {p} is not built (ninja -C {a.build} dispatch-vs-cyclictest qrt-wakeup-trace)")
        sys.exit(77)
if os.geteuid() != 0:
    print("wakeup_matrix: needs root (SCHED_FIFO, BPF)"); sys.exit(77)

def uptime():
    return open("/proc/loadavg").read().split()[0]

cases = []
for ep in a.endpoints.split(","):
    for reader, cpu_busy in (("sleeping", False), ("sleeping", True), ("busy-poll", False)):
        for mode in ("syscall", "sqpoll"):
            cases.append((ep, reader, cpu_busy, mode))

qrtd = os.path.join(a.build, "agent/qrtd")
V1_TASKS = "/sys/fs/cgroup/cpuset/qrt-isolated/tasks"  # cgroup v1: the dispatch thread joins it
state = "/tmp/qrt-wakeup-matrix"
def host(verb):
    os.makedirs(state, exist_ok=True); os.makedirs(state + "-journal", mode=0o700, exist_ok=True)
    return subprocess.run([qrtd, "host", verb, "-c", a.partition, "--state-dir", state,
                           "--journal-dir", state + "-journal"], capture_output=True, text=True)

if a.partition:
    r = host("apply")
    if r.returncode != 0:
        print("wakeup_matrix: qrtd host apply failed:", r.stderr[-600:]); host("restore"); sys.exit(1)
    print("partition applied:", a.partition, flush=True)

def run_all():
  rows = []
  for ep, reader, cpu_busy, mode in cases:
      cmd = ["taskset", "-c", str(a.reader_cpu), dvc, "--skip-cyclictest", "--only", mode, "--endpoint", ep,
             "--cpu", str(a.dispatch_cpu), "--sim-cpu", str(a.reader_cpu), "--loops", str(a.loops),
             "--interval-us", str(a.interval_us)]
      if reader == "busy-poll":
          cmd += ["--sim-busy-poll", "--sim-prio", "0"]
      if a.partition and os.path.exists(V1_TASKS):
          cmd += ["--join-tasks-file", V1_TASKS]
      stress = None
      if cpu_busy:
          secs = max(5, int(a.loops * a.interval_us / 1e6) + 5)
          stress = subprocess.Popen(["stress-ng", "--cpu", "1", "--taskset", str(a.reader_cpu), "--timeout", f"{secs}s",
                                     "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
          time.sleep(0.3)
      load = uptime()
      p = subprocess.run([trace, "--top", "64", "--"] + cmd, capture_output=True, text=True, timeout=120)
      if stress:
          stress.terminate(); stress.wait()
      t = json.loads(p.stdout.strip().splitlines()[-1])
      bench = None
      for line in p.stderr.splitlines():
          if line.startswith("{") and '"dispatch-vs-cyclictest"' in line:
              bench = json.loads(line)
      if bench is None:
          print("wakeup_matrix: no result from", " ".join(cmd), p.stderr[-400:]); continue
      f = bench["tuned" if mode == "syscall" else "tuned_sqpoll"]
      n = max(f.get("count", 0), 1)
      on_cpu = [s for s in t["senders"] if s["cpu"] == a.dispatch_cpu]
      def pick(pred):
          agg = {"waking_remote": 0, "ipi_sent": 0, "wake_idle_no_ipi": 0}
          for s in on_cpu:
              if pred(s["comm"]):
                  for k in agg: agg[k] += s[k]
          return {k: round(v / n, 3) for k, v in agg.items()}
      rt = pick(lambda c: c == "qrt-dispatch")
      poller = pick(lambda c: c.startswith("iou-sqp"))
      recv = {r["cpu"]: r for r in t["receivers"]}
      d_rx = recv.get(a.dispatch_cpu, {})
      row = {"endpoint": ep, "reader": reader, "reader_cpu_busy": cpu_busy, "submit": mode, "load": load,
             "jobs": f.get("count", 0),
             "dispatch_p50_us": f.get("p50_us"), "dispatch_p99_us": f.get("p99_us"),
             "arrival_p50_us": f.get("arrival", {}).get("p50_us"), "arrival_p99_us": f.get("arrival", {}).get("p99_us"),
             "rt_thread_per_job": rt, "poller_per_job": poller,
             "net_rx_on_dispatch_cpu_per_job": round(d_rx.get("net_rx", 0) / n, 3),
             "net_rx_ns_on_dispatch_cpu_per_job": round(d_rx.get("net_rx_ns", 0) / n),
             "reader_cpu_resched_ipi_per_job": round(recv.get(a.reader_cpu, {}).get("resched_ipi", 0) / n, 3),
             "reader_cpu_call_function_ipi_per_job": round(recv.get(a.reader_cpu, {}).get("call_function_ipi", 0) / n, 3),
             "missed": f.get("missed"), "failed": f.get("failed")}
      rows.append(row)
      print(f"{ep:4} {reader:9} cpu{a.reader_cpu}={'busy' if cpu_busy else 'idle'} {mode:7} load {load:5} | "
            f"dispatch p50/p99 {row['dispatch_p50_us']:6.2f}/{row['dispatch_p99_us']:6.2f} us  "
            f"arrival p50/p99 {row['arrival_p50_us'] or 0:6.2f}/{row['arrival_p99_us'] or 0:6.2f} us | per job: "
            f"RT wake-remote {rt['waking_remote']:.2f} ipi {rt['ipi_sent']:.2f} no-ipi {rt['wake_idle_no_ipi']:.2f}; "
            f"poller ipi {poller['ipi_sent']:.2f}; NET_RX on cpu{a.dispatch_cpu} {row['net_rx_on_dispatch_cpu_per_job']:.2f} "
            f"({row['net_rx_ns_on_dispatch_cpu_per_job']} ns)", flush=True)

  return rows

try:
    rows = run_all()
finally:
    if a.partition:
        r = host("restore")
        print("partition restored" if r.returncode == 0 else "wakeup_matrix: RESTORE FAILED: " + r.stderr[-600:], flush=True)
print(json.dumps({"bench": "wakeup_matrix", "loops": a.loops, "interval_us": a.interval_us, "partition": bool(a.partition), "rows": rows}))
