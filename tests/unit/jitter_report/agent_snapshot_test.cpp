// The agent contract: snapshots built with the agent's own telemetry types
// and renderer (qrt::telemetry::to_json), read back into a report.
#include <gtest/gtest.h>

#include "jitter_report/agent_source.hpp"
#include "jitter_report/render.hpp"
#include "jitter_report/slo.hpp"
#include "qrt/telemetry.hpp"

using namespace qrt::jitter;
using nlohmann::json;

namespace {

constexpr std::int64_t now_ns = 1'790'000'000'000'000'000;

rtcore::histogram lateness(std::int64_t base_ns, int n) {
    rtcore::histogram h;
    for (int i = 0; i < n; ++i) {
        h.record(base_ns + (i % 50) * 100);
    }
    return h;
}

json agent_snapshot(std::int64_t taken_ns = now_ns - 1'000'000'000) {
    qrt::telemetry::snapshot s;
    s.taken_ns = taken_ns;
    s.add_histogram("qrt_rpc_line_handling_seconds", "not ours", {}, lateness(50'000, 10));
    s.add_histogram("qrt_dispatch_lateness_seconds", "dispatch lateness", {{"qpu", "q0"}, {"cpu", "1"}},
                    lateness(3'000, 1000));
    s.add_histogram("qrt_dispatch_lateness_seconds", "dispatch lateness", {{"qpu", "q1"}, {"cpu", "3"}},
                    lateness(8'000, 500));
    s.add_histogram("qrt_probe_wakeup_latency_seconds", "wakeup", {{"cpu", "1"}}, lateness(2'000, 700));
    s.add_counter("qrt_probe_intrusions_total", "n",
                  {{"cpu", "1"}, {"kind", "hardirq"}, {"source", "irq 24 (virtio0-input.0)"}}, 17);
    s.add_real_counter("qrt_probe_intrusion_seconds_total", "t",
                       {{"cpu", "1"}, {"kind", "hardirq"}, {"source", "irq 24 (virtio0-input.0)"}}, 0.0025);
    s.add_gauge("qrt_probe_intrusion_max_seconds", "m",
                {{"cpu", "1"}, {"kind", "hardirq"}, {"source", "irq 24 (virtio0-input.0)"}}, 0.0004);
    s.add_counter("qrt_probe_intrusions_total", "n", {{"cpu", "3"}, {"kind", "task"}, {"source", "task a/1"}}, 3);
    return qrt::telemetry::to_json(s);
}

}  // namespace

TEST(agent_snapshot, the_host_line_comes_from_the_agents_status) {
    const json status = {{"probes", "available"},
                         {"hostname", "lab-host-7"},
                         {"kernel", {{"release", "6.6.30-rt30"}, {"preempt_model", "PREEMPT_RT"}}}};
    auto r = report_from_snapshot(agent_snapshot(), status, {}, now_ns);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(r->host.hostname, "lab-host-7");
    EXPECT_EQ(r->host.kernel, "6.6.30-rt30");
    EXPECT_TRUE(r->host.preempt_rt);
    auto plain = report_from_snapshot(agent_snapshot(), json{{"kernel", {{"preempt_model", "PREEMPT_DYNAMIC"}}}}, {},
                                      now_ns);
    ASSERT_TRUE(plain) << plain.err().message;
    EXPECT_FALSE(plain->host.preempt_rt);
    EXPECT_TRUE(plain->host.hostname.empty()) << "an older agent without hostname: the report says ?";
}

TEST(agent_snapshot, becomes_per_qpu_series_with_the_agents_percentiles) {
    const json snap = agent_snapshot();
    auto r = report_from_snapshot(snap, json{{"probes", "available"}}, {}, now_ns);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(r->run.mode, "agent");
    ASSERT_EQ(r->series_list.size(), 3U);
    const auto& q0 = r->series_list[0];
    EXPECT_EQ(q0.scope, "qpu");
    EXPECT_EQ(q0.name, "q0");
    EXPECT_EQ(q0.cpu, 1);
    EXPECT_EQ(q0.metric, "dispatch_lateness");
    EXPECT_TRUE(q0.primary);
    const auto h = lateness(3'000, 1000).summary();
    EXPECT_EQ(q0.stats.count, 1000U);
    EXPECT_EQ(q0.stats.p99_ns, h.p99_ns);
    EXPECT_EQ(q0.stats.max_ns, h.max_ns);
    std::uint64_t binned = 0;
    for (const auto& b : q0.bins) {
        binned += b.count;
    }
    EXPECT_EQ(binned, 1000U);
    const auto& probe = r->series_list[2];
    EXPECT_EQ(probe.scope, "cpu");
    EXPECT_EQ(probe.name, "cpu1");
    EXPECT_EQ(probe.metric, "probe_wakeup");
    EXPECT_FALSE(probe.primary);
    EXPECT_TRUE(r->probes.available);

    ASSERT_EQ(r->intrusions.size(), 2U);
    EXPECT_EQ(r->intrusions[0].source, "irq 24 (virtio0-input.0)");
    EXPECT_EQ(r->intrusions[0].count, 17U);
    EXPECT_EQ(r->intrusions[0].total_ns, 2'500'000U);
    EXPECT_EQ(r->intrusions[0].max_ns, 400'000U);
}

TEST(agent_snapshot, a_stale_snapshot_is_an_error) {
    agent_options opt;
    opt.max_age = std::chrono::seconds(60);
    auto r = report_from_snapshot(agent_snapshot(now_ns - 3600'000'000'000), json(), opt, now_ns);
    ASSERT_FALSE(r);
    EXPECT_NE(r.err().message.find("stale"), std::string::npos) << r.err().message;
    EXPECT_NE(r.err().message.find("3600 s ago"), std::string::npos) << r.err().message;
}

TEST(agent_snapshot, without_taken_ns_is_an_error) {
    auto r = report_from_snapshot(json{{"histograms", json::array()}}, json(), {}, now_ns);
    ASSERT_FALSE(r);
    EXPECT_NE(r.err().message.find("taken_ns"), std::string::npos);
}

TEST(agent_snapshot, cpus_filter_and_unknown_cpu) {
    agent_options opt;
    opt.cpus = rtcore::cpu_set{3};
    auto r = report_from_snapshot(agent_snapshot(), json(), opt, now_ns);
    ASSERT_TRUE(r) << r.err().message;
    ASSERT_EQ(r->series_list.size(), 1U);
    EXPECT_EQ(r->series_list[0].name, "q1");
    ASSERT_EQ(r->intrusions.size(), 1U);
    EXPECT_EQ(r->intrusions[0].cpu, 3U);

    opt.cpus = rtcore::cpu_set{7};
    auto bad = report_from_snapshot(agent_snapshot(), json(), opt, now_ns);
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.err().message.find("unknown CPU 7: the agent reports CPUs 1,3"), std::string::npos)
        << bad.err().message;
}

TEST(agent_snapshot, without_dispatch_histograms_says_so) {
    qrt::telemetry::snapshot s;
    s.taken_ns = now_ns;
    auto r = report_from_snapshot(qrt::telemetry::to_json(s), json(), {}, now_ns);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_TRUE(r->series_list.empty());
    ASSERT_FALSE(r->notes.empty());
    EXPECT_NE(r->notes[0].find("no dispatch or wakeup histograms"), std::string::npos);
    EXPECT_NE(r->probes.status.find("unknown"), std::string::npos);
}

TEST(agent_snapshot, recent_windows_and_outliers_reach_every_rendering) {
    // The agent's own renderer with its recent windows, as telemetry.snapshot sends it.
    qrt::telemetry::snapshot s;
    s.taken_ns = now_ns - 1'000'000'000;
    s.add_histogram("qrt_dispatch_lateness_seconds", "dispatch lateness", {{"qpu", "q0"}, {"cpu", "1"}},
                    lateness(3'000, 1000));
    qrt::telemetry::recent_windows rw;
    rw.observe(s, 0);
    rw.annotate(s, 30'000'000'000);  // 30 s later, nothing new: empty windows of 30 s
    auto r = report_from_snapshot(qrt::telemetry::to_json(s), json{{"probes", "available"}}, {}, now_ns);
    ASSERT_TRUE(r) << r.err().message;
    ASSERT_EQ(r->series_list.size(), 1U);
    const auto& q0 = r->series_list[0];
    ASSERT_EQ(q0.recent.size(), 2U);
    EXPECT_EQ(q0.recent[0].window, "1m") << "shortest first";
    EXPECT_EQ(q0.recent[0].span_ns, 30'000'000'000);
    EXPECT_EQ(q0.recent[0].stats.count, 0U);
    EXPECT_EQ(q0.stats.count, 1000U) << "lifetime keeps every sample";

    // telemetry.outliers, as the daemon's outlier feed answers it.
    const json outliers = {
        {"total", 5000},
        {"threshold_ns", 50'000},
        {"outliers",
         json::array({{{"cpu", 1}, {"tid", 77}, {"qpu", "q0"}, {"latency_ns", 80'000}, {"at_ns", now_ns - 2'000'000'000},
                       {"cause", {{"kind", "task"}, {"source", "task stress-ng/9"}}},
                       {"summary", "tid 77 (qrt-dispatch) on cpu 1: 80.0 us after wakeup"}},
                      {{"cpu", 1}, {"tid", 77}, {"qpu", "q0"}, {"latency_ns", 900'000}, {"at_ns", now_ns - 3'000'000'000},
                       {"cause", nullptr}, {"summary", "s"}},
                      // The first one again (the report once printed it twice).
                      {{"cpu", 1}, {"tid", 77}, {"qpu", "q0"}, {"latency_ns", 80'000}, {"at_ns", now_ns - 2'000'000'000},
                       {"cause", {{"kind", "task"}, {"source", "task stress-ng/9"}}},
                       {"summary", "tid 77 (qrt-dispatch) on cpu 1: 80.0 us after wakeup"}}})}};
    add_agent_outliers(outliers, *r);
    ASSERT_EQ(r->outliers.size(), 2U) << "the repeated outlier is listed once";
    EXPECT_EQ(r->outliers[0].latency_ns, 900'000U) << "largest latency first";
    EXPECT_EQ(r->outliers[0].main_cause, "");
    EXPECT_EQ(r->outliers[1].main_cause, "task stress-ng/9");
    EXPECT_EQ(r->outliers[1].qpu, "q0");

    const std::string text = render_text(*r);
    EXPECT_NE(text.find("    last 1m"), std::string::npos) << text;
    EXPECT_NE(text.find("    last 1h"), std::string::npos) << text;
    EXPECT_NE(text.find("q0 cpu1 tid 77 80.0us at "), std::string::npos) << text;
    {
        // HH:MM:SS.mmm: two outliers in one second are told apart.
        const auto at = text.find("q0 cpu1 tid 77 80.0us at ");
        const std::string when = text.substr(at + 25, 12);
        EXPECT_EQ(when.size(), 12U);
        EXPECT_EQ(when[2], ':');
        EXPECT_EQ(when[8], '.') << when;
        EXPECT_EQ(text.find("q0 cpu1 tid 77 80.0us at " + when, at + 1), std::string::npos) << "printed twice:\n" << text;
    }
    EXPECT_NE(text.find("mostly task stress-ng/9"), std::string::npos) << text;
    EXPECT_NE(text.find("outliers: 5000 over 50.0us since the agent started"), std::string::npos) << text;
    const json j = to_json(*r);
    EXPECT_EQ(j["series"][0]["recent"][0]["window"], "1m");
    EXPECT_EQ(j["outliers"][1]["qpu"], "q0");
    auto back = report_from_json(j);
    ASSERT_TRUE(back) << back.err().message;
    ASSERT_EQ(back->series_list[0].recent.size(), 2U);
    EXPECT_EQ(back->series_list[0].recent[1].window, "1h");
    EXPECT_NE(render_svg(*r).find("last 1m: p99"), std::string::npos);
}

// Wire version 2: a two-phase QPU's arm and start figures, as the agent
// names them (services_status.cpp), reach the text (where the time goes:
// before T the arm, at T the host's send, then the endpoint's start), the
// JSON and the SVG.
TEST(agent_snapshot, a_two_phase_qpus_arm_fire_and_start_reach_every_rendering) {
    qrt::telemetry::snapshot s;
    s.taken_ns = now_ns - 1'000'000'000;
    const qrt::telemetry::labels l{{"qpu", "q0"}, {"cpu", "1"}};
    const auto with_stage = [&](const char* stage) {
        auto ll = l;
        ll.emplace_back("stage", stage);
        return ll;
    };
    s.add_histogram("qrt_dispatch_lateness_seconds", "FIRE", l, lateness(3'000, 100));
    s.add_histogram("qrt_dispatch_arm_seconds", "ARM -> ARMED", l, lateness(210'000'000, 100));
    s.add_histogram("qrt_dispatch_arm_cost_seconds", "cost", with_stage("total"), lateness(200'000'000, 100));
    s.add_histogram("qrt_dispatch_arm_cost_seconds", "cost", with_stage("upload"), lateness(150'000'000, 100));
    s.add_histogram("qrt_dispatch_arm_cost_seconds", "cost", with_stage("parse"), lateness(50'000'000, 100));
    s.add_histogram("qrt_dispatch_start_lateness_seconds", "start", l, lateness(40'000, 100));
    auto r = report_from_snapshot(qrt::telemetry::to_json(s), json{{"probes", "available"}}, {}, now_ns);
    ASSERT_TRUE(r) << r.err().message;
    std::vector<std::string> metrics;
    for (const auto& x : r->series_list) {
        EXPECT_EQ(x.name, "q0");
        metrics.push_back(x.metric);
    }
    EXPECT_EQ(metrics, (std::vector<std::string>{"dispatch_lateness", "arm_to_armed", "arm_cost", "arm_cost_upload",
                                                 "arm_cost_parse", "start_lateness"}));

    const std::string text = render_text(*r);
    const auto where = text.find("two-phase QPUs (wire 2): where the time goes");
    ASSERT_NE(where, std::string::npos) << text;
    const auto arm = text.find("ARM -> ARMED", where);
    const auto cost = text.find("arm cost (endpoint)", where);
    const auto send = text.find("1. host send (FIRE sent - T)", where);
    const auto start = text.find("2. endpoint start (started - T)", where);
    ASSERT_NE(arm, std::string::npos) << text;
    ASSERT_NE(cost, std::string::npos) << text;
    ASSERT_NE(send, std::string::npos) << text;
    ASSERT_NE(start, std::string::npos) << text;
    EXPECT_LT(arm, send);
    EXPECT_LT(send, start) << "the host's send, then the endpoint's start";
    const auto parse = text.find("                parse               p50 " +
                                 format_ns(static_cast<double>(lateness(50'000'000, 100).summary().p50_ns)));
    const auto upload = text.find("                upload              p50 ");
    ASSERT_NE(parse, std::string::npos) << text;
    ASSERT_NE(upload, std::string::npos) << text;
    EXPECT_LT(cost, parse);
    EXPECT_LT(parse, upload) << "stages in the order they are spent";
    EXPECT_LT(upload, send);

    const json j = to_json(*r);
    ASSERT_EQ(j["series"].size(), 6U);
    EXPECT_EQ(j["series"][5]["metric"], "start_lateness");
    EXPECT_EQ(j["series"][5]["p99_ns"].get<std::int64_t>(), lateness(40'000, 100).summary().p99_ns) << j["series"][5];
    auto back = report_from_json(j);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_EQ(back->series_list[3].metric, "arm_cost_upload");

    const std::string svg = render_svg(*r);
    const auto fire_panel = svg.find("q0 dispatch lateness");
    const auto start_panel = svg.find("q0 start lateness at the endpoint");
    ASSERT_NE(fire_panel, std::string::npos) << svg;
    ASSERT_NE(start_panel, std::string::npos) << svg;
    EXPECT_LT(fire_panel, start_panel);
    EXPECT_NE(svg.find("q0 ARM -&gt; ARMED"), std::string::npos) << svg;
    EXPECT_NE(svg.find("q0 arm cost at the endpoint"), std::string::npos) << svg;
}
