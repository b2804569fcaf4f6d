#include "units.hpp"

#include <time.h>

#include <array>
#include <cstdio>
#include <limits>

#include "rtcore/duration_parse.hpp"

namespace qrtctl {

namespace {

constexpr std::int64_t ns_per_s = 1'000'000'000;
constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();

bool is_digit(char c) { return c >= '0' && c <= '9'; }

parsed_ns bad(std::string_view text, std::string_view why) {
    return parsed_ns{std::nullopt, "'" + std::string(text) + "' " + std::string(why)};
}

// Digits to int64 with overflow check.
std::optional<std::int64_t> to_i64(std::string_view digits) {
    std::int64_t v = 0;
    for (const char c : digits) {
        const int d = c - '0';
        if (v > (i64_max - d) / 10) {
            return std::nullopt;
        }
        v = v * 10 + d;
    }
    return v;
}

}  // namespace

parsed_ns parse_duration_ns(std::string_view text) {
    constexpr std::string_view rule =
        "is not a duration (e.g. 2ms, 1.5s, 250us, 10m; units ns us ms s m h)";
    const rtcore::duration_text parts = rtcore::split_duration(text);
    if (parts.whole.empty() || (parts.point && parts.fraction.empty())) {
        return bad(text, rule);
    }
    std::int64_t scale = 1;
    if (parts.unit.empty()) {
        if (!parts.fraction.empty()) {
            return bad(text, "needs a unit when it has a fraction (e.g. 1.5ms)");
        }
    } else {
        scale = rtcore::duration_unit_ns(parts.unit);
        if (scale == 0) {
            return bad(text, rule);
        }
    }
    const auto whole = to_i64(parts.whole);
    if (!whole || *whole > i64_max / scale) {
        return bad(text, "is too long (over 292 years)");
    }
    std::int64_t total = *whole * scale;
    // The fraction, exactly: digits * scale / 10^len must be a whole ns.
    std::int64_t num = 0;
    std::int64_t den = 1;
    for (const char c : parts.fraction) {
        if (den > i64_max / 10 / scale) {
            return bad(text, "has more fraction digits than ns resolution allows");
        }
        num = num * 10 + (c - '0');
        den *= 10;
    }
    if (num != 0) {
        if ((num * scale) % den != 0) {
            return bad(text, "is not a whole number of nanoseconds");
        }
        const std::int64_t add = num * scale / den;
        if (total > i64_max - add) {
            return bad(text, "is too long (over 292 years)");
        }
        total += add;
    }
    return parsed_ns{total, {}};
}

parsed_ns parse_time_ns(std::string_view text, std::int64_t now_ns) {
    if (text == "now") {
        return parsed_ns{now_ns, {}};
    }
    if (!text.empty() && text[0] == '+') {
        auto d = parse_duration_ns(text.substr(1));
        if (!d.value) {
            return bad(text, "is not now+duration: " + d.error);
        }
        if (*d.value > i64_max - now_ns) {
            return bad(text, "is too far in the future");
        }
        return parsed_ns{now_ns + *d.value, {}};
    }
    bool all_digits = !text.empty();
    for (const char c : text) {
        all_digits = all_digits && is_digit(c);
    }
    if (all_digits) {
        const auto v = to_i64(text);
        if (!v) {
            return bad(text, "does not fit in int64 ns");
        }
        return parsed_ns{*v, {}};
    }
    // YYYY-MM-DDTHH:MM:SS[.fff...]Z
    constexpr std::string_view rule =
        "is not a time: use now, +DURATION, ns since the epoch, or "
        "YYYY-MM-DDTHH:MM:SS[.fraction]Z (UTC)";
    if (text.size() < 20 || text.back() != 'Z') {
        return bad(text, rule);
    }
    const std::string_view shape = "dddd-dd-ddTdd:dd:dd";
    for (std::size_t k = 0; k < shape.size(); ++k) {
        const bool ok = shape[k] == 'd' ? is_digit(text[k]) : text[k] == shape[k];
        if (!ok) {
            return bad(text, rule);
        }
    }
    const auto num = [&](std::size_t at, std::size_t len) {
        return static_cast<int>(*to_i64(text.substr(at, len)));
    };
    tm t{};
    t.tm_year = num(0, 4) - 1900;
    t.tm_mon = num(5, 2) - 1;
    t.tm_mday = num(8, 2);
    t.tm_hour = num(11, 2);
    t.tm_min = num(14, 2);
    t.tm_sec = num(17, 2);
    if (t.tm_mon > 11 || t.tm_mday < 1 || t.tm_mday > 31 || t.tm_hour > 23 || t.tm_min > 59 ||
        t.tm_sec > 60) {
        return bad(text, "has a field out of range");
    }
    const tm asked = t;
    const time_t secs = ::timegm(&t);
    if (t.tm_mday != asked.tm_mday || t.tm_mon != asked.tm_mon) {
        return bad(text, "is not a calendar date");
    }
    std::int64_t frac_ns = 0;
    std::string_view rest = text.substr(19, text.size() - 20);
    if (!rest.empty()) {
        if (rest[0] != '.' || rest.size() < 2 || rest.size() > 10) {
            return bad(text, rule);
        }
        std::int64_t scale = 100'000'000;
        for (const char c : rest.substr(1)) {
            if (!is_digit(c)) {
                return bad(text, rule);
            }
            frac_ns += (c - '0') * scale;
            scale /= 10;
        }
    }
    if (secs < 0) {
        return bad(text, "is before 1970");
    }
    return parsed_ns{static_cast<std::int64_t>(secs) * ns_per_s + frac_ns, {}};
}

std::string format_time_ns(std::int64_t t_ns) {
    std::int64_t secs = t_ns / ns_per_s;
    std::int64_t rem = t_ns % ns_per_s;
    if (rem < 0) {
        rem += ns_per_s;
        --secs;
    }
    const time_t tt = static_cast<time_t>(secs);
    tm t{};
    if (::gmtime_r(&tt, &t) == nullptr) {
        return std::to_string(t_ns) + "ns";
    }
    std::array<char, 64> buf{};
    std::snprintf(buf.data(), buf.size(), "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ",
                  t.tm_year + 1900, t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec,
                  static_cast<long long>(rem / 1000));
    return buf.data();
}

std::string format_duration_ns(std::int64_t d_ns) {
    if (d_ns < 0) {
        if (d_ns == std::numeric_limits<std::int64_t>::min()) {
            return "-" + std::to_string(d_ns) + "ns";
        }
        return "-" + format_duration_ns(-d_ns);
    }
    // Minutes and hours as h/m/s components.
    if (d_ns >= 60 * ns_per_s) {
        const std::int64_t h = d_ns / (3600 * ns_per_s);
        const std::int64_t m = d_ns / (60 * ns_per_s) % 60;
        const std::int64_t s_ns = d_ns % (60 * ns_per_s);
        std::string out;
        if (h > 0) {
            out += std::to_string(h) + "h";
        }
        if (m > 0) {
            out += std::to_string(m) + "m";
        }
        if (s_ns > 0) {
            out += format_duration_ns(s_ns);
        }
        return out;
    }
    struct step {
        std::int64_t scale;
        const char* unit;
    };
    constexpr std::array<step, 4> steps{{{ns_per_s, "s"}, {1'000'000, "ms"}, {1'000, "us"}, {1, "ns"}}};
    for (const auto& st : steps) {
        if (d_ns >= st.scale || st.scale == 1) {
            const std::int64_t whole = d_ns / st.scale;
            // Three decimals at most, trailing zeros trimmed.
            const std::int64_t frac = (d_ns % st.scale) * 1000 / st.scale;
            std::string out = std::to_string(whole);
            if (frac != 0) {
                std::array<char, 24> buf{};
                std::snprintf(buf.data(), buf.size(), ".%03lld", static_cast<long long>(frac));
                std::string f = buf.data();
                while (f.back() == '0') {
                    f.pop_back();
                }
                out += f;
            }
            return out + st.unit;
        }
    }
    return std::to_string(d_ns) + "ns";
}

}  // namespace qrtctl
