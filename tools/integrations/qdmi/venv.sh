#!/bin/sh
# venv.sh VENV_DIR: create (once) the virtual environment that holds the
# pinned mqt.core of tools/integrations/qdmi/requirements.txt, never the system Python.
# CMake runs it at configure time (tools/integrations/qdmi/CMakeLists.txt): the QDMI
# headers libqrtd-qdmi.so is built against come from that wheel.  Reruns
# are cheap: a stamp holding the requirements' checksum says it is done.
# Prints the venv's python on success; exits non-zero naming the problem.
set -eu
venv=${1:?usage: venv.sh VENV_DIR}
here=$(cd "$(dirname "$0")" && pwd)
req=$here/requirements.txt
python=${QRT_PYTHON:-python3}
sum=$(sha256sum "$req" | cut -d' ' -f1)
stamp=$venv/.qrt-requirements.sha256
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$sum" ]; then
  echo "$venv/bin/python"
  exit 0
fi
command -v "$python" >/dev/null 2>&1 || { echo "venv.sh: $python not found" >&2; exit 1; }
rm -rf "$venv"
"$python" -m venv "$venv" >&2 || { echo "venv.sh: '$python -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
if ! "$venv/bin/pip" install --disable-pip-version-check --no-input -q -r "$req" >&2; then
  echo "venv.sh: pip could not install $req (is PyPI reachable?)" >&2
  rm -rf "$venv"
  exit 1
fi
echo "$sum" > "$stamp"
echo "$venv/bin/python"
