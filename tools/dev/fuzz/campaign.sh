#!/usr/bin/env bash
# A fuzz campaign outside CI (CI runs the 5000-execution smoke runs,
# ctest -R '^fuzz_'): builds every libFuzzer target with clang in its own
# build directory, then fuzzes the targets one after the other, each for its
# share of TOTAL_SECONDS on N cores (-jobs=N -workers=N: N processes sharing
# one corpus), and prints per target the executions, the coverage of the
# corpus it ends with (cov = edges, ft = features, as libFuzzer counts them
# when it replays that corpus) and the findings.  Exits 1 when a target
# crashed, leaked, ran out of memory or hung reproducibly; the inputs are
# kept in WORK/<target>/ (crash-*, leak-*, oom-*, timeout-*).
#
#   tools/dev/fuzz/campaign.sh [options] TOTAL_SECONDS [TARGET...]   (default: every target)
#     --cores N    processes per target (default: nproc)
#     --work DIR   corpora, findings and logs (default BUILD/campaign); the
#                  corpora grow across campaigns
#     --merge      afterwards, merge the inputs that add coverage into the
#                  committed seed corpora (tests/fuzz/corpus/*); off by default
#     --no-build   use the fuzzers already built
#   QRT_FUZZ_BUILD_DIR  clang build with -DQRT_BUILD_FUZZ=ON (default ./build-fuzz)
#   QRT_FUZZ_NICE       nice level (default 19: the machine is shared)
#   QRT_JOBS            build parallelism
#
# Time shares (weights, of TOTAL_SECONDS): the restore journal parser (root
# reads it), the socket's request path and the calibration path 2 each; the
# config loader, the wire codec and the BPF decoders 1 each.  The last three
# are small and saturate their coverage in minutes.
#
# A finding: fix it, then commit the input to tests/fuzz/corpus/<target>/ so
# the CI smoke run replays it (the seeds are replayed before any mutation).
#
# Example: 40 minutes on both cores of the shared machine, in the background:
#   nohup tools/dev/fuzz/campaign.sh --cores 2 2400 >campaign.out 2>&1 &
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
cores=$(nproc)
work=
merge=0
build_it=1
while [ $# -gt 0 ]; do
  case $1 in
    --cores) cores=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --merge) merge=1; shift ;;
    --no-build) build_it=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
if [ $# -lt 1 ] || ! [[ $1 =~ ^[0-9]+$ ]] || ! [[ $cores =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [--cores N] [--work DIR] [--merge] [--no-build] TOTAL_SECONDS [TARGET...]" >&2
  exit 2
fi
total_s=$1
shift
all=(journal rpc_request calibration config wire bpf_decode)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=("${all[@]}"); fi
build=${QRT_FUZZ_BUILD_DIR:-$here/build-fuzz}
work=${work:-$build/campaign}
nice_level=${QRT_FUZZ_NICE:-19}

weight() { case $1 in journal|rpc_request|calibration) echo 2 ;; *) echo 1 ;; esac; }
seeds() { case $1 in rpc_request) echo rpc ;; *) echo "$1" ;; esac; }
# What one input may be: an RPC byte stream, a journal file, a config file, a
# wire stream, a BPF record or a session of steps (as the smoke runs).
max_len() { case $1 in rpc_request|config) echo 16384 ;; journal) echo 72000 ;; *) echo 8192 ;; esac; }

for t in "${targets[@]}"; do
  case " ${all[*]} " in *" $t "*) ;; *) echo "campaign: unknown target $t (${all[*]})" >&2; exit 2 ;; esac
done

if [ "$build_it" = 1 ]; then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    launcher=()
    if command -v ccache >/dev/null 2>&1; then
      launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    fi
    cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
          -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
          -DQRT_BUILD_FUZZ=ON -DQRT_BUILD_BENCH=OFF -DQRT_BUILD_BPF=OFF >/dev/null
  fi
  nice -n "$nice_level" cmake --build "$build" -j "${QRT_JOBS:-$(nproc)}" \
      --target "${targets[@]/#/fuzz_}" >/dev/null
fi

