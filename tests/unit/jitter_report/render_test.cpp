#include <gtest/gtest.h>

#include <sstream>
#include <vector>

#include "jitter_report/render.hpp"
#include "jitter_report/slo.hpp"
#include "sample_report.hpp"

using namespace qrt::jitter;
using nlohmann::json;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) {
        out.push_back(l);
    }
    return out;
}

report full_report() {
    auto r = jitter_test::sample_report();
    r.slo = check_slo(*parse_slo("p99=10us,max=100ms"), r).value();
    comparison c;
    c.file = "/var/lib/qrtd/a/rather/long/path/to/the/baseline/before-tuning-2026-11-29.json";
    c.baseline_mode = "standalone";
    c.rows.push_back({"cpu", "cpu1", "timer_lateness", "p99", 10'000.0, 12'000.0, 1.2});
    c.rows.push_back({"cpu", "cpu1", "timer_lateness", "max", 0.0, 12'000.0, std::nullopt});
    c.only_in_baseline.push_back("cpu cpu2 timer_lateness");
    r.baseline = c;
    return r;
}

// A small XML well-formedness check: tags balance, attributes are quoted,
// no bare '&' or '<' in text.
bool well_formed(const std::string& xml, std::string& why) {
    std::vector<std::string> stack;
    std::size_t i = 0;
    if (xml.rfind("<?xml", 0) == 0) {
        i = xml.find("?>") + 2;
    }
    while (i < xml.size()) {
        if (xml[i] == '&') {
            const auto semi = xml.find(';', i);
            const std::string ent = xml.substr(i, semi == std::string::npos ? 1 : semi - i + 1);
            if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;" && ent != "&apos;") {
                why = "bad entity " + ent;
                return false;
            }
            i = semi + 1;
            continue;
        }
        if (xml[i] != '<') {
            ++i;
            continue;
        }
        const auto end = xml.find('>', i);
        if (end == std::string::npos) {
            why = "unterminated tag";
            return false;
        }
        std::string tag = xml.substr(i + 1, end - i - 1);
        if (tag.find('<') != std::string::npos) {
            why = "'<' inside tag " + tag;
            return false;
        }
        std::size_t quotes = 0;
        for (char c : tag) {
            quotes += c == '"' ? 1 : 0;
        }
        if (quotes % 2 != 0) {
            why = "unbalanced quotes in " + tag;
            return false;
        }
        if (tag.front() == '/') {
            const std::string name = tag.substr(1);
            if (stack.empty() || stack.back() != name) {
                why = "</" + name + "> closes " + (stack.empty() ? "nothing" : stack.back());
                return false;
            }
            stack.pop_back();
        } else if (tag.back() != '/') {
            stack.push_back(tag.substr(0, tag.find_first_of(" \n")));
        }
        i = end + 1;
    }
    if (!stack.empty()) {
        why = "unclosed <" + stack.back() + ">";
        return false;
    }
    return true;
}

}  // namespace

TEST(render_text, every_line_is_shorter_than_80_columns) {
    auto r = full_report();
    r.series_list[0].name = "a-qpu-name-much-longer-than-the-column";
    r.series_list[0].stats.count = 123'456'789'012;
    for (const auto& text : {render_text(r), render_text(jitter_test::sample_report())}) {
        for (const auto& l : lines_of(text)) {
            EXPECT_LT(l.size(), text_columns) << "[" << l << "]";
        }
    }
}

TEST(render_text, shows_percentiles_histogram_intrusions_and_verdict) {
    const auto r = full_report();
    const std::string t = render_text(r);
    for (const char* part : {"timer lateness", "p99.9", "stddev", "histogram: cpu1 timer lateness",
                             "top intrusions", "irq LOC (local timer)", "worst wakeups",
                             "against baseline", "1.20x", "only in the baseline: cpu cpu2",
                             "probes: available (tp_btf)", "note: hypervisor steal",
                             "verdict: SLO VIOLATED"}) {
        EXPECT_NE(t.find(part), std::string::npos) << "missing '" << part << "' in\n" << t;
    }
    // Row for cpu1 carries its p50 in the table.
    EXPECT_NE(t.find(format_ns(static_cast<double>(r.series_list[0].stats.p50_ns))), std::string::npos);
}

TEST(render_text, says_when_probes_are_unavailable_and_no_slo_was_given) {
    auto r = jitter_test::sample_report();
    r.probes = {false, "unavailable (missing capability CAP_BPF)"};
    r.intrusions.clear();
    const std::string t = render_text(r);
    EXPECT_NE(t.find("probes: unavailable (missing capability CAP_BPF)"), std::string::npos) << t;
    EXPECT_NE(t.find("verdict: no SLO given"), std::string::npos) << t;
}

TEST(render_text, histogram_bars_grow_with_log_count) {
    const auto r = jitter_test::sample_report();
    const auto lines = lines_of(render_text(r));
    std::size_t most = 0;
    std::size_t least = 1000;
    for (const auto& l : lines) {
        if (l.rfind("  <=", 0) != 0) {
            continue;
        }
        const auto bars = static_cast<std::size_t>(std::count(l.begin(), l.end(), '#'));
        const auto count = std::stoull(l.substr(l.rfind('|') + 1));
        if (count == 5000 / 2 || count > 1000) {
            most = std::max(most, bars);
        }
        if (count == 1) {
            least = std::min(least, bars);
        }
    }
    EXPECT_GT(most, least);
}

