#pragma once
// The housekeeping side of probe 3 (what the agent knows, it says): every outlier the ring
// buffer delivers is
//   - kept in a ring of the last `keep` outliers (telemetry.outliers,
//     qrt-jitter-report against the agent);
//   - counted by CPU and cause kind (qrt_probe_outliers_total);
//   - logged, rate-limited (at most one line per log_interval, then a count
//     of the suppressed ones);
//   - pushed to events.subscribe subscribers as an `outlier` event, at most
//     events_per_s per second; the next event that goes out says how many
//     were not pushed (data.suppressed), and the total is a metric.
// Bounded: memory is the ring; nothing else grows.  Single-threaded (the
// event loop).  Pure data in and out, so it is tested without BPF.

#ifdef QRT_HAVE_BPF

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "qrt/telemetry.hpp"
#include "qrt_bpf/outlier.hpp"

namespace qrt {

struct outlier_feed_options {
    std::size_t keep = 64;               // the ring of recent outliers
    std::uint32_t events_per_s = 20;     // outlier events pushed per second, at most
    std::int64_t log_interval_ns = 10'000'000'000;  // one log line per 10 s, at most
    std::uint64_t threshold_ns = 0;      // probes.outlier_threshold_ns (reported)
};

class outlier_feed {
public:
    explicit outlier_feed(outlier_feed_options o) : _opt(o) {}

    // One outlier from the probe.  qpu: the QPU whose dispatch thread it is
    // ("" when unknown); realtime_ns/monotonic_ns: the clocks now, to date
    // the switch on CLOCK_REALTIME.  Returns the event data to publish, or
    // nullopt when over the event rate.  Logs (rate-limited).
    std::optional<nlohmann::json> add(const qrt_bpf::outlier& o, const std::string& qpu,
                                      std::int64_t realtime_ns, std::int64_t monotonic_ns);

    // The ring, newest first, at most limit entries.
    nlohmann::json recent_json(std::size_t limit) const;
    // telemetry.outliers: {threshold_ns, total, kept, keep, suppressed_events,
    // dropped, duplicates_ignored, outliers: [...]}.
    nlohmann::json to_json(std::size_t limit, std::uint64_t dropped) const;
    void add_metrics(telemetry::snapshot& s, std::uint64_t dropped) const;

    std::uint64_t total() const noexcept { return _total; }
    std::uint64_t duplicates_ignored() const noexcept { return _duplicates; }
    std::size_t kept() const noexcept { return _ring.size(); }
    std::uint64_t suppressed_events() const noexcept { return _suppressed_total; }
    const outlier_feed_options& options() const noexcept { return _opt; }

private:
    outlier_feed_options _opt;
    std::deque<nlohmann::json> _ring;  // newest at the back
    std::map<std::tuple<unsigned, std::string>, std::uint64_t> _by_cpu_cause;
    std::uint64_t _total = 0;
    std::uint64_t _duplicates = 0;  // the same switch delivered again (ignored)
    std::uint64_t _max_latency_ns = 0;
    // Event rate: a one-second window.
    std::int64_t _event_window_start_ns = 0;
    std::uint32_t _events_in_window = 0;
    std::uint64_t _suppressed_since_event = 0;
    std::uint64_t _suppressed_total = 0;
    // Log rate.
    std::int64_t _last_log_ns = 0;
    bool _logged = false;
    std::uint64_t _unlogged = 0;
};

}  // namespace qrt

#endif  // QRT_HAVE_BPF
