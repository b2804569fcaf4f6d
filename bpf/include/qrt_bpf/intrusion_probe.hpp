#pragma once
// Probe 2 loader: hardirqs, local timer ticks, softirqs and foreign tasks on
// the isolated CPUs, per source.
//
//   auto probe = qrt_bpf::intrusion_probe::load({.isolated_cpus = {1}});
//   probe->add_tid(dispatch_tid);            // not an intrusion
//   auto list = probe->read();               // one entry per (cpu, source)

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qrt_bpf/intrusion.hpp"
#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"

namespace qrt_bpf {

struct intrusion_options {
    rtcore::cpu_set isolated_cpus;  // must not be empty; CPUs < 1024
    bool force_raw_tp = false;
    // Not intrusions (the dispatch threads, their io_uring pollers): put in
    // the map before the programs attach, so none of their switches is
    // counted in the window before an add_tid() could run.
    std::vector<pid_t> exempt_tids;
};

struct intrusion_counters {
    std::uint64_t map_full = 0;        // sources dropped: key map full
    std::uint64_t unmatched_exit = 0;  // exits seen without their entry
    // Runs the kernel skipped because the same program was already running
    // on that CPU (bpf_prog_info.recursion_misses, summed over programs).
    std::uint64_t recursion_misses = 0;
};

class intrusion_probe {
public:
    static rtcore::result<intrusion_probe> load(const intrusion_options& options);

    intrusion_probe(intrusion_probe&&) noexcept;
    intrusion_probe& operator=(intrusion_probe&&) noexcept;
    ~intrusion_probe();

    rtcore::status add_tid(pid_t tid);
    rtcore::status remove_tid(pid_t tid);
    // Every (cpu, source) seen so far, sorted by total time, largest first.
    rtcore::result<std::vector<intrusion>> read() const;
    rtcore::result<intrusion_counters> counters() const;
    const std::string& flavour() const;

    struct impl;

private:
    explicit intrusion_probe(std::unique_ptr<impl> p);
    std::unique_ptr<impl> _impl;
};

}  // namespace qrt_bpf
