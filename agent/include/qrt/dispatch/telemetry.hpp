#pragma once
// Per-QPU dispatch telemetry: a plain snapshot the RPC layer renders as JSON
// (telemetry.snapshot) and Prometheus text (metrics).  Built on the
// housekeeping thread from the dispatcher's records; the RT thread only
// publishes the current lead.

#include <cstdint>

#include "rtcore/histogram.hpp"

namespace qrt::dispatch {

struct dispatch_counters {
    std::uint64_t submitted = 0;
    std::uint64_t on_time = 0;              // sent with lateness <= tolerance
    std::uint64_t late = 0;                 // sent, but lateness > tolerance (preempted after the check)
    std::uint64_t missed = 0;               // never sent: start passed beyond tolerance
    std::uint64_t failed = 0;               // all failures after or instead of sending (below)
    std::uint64_t out_of_window = 0;        // refused at T: would not fit the window
    std::uint64_t calibration_changed = 0;  // calibration guard refusals
    std::uint64_t endpoint_down = 0;
    std::uint64_t send_failed = 0;
    std::uint64_t endpoint_errors = 0;      // ERROR frames from the QPU
    std::uint64_t endpoint_timeouts = 0;    // no RESULT in time
    std::uint64_t endpoint_disconnects = 0;
    std::uint64_t endpoint_protocol_errors = 0;
    std::uint64_t completed = 0;            // RESULT attached
    std::uint64_t sent = 0;                 // written to a write-only endpoint (no result can come)
    std::uint64_t qpu_out_of_window = 0;    // RESULT/ERROR flagged out-of-window by the QPU
    std::uint64_t stray_frames = 0;         // RESULT/ERROR for no pending job (e.g. after a timeout)
    std::uint64_t reconnects = 0;
    std::uint64_t rejected_submits = 0;     // submit() refused (pool or ring full, bad job)
};

struct dispatch_telemetry {
    std::uint32_t qpu_index = 0;
    bool tuned = true;
    bool endpoint_up = false;
    std::int64_t lead_ns = 0;            // current spin lead
    std::int64_t lead_min_ns = 0;
    std::int64_t lead_max_ns = 0;
    std::uint64_t lead_capped = 0;       // dispatches whose lead the spin budget cut
    std::uint64_t spin_ns_total = 0;     // CPU time spent spinning before T
    double spin_ns_per_dispatch = 0.0;
    dispatch_counters counters;
    rtcore::histogram_summary dispatch_lateness;  // submit time - T (monotonic)
    rtcore::histogram_summary arrival_lateness;   // QPU arrival stamp - T (realtime)
    rtcore::histogram_summary wakeup_latency;     // timer wake - (T - lead)
    // Wire version 2 (zero with version 1).
    unsigned wire_version = 1;
    std::int64_t arm_lead_ns = 0;        // learned: quantile of ARM -> ARMED + margin, >= the floor
    std::int64_t arm_lead_floor_ns = 0;  // max(qpu.arm_lead_ns, the endpoint's HELLO min_lead_ns)
    std::uint64_t arms_sent = 0;
    std::uint64_t armed = 0;
    std::uint64_t arm_refused = 0;
    std::uint64_t not_armed = 0;
    std::uint64_t disarms_sent = 0;
    rtcore::histogram_summary arm_latency;        // ARM sent -> ARMED read (monotonic)
    rtcore::histogram_summary arm_cost;           // the endpoint's own cost, all stages (ARMED)
    rtcore::histogram_summary start_lateness;     // the endpoint's started_ns - T (RESULT, realtime)
};

// Full histograms (for Prometheus buckets); large (3 x 30 KiB), copy sparingly.
struct dispatch_histograms {
    rtcore::histogram dispatch_lateness;
    rtcore::histogram arrival_lateness;
    rtcore::histogram wakeup_latency;
    rtcore::histogram arm_latency;     // version 2: ARM sent -> ARMED read
    rtcore::histogram arm_cost;        // version 2: ARMED's stages, summed
    rtcore::histogram start_lateness;  // version 2: RESULT's started_ns - T
};

}  // namespace qrt::dispatch
