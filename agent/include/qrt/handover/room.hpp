#pragma once
// The hand-over room: the event loop's side of the way from a durable
// reservation to the frame, in one place (agent/src/handover/README.md).
// It owns the job pump (job_pump.hpp, its own thread) and, through the
// pump's lanes, the one hand-over table per QPU (handover_table.hpp); it
// builds each QPU's plan from the ledger, takes the pump's reports and the
// links' outcomes back into the ledger, and keeps each link's calibration
// guard on the window in force.
//
// Its inputs, each a plain call on the event loop (no event source, no
// session of its own):
//   on_commit(notice)     the commit listener: a group became durable (or
//                         failed).  First the late-commit withdrawal: a job
//                         it committed whose start is now too close to
//                         hand over (options::handover_ns) is taken back
//                         from the ledger (ledger::withdraw_late) and
//                         returned, so that the listener answers its
//                         request with a retryable refusal instead of the
//                         acknowledgement (an acknowledged job is one the
//                         agent can dispatch); then on_durable()
//   on_durable()          plan what the group made dispatchable now, before
//                         the listener sends the acknowledgements (and the
//                         loop serves more input); the listener publishes
//                         the ledger's events after them
//   on_outcome(), on_dispatched(), on_arm()
//                         the QPU links' records and outcomes
//   on_calibration(qpu)   the calibration engine (calibration.update, a
//                         reload, a realtime step): re-read the windows
//   withdraw(id), restore(id)
//                         the ledger's dispatch gate (cancel, preemption,
//                         calibration update): pull the job back from the
//                         one QPU that holds it, or put it back
//
//   handover::room room(loop, ledger, clock, opts, qpus, on_ledger_events);
//   room.start(pump_options);  ...  room.stop();  // before the links stop

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qrt/dispatch/dispatcher.hpp"
#include "qrt/dispatch/job.hpp"
#include "qrt/dispatch/qpu_link.hpp"
#include "qrt/event_loop.hpp"
#include "qrt/handover/job_pump.hpp"
#include "qrt/timeline/ledger.hpp"
#include "rtcore/clock.hpp"

namespace qrt::handover {

// One QPU as the room sees it.
struct qpu_target {
    std::uint32_t index = 0;
    std::string name;
    dispatch::qpu_link* link = nullptr;  // owned by the daemon; outlives the room's use of it
    std::int64_t tolerance_ns = 0;
};

// What agent.status and the metrics show of one QPU's hand-over.
// Outcomes by kind (sent: written to a write-only endpoint, no result).
struct qpu_counts {
    std::uint64_t calibration_id = 0;  // what the link's guard holds
    std::size_t in_flight = 0;         // handed over, no outcome yet
    std::size_t arming = 0, armed = 0; // wire version 2: of those, ARM sent / ARMED (the table's arm column)
    std::uint64_t completed = 0, sent = 0, failed = 0, missed = 0;
};

// The pump's reports as the room took them; ledger_errors: transitions the
// outcomes could not make; max_plan_publish_ns: the longest sync();
// published_jobs: the jobs in the plans the loop published last (over every
// QPU; the pump takes them at its next tick).
// late_commits: jobs on_commit withdrew, durable too late for their start.
struct room_counts {
    std::uint64_t handed = 0, refused_by_dispatcher = 0, missed_before_handover = 0, ledger_errors = 0;
    std::uint64_t late_commits = 0;
    std::int64_t max_plan_publish_ns = 0;
    std::size_t published_jobs = 0;
};

class room {
public:
    struct options {
        std::int64_t plan_horizon_ns = 500'000'000;  // what the loop plans ahead
        std::size_t plan_max_jobs = 0;               // per QPU
        // What the hand-over still needs between a durable commit and the
        // send: the pump period + the dispatch threads' largest lead
        // (min_lead_ns without its margin).  A job committed with less
        // than this left before its start is withdrawn (on_commit).
        std::int64_t handover_ns = 0;
    };

    // on_ledger_events: the ledger changed here (an outcome, a miss):
    // publish its events to the subscribers.
    room(event_loop& loop, timeline::ledger& ledger, rtcore::clock_source& clock, options opts,
         std::vector<qpu_target> qpus, std::function<void()> on_ledger_events);
    ~room();
    room(const room&) = delete;
    room& operator=(const room&) = delete;

    // Starts the pump's thread and reads every QPU's windows.
    rtcore::status start(job_pump::options pump);
    // Joins the pump and takes its last reports; cancels the guards'
    // switch timers.  From here outcomes are recorded, never re-handed.
    void stop() noexcept;

    // ---- the inputs (event loop) ----
    // Returns the jobs withdrawn as late, for their requests' refusal.
    std::vector<timeline::late_job> on_commit(const timeline::commit_notice& n);
    void on_durable() noexcept;
    // Every pump period (the loop's plan timer): reports in, plans out,
    // and the ledger's events published (unless publish_events is false:
    // the caller publishes them).
    void sync(bool publish_events = true) noexcept;
    void on_dispatched(std::uint32_t qpu, std::uint64_t id, std::int64_t sent_ns);
    void on_arm(std::uint32_t qpu, std::uint64_t id, dispatch::arm_event e);
    void on_outcome(std::uint32_t qpu, const dispatch::dispatch_outcome& o);
    void on_calibration(std::string_view qpu);
    void on_calibration_all();
    dispatch::dispatcher::withdraw_result withdraw(std::uint64_t id);
    void restore(std::uint64_t id);

    qpu_counts counts(std::uint32_t qpu) const;
    room_counts counts() const;
    std::optional<pump_stats> pump_state() const;

private:
    struct qpu_state;

    void changed() noexcept;
    bool needs_plan() const noexcept;
    void apply_pump_reports(qpu_state& q);
    // Returns the jobs the plan holds.
    std::size_t publish_plan(qpu_state& q, std::int64_t now_ns);
    bool durable(const timeline::reservation& r) const;
    void refresh_calibration(qpu_state& q, std::int64_t now_ns);
    const timeline::calibration_window* window_of(qpu_state& q, std::int64_t start_ns, std::int64_t now_ns);
    qpu_state* qpu_of(std::uint64_t id);

    event_loop& _loop;
    timeline::ledger& _ledger;
    rtcore::clock_source& _clock;
    options _opts;
    std::vector<std::unique_ptr<qpu_state>> _qpus;
    std::function<void()> _on_ledger_events;
    std::unique_ptr<job_pump> _pump;
    bool _pumping = false;                 // sync() is running (no re-entry)
    bool _stopped = false;
    std::uint64_t _pumped_generation = 0;  // ledger generation the last plan saw
    room_counts _counts;
};

}  // namespace qrt::handover
