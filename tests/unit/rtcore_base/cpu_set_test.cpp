#include <gtest/gtest.h>

#include "rtcore/cpu_set.hpp"

using rtcore::cpu_set;

TEST(cpu_set, parses_and_formats_the_kernel_list_form) {
    auto s = cpu_set::parse_list("0-3,8,10-11\n");
    ASSERT_TRUE(s) << s.err().message;
    EXPECT_EQ(s->count(), 7U);
    EXPECT_EQ(s->to_list(), "0-3,8,10-11");
    EXPECT_EQ(cpu_set{}.to_list(), "");
    EXPECT_TRUE(cpu_set::parse_list("")->empty());
}

TEST(cpu_set, list_errors_name_the_offending_token) {
    auto bad = cpu_set::parse_list("0-3,x");
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.err().message, "cpu list \"0-3,x\": \"x\" is not a CPU number");
    auto backwards = cpu_set::parse_list("5-2");
    ASSERT_FALSE(backwards);
    EXPECT_NE(backwards.err().message.find("runs backwards"), std::string::npos);
    EXPECT_FALSE(cpu_set::parse_list("1,,2"));
    EXPECT_FALSE(cpu_set::parse_list("99999"));
}

TEST(cpu_set, parses_and_formats_the_kernel_mask_form) {
    auto s = cpu_set::parse_mask("00000003\n");
    ASSERT_TRUE(s);
    EXPECT_EQ(s->to_list(), "0-1");
    EXPECT_EQ(s->to_mask(2), "00000003");
    auto wide = cpu_set::parse_mask("00000001,80000000");
    ASSERT_TRUE(wide);
    EXPECT_EQ(wide->to_list(), "31-32");
    EXPECT_EQ(wide->to_mask(64), "00000001,80000000");
    EXPECT_EQ(cpu_set{0}.to_mask(64), "00000000,00000001");
    EXPECT_FALSE(cpu_set::parse_mask("0x3"));
    EXPECT_FALSE(cpu_set::parse_mask(""));
}

TEST(cpu_set, set_algebra) {
    const cpu_set all = cpu_set::first_n(4);
    const cpu_set iso{2, 3};
    EXPECT_EQ((all - iso).to_list(), "0-1");
    EXPECT_TRUE(iso.is_subset_of(all));
    EXPECT_FALSE(all.is_subset_of(iso));
    EXPECT_TRUE(all.intersects(iso));
    EXPECT_EQ(iso.first(), 2);
    EXPECT_EQ(iso.last(), 3);
    EXPECT_EQ(cpu_set{}.first(), -1);
}
