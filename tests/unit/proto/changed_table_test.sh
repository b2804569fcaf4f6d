#!/usr/bin/env bash
# proto.a_changed_table_is_caught: a field changed in the protocol table
# (a reason's code, the wire version) makes the staleness check fail and name
# every copy that no longer agrees: the check proto.generated_files_are_current
# runs is the one that would catch a hand edit or a forgotten regeneration.
#   changed_table_test.sh <qrt-protogen> <repository top>
set -euo pipefail
gen=$1
top=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
table=$top/agent/proto/protocol.toml

# The unchanged table passes.
"$gen" --table "$table" --check "$top"

check_changed() {  # FROM TO EXPECTED-STALE-FILE...
  local from=$1 to=$2
  shift 2
  sed "0,/$from/s//$to/" "$table" > "$tmp/protocol.toml"
  if cmp -s "$table" "$tmp/protocol.toml"; then
    echo "FAIL: the table no longer holds '$from'"; exit 1
  fi
  set +e
  "$gen" --table "$tmp/protocol.toml" --check "$top" 2> "$tmp/err"
  local rc=$?
  set -e
  cat "$tmp/err"
  if [ $rc -ne 1 ]; then
    echo "FAIL: --check exited $rc with '$from' changed to '$to' (want 1: stale)"; exit 1
  fi
  for f in "$@"; do
    grep -q "stale: $f" "$tmp/err" || { echo "FAIL: $f was not named stale"; exit 1; }
  done
}

# A reason's code: the C++, Python and Go tables all hold it.
check_changed 'code = -32003' 'code = -32090' \
  agent/proto/include/qrt/proto/table.hpp \
  tools/clients/python/src/qrt_client/protocol.py \
  tools/clients/go/qrtproto/protocol.go
# The wire's version: C and Python speak the wire.
check_changed '^version = 1$' 'version = 2' \
  agent/proto/include/qrt/proto/wire.h \
  tools/clients/python/src/qrt_client/protocol.py
# A state's column: sent no longer ends a job.
check_changed '{ name = "sent", finishes_job = true' '{ name = "sent", finishes_job = false' \
  agent/proto/include/qrt/proto/table.hpp \
  tools/clients/python/src/qrt_client/protocol.py \
  tools/clients/go/qrtproto/protocol.go
echo "PASS: every changed field made its copies stale, by name"
