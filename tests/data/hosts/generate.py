#!/usr/bin/env python3
"""Write the fake /proc and /sys trees the kernel probe tests run on.

Each tree holds only the files rtcore::probe_kernel reads, with the contents a
real host of that kind shows.  The trees are committed; run this script again
after changing it (from any directory) to regenerate them:

    python3 tests/data/hosts/generate.py

Trees:
  vm-2cpu              this development VM (Firecracker, kernel 6.18 PREEMPT_DYNAMIC,
                       no nohz_full support, cgroup v1 cpuset + cgroup2, BTF, io_uring),
                       captured from its real files
  rt-isolated-8cpu     a tuned PREEMPT_RT box: isolcpus/nohz_full/rcu_nocbs/irqaffinity
                       on the cmdline and in effect, RT throttling off, fair server
                       off on the isolated CPUs, cgroup2 with cpuset, no irqbalance,
                       performance governor, shallow idle states only
  stock-64cpu-smt      a stock Debian 12 kernel on a dual-socket Xeon (2 x 16 cores x 2
                       threads, siblings N and N+32), irqbalance running, schedutil,
                       C6 enabled
  xen-guest-restricted a Xen guest with io_uring disabled, no BTF, no cpuset
                       controller, raised timer slack, 5% steal and isolcpus
                       without managed_irq
"""

import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))


