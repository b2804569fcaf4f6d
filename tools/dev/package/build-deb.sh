#!/usr/bin/env bash
# Build the Debian packages of qrtd with debhelper: qrtd, libqrt-client1,
# libqrt-client-dev, qrtd-slurm (and their -dbgsym), then run lintian.
#
#   tools/dev/package/build-deb.sh [--build-dir DIR] [--out DIR] [--no-lintian]
#
#   --build-dir DIR  install from this already built tree (e.g. ./build from
#                    tools/dev/build.sh) instead of configuring and
#                    compiling with Debian's flags in OUT/pkgroot/build
#   --out DIR        where the .debs go (default: ./build-deb)
#   --no-lintian     skip lintian (it takes ~30 s)
#
# Needs dpkg-dev.  Run as root, it installs the missing build dependencies
# (debian/control, debhelper included) with `apt-get build-dep`, and lintian
# if missing (QRT_DEB_NO_APT=1: never); it installs nothing else, never the
# packages it builds.  The source tree is only read.  Then, as root:
#   apt install ./build-deb/qrtd_0.1.0_amd64.deb
#   systemctl enable --now qrtd.socket qrtd.service
# (README.md, "Deploying on a lab host").
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
out=$here/build-deb
build_dir=
lintian=1
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build_dir=$(cd "$2" && pwd); shift 2 ;;
    --out) mkdir -p "$2"; out=$(cd "$2" && pwd); shift 2 ;;
    --no-lintian) lintian=0; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-deb: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if ! command -v dpkg-buildpackage >/dev/null 2>&1; then
  echo "build-deb: dpkg-buildpackage not found: apt-get install dpkg-dev" >&2
  exit 3
fi
if [ -n "$build_dir" ] && [ ! -f "$build_dir/cmake_install.cmake" ]; then
  echo "build-deb: $build_dir is not a configured CMake build tree" >&2
  exit 2
fi

# The package root: a fresh copy of debian/ and, for a full build, of the
# source tree in src/ (debhelper wants the sources below the package root;
# mtimes are kept, so the persistent build/ next to it rebuilds only what
# changed).  The source tree itself is only read.
root=$out/pkgroot
mkdir -p "$root"
rm -rf "$root/debian" "$root/src"
cp -a "$here/debian" "$root/debian"
mkdir -p "$root/src"
if [ -z "$build_dir" ]; then
  (cd "$here" && tar --exclude=./.git --exclude='./build*' --exclude=./debian -cf - .) |
    tar -C "$root/src" -xf -
fi
version=$(dpkg-parsechangelog -l "$root/debian/changelog" -S Version)
project_version=$(sed -n 's/^project(qrtd VERSION \([0-9.]*\).*/\1/p' "$here/CMakeLists.txt")
if [ "${version%%-*}" != "$project_version" ]; then
  echo "build-deb: debian/changelog says $version, CMakeLists.txt $project_version" >&2
  exit 2
fi
# The build dependencies are debian/control's Build-Depends (debhelper
# included): as root, apt installs what is missing; otherwise say what is.
if ! missing=$(cd "$root" && dpkg-checkbuilddeps 2>&1); then
  if [ "$(id -u)" -eq 0 ] && [ "${QRT_DEB_NO_APT:-0}" != 1 ]; then
    echo "[deb] installing the build dependencies: apt-get build-dep $root"
    DEBIAN_FRONTEND=noninteractive apt-get build-dep -y -qq "$root"
  else
    echo "build-deb: $missing" >&2
    echo "build-deb: as root: apt-get build-dep $root (or tools/dev/deps.sh)" >&2
    exit 3
  fi
fi
rm -f "$out"/*_"$version"_*.deb "$out"/*_"$version"_*.ddeb "$out"/qrtd_"$version"_*.changes \
      "$out"/qrtd_"$version"_*.buildinfo

# A tree built without -g (tools/dev/build.sh's Release) has no debug
# information to split: no -dbgsym packages then, rather than empty ones.
ddebs=
if [ -n "$build_dir" ] && ! readelf -S "$build_dir/agent/qrtd" 2>/dev/null | grep -q '\.debug_info'; then
  ddebs=noddebs
fi
# debhelper gives its build a HOME of its own: name by its root the cache
# deps.sh filled for this user (QDMI's headers, tools/integrations/qdmi/
# qdmi-cache.sh), so that configure finds them there.
qdmi_dir=$(bash "$here/tools/integrations/qdmi/qdmi-cache.sh" --dir)
export QRT_QDMI_CACHE=${QRT_QDMI_CACHE:-$(dirname "$qdmi_dir")}
echo "[deb] building qrtd $version in $root${build_dir:+ from $build_dir}"
start=$(date +%s)
(cd "$root" && QRT_DEB_BUILD_DIR=$build_dir \
  DEB_BUILD_OPTIONS="nocheck $ddebs parallel=${QRT_JOBS:-$(nproc)} ${DEB_BUILD_OPTIONS:-}" \
  dpkg-buildpackage -b -us -uc -nc)
echo "[deb] built in $(( $(date +%s) - start )) s:"
ls -1 "$out"/*_"$version"_*.deb

if [ "$lintian" = 1 ]; then
  if ! command -v lintian >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && [ "${QRT_DEB_NO_APT:-0}" != 1 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lintian
  fi
  if command -v lintian >/dev/null 2>&1; then
    echo "[deb] lintian (errors fail; the overrides in debian/*.lintian-overrides say why)"
    lintian --fail-on error --display-info "$out"/qrtd_"$version"_amd64.changes
  else
    echo "[deb] lintian not installed: skipped (run tools/dev/deps.sh)" >&2
  fi
fi
echo "[deb] done: $out"
