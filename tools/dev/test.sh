#!/usr/bin/env bash
# Quick start command 2: install dependencies, build, run the whole test suite,
# then short libFuzzer smoke runs of every fuzz target (the socket's request
# path, the restore journal parser root reads, the calibration update path,
# the config loader, the QPU wire codec, the eBPF record decoders), then the
# threaded suites under TSan and the unit and integration suites under
# ASan+UBSan (tools/dev/sanitizers.sh says which and why).  Each stage
# prints the seconds it took ("[time] STAGE: N s").  A stage that fails
# does not stop the later ones (each reports what it found); the run then
# ends with the failed stages named and exit status 1.
#   QRT_BUILD_DIR         build directory (default ./build)
#   QRT_TEST_JOBS         ctest parallelism (default 2)
#   QRT_SKIP_FUZZ=1       skip the fuzz smoke runs (they need clang)
#   QRT_SKIP_SANITIZERS=1 skip the sanitizer stage
#   QRT_SANITIZERS=tsan|asan  run one half of the sanitizer stage (default both)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
# Paths under the checkout hash relative to it, so that a fresh clone in
# another directory (CI's mktemp -d) hits what an earlier clone cached.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$here}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
build=${QRT_BUILD_DIR:-$here/build}
start=$(date +%s)
stage_t0=$start
# stage_done NAME: how long the stage that just ended took.
stage_done() {
  local now
  now=$(date +%s)
  echo "[time] $1: $(( now - stage_t0 )) s ($(( now - start )) s so far)"
  stage_t0=$now
}
failed=()
# stage NAME CMD...: runs a test stage; a failure is recorded, not fatal.
stage() {
  local name=$1
  shift
  if ! "$@"; then
    echo "[test] stage $name FAILED (the later stages still run)"
    failed+=("$name")
  fi
  stage_done "$name"
}
"$here/tools/dev/deps.sh"
stage_done deps
"$here/tools/dev/build.sh"
stage_done build
echo "[test] running ctest in $build"
# Tests that need root, BPF or a tool skip themselves with the reason.
rm -f "$build/Testing/Temporary/LastTestsFailed.log"
stage ctest bash -c 'cd "$1" && ctest --output-on-failure -j "$2" --timeout 600' _ "$build" "${QRT_TEST_JOBS:-2}"

if [ "${QRT_SKIP_FUZZ:-0}" != 1 ]; then
  if command -v clang++ >/dev/null 2>&1; then
    fuzz=${QRT_FUZZ_BUILD_DIR:-$here/build-fuzz}
    targets=(fuzz_rpc_request fuzz_journal fuzz_calibration fuzz_config fuzz_wire fuzz_bpf_decode)
    echo "[fuzz] building ${targets[*]} with clang in $fuzz"
    if [ ! -f "$fuzz/CMakeCache.txt" ]; then
      launcher=()
      if command -v ccache >/dev/null 2>&1; then
        launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
      fi
      cmake -S "$here" -B "$fuzz" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
            -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
            -DQRT_BUILD_FUZZ=ON -DQRT_BUILD_BENCH=OFF -DQRT_BUILD_BPF=OFF >/dev/null
    fi
    if cmake --build "$fuzz" -j "${QRT_JOBS:-$(nproc)}" --target "${targets[@]}"; then
      stage_done "fuzz build"
      echo "[fuzz] smoke runs: 5000 executions each from the seed corpora"
      rm -f "$fuzz/Testing/Temporary/LastTestsFailed.log"
      stage "fuzz smoke" bash -c 'cd "$1" && ctest --output-on-failure -R "^fuzz_" --timeout 600' _ "$fuzz"
    else
      echo "[test] stage fuzz build FAILED (the later stages still run)"
      failed+=("fuzz build")
      stage_done "fuzz build"
    fi
  else
    echo "[fuzz] skipped: clang++ is not installed"
  fi
fi
# Both halves of the sanitizer stage: TSan on the threaded suites, ASan+UBSan
# on the unit and integration suites (tools/dev/sanitizers.sh says
# which and why, and what stays out).  A report fails the run.
if [ "${QRT_SKIP_SANITIZERS:-0}" != 1 ]; then
  san=${QRT_SANITIZERS:-all}
  case $san in
    all) san_only= ;;
    tsan|asan) san_only=$san ;;
    *) echo "[test] QRT_SANITIZERS must be all, tsan or asan, not $san" >&2; exit 2 ;;
  esac
  for half in tsan asan; do
    if [ -z "$san_only" ] || [ "$san_only" = "$half" ]; then
      stage "$half" env QRT_SAN_ONLY=$half "$here/tools/dev/sanitizers.sh"
    fi
  done
fi
echo "[test] done in $(( $(date +%s) - start )) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "[test] FAILED stages: ${failed[*]}"
  # The failed tests' names again at the very end, where a log's tail shows
  # them (ctest's own summary is far above when later stages ran).
  for f in "$build/Testing/Temporary/LastTestsFailed.log" \
           "${QRT_FUZZ_BUILD_DIR:-$here/build-fuzz}/Testing/Temporary/LastTestsFailed.log"; do
    if [ -s "$f" ]; then
      echo "[test] failed tests ($f):"
      sed 's/^/[test]   /' "$f"
    fi
  done
  exit 1
fi
