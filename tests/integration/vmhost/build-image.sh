#!/usr/bin/env bash
# The image of the emulated Debian 12 lab host (issue #11, section 4): a
# minimal bookworm root with Debian's own kernel, systemd as PID 1, and the
# qrtd packages installed through the chroot, so the guest needs no network
# (qemu -nic none).  Not part of CI yet: the boot-and-check harness that uses
# it is still to come.
#
#   tests/integration/vmhost/build-image.sh [--kernel rt|stock] [--debs DIR]
#
#   --kernel rt     linux-image-rt-amd64 (PREEMPT_RT 6.1, default)
#   --kernel stock  linux-image-amd64 (6.1, not RT)
#   --debs DIR      the qrtd .debs (default: ./build-deb, from
#                   tools/package/build-deb.sh)
#
# Cached in /var/cache/qrtd-vmhost (QRT_VMHOST_CACHE): the debootstrapped
# base root once per kernel flavour (~12 min the first time here), then the
# raw image of the current .debs (keyed by their sha256; ~20 s from the
# base), one per flavour, with the kernel and initrd next to it for qemu's
# -kernel/-initrd.  About 1.5 GB per flavour (4 GB sparse image).  Prints the image's path on its last line.
# Needs root (debootstrap, chroot), debootstrap (installed if missing) and
# the Debian mirror of this machine's apt sources.
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
kernel=rt
debs=$here/build-deb
while [ $# -gt 0 ]; do
  case $1 in
    --kernel) kernel=$2; shift 2 ;;
    --debs) debs=$(cd "$2" && pwd); shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown option $1" >&2; exit 2 ;;
  esac
done
case $kernel in
  rt) kpkg=linux-image-rt-amd64 ;;
  stock) kpkg=linux-image-amd64 ;;
  *) echo "build-image: --kernel rt or stock, not $kernel" >&2; exit 2 ;;
esac
if [ "$(id -u)" -ne 0 ]; then
  echo "build-image: needs root (debootstrap, chroot)" >&2
  exit 77
fi
qrtd_deb=$(ls "$debs"/qrtd_*_amd64.deb 2>/dev/null | head -1 || true)
if [ -z "$qrtd_deb" ]; then
  echo "build-image: no qrtd_*_amd64.deb in $debs: run tools/package/build-deb.sh" >&2
  exit 2
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
fi
mirror=$(sed -n 's/^URIs: *\([^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
mirror=${mirror:-$(awk '$1=="deb" && $3=="bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)}
if [ -z "$mirror" ]; then
  echo "build-image: no Debian mirror found in this machine's apt sources" >&2
  exit 2
fi

cache=${QRT_VMHOST_CACHE:-/var/cache/qrtd-vmhost}
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one builder at a time per cache
base=$cache/base-$kernel
key=$(cat "$debs"/qrtd_*_amd64.deb "$debs"/libqrt-client1_*_amd64.deb 2>/dev/null | sha256sum | cut -c1-16)
image=$cache/qrtd-$kernel-$key.img
# One image per kernel flavour: the cache does not grow with every build.
for old in "$cache"/qrtd-"$kernel"-*.img; do
  if [ "$old" != "$image" ]; then rm -f "$old" "$old.vmlinuz" "$old.initrd"; fi
done
if [ -f "$image" ] && [ -f "$image.vmlinuz" ] && [ -f "$image.initrd" ]; then
  echo "[vmhost] cached: $image"
  echo "$image"
  exit 0
fi

# Mounts made below are undone on every exit, success or not.
work=
cleanup() {
  for m in dev/pts dev proc sys; do
    if [ -n "$work" ] && mountpoint -q "$work/$m"; then umount -l "$work/$m"; fi
  done
  if [ -n "$work" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT

if [ ! -f "$base/.complete" ]; then
  echo "[vmhost] debootstrap bookworm ($kpkg) from $mirror into $base"
  rm -rf "$base"
  debootstrap --variant=minbase \
    --include=systemd-sysv,udev,dbus,initramfs-tools,"$kpkg",python3,procps,util-linux,kmod \
    bookworm "$base" "$mirror"
  touch "$base/.complete"
fi

work=$(mktemp -d "$cache/work-XXXXXX")
root=$work/root
cp -a "$base" "$root"
rm -f "$root/.complete"
for m in proc sys dev dev/pts; do mkdir -p "$root/$m"; done
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"

echo "[vmhost] installing the qrtd packages in the chroot"
mkdir -p "$root/tmp/debs"
cp "$debs"/qrtd_*_amd64.deb "$debs"/libqrt-client1_*_amd64.deb "$root/tmp/debs/"
# apt resolves the packages' dependencies from the mirror (the guest itself
# never needs the network).  No service starts in a chroot
# (policy-rc.d), and installing enables nothing anyway.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
chroot "$root" /bin/sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends /tmp/debs/*.deb'
rm -f "$root/usr/sbin/policy-rc.d"
rm -rf "$root/tmp/debs" "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*

# The guest: serial console login as root without a password (a test VM
# with no network), the root on /dev/vda, and a host name.
chroot "$root" passwd -d root >/dev/null
echo "/dev/vda / ext4 defaults 0 1" >"$root/etc/fstab"
echo qrt-vmhost >"$root/etc/hostname"
mkdir -p "$root/etc/systemd/system/serial-getty@ttyS0.service.d"
printf '[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin root --keep-baud 115200 %%I $TERM\n' \
  >"$root/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf"

for m in dev/pts dev proc sys; do umount -l "$root/$m"; done
vmlinuz=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -1)
initrd=$(ls "$root"/boot/initrd.img-* | sort -V | tail -1)
echo "[vmhost] mkfs.ext4 -d: $(du -sh "$root" | cut -f1) into $image"
truncate -s 4G "$work/image"
mkfs.ext4 -q -F -L qrt-vmhost -d "$root" "$work/image"
cp "$vmlinuz" "$work/image.vmlinuz"
cp "$initrd" "$work/image.initrd"
mv "$work/image.vmlinuz" "$image.vmlinuz"
mv "$work/image.initrd" "$image.initrd"
mv "$work/image" "$image"
echo "[vmhost] boot: qemu-system-x86_64 -m 2G -smp 2 -nographic -nic none" \
     "-drive file=$image,format=raw,if=virtio -kernel $image.vmlinuz -initrd $image.initrd" \
     "-append 'root=/dev/vda console=ttyS0'"
echo "$image"
