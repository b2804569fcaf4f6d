#pragma once
// Log-linear histogram of nanosecond values (HdrHistogram-like).
//
// Buckets:
//   - values 0 .. 127 each have their own bucket (exact);
//   - every power-of-two range [2^e, 2^(e+1)) for e = 7 .. 62 is split into
//     64 linear sub-buckets of width 2^(e-6).
// So a bucket is never wider than 1/64 of its lower bound, and a quantile
// reported at the bucket's midpoint is within 1/128 (0.78 %) of the true
// sample value.  The whole non-negative int64 range is covered with
// bucket_count = 3712 fixed buckets (29 KiB), held in a std::array: nothing is
// allocated after construction.
//
// record() is noexcept, allocation-free and O(1), so the real-time thread may
// call it.  quantile() walks the buckets (at most up to max's bucket) and is
// noexcept too.  The histogram is not synchronised: one thread writes it;
// others read a copy (it is trivially copyable) or merge() it.
//
// Statistics:
//   - count, min, max are exact; mean and stddev come from exact running sums
//     (128-bit integers: exact while sum of squares < 2^128, e.g. 2^64
//     samples of 1 s, or 2^28 samples of 13 days);
//   - stddev is the population standard deviation;
//   - quantile(q) uses the nearest-rank definition (the ceil(q*n)-th smallest
//     sample), reports the midpoint of the bucket holding it, clamped to
//     [min, max]; quantile(0) = min, quantile(1) = max exactly.
//
// Negative values (e.g. a lateness measured early) are recorded as 0 and
// counted in negative_count(), so reports can say so.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace rtcore {

// Bounds of one bucket: every value v in it has lower_ns <= v <= upper_ns
// (upper is inclusive, the form a Prometheus `le` label wants).
struct histogram_bucket {
    std::int64_t lower_ns = 0;
    std::int64_t upper_ns = 0;
    std::uint64_t count = 0;
};

// The figures reports print, computed in one pass over the buckets.
struct histogram_summary {
    std::uint64_t count = 0;
    std::int64_t min_ns = 0;
    std::int64_t max_ns = 0;
    double mean_ns = 0.0;
    double stddev_ns = 0.0;
    std::int64_t p50_ns = 0;
    std::int64_t p95_ns = 0;
    std::int64_t p99_ns = 0;
    std::int64_t p999_ns = 0;
};

// Calls f(name, field) for every field of a summary, with the name it has in
// every report and on the wire (telemetry.snapshot, qrt-jitter-report's
// JSON): the one list of them.  S is histogram_summary, const to write it
// out, mutable to read it in (pass a type derived from it as its base).
template <typename S, typename F>
constexpr void for_each_summary_field(S& s, F&& f) {
    static_assert(std::is_same_v<std::remove_const_t<S>, histogram_summary>);
    f("count", s.count);
    f("min_ns", s.min_ns);
    f("max_ns", s.max_ns);
    f("mean_ns", s.mean_ns);
    f("stddev_ns", s.stddev_ns);
    f("p50_ns", s.p50_ns);
    f("p95_ns", s.p95_ns);
    f("p99_ns", s.p99_ns);
    f("p999_ns", s.p999_ns);
}

class log_linear_histogram {
public:
    // log2 of the number of exact unit buckets at the bottom (0..127).
    static constexpr int linear_bits = 7;
    // Sub-buckets per power-of-two range.
    static constexpr int sub_bucket_bits = linear_bits - 1;
    static constexpr std::size_t sub_buckets = std::size_t{1} << sub_bucket_bits;
    static constexpr std::size_t linear_buckets = std::size_t{1} << linear_bits;
    static constexpr int max_exponent = 62;  // int64 max = 2^63 - 1
    static constexpr std::size_t bucket_count =
        linear_buckets + static_cast<std::size_t>(max_exponent - linear_bits + 1) * sub_buckets;
    // Worst-case relative error of a reported quantile against the sample.
    static constexpr double max_relative_error = 1.0 / static_cast<double>(2 * sub_buckets);

    log_linear_histogram() noexcept = default;

