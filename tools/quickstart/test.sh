#!/usr/bin/env bash
# Quick start command 2: install dependencies, build, run the whole test suite,
# then short libFuzzer smoke runs of the socket's request path and of the
# restore journal parser (root reads it).
#   QRT_BUILD_DIR   build directory (default ./build)
#   QRT_TEST_JOBS   ctest parallelism (default 2)
#   QRT_SKIP_FUZZ=1 skip the fuzz smoke run (it needs clang)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${QRT_BUILD_DIR:-$here/build}
start=$(date +%s)
"$here/tools/quickstart/deps.sh"
"$here/tools/quickstart/build.sh"
echo "[test] running ctest in $build ($(( $(date +%s) - start )) s so far)"
# Tests that need root, BPF or a tool skip themselves with the reason.
(cd "$build" && ctest --output-on-failure -j "${QRT_TEST_JOBS:-2}" --timeout 600)

if [ "${QRT_SKIP_FUZZ:-0}" != 1 ]; then
  if command -v clang++ >/dev/null 2>&1; then
    fuzz=${QRT_FUZZ_BUILD_DIR:-$here/build-fuzz}
    echo "[fuzz] building fuzz_rpc_request and fuzz_journal with clang in $fuzz"
    if [ ! -f "$fuzz/CMakeCache.txt" ]; then
      cmake -S "$here" -B "$fuzz" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
            -DQRT_BUILD_FUZZ=ON -DQRT_BUILD_BENCH=OFF -DQRT_BUILD_BPF=OFF >/dev/null
    fi
    cmake --build "$fuzz" -j "${QRT_JOBS:-$(nproc)}" --target fuzz_rpc_request fuzz_journal
    echo "[fuzz] smoke runs: 5000 executions each from the seed corpora"
    (cd "$fuzz" && ctest --output-on-failure -R '^fuzz_' --timeout 600)
  else
    echo "[fuzz] skipped: clang++ is not installed"
  fi
fi
echo "[test] done in $(( $(date +%s) - start )) s"
