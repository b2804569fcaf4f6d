#!/usr/bin/env bash
# The pinned MQT Core wheel (requirements.txt: QDMI's headers and CMake
# package, and the QDMI driver the tests load) in a cache outside the clone,
# keyed by the version and the pins, as tools/integrations/k8s/controlplane
# does for Go: a second clone, or a second run, finds it there and fetches
# nothing.  tools/dev/deps.sh runs it; configure only asks where it is.
#
#   qdmi-cache.sh         fetch what is missing (pip download --require-hashes
#                         from PyPI, then unpacked with pip install --target,
#                         offline); print the directory on stdout
#   qdmi-cache.sh --dir   print the directory only (nothing is fetched)
#
#   QRT_QDMI_CACHE   the cache's root (default ${XDG_CACHE_HOME:-$HOME/.cache}/qrtd)
#   QRT_PYTHON       the python3 whose pip fetches (default python3)
#
# The directory holds wheels/ (the exact wheels, checked against their
# hashes) and site/ (them unpacked: mqt/core/share/cmake/qdmi is the CMake
# package configure finds, and site/ on PYTHONPATH imports mqt.core).  Two
# runs at once take turns on a lock; a killed run leaves no half-filled
# directory (it fills a temporary one and renames it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
req=$here/requirements.txt
ver=$(sed -n 's/^mqt-core==\([^ ]*\) .*/\1/p' "$req")
[ -n "$ver" ] || { echo "qdmi-cache.sh: no mqt-core pin in $req" >&2; exit 1; }
pins=$(sha256sum "$req" | cut -c1-12)
if [ -n "${XDG_CACHE_HOME:-}" ]; then root=$XDG_CACHE_HOME/qrtd
elif [ -n "${HOME:-}" ]; then root=$HOME/.cache/qrtd
else root=/var/cache/qrtd; fi
root=${QRT_QDMI_CACHE:-$root}
dir=$root/qdmi-mqt-core-$ver-$pins

if [ "${1:-}" = --dir ]; then echo "$dir"; exit 0; fi
if [ -f "$dir/.complete" ]; then echo "$dir"; exit 0; fi

mkdir -p "$root"
exec 9>"$root/.qdmi-cache.lock"
if ! flock -n 9; then
  echo "[qdmi-cache] another run holds $root/.qdmi-cache.lock: waiting for it" >&2
  flock 9
fi
if [ -f "$dir/.complete" ]; then echo "$dir"; exit 0; fi

python=${QRT_PYTHON:-python3}
command -v "$python" >/dev/null 2>&1 || { echo "qdmi-cache.sh: $python not found" >&2; exit 1; }
tmp=$(mktemp -d "$root/.qdmi-cache.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "[qdmi-cache] mqt-core $ver (QDMI's headers) -> $dir" >&2
# pip from a throwaway venv: never the system Python's.
"$python" -m venv "$tmp/pip" >&2 ||
  { echo "qdmi-cache.sh: '$python -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
if ! "$tmp/pip/bin/pip" download --disable-pip-version-check --no-input -q --no-deps \
     --only-binary=:all: --require-hashes -r "$req" -d "$tmp/wheels" >&2; then
  echo "qdmi-cache.sh: pip could not fetch $req (is PyPI reachable?)" >&2
  exit 1
fi
"$tmp/pip/bin/pip" install --disable-pip-version-check --no-input -q --no-index --no-deps \
  --target "$tmp/site" "$tmp"/wheels/*.whl >&2
rm -rf "$tmp/pip"
[ -f "$tmp/site/mqt/core/share/cmake/qdmi/qdmi-config.cmake" ] ||
  { echo "qdmi-cache.sh: mqt-core $ver ships no QDMI CMake package" >&2; exit 1; }
chmod -R a+rX "$tmp"
touch "$tmp/.complete"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$dir"
