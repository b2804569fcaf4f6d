#!/usr/bin/env bash
# Install the Debian 12 packages qrtd needs to build, test and run its demo.
# Idempotent: apt-get only runs when a package is missing.
set -euo pipefail

QRT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ccache
  clang llvm libbpf-dev bpftool
  liburing-dev libhwloc-dev hwloc libcap-dev libsystemd-dev
  libspdlog-dev libfmt-dev libtomlplusplus-dev
  nlohmann-json3-dev libsqlite3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  rt-tests libbpf-tools stress-ng systemd python3
  # setfacl: .ci/run grants the test users (nobody, qrtd) search on a 0700
  # checkout by ACL instead of opening it to every local user.
  acl
  # Slurm integration (tools/slurm, tests/integration/slurm): spank.h to
  # build spank_qrt.so, and the daemons the test runs on loopback.
  libslurm-dev slurmctld slurmd slurm-client munge
  # Packaging (tools/package/build-deb.sh, ctest package_deb): build-time
  # only, never a dependency of the packages themselves.
  debhelper lintian
  # The emulated Debian 12 lab host (tests/integration/vmhost, ctest
  # vmhost_debian12): debootstrap builds its image, qemu boots it (TCG).
  debootstrap qemu-system-x86
  # promtool (ctest telemetry.promtool_check_metrics lints the daemon's real
  # metrics).  Debian 12 ships it only in prometheus (96 MB installed, no
  # smaller package has it); it is installed below with services held back,
  # so the Prometheus server it brings is never started here.
  prometheus
)

# LibTorch (libtorch-dev, 1.13 in bookworm) builds qrt-fleet-train, the
# trainer of qrt-fleet-sim's learned placement (bench/fleet).  It is opt-in:
# on this 2-vCPU VM it took 1 min 57 s to install, adds 104 packages and
# 416 MB, and its headers add 1-4 min of compile (74 s of CPU), for one smoke test
# (fleet_train_smoke, skipped with its reason without it) and a training
# run that is not part of CI.  QRT_WITH_TORCH=1 installs it.
if [ "${QRT_WITH_TORCH:-0}" = 1 ]; then
  QRT_PACKAGES+=(libtorch-dev)
fi

missing=()
for p in "${QRT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "[deps] all ${#QRT_PACKAGES[@]} packages already installed"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "[deps] missing packages: ${missing[*]}" >&2
  echo "[deps] run as root (or with sudo) to install them" >&2
  exit 1
fi
echo "[deps] installing ${#missing[@]} packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
rest=()
want_prometheus=0
for p in "${missing[@]}"; do
  if [ "$p" = prometheus ]; then want_prometheus=1; else rest+=("$p"); fi
done
if [ ${#rest[@]} -gt 0 ]; then
  apt-get install -y -qq --no-install-recommends "${rest[@]}"
fi
if [ "$want_prometheus" = 1 ]; then
  # Only promtool is wanted: a policy-rc.d that refuses every start keeps
  # the package's server from starting (an existing policy is left as is).
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  apt-get install -y -qq --no-install-recommends prometheus || status=$?
  if [ "$own_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
  [ "${status:-0}" = 0 ] || exit "$status"
fi
echo "[deps] done"
