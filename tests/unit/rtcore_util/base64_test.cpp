#include "rtcore/base64.hpp"

#include <optional>
#include <string>

#include <gtest/gtest.h>

TEST(base64, rfc4648_vectors) {
    EXPECT_EQ(rtcore::base64_encode(""), "");
    EXPECT_EQ(rtcore::base64_encode("f"), "Zg==");
    EXPECT_EQ(rtcore::base64_encode("fo"), "Zm8=");
    EXPECT_EQ(rtcore::base64_encode("foo"), "Zm9v");
    EXPECT_EQ(rtcore::base64_encode("foob"), "Zm9vYg==");
    EXPECT_EQ(rtcore::base64_encode("fooba"), "Zm9vYmE=");
    EXPECT_EQ(rtcore::base64_encode("foobar"), "Zm9vYmFy");
    EXPECT_EQ(rtcore::base64_decode("Zm9vYg=="), std::optional<std::string>("foob"));
    EXPECT_EQ(rtcore::base64_decode(""), std::optional<std::string>(""));
}

TEST(base64, every_byte_value_round_trips_at_every_length) {
    std::string bytes;
    for (int i = 0; i < 256; ++i) {
        bytes.push_back(static_cast<char>(i));
        const auto enc = rtcore::base64_encode(bytes);
        EXPECT_EQ(enc.size() % 4, 0U);
        EXPECT_EQ(rtcore::base64_decode(enc), std::optional<std::string>(bytes)) << i;
    }
}

TEST(base64, decoding_refuses_every_non_canonical_form) {
    for (const char* bad : {"Zm9", "Zm9v\n", " Zm9v", "Zm9v=", "Zg=a", "Z===", "=Zg=", "Zg==Zg==",
                            "Zm-_", "Zh==", "Zm9=", "Zm8=====", "Zm\x80v"}) {
        EXPECT_FALSE(rtcore::base64_decode(bad).has_value()) << bad;
    }
    // The same text with the unused bits cleared is accepted.
    EXPECT_EQ(rtcore::base64_decode("Zg=="), std::optional<std::string>("f"));
    EXPECT_EQ(rtcore::base64_decode("Zm8="), std::optional<std::string>("fo"));
}
