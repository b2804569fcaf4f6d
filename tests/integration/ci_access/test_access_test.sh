#!/usr/bin/env bash
# .ci/run used to `chmod o+x` the checkout's root (0644
# files below it: the whole tree readable by every local user) and never
# revert it.  Now the test users alone get search by ACL, undone at exit.
set -u
lib=$1
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (setfacl on a root-owned tree, runuser)"; exit 77; }
command -v setfacl >/dev/null || { echo "SKIP: setfacl is missing (package acl)"; exit 77; }
getent passwd nobody >/dev/null || { echo "SKIP: no user nobody"; exit 77; }
# The test users as test_access.sh names them; the refusal is checked with
# a local user that is none of them.
# shellcheck source=/dev/null
. "$lib"
other=
for u in games man lp mail news uucp proxy backup list bin sys; do
  case " ${qrt_test_users[*]} " in *" $u "*) continue ;; esac
  if getent passwd "$u" >/dev/null; then other=$u; break; fi
done
[ -n "$other" ] || { echo "SKIP: no local user outside ${qrt_test_users[*]} to check the refusal with"; exit 77; }

d=$(mktemp -d)  # 0700, as a fresh clone into mktemp -d
trap 'setfacl -b "$d" 2>/dev/null; rm -rf "$d"' EXIT
mkdir "$d/build" && echo x > "$d/build/file" && chmod 755 "$d/build" && chmod 644 "$d/build/file"
had_qrtd=0; getent passwd qrtd >/dev/null && had_qrtd=1
can_read() { runuser -u "$1" -- test -r "$d/build/file"; }

can_read nobody && fail "nobody can read below a 0700 root before the grant"
# 1. A run that succeeds (each run is its own bash -e, as .ci/run is).
export d other lib
export -f fail can_read
bash -ec '
  . "$lib"
  grant_test_access "$d"
  for u in "${qrt_test_users[@]}"; do
    getent passwd "$u" >/dev/null || continue
    can_read "$u" || fail "$u (a test user) cannot read the build tree after the grant"
  done
  ! can_read "$other" || fail "$other (not a test user) can read the build tree"
  [ -z "$(find "$d" -maxdepth 0 -perm -o=x)" ] || fail "the root was made searchable by others (o+x)"
  [ "$(stat -c %a "$d/build/file")" = 644 ] || fail "a file below changed mode"
' || fail "the granting run failed"
check_undone() {
  getfacl -cp "$d" 2>/dev/null | grep -q '^user:[^:]' && fail "$1: a named ACL entry is left: $(getfacl -cp "$d")"
  [ "$(stat -c %a "$d")" = 700 ] || fail "$1: the root is $(stat -c %a "$d"), not 700"
  local u
  for u in nobody daemon; do
    can_read "$u" && fail "$1: $u can still read the build tree"
  done
  if [ "$had_qrtd" = 0 ] && getent passwd qrtd >/dev/null; then fail "$1: user qrtd, made for the run, is left"; fi
  return 0
}
check_undone "after a run that passed"
# 2. A run that fails half way (set -e, as .ci/run): undone all the same.
bash -ec '. "$lib"; grant_test_access "$d"; false; echo "not reached"' && fail "the failing run succeeded"
check_undone "after a run that failed"
echo "1 passed, 0 failed: the test users alone could search the checkout, and nothing was left"
