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
#include "rtcore/host_fs.hpp"

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

// What one prune_exited_tasks() did.
struct intrusion_prune_result {
    std::size_t pruned = 0;      // task keys of exited threads removed from the BPF map
    std::size_t live_keys = 0;   // keys left in the BPF map (<= QRT_INTRUSION_MAX_KEYS)
    std::size_t exited_rows = 0;  // per-(cpu, command) totals kept for exited threads
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
    // Threads that exited and were pruned appear as one row per (cpu,
    // command) with id 0 ("task kworker/1:7 (exited)"), so every total stays
    // monotonic across a prune.
    rtcore::result<std::vector<intrusion>> read() const;

    // The BPF map holds one key per (cpu, TID) of a foreign task, so every
    // new thread takes a key until the map is full (QRT_INTRUSION_MAX_KEYS,
    // 8192; then new sources are dropped and counted in map_full).  This
    // removes the keys of threads that have exited: no /proc/<tid>/comm
    // under fs, or one naming another command (the TID was reused), and no
    // update for min_idle_ns (so the last segment of a thread that is just
    // exiting is not lost).  Their totals move to the exited-thread rows,
    // which are capped at max_exited_rows; beyond it a (cpu, command) is
    // added to the row of command "(other)" of its CPU.
    // The daemon calls it from housekeeping every 10 s.
    static constexpr std::size_t max_exited_rows = 1024;
    static constexpr std::size_t max_keys = 8192;  // QRT_INTRUSION_MAX_KEYS
    rtcore::result<intrusion_prune_result> prune_exited_tasks(
        const rtcore::host_fs& fs = rtcore::host_fs::system(),
        std::uint64_t min_idle_ns = 1'000'000'000);
    // Keys in the BPF map now (tests; bounded by QRT_INTRUSION_MAX_KEYS).
    rtcore::result<std::vector<intrusion>> read_map() const;
    rtcore::result<intrusion_counters> counters() const;
    const std::string& flavour() const;

    struct impl;

private:
    explicit intrusion_probe(std::unique_ptr<impl> p);
    std::unique_ptr<impl> _impl;
};

}  // namespace qrt_bpf
