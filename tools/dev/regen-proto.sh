#!/usr/bin/env bash
# Rewrite every language's copy of the protocol table after an edit of
# agent/proto/protocol.toml: C (wire.h), C++ (table.hpp), Python
# (qrt_client/protocol.py) and Go (qrtproto/protocol.go).  ctest
# proto.generated_files_are_current fails until this is run and the copies
# are committed.
#   tools/dev/regen-proto.sh [path/to/qrt-protogen]   (default: build it in ./build)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
gen=${1:-}
if [ -z "$gen" ]; then
  build=${QRT_BUILD_DIR:-$here/build}
  if [ ! -f "$build/CMakeCache.txt" ]; then
    echo "regen-proto: no build in $build; run tools/quickstart/build.sh first, or pass qrt-protogen's path" >&2
    exit 2
  fi
  cmake --build "$build" --target qrt-protogen >/dev/null
  gen=$build/agent/qrt-protogen
fi
"$gen" --table "$here/agent/proto/protocol.toml" --write "$here"
"$gen" --table "$here/agent/proto/protocol.toml" --check "$here"