    // Bucket index of a value (negative values map to bucket 0).
    static constexpr std::size_t bucket_index(std::int64_t value_ns) noexcept {
        if (value_ns < static_cast<std::int64_t>(linear_buckets)) {
            return value_ns < 0 ? 0 : static_cast<std::size_t>(value_ns);
        }
        const auto v = static_cast<std::uint64_t>(value_ns);
        const int e = 63 - std::countl_zero(v);  // linear_bits .. 62
        const int shift = e - sub_bucket_bits;
        const auto sub = static_cast<std::size_t>(v >> shift) - sub_buckets;
        return linear_buckets + static_cast<std::size_t>(e - linear_bits) * sub_buckets + sub;
    }

    // Bounds of bucket `index` (< bucket_count); count is left 0.
    static constexpr histogram_bucket bucket_bounds(std::size_t index) noexcept {
        if (index < linear_buckets) {
            const auto v = static_cast<std::int64_t>(index);
            return {v, v, 0};
        }
        const std::size_t k = index - linear_buckets;
        const int e = linear_bits + static_cast<int>(k / sub_buckets);
        const std::size_t sub = k % sub_buckets;
        const int shift = e - sub_bucket_bits;
        const std::uint64_t lower = static_cast<std::uint64_t>(sub_buckets + sub) << shift;
        const std::uint64_t upper = lower + ((std::uint64_t{1} << shift) - 1);
        return {static_cast<std::int64_t>(lower), static_cast<std::int64_t>(upper), 0};
    }

    // The value reported for samples in bucket `index`: its midpoint.
    static constexpr std::int64_t bucket_midpoint(std::size_t index) noexcept {
        const histogram_bucket b = bucket_bounds(index);
        return b.lower_ns + (b.upper_ns - b.lower_ns + 1) / 2;
    }

    void record(std::int64_t value_ns) noexcept { record_n(value_ns, 1); }

    // Record `times` samples of the same value (merging foreign histograms,
    // e.g. BPF maps).  No effect when times == 0.
    void record_n(std::int64_t value_ns, std::uint64_t times) noexcept {
        if (times == 0) {
            return;
        }
        if (value_ns < 0) {
            _negative += times;
            value_ns = 0;
        }
        _counts[bucket_index(value_ns)] += times;
        if (_count == 0 || value_ns < _min) {
            _min = value_ns;
        }
        if (_count == 0 || value_ns > _max) {
            _max = value_ns;
        }
        _count += times;
        const auto v = static_cast<u128>(value_ns);
        _sum += v * times;
        _sum_sq += v * v * times;
    }

    void merge(const log_linear_histogram& other) noexcept {
        if (other._count == 0) {
            return;
        }
        for (std::size_t i = 0; i < bucket_count; ++i) {
            _counts[i] += other._counts[i];
        }
        if (_count == 0 || other._min < _min) {
            _min = other._min;
        }
        if (_count == 0 || other._max > _max) {
            _max = other._max;
        }
        _count += other._count;
        _negative += other._negative;
        _sum += other._sum;
        _sum_sq += other._sum_sq;
    }

    void reset() noexcept { *this = log_linear_histogram{}; }

    std::uint64_t count() const noexcept { return _count; }
    std::uint64_t negative_count() const noexcept { return _negative; }
    bool empty() const noexcept { return _count == 0; }
    // min/max/mean/stddev/quantile are 0 on an empty histogram.
    std::int64_t min() const noexcept { return _count == 0 ? 0 : _min; }
    std::int64_t max() const noexcept { return _count == 0 ? 0 : _max; }

    double mean() const noexcept {
        if (_count == 0) {
            return 0.0;
        }
        return static_cast<double>(static_cast<long double>(_sum) / static_cast<long double>(_count));
    }

    double stddev() const noexcept {
        if (_count < 2) {
            return 0.0;
        }
        // n * sum_sq - sum^2 >= 0 exactly; compute it in 128 bits when that
        // cannot overflow, else in long double.
        const u128 n = _count;
        const long double nl = static_cast<long double>(_count);
        long double num = 0.0L;
        constexpr u128 limit = ~u128{0};
        const bool fits = (_sum == 0 || _sum <= limit / _sum) && (_sum_sq <= limit / n);
        if (fits) {
            num = static_cast<long double>(n * _sum_sq - _sum * _sum);
        } else {
            const long double s = static_cast<long double>(_sum);
            num = nl * static_cast<long double>(_sum_sq) - s * s;
        }
        if (num <= 0.0L) {
            return 0.0;
        }
        return static_cast<double>(std::sqrt(num) / nl);
    }

