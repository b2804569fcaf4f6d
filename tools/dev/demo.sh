#!/usr/bin/env bash
# Quick start command 1: the end-to-end demo, as root on Debian 12.
#
#   deps -> build -> the daemon's user from the shipped sysusers.d file ->
#   `qrtd host plan` -> qpu-sim + `qrtd run` (applies the partition as root,
#   binds its socket, drops to user qrtd, restores on exit through its root
#   helper) -> a scheduler client places and submits
#   a few hundred jobs across several short calibration windows -> lateness
#   percentiles and outcomes (qrt-jitter-report + qpu-sim's summary) -> a
#   check that the host was put back as it was.
#
# Idempotent; every process it starts is stopped by PID on exit (trap).
# Environment: QRT_BUILD_DIR (default ./build), QRT_DEMO_JOBS (300),
# QRT_DEMO_SPACING_MS (20), QRT_DEMO_STATE (/var/lib/qrtd-demo),
# QRT_DEMO_JOURNAL (/var/lib/qrtd-host, root's, as deployed),
# QRT_DEMO_SKIP_BUILD=1 (use the binaries already built), QRT_DEMO_CONFIG
# (another config than config/demo.toml, e.g. one with host.runtime_knobs = []
# to measure without the runtime knobs), QRT_DEMO_REPORT_JSON (a file that
# keeps the jitter report as JSON: every intrusion source, not only the top).
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
build=${QRT_BUILD_DIR:-$here/build}
config=${QRT_DEMO_CONFIG:-$here/config/demo.toml}
run_dir=/run/qrtd-demo
# qpu-sim's socket lives apart, in a directory only root writes: root never
# touches a path in a directory the daemon's user can write.
qpu_dir=/run/qrtd-demo-qpu
state=${QRT_DEMO_STATE:-/var/lib/qrtd-demo}
journal=${QRT_DEMO_JOURNAL:-/var/lib/qrtd-host}
jobs=${QRT_DEMO_JOBS:-300}
spacing_ms=${QRT_DEMO_SPACING_MS:-20}
sock=$run_dir/qrtd.sock
work=$(mktemp -d /tmp/qrtd-demo.XXXXXX)

