#pragma once
// Plain job descriptors and outcomes exchanged between the daemon (which
// owns the ledger) and the dispatcher.  Deliberately independent of the
// timeline types: the daemon translates due_jobs() entries into
// dispatch_job, and dispatch_outcome into mark_dispatched/complete/fail.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "qrt/proto/protocol.hpp"

namespace qrt::dispatch {

// One committed job, as handed to dispatcher::submit().  Times are realtime
// (UTC) nanoseconds since the epoch, durations nanoseconds.
struct dispatch_job {
    std::uint64_t job_id = 0;
    std::uint32_t qpu_index = 0;
    std::int64_t scheduled_ns = 0;     // slot start T
    std::int64_t window_start_ns = 0;  // calibration window (arrival must be >= this)
    std::int64_t window_end_ns = 0;    // the job must end by this time
    std::int64_t duration_ns = 0;
    std::uint64_t calibration_id = 0;  // the window's id at placement
    std::int64_t tolerance_ns = 0;     // largest acceptable lateness; later = missed
    std::uint32_t shots = 0;
};

// Outcome of the dispatch step itself (what the RT thread did).
enum class dispatch_status : std::uint8_t {
    sent = 0,              // submitted on time; the write completed
    missed,                // start passed by more than tolerance: never sent
    calibration_changed,   // calibration guard: id no longer current, never sent
    out_of_window,         // sending now would not end inside the window, never sent
    endpoint_down,         // no connected endpoint at T, never sent
    send_failed,           // the io_uring write failed or was short
    cancelled,             // dispatcher stopped with the job queued
    not_armed,             // wire version 2: the endpoint had not answered ARMED by T, never fired
};

// Wire version 2: what the QPU link did with a job's arming, reported on
// the loop (qpu_link_callbacks::on_arm) into the hand-over table's arm
// column (qrt/handover/handover_table.hpp has the diagram).
enum class arm_event : std::uint8_t {
    arm_sent,  // its ARM went out on the control connection
    armed,     // the endpoint answered ARMED
    unarmed,   // no longer armed: the connection was lost, or it was DISARMed to be armed again
    fired,     // the dispatch thread sent its FIRE
};

// The outcome reasons the QPU link and the job pump write: the first word
// of a missed or failed job's reason.  Each is a row of the protocol's one
// table with its outcome column set (qrt/proto/protocol.hpp).
namespace outcome = proto::reason;

// Stable spellings, used as failure reasons (the outcome:: names but for
// `sent`).
const char* to_string(dispatch_status s) noexcept;

// The job outcome reason the protocol's table gives an endpoint's ERROR
// status (qpu_error for a status it does not know).
std::string_view outcome_for_wire_error(std::uint16_t status) noexcept;

// The state a job ends in, as the QPU link reports it: completed (RESULT
// received), failed (see reason), missed (never sent) or sent (written on
// time to a write-only endpoint): the protocol's states that finish a job.
using job_state = proto::state;

// Reported once per job by qpu_link (housekeeping thread).  `dispatched` is
// reported earlier, when the frame left (see qpu_link callbacks).
struct dispatch_outcome {
    std::uint64_t job_id = 0;
    std::uint32_t qpu_index = 0;
    job_state state = job_state::failed;
    std::string reason;                   // stable reason ("ok", "missed", "endpoint_timeout", ...)
    std::string detail;                   // human detail (may be empty)
    std::int64_t scheduled_ns = 0;
    std::int64_t sent_ns = 0;             // realtime, 0 when never sent
    std::int64_t dispatch_lateness_ns = 0;
    std::int64_t arrival_ns = 0;          // from RESULT/ERROR, 0 when unknown
    std::int64_t arrival_lateness_ns = 0;
    std::vector<std::uint8_t> result;     // RESULT payload
};

}  // namespace qrt::dispatch
