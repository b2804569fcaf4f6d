#!/usr/bin/env bash
# ctest package_deb: see CMakeLists.txt.  Usage: test_package.sh SRC BUILD
set -uo pipefail
src=$1
build=$2
for tool in dpkg-buildpackage dh dpkg-deb; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool not installed (tools/dev/deps.sh installs the packaging set)"
    exit 77
  fi
done
for f in agent/qrtd tools/operator/qrtctl/qrtctl tools/integrations/slurm/spank_qrt.so; do
  if [ ! -e "$build/$f" ]; then
    echo "SKIP: $build/$f not built (spank_qrt.so needs libslurm-dev)"
    exit 77
  fi
done

tmp=$(mktemp -d /tmp/qrt-deb-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
check() {  # check "what" command...
  local what=$1; shift
  if "$@" >/dev/null 2>&1; then echo "ok: $what"; else fail "$what"; fi
}

version=$(dpkg-parsechangelog -l "$src/debian/changelog" -S Version)
# No -dbgsym packages and no lintian here: they add time, not checks.
# Never apt: a missing build dependency is a skip with its name.
DEB_BUILD_OPTIONS=noddebs QRT_JOBS=1 QRT_DEB_NO_APT=1 "$src/tools/dev/package/build-deb.sh" \
  --build-dir "$build" --out "$tmp/out" --no-lintian >"$tmp/build.log" 2>&1
rc=$?
if [ "$rc" -eq 3 ]; then
  echo "SKIP: build dependencies missing:"; cat "$tmp/build.log"
  exit 77
elif [ "$rc" -ne 0 ]; then
  cat "$tmp/build.log"
  echo "FAIL: tools/dev/package/build-deb.sh --build-dir $build (exit $rc)"
  exit 1
fi
out=$tmp/out
for p in qrtd libqrt-client1 libqrt-client-dev qrtd-slurm; do
  check "package ${p}_${version}_amd64.deb built" test -f "$out/${p}_${version}_amd64.deb"
done
deb() { echo "$out/$1_${version}_amd64.deb"; }
contents() { dpkg-deb -c "$(deb "$1")" | awk '{print $6}' | sed 's|^\./|/|'; }
has() {  # has PACKAGE PATH (grep reads the whole listing: with -q it would stop at the
          # match, dpkg-deb would die of SIGPIPE, and pipefail would call it missing)
  contents "$1" | grep -x -- "$2" >/dev/null || { fail "$1 ships $2"; return; }
  echo "ok: $1 ships $2"
}

# ---- contents
for f in /usr/sbin/qrtd /usr/bin/qrtctl /usr/bin/qrt-jitter-report /usr/bin/qpu-sim \
         /etc/qrtd/qrtd.toml /lib/systemd/system/qrtd.service /lib/systemd/system/qrtd.socket \
         /lib/systemd/system/qrtd-repin.service /lib/systemd/system/qrtd-repin.timer \
         /usr/lib/sysusers.d/qrtd.conf /usr/lib/tmpfiles.d/qrtd.conf \
         /usr/share/man/man8/qrtd.8.gz /usr/share/man/man5/qrtd.toml.5.gz \
         /usr/share/man/man1/qrtctl.1.gz /usr/share/man/man1/qrt-jitter-report.1.gz \
         /usr/share/man/man1/qpu-sim.1.gz /usr/share/qrtd/demo.toml \
         /usr/share/qrtd/python/qrt-client/src/qrt_client/__init__.py /usr/share/qrtd/python/qrt-client/src/qrt_client/protocol.py /usr/share/doc/qrtd/copyright \
         /usr/bin/qpu-aer /usr/share/man/man1/qpu-aer.1.gz /usr/share/qrtd/qpu-line3.toml \
         /usr/share/qrtd/python/requirements-sdk.txt /usr/share/qrtd/python/qrtd-qiskit/pyproject.toml; do
  has qrtd "$f"
done
has libqrt-client1 /usr/lib/x86_64-linux-gnu/libqrt-client.so.1
has libqrt-client-dev /usr/include/qrt/client.h
has libqrt-client-dev /usr/lib/x86_64-linux-gnu/libqrt-client.so
has libqrt-client-dev /usr/lib/x86_64-linux-gnu/pkgconfig/qrt-client.pc
has qrtd-slurm /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_qrt.so
has qrtd-slurm /usr/sbin/qrt-slurm-healthcheck
has qrtd-slurm /usr/share/man/man8/spank_qrt.8.gz
has qrtd-slurm /usr/sbin/qrt-slurm-prolog
check "qrt-slurm-prolog is the C program over libqrt-client (shlibs)" sh -c "dpkg-deb -f '$(deb qrtd-slurm)' Depends | grep -q libqrt-client1"
# The QDMI device library: always built (configure fails without QDMI).
check "package qrtd-qdmi_${version}_amd64.deb built" test -f "$(deb qrtd-qdmi)"
has qrtd-qdmi /usr/lib/x86_64-linux-gnu/qrtd/qdmi/libqrtd-qdmi.so
has qrtd-qdmi /usr/lib/x86_64-linux-gnu/qrtd/qdmi/qrtd-qdmi.qdmi.json
has qrtd-qdmi /usr/share/man/man7/qrtd-qdmi.7.gz
check "qrtd-qdmi depends on libqrt-client1 (shlibs)" sh -c "dpkg-deb -f '$(deb qrtd-qdmi)' Depends | grep -q libqrt-client1"
check "the manifest names the library beside it" sh -c "dpkg-deb --fsys-tarfile '$(deb qrtd-qdmi)' | tar -xO ./usr/lib/x86_64-linux-gnu/qrtd/qdmi/qrtd-qdmi.qdmi.json | grep -q '\"library\": \"libqrtd-qdmi.so\"'"
# The control stacks' endpoints: units (not enabled), users, env files, man
# pages; their distributions stay in qrtd's /usr/share/qrtd/python.
endpoints_deb="$out/qrtd-endpoints_${version}_all.deb"
check "package qrtd-endpoints_${version}_all.deb built" test -f "$endpoints_deb"
for f in /usr/share/man/man8/qpu-qblox.8.gz /usr/share/man/man8/qpu-labone.8.gz /lib/systemd/system/qpu-qblox.service \
         /lib/systemd/system/qpu-labone.service /usr/lib/sysusers.d/qpu-qblox.conf /usr/lib/sysusers.d/qpu-labone.conf \
         /etc/qrtd/qpu-qblox.env /etc/qrtd/qpu-labone.env; do
  dpkg-deb -c "$endpoints_deb" | awk '{print $6}' | sed 's|^\./|/|' | grep -x -- "$f" >/dev/null || fail "qrtd-endpoints ships $f"
done
has qrtd /usr/share/qrtd/python/qpu-qblox/pyproject.toml
has qrtd /usr/share/qrtd/python/qpu-labone/requirements.txt
# The shared library policy split: the runtime package holds no .so symlink
# or header (a -dev package does), so two sonames can be co-installed.
if contents libqrt-client1 | grep -qE '\.so$|\.h$'; then fail "libqrt-client1 ships only the versioned library"; else echo "ok: libqrt-client1 ships only the versioned library"; fi
check "libqrt-client1 declares its shared library (shlibs)" sh -c "dpkg-deb -I '$(deb libqrt-client1)' shlibs | grep -q '^libqrt-client 1 libqrt-client1'"
check "libqrt-client1 ships a symbols file naming qrt_place_best" sh -c "dpkg-deb -I '$(deb libqrt-client1)' symbols | grep -q 'qrt_place_best@QRT_CLIENT_1.1'"

# The network listener and tcp:// clients link libmunge; munged itself is
# only recommended (rpc.listen is off by default).
check "qrtd depends on libmunge2" sh -c "dpkg-deb -f '$(deb qrtd)' Depends | grep -q 'libmunge2'"
check "libqrt-client1 depends on libmunge2" sh -c "dpkg-deb -f '$(deb libqrt-client1)' Depends | grep -q 'libmunge2'"
check "qrtd recommends munge" sh -c "dpkg-deb -f '$(deb qrtd)' Recommends | grep -qw 'munge'"

# ---- conffile and maintainer scripts
dpkg-deb -e "$(deb qrtd)" "$tmp/ctl"
check "/etc/qrtd/qrtd.toml is a conffile" grep -qx /etc/qrtd/qrtd.toml "$tmp/ctl/conffiles"
# Install must not partition the host: nothing enables or starts a unit.
# The postinst runs for real with every tool it calls stubbed by a logger,
# so only what it would do to a host is checked.  The stub answers as
# deb-systemd-helper does: on a fresh install debian-installed is false and
# was-enabled true (its default, which makes debhelper's enable snippet
# enable); on an upgrade of an enabled unit both are true.
stub=$tmp/stub
mkdir -p "$stub"
for t in deb-systemd-helper deb-systemd-invoke systemctl systemd-sysusers systemd-tmpfiles; do
  cat >"$stub/$t" <<STUB
#!/bin/sh
echo "$t \$*" >>"$tmp/calls"
case "\$*" in
  *was-enabled*) exit 0 ;;
  *debian-installed*) exit \${QRT_WAS:-1} ;;
