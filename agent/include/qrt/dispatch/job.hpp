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
};

// The outcome reasons the QPU link and the job pump write: the first word
// of a missed or failed job's reason.  Each has its row in
// qrt::rpc::outcome_table (static_assert in qrt/reasons.hpp).
namespace outcome {
// never sent
inline constexpr std::string_view missed = "missed";
inline constexpr std::string_view calibration_changed = "calibration_changed";
inline constexpr std::string_view dispatch_refused = "dispatch_refused";  // the pump's hand-over
inline constexpr std::string_view out_of_window = "out_of_window";
inline constexpr std::string_view endpoint_down = "endpoint_down";
inline constexpr std::string_view cancelled = "cancelled";
// sent, then failed
inline constexpr std::string_view send_failed = "send_failed";
inline constexpr std::string_view endpoint_disconnected = "endpoint_disconnected";
inline constexpr std::string_view endpoint_protocol_error = "endpoint_protocol_error";
inline constexpr std::string_view endpoint_stalled = "endpoint_stalled";
inline constexpr std::string_view endpoint_timeout = "endpoint_timeout";
inline constexpr std::string_view qpu_out_of_window = "qpu_out_of_window";
inline constexpr std::string_view qpu_calibration_mismatch = "qpu_calibration_mismatch";
inline constexpr std::string_view qpu_busy = "qpu_busy";
inline constexpr std::string_view qpu_error = "qpu_error";
// unknown: written by the ledger on open after a crash (ledger::open)
inline constexpr std::string_view dispatch_unknown = "dispatch_unknown";

inline constexpr std::array<std::string_view, 16> all{
    missed,      calibration_changed,   dispatch_refused,        out_of_window,
    endpoint_down, cancelled,           send_failed,             endpoint_disconnected,
    endpoint_protocol_error, endpoint_stalled, endpoint_timeout, qpu_out_of_window,
    qpu_calibration_mismatch, qpu_busy, qpu_error, dispatch_unknown};
}  // namespace outcome

// Stable spellings, used as failure reasons (the outcome:: names but for
// `sent`).
const char* to_string(dispatch_status s) noexcept;

// Terminal state of a job as the daemon sees it.
enum class job_state : std::uint8_t {
    completed,  // RESULT received
    failed,     // see reason
    missed,     // never sent: start passed by more than tolerance
    sent,       // written on time to a write-only endpoint: no result can come back
};
const char* to_string(job_state s) noexcept;

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
