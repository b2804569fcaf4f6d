#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "qrt/rpc/json_rpc.hpp"

using namespace qrt::rpc;

namespace {
// The rpc_failure a callable throws (fails the test when none is thrown).
template <typename F>
rpc_failure failure_of(F&& f) {
    try {
        f();
    } catch (const rpc_failure& e) {
        return e;
    }
    ADD_FAILURE() << "expected an rpc_failure";
    return rpc_failure("internal_error", "none thrown");
}
}  // namespace

TEST(json_rpc, nesting_prescan_counts_brackets_outside_strings_only) {
    EXPECT_FALSE(nesting_exceeds(R"({"a":[1,{"b":2}]})", 3));
    EXPECT_TRUE(nesting_exceeds(R"({"a":[1,{"b":[2]}]})", 3));
    EXPECT_FALSE(nesting_exceeds(R"({"s":"[[[[[[[[[[[[[[[["})", 1));
    EXPECT_FALSE(nesting_exceeds(R"({"s":"\"[[[[[[[[["})", 1));  // escaped quote stays in string
    EXPECT_TRUE(nesting_exceeds(std::string(100000, '['), 64));
}

TEST(json_rpc, params_reader_rejects_unknown_members_naming_them) {
    const json p = {{"duration_ns", 5}, {"deadline", 7}};
    const auto f = failure_of([&] { params_reader r(p, {"duration_ns", "deadline_ns"}); });
    EXPECT_EQ(f.code(), code_invalid_params);
    EXPECT_EQ(f.reason(), reason::invalid_params);
    EXPECT_EQ(f.details().at("field"), "deadline");
    EXPECT_NE(f.message().find("deadline_ns"), std::string::npos) << f.message();
}

TEST(json_rpc, params_reader_accepts_absent_params_and_rejects_positional_params) {
    params_reader none(json(nullptr), {"x"});
    EXPECT_FALSE(none.has("x"));
    const auto f = failure_of([] { params_reader r(json::array({1, 2}), {"x"}); });
    EXPECT_EQ(f.details().at("field"), "params");
}

TEST(json_rpc, integers_must_be_json_integers_within_range) {
    const json p = json::parse(R"({"a":1.5,"b":1e300,"c":18446744073709551615,"d":-3,
                                    "e":99999999999999999999999,"f":"7","g":42})");
    params_reader r(p, {"a", "b", "c", "d", "e", "f", "g"});
    EXPECT_EQ(failure_of([&] { (void)r.i64("a", 0, 10); }).details().at("field"), "a");
    EXPECT_EQ(failure_of([&] { (void)r.i64("b", 0, 10); }).details().at("field"), "b");
    EXPECT_EQ(failure_of([&] { (void)r.i64("c", 0, INT64_MAX); }).details().at("field"), "c");
    EXPECT_EQ(failure_of([&] { (void)r.i64("d", 0, 10); }).details().at("field"), "d");
    EXPECT_EQ(failure_of([&] { (void)r.i64("e", 0, INT64_MAX); }).details().at("field"), "e");
    EXPECT_EQ(failure_of([&] { (void)r.i64("f", 0, 10); }).details().at("field"), "f");
    EXPECT_EQ(failure_of([&] { (void)r.i64("missing", 0, 10); }).details().at("field"), "missing");
    EXPECT_EQ(r.i64("g", 0, 100), 42);
    EXPECT_EQ(r.opt_i64("missing", 0, 1), std::nullopt);
}

TEST(json_rpc, numbers_strings_booleans_and_arrays_are_type_checked) {
    const json p = json::parse(R"({"n":0.5,"big":1e300,"s":"abc","b":true,"arr":["x","y"],
                                    "bad_arr":["x",1]})");
    params_reader r(p, {"n", "big", "s", "b", "arr", "bad_arr"});
    EXPECT_DOUBLE_EQ(r.number("n", 0.0, 1.0), 0.5);
    EXPECT_EQ(failure_of([&] { (void)r.number("big", 0.0, 1.0); }).details().at("field"), "big");
    EXPECT_EQ(r.str("s", 3), "abc");
    EXPECT_EQ(failure_of([&] { (void)r.str("s", 2); }).details().at("field"), "s");
    EXPECT_EQ(failure_of([&] { (void)r.str("b"); }).details().at("field"), "b");
    EXPECT_TRUE(r.boolean("b"));
    EXPECT_EQ(r.str_array("arr", 2), (std::vector<std::string>{"x", "y"}));
    EXPECT_EQ(failure_of([&] { (void)r.str_array("arr", 1); }).details().at("field"), "arr");
    EXPECT_EQ(failure_of([&] { (void)r.str_array("bad_arr", 5); }).details().at("field"),
              "bad_arr");
}

TEST(json_rpc, base64_round_trips_every_length) {
    std::string bytes;
    for (int i = 0; i < 300; ++i) {
        const auto enc = base64_encode(bytes);
        const auto dec = base64_decode_strict(enc);
        ASSERT_TRUE(dec.has_value()) << enc;
        EXPECT_EQ(*dec, bytes);
        bytes.push_back(static_cast<char>(i * 37));
    }
    EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
    EXPECT_EQ(base64_encode("fo"), "Zm8=");
}

TEST(json_rpc, base64_decoding_is_strict) {
    EXPECT_EQ(base64_decode_strict("Zm9v"), std::optional<std::string>("foo"));
    EXPECT_EQ(base64_decode_strict(""), std::optional<std::string>(""));
    for (const char* bad : {"Zm9", "Zm9v\n", " Zm9v", "Zm=v", "Z===", "Zm9-", "Zm9_", "Zm8=Zm8=",
                            "Zm9=",  // non-canonical: unused bits set
                            "Zh=="}) {
        EXPECT_FALSE(base64_decode_strict(bad).has_value()) << bad;
    }
}

TEST(json_rpc, replies_are_single_lines_even_with_invalid_utf8_inside) {
    const std::string line = to_line(make_result_reply(1, json{{"s", std::string("a\xff\nb")}}));
    EXPECT_EQ(line.back(), '\n');
    EXPECT_EQ(line.find('\n'), line.size() - 1);
    const auto back = json::parse(line);
    EXPECT_EQ(back.at("id"), 1);
}

// dump_to writes integers, plain strings and structure itself (public API
// only): its bytes must stay nlohmann's, for every kind of value.
TEST(json_rpc, dump_to_appends_exactly_what_nlohmann_dump_gives) {
    const std::vector<json> values = {
        nullptr,
        true,
        false,
        0,
        -1,
        std::numeric_limits<std::int64_t>::min(),
        std::numeric_limits<std::int64_t>::max(),
        std::numeric_limits<std::uint64_t>::max(),
        0.5,
        1.0,
        -0.0,
        1e300,
        0.9876543210123,
        "",
        "qpu0",
        "cal-000042 ~!@#$%^&*()_+{}|:<>?`-=[];',./",
        "quote \" backslash \\ slash /",
        "tab\tnewline\ncr\rbs\bff\f nul" + std::string(1, '\0') + "\x1f\x7f",
        "utf-8: \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80",
        std::string("invalid \xff\xfe utf-8 \xc3"),
        json::array(),
        json::object(),
        json::array({1, "two", 3.5, nullptr, json::array({false}), json::object({{"k", "v"}})}),
        json{{"z", 1}, {"a", json{{"nested \"key\"", json::array({-7, "\x01"})}}}, {"m", 0.25}},
        json::binary({1, 2, 3}),
    };
    for (const auto& v : values) {
        std::string out = "prefix:";
        dump_to(out, v);
        EXPECT_EQ(out, "prefix:" + v.dump(-1, ' ', false, json::error_handler_t::replace)) << v.type_name();
    }
}

// Doubles are written in nlohmann's layout around std::to_chars' digits:
// byte for byte nlohmann's text for the values replies carry and at every
// edge of the layout, and for any double a text that reads back as it.
TEST(json_rpc, doubles_are_nlohmanns_text_and_read_back_exactly) {
    const double edges[] = {0.5, 1.0, -1.0, 0.1, 0.99, 0.9876543210123, 0.25, 2.5, 3.14159, 1e-4,
                            1.5e-4, 1e-5, 1.5e-5, 1e15, 1e16, 1.5e16, 123456789012345.0,
                            1234567890123456.0, 12345678901234567.0, 1e21, 1e22, 1e100, -2.5e-300,
                            1e300, 5e-324, std::numeric_limits<double>::min(),
                            std::numeric_limits<double>::max(), std::numeric_limits<double>::lowest(),
                            std::numeric_limits<double>::epsilon(), 0.0, -0.0, 100.0, 0.001, 42.125};
    for (const double d : edges) {
        std::string out;
        append_json_double(out, d);
        EXPECT_EQ(out, json(d).dump()) << d;
    }
    for (const double d : {std::nan(""), std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()}) {
        std::string out;
        dump_to(out, json(d));
        EXPECT_EQ(out, "null");
    }
    // Fidelities and scores (the values slots.query writes) and any bit
    // pattern: the text reads back as the same double, and differs from
    // nlohmann's only where Grisu2 is not shortest (rare; never shorter).
    std::mt19937_64 rng(15);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    int differ = 0;
    constexpr int n = 200000;
    for (int i = 0; i < n; ++i) {
        double d = unit(rng);
        if (i % 2 == 1) {
            const std::uint64_t bits = rng();
            std::memcpy(&d, &bits, sizeof d);
        }
        if (!std::isfinite(d)) {
            continue;
        }
        std::string out;
        append_json_double(out, d);
        const json back = json::parse(out);
        ASSERT_TRUE(back.is_number_float()) << out;
        ASSERT_EQ(std::memcmp(&d, &back.get_ref<const double&>(), sizeof d), 0) << out;
        const std::string theirs = json(d).dump();
        if (out != theirs) {
            ++differ;
            ASSERT_LE(out.size(), theirs.size()) << out << " vs nlohmann " << theirs;
            ASSERT_EQ(json::parse(theirs).get<double>(), d);
        }
    }
    EXPECT_LT(differ, n / 100) << differ << " of " << n << " random doubles differ from nlohmann's text";
    std::printf("%d of %d random doubles written shorter than nlohmann's Grisu2 text\n", differ, n);
}
