#pragma once
// qpu-sim's version-2 side (agent/proto/protocol.toml, [wire]): the jobs it
// holds armed, the simulated prepare (compile, upload, arm) with its cost,
// FIRE, DISARM, and the counters and histograms of the exit summary.
//
// Prepare is one path, as a real stack's upload is: ARMs are prepared one
// after the other, each for a cost drawn from the --prepare-* model (a
// distribution around --prepare-ms, plus --prepare-ns-per-byte for each
// payload byte); a job becomes armed, and its ARMED is sent, when its
// prepare ends.  A FIRE for a job that is not armed yet (or at all) is
// answered ERROR not_armed and counted (fired_unarmed): under qrtd it stays
// zero.  The program runs on the one QPU the version-1 path also uses
// (busy_until_mono is shared).

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qrt/proto/wire_codec.hpp"
#include "qrt/proto/wire_v2.hpp"
#include "rtcore/histogram.hpp"

namespace qpu_sim {

// "<bitstring> <count>\n" for each outcome with a non-zero count; the counts
// sum to shots.  Deterministic in (job_id, calibration_id).
std::string bitstring_counts(std::uint64_t job_id, std::uint64_t calibration_id, std::uint32_t shots,
                             unsigned qubits);
std::uint64_t splitmix64(std::uint64_t& s);

// The simulated prepare cost.
struct prepare_model {
    enum class dist { fixed, uniform, exponential };
    dist shape = dist::fixed;
    double base_ms = 0;        // fixed: the cost; uniform: the middle; exponential: the least
    double spread_ms = 0;      // uniform: +- this; exponential: the mean above base
    double ns_per_byte = 0;    // added per payload byte (1 ms per 64 KiB: 15.2587890625)
    // The cost of preparing job_id's payload_bytes, by stage (compile half
    // of the drawn base, upload the rest of it plus the per-byte cost, arm
    // a tenth), deterministic in job_id.
    qrt::wire::armed_cost draw(std::uint64_t job_id, std::size_t payload_bytes) const;
    // The largest cost it can draw for a payload of the wire's maximum
    // (exponential: base + 5 means), the min_lead it states in HELLO.
    std::int64_t bound_ns() const;
};
bool parse_dist(const std::string& text, prepare_model::dist& out);

struct two_phase_options {
    prepare_model prepare;
    std::uint32_t max_armed = 16;
    std::int64_t horizon_ns = 60'000'000'000;
    std::int64_t min_lead_ns = -1;  // -1: prepare.bound_ns()
    std::uint64_t calibration_id = 0;
    std::string refuse_marker;      // a program containing it is refused at parse
    unsigned qubits = 4;
};

class two_phase {
public:
    // send: write a frame to a client now; schedule: write it at a
    // monotonic time (the simulator's answer queue).
    using send_fn = std::function<void(std::uint64_t client, std::vector<std::uint8_t> bytes)>;
    using schedule_fn = std::function<void(std::int64_t due_mono, std::uint64_t client, std::vector<std::uint8_t> bytes)>;

    two_phase(two_phase_options opt, send_fn send, schedule_fn schedule, std::int64_t& busy_until_mono,
              rtcore::histogram& start_lateness);

    // The HELLO payload for a new control connection.
    std::string capabilities(const std::string& identity, const std::string& session) const;

    void on_arm(std::uint64_t control, const qrt::wire::frame& f, std::int64_t arrival_ns, std::int64_t arrival_mono);
    void on_disarm(std::uint64_t control, const qrt::wire::frame& f, std::int64_t arrival_ns);
    void on_fire(std::uint64_t control, const qrt::wire::frame& f, std::int64_t arrival_ns, std::int64_t arrival_mono);
    // The control connection closed: its jobs are dropped, never started.
    void on_control_closed(std::uint64_t control);
    // Sends ARMED for every job whose prepare has ended by now.
    void tick(std::int64_t now_mono);
    // The next prepare end (INT64_MAX: none).
    std::int64_t next_due() const;

    void report(nlohmann::json& j) const;
    std::uint64_t jobs_seen() const { return _arms + _fires; }

private:
    struct held {
        std::uint64_t control = 0;
        qrt::wire::header arm{};
        std::int64_t armed_at_mono = 0;   // when its prepare ends
        std::int64_t armed_at_ns = 0;
        bool announced = false;           // ARMED sent
        qrt::wire::armed_cost cost;
    };

    void error(std::uint64_t control, const qrt::wire::header& about, qrt_wire_error status, qrt_wire_stage stage,
               std::int64_t arrival_ns, const std::string& why);

    two_phase_options _opt;
    send_fn _send;
    schedule_fn _schedule;
    std::int64_t& _busy_until_mono;
    rtcore::histogram& _start_lateness;
    std::map<std::uint64_t, held> _held;   // by job id: preparing or armed
    std::int64_t _prepare_free_mono = 0;   // the prepare path is busy until
    rtcore::histogram _arm_cost;           // drawn cost, by job
    rtcore::histogram _fire_lateness;      // FIRE arrival - fire_at
    std::uint64_t _arms = 0, _armed = 0, _arm_refused = 0, _fires = 0, _fired_unarmed = 0, _disarms = 0,
                  _disarmed = 0, _disarm_unknown = 0, _dropped_armed = 0, _fire_out_of_window = 0,
                  _fire_calibration = 0, _max_held = 0, _results = 0;
};

}  // namespace qpu_sim
