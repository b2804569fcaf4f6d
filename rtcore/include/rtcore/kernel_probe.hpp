#pragma once
// Kernel and host probe: what the running kernel offers a real-time
// dispatcher, and every risk as a warning with its fix.
//
// Reads ONLY through host_fs, so it runs unchanged on the real host
// (host_fs::system()) and on fake trees under tests/data/hosts/.  A file that
// is missing or unreadable leaves its field unknown (std::nullopt or
// tristate::unknown); it never fails the probe.
//
// Boot-only knobs (isolcpus, nohz_full, rcu_nocbs, irqaffinity, PREEMPT_RT,
// BTF) are judged from what the kernel reports as in effect
// (/sys/devices/system/cpu/isolated, .../nohz_full) and, where the kernel has
// no such file, from /proc/cmdline.  A knob that is missing or does not cover
// the isolated CPUs becomes a warning whose fix is the kernel command line to
// add, with needs_reboot = true.  The probe never claims a knob is in effect
// when it is not.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/host_fs.hpp"

namespace rtcore {

enum class tristate { no, yes, unknown };
const char* to_string(tristate t);

struct warning {
    std::string subsystem;   // "kernel", "boot", "sched", "cgroup", "bpf", "io_uring",
                             // "hypervisor", "timer", "irq", "cpufreq", "cpuidle"
    std::string message;     // what is wrong, with the values read
    std::string fix;         // what to do; for boot knobs the cmdline to add
    bool needs_reboot = false;
};

// One boot knob: what /proc/cmdline asked for, and what the kernel says is in
// effect where it has a file for it.
struct boot_knob {
    std::optional<std::string> cmdline_value;   // raw "managed_irq,domain,2-3"; nullopt: absent
    std::optional<cpu_set> cmdline_cpus;        // the CPU list part, when it parsed
    std::optional<cpu_set> kernel_cpus;         // from sysfs, when the kernel exposes it
    // CPUs the knob covers in effect (kernel_cpus when known, else
    // cmdline_cpus, else empty).
    cpu_set effective() const;
};

struct fair_server_cpu {
    unsigned cpu = 0;
    std::optional<std::uint64_t> runtime_ns;
    std::optional<std::uint64_t> period_ns;
};

struct idle_state {
    std::string name;                          // "C6", "POLL"
    std::optional<std::uint64_t> latency_us;   // exit latency
    bool disabled = false;
};

struct cpu_power_state {
    unsigned cpu = 0;
    std::optional<std::string> governor;       // cpufreq scaling_governor
    std::vector<idle_state> idle_states;       // cpuidle states, in order
};

struct kernel_report {
    // uname -r / uname -v as the kernel reports them.
    std::optional<std::string> release;        // /proc/sys/kernel/osrelease
    std::optional<std::string> version;        // /proc/sys/kernel/version, else from /proc/version
    tristate preempt_rt = tristate::unknown;
    // "PREEMPT_RT", "PREEMPT_DYNAMIC (full)", "PREEMPT_DYNAMIC", "PREEMPT",
    // "none or voluntary", or "unknown".
    std::string preempt_model = "unknown";

    std::optional<cpu_set> online;             // /sys/devices/system/cpu/online
    cpu_set isolated_requested;                // the isolated set probed against

    std::optional<std::string> cmdline;        // kernel parameters (before " -- ")
    boot_knob isolcpus;                        // kernel_cpus from /sys/devices/system/cpu/isolated
    std::vector<std::string> isolcpus_flags;   // "managed_irq", "domain", "nohz"
    boot_knob nohz_full;                       // kernel_cpus from /sys/devices/system/cpu/nohz_full
    // Kernel built with CONFIG_NO_HZ_FULL: no when sysfs has the cpu
    // directory but no nohz_full file (a cmdline nohz_full= is then ignored).
    tristate nohz_full_supported = tristate::unknown;
    boot_knob rcu_nocbs;                       // cmdline only; nohz_full implies it
    boot_knob irqaffinity;                     // cmdline only

    std::optional<std::int64_t> sched_rt_runtime_us;   // -1: no RT throttling
    std::optional<std::int64_t> sched_rt_period_us;
    tristate fair_server = tristate::unknown;  // /sys/kernel/debug/sched/fair_server present
    std::vector<fair_server_cpu> fair_server_cpus;

    bool mounts_read = false;                            // /proc/mounts was readable: nullopt = not mounted
    std::optional<std::string> cgroup_v1_cpuset_mount;   // mount point of a v1 cpuset hierarchy
    std::optional<std::string> cgroup_v2_mount;          // mount point of cgroup2
    tristate cgroup_v2_cpuset = tristate::unknown;       // "cpuset" in the v2 root cgroup.controllers

    tristate btf = tristate::unknown;                    // /sys/kernel/btf/vmlinux
    std::optional<int> io_uring_disabled;                // 0 on, 1 group-restricted, 2 off
    tristate io_uring = tristate::unknown;               // usable by an unprivileged daemon

    tristate hypervisor = tristate::unknown;             // cpuinfo "hypervisor" flag
    std::optional<std::string> hypervisor_type;          // /sys/hypervisor/type ("xen")
    std::optional<std::string> dmi_vendor;               // /sys/class/dmi/id/sys_vendor
    std::optional<std::string> dmi_product;              // /sys/class/dmi/id/product_name
    std::optional<double> steal_fraction;                // steal / total, since boot, /proc/stat

    std::optional<std::uint64_t> timer_slack_ns;         // /proc/self/timerslack_ns

    tristate irqbalance = tristate::unknown;             // a process with comm "irqbalance"
    std::optional<int> irqbalance_pid;

    std::optional<std::string> cpuidle_driver;           // /sys/devices/system/cpu/cpuidle/current_driver
    std::vector<cpu_power_state> cpu_power;                   // per isolated CPU (all online CPUs when none)

    std::vector<warning> warnings;

    bool has_warning(std::string_view subsystem) const;
};

// Probe the host behind fs against the CPUs the plan isolates (may be empty:
// then boot-knob coverage is not judged and per-CPU checks cover all online
// CPUs).
kernel_report probe_kernel(const host_fs& fs, const cpu_set& isolated);

// Multi-line human-readable rendering, warnings last.
std::string format_kernel_report(const kernel_report& report);

}  // namespace rtcore
