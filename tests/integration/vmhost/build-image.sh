#!/usr/bin/env bash
# The image of the emulated Debian 12 lab host: a
# minimal bookworm root with both of Debian's own 6.1 kernels
# (linux-image-rt-amd64 and linux-image-amd64), systemd as PID 1, and the
# qrtd packages installed through the chroot, so the guest needs no network
# (qemu -nic none).  run-vmhost.sh boots it once per kernel.
#
#   tests/integration/vmhost/build-image.sh [--base-only] [--debs DIR]
#
#   --base-only  build (or find) the cached base root and stop
#   --debs DIR   the qrtd .debs (default: ./build-deb, from
#                tools/dev/package/build-deb.sh)
#
# Two cache levels in /var/cache/qrtd-vmhost (QRT_VMHOST_CACHE):
#   base/        debootstrap + both kernels + systemd + qrtd's runtime
#                libraries, built once (3.4 min here, network bound),
#                rebuilt only when the recipe below changes.  The kernels and
#                initrds are copied out as vmlinuz-rt, initrd-rt,
#                vmlinuz-stock, initrd-stock for qemu's -kernel/-initrd.
#   qrtd-KEY.img the raw ext4 image: the base plus the current .debs and the
#                in-guest test runner (guest/, demo_client.py), keyed by
#                their sha256 and the base's; about
#                30 s from the base.  Only the newest one is kept.
# About 2.5 GB in all (4 GB sparse image).  Prints the image's path on its
# last line.  Needs root (debootstrap, chroot), debootstrap and mkfs.ext4,
# and the Debian mirror of this machine's apt sources for the base.
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
vmdir=$here/tests/integration/vmhost
debs=$here/build-deb
base_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --base-only) base_only=1; shift ;;
    --debs) debs=$(cd "$2" && pwd); shift 2 ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown option $1" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "build-image: needs root (debootstrap, chroot)" >&2
  exit 77
fi
qrtd_deb=
if [ "$base_only" = 0 ]; then
  qrtd_deb=$(ls "$debs"/qrtd_*_amd64.deb 2>/dev/null | head -1 || true)
  if [ -z "$qrtd_deb" ]; then
    echo "build-image: no qrtd_*_amd64.deb in $debs: run tools/dev/package/build-deb.sh" >&2
    exit 2
  fi
fi

# The base recipe.  The kernels are both flavours of Debian 12's 6.1; the
# libraries are what the qrtd package's shlibs:Depends resolve to on
# bookworm, so that installing the .debs later needs no mirror.  bpftool is
# there for the runner's diagnostics (which BTF, which program types load).
base_pkgs="linux-image-rt-amd64 linux-image-amd64 python3 procps util-linux kmod passwd
  libbpf1 libcap2 libfmt9 libhwloc15 libspdlog1.10 libsqlite3-0 libsystemd0
  libtomlplusplus3 liburing2 libelf1 libmunge2 bpftool"
base_key=$(printf '%s\n' "$base_pkgs" "recipe 2" | sha256sum | cut -c1-16)

cache=${QRT_VMHOST_CACHE:-/var/cache/qrtd-vmhost}
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one builder at a time per cache
base=$cache/base

# Mounts made below are undone on every exit, success or not.
mounted=()
work=
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    if mountpoint -q "${mounted[$i]}"; then umount -l "${mounted[$i]}" || true; fi
  done
  if [ -n "$work" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT
chroot_mounts() {  # chroot_mounts ROOT
  local m
  for m in proc sys dev dev/pts; do mkdir -p "$1/$m"; done
  mount -t proc proc "$1/proc"; mounted+=("$1/proc")
  mount -t sysfs sys "$1/sys"; mounted+=("$1/sys")
  mount --bind /dev "$1/dev"; mounted+=("$1/dev")
  mount --bind /dev/pts "$1/dev/pts"; mounted+=("$1/dev/pts")
}
chroot_umounts() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}"; done
  mounted=()
}

