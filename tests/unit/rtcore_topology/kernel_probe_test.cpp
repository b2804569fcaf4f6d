#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "rtcore/kernel_probe.hpp"

using rtcore::cpu_set;
using rtcore::host_fs;
using rtcore::kernel_report;
using rtcore::probe_kernel;
using rtcore::tristate;
using rtcore::warning;

namespace {

host_fs tree(const char* name) { return host_fs(std::string(QRT_TEST_DATA_DIR) + "/hosts/" + name); }

cpu_set list(const char* s) { return cpu_set::parse_list(s).value(); }

struct expected_warning {
    std::string subsystem;
    std::string message;
    std::string fix;
    bool needs_reboot;
};

// Compares warning by warning, so a failure shows what was expected and what
// came back.
void expect_warnings(const kernel_report& rep, const std::vector<expected_warning>& want) {
    for (std::size_t i = 0; i < std::max(rep.warnings.size(), want.size()); ++i) {
        if (i >= rep.warnings.size()) {
            ADD_FAILURE() << "missing warning " << i << ": " << want[i].subsystem << ": " << want[i].message;
            continue;
        }
        const warning& w = rep.warnings[i];
        if (i >= want.size()) {
            ADD_FAILURE() << "unexpected warning " << i << ": " << w.subsystem << ": " << w.message
                          << "\n  fix: " << w.fix;
            continue;
        }
        EXPECT_EQ(w.subsystem, want[i].subsystem) << "warning " << i;
        EXPECT_EQ(w.message, want[i].message) << "warning " << i;
        EXPECT_EQ(w.fix, want[i].fix) << "warning " << i;
        EXPECT_EQ(w.needs_reboot, want[i].needs_reboot) << "warning " << i << ": " << w.message;
    }
}

}  // namespace

TEST(kernel_probe, vm_tree_reports_a_non_rt_guest_without_boot_isolation) {
    const auto rep = probe_kernel(tree("vm-2cpu"), cpu_set{1});
    EXPECT_EQ(rep.release, "6.18.44-fc-v669");
    EXPECT_EQ(rep.version, "#1 SMP PREEMPT_DYNAMIC @0");
    EXPECT_EQ(rep.preempt_rt, tristate::no);
    EXPECT_EQ(rep.preempt_model, "PREEMPT_DYNAMIC");
    EXPECT_EQ(rep.online, list("0-1"));
    // The init arguments after " -- " are not kernel parameters.
    ASSERT_TRUE(rep.cmdline);
    EXPECT_EQ(rep.cmdline->find("--firecracker-init"), std::string::npos);
    EXPECT_EQ(rep.isolcpus.kernel_cpus, cpu_set{});
    EXPECT_EQ(rep.nohz_full_supported, tristate::no);
    EXPECT_EQ(rep.sched_rt_runtime_us, 950000);
    EXPECT_EQ(rep.sched_rt_period_us, 1000000);
    EXPECT_EQ(rep.fair_server, tristate::unknown);
    EXPECT_EQ(rep.cgroup_v1_cpuset_mount, "/sys/fs/cgroup/cpuset");
    EXPECT_EQ(rep.cgroup_v2_mount, "/sys/fs/cgroup/unified");
    EXPECT_EQ(rep.cgroup_v2_cpuset, tristate::no);
    EXPECT_EQ(rep.btf, tristate::yes);
    EXPECT_EQ(rep.io_uring, tristate::yes);
    EXPECT_EQ(rep.hypervisor, tristate::yes);
    ASSERT_TRUE(rep.steal_fraction);
    EXPECT_DOUBLE_EQ(*rep.steal_fraction, 13.0 / (3193 + 2231 + 59866 + 2208 + 37 + 13));
    EXPECT_EQ(rep.timer_slack_ns, 50000U);
    EXPECT_EQ(rep.irqbalance, tristate::no);
    EXPECT_EQ(rep.cpuidle_driver, "haltpoll");
    ASSERT_EQ(rep.cpu_power.size(), 1U);
    EXPECT_EQ(rep.cpu_power[0].cpu, 1U);
    EXPECT_FALSE(rep.cpu_power[0].governor);
    ASSERT_EQ(rep.cpu_power[0].idle_states.size(), 2U);
    EXPECT_EQ(rep.cpu_power[0].idle_states[1].name, "haltpoll idle");
    expect_warnings(rep, {
        {"kernel",
         "kernel is not PREEMPT_RT (preempt model: PREEMPT_DYNAMIC): wakeup latency on isolated CPUs is bounded only by the longest non-preemptible kernel section",
         "boot a PREEMPT_RT kernel (Debian: apt-get install linux-image-rt-amd64); short of that, add preempt=full to the kernel command line",
         true},
        {"boot",
         "isolcpus is not in effect on isolated CPU 1 (/sys/devices/system/cpu/isolated lists none); the scheduler still balances tasks onto those CPUs",
         "add to the kernel command line: isolcpus=managed_irq,domain,1",
         true},
        {"boot",
         "nohz_full is not in effect on isolated CPU 1 (the kernel is built without CONFIG_NO_HZ_FULL); the scheduler tick keeps interrupting those CPUs",
         "boot a kernel built with CONFIG_NO_HZ_FULL=y (Debian's stock kernels are) and add to the kernel command line: nohz_full=1",
         true},
        {"boot",
         "rcu_nocbs is not in effect on isolated CPU 1 (rcu_nocbs= and nohz_full cover none); RCU callbacks still run on those CPUs",
         "add to the kernel command line: rcu_nocbs=1",
         true},
        {"boot",
         "irqaffinity is not set: IRQs may start on isolated CPU 1 until they are pinned at runtime",
         "add to the kernel command line: irqaffinity=0",
         true},
        {"sched",
         "RT throttling is on: SCHED_FIFO tasks may run only 950000 us of every 1000000 us, so a spinning dispatch thread can be stalled for 50000 us",
         "sysctl -w kernel.sched_rt_runtime_us=-1 (persist it in /etc/sysctl.d/)",
         false},
        {"hypervisor",
         "running under a hypervisor: the host can deschedule vCPUs, which no guest setting prevents; steal time since boot is 0.02%",
         "pin each vCPU to a dedicated, isolated host core (e.g. libvirt <vcpupin> plus isolcpus on the host), or run on bare metal",
         false},
    });
}

