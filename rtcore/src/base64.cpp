#include "rtcore/base64.hpp"

#include <array>
#include <cstddef>
#include <cstdint>

namespace rtcore {

namespace {

constexpr std::string_view alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<std::int8_t, 256> make_reverse() {
    std::array<std::int8_t, 256> r{};
    for (auto& v : r) {
        v = -1;
    }
    for (std::size_t i = 0; i < alphabet.size(); ++i) {
        r[static_cast<unsigned char>(alphabet[i])] = static_cast<std::int8_t>(i);
    }
    return r;
}
constexpr auto reverse = make_reverse();

}  // namespace

std::string base64_encode(std::string_view bytes) {
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    std::size_t i = 0;
    const auto at = [&](std::size_t k) {
        return static_cast<unsigned>(static_cast<unsigned char>(bytes[k]));
    };
    for (; i + 3 <= bytes.size(); i += 3) {
        const unsigned v = (at(i) << 16U) | (at(i + 1) << 8U) | at(i + 2);
        out += alphabet[(v >> 18U) & 63U];
        out += alphabet[(v >> 12U) & 63U];
        out += alphabet[(v >> 6U) & 63U];
        out += alphabet[v & 63U];
    }
    if (i < bytes.size()) {
        unsigned v = at(i) << 16U;
        const bool two = i + 1 < bytes.size();
        if (two) {
            v |= at(i + 1) << 8U;
        }
        out += alphabet[(v >> 18U) & 63U];
        out += alphabet[(v >> 12U) & 63U];
        out += two ? alphabet[(v >> 6U) & 63U] : '=';
        out += '=';
    }
    return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
    if (text.size() % 4 != 0) {
        return std::nullopt;
    }
    std::string out;
    out.reserve(text.size() / 4 * 3);
    for (std::size_t i = 0; i < text.size(); i += 4) {
        const bool last = i + 4 == text.size();
        std::array<int, 4> v{};
        int pad = 0;
        for (std::size_t k = 0; k < 4; ++k) {
            const char c = text[i + k];
            if (c == '=') {
                // Only in the last quantum, only in positions 2..3, and
                // only followed by more '='.
                if (!last || k < 2) {
                    return std::nullopt;
                }
                ++pad;
                v[k] = 0;
                continue;
            }
            if (pad > 0) {
                return std::nullopt;  // data after padding
            }
            v[k] = reverse[static_cast<unsigned char>(c)];
            if (v[k] < 0) {
                return std::nullopt;
            }
        }
        const unsigned n = (static_cast<unsigned>(v[0]) << 18U) | (static_cast<unsigned>(v[1]) << 12U) |
                           (static_cast<unsigned>(v[2]) << 6U) | static_cast<unsigned>(v[3]);
        // Canonical: the unused bits before the padding are zero.
        if ((pad == 1 && (n & 0xFFU) != 0) || (pad == 2 && (n & 0xFFFFU) != 0)) {
            return std::nullopt;
        }
        out += static_cast<char>((n >> 16U) & 0xFFU);
        if (pad < 2) {
            out += static_cast<char>((n >> 8U) & 0xFFU);
        }
        if (pad < 1) {
            out += static_cast<char>(n & 0xFFU);
        }
    }
    return out;
}

}  // namespace rtcore
