#pragma once
// Wakeup-latency histogram read from probe 1: log2 buckets split into 8
// linear sub-buckets (relative bucket width <= 12.5%), summed over CPUs.
// Bucket layout is the one of bpf/progs/wakeup.h; the loader static_asserts
// that the two agree.

#include <array>
#include <cstdint>

namespace qrt_bpf {

struct wakeup_histogram {
    static constexpr unsigned sub_bits = 3;
    static constexpr unsigned subs = 1U << sub_bits;
    static constexpr unsigned max_pow = 36;  // >= 2^36 ns (68.7 s) -> last bucket
    static constexpr unsigned bucket_count = (max_pow - sub_bits + 1) * subs;

    std::array<std::uint64_t, bucket_count> buckets{};
    std::uint64_t count = 0;
    std::uint64_t sum_ns = 0;
    std::uint64_t max_ns = 0;

    // The bucket v_ns falls in (same function as the BPF side).
    static unsigned bucket_of(std::uint64_t v_ns) noexcept;
    // [lower_ns, upper_ns) of a bucket.
    static std::uint64_t bucket_lower_ns(unsigned index) noexcept;
    static std::uint64_t bucket_upper_ns(unsigned index) noexcept;

    // Records one value (tests and user-space histograms).
    void record(std::uint64_t v_ns) noexcept;
    // The q-quantile (0..1), interpolated linearly inside its bucket and
    // never above max_ns; 0 when empty.
    double quantile_ns(double q) const noexcept;
    double mean_ns() const noexcept;

    wakeup_histogram& operator+=(const wakeup_histogram& other) noexcept;
    // What was added since an earlier snapshot of the same counters (max_ns
    // cannot be differenced: it keeps the later max).
    wakeup_histogram since(const wakeup_histogram& earlier) const noexcept;
};

}  // namespace qrt_bpf
