// The outlier feed (agent/src/daemon/outlier_feed.hpp): what the agent keeps
// of probe 3's events and answers in telemetry.outliers.

#include <gtest/gtest.h>

#include "outlier_feed.hpp"

#ifdef QRT_HAVE_BPF

namespace {

qrt_bpf::outlier one(std::uint32_t tid, unsigned cpu, std::uint64_t switch_ns, std::uint64_t latency_ns) {
    qrt_bpf::outlier o;
    o.tid = tid;
    o.comm = "qrt-dispatch";
    o.cpu = cpu;
    o.switch_ns = switch_ns;
    o.wakeup_ns = switch_ns - latency_ns;
    o.latency_ns = latency_ns;
    return o;
}

// The demo's report listed one outlier twice ("273us at
// 05:55:11" on two lines).  One switch is one outlier, however often it is
// delivered; two switches are two, even in the same second with the same
// latency.
TEST(outlier_feed, the_same_switch_delivered_twice_is_kept_once) {
    qrt::outlier_feed f({});
    const std::int64_t rt = 1'800'000'000'000'000'000;
    const std::int64_t mono = 5'000'000'000;
    EXPECT_TRUE(f.add(one(77, 1, 4'000'000'000, 273'000), "q0", rt, mono));
    EXPECT_FALSE(f.add(one(77, 1, 4'000'000'000, 273'000), "q0", rt, mono)) << "a repeat is no event";
    EXPECT_TRUE(f.add(one(77, 1, 4'000'400'000, 273'000), "q0", rt, mono)) << "another switch, same latency";
    EXPECT_TRUE(f.add(one(78, 1, 4'000'000'000, 273'000), "q0", rt, mono)) << "another thread";
    EXPECT_EQ(f.total(), 3U);
    EXPECT_EQ(f.kept(), 3U);
    EXPECT_EQ(f.duplicates_ignored(), 1U);
    const auto j = f.to_json(64, 0);
    EXPECT_EQ(j["total"], 3);
    EXPECT_EQ(j["duplicates_ignored"], 1);
    ASSERT_EQ(j["outliers"].size(), 3U);
    EXPECT_EQ(j["outliers"][0]["tid"], 78) << "newest first";
    EXPECT_EQ(j["outliers"][2]["switch_ns"], 4'000'000'000ULL);
}

}  // namespace

#else

TEST(outlier_feed, needs_bpf) { GTEST_SKIP() << "qrtd built without qrt_bpf: no outlier feed"; }

#endif
