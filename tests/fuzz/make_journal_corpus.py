#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_journal into corpus/journal/.

Each seed is a journal text as qrtd writes it (CRC-32 of the rest, 8 hex,
then the kind and its escaped fields), covering every record kind, plus the
damage a crash, rot or a forger leaves: a torn tail, bad checksums, bad
escapes, huge fields, a version-1 header, paths outside the allow-list.
Run it again after adding a record kind; the real journals (real-*) come
from `qrtd host apply` on the fake trees and are kept as they are.
"""
import os
import zlib

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "journal")
BOOT = "148e24da-ef85-4d2b-baf4-da6d1156975d"


def esc(b):
    if isinstance(b, str):
        b = b.encode()
    if not b:
        return "~"
    out = []
    for c in b:
        if c < 0x21 or c > 0x7E or c in (ord("%"), ord("~")):
            out.append("%%%02x" % c)
        else:
            out.append(chr(c))
    return "".join(out)


def line(kind, *fields):
    body = " ".join([kind] + [esc(f) for f in fields])
    return "%08x %s\n" % (zlib.crc32(body.encode()) & 0xFFFFFFFF, body)


def raw(body):  # a body written as is (already escaped), with a good checksum
    return "%08x %s\n" % (zlib.crc32(body.encode()) & 0xFFFFFFFF, body)


def header(root="/"):
    return line("journal", "2", BOOT, root)


every_kind = (
    header()
    + line("apply", "1", "0", "run")
    + line("file", "/proc/irq/default_smp_affinity", "3\n")
    + line("file", "/proc/irq/36/smp_affinity_list", "0-1\n")
    + line("managed", "122")
    + line("ctl", "/sys/fs/cgroup/unified/cgroup.subtree_control", "cpuset")
    + line("mkcg", "/sys/fs/cgroup/cpuset/qrt-housekeeping", "/sys/fs/cgroup/cpuset")
    + line("file", "/sys/fs/cgroup/cpuset/cpuset.sched_load_balance", "1\n")
    + line("cg", "812", "4711", "/sys/fs/cgroup/cpuset", "0-1")
    + line("cg", "813", "4712", "/sys/fs/cgroup/cpuset", "")
    + line("aff", "900", "77", "0-3", "0-1")
    + line("method", "cgroup-v1-cpuset")
)

seeds = {
    "every-kind": every_kind,
    "v2-partition": header()
    + line("apply", "4-7", "0-3", "host-apply")
    + line("ctl", "/sys/fs/cgroup/cgroup.subtree_control", "cpuset")
    + line("mkcg", "/sys/fs/cgroup/qrt-isolated", "/sys/fs/cgroup")
    + line("method", "cgroup-v2-partition"),
    "fence": header("/tmp/qrt-tree/root")
    + line("apply", "2-3", "0-1", "run")
    + "".join(line("aff", str(100 + i), str(5000 + i), "0-3", "0-1") for i in range(20))
    + line("method", "affinity-fence"),
    "torn-tail": every_kind + line("file", "/proc/irq/41/smp_affinity_list", "0-1\n")[:30],
    "bad-crc-middle": header() + "deadbeef apply 1 0 run\n" + line("method", "none"),
    "bad-crc-last": header() + line("apply", "1", "0", "run") + "00000000 method none\n",
    "bad-escape": header() + raw("file /proc/irq/1/smp_affinity_list %zz") + raw("file /proc/irq/2/smp_affinity ab%4"),
    "tilde-inside": header() + raw("file /proc/irq/1/smp_affinity a~b"),
    "huge-field": header() + line("file", "/proc/irq/1/smp_affinity_list", "x" * 60000),
    "huge-line": header() + line("file", "/proc/irq/1/smp_affinity_list", "y" * 70000),
    "raw-high-bytes": header() + raw("file /proc/irq/1/smp_affinity_list \xe9\xff"),
    "version-1": line("journal", "1", BOOT) + line("apply", "1", "0") + line("file", "/proc/irq/36/smp_affinity_list", "0-1\n"),
    "forged-shadow": header() + line("file", "/etc/shadow", "root::0:0:99999:7:::\n"),
    "forged-dotdot": header() + line("file", "/proc/irq/../../etc/passwd", "x\n"),
    "forged-cgroup": header() + line("mkcg", "/sys/fs/cgroup/cpuset/other", "/sys/fs/cgroup/cpuset")
    + line("cg", "1", "1", "/etc", ""),
    "unknown-kind": header() + line("chmod", "/etc/shadow", "777"),
    "empty-fields": header() + raw("apply  0 run") + raw("apply ~ ~ run"),
    "bad-numbers": header() + line("cg", "-1", "1", "/sys/fs/cgroup/cpuset", "")
    + line("cg", "99999999999", "1", "/sys/fs/cgroup/cpuset", "")
    + line("aff", "1", "18446744073709551616", "0", "0")
    + line("managed", "4294967296")
    + line("aff", "1", "1", "0-4096", "0"),
    # The runtime knobs (host_knobs.hpp): every knob path, per-CPU kthreads
    # recorded as not movable, and a forged knob outside the allow-list.
    "knobs": header()
    + line("apply", "1", "0", "host-apply")
    + line("method", "cgroup-v1-cpuset")
    + line("knob", "/sys/devices/virtual/workqueue/cpumask", "3\n", "00000001")
    + line("knob", "/sys/devices/virtual/workqueue/writeback/cpumask", "3\n", "00000001")
    + line("knob", "/proc/sys/vm/stat_interval", "1\n", "10")
    + line("knob", "/proc/sys/kernel/timer_migration", "1\n", "0")
    + line("knob", "/proc/sys/kernel/watchdog_cpumask", "0-1\n", "0")
    + line("knob", "/proc/sys/kernel/sched_rt_runtime_us", "950000\n", "-1")
    + line("knob", "/sys/devices/system/machinecheck/machinecheck0/ignore_ce", "0\n", "1")
    + line("knob", "/sys/kernel/debug/sched/fair_server/cpu1/runtime", "50000000\n", "0")
    + line("nomove", "19", "1019")
    + line("nomove", "20", "1020")
    + line("aff", "2", "1002", "0-1", "0"),
    "knob-forged": header() + line("knob", "/proc/sys/kernel/core_pattern", "core\n", "|/tmp/x")
    + line("knob", "/sys/devices/virtual/workqueue/../../../etc/cpumask", "3\n", "1")
    + line("knob", "/proc/sys/vm/stat_interval", "1\n", "1 0")
    + line("knob", "/proc/sys/vm/stat_interval", "1\n")
    + line("nomove", "0", "1")
    + line("nomove", "19", "-1"),
    "no-newline": header().rstrip("\n"),
    "empty": "",
}

os.makedirs(here, exist_ok=True)
for name, text in seeds.items():
    with open(os.path.join(here, name), "wb") as f:
        f.write(text.encode("latin-1"))
print(f"wrote {len(seeds)} seeds to {here}")