esac
exit 0
STUB
  chmod +x "$stub/$t"
done
postinst() { : >"$tmp/calls"; env -i PATH="$stub:/usr/bin:/bin" QRT_WAS="$1" sh -e "$tmp/ctl/postinst" configure $2; }
if postinst 1 ""; then echo "ok: postinst configure (fresh install) runs"; else fail "postinst configure (fresh install) runs"; fi
if grep -E ' (enable|start|restart|try-restart|reload-or-restart)( |$)' "$tmp/calls"; then
  fail "a fresh install enables or starts nothing"
else
  echo "ok: a fresh install enables or starts nothing"
fi
check "postinst creates the user and group (systemd-sysusers qrtd.conf)" grep -qx 'systemd-sysusers qrtd.conf' "$tmp/calls"
check "postinst creates the directories (systemd-tmpfiles --create qrtd.conf)" grep -qx 'systemd-tmpfiles --create qrtd.conf' "$tmp/calls"
postinst 0 0.0.9 || fail "postinst configure 0.0.9 (upgrade) runs"
check "an upgrade keeps a unit the admin enabled" grep -qx "deb-systemd-helper enable qrtd.service" "$tmp/calls"
# With systemd running (not the case on this host), an upgrade restarts only
# what runs: try-restart, never start; nothing else starts a unit.
check "an upgrade try-restarts only a running service" grep -qE "deb-systemd-invoke try-restart .*'qrtd.service'" "$tmp/ctl/postinst"
check "the drift watch is handled with the service (Also=)" grep -qE "deb-systemd-invoke try-restart .*'qrtd-repin.timer'" "$tmp/ctl/postinst"
if grep -nE 'deb-systemd-invoke +(\$_dh_action|start|restart)|systemctl +(enable|start|restart)' "$tmp/ctl/postinst"; then
  fail "postinst has no start or restart"
