#pragma once
// The common ground of the tools' duration parsers: "<digits>[.<digits>]<unit>"
// split into its parts, and the unit table.  The tools keep their own
// policies on top (qrtctl: a bare integer is ns, fractions must be a whole
// number of ns; qrt-jitter-report: a unit is required, blanks around the
// unit are allowed, fractions round to the nearest ns).
//
// Units: ns, us, µs (UTF-8), ms, s, m, min, h.

#include <cstdint>
#include <string_view>

namespace rtcore {

inline constexpr std::int64_t ns_per_minute = 60'000'000'000;
inline constexpr std::int64_t ns_per_hour = 60 * ns_per_minute;

struct duration_text {
    std::string_view whole;     // decimal digits before the point ("" for ".5us")
    std::string_view fraction;  // decimal digits after the point
    bool point = false;         // a '.' followed the whole digits
    std::string_view unit;      // the rest, verbatim (may be empty, or not a unit)

    std::size_t digits() const noexcept { return whole.size() + fraction.size(); }
};

// Splits without judging: digits, at most one '.', digits, then the rest.
// No sign, no blanks, no exponent are taken as part of the number.
duration_text split_duration(std::string_view text) noexcept;

// ns per unit, 0 when unit is not one of the units above (exact match).
std::int64_t duration_unit_ns(std::string_view unit) noexcept;

}  // namespace rtcore
