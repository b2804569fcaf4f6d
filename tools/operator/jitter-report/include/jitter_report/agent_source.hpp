#pragma once
// Agent mode: one JSON-RPC exchange with qrtd over its UNIX socket
// (telemetry.snapshot, then agent.status), turned into a report.
//
// The metrics read (the contract with the daemon; see the man page, AGENT
// METRICS):
//   histograms  qrt_dispatch_lateness_seconds{qpu[,cpu]}        primary
//               qrt_dispatch_wakeup_latency_seconds{qpu[,cpu]}
//               qrt_dispatch_arrival_lateness_seconds{qpu[,cpu]}
//               qrt_dispatch_arm_seconds{qpu[,cpu]}               wire 2
//               qrt_dispatch_arm_cost_seconds{qpu[,cpu],stage}    wire 2
//               qrt_dispatch_start_lateness_seconds{qpu[,cpu]}    wire 2
//               qrt_probe_wakeup_latency_seconds{cpu|qpu}
//   counters    qrt_probe_intrusions_total{cpu,kind,source}
//   counters or gauges
//               qrt_probe_intrusion_seconds_total{cpu,kind,source}
//               qrt_probe_intrusion_max_seconds{cpu,kind,source}
//   histograms' "recent": {"1m": {...}, "1h": {...}} (the recent windows)
//   telemetry.outliers  the last outliers with their causes (optional:
//               its absence is a note)
//   agent.status "probes": "available ..." | "unavailable (<reason>)"

#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "jitter_report/report.hpp"
#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"

namespace qrt::jitter {

struct agent_options {
    std::string socket_path = "/run/qrtd/qrtd.sock";
    std::chrono::milliseconds timeout{5000};
    // A snapshot older than this (by its taken_ns) is stale: an error.
    std::chrono::seconds max_age{60};
    rtcore::cpu_set cpus;  // empty: every CPU the agent reports
};

// A JSON-RPC call over a fresh connection; the error names the socket and
// says whether nobody is there (missing), nobody listens (stale), access is
// denied, or the agent did not answer in time.
rtcore::result<nlohmann::json> agent_call(const agent_options& opt, const std::string& method,
                                          const nlohmann::json& params = nlohmann::json::object());

// telemetry.snapshot (+ agent.status) into a report.  now_ns: CLOCK_REALTIME.
rtcore::result<report> report_from_snapshot(const nlohmann::json& snapshot,
                                            const nlohmann::json& status,
                                            const agent_options& opt, std::int64_t now_ns);

// telemetry.outliers ({total, threshold_ns, outliers: [...]}) into
// r.outliers (largest latency first) and a note.
void add_agent_outliers(const nlohmann::json& outliers, report& r);

rtcore::result<report> read_agent(const agent_options& opt);

}  // namespace qrt::jitter
