// The dispatcher with a real thread in untuned mode (no root needed) sending
// into a socketpair: what is sent, what is refused, and the deadline
// re-conversion on a realtime step (fake clock).  No timing is asserted.

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <chrono>
#include <thread>
#include <vector>

#include "qrt/dispatch/dispatcher.hpp"
#include "qrt/dispatch/step_follower.hpp"
#include "qrt/event_loop.hpp"
#include "qrt/proto/wire_codec.hpp"
#include "rtcore/capabilities.hpp"
#include "rtcore/memory_lock.hpp"
#include "qrt_test/memory_lock.hpp"
#include "qrt_test/process.hpp"

using namespace qrt::dispatch;
namespace wire = qrt::wire;

namespace {

constexpr std::int64_t ms = 1'000'000;

class dispatcher_fixture : public ::testing::Test {
protected:
    void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, _sp), 0); }
    void TearDown() override {
        ::close(_sp[0]);
        ::close(_sp[1]);
    }

    static dispatcher_config untuned() {
        dispatcher_config c;
        c.mode = dispatch_mode::untuned;
        c.slots = 8;
        c.max_payload_bytes = 256;
        return c;
    }

    static dispatch_job job_at(std::uint64_t id, std::int64_t t_rt, std::uint64_t calibration_id = 1) {
        dispatch_job j;
        j.job_id = id;
        j.scheduled_ns = t_rt;
        j.window_start_ns = t_rt - 1000 * ms;
        j.window_end_ns = t_rt + 1000 * ms;
        j.duration_ns = 100'000;
        j.calibration_id = calibration_id;
        // Generous: a loaded CI machine may start the thread late, and a
        // late start must not turn these cases into `missed`.
        j.tolerance_ns = 300 * ms;
        j.shots = 10;
        return j;
    }

    // Bounded wait for n records.
    static std::vector<dispatch_record> wait_records(dispatcher& d, std::size_t n) {
        std::vector<dispatch_record> out;
        for (int i = 0; i < 3000 && out.size() < n; ++i) {
            d.drain_records([&](const dispatch_record& r) { out.push_back(r); });
            if (out.size() < n) {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
        }
        return out;
    }

    std::vector<wire::frame> read_frames() {
        wire::frame_reader r;
        std::uint8_t buf[4096];
        ssize_t n = 0;
        while ((n = ::recv(_sp[1], buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
            r.feed({buf, static_cast<std::size_t>(n)});
        }
        std::vector<wire::frame> out;
        while (auto f = r.next()) {
            out.push_back(std::move(*f));
        }
        EXPECT_EQ(r.error(), wire::decode_status::ok);
        return out;
    }

    int _sp[2] = {-1, -1};
    rtcore::real_clock _clock;
};

const std::uint8_t payload[] = {'h', 'e', 'l', 'l', 'o'};

// The host's clocks, except that CLOCK_REALTIME can be stepped in this
// process only (stepping the real clock would disturb the whole machine).
// Sleeps are the real ones, so the dispatch thread runs as in the daemon.
class stepping_clock final : public rtcore::clock_source {
public:
    std::int64_t now_monotonic_ns() const noexcept override { return _real.now_monotonic_ns(); }
    std::int64_t now_realtime_ns() const noexcept override {
        return _real.now_realtime_ns() + _offset.load(std::memory_order_acquire);
    }
    int sleep_until_monotonic_ns(std::int64_t t_ns) noexcept override { return _real.sleep_until_monotonic_ns(t_ns); }
    int sleep_until_or_woken(std::int64_t t_ns, const rtcore::wake_word& word, std::uint32_t seen) noexcept override {
        return _real.sleep_until_or_woken(t_ns, word, seen);
    }
    void step_realtime(std::int64_t delta_ns) noexcept { _offset.fetch_add(delta_ns, std::memory_order_acq_rel); }

private:
    rtcore::real_clock _real;
    std::atomic<std::int64_t> _offset{0};
};

}  // namespace

TEST_F(dispatcher_fixture, a_job_whose_start_passed_beyond_tolerance_is_missed_and_never_sent) {
    dispatcher d(untuned(), _clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    ASSERT_TRUE(d.submit(job_at(1, _clock.now_realtime_ns() - 1000 * ms), payload));
    ASSERT_TRUE(d.start());
    const auto recs = wait_records(d, 1);
    d.stop();
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].status, dispatch_status::missed) << to_string(recs[0].status);
    EXPECT_GT(recs[0].lateness_ns, 300 * ms);
    EXPECT_EQ(recs[0].sent_ns, 0);
    EXPECT_TRUE(read_frames().empty()) << "a missed job must never reach the endpoint";
}

