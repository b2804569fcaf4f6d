#pragma once
// The job pump: the thread that moves committed jobs into each QPU's dispatch
// ring (README.md, "Threads and cores" and "The path of a job").
//
// Threads of the housekeeping side, and what each may touch:
//
//   event loop (SCHED_OTHER)              job pump (SCHED_FIFO 1 on the
//                                           housekeeping CPUs, this file)
//   --------------------------------      ---------------------------------
//   owns the ledger; RPC, commits,        never touches the ledger
//   NSS, telemetry, endpoint I/O
//   builds each QPU's hand-over plan  --> every pump period (absolute
//     from the ledger (durable jobs,        timer): take the newest plan,
//     start order, within the plan          withdraw what was handed and is
//     horizon, at most plan_max_jobs)       no longer planned as handed,
//     and publishes it (publish)            hand what starts within the
//   takes the pump's reports          <--   hand-over horizon to the link
//     (handed / refused) into the           (qpu_link::submit: the only
//     ledger (take_reports)                 producer of the SPSC job ring)
//   the ledger's dispatch gate (cancel,
//     preemption, calibration update)
//     withdraws and restores through
//     withdraw / restore
//   dispatch outcomes (qpu_link) --> ledger, and release(id) in the lane's
//     hand-over table (forgotten once the pump takes the next plan)
//
// Where each job stands is the lane's hand-over table (handover_table.hpp),
// the one record of it on this side of the ledger.  Each QPU's lane is one
// priority-inheriting mutex: the pump holds it for its pass over that QPU
// (bounded by plan_max_jobs), the loop for a pointer swap (publish), a
// vector swap (take_reports), one withdraw or restore, or one release.  The
// pump never waits on anything else of the loop's: a stalled loop (a burst
// of commits, a slow scrape) delays no hand-over of a job already planned.
//
// The bound, from a durable ledger change to the job in the SPSC ring:
//   plan publication (the loop: right after the request line that made it
//   durable, or its next plan tick) + one pump period (2 ms) + the pump's
//   pass (bounded by plan_max_jobs; status reports its measured maximum).
// A job planned before a loop stall is handed over on time through the
// stall, as long as the stall is shorter than plan_horizon - horizon (the
// plan reaches that much further than the pump hands over).
//
// The pump's SCHED_FIFO priority 1, pinned to the housekeeping CPUs:
// above every SCHED_OTHER task there (the loop, clients, builds), so their
// load cannot push a tick back by a scheduler slice; below every other
// real-time thread (threaded IRQs at 50, the dispatch threads at 80 on their
// own isolated CPUs).  Its work per period is bounded, so it cannot starve
// the housekeeping CPUs.  Without CAP_SYS_NICE it runs SCHED_OTHER and
// agent.status says so (degraded); with dispatch.mode = "untuned" (the
// comparison mode) it runs SCHED_OTHER by design.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "qrt/dispatch/job.hpp"
#include "qrt/dispatch/qpu_link.hpp"
#include "qrt/handover/handover_table.hpp"
#include "qrt/timeline/types.hpp"
#include "rtcore/clock.hpp"
#include "rtcore/cpu_set.hpp"
#include "rtcore/pi_mutex.hpp"

namespace qrt {

// One planned job (loop -> pump): a committed, durable reservation.
struct handover_entry {
    dispatch::dispatch_job job;  // id, start, window, calibration id, tolerance, shots
    timeline::blob payload;      // shared bytes (a reference count, never a copy)
    // Set: the loop found it cannot be dispatched (calibration); the pump
    // refuses it with this reason when it comes due, unless handed.  Shared,
    // so the pump's report points at it without copying text.
    std::shared_ptr<const std::string> refuse;
};

struct handover_plan {
    std::vector<handover_entry> jobs;  // start order
    // Every committed job starting before this is in jobs (the plan horizon
    // end, or the last job's start when plan_max_jobs cut the plan short): a
    // handed job missing from the plan is withdrawn only if it starts before.
    std::int64_t complete_until_ns = 0;
    // (job id, index in jobs), by id: built by publish() on the loop, so
    // the pump looks jobs up without building anything.
    std::vector<std::pair<std::uint64_t, std::uint32_t>> by_id;
    std::uint64_t seq = 0;  // set by publish(): the lane table's publish count
};

// What the pump did with a job (pump -> loop).  Plain data: the pump fills
// it in without allocating, and the loop makes the words (reason_text).
struct pump_report {
    enum class kind : std::uint8_t { handed, refused };
    kind what = kind::handed;
    std::uint64_t id = 0;
    std::int64_t start_ns = 0;
    std::uint64_t calibration_id = 0;
    bool missed_before_handover = false;  // refused: its start had passed by more than its tolerance
    std::int64_t passed_by_ns = 0;        //   by this much, at
    std::int64_t tolerance_ns = 0;        //   this tolerance
    bool dispatch_refused = false;        // refused: the dispatcher said no (refusal)
    dispatch::submit_refusal refusal = dispatch::submit_refusal::none;
    std::shared_ptr<const std::string> loop_reason;  // refused: the plan's own reason (calibration)