else
  echo "ok: postinst has no start or restart"
fi
check "removal stops the service (prerm)" grep -qE '"\$1" = remove.*' "$tmp/ctl/prerm"
check "prerm stops qrtd.socket and qrtd.service" grep -q 'deb-systemd-invoke stop qrtd.socket qrtd.service' "$tmp/ctl/prerm"
check "prerm stops the drift watch first" grep -q 'deb-systemd-invoke stop qrtd-repin.timer qrtd-repin.service' "$tmp/ctl/prerm"
check "purge forgets the units (postrm deb-systemd-helper purge)" grep -q 'deb-systemd-helper purge.*qrtd' "$tmp/ctl/postrm"

# ---- unpacked into a scratch root
root=$tmp/root
for p in qrtd libqrt-client1 libqrt-client-dev qrtd-slurm; do dpkg-deb -x "$(deb "$p")" "$root"; done
check "qrtd.service runs /usr/sbin/qrtd" grep -qx 'ExecStart=/usr/sbin/qrtd run' "$root/lib/systemd/system/qrtd.service"
check "qrt-client.pc says prefix=/usr" grep -qx 'prefix=/usr' "$root/usr/lib/x86_64-linux-gnu/pkgconfig/qrt-client.pc"
check "the packaged qrtd accepts the packaged /etc/qrtd/qrtd.toml" "$root/usr/sbin/qrtd" check-config -c "$root/etc/qrtd/qrtd.toml"
check "the packaged qrtctl runs" "$root/usr/bin/qrtctl" --help
for b in usr/sbin/qrtd usr/bin/qrtctl usr/bin/qrt-jitter-report usr/bin/qpu-sim \
         usr/lib/x86_64-linux-gnu/slurm-wlm/spank_qrt.so; do
  if LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu ldd "$root/$b" | grep -q 'not found'; then
    fail "$b finds every shared library"
  else
    echo "ok: $b finds every shared library"
  fi
  if readelf -d "$root/$b" | grep -qE 'RPATH|RUNPATH'; then fail "$b has no build-tree RPATH"; fi
