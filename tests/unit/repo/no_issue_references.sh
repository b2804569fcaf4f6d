#!/bin/sh
# Fails when a file of the repository cites a tracker entry ("issue #N",
# "issue N", "#N section M") instead of saying the point itself: nobody who
# reads the repository has the tracker, so a comment, doc, man page or test
# says what was promised or what broke, in its own words.
#
#   no_issue_references.sh SOURCE_DIR    check every file
#   no_issue_references.sh --self-test   prove that it refuses one
#
# In a git checkout the files are the ones git tracks plus the untracked
# ones it does not ignore; elsewhere every file below SOURCE_DIR outside
# build trees.  "#1 SMP" (a kernel's version) and "arg#0" (a verifier's
# log) are not references.  Exit 0: none found; 1: each hit printed as
# file:line: text; 2: usage.
set -eu

# Written so that this file does not match them itself.
word='[Ii]ssue'
pattern="$word"'s?[[:space:]]+#?[0-9]+|(^|[[:space:](])#[0-9]{1,3}([[:space:]]*(§|section)|[:),.;]|$)'

check() {
  cd "$1" || exit 2
  list=$(mktemp)
  trap 'rm -f "$list"' EXIT
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard >"$list"
  else
    find . -type d \( -name .git -o -name 'build*' \) -prune -o -type f -print0 >"$list"
  fi
  hits=$(xargs -0 -r grep -I -n -E "$pattern" -- <"$list" 2>/dev/null || true)
  if [ -n "$hits" ]; then
    printf '%s\n' "$hits"
    n=$(printf '%s\n' "$hits" | wc -l)
    echo "no_issue_references: $n line(s) above cite a tracker entry: say the point itself" \
         "(what was promised, what broke) instead" >&2
    return 1
  fi
  n=$(tr -cd '\0' <"$list" | wc -c)
  echo "no_issue_references: $n files, none cites a tracker entry"
}

case ${1:-} in
--self-test)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/agent" "$tmp/tests"
  h='#'
  printf '// Locked memory for the dispatch path (%s %s14 section 3).\n' "$word" "$h" >"$tmp/agent/a.hpp"
  printf '# (#25 %s 5): two QPUs\n' section >"$tmp/tests/CMakeLists.txt"
  printf '"#1 SMP PREEMPT_DYNAMIC"\nreg type unsupported for arg#0\n' >"$tmp/tests/kernel.txt"
  if out=$(sh "$0" "$tmp" 2>&1); then
    echo "self-test: a tracker reference was not refused: $out" >&2
    exit 1
  fi
  case $out in
  *"kernel.txt"*) echo "self-test: refused a kernel version or a verifier log: $out" >&2; exit 1 ;;
  *"agent/a.hpp:1:"*"tests/CMakeLists.txt:1:"* | *"tests/CMakeLists.txt:1:"*"agent/a.hpp:1:"*)
    echo "self-test: refused, naming agent/a.hpp:1 and tests/CMakeLists.txt:1" ;;
  *) echo "self-test: refused, but without naming each file and line: $out" >&2; exit 1 ;;
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
