#include "rtcore/error.hpp"

#include <memory>
#include <string>
#include <type_traits>

#include <gtest/gtest.h>

namespace {

// A layer's own error type, as the timeline has one (a stable reason).
struct layer_error {
    std::string reason;
    std::string message;
};

template <typename T>
using layer_result = rtcore::basic_result<T, layer_error>;

static_assert(std::is_same_v<rtcore::result<int>, rtcore::basic_result<int, rtcore::error>>);
static_assert(!std::is_same_v<layer_result<int>, rtcore::result<int>>);

layer_result<std::unique_ptr<int>> make(bool ok) {
    if (ok) {
        return std::make_unique<int>(7);
    }
    return layer_error{"no_fit", "nothing fits"};
}

}  // namespace

TEST(basic_result, holds_a_value_or_the_layers_error) {
    auto good = make(true);
    ASSERT_TRUE(good);
    EXPECT_TRUE(good.has_value());
    EXPECT_EQ(**good, 7);
    auto moved = std::move(good).value();  // move-only values move out
    EXPECT_EQ(*moved, 7);

    auto bad = make(false);
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.err().reason, "no_fit");
    const layer_error taken = std::move(bad).err();
    EXPECT_EQ(taken.message, "nothing fits");
}

TEST(basic_result, value_or_and_arrow) {
    struct point {
        int x = 0;
    };
    layer_result<point> p(point{3});
    EXPECT_EQ(p->x, 3);
    layer_result<int> e(layer_error{"not_found", "gone"});
    EXPECT_EQ(e.value_or(5), 5);
    EXPECT_EQ(layer_result<int>(9).value_or(5), 9);
}

TEST(basic_result, void_specialisation_is_ok_by_default) {
    rtcore::status ok = rtcore::ok();
    EXPECT_TRUE(ok);
    layer_result<void> fine;
    EXPECT_TRUE(fine.has_value());
    layer_result<void> failed(layer_error{"store_error", "disk full"});
    ASSERT_FALSE(failed);
    EXPECT_EQ(failed.err().reason, "store_error");
    rtcore::status sys = rtcore::error::from_errno(ENOENT, "open /x");
    ASSERT_FALSE(sys);
    EXPECT_EQ(sys.err().code, ENOENT);
    EXPECT_NE(sys.err().message.find("open /x: "), std::string::npos);
}
