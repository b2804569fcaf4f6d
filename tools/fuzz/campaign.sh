#!/usr/bin/env bash
# A fuzz campaign: every libFuzzer target for SECONDS, all at once, one
# process each (niced), sharing the machine's cores; then one line per target
# with its executions, rate, coverage (cov = edges, ft = features), corpus
# size and crashes, and the total.  Outside CI (CI runs 5000-execution smoke
# runs: ctest -R '^fuzz_').
#
#   tools/fuzz/campaign.sh SECONDS [TARGET...]      (default: every target)
#
#   QRT_FUZZ_BUILD_DIR  clang build with -DQRT_BUILD_FUZZ=ON (default ./build-fuzz;
#                       configured and built here when missing)
#   QRT_FUZZ_OUT        where corpora, crash inputs and logs go
#                       (default $QRT_FUZZ_BUILD_DIR/campaign)
#   QRT_FUZZ_NICE       nice level of the fuzzers (default 19: others share the CPU)
#   QRT_JOBS            build parallelism
#
# The corpora grow across runs (each target's first corpus directory is
# under QRT_FUZZ_OUT, the committed seeds second and read-only).  A crash
# leaves crash-<sha1> (or timeout-/oom-) in QRT_FUZZ_OUT/<target>/; commit it
# to tests/fuzz/corpus/<target>/ as a regression seed once fixed, so the CI
# smoke run replays it.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -lt 1 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 SECONDS [TARGET...]" >&2
  exit 2
fi
seconds=$1
shift
all=(rpc_request journal calibration config wire bpf_decode)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=("${all[@]}"); fi
build=${QRT_FUZZ_BUILD_DIR:-$here/build-fuzz}
out=${QRT_FUZZ_OUT:-$build/campaign}

# -max_len per target: what one input may be (an RPC byte stream, a journal
# file, a config file, a wire stream, a BPF record or a session of steps).
max_len() {
  case $1 in
    rpc_request) echo 16384 ;;
    journal) echo 72000 ;;
    config) echo 16384 ;;
    *) echo 8192 ;;
  esac
}
# The corpus directory of a target under tests/fuzz/corpus.
seeds() {
  case $1 in
    rpc_request) echo rpc ;;
    *) echo "$1" ;;
  esac
}

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
        -DQRT_BUILD_FUZZ=ON -DQRT_BUILD_BENCH=OFF -DQRT_BUILD_BPF=OFF >/dev/null
fi
cmake --build "$build" -j "${QRT_JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}" >/dev/null

pids=()
for t in "${targets[@]}"; do
  mkdir -p "$out/$t/corpus"
  exe=$(find "$build/tests/fuzz" -maxdepth 1 -type f -name "fuzz_$t" -perm -u+x)
  nice -n "${QRT_FUZZ_NICE:-19}" "$exe" -max_total_time="$seconds" -max_len="$(max_len "$t")" \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$out/$t/" "$out/$t/corpus" "$here/tests/fuzz/corpus/$(seeds "$t")" \
      >"$out/$t/log" 2>&1 &
  pids+=($!)
done
echo "[campaign] ${#targets[@]} targets for $seconds s each (logs in $out/<target>/log)"
status=0
for p in "${pids[@]}"; do
  wait "$p" || status=1
done

printf '%-12s %12s %9s %7s %8s %7s %7s\n' target execs exec/s cov ft corpus crashes
total=0
for t in "${targets[@]}"; do
  log=$out/$t/log
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  last=$(grep -E '^#[0-9]+' "$log" | grep -E ' cov: ' | tail -n 1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(find "$out/$t/corpus" -type f | wc -l)
  crashes=$(find "$out/$t" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l)
  printf '%-12s %12s %9s %7s %8s %7s %7s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$corp" "$crashes"
  total=$(( total + ${execs:-0} ))
done
echo "[campaign] total executions: $total"
if [ "$status" != 0 ]; then
  echo "[campaign] a target stopped early: see its log and crash input above" >&2
fi
exit "$status"