TEST_F(dispatcher_fixture, calibration_guard_sends_only_jobs_of_the_current_calibration) {
    dispatcher d(untuned(), _clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    d.set_calibration_id(6);
    const std::int64_t t = _clock.now_realtime_ns() + 30 * ms;
    ASSERT_TRUE(d.submit(job_at(1, t, 5), payload));
    ASSERT_TRUE(d.submit(job_at(2, t + 20 * ms, 6), payload));
    ASSERT_TRUE(d.start());
    const auto recs = wait_records(d, 2);
    d.stop();
    ASSERT_EQ(recs.size(), 2u);
    EXPECT_EQ(recs[0].job_id, 1u);
    EXPECT_EQ(recs[0].status, dispatch_status::calibration_changed) << to_string(recs[0].status);
    EXPECT_EQ(recs[1].job_id, 2u);
    ASSERT_EQ(recs[1].status, dispatch_status::sent) << to_string(recs[1].status) << " io " << recs[1].io_result;
    EXPECT_EQ(recs[1].io_result, static_cast<std::int32_t>(wire::header_len + sizeof(payload)));

    const auto frames = read_frames();
    ASSERT_EQ(frames.size(), 1u);
    const wire::header& h = frames[0].hdr;
    EXPECT_EQ(h.type, QRT_WIRE_JOB);
    EXPECT_EQ(h.job_id, 2u);
    EXPECT_EQ(h.calibration_id, 6u);
    EXPECT_EQ(h.scheduled_ns, t + 20 * ms);
    EXPECT_EQ(h.sent_ns, recs[1].sent_ns);
    EXPECT_NE(h.sent_ns, 0);
    EXPECT_EQ(h.shots, 10u);
    EXPECT_EQ(frames[0].payload_text(), "hello");
}

TEST_F(dispatcher_fixture, calibration_change_after_submit_stops_a_queued_job) {
    dispatcher d(untuned(), _clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    d.set_calibration_id(3);
    ASSERT_TRUE(d.submit(job_at(9, _clock.now_realtime_ns() + 50 * ms, 3), payload));
    ASSERT_TRUE(d.start());
    d.set_calibration_id(4);  // the window changed before T
    const auto recs = wait_records(d, 1);
    d.stop();
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].status, dispatch_status::calibration_changed);
    EXPECT_TRUE(read_frames().empty());
}

TEST_F(dispatcher_fixture, a_withdrawn_job_is_cancelled_and_never_sent) {
    dispatcher d(untuned(), _clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    const std::int64_t t = _clock.now_realtime_ns() + 60 * ms;
    ASSERT_TRUE(d.submit(job_at(5, t), payload));
    ASSERT_TRUE(d.submit(job_at(6, t + 20 * ms), payload));
    ASSERT_TRUE(d.start());
    EXPECT_EQ(d.withdraw(5), dispatcher::withdraw_result::withdrawn) << "job 5 is queued";
    EXPECT_EQ(d.withdraw(77), dispatcher::withdraw_result::not_queued) << "job 77 was never submitted";
    const auto recs = wait_records(d, 2);
    d.stop();
    ASSERT_EQ(recs.size(), 2u);
    EXPECT_EQ(recs[0].job_id, 5u);
    EXPECT_EQ(recs[0].status, dispatch_status::cancelled) << to_string(recs[0].status);
    EXPECT_EQ(recs[0].sent_ns, 0);
    EXPECT_EQ(recs[1].job_id, 6u);
    EXPECT_EQ(recs[1].status, dispatch_status::sent) << to_string(recs[1].status);
    const auto frames = read_frames();
    ASSERT_EQ(frames.size(), 1u) << "only the job that was not withdrawn reaches the endpoint";
    EXPECT_EQ(frames[0].hdr.job_id, 6u);
}

TEST_F(dispatcher_fixture, without_an_endpoint_the_job_fails_endpoint_down) {
    dispatcher d(untuned(), _clock);
    ASSERT_TRUE(d.submit(job_at(1, _clock.now_realtime_ns() + 10 * ms), payload));
    ASSERT_TRUE(d.start());
    const auto recs = wait_records(d, 1);
    d.stop();
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].status, dispatch_status::endpoint_down);
}

