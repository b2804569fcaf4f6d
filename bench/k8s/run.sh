#!/usr/bin/env bash
# NodePrepareResources of the DRA driver qpu.qrtd.io (tools/integrations/k8s) with a
# real qrtd and qpu-sim: p50/p99 of the kubelet's gRPC call, one claim at a
# time (100) and 32 pods' calls at once (5 rounds), and the time from a
# pushed calibration.update to the republished ResourceSlice.  Ends with
# one JSON line.  Needs the build (qrtd, qpu-sim) and Go.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${QRT_BUILD_DIR:-$here/build}
export QRTD=${QRTD:-$build/agent/qrtd} QPU_SIM=${QPU_SIM:-$build/tools/endpoints/qpu-sim/qpu-sim}
cd "$here/tools/integrations/k8s"
QRT_K8S_BENCH=1 go test -count=1 -v -run 'TestACalibrationUpdateIsRepublished|TestBenchNodePrepareResources' \
    ./internal/driver/ 2>/dev/null | grep -E 'republished ResourceSlice|^NodePrepareResources|^\{"bench"' | sed 's/^ *driver_test.go:[0-9]*: //'
