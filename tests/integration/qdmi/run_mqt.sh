#!/bin/sh
# run_mqt.sh QDMI_VENV SDK_VENV SCRIPT [ARGS...]: run SCRIPT where mqt.core
# (QDMI_VENV, made at configure time by tools/integrations/qdmi/venv.sh) can be imported,
# with Qiskit too when the SDK venv (tests/integration/qiskit's sdk_venv
# fixture) is there: its python, and QDMI_VENV's site-packages on the path
# (both venvs come from the same python3).  Without the SDK venv, QDMI_VENV's
# python alone (the Qiskit-backend test then skips, naming why).
qdmi=$1
sdk=$2
shift 2
site=$("$qdmi/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || {
  echo "SKIP: $qdmi/bin/python does not run"; exit 77; }
if [ -x "$sdk/bin/python" ] && [ "$("$sdk/bin/python" -c 'import sys; print(sys.version_info[:2])')" = \
     "$("$qdmi/bin/python" -c 'import sys; print(sys.version_info[:2])')" ]; then
  PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} exec "$sdk/bin/python" "$@"
fi
exec "$qdmi/bin/python" "$@"