done
check "a C program builds against libqrt-client-dev with pkg-config" sh -c \
  "PKG_CONFIG_SYSROOT_DIR='$root' PKG_CONFIG_LIBDIR='$root/usr/lib/x86_64-linux-gnu/pkgconfig' \
   cc -o '$tmp/example' '$root/usr/share/doc/libqrt-client-dev/examples/qrt-client-example.c' \
   \$(PKG_CONFIG_SYSROOT_DIR='$root' PKG_CONFIG_LIBDIR='$root/usr/lib/x86_64-linux-gnu/pkgconfig' pkg-config --cflags --libs qrt-client)"

if [ "$(id -u)" -ne 0 ]; then
  echo "note: not root: sysusers/tmpfiles in the scratch root not checked"
elif ! command -v systemd-sysusers >/dev/null || ! command -v systemd-tmpfiles >/dev/null; then
  echo "note: systemd-sysusers/systemd-tmpfiles missing: not checked"
else
  # What postinst does, against the scratch root instead of this host.
  mkdir -p "$root/etc"
  : >"$root/etc/passwd"; : >"$root/etc/group"
  check "systemd-sysusers --root runs the packaged sysusers.d" systemd-sysusers --root="$root" qrtd.conf
  check "user qrtd exists, primary group qrt, home /var/lib/qrtd" sh -c \
    "gid=\$(awk -F: '\$1==\"qrt\"{print \$3}' '$root/etc/group'); awk -F: -v g=\"\$gid\" '\$1==\"qrtd\" && \$4==g && \$6==\"/var/lib/qrtd\"' '$root/etc/passwd' | grep -q ."
  systemd-tmpfiles --root="$root" --create qrtd.conf >"$tmp/tmpfiles.log" 2>&1  # /dev is not in the root
  uid=$(awk -F: '$1=="qrtd"{print $3}' "$root/etc/passwd")
  check "/var/lib/qrtd is qrtd:qrt 0750" sh -c "[ \"\$(stat -c '%u %a' '$root/var/lib/qrtd')\" = '$uid 750' ]"
  check "/var/lib/qrtd-host is root:root 0700" sh -c "[ \"\$(stat -c '%u %g %a' '$root/var/lib/qrtd-host')\" = '0 0 700' ]"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed; build log:"; tail -30 "$tmp/build.log"
  exit 1
fi
echo "package_deb: every check passed"
