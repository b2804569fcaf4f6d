#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "rtcore/histogram.hpp"

using rtcore::log_linear_histogram;

namespace {

// Nearest-rank quantile of sorted samples: the ceil(q*n)-th smallest.
std::int64_t exact_quantile(const std::vector<std::int64_t>& sorted, double q) {
    const auto n = static_cast<double>(sorted.size());
    auto rank = static_cast<std::size_t>(std::ceil(q * n));
    rank = std::clamp<std::size_t>(rank, 1, sorted.size());
    return sorted[rank - 1];
}

double exact_mean(const std::vector<std::int64_t>& v) {
    long double s = 0;
    for (auto x : v) {
        s += static_cast<long double>(x);
    }
    return static_cast<double>(s / static_cast<long double>(v.size()));
}

double exact_stddev(const std::vector<std::int64_t>& v) {
    const long double m = exact_mean(v);
    long double s = 0;
    for (auto x : v) {
        const long double d = static_cast<long double>(x) - m;
        s += d * d;
    }
    return static_cast<double>(std::sqrt(s / static_cast<long double>(v.size())));
}

struct distribution_case {
    std::string name;
    std::function<std::int64_t(std::mt19937_64&)> draw;
};

std::vector<distribution_case> distributions() {
    return {
        {"uniform_0_to_1ms",
         [](std::mt19937_64& g) { return std::uniform_int_distribution<std::int64_t>(0, 1'000'000)(g); }},
        {"exponential_mean_5us",
         [](std::mt19937_64& g) {
             return static_cast<std::int64_t>(std::exponential_distribution<double>(1.0 / 5000.0)(g));
         }},
        {"lognormal_wakeup_latency",
         [](std::mt19937_64& g) {
             return static_cast<std::int64_t>(std::lognormal_distribution<double>(std::log(3000.0), 0.8)(g));
         }},
        {"bimodal_with_rare_outliers",
         [](std::mt19937_64& g) {
             const double u = std::uniform_real_distribution<double>(0, 1)(g);
             if (u < 0.002) {
                 return std::uniform_int_distribution<std::int64_t>(1'000'000, 50'000'000)(g);
             }
             if (u < 0.5) {
                 return static_cast<std::int64_t>(std::normal_distribution<double>(800, 40)(g));
             }
             return static_cast<std::int64_t>(std::normal_distribution<double>(12000, 900)(g));
         }},
        {"small_integers",
         [](std::mt19937_64& g) { return std::uniform_int_distribution<std::int64_t>(0, 300)(g); }},
        {"seconds_scale",
         [](std::mt19937_64& g) {
             return std::uniform_int_distribution<std::int64_t>(1'000'000'000, 90'000'000'000)(g);
         }},
    };
}

}  // namespace

TEST(histogram, bucket_index_and_bounds_agree_over_the_whole_range) {
    for (std::size_t i = 0; i < log_linear_histogram::bucket_count; ++i) {
        const auto b = log_linear_histogram::bucket_bounds(i);
        ASSERT_LE(b.lower_ns, b.upper_ns) << "bucket " << i;
        EXPECT_EQ(log_linear_histogram::bucket_index(b.lower_ns), i);
        EXPECT_EQ(log_linear_histogram::bucket_index(b.upper_ns), i);
        if (i + 1 < log_linear_histogram::bucket_count) {
            EXPECT_EQ(log_linear_histogram::bucket_bounds(i + 1).lower_ns, b.upper_ns + 1) << "gap after " << i;
        }
        // No bucket is wider than 1/64 of its lower bound (beyond the exact ones).
        if (b.lower_ns >= 128) {
            EXPECT_LE(static_cast<double>(b.upper_ns - b.lower_ns + 1), static_cast<double>(b.lower_ns) / 64.0);
        }
    }
    EXPECT_EQ(log_linear_histogram::bucket_bounds(0).lower_ns, 0);
    EXPECT_EQ(log_linear_histogram::bucket_bounds(log_linear_histogram::bucket_count - 1).upper_ns,
              std::numeric_limits<std::int64_t>::max());
}

TEST(histogram, an_empty_histogram_reports_zeros) {
    log_linear_histogram h;
    EXPECT_TRUE(h.empty());
    EXPECT_EQ(h.count(), 0u);
    EXPECT_EQ(h.min(), 0);
    EXPECT_EQ(h.max(), 0);
    EXPECT_EQ(h.mean(), 0.0);
    EXPECT_EQ(h.stddev(), 0.0);
    EXPECT_EQ(h.quantile(0.99), 0);
    int buckets = 0;
    h.for_each_bucket([&](const rtcore::histogram_bucket&) { ++buckets; });
    EXPECT_EQ(buckets, 0);
}

