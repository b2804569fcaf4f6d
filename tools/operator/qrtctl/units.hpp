#pragma once
// Strict parsing and formatting of the times and durations qrtctl accepts
// and prints.  The API speaks integer ns since the Unix epoch (UTC) and ns
// durations; people type "2ms", "+30s" and "2026-11-29T18:00:00Z".

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "rtcore/clock.hpp"

namespace qrtctl {

// "<number><unit>": number is decimal (fraction allowed: "1.5ms"), unit one
// of ns, us, µs, ms, s, m, min, h.  A bare integer is ns.  No sign, no
// spaces, no exponent; a result that is not a whole number of ns, or that
// overflows int64, is refused.  The error names the text and the rule.
struct parsed_ns {
    std::optional<std::int64_t> value;
    std::string error;  // set when value is empty
};
parsed_ns parse_duration_ns(std::string_view text);

// A point in time: "now", "+<duration>" (from now), "<integer>" (ns since
// the epoch) or ISO 8601 UTC "YYYY-MM-DDTHH:MM:SS[.fraction]Z".
parsed_ns parse_time_ns(std::string_view text, std::int64_t now_ns);

// "2026-11-29T18:12:39.123456Z" (µs, UTC).
std::string format_time_ns(std::int64_t t_ns);
// "2ms", "1.5s", "350us", "3h12m": the shortest exact-enough reading.
std::string format_duration_ns(std::int64_t d_ns);

// The realtime clock, read the one way qrtd reads it (rtcore/clock.hpp).
using rtcore::realtime_now_ns;

}  // namespace qrtctl