sum_w=0
for t in "${targets[@]}"; do sum_w=$(( sum_w + $(weight "$t") )); done
# ASan's allocation stacks cost a sixth of an execution here: keep two frames
# (a finding is replayed with full stacks below).
export ASAN_OPTIONS="malloc_context_size=2:${ASAN_OPTIONS:-}"
start=$(date +%s)
echo "[campaign] ${targets[*]}: $total_s s on $cores cores at nice $nice_level, work in $work"
for t in "${targets[@]}"; do
  share=$(( total_s * $(weight "$t") / sum_w ))
  [ "$share" -ge 1 ] || share=1
  exe=$build/tests/fuzz/fuzz_$t
  dir=$work/$t
  mkdir -p "$dir/corpus" "$dir/logs"
  rm -f "$dir"/logs/fuzz-*.log
  echo "[campaign] $t: $share s ($(date -u +%H:%M:%S) UTC)"
  # -jobs/-workers: N processes, each for the share; the corpus directory
  # (first) collects what any of them finds, the seeds (second) are read-only.
  (cd "$dir/logs" && nice -n "$nice_level" "$exe" -jobs="$cores" -workers="$cores" \
      -max_total_time="$share" -max_len="$(max_len "$t")" -timeout=30 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$dir/" \
      "$dir/corpus" "$here/tests/fuzz/corpus/$(seeds "$t")" >"$dir/logs/main.log" 2>&1) || true
done

printf '\n%-12s %12s %9s %7s %8s %7s  %s\n' target execs exec/s cov ft corpus findings
total=0
failed=0
summary=$work/summary.txt
: >"$summary"
for t in "${targets[@]}"; do
  dir=$work/$t
  exe=$build/tests/fuzz/fuzz_$t
  execs=0
  secs=0
  for log in "$dir"/logs/fuzz-*.log; do
    [ -f "$log" ] || continue
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    if [ -z "$n" ]; then  # a job that stopped on a finding: its last status line
      n=$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')
    fi
    execs=$(( execs + ${n:-0} ))
    s=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
    secs=$(( secs > ${s:-0} ? secs : ${s:-0} ))
  done
  # Coverage of the corpus the campaign ends with (seeds included).
  cov_line=$(nice -n "$nice_level" "$exe" -runs=0 -max_len="$(max_len "$t")" \
      "$dir/corpus" "$here/tests/fuzz/corpus/$(seeds "$t")" 2>&1 | grep -E 'INITED|DONE' | tail -n 1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$cov_line")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$cov_line")
  corp=$(find "$dir/corpus" -type f | wc -l)
  findings=()
  for f in "$dir"/crash-* "$dir"/leak-* "$dir"/oom-* "$dir"/timeout-*; do
    [ -f "$f" ] || continue
    name=$(basename "$f")
    # Replay it once, alone, with full allocation stacks: a timeout that
    # does not hang again was a starved process on the shared machine.
    if ASAN_OPTIONS= timeout 120 "$exe" -timeout=30 -rss_limit_mb=2048 "$f" \
        >"$dir/$name.replay" 2>&1; then
      findings+=("$name(does-not-replay)")
      [[ $name == timeout-* ]] || failed=1
    else
      findings+=("$name")
      failed=1
    fi
  done
  rate=0
  [ "$secs" -gt 0 ] && rate=$(( execs / secs ))
  line=$(printf '%-12s %12s %9s %7s %8s %7s  %s' "$t" "$execs" "$rate" "${cov:-?}" "${ft:-?}" \
         "$corp" "${findings[*]:-none}")
  echo "$line"
  echo "$line" >>"$summary"
  total=$(( total + execs ))
  if [ "$merge" = 1 ]; then
    "$exe" -merge=1 -max_len="$(max_len "$t")" "$here/tests/fuzz/corpus/$(seeds "$t")" \
        "$dir/corpus" >"$dir/logs/merge.log" 2>&1
    echo "[campaign] $t: merged into tests/fuzz/corpus/$(seeds "$t"): $(grep -o 'added [0-9]* new units' "$dir/logs/merge.log" | tail -n 1)"
  fi
done
echo "[campaign] total executions: $total in $(( $(date +%s) - start )) s (exec/s: all processes of a target)" | tee -a "$summary"
if [ "$failed" != 0 ]; then
  echo "[campaign] FINDINGS: see $work/<target>/ (inputs and .replay logs)" >&2
  exit 1
fi
