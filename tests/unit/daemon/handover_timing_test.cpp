// handover_timing_for (services.cpp): a wire = 2 QPU's arm lead adds to the
// minimum lead every request is held to and to the hand-over horizon, so a
// job is handed over, and its ARM sent, at least arm_lead_ns before T.
#include <gtest/gtest.h>

#include "qrt/config.hpp"
#include "services.hpp"

TEST(handover_timing, a_wire_2_qpus_arm_lead_raises_the_minimum_lead_and_the_horizon) {
    qrt::config cfg;
    cfg.qpus.resize(2);
    const auto v1 = qrt::handover_timing_for(cfg);
    EXPECT_EQ(v1.arm_lead_ns, 0);

    cfg.qpus[1].wire = 2;
    cfg.qpus[1].arm_lead_ns = 300'000'000;
    const auto v2 = qrt::handover_timing_for(cfg);
    EXPECT_EQ(v2.arm_lead_ns, 300'000'000);
    EXPECT_EQ(v2.min_lead_ns, v1.min_lead_ns + 300'000'000);
    EXPECT_GE(v2.horizon_ns, v2.min_lead_ns);
    EXPECT_GE(v2.horizon_ns - v2.pump_period_ns, cfg.qpus[1].arm_lead_ns)
        << "handed over (and armed) at least arm_lead before T";
    EXPECT_EQ(v2.plan_horizon_ns, 2 * v2.horizon_ns);

    cfg.qpus[1].wire = 1;  // an arm lead means nothing to a version-1 QPU
    EXPECT_EQ(qrt::handover_timing_for(cfg).min_lead_ns, v1.min_lead_ns);
}
