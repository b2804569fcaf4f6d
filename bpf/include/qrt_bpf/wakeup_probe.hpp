#pragma once
// Probe 1 loader: wakeup latency of the dispatch threads.
//
//   auto probe = qrt_bpf::wakeup_probe::load({});   // open, configure, load, attach
//   probe->add_tid(gettid_of_dispatch_thread);
//   ... later, on the housekeeping side:
//   auto hist = probe->read();                       // summed over CPUs
//
// RAII: the skeleton and its links are released by the destructor.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "qrt_bpf/histogram.hpp"
#include "rtcore/error.hpp"

namespace qrt_bpf {

struct wakeup_options {
    // Count a preemption that leaves a dispatch thread runnable as a new
    // wait, as runqlat does.
    bool count_preempted = true;
    // Use the raw_tp programs even where tp_btf works (probes.flavour =
    // "raw_tp", tests).
    bool force_raw_tp = false;
};

class wakeup_probe {
public:
    static rtcore::result<wakeup_probe> load(const wakeup_options& options);

    wakeup_probe(wakeup_probe&&) noexcept;
    wakeup_probe& operator=(wakeup_probe&&) noexcept;
    ~wakeup_probe();

    rtcore::status add_tid(pid_t tid);
    rtcore::status remove_tid(pid_t tid);
    // The histogram summed over every possible CPU.
    rtcore::result<wakeup_histogram> read() const;
    // One histogram per possible CPU (index = CPU the thread was switched
    // in on), for per-CPU reports.
    rtcore::result<std::vector<wakeup_histogram>> read_per_cpu() const;
    // What loaded: "tp_btf", "raw_tp", or "tp_btf, raw_tp for sched_switch"
    // when the kernel rejected some tp_btf programs (each then runs as raw_tp).
    const std::string& flavour() const;

    struct impl;

private:
    explicit wakeup_probe(std::unique_ptr<impl> p);
    std::unique_ptr<impl> _impl;
};

}  // namespace qrt_bpf