TEST(kernel_probe, tuned_rt_host_gives_no_warning_for_the_cpus_it_isolated) {
    const auto rep = probe_kernel(tree("rt-isolated-8cpu"), list("2-7"));
    EXPECT_EQ(rep.preempt_rt, tristate::yes);
    EXPECT_EQ(rep.preempt_model, "PREEMPT_RT");
    EXPECT_EQ(rep.isolcpus_flags, (std::vector<std::string>{"managed_irq", "domain"}));
    EXPECT_EQ(rep.isolcpus.cmdline_cpus, list("2-7"));
    EXPECT_EQ(rep.isolcpus.kernel_cpus, list("2-7"));
    EXPECT_EQ(rep.nohz_full.kernel_cpus, list("2-7"));
    EXPECT_EQ(rep.rcu_nocbs.effective(), list("2-7"));
    EXPECT_EQ(rep.irqaffinity.effective(), list("0-1"));
    EXPECT_EQ(rep.sched_rt_runtime_us, -1);
    EXPECT_EQ(rep.fair_server, tristate::yes);
    ASSERT_EQ(rep.fair_server_cpus.size(), 8U);
    EXPECT_EQ(rep.fair_server_cpus[0].runtime_ns, 50000000U);
    EXPECT_EQ(rep.fair_server_cpus[7].runtime_ns, 0U);
    EXPECT_EQ(rep.fair_server_cpus[7].period_ns, 1000000000U);
    EXPECT_EQ(rep.cgroup_v2_cpuset, tristate::yes);
    EXPECT_FALSE(rep.cgroup_v1_cpuset_mount);
    EXPECT_EQ(rep.hypervisor, tristate::no);
    EXPECT_EQ(rep.dmi_vendor, "Supermicro");
    EXPECT_EQ(rep.irqbalance, tristate::no);
    ASSERT_EQ(rep.cpu_power.size(), 6U);
    EXPECT_EQ(rep.cpu_power[0].governor, "performance");
    expect_warnings(rep, {});
}

