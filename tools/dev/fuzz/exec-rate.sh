#!/usr/bin/env bash
# Executions per second of each libFuzzer target: RUNS executions (default
# 20000) from the committed seed corpus with a fixed seed, new inputs into a
# scratch directory (the seeds stay untouched), one target at a time.  Prints
# the wall rate and the rate per CPU second (user + sys of the fuzzer): on a
# shared machine the second is the one to compare.
#
#   tools/dev/fuzz/exec-rate.sh [TARGET...]          (default: every target)
#
#   QRT_FUZZ_BUILD_DIR  clang build with -DQRT_BUILD_FUZZ=ON (default ./build-fuzz)
#   QRT_FUZZ_RUNS       executions per target (default 20000)
#   QRT_FUZZ_NICE       nice level (default 0)
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
build=${QRT_FUZZ_BUILD_DIR:-$here/build-fuzz}
runs=${QRT_FUZZ_RUNS:-20000}
all=(rpc_request journal calibration config wire bpf_decode)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=("${all[@]}"); fi
seeds() { case $1 in rpc_request) echo rpc ;; *) echo "$1" ;; esac; }
max_len() { case $1 in rpc_request|config) echo 16384 ;; journal) echo 72000 ;; *) echo 8192 ;; esac; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
printf '%-12s %8s %9s %9s %10s\n' target runs wall_s cpu_s exec/cpu_s
for t in "${targets[@]}"; do
  exe=$build/tests/fuzz/fuzz_$t
  mkdir -p "$scratch/$t"
  /usr/bin/time -f '%e %U %S' -o "$scratch/$t.time" \
    nice -n "${QRT_FUZZ_NICE:-0}" "$exe" -runs="$runs" -seed=1 -max_len="$(max_len "$t")" \
      -artifact_prefix="$scratch/$t/" "$scratch/$t" "$here/tests/fuzz/corpus/$(seeds "$t")" \
      >"$scratch/$t.log" 2>&1 || { echo "[exec-rate] $t failed:"; tail -n 20 "$scratch/$t.log"; exit 1; }
  read -r wall user sys <"$scratch/$t.time"
  cpu=$(echo "$user + $sys" | bc -l)
  printf '%-12s %8s %9.1f %9.1f %10.0f\n' "$t" "$runs" "$wall" "$cpu" "$(echo "$runs / $cpu" | bc -l)"
done
