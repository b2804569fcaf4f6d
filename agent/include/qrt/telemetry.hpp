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

#include <cstdint>
#include <memory>
#include <string>
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
};

struct gauge {
    std::string name;  // e.g. qrt_rpc_connections
    std::string help;
    labels label_set;
    double value = 0.0;
};

struct histogram {
    std::string name;  // e.g. qrt_dispatch_lateness_seconds
    std::string help;
    labels label_set;
    // Samples in nanoseconds.  shared so a snapshot can be copied cheaply
    // (one rtcore histogram is 29 KiB).
    std::shared_ptr<const rtcore::histogram> ns;
};

struct snapshot {
    std::int64_t taken_ns = 0;  // CLOCK_REALTIME ns since the epoch
    std::vector<counter> counters;
    std::vector<gauge> gauges;
    std::vector<histogram> histograms;

    void add_counter(std::string name, std::string help, labels l, std::uint64_t v);
    void add_gauge(std::string name, std::string help, labels l, double v);
    void add_histogram(std::string name, std::string help, labels l, const rtcore::histogram& h);
    // Appends every metric of `other` (taken_ns keeps the later one).
    void merge(snapshot other);
};

// The `le` boundaries (ns) used for every histogram: 1-2-5 steps from 1 µs
// to 10 s, each snapped up to a bucket edge of rtcore::histogram.
const std::vector<std::int64_t>& prometheus_bounds_ns();

bool valid_metric_name(std::string_view name) noexcept;
bool valid_label_name(std::string_view name) noexcept;

// {"taken_ns":..,"counters":[{name,help,labels:{},value}],"gauges":[..],
//  "histograms":[{name,help,labels,count,min_ns,max_ns,mean_ns,stddev_ns,
//                 p50_ns,p95_ns,p99_ns,p999_ns,negative_count,
//                 buckets:[{le_ns,count}] (cumulative, non-empty steps)}]}
nlohmann::json to_json(const snapshot& s);

// Prometheus text exposition; fails naming the metric when a metric or label
// name is invalid, or when one name is used with two different types.
rtcore::result<std::string> to_prometheus(const snapshot& s);

// node_exporter textfile: rtcore::write_file_atomically (write
// <path>.tmp.<pid>, fsync, rename over path, fsync the directory).
rtcore::status write_textfile_atomically(const std::string& path, std::string_view text);

}  // namespace qrt::telemetry