TEST(kernel_probe, never_claims_a_boot_knob_covers_a_cpu_the_kernel_did_not_isolate) {
    const auto rep = probe_kernel(tree("rt-isolated-8cpu"), list("1-3"));
    expect_warnings(rep, {
        {"boot",
         "isolcpus is not in effect on isolated CPU 1 (/sys/devices/system/cpu/isolated lists 2-7); the kernel command line has isolcpus=managed_irq,domain,2-7; the scheduler still balances tasks onto those CPUs",
         "replace isolcpus=managed_irq,domain,2-7 on the kernel command line with isolcpus=managed_irq,domain,1-3",
         true},
        {"boot",
         "nohz_full is not in effect on isolated CPU 1 (/sys/devices/system/cpu/nohz_full lists 2-7); the kernel command line has nohz_full=2-7; the scheduler tick keeps interrupting those CPUs",
         "replace nohz_full=2-7 on the kernel command line with nohz_full=1-3",
         true},
        {"boot",
         "rcu_nocbs is not in effect on isolated CPU 1 (rcu_nocbs= and nohz_full cover 2-7); the kernel command line has rcu_nocbs=2-7; RCU callbacks still run on those CPUs",
         "replace rcu_nocbs=2-7 on the kernel command line with rcu_nocbs=1-3",
         true},
        {"boot",
         "irqaffinity=0-1 includes isolated CPU 1",
         "replace irqaffinity=0-1 on the kernel command line with irqaffinity=0,4-7",
         true},
        {"sched",
         "the fair server (dl_server) reserves 50000000 ns of every 1000000000 ns for normal tasks on CPU 1, preempting a SCHED_FIFO dispatch thread whenever a normal task is runnable there",
         "echo 0 > /sys/kernel/debug/sched/fair_server/cpu1/runtime (runtime setting, lost at reboot)",
         false},
    });
}

TEST(kernel_probe, stock_debian_smp_host_warns_about_every_untuned_knob) {
    const auto rep = probe_kernel(tree("stock-64cpu-smt"), list("4-5,36-37"));
    // No /proc/sys/kernel/version in this tree: uname -v comes from /proc/version.
    EXPECT_EQ(rep.version, "#1 SMP PREEMPT_DYNAMIC Debian 6.1.115-1 (2024-11-01)");
    EXPECT_EQ(rep.online, list("0-63"));
    EXPECT_EQ(rep.nohz_full.kernel_cpus, cpu_set{});   // "(null)"
    EXPECT_EQ(rep.nohz_full_supported, tristate::yes);
    EXPECT_FALSE(rep.io_uring_disabled);
    EXPECT_EQ(rep.io_uring, tristate::unknown);
    EXPECT_EQ(rep.irqbalance, tristate::yes);
    EXPECT_EQ(rep.irqbalance_pid, 734);
    ASSERT_EQ(rep.cpu_power.size(), 4U);
    EXPECT_EQ(rep.cpu_power[2].cpu, 36U);
    ASSERT_EQ(rep.cpu_power[2].idle_states.size(), 4U);
    EXPECT_EQ(rep.cpu_power[2].idle_states[3].latency_us, 170U);
    expect_warnings(rep, {
        {"kernel",
         "kernel is not PREEMPT_RT (preempt model: PREEMPT_DYNAMIC): wakeup latency on isolated CPUs is bounded only by the longest non-preemptible kernel section",
         "boot a PREEMPT_RT kernel (Debian: apt-get install linux-image-rt-amd64); short of that, add preempt=full to the kernel command line",
         true},
        {"boot",
         "isolcpus is not in effect on isolated CPUs 4-5,36-37 (/sys/devices/system/cpu/isolated lists none); the scheduler still balances tasks onto those CPUs",
         "add to the kernel command line: isolcpus=managed_irq,domain,4-5,36-37",
         true},
        {"boot",
         "nohz_full is not in effect on isolated CPUs 4-5,36-37 (/sys/devices/system/cpu/nohz_full lists none); the scheduler tick keeps interrupting those CPUs",
         "add to the kernel command line: nohz_full=4-5,36-37",
         true},
        {"boot",
         "rcu_nocbs is not in effect on isolated CPUs 4-5,36-37 (rcu_nocbs= and nohz_full cover none); RCU callbacks still run on those CPUs",
         "add to the kernel command line: rcu_nocbs=4-5,36-37",
         true},
        {"boot",
         "irqaffinity is not set: IRQs may start on isolated CPUs 4-5,36-37 until they are pinned at runtime",
         "add to the kernel command line: irqaffinity=0-3,6-35,38-63",
         true},
        {"sched",
         "RT throttling is on: SCHED_FIFO tasks may run only 950000 us of every 1000000 us, so a spinning dispatch thread can be stalled for 50000 us",
         "sysctl -w kernel.sched_rt_runtime_us=-1 (persist it in /etc/sysctl.d/)",
         false},
        {"irq",
         "irqbalance is running (pid 734): it moves IRQs back onto isolated CPUs unless they are banned",
         "ban the isolated CPUs: IRQBALANCE_BANNED_CPULIST=4-5,36-37 in /etc/default/irqbalance, then restart irqbalance",
         false},
        {"cpufreq",
         "CPUs 4-5,36-37 use the schedutil cpufreq governor: frequency changes add latency and make dispatch timing depend on load",
         "cpupower -c 4-5,36-37 frequency-set -g performance (or echo performance > /sys/devices/system/cpu/cpuN/cpufreq/scaling_governor for each)",
         false},
        {"cpuidle",
         "CPUs 4-5,36-37 may enter idle state C6 with an exit latency of 170 us",
         "hold /dev/cpu_dma_latency at 0 while dispatching (qrtd run does), or disable the state under /sys/devices/system/cpu/cpuN/cpuidle/stateK/disable",
         false},
    });
}

