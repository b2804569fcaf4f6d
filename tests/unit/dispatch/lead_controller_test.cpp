#include <gtest/gtest.h>

#include "qrt/dispatch/lead_controller.hpp"

using qrt::dispatch::lead_config;
using qrt::dispatch::lead_controller;

namespace {
lead_config cfg() {
    lead_config c;
    c.initial_ns = 50'000;
    c.min_ns = 5'000;
    c.max_ns = 200'000;
    c.margin_ns = 2'000;
    c.quantile = 0.999;
    c.window = 100;
    return c;
}
}  // namespace

TEST(adaptive_lead, starts_at_the_initial_lead_clamped_to_bounds) {
    EXPECT_EQ(lead_controller(cfg()).lead_ns(), 50'000);
    lead_config c = cfg();
    c.initial_ns = 1'000'000;
    EXPECT_EQ(lead_controller(c).lead_ns(), 200'000);
}

TEST(adaptive_lead, a_late_wakeup_raises_the_lead_at_once) {
    lead_controller l(cfg());
    l.observe(80'000);
    EXPECT_EQ(l.lead_ns(), 82'000);
}

TEST(adaptive_lead, never_exceeds_the_maximum) {
    lead_controller l(cfg());
    l.observe(10'000'000);
    EXPECT_EQ(l.lead_ns(), 200'000);
}

TEST(adaptive_lead, follows_the_window_quantile_plus_margin_downwards) {
    lead_controller l(cfg());
    for (int i = 0; i < 99; ++i) {
        l.observe(10'000);
    }
    EXPECT_FALSE(l.adapt()) << "does not come down before the window is full";
    EXPECT_EQ(l.lead_ns(), 50'000);
    l.observe(10'000);
    EXPECT_EQ(l.lead_ns(), 50'000) << "observe() alone never lowers the lead (the RT thread's cheap half)";
    EXPECT_TRUE(l.adapt());
    EXPECT_EQ(l.adaptations(), 1u);
    // p99.9 of 100 samples of 10 us is exactly 10 us.
    EXPECT_EQ(l.lead_ns(), 12'000);
    EXPECT_FALSE(l.adapt()) << "a new window starts empty";
}

TEST(adaptive_lead, never_goes_below_the_minimum) {
    lead_controller l(cfg());
    for (int i = 0; i < 100; ++i) {
        l.observe(100);
    }
    ASSERT_TRUE(l.adapt());
    EXPECT_EQ(l.lead_ns(), 5'000);
}

TEST(adaptive_lead, the_quantile_covers_rare_outliers_in_the_window) {
    lead_controller l(cfg());
    for (int i = 0; i < 99; ++i) {
        l.observe(3'000);
    }
    l.observe(60'000);  // one outlier in the window: p99.9 of 100 samples is the max
    ASSERT_TRUE(l.adapt());
    EXPECT_EQ(l.lead_ns(), 62'000);
}

TEST(adaptive_lead, a_lower_quantile_ignores_the_top_of_the_window) {
    lead_config c = cfg();
    c.quantile = 0.9;
    lead_controller l(c);
    for (int i = 1; i <= 100; ++i) {
        l.observe(i * 1'000);  // 1..100 us, in order
    }
    ASSERT_TRUE(l.adapt());
    EXPECT_EQ(l.lead_ns(), 90'000 + 2'000) << "p90 of 1..100 us is 90 us";
}
