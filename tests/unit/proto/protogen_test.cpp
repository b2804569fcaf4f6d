// qrt-protogen's loader refuses a table that would give the languages
// different or broken copies, naming the entry; its writers give the
// layouts the agent relies on.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "model.hpp"

namespace fs = std::filesystem;
using namespace qrt::protogen;

namespace {

const std::string k_table = QRT_PROTOCOL_TABLE;

std::string slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// The real table with `from` replaced by `to` (once), loaded.
load_result load_changed(const std::string& from, const std::string& to) {
    std::string text = slurp(k_table);
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << "the table no longer holds: " << from;
    if (at != std::string::npos) {
        text.replace(at, from.size(), to);
    }
    const auto p = fs::temp_directory_path() / ("qrt-protogen-" + std::to_string(::getpid()) + ".toml");
    std::ofstream(p) << text;
    auto r = load(p.string());
    fs::remove(p);
    return r;
}

}  // namespace

TEST(protogen, the_real_table_loads_and_gives_the_96_and_128_byte_headers) {
    const auto r = load(k_table);
    ASSERT_TRUE(r.m) << r.error;
    const auto& m = *r.m;
    ASSERT_FALSE(m.header.empty());
    EXPECT_EQ(m.header.back().offset + m.header.back().size, 128U);
    ASSERT_EQ(m.versions.size(), 2U);
    EXPECT_EQ(m.versions[0].header_len, 96U);
    EXPECT_EQ(m.versions[1].header_len, 128U);
    const auto outs = generate(m);
    ASSERT_EQ(outs.size(), 5U);
    for (const auto& o : outs) {
        EXPECT_NE(o.text.find("qrt-protogen"), std::string::npos) << o.path << " does not say it is generated";
    }
    EXPECT_NE(write_python(m).find("WIRE_HEADER_V1 = struct.Struct(\"<IHBBHHIQQqqqqqqIIq\")"), std::string::npos);
    EXPECT_NE(write_go(m).find("StateSent"), std::string::npos);
    EXPECT_NE(write_c_names(m).find("#define QRT_REASON_NO_FIT \"no_fit\""), std::string::npos);
    EXPECT_NE(write_c_names(m).find("#define QRT_STATE_SENT \"sent\""), std::string::npos);
}

TEST(protogen, a_duplicate_reason_is_refused_by_name) {
    const auto r = load_changed("{ name = \"no_fit\",", "{ name = \"not_found\",");
    ASSERT_FALSE(r.m);
    EXPECT_NE(r.error.find("\"not_found\" appears twice"), std::string::npos) << r.error;
}

TEST(protogen, an_application_code_used_twice_is_refused) {
    const auto r = load_changed("code = -32003", "code = -32002");
    ASSERT_FALSE(r.m);
    EXPECT_NE(r.error.find("already not_found's"), std::string::npos) << r.error;
}

TEST(protogen, a_header_field_that_c_would_pad_is_refused) {
    const auto r = load_changed("{ name = \"flags\", type = \"u8\"", "{ name = \"flags\", type = \"u16\"");
    ASSERT_FALSE(r.m);
    EXPECT_NE(r.error.find("not a multiple of its size"), std::string::npos) << r.error;
}

TEST(protogen, a_transition_to_no_state_is_refused) {
    const auto r = load_changed("next = [\"completed\", \"failed\", \"sent\"]", "next = [\"completed\", \"failed\", \"snet\"]");
    ASSERT_FALSE(r.m);
    EXPECT_NE(r.error.find("\"snet\", which is no state"), std::string::npos) << r.error;
}

TEST(protogen, a_misspelt_column_is_refused_not_dropped) {
    const auto r = load_changed("{ name = \"sent\", finishes_job = true", "{ name = \"sent\", finishes_jobs = true");
    ASSERT_FALSE(r.m);
    EXPECT_NE(r.error.find("unknown key finishes_jobs"), std::string::npos) << r.error;
}

TEST(protogen, a_version_2_field_before_a_version_1_field_is_refused) {
    const auto r = load_changed("{ name = \"tolerance_ns\", type = \"i64\", since = 1", "{ name = \"tolerance_ns\", type = \"i64\", since = 2");
    ASSERT_FALSE(r.m);
    EXPECT_NE(r.error.find("version 1's fields add up to 88 bytes"), std::string::npos) << r.error;
}

TEST(protogen, a_wire_error_must_map_to_an_outcome_reason) {
    const auto r = load_changed("outcome = \"qpu_busy\" }", "outcome = \"no_fit\" }");
    ASSERT_FALSE(r.m);
    EXPECT_NE(r.error.find("no outcome reason"), std::string::npos) << r.error;
}
