#!/usr/bin/env bash
# Create (or reuse) the virtual environment the SDK tests run in:
#   tools/integrations/qiskit/sdk_venv.sh BUILD_DIR      -> BUILD_DIR/venv
# It holds the pinned SDKs of requirements-sdk.txt and this repository's two
# Python packages, qrt-client (tools/clients/python) and qrtd-qiskit
# (tools/integrations/qiskit), installed by pip as a user would.  A stamp of
# the requirements and of the packages' sources decides whether anything is
# installed again, so a second run costs a hash.  Nothing goes into the
# system Python.  Exit status 77 (ctest's skip) when PyPI cannot be reached,
# naming why; 1 on any other failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: sdk_venv.sh BUILD_DIR}
venv="$build/venv"
# The base interpreter: Debian's own when there is one, so that every user
# can run the venv (one made from an interpreter under a private directory,
# such as pyenv's in /root, serves its maker only: README's "From Qiskit"
# runs as any user).  QRT_PYTHON overrides it.
if [ -n "${QRT_PYTHON:-}" ]; then
  python=$QRT_PYTHON
elif [ -x /usr/bin/python3 ]; then
  python=/usr/bin/python3
else
  python=python3
fi
req="$here/requirements-sdk.txt"

hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }
req_stamp=$( (cat "$req"; readlink -f "$(command -v "$python")") | sha256sum | cut -d' ' -f1)
client=$here/../../clients/python
pkg_stamp=$(hash_of "$client/pyproject.toml" "$here/pyproject.toml" \
                    $(find "$client/src" "$here/src" -name '*.py' | sort))

if [ -e "$venv" ] && [ ! -w "$venv" ]; then
  # Someone else's venv (root made it for the tests): use it if it runs for
  # us and is current, never try to remake it.
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.qrt-req-stamp" 2>/dev/null)" = "$req_stamp" ]; then
    echo "[sdk-venv] ready: $venv (made by its owner)"
    exit 0
  fi
  echo "[sdk-venv] $venv belongs to $(stat -c %U "$venv") and is not usable as $(id -un):" \
       "ask its owner to run $0 $build, or pass another build directory" >&2
  exit 1
fi
if [ -e "$venv" ] && [ "$(cat "$venv/.qrt-req-stamp" 2>/dev/null)" != "$req_stamp" ]; then
  echo "[sdk-venv] $venv was made from another interpreter or requirements: remaking it"
  rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "[sdk-venv] creating $venv from $python"
  "$python" -m venv "$venv"
fi
if [ "$(cat "$venv/.qrt-req-stamp" 2>/dev/null)" != "$req_stamp" ]; then
  echo "[sdk-venv] installing $req"
  if ! out=$("$venv/bin/pip" install --disable-pip-version-check -q -r "$req" 2>&1); then
    echo "$out" | tail -20
    if echo "$out" | grep -qiE "connection|resolve|network|timed out|No matching distribution"; then
      echo "[sdk-venv] SKIP: cannot install the pinned SDKs from PyPI (see above)"
      exit 77
    fi
    exit 1
  fi
  echo "$req_stamp" > "$venv/.qrt-req-stamp"
  rm -f "$venv/.qrt-pkg-stamp"
fi
if [ "$(cat "$venv/.qrt-pkg-stamp" 2>/dev/null)" != "$pkg_stamp" ]; then
  echo "[sdk-venv] installing qrt-client and qrtd-qiskit"
  # From a copy: setuptools builds in the tree it is given (build/,
  # *.egg-info), and the source tree stays as it was.
  src=$(mktemp -d "$build/sdk-src.XXXXXX")
  trap 'rm -rf "$src"' EXIT
  mkdir "$src/qrt-client" "$src/qrtd-qiskit"
  cp -r "$client/pyproject.toml" "$client/src" "$src/qrt-client/"
  cp -r "$here/pyproject.toml" "$here/src" "$src/qrtd-qiskit/"
  find "$src" -name __pycache__ -prune -exec rm -rf {} +
  "$venv/bin/pip" install --disable-pip-version-check -q --no-deps --no-build-isolation --force-reinstall \
    "$src/qrt-client" "$src/qrtd-qiskit"
  echo "$pkg_stamp" > "$venv/.qrt-pkg-stamp"
fi
"$venv/bin/python" -c "import qiskit, qiskit_aer, qiskit_qasm3_import, qrt_client, qrtd_qiskit"
echo "[sdk-venv] ready: $venv"
