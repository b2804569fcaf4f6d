#include "rtcore/error.hpp"

#include <unistd.h>

#include <cerrno>
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

namespace {

// What building a message can do to errno: allocation, a log call, a
// strerror of something else.  Here it says so outright.
std::string message_that_clobbers_errno(const std::string& what) {
    errno = EINVAL;
    return what;
}

// from_errno takes the errno value taken first, never errno itself: the
// order in which a call's arguments are evaluated is unspecified, so errno
// could be read after the message had been built.
template <typename E>
constexpr bool from_errno_takes = requires(E e) { rtcore::error::from_errno(e, std::string()); };
template <int N>
constexpr bool from_errno_takes_literal = requires { rtcore::error::from_errno(N, std::string()); };
template <typename S>
constexpr bool from_errno_takes_message_alone = requires(S s) { rtcore::error::from_errno(s); };

static_assert(!from_errno_takes<int&>, "errno itself (a modifiable int lvalue) must not compile");
static_assert(!from_errno_takes<int>, "a non-const copy must not compile either: take `const int err = errno;`");
static_assert(from_errno_takes<const int&>, "a const snapshot is the way");
static_assert(from_errno_takes_literal<ENOENT>, "a literal errno value is taken as it is");
static_assert(!from_errno_takes_message_alone<std::string>, "no overload reads errno behind the caller's back");

}  // namespace

TEST(error, from_errno_keeps_the_errno_taken_before_building_the_message_clobbered_it) {
    ASSERT_EQ(::access("/nonexistent-qrt-dir/x", F_OK), -1);
    const int err = errno;
    ASSERT_EQ(err, ENOENT);
    const auto e = rtcore::error::from_errno(err, message_that_clobbers_errno("access /nonexistent-qrt-dir/x"));
    EXPECT_EQ(errno, EINVAL) << "the message was meant to clobber errno";
    EXPECT_EQ(e.code, ENOENT);
    EXPECT_EQ(e.message, "access /nonexistent-qrt-dir/x: No such file or directory");
}
