#pragma once
// Deterministic synthetic workload for the timeline policies: Poisson
// arrivals at a chosen offered load, durations, look-ahead not_before,
// deadlines, priorities, fidelity needs, skewed tenants, and a periodic
// calibration schedule.  Same seed, same workload, on every machine with
// the same libstdc++.
//
// Regimes (bench/fleet uses all three; qrt-policy-compare the first):
//   stationary  Poisson arrivals at a constant rate
//   bursty      a two-state Markov-modulated Poisson process: a burst state
//               at burst_factor x the mean rate for burst_fraction of the
//               time (mean dwell burst_dwell_s), a calm state that keeps the
//               mean at offered_load
//   drift       the mix changes linearly over the run: durations grow
//               (x drift_duration_factor), deadline slack shrinks
//               (x drift_slack_factor), gangs appear (gang_fraction ->
//               drift_gang_fraction) and the tenant weights reverse; the
//               rate follows so the offered load stays constant
// The stationary regime with gang_fraction 0 draws exactly the random
// numbers it drew before regimes and gangs existed.

#include <cstdint>
#include <string>
#include <vector>

#include "qrt/timeline/types.hpp"

namespace qrt::timeline::bench {

enum class regime : std::uint8_t { stationary, bursty, drift };
const char* to_string(regime r) noexcept;

struct workload_params {
    std::uint64_t seed = 1;
    double hours = 12.0;              // arrival span
    std::size_t qpus = 2;
    std::int64_t period_s = 600;      // calibration cycle
    std::int64_t blackout_s = 60;     // calibration at the start of each cycle
    double f0 = 0.99;
    std::int64_t tau_s = 3600;
    double offered_load = 1.1;        // requested QPU time / window time
    std::int64_t min_duration_s = 5;
    std::int64_t max_duration_s = 240;
    double lookahead_fraction = 0.4;  // jobs that ask for a later start
    std::int64_t max_lookahead_s = 1800;
    double deadline_fraction = 0.8;   // jobs with a deadline
    double min_slack = 1.0;           // deadline = start_wish + duration*(1+slack) + ...
    double max_slack = 8.0;
    std::int64_t max_extra_slack_s = 900;
    double fidelity_fraction = 0.2;   // jobs with a min_fidelity
    double min_fidelity_lo = 0.93;
    double min_fidelity_hi = 0.97;
    std::size_t tenants = 4;          // weights 1/1, 1/2, 1/3 ... (skewed)
    std::int32_t priorities = 4;
    regime kind = regime::stationary;
    double gang_fraction = 0.0;       // jobs asking for k > 1 QPUs at one start
    std::size_t max_gang = 2;         // k uniform in [2, max_gang]
    double burst_factor = 3.0;        // bursty: rate in the burst state / mean rate
    double burst_fraction = 0.2;      // bursty: share of time in the burst state
    double burst_dwell_s = 120.0;     // bursty: mean burst length
    double drift_duration_factor = 4.0;  // drift: durations at the end / at the start
    double drift_slack_factor = 0.25;    // drift: deadline slack at the end / at the start
    double drift_gang_fraction = 0.3;    // drift: gang share at the end
};

struct job {
    std::uint64_t seq = 0;
    std::string tenant;
    std::int64_t arrival_ns = 0;
    request req;  // req.gang_size > 1: a gang (reserve_gang with k = gang_size)
};

struct workload {
    workload_params params;
    std::int64_t t0_ns = 0;
    std::int64_t end_ns = 0;  // last arrival
    std::vector<qpu_spec> qpus;
    std::vector<job> jobs;    // in arrival order
};

workload generate(const workload_params& p);

}  // namespace qrt::timeline::bench
