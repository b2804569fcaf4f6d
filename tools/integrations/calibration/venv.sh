#!/bin/sh
# venv.sh VENV_DIR: create (once) the virtual environment of qrt-calibration
# -- the pinned packages of requirements.txt, then qrt-client
# (tools/clients/python), qrtd-qiskit (tools/integrations/qiskit) and
# qrt-calibration itself, installed by pip as a user would -- never the
# system Python.  Reruns are cheap: a stamp of the requirements' checksum
# (and the interpreter) says they are in, a stamp of the packages' sources
# says they are.  Prints the venv's python on success; exits 77 (ctest's
# skip) naming why when PyPI cannot be reached, 1 on any other failure.
set -eu
venv=${1:?usage: venv.sh VENV_DIR}
here=$(cd "$(dirname "$0")" && pwd)
tools=$(cd "$here/../.." && pwd)
req=$here/requirements.txt
# Debian's own interpreter when there is one, so that every user (the
# service's own) can run the venv; QRT_PYTHON overrides it.
if [ -n "${QRT_PYTHON:-}" ]; then python=$QRT_PYTHON
elif [ -x /usr/bin/python3 ]; then python=/usr/bin/python3
else python=python3; fi
command -v "$python" >/dev/null 2>&1 || { echo "venv.sh: $python not found" >&2; exit 1; }
sum=$( (cat "$req"; readlink -f "$(command -v "$python")") | sha256sum | cut -d' ' -f1)
pkgs="$tools/clients/python $tools/integrations/qiskit $here"
pkg=$(for d in $pkgs; do (cd "$d" && find pyproject.toml src -type f ! -path '*__pycache__*' | sort |
      sed "s|^|$d/|"); done | xargs sha256sum | sha256sum | cut -d' ' -f1)
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
  # From copies: setuptools builds in the tree it is given (build/,
  # *.egg-info), and the source tree stays as it was.
  src=$(mktemp -d "${TMPDIR:-/tmp}/qrt-calibration-src.XXXXXX")
  trap 'rm -rf "$src"' EXIT
  for d in $pkgs; do
    mkdir "$src/$(basename "$d")"
    cp -r "$d/pyproject.toml" "$d/src" "$src/$(basename "$d")/"
  done
  find "$src" -name __pycache__ -prune -exec rm -rf {} +
  "$venv/bin/pip" install --disable-pip-version-check --no-input -q --no-deps --no-build-isolation \
    --force-reinstall "$src/python" "$src/qiskit" "$src/calibration" >&2 ||
    { echo "venv.sh: could not install qrt-client, qrtd-qiskit and qrt-calibration" >&2; exit 1; }
  echo "$pkg" > "$venv/.qrt-package.sha256"
fi
"$venv/bin/python" -c "import qrt_client, qrtd_qiskit, qrt_calibration, qiskit_experiments" >&2 ||
  { echo "venv.sh: qrt_calibration does not import" >&2; exit 1; }
echo "$venv/bin/python"
