#include "qrt_bpf/histogram_convert.hpp"

#include <cstdint>

#include <gtest/gtest.h>

using qrt_bpf::wakeup_histogram;

TEST(histogram_convert, every_sample_lands_at_its_bucket_midpoint) {
    wakeup_histogram w;
    w.record(1000);  // bucket [960, 1024): midpoint 992
    w.record(1000);
    w.record(5);     // exact bucket [5, 6): midpoint 5
    w.record(50'000);
    const auto h = qrt_bpf::to_rtcore_histogram(w);
    EXPECT_EQ(h.count(), 4U);
    EXPECT_EQ(h.min(), 5);
    const unsigned b = wakeup_histogram::bucket_of(1000);
    const auto lo = static_cast<std::int64_t>(wakeup_histogram::bucket_lower_ns(b));
    const auto hi = static_cast<std::int64_t>(wakeup_histogram::bucket_upper_ns(b));
    EXPECT_LE(lo, 1000);
    EXPECT_LT(1000, hi);
    // The median of {5, m, m, 50000} is the 1000-bucket's midpoint m.
    EXPECT_NEAR(static_cast<double>(h.quantile(0.5)), static_cast<double>(lo + (hi - lo) / 2),
                static_cast<double>(lo + (hi - lo) / 2) / 64.0);
}

TEST(histogram_convert, never_above_the_probes_max) {
    wakeup_histogram w;
    w.record(1000);
    w.max_ns = 970;  // a max inside the bucket, below its midpoint
    const auto h = qrt_bpf::to_rtcore_histogram(w);
    EXPECT_EQ(h.count(), 1U);
    EXPECT_EQ(h.max(), 970);  // rtcore's max is exact
}

TEST(histogram_convert, the_open_last_bucket_is_recorded_at_its_lower_bound) {
    wakeup_histogram w;
    const std::uint64_t huge = std::uint64_t{1} << 40;  // past 2^36 ns: the last bucket
    w.record(huge);
    ASSERT_EQ(wakeup_histogram::bucket_of(huge), wakeup_histogram::bucket_count - 1);
    const auto h = qrt_bpf::to_rtcore_histogram(w);
    EXPECT_EQ(h.count(), 1U);
    const auto lower = static_cast<std::int64_t>(
        wakeup_histogram::bucket_lower_ns(wakeup_histogram::bucket_count - 1));
    EXPECT_EQ(h.max(), lower);
}

TEST(histogram_convert, an_empty_probe_histogram_is_empty) {
    EXPECT_EQ(qrt_bpf::to_rtcore_histogram(wakeup_histogram{}).count(), 0U);
}