TEST(kernel_probe, restricted_xen_guest_warns_about_io_uring_btf_cpuset_steal_and_slack) {
    const auto rep = probe_kernel(tree("xen-guest-restricted"), list("2-3"));
    EXPECT_EQ(rep.preempt_model, "PREEMPT");
    EXPECT_EQ(rep.isolcpus.effective(), list("2-3"));
    EXPECT_TRUE(rep.isolcpus_flags.empty());
    EXPECT_EQ(rep.fair_server, tristate::no);
    EXPECT_EQ(rep.btf, tristate::no);
    EXPECT_EQ(rep.io_uring_disabled, 2);
    EXPECT_EQ(rep.io_uring, tristate::no);
    EXPECT_EQ(rep.hypervisor_type, "xen");
    ASSERT_TRUE(rep.steal_fraction);
    EXPECT_NEAR(*rep.steal_fraction, 500.0 / 9500.0, 1e-12);
    EXPECT_EQ(rep.timer_slack_ns, 200000U);
    expect_warnings(rep, {
        {"kernel",
         "kernel is not PREEMPT_RT (preempt model: PREEMPT): wakeup latency on isolated CPUs is bounded only by the longest non-preemptible kernel section",
         "boot a PREEMPT_RT kernel (Debian: apt-get install linux-image-rt-amd64)",
         true},
        {"boot",
         "isolcpus lacks the managed_irq flag: managed IRQs (NVMe, multiqueue NICs) can still fire on isolated CPUs 2-3",
         "replace isolcpus=2-3 on the kernel command line with isolcpus=managed_irq,domain,2-3",
         true},
        {"boot",
         "nohz_full is not in effect on isolated CPUs 2-3 (/sys/devices/system/cpu/nohz_full lists none); the scheduler tick keeps interrupting those CPUs",
         "add to the kernel command line: nohz_full=2-3",
         true},
        {"boot",
         "rcu_nocbs is not in effect on isolated CPUs 2-3 (rcu_nocbs= and nohz_full cover none); RCU callbacks still run on those CPUs",
         "add to the kernel command line: rcu_nocbs=2-3",
         true},
        {"boot",
         "irqaffinity is not set: IRQs may start on isolated CPUs 2-3 until they are pinned at runtime",
         "add to the kernel command line: irqaffinity=0-1",
         true},
        {"cgroup",
         "no cpuset controller: cgroup v2 at /sys/fs/cgroup does not offer cpuset in cgroup.controllers and no cgroup v1 cpuset is mounted; runtime isolation falls back to an affinity fence, which cannot stop new tasks from landing on isolated CPUs",
         "mkdir -p /sys/fs/cgroup/cpuset && mount -t cgroup -o cpuset cpuset /sys/fs/cgroup/cpuset; if that fails, boot a kernel built with CONFIG_CPUSETS=y",
         false},
        {"bpf",
         "no BTF (/sys/kernel/btf/vmlinux is missing): the eBPF wakeup-latency and intrusion probes cannot load, so qrtd reports probes: unavailable",
         "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y (Debian's stock kernels are)",
         true},
        {"io_uring",
         "io_uring is disabled (io_uring_disabled=2): the dispatcher cannot submit through io_uring",
         "sysctl -w kernel.io_uring_disabled=0 (persist it in /etc/sysctl.d/)",
         false},
        {"hypervisor",
         "running under a hypervisor (xen): the host can deschedule vCPUs, which no guest setting prevents; steal time since boot is 5.26%",
         "pin each vCPU to a dedicated, isolated host core (e.g. libvirt <vcpupin> plus isolcpus on the host), or run on bare metal",
         false},
        {"timer",
         "timer slack is 200000 ns, above the 50000 ns default: threads that do not set their own slack wake up late by up to that much",
         "remove TimerSlackNSec= (or the parent's PR_SET_TIMERSLACK) for qrtd; its dispatch threads set 1 ns themselves",
         false},
    });
}

