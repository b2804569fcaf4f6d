#!/usr/bin/env bash
# Installs the guest side of the vmhost test into a root (build-image.sh
# calls it, with the chroot's /proc, /sys and /dev mounted):
#   /etc/qrtd/qrtd.toml                      qrtd.toml here (the demo profile)
#   /etc/systemd/system/qrtd.service.d/      qrtd-vmhost.conf (watchdog 15 s)
#   /etc/systemd/system/qrt-vmhost-*.service qpu-sim and the runner
#   /usr/local/lib/qrt-vmhost/               runner.py, demo_client.py
#   users alice (group qrt) and bob (not)
# and enables qrtd.socket (not qrtd.service: the first client starts it),
# qpu-sim and the runner.
set -euo pipefail
root=$1
guest=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$guest/../../../.." && pwd)
install -m 0644 "$guest/qrtd.toml" "$root/etc/qrtd/qrtd.toml"
install -d "$root/etc/systemd/system/qrtd.service.d"
install -m 0644 "$guest/qrtd-vmhost.conf" "$root/etc/systemd/system/qrtd.service.d/vmhost.conf"
install -m 0644 "$guest/qrt-vmhost-qpusim.service" "$guest/qrt-vmhost-test.service" "$root/etc/systemd/system/"
install -d "$root/usr/local/lib/qrt-vmhost"
install -m 0755 "$guest/runner.py" "$root/usr/local/lib/qrt-vmhost/runner.py"
install -m 0755 "$src/tools/dev/demo_client.py" "$root/usr/local/lib/qrt-vmhost/demo_client.py"
chroot "$root" /bin/sh -ec '
  id alice >/dev/null 2>&1 || useradd -m -G qrt alice
  id bob >/dev/null 2>&1 || useradd -m bob
  systemctl enable qrtd.socket qrt-vmhost-qpusim.service qrt-vmhost-test.service'
