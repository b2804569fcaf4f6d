#!/bin/sh
# Fails when a file of the repository points at a design or style file kept
# outside it: the design of record lives in the repository (README.md's
# architecture section and the README.md of each folder of agent/src and
# rtcore/), so nothing may send a reader to a sibling directory of the clone.
#
#   no_outside_references.sh SOURCE_DIR          check the tree
#   no_outside_references.sh --self-test         prove that it refuses one
#
# In a git checkout the files are the ones git tracks plus the untracked
# ones it does not ignore; elsewhere (a release tarball) every file below
# SOURCE_DIR outside build trees.  Exit 0: none found; 1: each hit printed as
# file:line: text; 2: usage.
set -eu

# The patterns, as extended regular expressions.  Written so that this file
# does not match them itself.
base='\.\./shared|shared/(DESIGN|STYLE)'

check() {
  dir=$1
  cd "$dir" || exit 2
  # A bare DESIGN or STYLE markdown file name points outside too, unless the
  # repository has one at its top.
  pattern=$base
  for f in DESIGN STYLE; do
    [ -e "$f.md" ] || pattern="$pattern|$f\\.md"
  done
  list=$(mktemp)
  trap 'rm -f "$list"' EXIT
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard >"$list"
  else
    # Build trees hold copies of the sources' text (CMake caches, logs).
    find . -type d \( -name .git -o -name 'build*' \) -prune -o -type f -print0 >"$list"
  fi
  hits=$(xargs -0 -r grep -I -n -E "$pattern" -- <"$list" 2>/dev/null || true)
  if [ -n "$hits" ]; then
    printf '%s\n' "$hits"
    n=$(printf '%s\n' "$hits" | wc -l)
    echo "no_outside_references: $n line(s) above point outside the repository ($pattern):" \
         "say it here instead (README.md, the folder's README.md)" >&2
    return 1
  fi
  n=$(tr -cd '\0' <"$list" | wc -c)
  echo "no_outside_references: $n files, none points outside the repository"
}

case ${1:-} in
--self-test)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  up=..
  d=DESIGN
  ref="$up/shared/$d.md"
  mkdir -p "$tmp/agent"
  printf 'int x;\n' >"$tmp/agent/a.cpp"
  printf '// see %s, "Threads"\n' "$ref" >"$tmp/agent/b.hpp"
  if out=$(sh "$0" "$tmp" 2>&1); then
    echo "self-test: a file naming $ref was not refused: $out" >&2
    exit 1
  fi
  case $out in
  *"agent/b.hpp:1:"*) echo "self-test: refused, naming agent/b.hpp:1" ;;
  *) echo "self-test: refused, but without naming the file and line: $out" >&2; exit 1 ;;
  esac
  ;;
'' | -*)
  echo "usage: $0 SOURCE_DIR | --self-test" >&2
  exit 2
  ;;
*)
  check "$1"
  ;;
esac
