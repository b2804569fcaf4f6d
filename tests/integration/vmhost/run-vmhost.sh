#!/usr/bin/env bash
# The emulated Debian 12 lab host test: boots the
# image of build-image.sh under qemu (TCG, 2 vCPUs, no network) once per
# kernel, Debian's linux-image-rt-amd64 and linux-image-amd64, lets the
# runner baked into the image (guest/runner.py) check qrtd under the guest's
# real systemd, and reports its cases.  See README.md.
#
#   tests/integration/vmhost/run-vmhost.sh [--build-dir DIR | --debs DIR]
#       [--flavour rt|stock|both] [--logs DIR] [--shell]
#
#   --build-dir DIR  build the .debs from this CMake build tree first
#                    (tools/dev/package/build-deb.sh --build-dir DIR)
#   --debs DIR       use the .debs already in DIR (default ./build-deb)
#   --flavour F      rt, stock or both (default both)
#   --logs DIR       serial console logs and the guest's results go here
#                    (default ./vmhost-logs): DIR/serial-F.log, DIR/F/
#   --shell          boot one flavour (rt unless --flavour stock) with the
#                    runner masked, the serial console on this terminal and
#                    root logged in; the guest's `poweroff` ends it
#
# QRT_VMHOST_TIMEOUT (default 900): seconds one boot may take before qemu is
# killed and the flavour fails.  Exit 0 when every case passed on every
# flavour, 1 when a case failed or a guest never reported, 77 (skip) when
# not root or qemu-system-x86_64, debootstrap or mkfs.ext4 is missing and
# cannot be installed, or the .debs cannot be built here.
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
vmdir=$here/tests/integration/vmhost
build_dir=
debs=
flavours="rt stock"
logs=$PWD/vmhost-logs
shell=0
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build_dir=$(cd "$2" && pwd); shift 2 ;;
    --debs) debs=$(cd "$2" && pwd); shift 2 ;;
    --flavour)
      case $2 in rt|stock) flavours=$2 ;; both) flavours="rt stock" ;;
        *) echo "run-vmhost: --flavour rt, stock or both, not $2" >&2; exit 2 ;; esac
      shift 2 ;;
    --logs) mkdir -p "$2"; logs=$(cd "$2" && pwd); shift 2 ;;
    --shell) shell=1; shift ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run-vmhost: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
timeout_s=${QRT_VMHOST_TIMEOUT:-900}
# Console silence that counts as a hung guest (its slowest case waits 240 s
# for a reply with nothing to print).
stall_s=${QRT_VMHOST_STALL:-300}
skip() { echo "SKIP: $*"; exit 77; }
say() { echo "[vmhost] $*"; }

if [ "$(id -u)" -ne 0 ]; then
  skip "needs root (debootstrap and chroot build the image)"
fi
# qemu-system-x86 and debootstrap from Debian's apt when missing (they are
# in tools/dev/deps.sh's set too); mkfs.ext4 is e2fsprogs.
want=
command -v qemu-system-x86_64 >/dev/null 2>&1 || want="$want qemu-system-x86"
command -v debootstrap >/dev/null 2>&1 || want="$want debootstrap"
if [ -n "$want" ]; then
  say "installing$want"
  # shellcheck disable=SC2086  # a list of names
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $want >/dev/null 2>&1 ||
    skip "$want missing and apt-get install failed (tools/dev/deps.sh installs them)"
fi
for tool in qemu-system-x86_64 debootstrap mkfs.ext4 tar; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool not installed"
done

