#!/usr/bin/env bash
# The sanitizer stage of the test command (tools/dev/test.sh runs it
# in CI; it also runs alone).  Two builds, each of ONLY the test programs it
# runs (and what they start: qpu-sim, qrt-test-server, qrtctl), and of those
# programs exactly the tests ctest registered for them, under ctest (so each
# test keeps its timeout, resource locks and skip code).  A report is fatal
# (-fno-sanitize-recover, halt_on_error=1): a data race, a leak, an overflow
# or undefined behaviour fails the test, the stage and CI.
#
# Which suites, and why (the whole CI run must stay under 30 minutes on the
# 2-vCPU machine; each tree rebuilds qrt_agent instrumented, mostly from
# ccache once warm, so what costs is linking and running):
#
#   TSan (build-tsan): every suite with more than one thread.
#     test_rtcore_rt             SPSC rings, RT threads, clocks
#     test_event_loop            the loop's cross-thread post and timers
#     test_dispatch_unit         the dispatcher, its endpoints and submit modes
#                                (the withdraw CAS between loop and RT thread)
#     test_rpc_server            the socket server and its NSS resolver thread
#     test_dispatch_integration  RT thread + endpoint reader against qpu-sim
#     test_job_pump              the job pump's thread against a busy loop
#                                sharing the QPU link
#     test_commit_writer         the ledger writer thread and the loop's
#                                durable-up-to notices
#   ASan+UBSan (build-asan): everything that parses untrusted bytes, keeps
#   state in memory or owns memory by hand, unit and integration tiers.
#     unit: test_rtcore_base, test_rtcore_util, test_rtcore_topology,
#           test_rtcore_partition (the journal root reads), test_config,
#           test_daemon_support, test_rpc_unit, test_timeline (ledger +
#           SQLite), test_commit_writer (group commit, undo of a failed
#           group), test_bpf (decoders), test_event_loop, test_dispatch_unit
#     integration: test_rpc_server, test_dispatch_integration,
#           test_clients_integration (libqrt-client, qrtctl, the agent's socket
#           side with its SQLite ledger)
#   Neither: suites that change the host or boot a VM (host_real, e2e,
#   vmhost, slurm, package, systemd_unit, qrtd_cli: root, host lock, minutes
#   each, and they run the same code the suites above cover), measurement
#   suites (jitter_report*, bpf_intrusions: they measure timer loops and
#   kernel events, which instrumentation slows by 2-15x and makes
#   meaningless), and the fleet simulation (CPU-bound, no untrusted input).
#   Every parser also runs under ASan+UBSan in the fuzz smoke runs.
#
# Kept out of the sanitized runs, with the reason (san_exclude below):
#   rpc_tenants.a_tenant_flooding_the_socket_is_throttled_and_the_others_queries_stay_fast
#     asserts a victim's p99 under a stated 500 ms during a 2,000-connection
#     flood: a timing promise, measured in the plain build's ctest.
#   rt_thread.real*  check what the kernel did (memory locked by mlockall,
#     SCHED_FIFO granted or refused); every sanitizer turns mlockall into a
#     no-op, so they cannot pass and test no threading.
#
#   QRT_SAN_JOBS      build parallelism (default QRT_JOBS or nproc)
#   QRT_SAN_ONLY      "tsan" or "asan" to run one of the two
#   QRT_TEST_JOBS     ctest parallelism (default 2)
#   QRT_TSAN_DIR / QRT_ASAN_DIR   build directories
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
# Paths under the checkout hash relative to it, so that a fresh clone in
# another directory (CI's mktemp -d) hits what an earlier clone cached.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$here}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
jobs=${QRT_SAN_JOBS:-${QRT_JOBS:-$(nproc)}}
only=${QRT_SAN_ONLY:-}
start=$(date +%s)

tsan_targets=(test_rtcore_rt test_event_loop test_dispatch_unit test_rpc_server
              test_dispatch_integration test_job_pump test_commit_writer)
asan_targets=(test_rtcore_base test_rtcore_util test_rtcore_topology test_rtcore_partition
              test_config test_daemon_support test_rpc_unit test_timeline test_commit_writer test_bpf
              test_event_loop test_dispatch_unit
              test_rpc_server test_dispatch_integration test_clients_integration)
# Python regex (re.search) of the tests kept out of both sanitized runs (see above).
san_exclude='^rpc_tenants\.a_tenant_flooding_the_socket_is_throttled_and_the_others_queries_stay_fast$|^rt_thread\.real'

