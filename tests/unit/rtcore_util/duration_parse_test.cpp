#include "rtcore/duration_parse.hpp"

#include <gtest/gtest.h>

TEST(duration_parse, splits_digits_point_fraction_and_the_rest) {
    auto p = rtcore::split_duration("12.50ms");
    EXPECT_EQ(p.whole, "12");
    EXPECT_TRUE(p.point);
    EXPECT_EQ(p.fraction, "50");
    EXPECT_EQ(p.unit, "ms");
    EXPECT_EQ(p.digits(), 4U);

    p = rtcore::split_duration("42");
    EXPECT_EQ(p.whole, "42");
    EXPECT_FALSE(p.point);
    EXPECT_TRUE(p.unit.empty());

    p = rtcore::split_duration(".5us");
    EXPECT_TRUE(p.whole.empty());
    EXPECT_TRUE(p.point);
    EXPECT_EQ(p.fraction, "5");

    p = rtcore::split_duration("2.ms");
    EXPECT_TRUE(p.point);
    EXPECT_TRUE(p.fraction.empty());
    EXPECT_EQ(p.unit, "ms");
}

TEST(duration_parse, the_rest_is_verbatim_and_not_judged) {
    // A second point, a sign, blanks and exponents end the number.
    EXPECT_EQ(rtcore::split_duration("1.2.3us").unit, ".3us");
    EXPECT_EQ(rtcore::split_duration("-2ms").unit, "-2ms");
    EXPECT_EQ(rtcore::split_duration("10 us").unit, " us");
    EXPECT_EQ(rtcore::split_duration("2e3ms").unit, "e3ms");
    EXPECT_EQ(rtcore::split_duration("").digits(), 0U);
}

TEST(duration_parse, unit_table) {
    EXPECT_EQ(rtcore::duration_unit_ns("ns"), 1);
    EXPECT_EQ(rtcore::duration_unit_ns("us"), 1'000);
    EXPECT_EQ(rtcore::duration_unit_ns("\xc2\xb5s"), 1'000);
    EXPECT_EQ(rtcore::duration_unit_ns("ms"), 1'000'000);
    EXPECT_EQ(rtcore::duration_unit_ns("s"), 1'000'000'000);
    EXPECT_EQ(rtcore::duration_unit_ns("m"), rtcore::ns_per_minute);
    EXPECT_EQ(rtcore::duration_unit_ns("min"), rtcore::ns_per_minute);
    EXPECT_EQ(rtcore::duration_unit_ns("h"), rtcore::ns_per_hour);
    for (const char* bad : {"", "S", "sec", "mins", " ms", "ms ", "d", "µ"}) {
        EXPECT_EQ(rtcore::duration_unit_ns(bad), 0) << bad;
    }
}