TEST(kernel_probe, without_an_isolated_set_per_cpu_checks_cover_every_online_cpu) {
    const auto rep = probe_kernel(tree("stock-64cpu-smt"), cpu_set{});
    EXPECT_EQ(rep.cpu_power.size(), 64U);
    EXPECT_FALSE(rep.has_warning("boot"));
    ASSERT_TRUE(rep.has_warning("cpufreq"));
    for (const auto& w : rep.warnings) {
        if (w.subsystem == "cpufreq") {
            EXPECT_EQ(w.message, "CPUs 0-63 use the schedutil cpufreq governor: frequency changes add latency and "
                                 "make dispatch timing depend on load");
        }
    }
}

TEST(kernel_probe, an_isolated_cpu_that_is_not_online_is_a_warning) {
    const auto rep = probe_kernel(tree("rt-isolated-8cpu"), list("6-9"));
    ASSERT_FALSE(rep.warnings.empty());
    EXPECT_EQ(rep.warnings[0].subsystem, "cpu");
    EXPECT_EQ(rep.warnings[0].message, "isolated CPUs 8-9 not online (online CPUs: 0-7)");
}

TEST(kernel_probe, an_empty_tree_is_all_unknown_and_claims_nothing) {
    const auto root = std::filesystem::temp_directory_path() / ("qrt-probe-empty-" + std::to_string(::getpid()));
    std::filesystem::create_directories(root);
    const auto rep = probe_kernel(host_fs(root), list("1"));
    std::filesystem::remove_all(root);
    EXPECT_EQ(rep.preempt_rt, tristate::unknown);
    EXPECT_EQ(rep.preempt_model, "unknown");
    EXPECT_FALSE(rep.release);
    EXPECT_FALSE(rep.online);
    EXPECT_FALSE(rep.cmdline);
    EXPECT_TRUE(rep.isolcpus.effective().empty());
    EXPECT_EQ(rep.btf, tristate::unknown);
    EXPECT_EQ(rep.hypervisor, tristate::unknown);
    EXPECT_EQ(rep.irqbalance, tristate::unknown);
    EXPECT_EQ(rep.fair_server, tristate::unknown);
    EXPECT_FALSE(rep.mounts_read);
    EXPECT_FALSE(rep.steal_fraction);
    // Boot knobs are not in effect, so they are still recommended; nothing
    // unknown is reported as a risk of its own.
    for (const auto& w : rep.warnings) {
        EXPECT_EQ(w.subsystem, "boot") << w.message;
        EXPECT_TRUE(w.needs_reboot) << w.message;
    }
    EXPECT_EQ(rep.warnings.size(), 4U);
    EXPECT_NE(rtcore::format_kernel_report(rep).find("preempt_rt: unknown"), std::string::npos);
}