TEST_F(dispatcher_fixture, stop_cancels_queued_jobs) {
    dispatcher d(untuned(), _clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    ASSERT_TRUE(d.submit(job_at(1, _clock.now_realtime_ns() + 10'000 * ms), payload));
    ASSERT_TRUE(d.start());
    d.stop();
    const auto recs = wait_records(d, 1);
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].status, dispatch_status::cancelled);
    EXPECT_EQ(d.queued(), 0u) << "the slot came back to the pool";
}

TEST_F(dispatcher_fixture, submit_refuses_bad_jobs_with_a_reason) {
    dispatcher d(untuned(), _clock);
    const std::int64_t t = _clock.now_realtime_ns() + 1000 * ms;
    ASSERT_TRUE(d.submit(job_at(1, t), payload));
    ASSERT_TRUE(d.submit(job_at(2, t - 1), payload)) << "an earlier start after a later one is accepted";

    dispatch_job outside = job_at(3, t + 1);
    outside.window_end_ns = outside.scheduled_ns + outside.duration_ns - 1;
    auto st = d.submit(outside, payload);
    ASSERT_FALSE(st);
    EXPECT_NE(st.err().message.find("not inside its window"), std::string::npos) << st.err().message;

    std::vector<std::uint8_t> big(257);
    st = d.submit(job_at(4, t + 2), big);
    ASSERT_FALSE(st);
    EXPECT_NE(st.err().message.find("max_payload_bytes"), std::string::npos);

    for (std::uint64_t id = 10; id < 16; ++id) {
        ASSERT_TRUE(d.submit(job_at(id, t + static_cast<std::int64_t>(id)), payload));
    }
    st = d.submit(job_at(99, t + 100), payload);
    ASSERT_FALSE(st) << "8 slots are in use";
    EXPECT_EQ(st.err().code, EBUSY);
}

TEST(dispatcher_clock_step, queued_deadlines_are_reconverted_after_a_realtime_step) {
    rtcore::fake_clock clock;
    int sp[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    dispatcher_config cfg;
    cfg.mode = dispatch_mode::untuned;
    cfg.slots = 4;
    cfg.max_payload_bytes = 64;
    dispatcher d(cfg, clock);
    dispatch_job j;
    j.job_id = 77;
    j.scheduled_ns = clock.now_realtime_ns() + 10 * rtcore::ns_per_s;
    j.window_start_ns = j.scheduled_ns;
    j.window_end_ns = j.scheduled_ns + rtcore::ns_per_s;
    j.tolerance_ns = 1 * ms;
    ASSERT_TRUE(d.submit(j, {}));
    const std::int64_t mono0 = clock.now_monotonic_ns();
    ASSERT_EQ(d.queued_deadline_ns(77), mono0 + 10 * rtcore::ns_per_s);

    // The realtime clock is set back by 3 s (e.g. PTP step): the job's start,
    // given in realtime, is now 13 s away on CLOCK_MONOTONIC.
    clock.step_realtime(-3 * rtcore::ns_per_s);
    EXPECT_EQ(d.on_realtime_step(rtcore::time_base::sample(clock)), 1u);
    ASSERT_EQ(d.queued_deadline_ns(77), mono0 + 13 * rtcore::ns_per_s);

    ASSERT_TRUE(d.set_endpoint_fd(sp[0]));
    ASSERT_TRUE(d.start());
    std::vector<dispatch_record> recs;
    for (int i = 0; i < 3000 && recs.empty(); ++i) {
        d.drain_records([&](const dispatch_record& r) { recs.push_back(r); });
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    d.stop();
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].status, dispatch_status::sent) << to_string(recs[0].status);
    EXPECT_EQ(recs[0].deadline_ns, mono0 + 13 * rtcore::ns_per_s) << "sent at the re-converted deadline";
    ::close(sp[0]);
    ::close(sp[1]);
}

TEST(realtime_step_follower, a_detected_step_reconverts_every_followed_dispatcher) {
    rtcore::fake_clock clock;
    qrt::event_loop loop;
    auto follower = realtime_step_follower::open(loop, clock);
    ASSERT_TRUE(follower) << follower.err().message;
    dispatcher_config cfg;
    cfg.mode = dispatch_mode::untuned;
    cfg.slots = 2;
    cfg.max_payload_bytes = 16;
    dispatcher a(cfg, clock);
    dispatcher b(cfg, clock);
    (*follower)->follow([&](const rtcore::time_base& base) { return a.on_realtime_step(base); });
    (*follower)->follow([&](const rtcore::time_base& base) { return b.on_realtime_step(base); });
    dispatch_job j;
    j.job_id = 5;
    j.scheduled_ns = clock.now_realtime_ns() + 60 * rtcore::ns_per_s;
    j.window_start_ns = j.scheduled_ns;
    j.window_end_ns = j.scheduled_ns + rtcore::ns_per_s;
    ASSERT_TRUE(a.submit(j, {}));
    j.scheduled_ns += 1;
    ASSERT_TRUE(b.submit(j, {}));
    const std::int64_t before_a = *a.queued_deadline_ns(5);

    clock.step_realtime(+2 * rtcore::ns_per_s);  // realtime jumps forward: T is 2 s nearer
    auto step = (*follower)->resample_now();
    ASSERT_TRUE(step) << step.err().message;
    EXPECT_EQ(step->step_ns, 2 * rtcore::ns_per_s);
    EXPECT_EQ((*follower)->reconverted(), 2u);
    EXPECT_EQ(*a.queued_deadline_ns(5), before_a - 2 * rtcore::ns_per_s);
    EXPECT_EQ(*b.queued_deadline_ns(5), before_a + 1 - 2 * rtcore::ns_per_s);
}

// ---- edge cases from review: never late, never blocked, never stale ----

TEST_F(dispatcher_fixture, a_frame_the_endpoint_cannot_take_at_t_fails_and_is_never_sent_late) {
    // Fill the socket buffer (the peer never reads): the write cannot go out
    // at T.  It must fail then (RWF_NOWAIT), not be parked by io_uring and
    // sent when the peer drains the buffer later.
    int sndbuf = 4096;
    ASSERT_EQ(::setsockopt(_sp[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
    std::vector<std::uint8_t> filler(1024, 0xAB);
    std::size_t filled = 0;
    while (true) {
        const ssize_t n = ::send(_sp[0], filler.data(), filler.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n <= 0) {
            break;
        }
        filled += static_cast<std::size_t>(n);
        ASSERT_LT(filled, std::size_t{64} << 20) << "the socket buffer never filled";
    }
    dispatcher d(untuned(), _clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    dispatch_job j = job_at(1, _clock.now_realtime_ns() + 20 * ms);
    j.tolerance_ns = 30 * ms;
    ASSERT_TRUE(d.submit(j, payload));
    ASSERT_TRUE(d.start());
    const auto recs = wait_records(d, 1);
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].status, dispatch_status::send_failed) << to_string(recs[0].status);
    EXPECT_EQ(recs[0].io_result, -EAGAIN) << "refused at T, not queued";
    EXPECT_EQ(d.thread_stats().send_blocked, 1u);
    // Drain the peer: only the filler comes out, never the job's frame.
    std::size_t drained = 0;
    std::uint8_t buf[4096];
    for (int i = 0; i < 200; ++i) {
        const ssize_t n = ::recv(_sp[1], buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
            drained += static_cast<std::size_t>(n);
            continue;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    d.stop();
    EXPECT_EQ(drained, filled) << "the refused frame reached the endpoint later";
}

TEST_F(dispatcher_fixture, a_job_handed_to_an_idle_thread_is_picked_up_at_once) {
    // The idle thread would look at the ring only once a minute: submit()
    // must wake it, or a job due in 50 ms is missed.
    dispatcher_config c = untuned();
    c.idle_sleep_ns = 60'000 * ms;
    dispatcher d(c, _clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    ASSERT_TRUE(d.start());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let it go idle
    dispatch_job j = job_at(1, _clock.now_realtime_ns() + 50 * ms);
    j.tolerance_ns = 500 * ms;
    ASSERT_TRUE(d.submit(j, payload));
    const auto recs = wait_records(d, 1);
    d.stop();
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].status, dispatch_status::sent) << to_string(recs[0].status);
    EXPECT_GE(d.thread_stats().early_wakes, 1u);
}

TEST_F(dispatcher_fixture, a_realtime_step_during_the_last_sleep_moves_the_send_at_once) {
    // One long sleep (no chunking) towards T = now + 20 s; a step then makes
    // T 100 ms away.  The sleep must be cut short: the job goes out long
    // before the old wake-up time (the wait below gives up after 3 s).
    stepping_clock clock;
    dispatcher_config c = untuned();
    c.max_sleep_chunk_ns = 3'600'000 * ms;
    dispatcher d(c, clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    const std::int64_t t_rt = clock.now_realtime_ns() + 20'000 * ms;
    dispatch_job j = job_at(1, t_rt);
    j.window_start_ns = t_rt - 60'000 * ms;
    ASSERT_TRUE(d.submit(j, payload));
    ASSERT_TRUE(d.start());
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // asleep towards T
    // The realtime clock jumps forward by 19.9 s; the step watch reports it.
    clock.step_realtime(19'900 * ms);
    EXPECT_EQ(d.on_realtime_step(rtcore::time_base::sample(clock)), 1u);
    const auto recs = wait_records(d, 1);
    d.stop();
    ASSERT_EQ(recs.size(), 1u) << "still asleep towards the old deadline";
    EXPECT_EQ(recs[0].status, dispatch_status::sent) << to_string(recs[0].status);
    EXPECT_GE(d.thread_stats().early_wakes, 1u);
    EXPECT_EQ(read_frames().size(), 1u);
}

// ---- realtime steps nobody has reported yet ----
//
// The step watch runs on the housekeeping loop; until it has re-converted
// (the loop is busy, or the step came before the watch was armed), the
// dispatch thread holds deadlines made with the old offset.  It must check
// the offset itself: a job is never sent before its realtime start (a
// backward step) and never later than its tolerance (a forward one).

namespace {
constexpr std::int64_t step_tolerance_ns = 50 * ms;

dispatch_job job_with_tolerance(std::uint64_t id, std::int64_t t_rt) {
    dispatch_job j;
    j.job_id = id;
    j.scheduled_ns = t_rt;
    j.window_start_ns = t_rt - 5'000 * ms;
    j.window_end_ns = t_rt + 5'000 * ms;
    j.duration_ns = 100'000;
    j.calibration_id = 1;
    j.tolerance_ns = step_tolerance_ns;
    j.shots = 10;
    return j;
}

// Each of n jobs was sent, not before its realtime start (1 ms of sampling
// slack) and not later than its tolerance, by the realtime clock it was
// scheduled on.
void expect_sent_on_time(const std::vector<dispatch_record>& recs, const std::vector<dispatch_job>& jobs) {
    ASSERT_EQ(recs.size(), jobs.size());
    for (const auto& r : recs) {
        const auto j = std::find_if(jobs.begin(), jobs.end(), [&](const dispatch_job& x) { return x.job_id == r.job_id; });
        ASSERT_NE(j, jobs.end());
        EXPECT_EQ(r.status, dispatch_status::sent) << "job " << r.job_id << ": " << to_string(r.status);
        EXPECT_GE(r.sent_ns, j->scheduled_ns - ms)
            << "job " << r.job_id << " sent " << (j->scheduled_ns - r.sent_ns) / ms << " ms before its start";
        EXPECT_LE(r.sent_ns, j->scheduled_ns + step_tolerance_ns)
            << "job " << r.job_id << " sent " << (r.sent_ns - j->scheduled_ns) / ms << " ms after its start";
    }
}
}  // namespace

TEST_F(dispatcher_fixture, a_backward_step_of_100_ms_with_jobs_handed_over_sends_them_at_their_start_not_early) {
    stepping_clock clock;
    dispatcher d(untuned(), clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    std::vector<dispatch_job> jobs;
    const std::int64_t t0 = clock.now_realtime_ns() + 120 * ms;
    for (std::uint64_t i = 0; i < 6; ++i) {
        jobs.push_back(job_with_tolerance(i + 1, t0 + static_cast<std::int64_t>(i) * 10 * ms));
        ASSERT_TRUE(d.submit(jobs.back(), payload));
    }
    ASSERT_TRUE(d.start());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // handed over, asleep towards the first
    clock.step_realtime(-100 * ms);  // not reported: the watch has not run yet
    const auto recs = wait_records(d, jobs.size());
    d.stop();
    expect_sent_on_time(recs, jobs);
    EXPECT_GE(d.thread_stats().steps_followed, 1u);
    EXPECT_EQ(read_frames().size(), jobs.size());
}

TEST_F(dispatcher_fixture, a_forward_step_of_200_ms_with_jobs_handed_over_sends_them_at_their_start_not_late) {
    stepping_clock clock;
    dispatcher d(untuned(), clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    std::vector<dispatch_job> jobs;
    const std::int64_t t0 = clock.now_realtime_ns() + 400 * ms;
    for (std::uint64_t i = 0; i < 6; ++i) {
        jobs.push_back(job_with_tolerance(i + 1, t0 + static_cast<std::int64_t>(i) * 10 * ms));
        ASSERT_TRUE(d.submit(jobs.back(), payload));
    }
    ASSERT_TRUE(d.start());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    clock.step_realtime(+200 * ms);  // T is now 200 ms nearer; nobody says so
    const auto recs = wait_records(d, jobs.size());
    d.stop();
    expect_sent_on_time(recs, jobs);
    EXPECT_GE(d.thread_stats().steps_followed, 1u);
}

TEST_F(dispatcher_fixture, a_2_s_step_after_the_time_base_was_sampled_is_followed_before_the_first_send) {
    // Start-up: the dispatcher samples its time base, then the clock steps by
    // +2 s before any watch could report it; jobs are converted with the old
    // base.  They must still go out at their realtime start.
    stepping_clock clock;
    dispatcher d(untuned(), clock);
    clock.step_realtime(2'000 * ms);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    std::vector<dispatch_job> jobs;
    const std::int64_t t0 = clock.now_realtime_ns() + 150 * ms;
    for (std::uint64_t i = 0; i < 6; ++i) {
        jobs.push_back(job_with_tolerance(i + 1, t0 + static_cast<std::int64_t>(i) * 10 * ms));
        ASSERT_TRUE(d.submit(jobs.back(), payload));
    }
    ASSERT_TRUE(d.start());
    const auto recs = wait_records(d, jobs.size());
    d.stop();
    expect_sent_on_time(recs, jobs);
}

TEST_F(dispatcher_fixture, a_job_handed_over_after_an_unreported_step_keeps_the_start_order) {
    // The thread has followed a -100 ms step itself; a job submitted next
    // with the stale base (housekeeping has not re-sampled) between two
    // pending ones is converted like them and goes out between them.
    stepping_clock clock;
    dispatcher d(untuned(), clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    const std::int64_t t0 = clock.now_realtime_ns() + 150 * ms;
    std::vector<dispatch_job> jobs{job_with_tolerance(1, t0), job_with_tolerance(3, t0 + 40 * ms)};
    ASSERT_TRUE(d.submit(jobs[0], payload));
    ASSERT_TRUE(d.submit(jobs[1], payload));
    ASSERT_TRUE(d.start());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    clock.step_realtime(-100 * ms);
    for (int i = 0; i < 3000 && d.thread_stats().steps_followed == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_GE(d.thread_stats().steps_followed, 1u) << "the thread never looked at the clock";
    jobs.push_back(job_with_tolerance(2, t0 + 20 * ms));
    ASSERT_TRUE(d.submit(jobs.back(), payload));
    const auto recs = wait_records(d, jobs.size());
    d.stop();
    expect_sent_on_time(recs, jobs);
    ASSERT_EQ(recs.size(), 3u);
    EXPECT_EQ(recs[0].job_id, 1u);
    EXPECT_EQ(recs[1].job_id, 2u);
    EXPECT_EQ(recs[2].job_id, 3u);
}

TEST_F(dispatcher_fixture, a_new_endpoint_is_registered_by_the_dispatch_thread_itself) {
    dispatcher d(untuned(), _clock);
    ASSERT_TRUE(d.start());
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));  // while running: handed over, applied by the thread
    EXPECT_TRUE(d.endpoint_up());
    EXPECT_EQ(d.thread_stats().endpoint_updates, 1u);
    ASSERT_TRUE(d.submit(job_at(1, _clock.now_realtime_ns() + 30 * ms), payload));
    const auto recs = wait_records(d, 1);
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].status, dispatch_status::sent) << to_string(recs[0].status);
    d.clear_endpoint();
    EXPECT_FALSE(d.endpoint_up());
    ASSERT_TRUE(d.submit(job_at(2, _clock.now_realtime_ns() + 30 * ms), payload));
    const auto after = wait_records(d, 1);
    d.stop();
    ASSERT_EQ(after.size(), 1u);
    EXPECT_EQ(after[0].status, dispatch_status::endpoint_down) << to_string(after[0].status);
    EXPECT_EQ(read_frames().size(), 1u);
}

TEST_F(dispatcher_fixture, stop_wakes_a_thread_in_a_long_idle_sleep) {
    // Idle, the thread sleeps up to idle_sleep_ns: stop() must cut that
    // short (the wake word), not wait an hour for it.
    dispatcher_config c = untuned();
    c.idle_sleep_ns = 3'600'000 * ms;
    dispatcher d(c, _clock);
    ASSERT_TRUE(d.start());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // asleep
    std::atomic<bool> stopped{false};
    std::thread stopper([&] {
        d.stop();
        stopped = true;
    });
    for (int i = 0; i < 10'000 && !stopped.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(stopped.load()) << "stop() still waiting for the idle sleep";
    stopper.join();  // returns within the hour in any case
    EXPECT_FALSE(d.running());
}

TEST_F(dispatcher_fixture, jobs_handed_over_out_of_start_order_go_out_in_start_order) {
    // Backfill: the ledger places a job into a gap before jobs already handed
    // over.  Every job is sent, and the endpoint sees them by start.
    dispatcher d(untuned(), _clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    const std::int64_t t = _clock.now_realtime_ns() + 100 * ms;
    ASSERT_TRUE(d.submit(job_at(1, t + 200 * ms), payload));
    ASSERT_TRUE(d.submit(job_at(2, t), payload));
    ASSERT_TRUE(d.submit(job_at(3, t + 100 * ms), payload));
    ASSERT_TRUE(d.submit(job_at(4, t + 100 * ms), payload));  // same start: after job 3
    ASSERT_TRUE(d.start());
    const auto recs = wait_records(d, 4);
    d.stop();
    ASSERT_EQ(recs.size(), 4u);
    const std::uint64_t want[] = {2, 3, 4, 1};
    for (std::size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(recs[i].job_id, want[i]) << "record " << i;
        EXPECT_EQ(recs[i].status, dispatch_status::sent) << "job " << recs[i].job_id << ": " << to_string(recs[i].status);
    }
    const auto frames = read_frames();
    ASSERT_EQ(frames.size(), 4u);
    for (std::size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(frames[i].hdr.job_id, want[i]) << "frame " << i;
    }
}

TEST_F(dispatcher_fixture, a_job_handed_over_before_the_one_the_thread_sleeps_towards_goes_out_first) {
    // The thread sleeps in one piece towards a job 20 s away; a job due in
    // 80 ms arrives.  It must be sent (not refused, not held behind the
    // later one); the later one is still queued at stop.
    dispatcher_config c = untuned();
    c.max_sleep_chunk_ns = 60'000 * ms;
    dispatcher d(c, _clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    ASSERT_TRUE(d.submit(job_at(1, _clock.now_realtime_ns() + 20'000 * ms), payload));
    ASSERT_TRUE(d.start());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let it go to sleep
    ASSERT_TRUE(d.submit(job_at(2, _clock.now_realtime_ns() + 80 * ms), payload));
    const auto first = wait_records(d, 1);
    d.stop();
    ASSERT_EQ(first.size(), 1u) << "the earlier job was not sent within 3 s";
    EXPECT_EQ(first[0].job_id, 2u);
    EXPECT_EQ(first[0].status, dispatch_status::sent) << to_string(first[0].status);
    const auto rest = wait_records(d, 1);
    ASSERT_EQ(rest.size(), 1u);
    EXPECT_EQ(rest[0].job_id, 1u);
    EXPECT_EQ(rest[0].status, dispatch_status::cancelled) << "stopped with the later job queued";
    const auto frames = read_frames();
    ASSERT_EQ(frames.size(), 1u);
    EXPECT_EQ(frames[0].hdr.job_id, 2u);
}

TEST_F(dispatcher_fixture, withdrawing_a_job_whose_frame_is_out_says_too_late) {
    // The ledger must not record `cancelled` for a job the QPU got: once the
    // frame is on the wire, withdraw() loses the race and says so.
    dispatcher d(untuned(), _clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    ASSERT_TRUE(d.submit(job_at(1, _clock.now_realtime_ns() + 20 * ms), payload));
    ASSERT_TRUE(d.start());
    pollfd p{_sp[1], POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 3000), 1) << "the frame never arrived";
    // The record is not drained yet: the job still holds its slot.
    EXPECT_EQ(d.withdraw(1), dispatcher::withdraw_result::too_late);
    const auto recs = wait_records(d, 1);
    d.stop();
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].status, dispatch_status::sent) << to_string(recs[0].status);
    EXPECT_EQ(read_frames().size(), 1u);
}

TEST_F(dispatcher_fixture, a_restored_job_is_sent_as_if_never_withdrawn) {
    dispatcher d(untuned(), _clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    ASSERT_TRUE(d.submit(job_at(1, _clock.now_realtime_ns() + 100 * ms), payload));
    ASSERT_TRUE(d.start());
    ASSERT_EQ(d.withdraw(1), dispatcher::withdraw_result::withdrawn);
    EXPECT_TRUE(d.restore(1));
    EXPECT_FALSE(d.restore(2)) << "job 2 was never submitted";
    const auto recs = wait_records(d, 1);
    d.stop();
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].status, dispatch_status::sent) << to_string(recs[0].status);
    ASSERT_EQ(read_frames().size(), 1u);
}

TEST_F(dispatcher_fixture, a_withdrawn_job_is_reported_at_once_not_at_its_start) {
    // The pump hands a re-placed job over again only once the stale copy is
    // reported: that must not wait for the stale start (20 s here).
    dispatcher_config c = untuned();
    c.max_sleep_chunk_ns = 60'000 * ms;
    dispatcher d(c, _clock);
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    ASSERT_TRUE(d.submit(job_at(1, _clock.now_realtime_ns() + 20'000 * ms), payload));
    ASSERT_TRUE(d.start());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let it go to sleep
    ASSERT_EQ(d.withdraw(1), dispatcher::withdraw_result::withdrawn);
    d.report_withdrawn();
    const auto recs = wait_records(d, 1);
    ASSERT_EQ(recs.size(), 1u) << "the withdrawn job was not reported within 3 s";
    EXPECT_EQ(recs[0].status, dispatch_status::cancelled);
    EXPECT_EQ(recs[0].sent_ns, 0);
    d.stop();
    EXPECT_TRUE(read_frames().empty());
}


// A tuned dispatch thread locks its dispatch path (the
// frame pool, rings, its stack and code) and nothing the process allocates
// later: 64 MiB of "client buffers" written after it started stay unlocked.
// Under mlockall(MCL_CURRENT | MCL_FUTURE) VmLck grew by all 64 MiB.
TEST_F(dispatcher_fixture, a_tuned_thread_locks_its_dispatch_path_and_not_what_is_allocated_later) {
    if (!qrt::testing::mlock_really_locks()) {
        GTEST_SKIP() << qrt::testing::mlock_locks_nothing;
    }
    if (!rtcore::has_capability(CAP_SYS_NICE) || !rtcore::has_capability(CAP_IPC_LOCK)) {
        GTEST_SKIP() << "needs CAP_SYS_NICE and CAP_IPC_LOCK (root) for a tuned dispatch thread";
    }
    const auto before = rtcore::read_process_locked_memory();
    ASSERT_GE(before.vm_lck_bytes, 0) << "no VmLck line in /proc/self/status";
    dispatcher_config c = untuned();
    c.mode = dispatch_mode::tuned;
    c.dispatch_cpu = -1;
    c.hold_cpu_dma_latency = false;
    c.slots = 64;
    c.max_payload_bytes = 16 * 1024;
    dispatcher d(c, _clock);
    ASSERT_TRUE(d.start());
    const auto ts = d.thread_stats();
    ASSERT_TRUE(ts.rt_applied) << d.setup_error();
    ASSERT_TRUE(ts.mlocked) << d.setup_error();
    const auto pool = dispatcher::frame_pool_bytes(c.slots, c.max_payload_bytes);
    EXPECT_GE(ts.locked_bytes, pool);
    const auto locked = rtcore::read_process_locked_memory();
    EXPECT_GE(locked.vm_lck_bytes - before.vm_lck_bytes, static_cast<std::int64_t>(pool));

    std::vector<std::unique_ptr<char[]>> buffers;
    for (int i = 0; i < 64; ++i) {
        buffers.push_back(std::make_unique<char[]>(1 << 20));
        std::memset(buffers.back().get(), i + 1, 1 << 20);
    }
    const auto loaded = rtcore::read_process_locked_memory();
    std::printf("VmLck before %lld kB, dispatcher started %lld kB, after 64 MiB allocated %lld kB "
                "(dispatch path %llu kB)\n",
                static_cast<long long>(before.vm_lck_bytes / 1024), static_cast<long long>(locked.vm_lck_bytes / 1024),
                static_cast<long long>(loaded.vm_lck_bytes / 1024),
                static_cast<unsigned long long>(ts.locked_bytes / 1024));
    EXPECT_LT(loaded.vm_lck_bytes - locked.vm_lck_bytes, 4 << 20)
        << "memory allocated after the dispatcher started was locked too (mlockall MCL_FUTURE?)";
    d.stop();
    // Its regions are given back when the thread ends.
    EXPECT_LE(rtcore::read_process_locked_memory().vm_lck_bytes, before.vm_lck_bytes);
}

// A container (or a unit without LimitMEMLOCK=) gives 8
// MiB of RLIMIT_MEMLOCK and no CAP_IPC_LOCK; the default frame pool
// (1024 slots of 64 KiB payloads) is 64.1 MiB, and registering it with
// io_uring locks it.  qrtd exited at start even in untuned mode
// ("io_uring_register_buffers (67239936 bytes): Cannot allocate memory:
// Cannot allocate memory") and systemd restarted it until it gave up.
namespace {

// In a child: CAP_IPC_LOCK gone and RLIMIT_MEMLOCK 8 MiB, as in a container.
std::string as_in_a_container() {
    if (rtcore::has_capability(CAP_IPC_LOCK)) {
        rtcore::drop_options o;
        o.set_no_new_privs = false;
        if (auto d = rtcore::drop_capabilities_except({CAP_SYS_NICE}, o); !d) {
            return "dropping CAP_IPC_LOCK: " + d.err().message;
        }
    }
    const rlimit rl{8U << 20, 8U << 20};
    if (::setrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
        return std::string("setrlimit RLIMIT_MEMLOCK: ") + std::strerror(errno);
    }
    if (rtcore::has_capability(CAP_IPC_LOCK)) {
        return "CAP_IPC_LOCK is still effective";
    }
    return "";
}

dispatcher_config default_pool(dispatch_mode mode) {
    dispatcher_config c;
    c.mode = mode;
    c.slots = 1024;
    c.max_payload_bytes = 64 * 1024;
    c.hold_cpu_dma_latency = false;
    return c;
}

}  // namespace

TEST(dispatcher_memlock, untuned_without_locked_memory_dispatches_from_unregistered_buffers) {
    const auto r = qrt::testing::run_in_child([](std::string& reply) -> int {
        if (auto why = as_in_a_container(); !why.empty()) {
            reply = why;
            return 77;
        }
        rtcore::real_clock clock;
        dispatcher d(default_pool(dispatch_mode::untuned), clock);
        reply = d.buffers_fallback_reason();
        if (d.fixed_buffers()) {
            return 10;
        }
        int sp[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0 || !d.set_endpoint_fd(sp[0]) || !d.start()) {
            return 11;
        }
        dispatch_job j;
        j.job_id = 42;
        j.scheduled_ns = clock.now_realtime_ns() + 50 * ms;
        j.window_start_ns = j.scheduled_ns - 1000 * ms;
        j.window_end_ns = j.scheduled_ns + 1000 * ms;
        j.duration_ns = 100'000;
        j.calibration_id = 1;
        j.tolerance_ns = 300 * ms;
        j.shots = 10;
        d.set_calibration_id(1);
        if (!d.submit(j, payload)) {
            return 12;
        }
        std::vector<dispatch_record> recs;
        for (int i = 0; i < 3000 && recs.empty(); ++i) {
            d.drain_records([&](const dispatch_record& rec) { recs.push_back(rec); });
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        d.stop();
        if (recs.empty() || recs[0].status != dispatch_status::sent) {
            reply += recs.empty() ? "; no record" : std::string("; status ") + to_string(recs[0].status);
            return 13;
        }
        wire::frame_reader fr;
        std::uint8_t buf[4096];
        const ssize_t n = ::recv(sp[1], buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
            fr.feed({buf, static_cast<std::size_t>(n)});
        }
        auto f = fr.next();
        return f && f->hdr.job_id == 42 ? 0 : 14;
    });
    if (r.exit_code == 77) {
        GTEST_SKIP() << r.reply;
    }
    ASSERT_EQ(r.exit_code, 0) << r.reply << r.err;
    EXPECT_NE(r.reply.find("frame buffers not registered with io_uring (plain writes): RLIMIT_MEMLOCK = 8 MiB and "
                           "no CAP_IPC_LOCK, 64.1 MiB needed"),
              std::string::npos)
        << r.reply;
}

TEST(dispatcher_memlock, tuned_without_locked_memory_refuses_naming_the_limit_the_need_and_the_remedy) {
    const auto r = qrt::testing::run_in_child([](std::string& reply) -> int {
        if (auto why = as_in_a_container(); !why.empty()) {
            reply = why;
            return 77;
        }
        rtcore::real_clock clock;
        try {
            dispatcher d(default_pool(dispatch_mode::tuned), clock);
        } catch (const std::exception& e) {
            reply = e.what();
            return 0;
        }
        return 10;
    });
    if (r.exit_code == 77) {
        GTEST_SKIP() << r.reply;
    }
    ASSERT_EQ(r.exit_code, 0) << "a tuned dispatcher started without being able to lock its pool";
    for (const char* part : {"dispatch: qpu 0: tuned mode cannot lock its frame pool: RLIMIT_MEMLOCK = 8 MiB and no "
                             "CAP_IPC_LOCK, 64.1 MiB needed",
                             "dispatch.ring_capacity", "Raise the limit", "or grant CAP_IPC_LOCK", "LimitMEMLOCK=infinity"}) {
        EXPECT_NE(r.reply.find(part), std::string::npos) << part << "\nin: " << r.reply;
    }
    EXPECT_EQ(r.reply.find("Cannot allocate memory: Cannot allocate memory"), std::string::npos) << r.reply;
}

