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
