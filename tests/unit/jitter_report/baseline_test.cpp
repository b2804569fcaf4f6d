#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "jitter_report/atomic_file.hpp"
#include "jitter_report/baseline.hpp"
#include "jitter_report/render.hpp"
#include "sample_report.hpp"

using namespace qrt::jitter;
namespace fs = std::filesystem;

namespace {

class temp_dir {
public:
    temp_dir() {
        path = fs::temp_directory_path() / ("qrt-jitter-unit-" + std::to_string(::getpid()) + "-" +
                                            std::to_string(counter++));
        fs::create_directories(path);
    }
    ~temp_dir() { fs::remove_all(path); }
    std::string file(const std::string& name, const std::string& content) const {
        const auto p = (path / name).string();
        std::ofstream(p) << content;
        return p;
    }
    fs::path path;
    static inline int counter = 0;
};

}  // namespace

TEST(baseline_compare, gives_the_ratio_per_percentile_of_matching_series) {
    const auto before = jitter_test::sample_report();
    auto now = before;
    now.series_list[0].stats.p99_ns = before.series_list[0].stats.p99_ns * 2;
    now.series_list[1].name = "cpu5";
    const auto c = compare(now, before, "before.json");
    EXPECT_EQ(c.file, "before.json");
    bool saw = false;
    for (const auto& row : c.rows) {
        if (row.name == "cpu1" && row.metric == "timer_lateness" && row.stat == "p99") {
            ASSERT_TRUE(row.ratio.has_value());
            EXPECT_DOUBLE_EQ(*row.ratio, 2.0);
            saw = true;
        }
        if (row.name == "cpu1" && row.metric == "timer_lateness" && row.stat == "p50") {
            EXPECT_DOUBLE_EQ(row.ratio.value_or(0), 1.0);
        }
    }
    EXPECT_TRUE(saw);
    EXPECT_EQ(c.rows.size(), 2U * 6U);  // cpu1 timer + cpu1 probe, six stats each
    ASSERT_EQ(c.only_in_current.size(), 1U);
    EXPECT_EQ(c.only_in_current[0], "cpu cpu5 timer_lateness");
    ASSERT_EQ(c.only_in_baseline.size(), 1U);
    EXPECT_EQ(c.only_in_baseline[0], "cpu cpu3 timer_lateness");
}

TEST(baseline_compare, has_no_ratio_against_a_zero) {
    auto before = jitter_test::sample_report();
    before.series_list[0].stats.stddev_ns = 0.0;
    const auto c = compare(jitter_test::sample_report(), before, "b");
    for (const auto& row : c.rows) {
        if (row.name == "cpu1" && row.metric == "timer_lateness" && row.stat == "stddev") {
            EXPECT_FALSE(row.ratio.has_value());
        }
    }
}

TEST(baseline_load, reads_a_json_report) {
    temp_dir d;
    const auto p = d.file("b.json", to_json(jitter_test::sample_report()).dump(2));
    auto b = load_baseline(p);
    ASSERT_TRUE(b) << b.err().message;
    EXPECT_EQ(b->series_list.size(), 3U);
}

TEST(baseline_load, refuses_bad_files_naming_the_file_and_the_problem) {
    temp_dir d;
    const std::string good = to_json(jitter_test::sample_report()).dump();
    auto newer = nlohmann::json::parse(good);
    newer["schema_version"] = schema_version + 1;
    auto missing = nlohmann::json::parse(good);
    missing["series"][1].erase("p99_ns");
    auto retyped = nlohmann::json::parse(good);
    retyped["series"][0]["count"] = "many";
    struct bad {
        std::string name;
        std::string content;
        std::string says;
    };
    for (const bad& b : std::vector<bad>{
             {"truncated.json", good.substr(0, good.size() / 2), "not valid JSON at byte"},
             {"empty.json", "", "the file is empty"},
             {"binary.json", std::string("\x00\x01\x02", 3), "not valid JSON"},
             {"other.json", R"({"schema":"something-else","schema_version":1})", "is not a qrt-jitter-report"},
             {"newer.json", newer.dump(), "is not supported"},
             {"missing.json", missing.dump(), "$.series[1].p99_ns: missing"},
             {"retyped.json", retyped.dump(), "$.series[0].count: expected a non-negative integer"},
             {"array.json", "[1,2,3]", "$: expected an object"}}) {
        const auto p = d.file(b.name, b.content);
        auto r = load_baseline(p);
        ASSERT_FALSE(r) << b.name << " was accepted";
        EXPECT_NE(r.err().message.find(p), std::string::npos) << r.err().message;
        EXPECT_NE(r.err().message.find(b.says), std::string::npos)
            << b.name << ": " << r.err().message << " (expected: " << b.says << ")";
    }
    auto none = load_baseline((d.path / "nope.json").string());
    ASSERT_FALSE(none);
    EXPECT_NE(none.err().message.find("No such file"), std::string::npos) << none.err().message;
}

TEST(atomic_file, replaces_the_whole_file_or_leaves_it_alone) {
    temp_dir d;
    const auto p = d.file("out.json", "old");
    ASSERT_TRUE(write_file_atomically(p, "new content"));
    std::ifstream in(p);
    std::ostringstream got;
    got << in.rdbuf();
    EXPECT_EQ(got.str(), "new content");

    // A directory cannot be replaced by a file: the rename fails, the
    // directory stays, and no temporary file is left behind.
    const auto dir = (d.path / "a-dir").string();
    fs::create_directories(dir);
    auto st = write_file_atomically(dir, "x");
    ASSERT_FALSE(st);
    EXPECT_NE(st.err().message.find("rename"), std::string::npos) << st.err().message;
    EXPECT_TRUE(fs::is_directory(dir));
    std::size_t entries = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(d.path)) {
        ++entries;
    }
    EXPECT_EQ(entries, 2U);  // out.json and a-dir

    auto no_dir = write_file_atomically((d.path / "missing" / "f.svg").string(), "x");
    ASSERT_FALSE(no_dir);
    EXPECT_NE(no_dir.err().message.find("open"), std::string::npos) << no_dir.err().message;
}
