#!/usr/bin/env bash
# Regenerate what the config option table writes into the tree: the shipped
# config/qrtd.toml and the OPTIONS list of qrtd.toml(5) (from `.SS "[agent]"`
# up to the next .SH).  The config_reference tests fail until this is run
# after a change to agent/src/config/config_table.cpp.
#   tools/dev/regen-config-docs.sh [path/to/qrtd]   (default build/agent/qrtd)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
qrtd=${1:-$here/build/agent/qrtd}
"$qrtd" config-reference > "$here/config/qrtd.toml"
roff=$("$qrtd" config-reference --roff)
python3 - "$here/agent/man/qrtd.toml.5" "$roff" <<'PY'
import sys
path, roff = sys.argv[1], sys.argv[2]
text = open(path).read()
start = text.index('.SS "[agent]"')
end = text.index("\n.SH ", start) + 1
open(path, "w").write(text[:start] + roff.rstrip("\n") + "\n" + text[end:])
PY
echo "regenerated config/qrtd.toml and the OPTIONS of agent/man/qrtd.toml.5"
