#!/usr/bin/env bash
# Create (or reuse) the virtual environment the Python checks run in:
#   tools/dev/lint_venv.sh BUILD_DIR      -> BUILD_DIR/venv-lint
# It holds ruff and mypy as requirements-lint.txt pins them, and nothing of
# this repository (python_lint.py points mypy at the sources).  A stamp of
# the requirements and of the base interpreter decides whether anything is
# installed again, so a second run costs a hash.  Nothing goes into the
# system Python.  Exit status 77 (ctest's skip) when PyPI cannot be reached,
# naming why; 1 on any other failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: lint_venv.sh BUILD_DIR}
venv="$build/venv-lint"
# Debian's interpreter when there is one (as sdk_venv.sh); QRT_PYTHON overrides it.
if [ -n "${QRT_PYTHON:-}" ]; then
  python=$QRT_PYTHON
elif [ -x /usr/bin/python3 ]; then
  python=/usr/bin/python3
else
  python=python3
fi
req="$here/requirements-lint.txt"
stamp=$( (cat "$req"; readlink -f "$(command -v "$python")") | sha256sum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.qrt-req-stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "[lint-venv] ready: $venv"
  exit 0
fi
if [ -e "$venv" ]; then
  if [ ! -w "$venv" ]; then
    echo "[lint-venv] $venv belongs to $(stat -c %U "$venv") and is not current: ask its owner to run $0 $build" >&2
    exit 1
  fi
  echo "[lint-venv] $venv was made from another interpreter or requirements: remaking it"
  rm -rf "$venv"
fi
echo "[lint-venv] creating $venv from $python"
"$python" -m venv "$venv"
if ! out=$("$venv/bin/pip" install --disable-pip-version-check -q --no-deps -r "$req" 2>&1); then
  echo "$out" | tail -20
  if echo "$out" | grep -qiE "connection|resolve|network|timed out|No matching distribution"; then
    echo "[lint-venv] SKIP: cannot install the pinned checkers from PyPI (see above)"
    exit 77
  fi
  exit 1
fi
# --no-deps above: every requirement is pinned here; pip check says if one is missing.
"$venv/bin/pip" check --disable-pip-version-check
echo "$stamp" > "$venv/.qrt-req-stamp"
echo "[lint-venv] ready: $venv"
