#include "rtcore/text.hpp"

#include <string>
#include <string_view>

#include <gtest/gtest.h>

using namespace std::string_literals;

TEST(text, trim_drops_ascii_white_space_at_both_ends_only) {
    EXPECT_EQ(rtcore::trim("3\n"), "3");                     // a kernel file
    EXPECT_EQ(rtcore::trim(" \t0-3,8 \n"), "0-3,8");         // cpuset.cpus with blanks
    EXPECT_EQ(rtcore::trim("{\"id\":1}\r"), "{\"id\":1}");   // a request line from a CRLF client
    EXPECT_EQ(rtcore::trim("\v\fp99 = 50us\f\v"), "p99 = 50us");  // inner blanks stay
    EXPECT_EQ(rtcore::trim(""), "");
    EXPECT_EQ(rtcore::trim(" \t\n\r"), "");
    EXPECT_EQ(rtcore::trim("x"), "x");
    // Not white space: a NUL byte, or a non-ASCII byte (UTF-8 NBSP), stays.
    EXPECT_EQ(rtcore::trim(" a\0 "s), "a\0"s);
    EXPECT_EQ(rtcore::trim("\xc2\xa0" "a"), "\xc2\xa0" "a");
}

TEST(text, trim_returns_a_view_into_its_argument) {
    const std::string s = "  cpuset cpu  ";
    const std::string_view t = rtcore::trim(s);
    EXPECT_EQ(t.data(), s.data() + 2);
    EXPECT_EQ(t.size(), 10U);
}

TEST(text, one_line_trims_then_folds_newlines_and_cuts_at_60) {
    EXPECT_EQ(rtcore::one_line("  ff\n"), "ff");
    EXPECT_EQ(rtcore::one_line("a\nb\n"), "a b");
    EXPECT_EQ(rtcore::one_line(" \n"), "(empty)");
    EXPECT_EQ(rtcore::one_line(std::string(70, 'x')), std::string(57, 'x') + "...");
}
