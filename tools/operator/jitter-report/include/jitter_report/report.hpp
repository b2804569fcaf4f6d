#pragma once
// The one report of qrt-jitter-report.  Every source (the agent's
// telemetry.snapshot, the standalone timer loop) fills this structure; every
// rendering (text, JSON, SVG) and every check (SLO, baseline) reads it.
// Nothing renders from a source directly.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rtcore/histogram.hpp"

namespace qrt::jitter {

// The JSON schema: bump schema_version on any change a reader could notice
// (a field removed, renamed or re-typed); adding a field does not bump it.
inline constexpr const char* schema_name = "qrt-jitter-report";
inline constexpr int schema_version = 1;

// One histogram bin: samples in (previous le_ns, le_ns]; the first bin
// starts at 0.
struct bin {
    std::int64_t le_ns = 0;
    std::uint64_t count = 0;
    bool operator==(const bin&) const = default;
};

// rtcore's summary of a histogram (count, min, max, mean, stddev, p50, p95,
// p99, p99.9), and how many samples were measured early.
struct latency_stats : rtcore::histogram_summary {
    std::uint64_t negative_count = 0;  // samples measured early, recorded as 0
};

// The same distribution over a recent window only (agent mode: the agent's
// "1m" and "1h" next to its lifetime figures).
struct window_stats {
    std::string window;        // "1m", "1h"
    std::int64_t span_ns = 0;  // what the window covers (shorter while the agent is young)
    latency_stats stats;       // min/max: to the bucket
};

// One latency distribution of one QPU or CPU.
struct series {
    std::string scope;   // "qpu", "cpu" or "host"
    std::string name;    // "q0", "cpu1", "all"
    int cpu = -1;        // the CPU measured, -1 when unknown
    std::string metric;  // see metric_title(): timer_lateness, dispatch_lateness, ...
    bool primary = false;  // the series --slo is checked against
    latency_stats stats;
    std::vector<bin> bins;  // non-cumulative, increasing le_ns, empty bins omitted
    std::vector<window_stats> recent;  // shortest first; empty: lifetime only
};

// "timer lateness", "dispatch lateness", "wakeup latency (eBPF)", ... and
// the metric id itself for ids this version does not know.
std::string metric_title(const std::string& metric);

struct intrusion_row {
    unsigned cpu = 0;
    std::string kind;    // hardirq, softirq, task, local_timer
    std::string source;  // "irq 24 (virtio0-input.0)", "task kworker/1:1/123"
    std::uint64_t count = 0;
    std::uint64_t total_ns = 0;
    std::uint64_t max_ns = 0;
};

struct outlier_row {
    unsigned cpu = 0;
    std::uint32_t tid = 0;
    std::uint64_t latency_ns = 0;
    std::string main_cause;  // "" when the probe saw nothing on the CPU
    std::string summary;
    std::int64_t at_ns = 0;  // agent mode: CLOCK_REALTIME of the switch; 0 unknown
    std::string qpu;         // agent mode: the QPU of the dispatch CPU, "" unknown
};

struct run_info {
    std::string mode;          // "standalone" or "agent"
    std::int64_t taken_ns = 0;  // CLOCK_REALTIME ns since the epoch, end of the run
    std::int64_t duration_ns = 0;  // standalone: measured time; agent: 0
    // standalone
    std::string cpus;          // kernel list form, "1" or "0-1"
    std::int64_t interval_ns = 0;
    int priority = 0;
    std::string policy;        // "SCHED_FIFO" or "SCHED_OTHER"
    std::uint64_t overruns = 0;  // periods skipped because a wakeup came a whole interval late
    // agent
    std::string socket;
    std::string agent_version;
};

struct host_info {
    std::string hostname;
    std::string kernel;        // uname -r
    bool preempt_rt = false;
    double steal_percent = -1.0;  // over the run; -1 when unknown
};

struct probe_info {
    bool available = false;
    std::string status;  // "available (tp_btf)" or "unavailable (<reason>)"
};

// One SLO target checked against one series.
struct slo_check {
    std::string series;  // "cpu1", "q0"
    std::string metric;
    std::string stat;    // p50, p95, p99, p99.9, max, mean, stddev
    std::int64_t limit_ns = 0;
    double measured_ns = 0.0;
    bool met = false;
};

struct slo_verdict {
    std::string spec;  // as given, normalised ("p99=10us,max=100us")
    bool met = false;
    std::vector<slo_check> checks;
};

// One percentile of one series, now against the baseline run.
struct comparison_row {
    std::string scope;
    std::string name;
    std::string metric;
    std::string stat;  // p50, p95, p99, p99.9, max, stddev
    double baseline_ns = 0.0;
    double current_ns = 0.0;
    std::optional<double> ratio;  // current / baseline; none when baseline is 0
};

struct comparison {
    std::string file;
    std::string baseline_mode;
    std::int64_t baseline_taken_ns = 0;
    std::vector<comparison_row> rows;
    std::vector<std::string> only_in_baseline;  // "cpu cpu2 timer_lateness"
    std::vector<std::string> only_in_current;
};

struct report {
    std::string tool_version;
    run_info run;
    host_info host;
    probe_info probes;
    std::vector<series> series_list;
    std::vector<intrusion_row> intrusions;  // largest total_ns first
    std::vector<outlier_row> outliers;      // largest latency first
    std::vector<std::string> notes;         // what a reader must know (fallbacks, steal)
    std::optional<slo_verdict> slo;
    std::optional<comparison> baseline;
};

// Bin upper bounds used for every histogram this tool builds: 10 steps per
// decade (1, 1.25, 1.6, 2, 2.5, 3.2, 4, 5, 6.3, 8) from 100 ns to 10 s,
// each snapped up to a bucket edge of rtcore::histogram so counts are exact.
const std::vector<std::int64_t>& bin_bounds_ns();

// Stats and bins of a histogram.
latency_stats stats_of(const rtcore::histogram& h);
std::vector<bin> bins_of(const rtcore::histogram& h);

// Bins from cumulative (le_ns, count) steps as telemetry.snapshot gives them;
// samples above the last step go to a final bin at max_ns.
std::vector<bin> bins_from_cumulative(const std::vector<bin>& cumulative, std::uint64_t total,
                                      std::int64_t max_ns);

// The bins to draw (text and SVG): the series' bins with the empty bins of
// bin_bounds_ns() between the first and last put back, so the shape shows;
// merged pairwise until at most max_rows remain.
std::vector<bin> display_bins(const series& s, std::size_t max_rows);

}  // namespace qrt::jitter
