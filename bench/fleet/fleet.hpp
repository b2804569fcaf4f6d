#pragma once
// qrt-fleet-sim's engine: N hosts, each running the agent's own ledger and
// placement policy (qrt::timeline::ledger, in-memory store) in virtual time,
// driven by discrete events; four structures of authority decide where each
// job goes.  See bench/fleet/README.md (qrt-fleet-sim(1)) for the model, the
// operating objective and the reward.
//
// Deterministic: one seed fixes the workload, the calibration processes,
// the faults and every random choice of the structures.  Wall-clock time is
// read only to measure decision latency (real ns per decision), which is
// reported but never feeds back into the simulation.

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mlp.hpp"
#include "workload.hpp"

namespace qrt::fleet {

enum class structure : unsigned char { central, no_comm, limited, learned };
const char* to_string(structure s) noexcept;
bool structure_from_string(std::string_view s, structure* out) noexcept;
inline constexpr structure k_structures[] = {structure::central, structure::no_comm,
                                             structure::limited, structure::learned};

struct fleet_params {
    std::uint64_t seed = 1;
    std::size_t hosts = 64;
    std::size_t min_qpus = 1;  // per host, uniform in [min, max]
    std::size_t max_qpus = 4;
    double hours = 2.0;        // arrival span; the run goes on until every job resolved
    double warmup_h = 0.25;    // excluded from the figures
    double load = 0.9;         // requested QPU time / nominal window time
    timeline::bench::regime regime = timeline::bench::regime::stationary;
    double gang_fraction = 0.05;
    std::string policy = "edf-backfill";  // every host's ledger policy
    bool admission = true;  // false: hosts are not told deadlines (best effort queue)

    // Calibration, per QPU (pushed windows, the calibration-guard path).
    std::int64_t period_s = 600;
    std::int64_t blackout_s = 60;
    double period_drift = 0.15;      // +-relative drift of the period (slow sine)
    double drift_cycle_h = 6.0;      // the drift's own period
    double overrun_prob = 0.05;      // per calibration: blackout runs long
    std::int64_t overrun_max_s = 120;
    double push_rate_per_h = 0.5;    // unscheduled re-calibrations (new id, new f0)
    double f0_lo = 0.975;
    double f0_hi = 0.995;
    std::int64_t tau_lo_s = 3600;    // fidelity decay time constant per QPU
    std::int64_t tau_hi_s = 4 * 3600;
    std::size_t forecast_windows = 12;  // windows published ahead

    // Faults.
    double host_mtbf_h = 48.0;       // per host; 0 = never
    double host_down_mean_s = 300;
    double stall_mtbf_h = 96.0;      // per QPU endpoint; 0 = never
    double stall_mean_s = 60;
    double detect_s = 2.0;           // a scheduler notices a dead host after this

    // Communication.
    double delay_ms = 5.0;           // one way, per message
    double timeout_ms = 250.0;       // a request to a dead host
    double gossip_s = 10.0;          // limited/learned: load gossip period T
    std::size_t gossip_entries = 16; // digest entries per gossip message
    std::size_t d = 2;               // limited/learned: agents asked per try
    std::size_t tries = 3;           // attempts per decision before rejecting
    std::size_t max_reschedules = 3; // re-decisions of a job that lost its slot
};

// One operating objective, written before the reward (README "objective"):
// per job, cost = w_miss * missed + w_response * min(response / 600 s, 3)
//                 + w_message * messages.  The learned actor's reward is the
// negative cost of the job it placed.
struct objective_weights {
    double miss = 1.0;
    double response = 0.1;
    double message = 0.002;
};

// Features the learned actor sees for one candidate (local observation
// plus what the limited-sharing structure shares).  Fixed order; the model
// file's input count must equal k_actor_features.
inline constexpr std::size_t k_actor_features = 12;
// The centralised critic's input (global state, training only).
inline constexpr std::size_t k_critic_features = 10;

// One decision of the learned structure, for training.
struct decision_record {
    std::vector<float> candidates;  // k x k_actor_features
    std::size_t k = 0;
    std::size_t chosen = 0;
    std::vector<float> global;      // k_critic_features
    std::size_t job = 0;
    float reward = 0.0F;            // filled when the job resolves
};

struct learned_config {
    const mlp* actor = nullptr;  // required for structure::learned
    bool explore = false;        // sample from softmax (training) instead of argmax
    std::uint64_t explore_seed = 0;
    std::vector<decision_record>* record = nullptr;  // when set, every decision is kept
};

struct fleet_metrics {
    std::string structure;
    std::string regime;
    double load = 0;
    double offered = 0;              // realized: measured jobs' QPU time / window time
    std::size_t hosts = 0;
    std::size_t qpus = 0;
    std::uint64_t seed = 0;
    std::size_t jobs = 0;            // measured jobs (arrived after warm-up)
    std::size_t completed = 0;
    std::size_t with_deadline = 0;
    std::size_t deadline_missed = 0;
    std::size_t rejected = 0;        // never placed anywhere
    double miss_rate = 0;            // deadline jobs not completed by their deadline
    double compliance_admitted = 0;  // deadline jobs admitted that then met it
    double utilization = 0;          // busy QPU time / window time (measured span)
    double throughput_qpu_h_per_h = 0;  // completed QPU-hours per hour
    double response_p50_s = 0;
    double response_p95_s = 0;
    double jain = 0;
    double messages_per_job = 0;
    std::uint64_t messages = 0;
    double decide_ns_p50 = 0;        // real ns per decision
    double decide_ns_mean = 0;
    double reschedules_per_job = 0;  // slot changes (re-placed by a host, or re-decided)
    double mean_cost = 0;            // the operating objective per job (lower is better)
    double wall_s = 0;
    std::uint64_t ledger_ops = 0;    // calls into the hosts' ledgers
    std::uint64_t fingerprint = 0;   // FNV-1a over every commit (job, host, start), in order
};

// Runs one simulation.  Throws std::runtime_error on a broken setup (unknown
// policy, a learned run without an actor).
fleet_metrics simulate(const fleet_params& p, structure s, const learned_config& lc = {},
                       const objective_weights& ow = {});

// The workload a fleet_params asks for (tests and the trainer use it).
timeline::bench::workload fleet_workload(const fleet_params& p, std::size_t total_qpus);

}  // namespace qrt::fleet