if [ "$(cat "$base/.complete" 2>/dev/null)" != "$base_key" ]; then
  if ! command -v debootstrap >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
  fi
  mirror=$(sed -n 's/^URIs: *\([^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  mirror=${mirror:-$(awk '$1=="deb" && $3=="bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)}
  if [ -z "$mirror" ]; then
    echo "build-image: no Debian mirror found in this machine's apt sources" >&2
    exit 2
  fi
  start=$(date +%s)
  echo "[vmhost] debootstrap bookworm from $mirror into $base"
  rm -rf "$base" "$cache"/base.new
  debootstrap --variant=minbase --include=systemd-sysv,udev,dbus,initramfs-tools \
    bookworm "$cache/base.new" "$mirror"
  # The machine's own apt sources (bookworm, -updates, -security): the
  # kernels are the current 6.1 point release, as on a lab host.
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    rm -f "$cache/base.new/etc/apt/sources.list"
    cp /etc/apt/sources.list.d/debian.sources "$cache/base.new/etc/apt/sources.list.d/"
  fi
  chroot_mounts "$cache/base.new"
  printf '#!/bin/sh\nexit 101\n' >"$cache/base.new/usr/sbin/policy-rc.d"
  chmod +x "$cache/base.new/usr/sbin/policy-rc.d"
  # shellcheck disable=SC2086,SC2116  # the list, on one line
  chroot "$cache/base.new" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends $(echo $base_pkgs)"
  rm -f "$cache/base.new/usr/sbin/policy-rc.d"
  chroot "$cache/base.new" apt-get clean
  rm -rf "$cache/base.new/var/lib/apt/lists/"*
  chroot_umounts

  # The guest: serial console login as root without a password (a test VM
  # with no network), the root on /dev/vda, and a host name.
  chroot "$cache/base.new" passwd -d root >/dev/null
  echo "/dev/vda / ext4 defaults 0 1" >"$cache/base.new/etc/fstab"
  echo qrt-vmhost >"$cache/base.new/etc/hostname"
  mkdir -p "$cache/base.new/etc/systemd/system/serial-getty@ttyS0.service.d"
  printf '[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin root --keep-baud 115200 %%I $TERM\n' \
    >"$cache/base.new/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf"
  for flavour in rt stock; do
    if [ $flavour = rt ]; then pat='*-rt-amd64'; else pat='*[0-9]-amd64'; fi
    # shellcheck disable=SC2086
    vmlinuz=$(ls "$cache"/base.new/boot/vmlinuz-$pat | sort -V | tail -1)
    # shellcheck disable=SC2086
    initrd=$(ls "$cache"/base.new/boot/initrd.img-$pat | sort -V | tail -1)
    cp "$vmlinuz" "$cache/vmlinuz-$flavour"
    cp "$initrd" "$cache/initrd-$flavour"
    echo "[vmhost] $flavour kernel: $(basename "$vmlinuz")"
  done
  echo "$base_key" >"$cache/base.new/.complete"
  mv "$cache/base.new" "$base"
  echo "[vmhost] base root built in $(( $(date +%s) - start )) s"
fi
if [ "$base_only" = 1 ]; then
  echo "$base"
  exit 0
fi

# The image: the base, the current .debs and the guest side of the test.
key=$( (cat "$base/.complete" "$debs"/qrtd_*_amd64.deb "$debs"/libqrt-client1_*_amd64.deb
        find "$vmdir/guest" -type f | sort | xargs cat
        cat "$here/tools/dev/demo_client.py") | sha256sum | cut -c1-16)
image=$cache/qrtd-$key.img
for old in "$cache"/qrtd-*.img; do
  if [ "$old" != "$image" ]; then rm -f "$old"; fi
done
if [ -f "$image" ]; then
  echo "[vmhost] cached: $image"
  echo "$image"
  exit 0
fi
start=$(date +%s)
work=$(mktemp -d "$cache/work-XXXXXX")
root=$work/root
cp -a "$base" "$root"
rm -f "$root/.complete"

echo "[vmhost] installing the qrtd packages in the chroot"
mkdir -p "$root/tmp/debs"
cp "$debs"/qrtd_*_amd64.deb "$debs"/libqrt-client1_*_amd64.deb "$root/tmp/debs/"
# The base holds the runtime libraries, so dpkg needs no mirror.  No service
# starts in a chroot (policy-rc.d), and installing enables nothing anyway.
chroot_mounts "$root"
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
if ! chroot "$root" /bin/sh -c 'DEBIAN_FRONTEND=noninteractive dpkg -i /tmp/debs/*.deb'; then
  echo "[vmhost] dpkg -i wants more than the base holds: resolving from the mirror" >&2
  chroot "$root" /bin/sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -f -y -qq --no-install-recommends'
  rm -rf "$root/var/lib/apt/lists/"*
fi
rm -f "$root/usr/sbin/policy-rc.d"
rm -rf "$root/tmp/debs" "$root/var/cache/apt/archives/"*.deb

# The guest side of the test (guest/README lists what goes where).
"$vmdir/guest/install.sh" "$root"
chroot_umounts

echo "[vmhost] mkfs.ext4 -d: $(du -sh "$root" | cut -f1) into $image"
truncate -s 4G "$work/image"
mkfs.ext4 -q -F -L qrt-vmhost -d "$root" "$work/image"
mv "$work/image" "$image"
echo "[vmhost] image built in $(( $(date +%s) - start )) s"
echo "$image"
