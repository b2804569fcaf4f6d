#!/bin/sh
# venv.sh VENV_DIR: create (once) the virtual environment of qpu-qblox --
# the pinned packages of requirements.txt and qpu-qblox itself, installed
# by pip as a user would -- never the system Python.  Reruns are cheap: a
# stamp of the requirements' checksum says they are in, a stamp of the
# package's sources says it is.  Prints the venv's python on success;
# exits 77 (ctest's skip) naming why when PyPI cannot be reached, 1 on any
# other failure.
set -eu
venv=${1:?usage: venv.sh VENV_DIR}
here=$(cd "$(dirname "$0")" && pwd)
req=$here/requirements.txt
python=${QRT_PYTHON:-python3}
sum=$(sha256sum "$req" | cut -d' ' -f1)
pkg=$(cd "$here" && find pyproject.toml src -type f ! -path '*__pycache__*' | sort | xargs sha256sum | sha256sum | cut -d' ' -f1)
command -v "$python" >/dev/null 2>&1 || { echo "venv.sh: $python not found" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.qrt-requirements.sha256" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$venv"
  "$python" -m venv "$venv" >&2 || { echo "venv.sh: '$python -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  if ! out=$("$venv/bin/pip" install --disable-pip-version-check --no-input -q -r "$req" 2>&1); then
    echo "$out" | tail -20 >&2
    rm -rf "$venv"
    if echo "$out" | grep -qiE "connection|resolve|network|timed out|No matching distribution"; then
      echo "venv.sh: SKIP: cannot install $req from PyPI (see above)" >&2
      exit 77
    fi
    echo "venv.sh: pip could not install $req" >&2
    exit 1
  fi
  echo "$sum" > "$venv/.qrt-requirements.sha256"
fi
if [ "$(cat "$venv/.qrt-package.sha256" 2>/dev/null)" != "$pkg" ]; then
  # From a copy: setuptools builds in the tree it is given (build/,
  # *.egg-info), and the source tree stays as it was.
  src=$(mktemp -d "${TMPDIR:-/tmp}/qpu-qblox-src.XXXXXX")
  trap 'rm -rf "$src"' EXIT
  cp -r "$here/pyproject.toml" "$here/src" "$src/"
  "$venv/bin/pip" install --disable-pip-version-check --no-input -q --no-deps --no-build-isolation \
    --force-reinstall "$src" >&2 || { echo "venv.sh: could not install qpu-qblox" >&2; exit 1; }
  echo "$pkg" > "$venv/.qrt-package.sha256"
fi
"$venv/bin/python" -c "import qpu_qblox" >&2 || { echo "venv.sh: qpu_qblox does not import" >&2; exit 1; }
echo "$venv/bin/python"
