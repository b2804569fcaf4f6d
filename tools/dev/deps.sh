#!/usr/bin/env bash
# Install the Debian 12 packages qrtd needs to build, test and run its demo.
# Idempotent: apt-get only runs when a package is missing.
#
# Some packages bring daemons that only the tests use, and the tests run
# their own from the binaries (tests/integration/slurm starts munged,
# slurmctld and slurmd on loopback with its own configuration; telemetry
# uses promtool alone).  deps.sh installs those with every start held back
# (policy-rc.d), records them in $QRT_DEPS_STATE_DIR (/var/lib/qrt-deps),
# and on every run as root keeps their units disabled at boot and stopped:
# left as Debian enables them, Prometheus listened on every interface (:9090)
# and slurmctld, slurmd and munge ran at every boot of the machine.  A
# package that was installed before deps.sh ran (a real Slurm node) is not
# recorded and never touched; deps.sh only names its unit when it is enabled.
#
# Last, as any user, the pinned published packages the build finds locally
# (configure reaches no registry) go into the user's cache, outside the
# clone, keyed by version and checksum, once: the mqt-core wheel whose QDMI
# headers build libqrtd-qdmi.so (tools/integrations/qdmi/qdmi-cache.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)

state_dir=${QRT_DEPS_STATE_DIR:-/var/lib/qrt-deps}
policy_rc=${QRT_DEPS_POLICY_RC:-/usr/sbin/policy-rc.d}

QRT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ccache
  clang llvm libbpf-dev bpftool
  # The fuzz and sanitizer runtimes of clang (a Recommends of clang-14, which
  # --no-install-recommends leaves out): without it the fuzz targets do not link.
  libclang-rt-14-dev
  liburing-dev libhwloc-dev hwloc libcap-dev libsystemd-dev
  libspdlog-dev libfmt-dev libtomlplusplus-dev
  nlohmann-json3-dev libsqlite3-dev libcli11-dev
  # MUNGE: the network listener (rpc.listen) and tcp:// clients link libmunge;
  # the daemon munged (package munge, below) is what they talk to.
  libmunge-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  rt-tests libbpf-tools stress-ng systemd python3
  # `python3 -m venv` for the pinned PyPI packages: the SDK tests' build/venv
  # (tools/integrations/qiskit/sdk_venv.sh: qiskit, qiskit-aer) and the pip
  # that fetches the mqt-core wheel into the cache (tools/integrations/qdmi/
  # qdmi-cache.sh: QDMI's headers for libqrtd-qdmi.so); never the system Python.
  python3-venv
  # setfacl: .ci/run grants the test users (nobody, qrtd) search on a 0700
  # checkout by ACL instead of opening it to every local user.
  acl
  # Slurm integration (tools/integrations/slurm, tests/integration/slurm): spank.h to
  # build spank_qrt.so, and the daemons the test runs on loopback.
  libslurm-dev slurmctld slurmd slurm-client munge
  # The multi-node Slurm test (tests/integration/slurm/slurm_cluster.py):
  # ip netns, veth and a bridge (iproute2), nsenter and unshare (util-linux).
  iproute2 util-linux
  # Packaging (tools/dev/package/build-deb.sh, ctest package_deb): build-time
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
# package:unit of the daemons installed only for the tests (see above).
QRT_TEST_SERVICES=(prometheus:prometheus.service slurmctld:slurmctld.service slurmd:slurmd.service
                   munge:munge.service)

