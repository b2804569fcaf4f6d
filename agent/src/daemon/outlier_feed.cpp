// The housekeeping side of probe 3: see outlier_feed.hpp.

#ifdef QRT_HAVE_BPF

#include "outlier_feed.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "qrt/log.hpp"

namespace qrt {

using json = nlohmann::json;

namespace {

constexpr std::int64_t k_sec = 1'000'000'000;

json cause_json(const qrt_bpf::outlier_cause& c, std::uint64_t wakeup_ns) {
    return {{"kind", std::string(qrt_bpf::to_string(c.kind))},
            {"source", c.source()},
            {"id", c.id},
            {"name", c.name},
            // Start relative to the wakeup (negative: it began before).
            {"start_offset_ns", static_cast<std::int64_t>(c.start_ns) - static_cast<std::int64_t>(wakeup_ns)},
            {"duration_ns", c.duration_ns},
            {"overlap_ns", c.overlap_ns}};
}

}  // namespace

std::optional<json> outlier_feed::add(const qrt_bpf::outlier& o, const std::string& qpu,
                                      std::int64_t realtime_ns, std::int64_t monotonic_ns) {
    // One switch is one outlier: the same dispatch thread switched in on the
    // same CPU at the same instant, delivered again, is counted once (the
    // report would otherwise list it twice).  Deliveries are in order, so
    // the newest few entries are the ones to compare with.
    std::size_t looked = 0;
    for (auto it = _ring.rbegin(); it != _ring.rend() && looked < 8; ++it, ++looked) {
        if ((*it)["switch_ns"] == o.switch_ns && (*it)["tid"] == o.tid && (*it)["cpu"] == o.cpu) {
            ++_duplicates;
            return std::nullopt;
        }
    }
    ++_total;
    _max_latency_ns = std::max(_max_latency_ns, o.latency_ns);
    const auto main = o.main_cause();
    const std::string cause_kind = main ? std::string(qrt_bpf::to_string(main->kind)) : "none";
    ++_by_cpu_cause[{o.cpu, cause_kind}];

    json causes = json::array();
    for (const auto& c : o.causes) {
        causes.push_back(cause_json(c, o.wakeup_ns));
    }
    // The switch on CLOCK_REALTIME: now minus how long ago it was.
    const std::int64_t ago_ns = std::max<std::int64_t>(0, monotonic_ns - static_cast<std::int64_t>(o.switch_ns));
    json e{{"qpu", qpu},
           {"cpu", o.cpu},
           {"tid", o.tid},
           {"comm", o.comm},
           {"waker_cpu", o.waker_cpu},
           {"latency_ns", o.latency_ns},
           {"threshold_ns", _opt.threshold_ns},
           {"at_ns", realtime_ns - ago_ns},
           {"switch_ns", o.switch_ns},
           {"cause", main ? cause_json(*main, o.wakeup_ns) : json(nullptr)},
           {"causes", std::move(causes)},
           {"summary", o.summary()}};
    _ring.push_back(e);
    while (_ring.size() > _opt.keep) {
        _ring.pop_front();
    }

    // Log: one line per interval, with the count of the ones not logged.
    if (!_logged || monotonic_ns - _last_log_ns >= _opt.log_interval_ns) {
        if (_unlogged > 0) {
            log::warn("probes", "outlier: {} ({} more outliers since the last line)", o.summary(), _unlogged);
        } else {
            log::warn("probes", "outlier: {}", o.summary());
        }
        _logged = true;
        _last_log_ns = monotonic_ns;
        _unlogged = 0;
    } else {
        ++_unlogged;
    }

    // Event rate: events_per_s in each one-second window.
    if (monotonic_ns - _event_window_start_ns >= k_sec) {
        _event_window_start_ns = monotonic_ns;
        _events_in_window = 0;
    }
    if (_events_in_window >= _opt.events_per_s) {
        ++_suppressed_since_event;
        ++_suppressed_total;
        return std::nullopt;
    }
    ++_events_in_window;
    e["suppressed"] = std::exchange(_suppressed_since_event, 0);
    return e;
}

json outlier_feed::recent_json(std::size_t limit) const {
    json out = json::array();
    for (auto it = _ring.rbegin(); it != _ring.rend() && out.size() < limit; ++it) {
        out.push_back(*it);
    }
    return out;
}

json outlier_feed::to_json(std::size_t limit, std::uint64_t dropped) const {
    return {{"threshold_ns", _opt.threshold_ns},
            {"total", _total},
            {"keep", _opt.keep},
            {"kept", _ring.size()},
            {"max_latency_ns", _max_latency_ns},
            {"events_per_s", _opt.events_per_s},
            {"suppressed_events", _suppressed_total},
            {"dropped", dropped},
            {"duplicates_ignored", _duplicates},
            {"outliers", recent_json(limit)}};
}

void outlier_feed::add_metrics(telemetry::snapshot& s, std::uint64_t dropped) const {
    for (const auto& [key, n] : _by_cpu_cause) {
        const auto& [cpu, cause] = key;
        s.add_counter("qrt_probe_outliers_total",
                      "eBPF: dispatch wakeups over probes.outlier_threshold_ns, by CPU and kind of main cause",
                      {{"cpu", std::to_string(cpu)}, {"cause", cause}}, n);
    }
    s.add_counter("qrt_probe_outlier_events_dropped_total",
                  "eBPF: outliers lost because the ring buffer was full", {}, dropped);
    s.add_counter("qrt_probe_outlier_events_suppressed_total",
                  "outlier events not pushed to subscribers (over the event rate)", {}, _suppressed_total);
    s.add_gauge("qrt_probe_outlier_max_latency_seconds", "eBPF: the largest outlier latency seen", {},
                static_cast<double>(_max_latency_ns) / 1e9);
}

}  // namespace qrt

#endif  // QRT_HAVE_BPF
