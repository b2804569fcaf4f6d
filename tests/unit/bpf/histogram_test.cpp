#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "decode.hpp"
#include "qrt_bpf/histogram.hpp"

using qrt_bpf::wakeup_histogram;

TEST(wakeup_histogram, small_values_have_exact_buckets) {
    for (std::uint64_t v = 0; v < wakeup_histogram::subs; ++v) {
        EXPECT_EQ(wakeup_histogram::bucket_of(v), v);
        EXPECT_EQ(wakeup_histogram::bucket_lower_ns(static_cast<unsigned>(v)), v);
    }
}

TEST(wakeup_histogram, every_bucket_holds_its_own_bounds_and_they_tile_the_range) {
    for (unsigned i = 0; i + 1 < wakeup_histogram::bucket_count; ++i) {
        const std::uint64_t lo = wakeup_histogram::bucket_lower_ns(i);
        const std::uint64_t hi = wakeup_histogram::bucket_upper_ns(i);
        ASSERT_LT(lo, hi) << "bucket " << i;
        EXPECT_EQ(wakeup_histogram::bucket_of(lo), i) << "lower bound of bucket " << i;
        EXPECT_EQ(wakeup_histogram::bucket_of(hi - 1), i) << "upper bound of bucket " << i;
        EXPECT_EQ(wakeup_histogram::bucket_of(hi), i + 1) << "first value after bucket " << i;
    }
}

TEST(wakeup_histogram, bucket_width_is_at_most_one_eighth_of_its_lower_bound) {
    for (unsigned i = wakeup_histogram::subs; i + 1 < wakeup_histogram::bucket_count; ++i) {
        const std::uint64_t lo = wakeup_histogram::bucket_lower_ns(i);
        const std::uint64_t width = wakeup_histogram::bucket_upper_ns(i) - lo;
        EXPECT_LE(width * 8, lo) << "bucket " << i;
    }
}

TEST(wakeup_histogram, huge_values_land_in_the_last_bucket) {
    EXPECT_EQ(wakeup_histogram::bucket_of(UINT64_MAX), wakeup_histogram::bucket_count - 1);
    EXPECT_EQ(wakeup_histogram::bucket_of(1ULL << 40), wakeup_histogram::bucket_count - 1);
    EXPECT_EQ(wakeup_histogram::bucket_upper_ns(wakeup_histogram::bucket_count - 1), UINT64_MAX);
}

TEST(wakeup_histogram, known_values_map_to_known_buckets) {
    // 1000 ns: 2^9 <= 1000 < 2^10, sub = (1000 >> 6) & 7 = 15 & 7 = 7.
    EXPECT_EQ(wakeup_histogram::bucket_of(1000), (9U - 3U + 1U) * 8U + 7U);
    EXPECT_EQ(wakeup_histogram::bucket_lower_ns(wakeup_histogram::bucket_of(1000)), 960U);
    EXPECT_EQ(wakeup_histogram::bucket_upper_ns(wakeup_histogram::bucket_of(1000)), 1024U);
}

TEST(wakeup_histogram, quantiles_of_a_uniform_sample_are_within_bucket_resolution) {
    wakeup_histogram h;
    for (std::uint64_t v = 1; v <= 100000; ++v) {
        h.record(v * 10);  // 10 ns .. 1 ms
    }
    EXPECT_EQ(h.count, 100000U);
    EXPECT_EQ(h.max_ns, 1000000U);
    EXPECT_NEAR(h.quantile_ns(0.5), 500000.0, 500000.0 / 8);
    EXPECT_NEAR(h.quantile_ns(0.99), 990000.0, 990000.0 / 8);
    EXPECT_LE(h.quantile_ns(1.0), 1000000.0);
    EXPECT_NEAR(h.mean_ns(), 500005.0, 1.0);
}

TEST(wakeup_histogram, quantile_of_empty_histogram_is_zero_and_never_exceeds_max) {
    wakeup_histogram h;
    EXPECT_EQ(h.quantile_ns(0.5), 0.0);
    h.record(1000);
    EXPECT_LE(h.quantile_ns(0.99), 1000.0);
    EXPECT_GE(h.quantile_ns(0.99), 960.0);
}

TEST(wakeup_histogram, since_subtracts_an_earlier_snapshot) {
    wakeup_histogram a;
    a.record(100);
    wakeup_histogram b = a;
    b.record(5000);
    b.record(100);
    const wakeup_histogram d = b.since(a);
    EXPECT_EQ(d.count, 2U);
    EXPECT_EQ(d.sum_ns, 5100U);
    EXPECT_EQ(d.buckets[wakeup_histogram::bucket_of(100)], 1U);
    EXPECT_EQ(d.buckets[wakeup_histogram::bucket_of(5000)], 1U);
}

TEST(wakeup_histogram, sum_cpus_adds_per_cpu_copies_and_keeps_the_largest_max) {
    std::vector<qrt_wakeup_hist> per_cpu(3);
    per_cpu[0] = {};
    per_cpu[1] = {};
    per_cpu[2] = {};
    per_cpu[0].bucket_count[10] = 2;
    per_cpu[0].count = 2;
    per_cpu[0].sum_ns = 20;
    per_cpu[0].max_ns = 11;
    per_cpu[2].bucket_count[10] = 1;
    per_cpu[2].bucket_count[100] = 4;
    per_cpu[2].count = 5;
    per_cpu[2].sum_ns = 5000;
    per_cpu[2].max_ns = 3000;
    const wakeup_histogram total = qrt_bpf::detail::sum_cpus(per_cpu.data(), per_cpu.size());
    EXPECT_EQ(total.buckets[10], 3U);
    EXPECT_EQ(total.buckets[100], 4U);
    EXPECT_EQ(total.count, 7U);
    EXPECT_EQ(total.sum_ns, 5020U);
    EXPECT_EQ(total.max_ns, 3000U);
}
