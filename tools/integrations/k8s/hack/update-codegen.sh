#!/usr/bin/env bash
# Regenerate the API's generated code (zz_generated.deepcopy.go) with
# deepcopy-gen, the tool go.mod pins (`go tool`, k8s.io/code-generator).
#   hack/update-codegen.sh            write it
#   hack/update-codegen.sh --verify   fail, naming the file, when it is stale (run-tests.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
pkgs=(./api/qpu.qrtd.io/v1alpha1)
out=zz_generated.deepcopy.go
if [ "${1:-}" = "--verify" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for p in "${pkgs[@]}"; do
    mkdir -p "$tmp/$p"
    cp "$p"/*.go "$tmp/$p/"
  done
  GOFLAGS="${GOFLAGS:-} -mod=readonly" go tool deepcopy-gen --output-file "$out" \
    --go-header-file hack/boilerplate.go.txt "${pkgs[@]}"
  stale=0
  for p in "${pkgs[@]}"; do
    if ! diff -u "$tmp/$p/$out" "$p/$out"; then
      echo "$p/$out is stale: run hack/update-codegen.sh and commit it" >&2
      stale=1
    fi
    cp "$tmp/$p/$out" "$p/$out"  # the tree as it was
  done
  exit $stale
fi
go tool deepcopy-gen --output-file "$out" --go-header-file hack/boilerplate.go.txt "${pkgs[@]}"
