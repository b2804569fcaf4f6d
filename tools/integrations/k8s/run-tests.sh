#!/usr/bin/env bash
# ctest k8s.dra_driver: gofmt, go vet, the generated code, then `go test ./...`
# of the DRA driver (tools/integrations/k8s), once,
# against the qrtd and qpu-sim ctest passes in QRTD and QPU_SIM, and the
# Kubernetes control plane controlplane/build.sh builds (QRT_K8S_BIN: its
# directory; given, nothing is built).  Modules
# come from the Go module proxy as go.mod/go.sum pin them (-mod=readonly:
# nothing is changed, only fetched into the module cache); the build cache
# (GOCACHE) is reused between runs.  Exit 77 (ctest SKIP) without Go.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v go >/dev/null 2>&1; then
  for g in /usr/local/go/bin/go /usr/lib/go/bin/go; do
    if [ -x "$g" ]; then PATH=$(dirname "$g"):$PATH; break; fi
  done
fi
if ! command -v go >/dev/null 2>&1; then
  echo "SKIP: no go command (Go 1.26 or newer builds tools/integrations/k8s; see tools/integrations/k8s/README.md)"
  exit 77
fi
need=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$here/go.mod")
have=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
  echo "SKIP: go $have is older than go.mod's go $need"
  exit 77
fi
cd "$here"
# Without HOME (a bare CI environment) the go command has no default cache
# directories: keep them in one place that later runs reuse.
if [ -z "${HOME:-}" ] && [ -z "${GOCACHE:-}" ]; then
  export GOCACHE=/var/cache/qrt-go/build GOMODCACHE=${GOMODCACHE:-/var/cache/qrt-go/mod}
fi
# The real control plane the end-to-end tests run against (etcd,
# kube-apiserver, kube-scheduler, kube-controller-manager): built from the
# pinned modules into a cache outside the clone the first time (about 15
# minutes of CPU; progress on stderr), found there afterwards.
if [ -z "${QRT_K8S_BIN:-}" ]; then
  QRT_K8S_BIN=$("$here/controlplane/build.sh")
  export QRT_K8S_BIN
fi
export GOFLAGS="-mod=readonly ${GOFLAGS:-}"
go mod download
# The Go ecosystem's own bars: gofmt, go vet, and generated code current
# (deepcopy-gen, hack/update-codegen.sh).
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted (run gofmt -w)" >&2
  exit 1
fi
go vet ./...
hack/update-codegen.sh --verify
exec go test -count=1 ./... "$@"