export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=1 detect_stack_use_after_return=1 strict_string_checks=1 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"

# The ctest numbers of the tests whose program is one of the given ones and
# whose name san_exclude does not match, as ctest -I wants them
# ("0,0,0,n,n,...").  ctest numbers -I within what -R/-E left, so the
# exclusion is applied here, not with -E.
select_tests() {
  local dir=$1
  shift
  ctest --test-dir "$dir" --show-only=json-v1 2>/dev/null | python3 -c '
import json, os, re, sys
exclude = re.compile(sys.argv[1])
want = set(sys.argv[2:])
tests = json.load(sys.stdin)["tests"]
nums = [str(i + 1) for i, t in enumerate(tests)
        if t.get("command") and os.path.basename(t["command"][0]) in want
        and not exclude.search(t["name"])]
print(",".join(["0", "0", "0"] + nums) if nums else "")
' "$san_exclude" "$@"
}

# stage NAME DIR CMAKE_OPTION TARGETS...
stage() {
  local name=$1 dir=$2 option=$3
  shift 3
  local t0
  t0=$(date +%s)
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    local launcher=()
    if command -v ccache >/dev/null 2>&1; then
      launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    fi
    cmake -S "$here" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug "${launcher[@]}" \
          -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
          -D"$option"=ON -DQRT_WERROR="${QRT_WERROR:-ON}" \
          -DQRT_BUILD_BENCH=OFF -DQRT_BUILD_BPF=OFF >/dev/null
  fi
  echo "[sanitizers] $name: building $* in $dir"
  # Called as `stage ... || status=1`, so errexit is off in here: a build
  # that fails must stop the stage itself.
  if ! cmake --build "$dir" -j "$jobs" --target "$@"; then
    echo "[sanitizers] $name: FAILED: the build of $* failed (the compiler's error is above)" >&2
    return 1
  fi
  local built
  built=$(date +%s)
  local sel
  sel=$(select_tests "$dir" "$@")
  if [ -z "$sel" ]; then
    echo "[sanitizers] $name: no tests registered for $*" >&2
    return 1
  fi
  local n=$(( $(tr ',' '\n' <<<"$sel" | wc -l) - 3 ))
  echo "[sanitizers] $name: running the $n tests of $*"
  local rc=0
  # Every instrumented process (the tests and the programs they start:
  # qpu-sim, qrt-test-server, qrtctl) writes its reports under logs/, so a
  # report in a child the test did not look at fails the stage too.
  local logs=$dir/sanitizer-logs
  rm -rf "$logs"
  mkdir -p "$logs"
  (cd "$dir" &&
     TSAN_OPTIONS="$TSAN_OPTIONS log_path=$logs/tsan" \
     ASAN_OPTIONS="$ASAN_OPTIONS log_path=$logs/asan" \
     UBSAN_OPTIONS="$UBSAN_OPTIONS log_path=$logs/ubsan" \
     ctest --output-on-failure -j "${QRT_TEST_JOBS:-2}" --timeout 600 -I "$sel") || rc=1
  local reports
  reports=$(grep -lE 'ERROR: (Address|Leak|Thread)Sanitizer|WARNING: ThreadSanitizer|runtime error:' \
            "$logs"/* 2>/dev/null || true)
  if [ -n "$reports" ]; then
    echo "[sanitizers] $name: reports:" >&2
    for f in $reports; do
      echo "== $f" >&2
      head -n 60 "$f" >&2
    done
    rc=1
  fi
  echo "[sanitizers] $name: build $(( built - t0 )) s, tests $(( $(date +%s) - built )) s"
  if [ "$rc" != 0 ]; then
    echo "[sanitizers] $name: FAILED (a failing test or a sanitizer report above)" >&2
    return 1
  fi
}

status=0
if [ "$only" != asan ]; then
  stage TSan "${QRT_TSAN_DIR:-$here/build-tsan}" QRT_SANITIZE_THREAD "${tsan_targets[@]}" || status=1
fi
if [ "$only" != tsan ]; then
  stage "ASan+UBSan" "${QRT_ASAN_DIR:-$here/build-asan}" QRT_SANITIZE "${asan_targets[@]}" || status=1
fi
echo "[sanitizers] done in $(( $(date +%s) - start )) s"
exit "$status"
