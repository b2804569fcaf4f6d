#include <gtest/gtest.h>

#include "qrt/dispatch/guard.hpp"

using namespace qrt::dispatch;

namespace {
guard_input on_time() {
    guard_input g;
    g.now_ns = 1'000'000;
    g.deadline_ns = 1'000'000;
    g.window_end_ns = 2'000'000;
    g.duration_ns = 100'000;
    g.tolerance_ns = 50'000;
    g.job_calibration_id = 7;
    g.current_calibration_id = 7;
    g.endpoint_up = true;
    return g;
}
}  // namespace

TEST(calibration_guard, sends_when_the_window_id_is_still_current) {
    EXPECT_EQ(check_before_send(on_time()), dispatch_status::sent);
}

TEST(calibration_guard, refuses_a_job_whose_calibration_id_changed) {
    guard_input g = on_time();
    g.current_calibration_id = 8;
    EXPECT_EQ(check_before_send(g), dispatch_status::calibration_changed);
}

TEST(calibration_guard, zero_current_id_means_no_calibration_tracking) {
    guard_input g = on_time();
    g.current_calibration_id = 0;
    EXPECT_EQ(check_before_send(g), dispatch_status::sent);
}

TEST(calibration_guard, a_qpu_without_any_window_sends_nothing) {
    guard_input g = on_time();
    g.current_calibration_id = no_window_calibration_id;
    EXPECT_EQ(check_before_send(g), dispatch_status::calibration_changed);
}

TEST(calibration_guard, a_job_at_the_boundary_of_back_to_back_windows_belongs_to_the_next_one) {
    guard_input g = on_time();
    g.current_calibration_id = 7;
    g.next_calibration_id = 8;
    g.scheduled_rt_ns = 1'700'000'000'000'000'000;
    g.calibration_switch_rt_ns = g.scheduled_rt_ns;  // the next window starts at T
    g.job_calibration_id = 8;
    EXPECT_EQ(check_before_send(g), dispatch_status::sent) << "the switch timer has not fired yet";
    g.job_calibration_id = 7;
    EXPECT_EQ(check_before_send(g), dispatch_status::calibration_changed) << "T is in the next window";
    g.calibration_switch_rt_ns = g.scheduled_rt_ns + 1;  // T still inside the current window
    EXPECT_EQ(check_before_send(g), dispatch_status::sent);
    g.job_calibration_id = 8;
    EXPECT_EQ(check_before_send(g), dispatch_status::calibration_changed);
}

// A job re-placed at the very start of the next window: its monotonic
// deadline was converted when it was handed over, the switch when the
// calibration changed, each with the time base of its moment, and they may
// differ by the base's sampling error.  The windows are realtime, and so is
// the decision: the job belongs to the next window (the end-to-end race test
// once saw it refused "placed in calibration 1022, the window at start is
// 1021").
TEST(calibration_guard, a_job_at_the_switch_belongs_to_the_next_window_whatever_its_monotonic_deadline) {
    guard_input g = on_time();
    g.current_calibration_id = 1021;
    g.next_calibration_id = 1022;
    g.job_calibration_id = 1022;
    g.scheduled_rt_ns = 1'796'671'614'858'806'514;
    g.calibration_switch_rt_ns = g.scheduled_rt_ns;
    for (const std::int64_t skew : {-40, -1, 0, 1, 40}) {  // ns between the two conversions
        g.deadline_ns = on_time().deadline_ns + skew;
        EXPECT_EQ(check_before_send(g), dispatch_status::sent) << "skew " << skew;
    }
}

TEST(missed, start_passed_beyond_tolerance_is_missed_never_sent) {
    guard_input g = on_time();
    g.now_ns = g.deadline_ns + g.tolerance_ns + 1;
    EXPECT_EQ(check_before_send(g), dispatch_status::missed);
    g.now_ns = g.deadline_ns + g.tolerance_ns;  // exactly at the tolerance: still sent
    EXPECT_EQ(check_before_send(g), dispatch_status::sent);
}

TEST(missed, takes_precedence_over_every_other_refusal) {
    guard_input g = on_time();
    g.now_ns = g.deadline_ns + 10 * g.tolerance_ns;
    g.current_calibration_id = 9;
    g.endpoint_up = false;
    EXPECT_EQ(check_before_send(g), dispatch_status::missed);
}

TEST(window, a_job_that_would_end_after_the_window_is_not_sent) {
    guard_input g = on_time();
    g.window_end_ns = g.deadline_ns + g.duration_ns + 10'000;
    g.now_ns = g.deadline_ns + 20'000;  // within tolerance, but would overrun the window
    EXPECT_EQ(check_before_send(g), dispatch_status::out_of_window);
}

TEST(endpoint, a_job_is_not_sent_to_a_down_endpoint) {
    guard_input g = on_time();
    g.endpoint_up = false;
    EXPECT_EQ(check_before_send(g), dispatch_status::endpoint_down);
}

// Wire version 2: a FIRE never goes out for a job the endpoint has not
// answered ARMED for; every earlier refusal still wins (it says more).
TEST(armed, a_job_not_armed_at_t_is_never_fired) {
    guard_input g = on_time();
    g.armed = false;
    EXPECT_EQ(check_before_send(g), dispatch_status::not_armed);
    g.endpoint_up = false;
    EXPECT_EQ(check_before_send(g), dispatch_status::endpoint_down);
    g.now_ns = g.deadline_ns + g.tolerance_ns + 1;
    EXPECT_EQ(check_before_send(g), dispatch_status::missed);
}
