#!/usr/bin/env bash
# Quick start command 2: install dependencies, build, run the whole test suite.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${QRT_BUILD_DIR:-$here/build}
"$here/tools/quickstart/deps.sh"
"$here/tools/quickstart/build.sh"
echo "[test] running ctest in $build"
cd "$build"
ctest --output-on-failure -j "${QRT_TEST_JOBS:-2}" --timeout 600
