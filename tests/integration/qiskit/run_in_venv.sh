#!/bin/sh
# run_in_venv.sh VENV SCRIPT [ARGS...]: run SCRIPT with VENV's python, or skip
# (77, ctest's SKIP_RETURN_CODE) naming why when the venv is not there.
venv=$1
shift
if [ ! -x "$venv/bin/python" ]; then
  echo "SKIP: no $venv/bin/python: the sdk.venv fixture could not install the pinned SDKs (see its output)"
  exit 77
fi
exec "$venv/bin/python" "$@"
