#!/bin/sh
# Fails when production code of the agent or rtcore closes a file
# descriptor by hand: every fd qrtd owns is an rtcore::unique_fd
# (rtcore/include/rtcore/unique_fd.hpp, the one owner type), so none leaks
# on an early return and none is closed twice.  Where a descriptor is not
# the code's to own (a child's copy between fork and _exit), the call says
# so on its line with a comment "bare close: <why>".
#
#   no_bare_close.sh SOURCE_DIR          check agent/ and rtcore/
#   no_bare_close.sh --self-test         prove that it refuses one
#
# Counted: ::close(x) and close(x) in .c .cc .cpp .h .hpp files under agent/
# and rtcore/, unique_fd.hpp itself aside; a member close() of an object
# (x.close(), x->close(), ledger::close()) is not a bare close.
# Exit 0: none found; 1: each printed as file:line: text; 2: usage.
set -eu

pattern='(^|[^A-Za-z0-9_.>:])(::)?close[[:space:]]*\([^)]'

check() {
  cd "$1" || exit 2
  list=$(mktemp)
  trap 'rm -f "$list"' EXIT
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files --cached --others --exclude-standard -- agent rtcore >"$list"
  else
    find agent rtcore -type f >"$list" 2>/dev/null || true
  fi
  files=$(grep -E '\.(c|cc|cpp|h|hpp)$' "$list" | grep -v '^rtcore/include/rtcore/unique_fd\.hpp$' || true)
  hits=
  if [ -n "$files" ]; then
    hits=$(printf '%s\n' "$files" | tr '\n' '\0' | xargs -0 grep -n -E "$pattern" -- 2>/dev/null |
           grep -v 'bare close:' || true)
  fi
  if [ -n "$hits" ]; then
    printf '%s\n' "$hits"
    n=$(printf '%s\n' "$hits" | wc -l)
    echo "no_bare_close: $n bare close(s) above: hold the fd in an rtcore::unique_fd (reset() closes it)," \
         "or, where it is not this code's to own, say why on the line: // bare close: <why>" >&2
    return 1
  fi
  n=$(printf '%s\n' "$files" | grep -c . || true)
  echo "no_bare_close: $n files of agent/ and rtcore/, no bare close"
}

case ${1:-} in
--self-test)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/agent/src" "$tmp/rtcore/include/rtcore"
  printf 'void f(int fd) {\n    ::close(fd);\n}\n' >"$tmp/agent/src/a.cpp"
  printf 'void g(L& l) { l.close(); ledger::close(); }\n' >"$tmp/agent/src/b.cpp"
  printf '::close(fd);  // bare close: the child'"'"'s copy\n' >"$tmp/agent/src/c.cpp"
  printf 'int close() noexcept { return ::close(release()); }\n' >"$tmp/rtcore/include/rtcore/unique_fd.hpp"
  if out=$(sh "$0" "$tmp" 2>&1); then
    echo "self-test: a bare ::close(fd) was not refused: $out" >&2
    exit 1
  fi
  case $out in
  *"agent/src/b.cpp"* | *"agent/src/c.cpp"* | *"unique_fd.hpp"*)
    echo "self-test: refused a member close, a documented one or the owner type: $out" >&2; exit 1 ;;
  *"agent/src/a.cpp:2:"*) echo "self-test: refused, naming agent/src/a.cpp:2" ;;
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
