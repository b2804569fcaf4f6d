#!/usr/bin/env bash
# Quick start command 2: install dependencies, build, run the whole test suite,
# then short libFuzzer smoke runs of every fuzz target (the socket's request
# path, the restore journal parser root reads, the calibration update path,
# the config loader, the QPU wire codec, the eBPF record decoders), then the
# threaded parts under TSan and a unit subset under ASan+UBSan
# (tools/quickstart/sanitizers.sh says which and why).
#   QRT_BUILD_DIR         build directory (default ./build)
#   QRT_TEST_JOBS         ctest parallelism (default 2)
#   QRT_SKIP_FUZZ=1       skip the fuzz smoke runs (they need clang)
#   QRT_SKIP_SANITIZERS=1 skip the sanitizer stage
#   QRT_SANITIZERS=all    run ASan+UBSan too, not only TSan
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
    cmake --build "$fuzz" -j "${QRT_JOBS:-$(nproc)}" --target "${targets[@]}"
    echo "[fuzz] smoke runs: 5000 executions each from the seed corpora"
    (cd "$fuzz" && ctest --output-on-failure -R '^fuzz_' --timeout 600)
  else
    echo "[fuzz] skipped: clang++ is not installed"
  fi
fi
# The test command runs the TSan half of the sanitizer stage (the threaded
# parts: rings, RT threads, event loop, dispatcher, server).  Each half
# rebuilds the whole agent library instrumented, about 10 min of wall time on
# 2 vCPUs, and both together would put the run over 30 min.  ASan+UBSan
# already run on every parser through the fuzz smoke runs above (the fuzz
# targets are built with -fsanitize=fuzzer,address,undefined); the full
# ASan+UBSan unit subset is `tools/quickstart/sanitizers.sh` or
# QRT_SANITIZERS=all here.
if [ "${QRT_SKIP_SANITIZERS:-0}" != 1 ]; then
  san_only=tsan
  [ "${QRT_SANITIZERS:-tsan}" = all ] && san_only=
  echo "[sanitizers] ${san_only:-TSan and ASan+UBSan} builds of the chosen tests ($(( $(date +%s) - start )) s so far)"
  QRT_SAN_ONLY=$san_only "$here/tools/quickstart/sanitizers.sh"
fi
echo "[test] done in $(( $(date +%s) - start )) s"
