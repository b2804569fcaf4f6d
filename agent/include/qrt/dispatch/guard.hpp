#pragma once
// The checks made just before a job is sent (pure functions, so the rules
// are unit-tested apart from the thread).  Times CLOCK_MONOTONIC ns, but for
// the calibration windows', which are realtime as the ledger placed them.

#include <cstdint>

#include "qrt/dispatch/job.hpp"

namespace qrt::dispatch {

// The current calibration id while a QPU has no valid window (a blackout
// with nothing scheduled, or every window cancelled by calibration.update).
// It matches no job, so nothing is sent without a calibration; 0 keeps its
// meaning of "this QPU does not track calibration".
inline constexpr std::uint64_t no_window_calibration_id = UINT64_MAX;

struct guard_input {
    std::int64_t now_ns = 0;             // monotonic, just before sending
    std::int64_t deadline_ns = 0;        // T, monotonic
    std::int64_t window_end_ns = 0;      // monotonic (deadline + window_end - scheduled)
    std::int64_t duration_ns = 0;
    std::int64_t tolerance_ns = 0;
    std::uint64_t job_calibration_id = 0;
    std::uint64_t current_calibration_id = 0;  // 0 = no calibration tracking
    // The window that starts exactly where the current one ends (pushed
    // back-to-back windows, or blackout_ns = 0): a job whose T is at or after
    // the switch belongs to it, even before the housekeeping side switched.
    // Both in realtime, as the ledger placed the job and the window: a job
    // placed at the very start of the next window belongs to it whatever
    // time base its monotonic deadline and the switch were converted with.
    std::uint64_t next_calibration_id = 0;
    std::int64_t scheduled_rt_ns = 0;                   // T, realtime
    std::int64_t calibration_switch_rt_ns = INT64_MAX;  // realtime
    bool endpoint_up = false;
    // Wire version 2: the endpoint answered ARMED for this job (version 1:
    // always true, the frame carries the program).
    bool armed = true;
};

// sent means "go ahead and send now".  Order of precedence: a job whose start
// passed by more than its tolerance is missed (whatever else holds); then the
// calibration guard; then the window; then the endpoint; then (version 2)
// whether the job is armed: a FIRE never goes out for a job that is not.
constexpr dispatch_status check_before_send(const guard_input& in) noexcept {
    if (in.now_ns - in.deadline_ns > in.tolerance_ns) {
        return dispatch_status::missed;
    }
    const std::uint64_t expected = in.scheduled_rt_ns >= in.calibration_switch_rt_ns ? in.next_calibration_id
                                                                                     : in.current_calibration_id;
    if (in.current_calibration_id != 0 && in.job_calibration_id != expected) {
        return dispatch_status::calibration_changed;
    }
    if (in.now_ns + in.duration_ns > in.window_end_ns) {
        return dispatch_status::out_of_window;
    }
    if (!in.endpoint_up) {
        return dispatch_status::endpoint_down;
    }
    if (!in.armed) {
        return dispatch_status::not_armed;
    }
    return dispatch_status::sent;
}

}  // namespace qrt::dispatch
