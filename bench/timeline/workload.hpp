#pragma once
// Deterministic synthetic workload for the timeline policies: Poisson
// arrivals at a chosen offered load, durations, look-ahead not_before,
// deadlines, priorities, fidelity needs, skewed tenants, and a periodic
// calibration schedule.  Same seed, same workload, on every machine with
// the same libstdc++.

#include <cstdint>
#include <string>
#include <vector>

#include "qrt/timeline/types.hpp"

namespace qrt::timeline::bench {

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
};

struct job {
    std::uint64_t seq = 0;
    std::string tenant;
    std::int64_t arrival_ns = 0;
    request req;
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
