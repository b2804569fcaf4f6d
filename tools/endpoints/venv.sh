#!/bin/sh
# venv.sh PACKAGE VENV_DIR: create (or bring up to date) the virtual
# environment of one Python endpoint of this room -- PACKAGE is qpu-qblox or
# qpu-labone: the pinned packages of PACKAGE/requirements.txt, then this
# repository's qrt-client (tools/clients/python), qrt-endpoint (the
# framework) and PACKAGE itself, installed by pip as a user would; never the
# system Python.  It runs from the source tree (tools/endpoints/venv.sh,
# into build/venv-qblox, build/venv-labone) and installed
# (/usr/share/qrtd/python/endpoint-venv.sh, beside the distributions: as
# root, into /opt/qrtd/PACKAGE, what PACKAGE.service runs).  Reruns are cheap: a stamp of the requirements and the
# interpreter says they are in, a stamp of the three packages' sources says
# those are.  The base interpreter is Debian's own when there is one, so
# that any user (the endpoint's own, under systemd) can run the venv;
# QRT_PYTHON overrides it.  Prints the venv's python on success; exits 77
# (ctest's skip) naming why when PyPI cannot be reached, 1 on any other
# failure.
set -eu
pkg=${1:?usage: venv.sh PACKAGE VENV_DIR}
venv=${2:?usage: venv.sh PACKAGE VENV_DIR}
here=$(cd "$(dirname "$0")" && pwd)
if [ -d "$here/../clients/python" ]; then   # the source tree: tools/endpoints
  client=$here/../clients/python
else                                        # installed: /usr/share/qrtd/python
  client=$here/qrt-client
fi
framework=$here/qrt-endpoint
dir=$here/$pkg
[ -f "$dir/pyproject.toml" ] && [ -f "$dir/requirements.txt" ] || { echo "venv.sh: no package $dir" >&2; exit 1; }
if [ -n "${QRT_PYTHON:-}" ]; then
  python=$QRT_PYTHON
elif [ -x /usr/bin/python3 ]; then
  python=/usr/bin/python3
else
  python=python3
fi
command -v "$python" >/dev/null 2>&1 || { echo "venv.sh: $python not found" >&2; exit 1; }
module=$(echo "$pkg" | tr - _)
req=$dir/requirements.txt
sum=$( (cat "$req"; readlink -f "$(command -v "$python")") | sha256sum | cut -d' ' -f1)
srcsum=$(for d in "$client" "$framework" "$dir"; do
           (cd "$d" && find pyproject.toml src -type f ! -path '*__pycache__*' | sort | xargs sha256sum)
         done | sha256sum | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.qrt-requirements.sha256" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$venv"
  "$python" -m venv "$venv" >&2 || { echo "venv.sh: '$python -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  if ! out=$("$venv/bin/pip" install --disable-pip-version-check --no-input -q -r "$req" 2>&1); then
    echo "$out" | tail -20 >&2
    rm -rf "$venv"
    if echo "$out" | grep -qiE "connection|resolve|network|timed out"; then
      echo "venv.sh: SKIP: cannot reach PyPI for $req (see above)" >&2
      exit 77
    fi
    echo "venv.sh: pip could not install $req" >&2
    exit 1
  fi
  echo "$sum" > "$venv/.qrt-requirements.sha256"
fi
if [ "$(cat "$venv/.qrt-package.sha256" 2>/dev/null)" != "$srcsum" ]; then
  # From copies: setuptools builds in the tree it is given (build/,
  # *.egg-info), and the source tree stays as it was.
  src=$(mktemp -d "${TMPDIR:-/tmp}/qrt-endpoint-src.XXXXXX")
  trap 'rm -rf "$src"' EXIT
  for d in "qrt-client:$client" "qrt-endpoint:$framework" "$pkg:$dir"; do
    mkdir "$src/${d%%:*}"
    cp -r "${d#*:}/pyproject.toml" "${d#*:}/src" "$src/${d%%:*}/"
  done
  find "$src" -name __pycache__ -prune -exec rm -rf {} +
  "$venv/bin/pip" install --disable-pip-version-check --no-input -q --no-deps --no-build-isolation \
    --force-reinstall "$src/qrt-client" "$src/qrt-endpoint" "$src/$pkg" >&2 \
    || { echo "venv.sh: could not install qrt-client, qrt-endpoint and $pkg" >&2; exit 1; }
  echo "$srcsum" > "$venv/.qrt-package.sha256"
fi
"$venv/bin/python" -c "import qrt_client, qrt_endpoint, $module" >&2 || { echo "venv.sh: $module does not import" >&2; exit 1; }
echo "$venv/bin/python"
