#include "qrt_bpf/histogram.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "decode.hpp"

namespace qrt_bpf {

static_assert(wakeup_histogram::sub_bits == QRT_WAKEUP_SUB_BITS);
static_assert(wakeup_histogram::subs == QRT_WAKEUP_SUBS);
static_assert(wakeup_histogram::max_pow == QRT_WAKEUP_MAX_POW);
static_assert(wakeup_histogram::bucket_count == QRT_WAKEUP_BUCKETS);

unsigned wakeup_histogram::bucket_of(std::uint64_t v_ns) noexcept {
    return qrt_wakeup_bucket(v_ns);  // the very function the BPF side runs
}

std::uint64_t wakeup_histogram::bucket_lower_ns(unsigned index) noexcept {
    if (index < subs) {
        return index;
    }
    const unsigned p = index / subs + sub_bits - 1;
    const std::uint64_t sub = index % subs;
    return (subs + sub) << (p - sub_bits);
}

std::uint64_t wakeup_histogram::bucket_upper_ns(unsigned index) noexcept {
    if (index + 1 >= bucket_count) {
        return UINT64_MAX;
    }
    return bucket_lower_ns(index + 1);
}

void wakeup_histogram::record(std::uint64_t v_ns) noexcept {
    buckets[bucket_of(v_ns)]++;
    count++;
    sum_ns += v_ns;
    max_ns = std::max(max_ns, v_ns);
}

double wakeup_histogram::quantile_ns(double q) const noexcept {
    if (count == 0) {
        return 0.0;
    }
    q = std::clamp(q, 0.0, 1.0);
    // Rank of the q-quantile among count samples, 1-based.
    const double rank = std::max(1.0, std::ceil(q * static_cast<double>(count)));
    std::uint64_t seen = 0;
    for (unsigned i = 0; i < bucket_count; ++i) {
        const std::uint64_t n = buckets[i];
        if (n == 0) {
            continue;
        }
        if (static_cast<double>(seen + n) >= rank) {
            const double lower = static_cast<double>(bucket_lower_ns(i));
            const double upper = i + 1 >= bucket_count
                                     ? static_cast<double>(max_ns)
                                     : static_cast<double>(bucket_upper_ns(i));
            // Samples spread evenly over the bucket: the k-th of n sits at
            // the middle of its 1/n slice.
            const double k = rank - static_cast<double>(seen);
            const double v = lower + (upper - lower) * (k - 0.5) / static_cast<double>(n);
            return std::min(v, static_cast<double>(max_ns));
        }
        seen += n;
    }
    return static_cast<double>(max_ns);
}

double wakeup_histogram::mean_ns() const noexcept {
    return count == 0 ? 0.0 : static_cast<double>(sum_ns) / static_cast<double>(count);
}

wakeup_histogram& wakeup_histogram::operator+=(const wakeup_histogram& other) noexcept {
    for (unsigned i = 0; i < bucket_count; ++i) {
        buckets[i] += other.buckets[i];
    }
    count += other.count;
    sum_ns += other.sum_ns;
    max_ns = std::max(max_ns, other.max_ns);
    return *this;
}

wakeup_histogram wakeup_histogram::since(const wakeup_histogram& earlier) const noexcept {
    wakeup_histogram d;
    for (unsigned i = 0; i < bucket_count; ++i) {
        d.buckets[i] = buckets[i] >= earlier.buckets[i] ? buckets[i] - earlier.buckets[i] : 0;
    }
    d.count = count >= earlier.count ? count - earlier.count : 0;
    d.sum_ns = sum_ns >= earlier.sum_ns ? sum_ns - earlier.sum_ns : 0;
    d.max_ns = max_ns;
    return d;
}

namespace detail {

wakeup_histogram sum_cpus(const qrt_wakeup_hist* per_cpu, std::size_t ncpus) noexcept {
    wakeup_histogram total;
    for (std::size_t c = 0; c < ncpus; ++c) {
        const qrt_wakeup_hist& h = per_cpu[c];
        for (unsigned i = 0; i < wakeup_histogram::bucket_count; ++i) {
            total.buckets[i] += h.bucket_count[i];
        }
        total.count += h.count;
        total.sum_ns += h.sum_ns;
        total.max_ns = std::max<std::uint64_t>(total.max_ns, h.max_ns);
    }
    return total;
}

}  // namespace detail
}  // namespace qrt_bpf
