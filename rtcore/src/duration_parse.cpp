#include "rtcore/duration_parse.hpp"

#include <array>

namespace rtcore {

namespace {

struct unit_def {
    std::string_view name;
    std::int64_t ns;
};

constexpr std::array<unit_def, 8> units{{
    {"ns", 1},
    {"us", 1'000},
    {"\xc2\xb5s", 1'000},  // µs
    {"ms", 1'000'000},
    {"s", 1'000'000'000},
    {"m", ns_per_minute},
    {"min", ns_per_minute},
    {"h", ns_per_hour},
}};

std::size_t digits_from(std::string_view text, std::size_t i) noexcept {
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
        ++i;
    }
    return i;
}

}  // namespace

duration_text split_duration(std::string_view text) noexcept {
    duration_text out;
    std::size_t i = digits_from(text, 0);
    out.whole = text.substr(0, i);
    if (i < text.size() && text[i] == '.') {
        out.point = true;
        const std::size_t start = ++i;
        i = digits_from(text, i);
        out.fraction = text.substr(start, i - start);
    }
    out.unit = text.substr(i);
    return out;
}

std::int64_t duration_unit_ns(std::string_view unit) noexcept {
    for (const auto& u : units) {
        if (u.name == unit) {
            return u.ns;
        }
    }
    return 0;
}

}  // namespace rtcore