def write_tree(name, files):
    root = os.path.join(HERE, name)
    if os.path.isdir(root):
        shutil.rmtree(root)
    for path, content in sorted(files.items()):
        full = os.path.join(root, path.lstrip("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="ascii") as f:
            f.write(content)


def cpu_flags(hypervisor):
    base = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 "
            "clflush mmx fxsr sse sse2 ht syscall nx pdpe1gb rdtscp lm constant_tsc "
            "nopl xtopology nonstop_tsc cpuid pni pclmulqdq ssse3 fma cx16 pcid sse4_1 "
            "sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand")
    if hypervisor:
        base += " hypervisor"
    return base + " lahf_lm abm 3dnowprefetch fsgsbase bmi1 avx2 smep bmi2 erms invpcid"


def cpuinfo(n, model, hypervisor):
    out = []
    for i in range(n):
        out.append(
            f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: {model}\n"
            f"flags\t\t: {cpu_flags(hypervisor)}\n\n")
    return "".join(out)


def proc_stat(per_cpu):
    """per_cpu: list of (user, system, idle, steal) jiffies."""
    tot = [sum(c[i] for c in per_cpu) for i in range(4)]
    lines = [f"cpu  {tot[0]} 0 {tot[1]} {tot[2]} 0 0 0 {tot[3]} 0 0"]
    for i, c in enumerate(per_cpu):
        lines.append(f"cpu{i} {c[0]} 0 {c[1]} {c[2]} 0 0 0 {c[3]} 0 0")
    lines += ["intr 0", "ctxt 1000", "btime 1764400000", "processes 500",
              "procs_running 1", "procs_blocked 0", "softirq 0 0 0 0 0 0 0 0 0 0 0"]
    return "\n".join(lines) + "\n"


def idle_states(files, cpu, states):
    for k, (name, latency) in enumerate(states):
        d = f"/sys/devices/system/cpu/cpu{cpu}/cpuidle/state{k}"
        files[d + "/name"] = name + "\n"
        files[d + "/latency"] = f"{latency}\n"
        files[d + "/disable"] = "0\n"


def comms(files, procs):
    for pid, comm in procs.items():
        files[f"/proc/{pid}/comm"] = comm + "\n"


# --- vm-2cpu: captured from this VM ----------------------------------------
def vm_2cpu():
    f = {}
    f["/proc/cmdline"] = (
        "mitigations=auto,no_guest_host,no_guest_guest console=ttyS0 quiet reboot=k panic=1 "
        "nomodule random.trust_cpu=1 swiotlb=noforce psi=1 nvproxy.enable=1 "
        "page_reporting.page_reporting_order=11 deferred_init=lazy nested_pvm=1 "
        "rcupdate.rcu_cpu_stall_cputime=1 cpuidle_haltpoll.force=1 haltpoll.guest_halt_poll_ns=0 "
        "sched_vcpu_pack=15 rdinit=/process_api -- --firecracker-init --addr 0.0.0.0:2024 "
        "--max-ws-buffer-size 32768 --block-local-connections --log-vsock-port 5002 "
        "--control-vsock-port 5001 --listen-vsock-port 2024 --tcp-readiness-only --auth-required\n")
    f["/proc/version"] = ("Linux version 6.18.44-fc-v669 (builder@sandboxing) (gcc (GCC) 15.3.0, "
                          "GNU ld (GNU Binutils) 2.46) #1 SMP PREEMPT_DYNAMIC @0\n")
    f["/proc/sys/kernel/version"] = "#1 SMP PREEMPT_DYNAMIC @0\n"
    f["/proc/sys/kernel/osrelease"] = "6.18.44-fc-v669\n"
    f["/proc/sys/kernel/sched_rt_runtime_us"] = "950000\n"
    f["/proc/sys/kernel/sched_rt_period_us"] = "1000000\n"
    f["/proc/sys/kernel/io_uring_disabled"] = "0\n"
    f["/proc/self/timerslack_ns"] = "50000\n"
    f["/proc/mounts"] = (
        "proc /proc proc rw,relatime 0 0\n"
        "sysfs /sys sysfs rw,relatime 0 0\n"
        "devtmpfs /dev devtmpfs rw,relatime,size=12334460k,nr_inodes=3083615,mode=755 0 0\n"
        "/dev/vda / ext4 rw,relatime,discard 0 0\n"
        "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n"
        "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
        "cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0\n"
        "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
        "cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n"
        "cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n")
    f["/sys/fs/cgroup/unified/cgroup.controllers"] = "hugetlb\n"
    f["/proc/cpuinfo"] = (
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush "
        "mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl "
        "xtopology nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid "
        "sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor "
        "lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext vmmcall\n\n"
        "processor\t: 1\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush "
        "mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl "
        "xtopology nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid "
        "sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor "
        "lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext vmmcall\n\n")
    f["/proc/stat"] = ("cpu  3193 0 2231 59866 2208 0 37 13 0 0\n"
                       "cpu0 1174 0 812 31635 146 0 9 3 0 0\n"
                       "cpu1 2019 0 1418 28231 2061 0 27 9 0 0\n"
                       "intr 318720 0\nctxt 900000\nbtime 1764400000\nprocesses 12000\n"
                       "procs_running 1\nprocs_blocked 0\n")
    comms(f, {1: "process_api", 10: "kworker/0:0H-events_highpri", 1184: "memfd:sealed-91",
              1185: "bash"})
    f["/sys/devices/system/cpu/online"] = "0-1\n"
    f["/sys/devices/system/cpu/possible"] = "0-1\n"
    f["/sys/devices/system/cpu/isolated"] = "\n"
    f["/sys/devices/system/cpu/cpuidle/current_driver"] = "haltpoll\n"
    for cpu in (0, 1):
        idle_states(f, cpu, [("POLL", 0), ("haltpoll idle", 1)])
    f["/sys/kernel/btf/vmlinux"] = ""
    f["/sys/kernel/kexec_loaded"] = "0\n"
    write_tree("vm-2cpu", f)


# --- rt-isolated-8cpu --------------------------------------------------------
def rt_isolated_8cpu():
    f = {}
    f["/proc/cmdline"] = ("BOOT_IMAGE=/boot/vmlinuz-6.12.48+deb13-rt-amd64 root=UUID=0b6f3c1e-8d1a-4c55-9a55-"
                          "2f0f1d9f6a31 ro quiet isolcpus=managed_irq,domain,2-7 nohz_full=2-7 "
                          "rcu_nocbs=2-7 irqaffinity=0-1 intel_pstate=disable\n")
    f["/proc/version"] = ("Linux version 6.12.48+deb13-rt-amd64 (debian-kernel@lists.debian.org) "
                          "(x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0, GNU ld (GNU Binutils "
                          "for Debian) 2.44) #1 SMP PREEMPT_RT Debian 6.12.48-1 (2025-09-20)\n")
    f["/proc/sys/kernel/version"] = "#1 SMP PREEMPT_RT Debian 6.12.48-1 (2025-09-20)\n"
    f["/proc/sys/kernel/osrelease"] = "6.12.48+deb13-rt-amd64\n"
    f["/sys/kernel/realtime"] = "1\n"
    f["/proc/sys/kernel/sched_rt_runtime_us"] = "-1\n"
    f["/proc/sys/kernel/sched_rt_period_us"] = "1000000\n"
    f["/proc/sys/kernel/io_uring_disabled"] = "0\n"
    f["/proc/self/timerslack_ns"] = "50000\n"
    f["/proc/mounts"] = ("sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
                         "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
                         "/dev/nvme0n1p2 / ext4 rw,relatime,errors=remount-ro 0 0\n"
                         "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,"
                         "memory_recursiveprot 0 0\n"
                         "debugfs /sys/kernel/debug debugfs rw,nosuid,nodev,noexec,relatime 0 0\n")
    f["/sys/fs/cgroup/cgroup.controllers"] = "cpuset cpu io memory hugetlb pids rdma misc\n"
    f["/proc/cpuinfo"] = cpuinfo(8, "Intel(R) Xeon(R) E-2378G CPU @ 2.80GHz", False)
    f["/proc/stat"] = proc_stat([(9000, 3000, 900000, 0)] * 2 + [(50, 20, 980000, 0)] * 6)
    comms(f, {1: "systemd", 2: "kthreadd", 512: "systemd-journal", 640: "chronyd", 701: "sshd",
              900: "qrtd"})
    f["/sys/devices/system/cpu/online"] = "0-7\n"
    f["/sys/devices/system/cpu/isolated"] = "2-7\n"
    f["/sys/devices/system/cpu/nohz_full"] = "2-7\n"
    f["/sys/devices/system/cpu/cpuidle/current_driver"] = "intel_idle\n"
    f["/sys/kernel/debug/sched/preempt"] = "none voluntary full lazy (realtime)\n"
    for cpu in range(8):
        d = f"/sys/kernel/debug/sched/fair_server/cpu{cpu}"
        f[d + "/runtime"] = ("50000000\n" if cpu < 2 else "0\n")
        f[d + "/period"] = "1000000000\n"
        f[f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"] = "performance\n"
        idle_states(f, cpu, [("POLL", 0), ("C1", 1)])
    f["/sys/kernel/btf/vmlinux"] = ""
    f["/sys/class/dmi/id/sys_vendor"] = "Supermicro\n"
    f["/sys/class/dmi/id/product_name"] = "SYS-E300-12D\n"
    write_tree("rt-isolated-8cpu", f)


# --- stock-64cpu-smt ---------------------------------------------------------
def stock_64cpu_smt():
    f = {}
    f["/proc/cmdline"] = ("BOOT_IMAGE=/boot/vmlinuz-6.1.0-27-amd64 root=UUID=3f1b2a7c-55e0-4a3e-9c1d-"
                          "7e2d4b9a0c11 ro quiet\n")
    f["/proc/version"] = ("Linux version 6.1.0-27-amd64 (debian-kernel@lists.debian.org) (gcc-12 "
                          "(Debian 12.2.0-14) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP "
                          "PREEMPT_DYNAMIC Debian 6.1.115-1 (2024-11-01)\n")
    # No /proc/sys/kernel/version here: the probe must fall back to /proc/version.
    f["/proc/sys/kernel/osrelease"] = "6.1.0-27-amd64\n"
    f["/proc/sys/kernel/sched_rt_runtime_us"] = "950000\n"
    f["/proc/sys/kernel/sched_rt_period_us"] = "1000000\n"
    # 6.1 has no io_uring_disabled sysctl.
    f["/proc/self/timerslack_ns"] = "50000\n"
    f["/proc/mounts"] = ("sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
                         "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
                         "/dev/sda2 / ext4 rw,relatime,errors=remount-ro 0 0\n"
                         "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,"
                         "memory_recursiveprot 0 0\n")
    f["/sys/fs/cgroup/cgroup.controllers"] = "cpuset cpu io memory hugetlb pids rdma misc\n"
    f["/proc/cpuinfo"] = cpuinfo(64, "Intel(R) Xeon(R) Gold 6326 CPU @ 2.90GHz", False)
    f["/proc/stat"] = proc_stat([(120000, 30000, 5000000, 0)] * 64)
    comms(f, {1: "systemd", 2: "kthreadd", 433: "systemd-journal", 734: "irqbalance",
              801: "cron", 1022: "sshd"})
    f["/sys/devices/system/cpu/online"] = "0-63\n"
    f["/sys/devices/system/cpu/possible"] = "0-63\n"
    f["/sys/devices/system/cpu/isolated"] = "\n"
    f["/sys/devices/system/cpu/nohz_full"] = "(null)\n"
    f["/sys/devices/system/cpu/cpuidle/current_driver"] = "intel_idle\n"
    for cpu in range(64):
        f[f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"] = "schedutil\n"
        idle_states(f, cpu, [("POLL", 0), ("C1", 2), ("C1E", 10), ("C6", 170)])
    f["/sys/kernel/btf/vmlinux"] = ""
    f["/sys/class/dmi/id/sys_vendor"] = "Dell Inc.\n"
    f["/sys/class/dmi/id/product_name"] = "PowerEdge R650\n"
    write_tree("stock-64cpu-smt", f)


# --- xen-guest-restricted ----------------------------------------------------
def xen_guest_restricted():
    f = {}
    f["/proc/cmdline"] = "root=/dev/xvda1 ro console=hvc0 isolcpus=2-3\n"
    f["/proc/version"] = ("Linux version 6.6.52-custom (root@build) (gcc (GCC) 13.2.0, GNU ld 2.41) "
                          "#1 SMP PREEMPT Fri Sep 20 10:00:00 UTC 2024\n")
    f["/proc/sys/kernel/version"] = "#1 SMP PREEMPT Fri Sep 20 10:00:00 UTC 2024\n"
    f["/proc/sys/kernel/osrelease"] = "6.6.52-custom\n"
    f["/proc/sys/kernel/sched_rt_runtime_us"] = "-1\n"
    f["/proc/sys/kernel/sched_rt_period_us"] = "1000000\n"
    f["/proc/sys/kernel/io_uring_disabled"] = "2\n"
    f["/proc/self/timerslack_ns"] = "200000\n"
    f["/proc/mounts"] = ("sysfs /sys sysfs rw,relatime 0 0\nproc /proc proc rw,relatime 0 0\n"
                         "cgroup2 /sys/fs/cgroup cgroup2 rw,relatime 0 0\n"
                         "debugfs /sys/kernel/debug debugfs rw,relatime 0 0\n")
    f["/sys/fs/cgroup/cgroup.controllers"] = "cpu io memory pids\n"
    f["/sys/kernel/debug/sched/preempt"] = "none voluntary (full)\n"
    f["/proc/cpuinfo"] = cpuinfo(4, "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz", True)
    f["/proc/stat"] = proc_stat([(800, 200, 8000, 500)] * 4)   # 5% steal
    comms(f, {1: "init", 2: "kthreadd", 300: "sshd"})
    f["/sys/devices/system/cpu/online"] = "0-3\n"
    f["/sys/devices/system/cpu/isolated"] = "2-3\n"
    f["/sys/devices/system/cpu/nohz_full"] = "(null)\n"
    f["/sys/hypervisor/type"] = "xen\n"
    f["/sys/kernel/kexec_loaded"] = "0\n"   # /sys/kernel exists, btf does not
    write_tree("xen-guest-restricted", f)


if __name__ == "__main__":
    vm_2cpu()
    rt_isolated_8cpu()
    stock_64cpu_smt()
    xen_guest_restricted()