    // The nearest-rank q-quantile (q clamped to [0, 1]).
    std::int64_t quantile(double q) const noexcept {
        if (_count == 0) {
            return 0;
        }
        if (!(q > 0.0)) {
            return _min;
        }
        if (q >= 1.0) {
            return _max;
        }
        return value_at_rank(rank_of(q));
    }

    histogram_summary summary() const noexcept {
        histogram_summary s;
        s.count = _count;
        s.min_ns = min();
        s.max_ns = max();
        s.mean_ns = mean();
        s.stddev_ns = stddev();
        s.p50_ns = quantile(0.50);
        s.p95_ns = quantile(0.95);
        s.p99_ns = quantile(0.99);
        s.p999_ns = quantile(0.999);
        return s;
    }

    // Bucket i with its count (i < bucket_count).
    histogram_bucket bucket(std::size_t index) const noexcept {
        histogram_bucket b = bucket_bounds(index);
        b.count = _counts[index];
        return b;
    }

    // Calls f(const histogram_bucket&) for every non-empty bucket, lowest first.
    template <typename F>
    void for_each_bucket(F&& f) const {
        if (_count == 0) {
            return;
        }
        const std::size_t last = bucket_index(_max);
        for (std::size_t i = bucket_index(_min); i <= last; ++i) {
            if (_counts[i] != 0) {
                f(bucket(i));
            }
        }
    }

    // Samples certainly <= le_ns: the sum over buckets whose upper bound is
    // <= le_ns.  Exact when le_ns is some bucket's upper_ns (choose Prometheus
    // `le` boundaries with bucket_upper_at_or_above()).
    std::uint64_t count_at_or_below(std::int64_t le_ns) const noexcept {
        if (_count == 0 || le_ns < 0) {
            return 0;
        }
        if (le_ns >= _max) {
            return _count;
        }
        std::size_t i = bucket_index(le_ns);
        if (bucket_bounds(i).upper_ns > le_ns) {
            if (i == 0) {
                return 0;
            }
            --i;
        }
        std::uint64_t c = 0;
        for (std::size_t j = 0; j <= i; ++j) {
            c += _counts[j];
        }
        return c;
    }

    // The smallest bucket upper bound >= value_ns: a boundary at which
    // count_at_or_below() is exact.
    static constexpr std::int64_t bucket_upper_at_or_above(std::int64_t value_ns) noexcept {
        return bucket_bounds(bucket_index(value_ns)).upper_ns;
    }

private:
    __extension__ using u128 = unsigned __int128;

    std::uint64_t rank_of(double q) const noexcept {
        const double r = std::ceil(q * static_cast<double>(_count));
        if (r < 1.0) {
            return 1;
        }
        if (r >= static_cast<double>(_count)) {
            return _count;
        }
        return static_cast<std::uint64_t>(r);
    }

    std::int64_t value_at_rank(std::uint64_t rank) const noexcept {
        std::uint64_t seen = 0;
        const std::size_t last = bucket_index(_max);
        for (std::size_t i = bucket_index(_min); i <= last; ++i) {
            seen += _counts[i];
            if (seen >= rank) {
                return std::clamp(bucket_midpoint(i), _min, _max);
            }
        }
        return _max;
    }

    std::array<std::uint64_t, bucket_count> _counts{};
    std::uint64_t _count = 0;
    std::uint64_t _negative = 0;
    std::int64_t _min = 0;
    std::int64_t _max = 0;
    u128 _sum = 0;
    u128 _sum_sq = 0;
};

// The short name used across qrtd.
using histogram = log_linear_histogram;

static_assert(log_linear_histogram::bucket_count == 3712);
static_assert(log_linear_histogram::bucket_index(std::numeric_limits<std::int64_t>::max()) ==
              log_linear_histogram::bucket_count - 1);
static_assert(log_linear_histogram::bucket_bounds(log_linear_histogram::bucket_count - 1).upper_ns ==
              std::numeric_limits<std::int64_t>::max());
static_assert(log_linear_histogram::bucket_bounds(128).lower_ns == 128 &&
              log_linear_histogram::bucket_bounds(128).upper_ns == 129);

}  // namespace rtcore