TEST(histogram, small_values_are_exact) {
    log_linear_histogram h;
    for (std::int64_t v = 1; v <= 100; ++v) {
        h.record(v);
    }
    EXPECT_EQ(h.count(), 100u);
    EXPECT_EQ(h.min(), 1);
    EXPECT_EQ(h.max(), 100);
    EXPECT_EQ(h.quantile(0.50), 50);
    EXPECT_EQ(h.quantile(0.95), 95);
    EXPECT_EQ(h.quantile(0.99), 99);
    EXPECT_EQ(h.quantile(0.0), 1);
    EXPECT_EQ(h.quantile(1.0), 100);
    EXPECT_DOUBLE_EQ(h.mean(), 50.5);
    EXPECT_NEAR(h.stddev(), 28.866070047722118, 1e-9);
}

TEST(histogram, extremes_are_exact_and_quantiles_clamped_to_them) {
    log_linear_histogram h;
    h.record(1'000'003);
    EXPECT_EQ(h.quantile(0.5), 1'000'003);  // clamped into [min, max]
    EXPECT_EQ(h.min(), 1'000'003);
    EXPECT_EQ(h.max(), 1'000'003);
    h.record(std::numeric_limits<std::int64_t>::max());
    EXPECT_EQ(h.max(), std::numeric_limits<std::int64_t>::max());
    EXPECT_EQ(h.quantile(1.0), std::numeric_limits<std::int64_t>::max());
}

TEST(histogram, negative_values_are_counted_and_recorded_as_zero) {
    log_linear_histogram h;
    h.record(-50);
    h.record(10);
    EXPECT_EQ(h.negative_count(), 1u);
    EXPECT_EQ(h.min(), 0);
    EXPECT_EQ(h.count(), 2u);
}

TEST(histogram, record_is_noexcept_and_the_histogram_trivially_copyable) {
    log_linear_histogram h;
    static_assert(noexcept(h.record(1)));
    static_assert(noexcept(h.quantile(0.5)));
    static_assert(noexcept(h.merge(h)));
    static_assert(std::is_trivially_copyable_v<log_linear_histogram>);
    SUCCEED();
}

class histogram_accuracy : public ::testing::TestWithParam<std::size_t> {};

