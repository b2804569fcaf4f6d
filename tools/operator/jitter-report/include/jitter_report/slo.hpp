#pragma once
// --slo parsing and checking.
//
//   p99=10us,max=100us       every primary series must have p99 <= 10 us
//                            and max <= 100 us
// Keys: p50 p95 p99 p99.9 (or p999) max mean stddev.  Values need a unit:
// ns, us (or µs), ms, s; decimals allowed ("2.5us").  A key given twice, an
// unknown key, a value without a unit or <= 0 is an error naming the term.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "jitter_report/report.hpp"
#include "rtcore/error.hpp"

namespace qrt::jitter {

struct slo_target {
    std::string stat;  // canonical: p50 p95 p99 p99.9 max mean stddev
    std::int64_t limit_ns = 0;
    bool operator==(const slo_target&) const = default;
};

struct slo_spec {
    std::vector<slo_target> targets;  // in the order given
    // "p99=10us,max=100us" (canonical keys, values in the shortest exact unit)
    std::string to_string() const;
};

rtcore::result<slo_spec> parse_slo(std::string_view text);

// "10us", "1.5ms", "250ns", "2s" (also "10 us"); strict: nothing may follow
// the unit.  allow_minutes adds "m" and "min" (for --duration).
rtcore::result<std::int64_t> parse_duration_ns(std::string_view text, bool allow_minutes = false);

// "950ns", "4.21us", "12.1us", "1.23ms", "2.50s": at most 7 characters for
// values below 1000 s.
std::string format_ns(double ns);
// Exact, for canonical forms: "10us", "1500ns", "2s".
std::string format_ns_exact(std::int64_t ns);

// The value of `stat` in a series' stats.
double stat_value(const latency_stats& s, std::string_view stat);

// Checks every target against every primary series that has samples.  Fails
// (an error, exit 2) when no primary series has any sample.
rtcore::result<slo_verdict> check_slo(const slo_spec& spec, const report& r);

}  // namespace qrt::jitter
