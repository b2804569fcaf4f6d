#include "jitter_report/slo.hpp"

#include <array>
#include <cmath>
#include <initializer_list>
#include <utility>

#include <fmt/format.h>

#include "rtcore/duration_parse.hpp"
#include "rtcore/text.hpp"

namespace qrt::jitter {

namespace {

using rtcore::trim;

struct stat_key {
    std::string_view key;
    std::string_view canonical;
};

constexpr std::array<stat_key, 8> stat_keys{{
    {"p50", "p50"},
    {"p95", "p95"},
    {"p99", "p99"},
    {"p99.9", "p99.9"},
    {"p999", "p99.9"},
    {"max", "max"},
    {"mean", "mean"},
    {"stddev", "stddev"},
}};

std::string known_stats() {
    return "p50, p95, p99, p99.9, max, mean, stddev";
}

}  // namespace

rtcore::result<std::int64_t> parse_duration_ns(std::string_view text, bool allow_minutes) {
    const std::string_view t = trim(text);
    const std::string shown(text);
    if (t.empty()) {
        return rtcore::error::invalid("empty duration (expected a number and a unit, e.g. 10us)");
    }
    const rtcore::duration_text parts = rtcore::split_duration(t);
    if (parts.digits() > 18) {
        return rtcore::error::invalid(fmt::format("duration '{}': too many digits", shown));
    }
    if (parts.digits() == 0) {
        return rtcore::error::invalid(
            fmt::format("duration '{}': expected a number first (e.g. 10us)", shown));
    }
    if (parts.point && parts.fraction.empty()) {
        return rtcore::error::invalid(fmt::format("duration '{}': no digit after '.'", shown));
    }
    const std::string_view unit = trim(parts.unit);
    if (unit.empty()) {
        return rtcore::error::invalid(fmt::format(
            "duration '{}': missing unit (ns, us, ms, s{})", shown, allow_minutes ? ", m" : ""));
    }
    // Seconds at most, minutes when asked; never hours.
    const std::int64_t unit_ns = rtcore::duration_unit_ns(unit);
    if (unit_ns == 0 || unit_ns > (allow_minutes ? rtcore::ns_per_minute : 1'000'000'000)) {
        return rtcore::error::invalid(fmt::format("duration '{}': unknown unit '{}' (ns, us, ms, s{})",
                                                  shown, unit, allow_minutes ? ", m" : ""));
    }
    std::uint64_t mantissa = 0;  // every digit, the point dropped
    for (const std::string_view digits : {parts.whole, parts.fraction}) {
        for (const char c : digits) {
            mantissa = mantissa * 10 + static_cast<std::uint64_t>(c - '0');
        }
    }
    const long double v = static_cast<long double>(mantissa) * static_cast<long double>(unit_ns) /
                          std::pow(10.0L, static_cast<long double>(parts.fraction.size()));
    if (v > 1e18L) {
        return rtcore::error::invalid(fmt::format("duration '{}': too large", shown));
    }
    return static_cast<std::int64_t>(std::llround(v));
}

std::string format_ns(double ns) {
    if (!std::isfinite(ns)) {
        return "?";
    }
    const double a = std::fabs(ns);
    if (a < 1'000.0) {
        return fmt::format("{:.0f}ns", ns);
    }
    const auto scaled = [](double v, const char* unit) {
        const double av = std::fabs(v);
        if (av < 9.995) {
            return fmt::format("{:.2f}{}", v, unit);
        }
        if (av < 99.95) {
            return fmt::format("{:.1f}{}", v, unit);
        }
        return fmt::format("{:.0f}{}", v, unit);
    };
    if (a < 999'500.0) {
        return scaled(ns / 1e3, "us");
    }
    if (a < 999'500'000.0) {
        return scaled(ns / 1e6, "ms");
    }
    return scaled(ns / 1e9, "s");
}

std::string format_ns_exact(std::int64_t ns) {
    if (ns != 0 && ns % 1'000'000'000 == 0) {
        return fmt::format("{}s", ns / 1'000'000'000);
    }
    if (ns != 0 && ns % 1'000'000 == 0) {
        return fmt::format("{}ms", ns / 1'000'000);
    }
    if (ns != 0 && ns % 1'000 == 0) {
        return fmt::format("{}us", ns / 1'000);
    }
    return fmt::format("{}ns", ns);
}

std::string slo_spec::to_string() const {
    std::string out;
    for (const auto& t : targets) {
        if (!out.empty()) {
            out += ',';
        }
        out += fmt::format("{}={}", t.stat, format_ns_exact(t.limit_ns));
    }
    return out;
}

rtcore::result<slo_spec> parse_slo(std::string_view text) {
    slo_spec spec;
    if (trim(text).empty()) {
        return rtcore::error::invalid(
            "--slo: empty (expected e.g. p99=10us,max=100us; keys: " + known_stats() + ")");
    }
    std::size_t start = 0;
    while (start <= text.size()) {
        const std::size_t comma = text.find(',', start);
        const std::size_t end = comma == std::string_view::npos ? text.size() : comma;
        const std::string_view term = trim(text.substr(start, end - start));
        if (term.empty()) {
            return rtcore::error::invalid(
                fmt::format("--slo '{}': empty term at offset {}", text, start));
        }
        const std::size_t eq = term.find('=');
        if (eq == std::string_view::npos) {
            return rtcore::error::invalid(
                fmt::format("--slo term '{}': expected <stat>=<limit>, e.g. p99=10us", term));
        }
        const std::string_view key = trim(term.substr(0, eq));
        const std::string_view value = trim(term.substr(eq + 1));
        std::string_view canonical;
        for (const auto& k : stat_keys) {
            if (k.key == key) {
                canonical = k.canonical;
            }
        }
        if (canonical.empty()) {
            return rtcore::error::invalid(fmt::format("--slo term '{}': unknown statistic '{}' (known: {})",
                                                      term, key, known_stats()));
        }
        for (const auto& t : spec.targets) {
            if (t.stat == canonical) {
                return rtcore::error::invalid(
                    fmt::format("--slo term '{}': {} is given twice", term, canonical));
            }
        }
        auto ns = parse_duration_ns(value);
        if (!ns) {
            return rtcore::error::invalid(fmt::format("--slo term '{}': {}", term, ns.err().message));
        }
        if (*ns <= 0) {
            return rtcore::error::invalid(
                fmt::format("--slo term '{}': the limit must be greater than 0", term));
        }
        spec.targets.push_back({std::string(canonical), *ns});
        if (comma == std::string_view::npos) {
            break;
        }
        start = comma + 1;
    }
    return spec;
}

double stat_value(const latency_stats& s, std::string_view stat) {
    if (stat == "p50") {
        return static_cast<double>(s.p50_ns);
    }
    if (stat == "p95") {
        return static_cast<double>(s.p95_ns);
    }
    if (stat == "p99") {
        return static_cast<double>(s.p99_ns);
    }
    if (stat == "p99.9") {
        return static_cast<double>(s.p999_ns);
    }
    if (stat == "max") {
        return static_cast<double>(s.max_ns);
    }
    if (stat == "mean") {
        return s.mean_ns;
    }
    if (stat == "stddev") {
        return s.stddev_ns;
    }
    return 0.0;
}

rtcore::result<slo_verdict> check_slo(const slo_spec& spec, const report& r) {
    slo_verdict v;
    v.spec = spec.to_string();
    v.met = true;
    for (const auto& s : r.series_list) {
        if (!s.primary || s.stats.count == 0) {
            continue;
        }
        for (const auto& t : spec.targets) {
            slo_check c;
            c.series = s.name;
            c.metric = s.metric;
            c.stat = t.stat;
            c.limit_ns = t.limit_ns;
            c.measured_ns = stat_value(s.stats, t.stat);
            c.met = c.measured_ns <= static_cast<double>(t.limit_ns);
            v.met = v.met && c.met;
            v.checks.push_back(std::move(c));
        }
    }
    if (v.checks.empty()) {
        return rtcore::error::invalid(
            "--slo: nothing to check: the report has no samples of a primary series "
            "(timer lateness or dispatch lateness)");
    }
    return v;
}

}  // namespace qrt::jitter