TEST(kernel_probe, rcu_nocbs_is_implied_by_nohz_full) {
    const auto root = std::filesystem::temp_directory_path() / ("qrt-probe-nohz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(root / "proc");
    std::filesystem::create_directories(root / "sys/devices/system/cpu");
    std::ofstream(root / "proc/cmdline") << "ro nohz_full=2-3 isolcpus=managed_irq,domain,2-3 irqaffinity=0-1\n";
    std::ofstream(root / "sys/devices/system/cpu/online") << "0-3\n";
    std::ofstream(root / "sys/devices/system/cpu/isolated") << "2-3\n";
    std::ofstream(root / "sys/devices/system/cpu/nohz_full") << "2-3\n";
    const auto rep = probe_kernel(host_fs(root), list("2-3"));
    std::filesystem::remove_all(root);
    EXPECT_FALSE(rep.rcu_nocbs.cmdline_value);
    EXPECT_EQ(rep.rcu_nocbs.effective(), list("2-3"));
    EXPECT_FALSE(rep.has_warning("boot"));
}

TEST(kernel_probe, this_host_probe_is_self_consistent) {
    const auto fs = host_fs::system();
    const auto rep = probe_kernel(fs, cpu_set{});
    const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
    ASSERT_TRUE(rep.online) << "/sys/devices/system/cpu/online unreadable";
    EXPECT_EQ(rep.online->count(), static_cast<std::size_t>(n));
    ASSERT_TRUE(rep.release);
    EXPECT_FALSE(rep.release->empty());
    EXPECT_NE(rep.preempt_rt, tristate::unknown);
    EXPECT_EQ(rep.preempt_rt == tristate::yes, fs.read_line("/sys/kernel/realtime").value_or("") == "1" ||
                                                   rep.version->find("PREEMPT_RT") != std::string::npos);
    EXPECT_EQ(rep.btf == tristate::yes, std::filesystem::exists("/sys/kernel/btf/vmlinux"));
    EXPECT_TRUE(rep.mounts_read);
    if (rep.steal_fraction) {
        EXPECT_GE(*rep.steal_fraction, 0.0);
        EXPECT_LE(*rep.steal_fraction, 1.0);
    }
    ASSERT_TRUE(rep.timer_slack_ns);
    EXPECT_GT(*rep.timer_slack_ns, 0U);
    EXPECT_NE(rep.irqbalance, tristate::unknown);
    EXPECT_EQ(rep.cpu_power.size(), rep.online->count());
    // What the kernel lists as isolated is what the report says is in effect.
    if (auto iso = fs.read_line("/sys/devices/system/cpu/isolated")) {
        EXPECT_EQ(rep.isolcpus.effective(), cpu_set::parse_list(*iso).value());
    }
    // Probing against an isolated CPU only adds boot warnings when the kernel
    // does not already isolate it, and each one needs a reboot.
    const unsigned last = static_cast<unsigned>(rep.online->last());
    const auto rep1 = probe_kernel(fs, cpu_set{last});
    for (const auto& w : rep1.warnings) {
        if (w.subsystem == "boot") {
            EXPECT_TRUE(w.needs_reboot) << w.message;
            EXPECT_NE(w.fix.find("kernel command line"), std::string::npos) << w.fix;
        }
    }
    const bool all_in_effect = rep1.isolcpus.effective().test(last) && rep1.nohz_full.effective().test(last) &&
                               rep1.rcu_nocbs.effective().test(last) && !rep1.irqaffinity.effective().empty() &&
                               !rep1.irqaffinity.effective().test(last);
    EXPECT_EQ(rep1.has_warning("boot"), !all_in_effect);
}
