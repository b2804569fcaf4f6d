#!/usr/bin/env bash
# Builds the Kubernetes control plane the DRA driver's end-to-end tests run
# against (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) from
# the published Go modules pinned in kube/go.mod and etcd/go.mod, into a cache
# outside the clone keyed by the versions and the pins, as ccache is for C++:
# a second clone, or a second run, finds them there and builds nothing.
#
#   build.sh            build what is missing; print the directory on stdout
#   build.sh --dir      print the directory only (nothing is built)
#
#   QRT_K8S_CACHE   the cache's root (default ${XDG_CACHE_HOME:-$HOME/.cache}/qrtd)
#   QRT_K8S_NICE    niceness of the build (default 10: it shares the machine)
#
# Progress goes to stderr: one line every 100 packages compiled, and the time
# each binary set took.  The first build is about 15 minutes of CPU (README,
# "Tests").  Two runs at once take turns on a lock; a killed build leaves no
# half-filled directory (it builds into a temporary one and renames it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v go >/dev/null 2>&1; then
  for g in /usr/local/go/bin/go /usr/lib/go/bin/go; do
    if [ -x "$g" ]; then PATH=$(dirname "$g"):$PATH; break; fi
  done
fi
command -v go >/dev/null 2>&1 || { echo "build.sh: no go command" >&2; exit 77; }

version_of() { # version_of GO.MOD MODULE: the version go.mod requires
  sed -n "s|^[[:space:]]*\\(require \\)\\{0,1\\}$2 \\(v[^ ]*\\).*|\\2|p" "$1" | head -1
}
kube=$(version_of "$here/kube/go.mod" k8s.io/kubernetes)
etcd=$(version_of "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)
[ -n "$kube" ] && [ -n "$etcd" ] || { echo "build.sh: cannot read the pinned versions" >&2; exit 1; }
pins=$(cat "$here"/kube/go.mod "$here"/kube/go.sum "$here"/etcd/go.mod "$here"/etcd/go.sum |
  sha256sum | cut -c1-12)
gov=$(go env GOVERSION)
if [ -n "${XDG_CACHE_HOME:-}" ]; then root=$XDG_CACHE_HOME/qrtd
elif [ -n "${HOME:-}" ]; then root=$HOME/.cache/qrtd
else root=/var/cache/qrtd; fi
root=${QRT_K8S_CACHE:-$root}
dir="$root/k8s-$kube-etcd-$etcd-$gov-$pins"
bins=(etcd kube-apiserver kube-scheduler kube-controller-manager)
complete() { for b in "${bins[@]}"; do [ -x "$dir/$b" ] || return 1; done; }

if [ "${1:-}" = --dir ]; then echo "$dir"; exit 0; fi
if complete; then echo "$dir"; exit 0; fi

mkdir -p "$root"
exec 9>"$root/.k8s-build.lock"
if ! flock -n 9; then
  echo "[k8s-build] another build holds $root/.k8s-build.lock: waiting for it" >&2
  flock 9
fi
if complete; then echo "$dir"; exit 0; fi

# Without HOME (a bare CI environment) the go command has no default cache.
if [ -z "${HOME:-}" ] && [ -z "${GOCACHE:-}" ]; then
  export GOCACHE=/var/cache/qrt-go/build GOMODCACHE=${GOMODCACHE:-/var/cache/qrt-go/mod}
fi
export GOFLAGS="-mod=readonly -trimpath" CGO_ENABLED=0 GOTOOLCHAIN=local
tmp=$(mktemp -d "$root/.k8s-build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s)
echo "[k8s-build] kubernetes $kube, etcd $etcd, $gov -> $dir" >&2

# build MODULE_DIR LABEL PACKAGE...: go build with a progress line every 100
# packages compiled (go build -v names each one as it starts it).
build() {
  local mod=$1 label=$2
  shift 2
  local total start
  start=$(date +%s)
  total=$(cd "$mod" && go list -deps "$@" | wc -l)
  echo "[k8s-build] $label: $total packages (those already in the Go build cache are not compiled)" >&2
  (cd "$mod" && nice -n "${QRT_K8S_NICE:-10}" go build -v -ldflags='-s -w' -o "$tmp/" "$@") 2>&1 |
    awk -v label="$label" -v total="$total" -v start="$start" '
      /^[a-z0-9._-]+(\/[^ ]*)?$/ { n++; if (n % 100 == 0) {
          cmd = "date +%s"; cmd | getline now; close(cmd)
          printf "[k8s-build] %s: %d/%d packages compiled (%d s)\n", label, n, total, now - start
          fflush() }
        next }
      { print; fflush() }' >&2
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { echo "[k8s-build] $label: go build failed ($rc)" >&2; return "$rc"; }
  echo "[k8s-build] $label: done in $(( $(date +%s) - start )) s" >&2
}
build "$here/etcd" etcd go.etcd.io/etcd/server/v3
# go names the binary of go.etcd.io/etcd/server/v3 "server".
mv "$tmp/server" "$tmp/etcd"
build "$here/kube" kube-apiserver,kube-scheduler,kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager
printf 'kubernetes %s\netcd %s\n%s\npins %s\nbuilt in %d s\n' "$kube" "$etcd" "$gov" "$pins" \
  "$(( $(date +%s) - t0 ))" >"$tmp/VERSIONS"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "[k8s-build] control plane built in $(( $(date +%s) - t0 )) s: $dir" >&2
echo "$dir"
