#pragma once
// A wakeup-probe histogram as an rtcore::histogram: every sample of a probe
// bucket is recorded at the bucket's midpoint, never above the probe's
// max_ns.  The open last bucket (>= 2^36 ns) has no midpoint: its samples
// are recorded at its lower bound.  Used by the agent's telemetry
// (qrt_probe_wakeup_latency_seconds) and by qrt-jitter-report --standalone,
// so both draw the same bins from the same counters.

#include <algorithm>
#include <cstdint>

#include "qrt_bpf/histogram.hpp"
#include "rtcore/histogram.hpp"

namespace qrt_bpf {

inline rtcore::histogram to_rtcore_histogram(const wakeup_histogram& w) noexcept {
    rtcore::histogram h;
    for (unsigned i = 0; i < wakeup_histogram::bucket_count; ++i) {
        if (w.buckets[i] == 0) {
            continue;
        }
        const std::uint64_t lo = wakeup_histogram::bucket_lower_ns(i);
        const std::uint64_t hi = wakeup_histogram::bucket_upper_ns(i);
        const std::uint64_t mid = hi == UINT64_MAX ? lo : lo + (hi - lo) / 2;
        h.record_n(static_cast<std::int64_t>(std::min(mid, w.max_ns)), w.buckets[i]);
    }
    return h;
}

}  // namespace qrt_bpf