TEST(render_json, carries_the_documented_schema) {
    const auto r = full_report();
    const json j = to_json(r);
    EXPECT_EQ(j.at("schema"), "qrt-jitter-report");
    EXPECT_EQ(j.at("schema_version"), schema_version);
    for (const char* key : {"tool_version", "run", "host", "probes", "series", "intrusions",
                            "outliers", "notes", "slo", "baseline"}) {
        EXPECT_TRUE(j.contains(key)) << key;
    }
    for (const char* key : {"mode", "taken_ns", "duration_ns", "cpus", "interval_ns", "priority",
                            "policy", "overruns"}) {
        EXPECT_TRUE(j.at("run").contains(key)) << "run." << key;
    }
    const auto& s = j.at("series").at(0);
    for (const char* key : {"scope", "name", "cpu", "metric", "primary", "count", "min_ns", "max_ns",
                            "mean_ns", "stddev_ns", "p50_ns", "p95_ns", "p99_ns", "p999_ns",
                            "negative_count", "bins"}) {
        EXPECT_TRUE(s.contains(key)) << "series[0]." << key;
    }
    std::uint64_t binned = 0;
    for (const auto& b : s.at("bins")) {
        binned += b.at("count").get<std::uint64_t>();
    }
    EXPECT_EQ(binned, s.at("count").get<std::uint64_t>());
    EXPECT_EQ(j.at("slo").at("spec"), "p99=10us,max=100ms");
    EXPECT_FALSE(j.at("slo").at("met").get<bool>());
    EXPECT_TRUE(j.at("baseline").at("rows").at(1).at("ratio").is_null());
    EXPECT_EQ(j.at("intrusions").at(0).at("source"), r.intrusions[0].source);
}

TEST(render_json, reads_back_what_it_wrote) {
    const auto r = full_report();
    auto back = report_from_json(json::parse(to_json(r).dump()));
    ASSERT_TRUE(back) << back.err().message;
    ASSERT_EQ(back->series_list.size(), r.series_list.size());
    for (std::size_t i = 0; i < r.series_list.size(); ++i) {
        const auto& a = r.series_list[i];
        const auto& b = back->series_list[i];
        EXPECT_EQ(a.name, b.name);
        EXPECT_EQ(a.metric, b.metric);
        EXPECT_EQ(a.primary, b.primary);
        EXPECT_EQ(a.stats.p99_ns, b.stats.p99_ns);
        EXPECT_EQ(a.stats.count, b.stats.count);
        EXPECT_EQ(a.bins, b.bins);
    }
    EXPECT_EQ(back->run.taken_ns, r.run.taken_ns);
}

TEST(render_svg, is_well_formed_with_a_bar_per_nonempty_bin) {
    auto r = full_report();
    r.series_list[0].name = "q<0> & \"friends\"";
    const std::string svg = render_svg(r);
    std::string why;
    EXPECT_TRUE(well_formed(svg, why)) << why;
    EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
    EXPECT_NE(svg.find("q&lt;0&gt; &amp; &quot;friends&quot;"), std::string::npos);
    EXPECT_NE(svg.find("samples (log scale)"), std::string::npos);
    std::size_t rects = 0;
    for (std::size_t p = svg.find("<rect x="); p != std::string::npos; p = svg.find("<rect x=", p + 1)) {
        ++rects;
    }
    std::size_t bins = 0;
    for (const auto& s : r.series_list) {
        if (s.primary) {
            for (const auto& b : display_bins(s, 60)) {
                bins += b.count > 0 ? 1 : 0;
            }
        }
    }
    EXPECT_EQ(rects, bins + 1);  // + the white background
}

TEST(render_svg, without_samples_still_renders_a_document) {
    report r;
    r.run.mode = "agent";
    std::string why;
    const std::string svg = render_svg(r);
    EXPECT_TRUE(well_formed(svg, why)) << why;
    EXPECT_NE(svg.find("no samples"), std::string::npos);
}

TEST(report_bins, keep_every_sample_and_fill_gaps_for_display) {
    const auto s = jitter_test::sample_series("cpu1", 1, 4'000);
    std::uint64_t n = 0;
    for (const auto& b : s.bins) {
        n += b.count;
        EXPECT_GT(b.count, 0U);
    }
    EXPECT_EQ(n, s.stats.count);
    const auto rows = display_bins(s, 1000);
    EXPECT_GT(rows.size(), s.bins.size());  // gaps between 4 us and 1.6 ms put back
    const auto few = display_bins(s, 8);
    EXPECT_LE(few.size(), 8U);
    std::uint64_t m = 0;
    for (const auto& b : few) {
        m += b.count;
    }
    EXPECT_EQ(m, s.stats.count);
}

TEST(report_bins, from_cumulative_steps_put_the_tail_in_a_last_bin) {
    const auto bins = bins_from_cumulative({{1'000, 5}, {2'000, 9}, {5'000, 9}, {10'000, 12}}, 15, 70'000);
    ASSERT_EQ(bins.size(), 4U);
    EXPECT_EQ(bins[0], (bin{1'000, 5}));
    EXPECT_EQ(bins[1], (bin{2'000, 4}));
    EXPECT_EQ(bins[2], (bin{10'000, 3}));
    EXPECT_EQ(bins[3], (bin{70'000, 3}));
}
