#pragma once
// A dispatch wakeup over the outlier threshold (probe 3), with what ran on
// its CPU just before the switch.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qrt_bpf/intrusion.hpp"

namespace qrt_bpf {

struct outlier_cause {
    intrusion_kind kind = intrusion_kind::task;
    std::uint32_t id = 0;
    std::string name;
    std::uint64_t start_ns = 0;  // CLOCK_MONOTONIC
    std::uint64_t duration_ns = 0;
    // Overlap with [wakeup_ns, switch_ns]: 0 for what ran before the wakeup.
    std::uint64_t overlap_ns = 0;

    std::string source() const { return describe_source(kind, id, name); }
};

struct outlier {
    std::uint32_t tid = 0;
    std::string comm;
    unsigned cpu = 0;
    unsigned waker_cpu = 0;
    std::uint64_t wakeup_ns = 0;
    std::uint64_t switch_ns = 0;
    std::uint64_t latency_ns = 0;
    // The CPU's recent history, oldest first.
    std::vector<outlier_cause> causes;

    // The cause with the largest overlap with the latency window, if any.
    std::optional<outlier_cause> main_cause() const;
    // "tid 1234 (qrt-dispatch) on cpu 1: 812 us after wakeup; during it:
    //  task stress-ng-cpu/999 790 us, irq LOC (local timer) 3 us"
    std::string summary() const;
};

}  // namespace qrt_bpf
