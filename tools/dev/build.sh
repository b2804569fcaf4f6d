#!/usr/bin/env bash
# Configure and build qrtd into ./build (or $QRT_BUILD_DIR).  Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
# Paths under the checkout hash relative to it, so that a fresh clone in
# another directory (CI's mktemp -d) hits what an earlier clone cached.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$here}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
build=${QRT_BUILD_DIR:-$here/build}
jobs=${QRT_JOBS:-$(nproc)}
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
# ccache (from deps.sh) makes a rebuild in a fresh clone mostly cache hits.
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  echo "[build] configuring $build"
  cmake -S "$here" -B "$build" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=${QRT_BUILD_TYPE:-Release} \
        -DQRT_WERROR=${QRT_WERROR:-ON} ${QRT_CMAKE_ARGS:-}
fi
echo "[build] building with $jobs jobs"
cmake --build "$build" -j "$jobs"
echo "[build] done: $build"
