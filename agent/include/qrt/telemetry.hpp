#pragma once
// One telemetry snapshot, two renderings: JSON (telemetry.snapshot) and the
// Prometheus text exposition format 0.0.4 (the `metrics` method and the
// node_exporter textfile).
//
// Conventions (Prometheus naming): names carry base units and counters end in
// _total; the renderer enforces neither, but validates metric and label
// names and escapes label values.  Histograms are rtcore::histogram of
// nanoseconds, exposed in seconds: cumulative `le` buckets at fixed 1-2-5
// boundaries (each snapped to a bucket edge of the log-linear histogram so
// every count is exact), then `+Inf`, `_sum` and `_count`.  Metrics sharing a
// name form one family with one HELP/TYPE pair, whatever their labels.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "rtcore/error.hpp"
#include "rtcore/histogram.hpp"

namespace qrt::telemetry {

using labels = std::vector<std::pair<std::string, std::string>>;

struct counter {
    std::string name;  // e.g. qrt_rpc_requests_total
    std::string help;
    labels label_set;
    std::uint64_t value = 0;
    // A counter of a real quantity (seconds): rendered from real_value.
    bool is_real = false;
    double real_value = 0.0;
};

struct gauge {
    std::string name;  // e.g. qrt_rpc_connections
    std::string help;
    labels label_set;
    double value = 0.0;
};

// The samples of one histogram recorded in a recent window ("1m", "1h"):
// the lifetime histogram now minus its checkpoint of span_ns ago.
struct window_view {
    std::string window;      // "1m", "1h"
    std::int64_t span_ns = 0;  // what the view covers (>= the window once the agent ran that long)
    std::shared_ptr<const rtcore::histogram> ns;
};

struct histogram {
    std::string name;  // e.g. qrt_dispatch_lateness_seconds
    std::string help;
    labels label_set;
    // Samples in nanoseconds.  shared so a snapshot can be copied cheaply
    // (one rtcore histogram is 29 KiB).
    std::shared_ptr<const rtcore::histogram> ns;
    // Recent windows (recent_windows::annotate); empty: lifetime only.
    std::vector<window_view> recent;
};

struct snapshot {
    std::int64_t taken_ns = 0;  // CLOCK_REALTIME ns since the epoch
    std::vector<counter> counters;
    std::vector<gauge> gauges;
    std::vector<histogram> histograms;

    void add_counter(std::string name, std::string help, labels l, std::uint64_t v);
    // A monotonic real-valued total, e.g. qrt_probe_intrusion_seconds_total.
    void add_real_counter(std::string name, std::string help, labels l, double v);
    void add_gauge(std::string name, std::string help, labels l, double v);
    void add_histogram(std::string name, std::string help, labels l, const rtcore::histogram& h);
    // Appends every metric of `other` (taken_ns keeps the later one).
    void merge(snapshot other);
};

// Recent windows of every histogram, in bounded memory for months of running: the
// lifetime figures stay, and next to them "the last minute" and "the last
// hour" that operators can compare.  Each window keeps a ring of slices+1
// checkpoints of the lifetime histogram, one every length/slices (a
// checkpoint stores only the non-empty buckets); the window's view is the
// histogram now minus the newest checkpoint at least `length` old (or the
// oldest one, while the agent has not run that long: span_ns says what it
// covers).  So a window forgets samples older than length + length/slices,
// exact to the bucket (0.78 %); min/max of a view are bucket midpoints.
// A lifetime histogram that went back (a reset) restarts its windows.
// At most max_series series are followed; a series not seen for the
// longest window is dropped.  observe() is called from a housekeeping timer
// at least every length/slices of the shortest window; time is
// CLOCK_MONOTONIC (steps of the realtime clock do not move windows).
struct recent_window_spec {
    std::string name;            // "1m"
    std::int64_t length_ns = 0;  // 60 s
    std::size_t slices = 6;      // a checkpoint every 10 s
};

class recent_windows {
public:
    // "1m" (6 slices of 10 s) and "1h" (6 slices of 10 min).
    static std::vector<recent_window_spec> default_specs();
    static constexpr std::size_t default_max_series = 256;

    explicit recent_windows(std::vector<recent_window_spec> specs = default_specs(),
                            std::size_t max_series = default_max_series);
    ~recent_windows();
    recent_windows(recent_windows&&) noexcept;
    recent_windows& operator=(recent_windows&&) noexcept;

    // The period observe() must run at (the shortest slice).
    std::int64_t tick_ns() const noexcept;
    // Checkpoints every histogram of s whose slice is due.
    void observe(const snapshot& s, std::int64_t now_ns);
    // Attaches the recent views to every observed histogram of s.  A
    // histogram not seen before is followed from now on (its views are empty
    // until samples come).
    void annotate(snapshot& s, std::int64_t now_ns);
    std::size_t series() const noexcept;
    const std::vector<recent_window_spec>& specs() const noexcept { return _specs; }

private:
    struct state;
    std::vector<recent_window_spec> _specs;
    std::size_t _max_series;
    std::unique_ptr<state> _state;
};

// The name of the gauge holding a histogram's recent-window figures:
// qrt_dispatch_lateness_seconds -> qrt_dispatch_lateness_recent_seconds
// (labels window and stat = p50|p95|p99|p999|max|mean), and of the one
// holding their sample counts (..._recent_samples, label window).
std::string recent_metric_name(std::string_view histogram_name);
std::string recent_samples_metric_name(std::string_view histogram_name);

// The `le` boundaries (ns) used for every histogram: 1-2-5 steps from 1 µs
// to 10 s, each snapped up to a bucket edge of rtcore::histogram.
const std::vector<std::int64_t>& prometheus_bounds_ns();

bool valid_metric_name(std::string_view name) noexcept;
bool valid_label_name(std::string_view name) noexcept;

// {"taken_ns":..,"counters":[{name,help,labels:{},value}],"gauges":[..],
//  "histograms":[{name,help,labels,count,min_ns,max_ns,mean_ns,stddev_ns,
//                 p50_ns,p95_ns,p99_ns,p999_ns,negative_count,
//                 buckets:[{le_ns,count}] (cumulative, non-empty steps),
//                 recent:{"1m":{span_ns,count,min_ns,..,p999_ns},"1h":{..}}}]}
nlohmann::json to_json(const snapshot& s);

// Prometheus text exposition; fails naming the metric when a metric or label
// name is invalid, or when one name is used with two different types.
rtcore::result<std::string> to_prometheus(const snapshot& s);

// node_exporter textfile: rtcore::write_file_atomically (write
// <path>.tmp.<pid>, fsync, rename over path, fsync the directory).
rtcore::status write_textfile_atomically(const std::string& path, std::string_view text);

}  // namespace qrt::telemetry