step() { echo; echo "==> [demo] $*"; }
info() { echo "    [demo] $*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "[demo] run as root: the demo applies (and restores) a CPU/IRQ partition" >&2
  exit 1
fi

sim_pid=""
qrtd_pid=""
cleanup() {
  local rc=$?
  # Only the PIDs this script started.
  if [ -n "$qrtd_pid" ] && kill -0 "$qrtd_pid" 2>/dev/null; then
    kill -TERM "$qrtd_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$qrtd_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  if [ -n "$sim_pid" ] && kill -0 "$sim_pid" 2>/dev/null; then
    kill -TERM "$sim_pid" 2>/dev/null || true
    wait "$sim_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

host_snapshot() {
  # What the partition changes: IRQ affinities, the default affinity and
  # the qrt cpusets; restored means byte-equal to before.
  {
    for f in /proc/irq/default_smp_affinity /proc/irq/*/smp_affinity_list; do
      [ -r "$f" ] && printf '%s %s\n' "$f" "$(cat "$f" 2>/dev/null || echo '?')"
    done
    ls -d /sys/fs/cgroup/cpuset/qrt-* /sys/fs/cgroup/unified/qrt-* /sys/fs/cgroup/qrt-* 2>/dev/null || true
    # The runtime knobs (host.runtime_knobs).
    for f in /sys/devices/virtual/workqueue/cpumask /sys/devices/virtual/workqueue/*/cpumask \
             /proc/sys/vm/stat_interval /proc/sys/kernel/timer_migration /proc/sys/kernel/watchdog_cpumask \
             /proc/sys/kernel/sched_rt_runtime_us; do
      [ -r "$f" ] && printf '%s %s\n' "$f" "$(cat "$f" 2>/dev/null || echo '?')"
    done
  } | sort
}

step "1/6 dependencies"
"$here/tools/dev/deps.sh"

step "2/6 build ($build)"
if [ "${QRT_DEMO_SKIP_BUILD:-0}" = 1 ]; then
  info "QRT_DEMO_SKIP_BUILD=1: using the binaries already in $build"
else
  "$here/tools/dev/build.sh"
fi
qrtd=$build/agent/qrtd
sim=$build/tools/endpoints/qpu-sim/qpu-sim
report=$build/tools/operator/jitter-report/qrt-jitter-report
for b in "$qrtd" "$sim" "$report"; do
  [ -x "$b" ] || { echo "[demo] missing $b after the build" >&2; exit 1; }
done

step "3/6 the daemon's user, then the partition plan (changes nothing)"
# As the package does it: user qrtd and group qrt from the shipped
# sysusers.d file (idempotent).  qrtd run starts as root, applies the
# partition, binds its socket for group qrt, then runs as qrtd.
systemd-sysusers "$here/systemd/sysusers.d/qrtd.conf"
# ... and its directories and device access from the shipped tmpfiles.d file:
# /var/lib/qrtd-host root:root 0700 (the journal), /dev/cpu_dma_latency for user qrtd alone.
systemd-tmpfiles --create "$here/systemd/tmpfiles.d/qrtd.conf" || true
info "daemon user: $(id qrtd)"
"$qrtd" host plan -c "$config" | sed 's/^/    /'

if [ -e "$journal/host-journal" ]; then
  info "a journal from an earlier interrupted demo is in $journal: restoring it first"
  "$qrtd" host restore -c "$config" --state-dir "$state" --journal-dir "$journal" || true
fi
# The runtime directory as systemd's RuntimeDirectory= makes it; the state
# directory qrtd run creates or hands over to qrtd itself.
install -d -o qrtd -g qrt -m 0750 "$run_dir"
install -d -o root -g qrt -m 0750 "$qpu_dir"
mkdir -p "$state"
rm -f "$state"/ledger.sqlite*   # a fresh timeline for every demo run
host_snapshot > "$work/host.before"

step "4/6 qpu-sim + qrtd run (applies the partition; restores it on exit)"
# The simulated control electronics' socket, for group qrt (the daemon):
# qpu-sim creates it with that group and mode itself.
"$sim" --listen "unix://$qpu_dir/qpu0.sock" --socket-group qrt --socket-mode 0660 --fifo 50 --json \
  --summary-file "$work/sim.json" --duration-s 120 > "$work/sim.out" 2>&1 &
sim_pid=$!
for _ in $(seq 1 100); do [ -S "$qpu_dir/qpu0.sock" ] && break; sleep 0.05; done
info "qpu-sim pid $sim_pid on unix://$qpu_dir/qpu0.sock"
"$qrtd" run -c "$config" --state-dir "$state" --journal-dir "$journal" --duration-s 90 > "$work/qrtd.log" 2>&1 &
qrtd_pid=$!
for _ in $(seq 1 200); do
  [ -S "$sock" ] && break
  kill -0 "$qrtd_pid" 2>/dev/null || { cat "$work/qrtd.log" >&2; exit 1; }
  sleep 0.05
done
[ -S "$sock" ] || { echo "[demo] qrtd did not open $sock" >&2; tail -20 "$work/qrtd.log" >&2; exit 1; }
info "qrtd pid $qrtd_pid on $sock"
grep -E "isolation: |irq: |knob: |caps: |dispatch: qpu0: endpoint .* mode|probes: " "$work/qrtd.log" | sed 's/^[^ ]* /    /' || true

step "5/6 scheduler client: $jobs jobs, ${spacing_ms} ms apart"
python3 "$here/tools/dev/demo_client.py" --socket "$sock" --jobs "$jobs" \
  --spacing-ms "$spacing_ms" | sed 's/^/    /'

step "    lateness report (qrt-jitter-report against the agent)"
"$report" --socket "$sock" --no-histogram | sed 's/^/    /' || true
if [ -n "${QRT_DEMO_REPORT_JSON:-}" ]; then
  "$report" --socket "$sock" --json > "$QRT_DEMO_REPORT_JSON" || true
fi

# Stop qrtd (it restores the host), then qpu-sim (it prints its summary).
kill -TERM "$qrtd_pid"
qrtd_rc=0
wait "$qrtd_pid" || qrtd_rc=$?
qrtd_pid=""
grep -E "host: restored|restore|daemon: stopped" "$work/qrtd.log" | sed 's/^[^ ]* /    /' || true
kill -TERM "$sim_pid"
wait "$sim_pid" || true
sim_pid=""
step "    qpu-sim summary (arrival stamps at the simulated QPU)"
python3 - "$work/sim.json" <<'EOF' | sed 's/^/    /'
import json, sys
s = json.load(open(sys.argv[1]))
a = s["arrival_lateness_ns"]
print(f"jobs {s['jobs']}, results {s['results']}, out of window {s['out_of_window']}, "
      f"late {s['late']}, calibration mismatches {s['calibration_mismatch']}")
print(f"arrival lateness: p50 {a['p50']/1e3:.1f} us, p95 {a['p95']/1e3:.1f} us, "
      f"p99 {a['p99']/1e3:.1f} us, max {a['max']/1e3:.1f} us")
EOF

step "6/6 host restored?"
host_snapshot > "$work/host.after"
if [ "$qrtd_rc" -eq 0 ] && [ ! -e "$journal/host-journal" ] && diff -q "$work/host.before" "$work/host.after" >/dev/null; then
  info "yes: $(wc -l < "$work/host.after") IRQ/cpuset/knob values equal to before, no journal left"
else
  info "NO: qrtd exit $qrtd_rc; differences:"
  diff "$work/host.before" "$work/host.after" | head -20 | sed 's/^/    /' || true
  info "run: $qrtd host restore -c $config --state-dir $state --journal-dir $journal"
  exit 1
fi
echo
echo "[demo] done"
