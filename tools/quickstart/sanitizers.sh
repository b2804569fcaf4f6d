#!/usr/bin/env bash
# The sanitizer stage of the test command (tools/quickstart/test.sh runs it;
# it also runs alone).  Two builds, each of ONLY the test programs it runs:
#
#   TSan (build-tsan)       the threaded parts: the SPSC rings, RT threads and
#                           clocks (test_rtcore_rt), the event loop's cross-
#                           thread post (test_event_loop), the dispatcher,
#                           its endpoints and submit modes (test_dispatch_unit)
#                           and the socket server (test_rpc_server).
#   ASan+UBSan (build-asan) the code that reads untrusted bytes or keeps state
#                           in memory: JSON-RPC, framing, engine, auth
#                           (test_rpc_unit), the socket server
#                           (test_rpc_server), the ledger and its SQLite store
#                           (test_timeline), the config loader (test_config),
#                           the journal root reads and the host partition
#                           (test_rtcore_partition), the eBPF decoders
#                           (test_bpf).
#
# Each program runs directly (gtest), one at a time: the dispatcher tests pin
# CPU 1.  A report is fatal (-fno-sanitize-recover, halt_on_error=1), so a
# data race, a leak, an overflow or undefined behaviour fails the stage.
# gcc's sanitizers; -O1 -g1 (line tables only) keeps the builds small.
#   QRT_SAN_JOBS      build parallelism (default QRT_JOBS or nproc)
#   QRT_SAN_ONLY      "tsan" or "asan" to run one of the two
#   QRT_TSAN_DIR / QRT_ASAN_DIR   build directories
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
jobs=${QRT_SAN_JOBS:-${QRT_JOBS:-$(nproc)}}
only=${QRT_SAN_ONLY:-}
start=$(date +%s)

tsan_targets=(test_rtcore_rt test_event_loop test_dispatch_unit test_rpc_server)
asan_targets=(test_rpc_unit test_rpc_server test_timeline test_config test_rtcore_partition test_bpf)

export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=1 detect_stack_use_after_return=1 strict_string_checks=1 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"

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
  cmake --build "$dir" -j "$jobs" --target "$@"
  local built
  built=$(date +%s)
  local failed=()
  for t in "$@"; do
    local exe
    exe=$(find "$dir/tests" -type f -name "$t" -perm -u+x | head -n 1)
    if [ -z "$exe" ]; then
      echo "[sanitizers] $name: $t was not built" >&2
      failed+=("$t")
      continue
    fi
    # The rt_thread.real* tests check what the kernel did (memory locked,
    # SCHED_FIFO granted or refused); every sanitizer turns mlockall into a
    # no-op, so they cannot pass in a sanitized build and test no threading.
    local filter=-
    [ "$t" = test_rtcore_rt ] && filter='-rt_thread.real*'
    echo "[sanitizers] $name: running $t"
    # gtest_discover_tests runs the tests from their build directory.
    if ! (cd "$(dirname "$exe")" && "$exe" --gtest_brief=1 --gtest_filter="$filter"); then
      failed+=("$t")
    fi
  done
  echo "[sanitizers] $name: build $(( built - t0 )) s, tests $(( $(date +%s) - built )) s"
  if [ ${#failed[@]} -ne 0 ]; then
    echo "[sanitizers] $name: FAILED: ${failed[*]}" >&2
    return 1
  fi
}

if [ "$only" != asan ]; then
  stage TSan "${QRT_TSAN_DIR:-$here/build-tsan}" QRT_SANITIZE_THREAD "${tsan_targets[@]}"
fi
if [ "$only" != tsan ]; then
  stage "ASan+UBSan" "${QRT_ASAN_DIR:-$here/build-asan}" QRT_SANITIZE "${asan_targets[@]}"
fi
echo "[sanitizers] done in $(( $(date +%s) - start )) s"