TEST_P(histogram_accuracy, quantiles_are_within_one_percent_of_exact_percentiles) {
    const auto dist = distributions()[GetParam()];
    for (const std::size_t n : {std::size_t{1000}, std::size_t{200'000}}) {
        std::mt19937_64 g(0x5eed0000u + GetParam() * 31 + n);
        std::vector<std::int64_t> samples;
        samples.reserve(n);
        log_linear_histogram h;
        for (std::size_t i = 0; i < n; ++i) {
            const std::int64_t v = std::max<std::int64_t>(0, dist.draw(g));
            samples.push_back(v);
            h.record(v);
        }
        std::sort(samples.begin(), samples.end());
        for (const double q : {0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 0.9999}) {
            const std::int64_t exact = exact_quantile(samples, q);
            const std::int64_t got = h.quantile(q);
            const double rel = exact == 0 ? static_cast<double>(std::abs(got))
                                          : std::abs(static_cast<double>(got - exact)) / static_cast<double>(exact);
            EXPECT_LE(rel, 0.01) << dist.name << " n=" << n << " q=" << q << " exact=" << exact << " got=" << got;
            EXPECT_LE(rel, log_linear_histogram::max_relative_error + 1e-12) << dist.name << " q=" << q;
        }
        EXPECT_EQ(h.count(), n);
        EXPECT_EQ(h.min(), samples.front());
        EXPECT_EQ(h.max(), samples.back());
        EXPECT_NEAR(h.mean(), exact_mean(samples), 1e-6 * std::max(1.0, exact_mean(samples)));
        EXPECT_NEAR(h.stddev(), exact_stddev(samples), 1e-6 * std::max(1.0, exact_stddev(samples)));
        const auto s = h.summary();
        EXPECT_EQ(s.p999_ns, h.quantile(0.999));
        EXPECT_EQ(s.count, n);
    }
}

INSTANTIATE_TEST_SUITE_P(distributions, histogram_accuracy, ::testing::Range<std::size_t>(0, 6),
                         [](const ::testing::TestParamInfo<std::size_t>& param_info) {
                             return distributions()[param_info.param].name;
                         });

TEST(histogram, merge_equals_recording_everything_in_one) {
    std::mt19937_64 g(42);
    std::lognormal_distribution<double> d(std::log(5000.0), 1.0);
    log_linear_histogram a;
    log_linear_histogram b;
    log_linear_histogram all;
    for (int i = 0; i < 50'000; ++i) {
        const auto v = static_cast<std::int64_t>(d(g));
        (i % 3 == 0 ? a : b).record(v);
        all.record(v);
    }
    a.merge(b);
    EXPECT_EQ(a.count(), all.count());
    EXPECT_EQ(a.min(), all.min());
    EXPECT_EQ(a.max(), all.max());
    EXPECT_DOUBLE_EQ(a.mean(), all.mean());
    EXPECT_DOUBLE_EQ(a.stddev(), all.stddev());
    for (std::size_t i = 0; i < log_linear_histogram::bucket_count; ++i) {
        ASSERT_EQ(a.bucket(i).count, all.bucket(i).count) << "bucket " << i;
    }
    log_linear_histogram empty;
    a.merge(empty);
    EXPECT_EQ(a.count(), all.count());
    empty.merge(all);
    EXPECT_EQ(empty.min(), all.min());
    EXPECT_EQ(empty.quantile(0.99), all.quantile(0.99));
}

TEST(histogram, reset_forgets_everything) {
    log_linear_histogram h;
    h.record(5);
    h.record(-1);
    h.reset();
    EXPECT_TRUE(h.empty());
    EXPECT_EQ(h.negative_count(), 0u);
    EXPECT_EQ(h.bucket(5).count, 0u);
}

TEST(histogram, bucket_iteration_covers_every_sample_once) {
    log_linear_histogram h;
    const std::vector<std::int64_t> values{0, 3, 127, 128, 129, 130, 5000, 5001, 1'000'000, 1'000'000};
    for (auto v : values) {
        h.record(v);
    }
    std::uint64_t total = 0;
    std::int64_t prev_upper = -1;
    h.for_each_bucket([&](const rtcore::histogram_bucket& b) {
        EXPECT_GT(b.lower_ns, prev_upper);
        EXPECT_GT(b.count, 0u);
        const auto in_bucket = std::count_if(values.begin(), values.end(),
                                             [&](std::int64_t v) { return v >= b.lower_ns && v <= b.upper_ns; });
        EXPECT_EQ(b.count, static_cast<std::uint64_t>(in_bucket)) << b.lower_ns << ".." << b.upper_ns;
        prev_upper = b.upper_ns;
        total += b.count;
    });
    EXPECT_EQ(total, values.size());
}

TEST(histogram, cumulative_counts_at_bucket_boundaries_are_exact_for_prometheus_le) {
    std::mt19937_64 g(7);
    std::exponential_distribution<double> d(1.0 / 20000.0);
    std::vector<std::int64_t> samples;
    log_linear_histogram h;
    for (int i = 0; i < 20'000; ++i) {
        const auto v = static_cast<std::int64_t>(d(g));
        samples.push_back(v);
        h.record(v);
    }
    for (const std::int64_t want : {0L, 100L, 1000L, 10'000L, 50'000L, 100'000L, 1'000'000L}) {
        const std::int64_t le = log_linear_histogram::bucket_upper_at_or_above(want);
        EXPECT_GE(le, want);
        const auto exact = std::count_if(samples.begin(), samples.end(), [&](std::int64_t v) { return v <= le; });
        EXPECT_EQ(h.count_at_or_below(le), static_cast<std::uint64_t>(exact)) << "le=" << le;
    }
    // Between boundaries the count never overstates.
    const auto exact_1001 = std::count_if(samples.begin(), samples.end(), [](std::int64_t v) { return v <= 1001; });
    EXPECT_LE(h.count_at_or_below(1001), static_cast<std::uint64_t>(exact_1001));
    EXPECT_EQ(h.count_at_or_below(-1), 0u);
    EXPECT_EQ(h.count_at_or_below(std::numeric_limits<std::int64_t>::max()), h.count());
}

TEST(histogram, record_n_counts_repeated_values) {
    log_linear_histogram h;
    h.record_n(1000, 9);
    h.record_n(2000, 1);
    h.record_n(5, 0);
    EXPECT_EQ(h.count(), 10u);
    EXPECT_EQ(h.quantile(0.9), h.quantile(0.5));
    EXPECT_EQ(h.quantile(0.95), 2000);
    EXPECT_DOUBLE_EQ(h.mean(), 1100.0);
    EXPECT_DOUBLE_EQ(h.stddev(), 300.0);
}
