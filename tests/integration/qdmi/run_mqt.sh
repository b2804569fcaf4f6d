#!/bin/sh
# run_mqt.sh QDMI_SITE SDK_VENV SCRIPT [ARGS...]: run SCRIPT where mqt.core
# can be imported: QDMI_SITE (the pinned wheel unpacked in the cache
# tools/dev/deps.sh fills, tools/integrations/qdmi/qdmi-cache.sh) on the
# path of the SDK venv's python (tests/integration/qiskit's sdk_venv
# fixture: Qiskit too), else of Debian's python3 (the Qiskit-backend test
# then skips, naming why).  Both are the python3 the wheel is built for.
site=$1
sdk=$2
shift 2
if [ -z "$site" ] || [ ! -f "$site/mqt/core/__init__.py" ]; then
  echo "SKIP: mqt.core is not unpacked in the cache ('$site'): run tools/dev/deps.sh"
  exit 77
fi
python=python3
if [ -x "$sdk/bin/python" ] && PYTHONPATH=$site "$sdk/bin/python" -c 'import mqt.core.qdmi' 2>/dev/null; then
  python=$sdk/bin/python
fi
PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} exec "$python" "$@"
