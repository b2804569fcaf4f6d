#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <cstdio>
#include <map>
#include <string>

#include "qrt/telemetry.hpp"

using namespace qrt::telemetry;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (start < text.size()) {
        const auto nl = text.find('\n', start);
        const auto end = nl == std::string::npos ? text.size() : nl;
        out.push_back(text.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

snapshot sample_snapshot() {
    snapshot s;
    s.taken_ns = 123;
    s.add_counter("qrt_rpc_requests_total", "requests", {{"method", "slots.query"}}, 5);
    s.add_counter("qrt_rpc_requests_total", "requests", {{"method", "agent.hello"}}, 2);
    s.add_gauge("qrt_rpc_connections", "open connections", {}, 3);
    rtcore::histogram h;
    for (std::int64_t v : {500, 1'500, 20'000, 20'000, 3'000'000, 900'000'000}) {
        h.record(v);
    }
    s.add_histogram("qrt_dispatch_lateness_seconds", "lateness", {{"qpu", "q\"0\\\n"}}, h);
    return s;
}

}  // namespace

TEST(telemetry, prometheus_text_has_one_help_and_type_per_family_before_its_samples) {
    auto text = to_prometheus(sample_snapshot());
    ASSERT_TRUE(text) << text.err().message;
    const auto ls = lines_of(*text);
    std::map<std::string, int> help_count;
    std::map<std::string, int> type_count;
    std::string current_type_family;
    for (const auto& l : ls) {
        if (l.rfind("# HELP ", 0) == 0) {
            ++help_count[l.substr(7, l.find(' ', 7) - 7)];
        } else if (l.rfind("# TYPE ", 0) == 0) {
            current_type_family = l.substr(7, l.find(' ', 7) - 7);
            ++type_count[current_type_family];
        } else {
            EXPECT_EQ(l.rfind(current_type_family, 0), 0U) << "sample outside its family: " << l;
        }
    }
    EXPECT_EQ(help_count["qrt_rpc_requests_total"], 1);
    EXPECT_EQ(type_count["qrt_rpc_requests_total"], 1);
    EXPECT_NE(text->find("# TYPE qrt_rpc_requests_total counter\n"), std::string::npos);
    EXPECT_NE(text->find("qrt_rpc_requests_total{method=\"slots.query\"} 5\n"), std::string::npos);
    EXPECT_NE(text->find("# TYPE qrt_rpc_connections gauge\nqrt_rpc_connections 3\n"),
              std::string::npos);
    EXPECT_EQ(text->back(), '\n');
}

TEST(telemetry, histograms_have_cumulative_le_buckets_in_seconds_then_sum_and_count) {
    auto text = to_prometheus(sample_snapshot());
    ASSERT_TRUE(text);
    std::uint64_t prev = 0;
    double prev_le = -1.0;
    int buckets = 0;
    std::string inf_line;
    std::string sum_line;
    std::string count_line;
    for (const auto& l : lines_of(*text)) {
        if (l.rfind("qrt_dispatch_lateness_seconds_bucket", 0) == 0) {
            // Labels: qpu escaped, le last.
            EXPECT_NE(l.find(R"(qpu="q\"0\\\n")"), std::string::npos) << l;
            const auto le_at = l.find("le=\"") + 4;
            const std::string le = l.substr(le_at, l.find('"', le_at) - le_at);
            const auto value = std::stoull(l.substr(l.rfind(' ') + 1));
            EXPECT_GE(value, prev) << "buckets must be cumulative: " << l;
            prev = value;
            if (le == "+Inf") {
                inf_line = l;
            } else {
                const double le_s = std::stod(le);
                EXPECT_GT(le_s, prev_le);
                EXPECT_LT(le_s, 11.0) << "le is in seconds";
                prev_le = le_s;
            }
            ++buckets;
        } else if (l.rfind("qrt_dispatch_lateness_seconds_sum", 0) == 0) {
            sum_line = l;
        } else if (l.rfind("qrt_dispatch_lateness_seconds_count", 0) == 0) {
            count_line = l;
        }
    }
    EXPECT_GT(buckets, 10);
    EXPECT_EQ(inf_line.substr(inf_line.rfind(' ') + 1), "6");
    EXPECT_EQ(count_line.substr(count_line.rfind(' ') + 1), "6");
    const double sum = std::stod(sum_line.substr(sum_line.rfind(' ') + 1));
    EXPECT_NEAR(sum, (500 + 1'500 + 40'000 + 3'000'000 + 900'000'000) / 1e9, 1e-9);
    // The first boundary is the histogram bucket edge at or above 1 us
    // (1007 ns): exactly one sample (500 ns) lies at or below it.
    EXPECT_NE(text->find("le=\"1.007e-06\"} 1\n"), std::string::npos) << *text;
}

TEST(telemetry, invalid_names_and_type_clashes_are_errors_naming_the_metric) {
    snapshot bad_name;
    bad_name.add_counter("1bad", "", {}, 1);
    auto a = to_prometheus(bad_name);
    ASSERT_FALSE(a);
    EXPECT_NE(a.err().message.find("1bad"), std::string::npos);
    snapshot bad_label;
    bad_label.add_gauge("ok_metric", "", {{"le", "1"}}, 1);
    EXPECT_FALSE(to_prometheus(bad_label));
    snapshot clash;
    clash.add_counter("x_total", "", {}, 1);
    clash.add_gauge("x_total", "", {}, 1);
    auto c = to_prometheus(clash);
    ASSERT_FALSE(c);
    EXPECT_NE(c.err().message.find("x_total"), std::string::npos);
}

TEST(telemetry, json_rendering_carries_the_same_figures) {
    const auto j = to_json(sample_snapshot());
    EXPECT_EQ(j.at("taken_ns"), 123);
    ASSERT_EQ(j.at("counters").size(), 2U);
    EXPECT_EQ(j.at("counters")[0].at("labels").at("method"), "slots.query");
    ASSERT_EQ(j.at("histograms").size(), 1U);
    const auto& h = j.at("histograms")[0];
    EXPECT_EQ(h.at("count"), 6);
    EXPECT_EQ(h.at("max_ns"), 900'000'000);
    EXPECT_EQ(h.at("min_ns"), 500);
    EXPECT_EQ(h.at("buckets").back().at("count"), 6);
    std::uint64_t prev = 0;
    for (const auto& b : h.at("buckets")) {
        EXPECT_GT(b.at("count").get<std::uint64_t>(), prev);
        prev = b.at("count");
    }
}

TEST(telemetry, textfile_is_replaced_atomically) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("qrt-telemetry-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "qrtd.prom").string();
    ASSERT_TRUE(write_textfile_atomically(path, "a 1\n"));
    ASSERT_TRUE(write_textfile_atomically(path, "a 2\n"));
    std::string content(64, '\0');
    {
        FILE* f = std::fopen(path.c_str(), "rb");
        ASSERT_NE(f, nullptr);
        content.resize(std::fread(content.data(), 1, content.size(), f));
        std::fclose(f);
    }
    EXPECT_EQ(content, "a 2\n");
    std::size_t files = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) {
        ++files;
    }
    EXPECT_EQ(files, 1U) << "no temporary file left behind";
    auto bad = write_textfile_atomically((dir / "no/such/dir/x.prom").string(), "x");
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.err().message.find("no/such/dir"), std::string::npos);
    std::filesystem::remove_all(dir);
}

TEST(telemetry, a_total_of_seconds_is_a_counter_and_every_total_is_a_counter) {
    // promtool check metrics flagged qrt_probe_intrusion_seconds_total as a
    // gauge with a _total suffix: a real-valued total is a counter.
    snapshot s;
    s.add_real_counter("qrt_probe_intrusion_seconds_total", "t", {{"cpu", "1"}}, 0.0025);
    s.add_counter("qrt_probe_intrusions_total", "n", {{"cpu", "1"}}, 3);
    s.add_gauge("qrt_probe_intrusion_max_seconds", "m", {{"cpu", "1"}}, 0.0004);
    auto text = to_prometheus(s);
    ASSERT_TRUE(text) << text.err().message;
    EXPECT_NE(text->find("# TYPE qrt_probe_intrusion_seconds_total counter\n"
                         "qrt_probe_intrusion_seconds_total{cpu=\"1\"} 0.0025\n"),
              std::string::npos)
        << *text;
    std::string family;
    for (const auto& l : lines_of(*text)) {
        if (l.rfind("# TYPE ", 0) != 0) {
            continue;
        }
        const auto name = l.substr(7, l.find(' ', 7) - 7);
        const auto type = l.substr(l.rfind(' ') + 1);
        EXPECT_EQ(name.ends_with("_total"), type == "counter") << l;
    }
    const auto j = to_json(s);
    EXPECT_DOUBLE_EQ(j["counters"][0]["value"].get<double>(), 0.0025);
    EXPECT_EQ(j["counters"][1]["value"].get<std::uint64_t>(), 3u);
}

namespace {

constexpr std::int64_t sec = 1'000'000'000;

snapshot one_histogram(const rtcore::histogram& h) {
    snapshot s;
    s.add_histogram("qrt_dispatch_lateness_seconds", "lateness", {{"qpu", "q0"}}, h);
    return s;
}

const window_view* view_of(const snapshot& s, const std::string& window) {
    for (const auto& v : s.histograms.front().recent) {
        if (v.window == window) {
            return &v;
        }
    }
    return nullptr;
}

}  // namespace

TEST(telemetry, recent_windows_forget_old_samples_on_a_fake_clock_while_lifetime_keeps_them) {
    recent_windows rw;  // 1m (10 s slices), 1h (10 min slices)
    ASSERT_EQ(rw.tick_ns(), 10 * sec);
    rtcore::histogram lifetime;
    std::int64_t now = 1'000 * sec;  // a fake CLOCK_MONOTONIC
    rw.observe(one_histogram(lifetime), now);
    // 100 slow samples (5 ms) in the first 10 s.
    for (int i = 0; i < 100; ++i) {
        lifetime.record(5'000'000);
    }
    now += rw.tick_ns();
    rw.observe(one_histogram(lifetime), now);
    {
        auto s = one_histogram(lifetime);
        rw.annotate(s, now);
        ASSERT_NE(view_of(s, "1m"), nullptr);
        EXPECT_EQ(view_of(s, "1m")->ns->count(), 100u);
        EXPECT_EQ(view_of(s, "1m")->span_ns, 10 * sec) << "the agent ran 10 s: the window says so";
        EXPECT_EQ(view_of(s, "1h")->ns->count(), 100u);
    }
    // Then two minutes of fast samples (10 us), 10 per tick.
    for (int t = 0; t < 12; ++t) {
        for (int i = 0; i < 10; ++i) {
            lifetime.record(10'000);
        }
        now += rw.tick_ns();
        rw.observe(one_histogram(lifetime), now);
    }
    auto s = one_histogram(lifetime);
    rw.annotate(s, now);
    const auto* minute = view_of(s, "1m");
    const auto* hour = view_of(s, "1h");
    ASSERT_NE(minute, nullptr);
    ASSERT_NE(hour, nullptr);
    // Lifetime keeps everything; the last minute forgot the slow start
    // (exactly 60 s of ticks: 6 x 10 samples), the last hour did not.
    EXPECT_EQ(s.histograms.front().ns->count(), 220u);
    EXPECT_EQ(s.histograms.front().ns->max(), 5'000'000);
    EXPECT_EQ(minute->span_ns, 60 * sec);
    EXPECT_EQ(minute->ns->count(), 60u);
    EXPECT_LT(minute->ns->max(), 11'000) << "the 5 ms samples are older than a minute";
    EXPECT_NEAR(static_cast<double>(minute->ns->quantile(0.99)), 10'000.0, 10'000.0 / 128);
    EXPECT_EQ(hour->ns->count(), 220u);
    EXPECT_GT(hour->ns->max(), 4'900'000);

    // Rendered: JSON next to the lifetime figures, Prometheus as gauges.
    const auto j = to_json(s);
    const auto& h = j["histograms"][0];
    EXPECT_EQ(h["count"], 220);
    EXPECT_EQ(h["recent"]["1m"]["count"], 60);
    EXPECT_EQ(h["recent"]["1m"]["span_ns"], 60 * sec);
    EXPECT_EQ(h["recent"]["1h"]["count"], 220);
    auto text = to_prometheus(s);
    ASSERT_TRUE(text) << text.err().message;
    EXPECT_NE(text->find("# TYPE qrt_dispatch_lateness_recent_seconds gauge\n"), std::string::npos) << *text;
    EXPECT_NE(text->find("qrt_dispatch_lateness_recent_samples{qpu=\"q0\",window=\"1m\"} 60\n"),
              std::string::npos)
        << *text;
    EXPECT_NE(text->find("qrt_dispatch_lateness_recent_seconds{qpu=\"q0\",window=\"1h\",stat=\"max\"} 0.005"),
              std::string::npos)
        << *text;

    // An hour and a half later with nothing new, both windows are empty and
    // lifetime is unchanged.
    for (int t = 0; t < 9 * 60; ++t) {  // 90 min of 10 s ticks
        now += rw.tick_ns();
        rw.observe(one_histogram(lifetime), now);
    }
    auto later = one_histogram(lifetime);
    rw.annotate(later, now);
    EXPECT_EQ(view_of(later, "1m")->ns->count(), 0u);
    EXPECT_EQ(view_of(later, "1h")->ns->count(), 0u);
    EXPECT_EQ(later.histograms.front().ns->count(), 220u);
}

TEST(telemetry, recent_windows_are_bounded_and_restart_after_a_reset) {
    recent_windows rw(recent_windows::default_specs(), 4);
    std::int64_t now = 0;
    snapshot many;
    rtcore::histogram h;
    h.record(1'000);
    for (int i = 0; i < 10; ++i) {
        many.add_histogram("qrt_x_seconds", "x", {{"n", std::to_string(i)}}, h);
    }
    rw.observe(many, now);
    EXPECT_EQ(rw.series(), 4u) << "at most max_series series are followed";
    // A series not seen for an hour is dropped.
    now += 3'601 * sec;
    rw.observe(snapshot{}, now);
    EXPECT_EQ(rw.series(), 0u);

    // A lifetime histogram that went back (the link restarted) restarts its
    // windows instead of reporting nonsense.
    rtcore::histogram big;
    for (int i = 0; i < 50; ++i) {
        big.record(2'000);
    }
    rw.observe(one_histogram(big), now);
    now += 10 * sec;
    rtcore::histogram fresh;
    fresh.record(3'000);
    rw.observe(one_histogram(fresh), now);
    auto s = one_histogram(fresh);
    rw.annotate(s, now);
    EXPECT_EQ(view_of(s, "1m")->ns->count(), 1u);
}