mkdir -p "$logs"
work=$(mktemp -d /var/tmp/qrt-vmhost-run-XXXXXX)
qemu_pid=
cleanup() {
  # Only what this script started: its qemu (by PID) and its scratch files
  # (the results disks, qemu's snapshot overlay of the image, the .debs).
  if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
    kill -KILL "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the .debs
if [ -n "$build_dir" ]; then
  for f in agent/qrtd tools/operator/qrtctl/qrtctl tools/endpoints/qpu-sim/qpu-sim tools/integrations/slurm/spank_qrt.so; do
    [ -e "$build_dir/$f" ] || skip "$build_dir/$f not built (the .debs need it; spank_qrt.so needs libslurm-dev)"
  done
  say "building the .debs from $build_dir"
  start=$(date +%s)
  rc=0
  DEB_BUILD_OPTIONS=noddebs QRT_JOBS=1 QRT_DEB_NO_APT=1 "$here/tools/dev/package/build-deb.sh" \
    --build-dir "$build_dir" --out "$work/debs" --no-lintian >"$logs/build-deb.log" 2>&1 || rc=$?
  if [ "$rc" -eq 3 ]; then
    skip "the .debs cannot be built here: $(tail -2 "$logs/build-deb.log" | tr '\n' ' ')"
  elif [ "$rc" -ne 0 ]; then
    tail -30 "$logs/build-deb.log"
    echo "FAIL: tools/dev/package/build-deb.sh --build-dir $build_dir (exit $rc; $logs/build-deb.log)"
    exit 1
  fi
  say ".debs built in $(( $(date +%s) - start )) s"
  debs=$work/debs
fi
debs=${debs:-$here/build-deb}

# ---- the image (cached; only its last step depends on the .debs)
start=$(date +%s)
rc=0
"$vmdir/build-image.sh" --debs "$debs" >"$logs/build-image.log" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
  tail -30 "$logs/build-image.log"
  [ "$rc" -eq 77 ] && skip "build-image.sh: $(tail -1 "$logs/build-image.log")"
  echo "FAIL: build-image.sh (exit $rc; $logs/build-image.log)"
  exit 1
fi
image=$(tail -1 "$logs/build-image.log")
cache=$(dirname "$image")
say "image $image ($(( $(date +%s) - start )) s; $logs/build-image.log)"

# boot FLAVOUR CONSOLE [extra kernel args]: qemu in the background, $qemu_pid.
# CONSOLE: a file for the serial console, or - for this terminal.
boot() {
  local flavour=$1; shift
  local console=$1; shift
  local qemu_console=(-nographic)
  if [ "$console" != - ]; then qemu_console=(-serial "file:$console" -monitor none); fi
  local results=$work/results-$flavour.img
  truncate -s 64M "$results"
  # no_timer_check: the kernel's IO-APIC timer check fails (panic) when TCG
  # runs slowly on a loaded host.  The image is only read: snapshot=on keeps the guest's writes in a
  # temporary overlay in $work (TMPDIR), so every boot starts from the
  # cached image.
  TMPDIR=$work qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m 2048 \
    -display none -vga none -no-reboot -nic none \
    -drive "file=$image,format=raw,if=none,id=root,snapshot=on" -device virtio-blk-pci,drive=root \
    -drive "file=$results,format=raw,if=none,id=results" -device virtio-blk-pci,drive=results,serial=qrtresults \
    -kernel "$cache/vmlinuz-$flavour" -initrd "$cache/initrd-$flavour" \
    -append "root=/dev/vda console=ttyS0 panic=-1 no_timer_check qrt.vmhost.flavour=$flavour $*" \
    "${qemu_console[@]}" &
  qemu_pid=$!
}

if [ "$shell" = 1 ]; then
  flavour=${flavours%% *}
  say "shell on the $flavour kernel: root is logged in on the console; 'poweroff' ends it"
  qemu_pid=
  boot "$flavour" - systemd.mask=qrt-vmhost-test.service
  wait "$qemu_pid" || true
  qemu_pid=
  exit 0
fi

failed=0
summary=()
for flavour in $flavours; do
  serial=$logs/serial-$flavour.log
  out=$logs/$flavour
  # A guest whose console falls silent for $stall_s s has hung under TCG
  # (seen once in a dozen boots on this shared 2-vCPU VM, and twice in a
  # row on the rt kernel once: no output after a case, qemu busy): it is
  # booted again, up to three boots, each hang said with the cases it had
  # passed; a third hang, like any FAIL the runner reports, fails the test.
  for attempt in 1 2 3; do
    rm -rf "$out" "$serial"
    again=''
    if [ "$attempt" != 1 ]; then again=" (boot $attempt: the earlier boot hung)"; fi
    say "booting the $flavour kernel (TCG, 2 vCPUs, -nic none; console: $serial)$again"
    t0=$(date +%s)
    boot "$flavour" "$serial" systemd.mask=serial-getty@ttyS0.service
    t_start=''
    hung=0
    last_size=0
    last_change=$t0
    while kill -0 "$qemu_pid" 2>/dev/null; do
      now=$(date +%s)
      if [ -z "$t_start" ] && grep -aq 'QRT-VMHOST START' "$serial" 2>/dev/null; then
        t_start=$((now - t0))
        say "$flavour: the runner started ${t_start} s after qemu; $(grep -ao 'multi-user.target reached [0-9.]* s' "$serial" | head -1)"
      fi
      size=$(stat -c %s "$serial" 2>/dev/null || echo 0)
      if [ "$size" != "$last_size" ]; then last_size=$size; last_change=$now; fi
      if [ $((now - last_change)) -ge "$stall_s" ]; then
        say "$flavour: the console has been silent for $stall_s s: the guest hung; killing qemu (pid $qemu_pid)"
        kill -KILL "$qemu_pid" 2>/dev/null || true
        hung=1
        break
      fi
      if [ $((now - t0)) -ge "$timeout_s" ]; then
        say "$flavour: no power-off within $timeout_s s: killing qemu (pid $qemu_pid)"
        kill -KILL "$qemu_pid" 2>/dev/null || true
        break
      fi
      sleep 1
    done
    wait "$qemu_pid" 2>/dev/null || true
    qemu_pid=
    if [ "$hung" = 0 ]; then break; fi
    if [ "$attempt" != 3 ]; then
      grep -a 'QRT-VMHOST' "$serial" 2>/dev/null | tail -3 | sed 's/^/  hung boot: /' || true
      cp "$serial" "$serial.hung$attempt" 2>/dev/null || true
    fi
  done
  elapsed=$(( $(date +%s) - t0 ))
  mkdir -p "$out"
  if tar -xf "$work/results-$flavour.img" -C "$out" 2>/dev/null && [ -f "$out/out/results.txt" ] &&
     grep -q '^DONE ' "$out/out/results.txt"; then
    mv "$out"/out/* "$out"/ && rmdir "$out/out"
    echo "---- $flavour kernel: $(grep -ao 'QRT-VMHOST START .*' "$serial" | head -1 | sed 's/^QRT-VMHOST START //')"
    grep -v '^DONE ' "$out/results.txt" | sed 's/^/  /'
    line=$(grep '^DONE ' "$out/results.txt")
    echo "  $line; qemu ran ${elapsed} s"
    if grep -q '^FAIL ' "$out/results.txt"; then failed=1; fi
    summary+=("$flavour: ${line#DONE }")
  else
    failed=1
    echo "---- $flavour kernel: the guest never reported (${elapsed} s; no results on its results disk)"
    grep -a 'QRT-VMHOST' "$serial" 2>/dev/null | tail -20 | sed 's/^/  /' || true
    tail -20 "$serial" 2>/dev/null | sed 's/^/  console: /' || true
    summary+=("$flavour: never reported")
  fi
done
say "logs: $logs"
for s in "${summary[@]}"; do say "$s"; done
exit "$failed"
