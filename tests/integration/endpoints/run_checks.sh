#!/bin/sh
# run_checks.sh VENV PACKAGE_DIR pytest|none: ruff and mypy over the
# package's sources with the venv's tools, then (pytest) its test suite
# against the installed package; skips (77) naming why when the venv is not
# there.
venv=$1
pkg=$2
tests=${3:-pytest}
if [ ! -x "$venv/bin/python" ]; then
  echo "SKIP: no $venv/bin/python: the venv fixture could not install the pinned packages (see its output)"
  exit 77
fi
set -e
cd "$pkg"
"$venv/bin/ruff" check --no-cache src $( [ -d tests ] && echo tests )
"$venv/bin/mypy" --cache-dir=/dev/null src
[ "$tests" = pytest ] || exit 0
work=$(mktemp -d "${TMPDIR:-/tmp}/qrt-endpoints.XXXXXX")
trap 'rm -rf "$work"' EXIT
# the installed package, not the source tree, is what the tests import
cd "$work"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$pkg/tests"
