#pragma once
// Probe 3 loader: ring buffer events for dispatch wakeups over a threshold,
// each with the recent history of its CPU.
//
//   auto probe = qrt_bpf::outlier_probe::load({.threshold_ns = 50'000});
//   probe->add_tid(dispatch_tid);
//   auto events = probe->poll(100);   // housekeeping side, waits <= 100 ms

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qrt_bpf/outlier.hpp"
#include "rtcore/error.hpp"

namespace qrt_bpf {

struct outlier_options {
    std::uint64_t threshold_ns = 100'000;
    bool force_raw_tp = false;
};

class outlier_probe {
public:
    static rtcore::result<outlier_probe> load(const outlier_options& options);

    outlier_probe(outlier_probe&&) noexcept;
    outlier_probe& operator=(outlier_probe&&) noexcept;
    ~outlier_probe();

    rtcore::status add_tid(pid_t tid);
    rtcore::status remove_tid(pid_t tid);
    // Waits up to timeout_ms (0: no wait) and returns the events that came.
    rtcore::result<std::vector<outlier>> poll(int timeout_ms);
    // Events the BPF side could not queue (ring buffer full).
    rtcore::result<std::uint64_t> dropped() const;
    // The ring buffer's epoll fd, for an event loop.
    int epoll_fd() const;
    const std::string& flavour() const;

    struct impl;

private:
    explicit outlier_probe(std::unique_ptr<impl> p);
    std::unique_ptr<impl> _impl;
};

}  // namespace qrt_bpf