    // "missed: ...", "dispatch_refused: ...", or the loop's reason.
    std::string reason_text(const dispatch::qpu_link& link) const;
};

struct pump_stats {
    std::string sched;                 // "SCHED_FIFO 1", or "SCHED_OTHER (why)"
    std::uint64_t ticks = 0;
    std::uint64_t ticks_skipped = 0;   // periods slept through (the tick came more than a period late)
    std::int64_t max_lateness_ns = 0;  // tick wake-up minus its absolute time
    std::int64_t max_work_ns = 0;      // longest pass over every QPU
    std::uint64_t plan_jobs = 0;       // jobs in the plans the pump holds now
    std::uint64_t plans_taken = 0;
    std::uint64_t deferred = 0;        // jobs left to the next pass because the storage the loop sized was full
    std::uint64_t refused_transitions = 0;  // hand-over table transitions refused (0 unless a bug)
};

class job_pump {
public:
    struct options {
        std::int64_t period_ns = 2'000'000;
        std::int64_t horizon_ns = 250'000'000;  // hand over what starts before now + this
        int priority = 1;                       // SCHED_FIFO; 0: SCHED_OTHER
        // Pin here (the housekeeping CPUs); empty: the process's affinity.
        // Never a dispatch CPU: the SCHED_FIFO 80 thread spinning there
        // would hold a tick back for its whole spin.
        rtcore::cpu_set cpus;
        // Entries of each QPU's hand-over table at most (handover_table.hpp).
        std::size_t max_jobs = 4096;
    };

    job_pump(std::vector<dispatch::qpu_link*> links, rtcore::clock_source& clock, options opts);
    ~job_pump();
    job_pump(const job_pump&) = delete;
    job_pump& operator=(const job_pump&) = delete;

    // The thread; stop() joins it (within one period).
    rtcore::status start();
    void stop() noexcept;

    // ---- the event loop ----
    // The newest plan of QPU qpu.  Builds the plan's by_id index and grows
    // the lane's storage here, on the loop, so that the pump's pass never
    // allocates.  The jobs released since the last publish are forgotten
    // when the pump takes this plan (a released job still planned is then
    // handed over again, as for a re-placed job).
    void publish(std::uint32_t qpu, handover_plan plan);
    std::vector<pump_report> take_reports(std::uint32_t qpu);
    // The ledger's dispatch gate, the one verb pair to the dispatcher:
    // withdraw job id (if handed; else keep the pump from handing it over
    // from a plan older than the next publish), and undo that for a change
    // that was abandoned (restore: false when the dispatch thread had
    // already dropped the job, whose `cancelled` record then comes back).
    // An unknown qpu or a full table: too_late (the gate refuses the change).
    dispatch::dispatcher::withdraw_result withdraw(std::uint32_t qpu, std::uint64_t id);
    bool restore(std::uint32_t qpu, std::uint64_t id);
    // The loop took the outcome (or the pump's refusal) of job id.  False
    // when the table had no hand-over of it to release (counted).
    bool release(std::uint32_t qpu, std::uint64_t id);
    // The job as handed over (start, calibration id), while the link holds it.
    std::optional<std::pair<std::int64_t, std::uint64_t>> handed_as(std::uint32_t qpu, std::uint64_t id) const;
    std::size_t in_flight(std::uint32_t qpu) const;
    // Wire version 2: the link's arm event for job id, into the table's arm
    // column (refused: counted in refused_transitions, a bug).
    void on_arm(std::uint32_t qpu, std::uint64_t id, dispatch::arm_event e);
    // Jobs the table holds arming and armed.
    std::pair<std::size_t, std::size_t> arming_armed(std::uint32_t qpu) const;
    // Released since the last publish (the loop publishes again soon).
    bool releases_pending(std::uint32_t qpu) const;
    pump_stats stats() const;

    // One pass over every QPU at realtime now (the thread's tick; tests call
    // it directly).  Allocates nothing, logs nothing and throws nothing: its
    // storage is sized by publish() and take_reports() on the loop.
    void pass(std::int64_t now_rt_ns) noexcept;

private:
    struct lane {
        dispatch::qpu_link* link = nullptr;
        mutable rtcore::pi_mutex mu;  // everything below
        std::optional<handover_plan> next;
        // Where each job stands (handover_table.hpp); its storage is grown
        // by the loop to hold what the current and the next plan can still
        // add (each job is claimed at most once until it is released).
        handover::handover_table table;
        std::vector<pump_report> reports;  // grown like the table
        handover_plan plan;
        // The plan the pump replaced, for the loop to free (the pump frees
        // nothing): empty whenever a new plan arrives, since only publish()
        // brings one and publish() takes this.
        std::optional<handover_plan> spent;
    };

    void pass_lane(lane& l, std::int64_t now_rt_ns) noexcept;
    // Storage for what the current and next plan of l may still add, grown
    // on the loop under l.mu (the pump then never grows it).
    static void reserve_for_plans(lane& l);
    void thread_main() noexcept;

    rtcore::clock_source& _clock;
    options _opts;
    std::vector<std::unique_ptr<lane>> _lanes;
    std::thread _thread;
    std::atomic<bool> _stop{false};

    mutable rtcore::pi_mutex _sched_mu;
    std::string _sched = "not started";
    std::atomic<std::uint64_t> _ticks{0};
    std::atomic<std::uint64_t> _ticks_skipped{0};
    std::atomic<std::int64_t> _max_lateness_ns{0};
    std::atomic<std::int64_t> _max_work_ns{0};
    std::atomic<std::uint64_t> _plan_jobs{0};
    std::atomic<std::uint64_t> _plans_taken{0};
    std::atomic<std::uint64_t> _deferred{0};  // decisions put off to the next pass: storage was full
    mutable std::atomic<std::uint64_t> _refused_transitions{0};  // the table refused a transition: a bug
};

}  // namespace qrt
