#pragma once
// Housekeeping vs isolated cores, planned from a topology.
//
// Rules (each choice is explained in partition_plan::reasons):
//   - isolate whole cores: SMT siblings share execution units and L1/L2, so a
//     housekeeping task on one sibling disturbs the other.  An explicit list
//     that splits a core is widened to the whole core (split_core::widen) or
//     refused (split_core::refuse);
//   - keep at least min_housekeeping_cores (>= 1) whole cores for
//     housekeeping; refuse a plan that would isolate every CPU;
//   - refuse CPUs that are not online, naming them and the online set;
//   - prefer cores near the device the RT threads serve (its PCI device or
//     network interface);
//   - prefer to keep CPU 0 for housekeeping (timers, boot-time IRQs and
//     many unmovable kthreads live there);
//   - otherwise isolate from the highest-numbered core down.
//
// Planning only reads the topology: it changes nothing on the host.  The
// boot-only knobs are returned as a recommended kernel command line that
// needs a reboot; nothing here claims they are in effect.

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/topology.hpp"

namespace rtcore {

struct plan_request {
    enum class split_core { widen, refuse };

    // Explicit isolated CPUs.  When set, isolate_cores is ignored.
    std::optional<cpu_set> isolated;
    // Number of whole cores to isolate.  Unset: auto, one core per RT
    // thread (rt_cpu_count), and at least the cores holding rt_cpus.
    std::optional<unsigned> isolate_cores;
    // RT threads that each need a CPU of their own on an isolated core
    // (>= 1).  The plan numbers them 0..rt_cpu_count-1 ("RT thread 0");
    // what each one is for is the caller's to say.
    unsigned rt_cpu_count = 1;
    // Wanted CPU per RT thread, index = RT thread.  Empty: chosen by the
    // plan (first CPU of each isolated core, nearest the device first).
    // When given it must have rt_cpu_count entries; their cores are isolated.
    std::vector<unsigned> rt_cpus;
    // Locality hint: a PCI bus id ("0000:00:04.0") or a network interface
    // ("eth0") of the device the RT threads serve.  A hint the topology does
    // not know is an error (a typo should not silently lose locality).
    std::optional<std::string> near_device;
    // Whole cores that stay housekeeping (>= 1).
    unsigned min_housekeeping_cores = 1;
    split_core on_split_core = split_core::widen;
};

// Boot-only knobs.  Never in effect until the host reboots with them.
struct kernel_cmdline_advice {
    // "isolcpus=managed_irq,domain,2-3 nohz_full=2-3 rcu_nocbs=2-3 irqaffinity=0-1"
    std::string args;
    bool needs_reboot = true;
};

struct partition_plan {
    cpu_set online;          // every online CPU of the topology
    cpu_set isolated;        // whole cores
    cpu_set housekeeping;    // online - isolated, never empty
    // CPU per RT thread, index = RT thread; each is in isolated.
    std::vector<unsigned> rt_cpus;
    // CPUs near the hint device (empty without a hint).
    cpu_set near_device_cpus;
    // One sentence per choice, in the order the choices were made.
    std::vector<std::string> reasons;
    kernel_cmdline_advice kernel_cmdline;
};

result<partition_plan> plan_partition(const topology& topo, const plan_request& req);

// The kernel command line that makes `isolated` isolated at boot, with
// irqaffinity set to `housekeeping`.
std::string recommended_kernel_cmdline(const cpu_set& isolated, const cpu_set& housekeeping);

// Multi-line human-readable rendering.  rt_cpu_label names RT thread i's
// line ("rt thread 0 cpu" by default; the caller may say what the thread
// is for, e.g. "qpu 0 dispatch cpu").
std::string format_plan(const partition_plan& plan,
                        const std::function<std::string(std::size_t)>& rt_cpu_label = {});

}  // namespace rtcore