# LibTorch (libtorch-dev, 1.13 in bookworm) builds qrt-fleet-train, the
# trainer of qrt-fleet-sim's learned placement (bench/fleet).  It is opt-in:
# on this 2-vCPU VM it took 1 min 57 s to install, adds 104 packages and
# 416 MB, and its headers add 1-4 min of compile (74 s of CPU), for one smoke test
# (fleet_train_smoke, skipped with its reason without it) and a training
# run that is not part of CI.  QRT_WITH_TORCH=1 installs it.
if [ "${QRT_WITH_TORCH:-0}" = 1 ]; then
  QRT_PACKAGES+=(libtorch-dev)
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
test_service_unit() {  # the unit of a test-only package, or nothing
  local e
  for e in "${QRT_TEST_SERVICES[@]}"; do
    if [ "${e%%:*}" = "$1" ]; then echo "${e#*:}"; fi
  done
}
recorded() { [ -f "$state_dir/test-services" ] && grep -qx "$1" "$state_dir/test-services"; }
# The pinned wheels the build finds in the user's cache (nothing when there).
pinned_downloads() {
  local dir
  dir=$(bash "$here/tools/integrations/qdmi/qdmi-cache.sh") || {
    echo "[deps] the pinned mqt-core wheel (QDMI's headers) could not be fetched; see above" >&2
    return 1
  }
  echo "[deps] QDMI's headers: mqt-core in $dir"
}

# The units of the test-only packages deps.sh installed: disabled at boot
# and stopped, every run (idempotent).  Others are only named when enabled.
quiet_test_services() {
  local e pkg unit
  for e in "${QRT_TEST_SERVICES[@]}"; do
    pkg=${e%%:*}
    unit=${e#*:}
    installed "$pkg" || continue
    if recorded "$pkg"; then
      if systemctl is-enabled --quiet "$unit" 2>/dev/null; then
        systemctl disable --quiet "$unit"
        echo "[deps] $unit: disabled at boot (installed for the tests only, which run their own)"
      fi
      if systemctl is-active --quiet "$unit" 2>/dev/null; then
        systemctl stop "$unit"
        echo "[deps] $unit: stopped"
      fi
    elif systemctl is-enabled --quiet "$unit" 2>/dev/null; then
      echo "[deps] note: $unit is enabled at boot; deps.sh did not install $pkg (or an older deps.sh" \
           "did): if it is there only for the tests, run: systemctl disable --now $unit"
    fi
  done
}

missing=()
for p in "${QRT_PACKAGES[@]}"; do
  if ! installed "$p"; then
    missing+=("$p")
  fi
done

if [ "$(id -u)" -ne 0 ]; then
  if [ ${#missing[@]} -eq 0 ]; then
    echo "[deps] all ${#QRT_PACKAGES[@]} packages already installed"
    pinned_downloads
    exit 0
  fi
  echo "[deps] missing packages: ${missing[*]}" >&2
  echo "[deps] run as root (or with sudo) to install them" >&2
  exit 1
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "[deps] all ${#QRT_PACKAGES[@]} packages already installed"
  quiet_test_services
  pinned_downloads
  exit 0
fi
echo "[deps] installing ${#missing[@]} packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
rest=()
held=()
for p in "${missing[@]}"; do
  if [ -n "$(test_service_unit "$p")" ]; then held+=("$p"); else rest+=("$p"); fi
done
if [ ${#rest[@]} -gt 0 ]; then
  apt-get install -y -qq --no-install-recommends "${rest[@]}"
fi
if [ ${#held[@]} -gt 0 ]; then
  # The test-only daemons: a policy-rc.d that refuses every start keeps
  # them from starting (an existing policy is left as is); recorded first,
  # so a failed install is still quieted by the next run.
  mkdir -p "$state_dir"
  for p in "${held[@]}"; do
    recorded "$p" || echo "$p" >> "$state_dir/test-services"
  done
  own_policy=0
  if [ ! -e "$policy_rc" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy_rc"
    chmod 755 "$policy_rc"
    own_policy=1
  fi
  apt-get install -y -qq --no-install-recommends "${held[@]}" || status=$?
  if [ "$own_policy" = 1 ]; then rm -f "$policy_rc"; fi
  [ "${status:-0}" = 0 ] || exit "$status"
fi
quiet_test_services
pinned_downloads
echo "[deps] done"
