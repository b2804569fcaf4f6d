# Sourced by .ci/run (bash): lets the users that the deployed-path tests run
# binaries as -- nobody (Slurm's jobs, the clients' peers), qrtd (the
# unit's user) and daemon (the Slurm prolog test's job user, whose
# TaskProlog runs the built qrt-slurm-prolog) -- search a checkout whose root is 0700 (a clone into
# `mktemp -d`), and nobody else: an ACL entry with x for each of them on the
# root alone, never `chmod o+x`, which would open the tree to every local
# user.  User qrtd (and group qrt) is made from sysusers.d when missing, so
# the tests find it and leave it alone, and removed again afterwards.
#
#   grant_test_access DIR   grant, and arrange for revoke_test_access to run
#                           when the sourcing shell exits (also on failure)
#   revoke_test_access      undo exactly what grant_test_access did
#
# Both print what they do.  Root only; a root that others can already
# search is left as it is.

# The test users, the one list (tests/integration/ci_access reads it too).
qrt_test_users=(nobody qrtd daemon)
_qrt_access_dir=
_qrt_access_users=()
_qrt_access_made_user=0
_qrt_access_made_group=0

grant_test_access() {
  local dir=$1 u
  if [ "$(id -u)" != 0 ] || [ -n "$(find "$dir" -maxdepth 0 -perm -o=x)" ]; then
    return 0
  fi
  command -v setfacl >/dev/null || { echo "ci: setfacl is missing (package acl, from deps.sh)" >&2; return 1; }
  _qrt_access_dir=$dir
  trap revoke_test_access EXIT
  getent passwd qrtd >/dev/null || _qrt_access_made_user=1
  getent group qrt >/dev/null || _qrt_access_made_group=1
  if [ "$_qrt_access_made_user" = 1 ] || [ "$_qrt_access_made_group" = 1 ]; then
    # An absolute path: systemd-sysusers takes a relative one for a name to
    # look up in its own directories.
    systemd-sysusers "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/systemd/sysusers.d/qrtd.conf"
  fi
  for u in "${qrt_test_users[@]}"; do
    if getent passwd "$u" >/dev/null; then
      setfacl -m "u:$u:x" "$dir"
      _qrt_access_users+=("$u")
    fi
  done
  echo "ci: $dir is 0700: search (x) for ${_qrt_access_users[*]} only, by ACL, until this run ends"
}

revoke_test_access() {
  local u
  [ -n "$_qrt_access_dir" ] || return 0
  for u in "${_qrt_access_users[@]}"; do
    setfacl -x "u:$u" "$_qrt_access_dir" 2>/dev/null ||
      echo "ci: could not remove the ACL entry of $u on $_qrt_access_dir" >&2
  done
  # No named entry left: drop the ACL whole (the mask too), back to the mode bits.
  if ! getfacl -cp "$_qrt_access_dir" 2>/dev/null | grep -q '^user:[^:]'; then
    setfacl -b "$_qrt_access_dir" 2>/dev/null || true
  fi
  if [ "$_qrt_access_made_user" = 1 ]; then userdel qrtd 2>/dev/null || true; fi
  if [ "$_qrt_access_made_group" = 1 ] && getent group qrt >/dev/null; then groupdel qrt 2>/dev/null || true; fi
  echo "ci: removed the ACL entries of ${_qrt_access_users[*]} on $_qrt_access_dir"
  _qrt_access_dir=
  _qrt_access_users=()
  _qrt_access_made_user=0
  _qrt_access_made_group=0
}
