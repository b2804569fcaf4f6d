#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/timerfd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <thread>

#include "rtcore/clock.hpp"

using rtcore::ns_per_s;

TEST(clock, timespec_conversion_round_trips_including_negative_values) {
    for (const std::int64_t ns : {0L, 1L, 999'999'999L, 1'000'000'000L, 1'767'225'600'123'456'789L, -1L, -1'500'000'000L}) {
        const timespec ts = rtcore::to_timespec(ns);
        EXPECT_GE(ts.tv_nsec, 0);
        EXPECT_LT(ts.tv_nsec, ns_per_s);
        EXPECT_EQ(rtcore::to_ns(ts), ns);
    }
}

TEST(clock, real_clock_reads_the_host_clocks) {
    rtcore::real_clock clk;
    const std::int64_t m1 = clk.now_monotonic_ns();
    const std::int64_t r = clk.now_realtime_ns();
    const std::int64_t m2 = clk.now_monotonic_ns();
    EXPECT_LE(m1, m2);
    EXPECT_GT(r, 1'600'000'000 * ns_per_s);  // after 2020
    static_assert(noexcept(clk.now_monotonic_ns()));
    static_assert(noexcept(clk.sleep_until_monotonic_ns(0)));
}

TEST(clock, real_sleep_until_returns_at_or_after_the_deadline) {
    rtcore::real_clock clk;
    const std::int64_t target = clk.now_monotonic_ns() + 2'000'000;
    EXPECT_EQ(clk.sleep_until_monotonic_ns(target), 0);
    EXPECT_GE(clk.now_monotonic_ns(), target);
    // A deadline in the past returns at once with success.
    EXPECT_EQ(clk.sleep_until_monotonic_ns(target - ns_per_s), 0);
    EXPECT_EQ(clk.sleep_until_monotonic_ns(-5), -EINVAL);
}

namespace {
void on_usr1(int) {}
}  // namespace

TEST(clock, real_sleep_until_is_not_cut_short_by_a_signal) {
    struct sigaction sa {};
    struct sigaction old {};
    sa.sa_handler = on_usr1;  // no SA_RESTART: clock_nanosleep returns EINTR
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(::sigaction(SIGUSR1, &sa, &old), 0);
    rtcore::real_clock clk;
    const pthread_t sleeper = ::pthread_self();
    std::atomic<bool> done{false};
    std::thread poker([&] {
        for (int i = 0; i < 20 && !done.load(); ++i) {
            ::pthread_kill(sleeper, SIGUSR1);
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
    });
    const std::int64_t target = clk.now_monotonic_ns() + 30'000'000;
    const int rc = clk.sleep_until_monotonic_ns(target);
    const std::int64_t woke = clk.now_monotonic_ns();
    done = true;
    poker.join();
    ::sigaction(SIGUSR1, &old, nullptr);
    EXPECT_EQ(rc, 0);
    EXPECT_GE(woke, target);
}

TEST(clock, sleep_until_or_woken_sleeps_to_the_deadline_when_nobody_wakes_it) {
    rtcore::real_clock clk;
    rtcore::wake_word word{7};
    const std::int64_t t = clk.now_monotonic_ns() + 2'000'000;
    EXPECT_EQ(clk.sleep_until_or_woken(t, word, 7), 0);
    EXPECT_GE(clk.now_monotonic_ns(), t);
}

TEST(clock, sleep_until_or_woken_returns_at_once_when_the_word_already_moved) {
    rtcore::real_clock clk;
    rtcore::wake_word word{8};
    const std::int64_t t = clk.now_monotonic_ns() + 3'600 * ns_per_s;
    EXPECT_EQ(clk.sleep_until_or_woken(t, word, 7), -EAGAIN);
    EXPECT_EQ(clk.sleep_until_or_woken(-1, word, 8), -EINVAL);
}

TEST(clock, wake_sleepers_cuts_a_long_sleep_short) {
    rtcore::real_clock clk;
    rtcore::wake_word word{0};
    std::atomic<int> rc{1};
    std::thread sleeper([&] {
        // An hour: only the wake can end this within the test.
        rc = clk.sleep_until_or_woken(clk.now_monotonic_ns() + 3'600 * ns_per_s, word, 0);
    });
    // Wake until it has returned (the first wake may come before it sleeps:
    // then the word has moved and its sleep returns at once).
    for (int i = 0; i < 5000 && rc.load() == 1; ++i) {
        rtcore::wake_sleepers(word);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    sleeper.join();
    EXPECT_EQ(rc.load(), -EAGAIN);
    EXPECT_GE(word.load(), 1u);
}

TEST(clock, fake_sleep_until_or_woken_honours_the_word) {
    rtcore::fake_clock clk;
    rtcore::wake_word word{3};
    const std::int64_t t0 = clk.now_monotonic_ns();
    EXPECT_EQ(clk.sleep_until_or_woken(t0 + 10, word, 2), -EAGAIN);
    EXPECT_EQ(clk.now_monotonic_ns(), t0) << "a cut-short sleep does not move fake time";
    EXPECT_EQ(clk.sleep_until_or_woken(t0 + 10, word, 3), 0);
    EXPECT_EQ(clk.now_monotonic_ns(), t0 + 10);
}

TEST(clock, fake_clock_moves_only_when_told) {
    rtcore::fake_clock clk(5 * ns_per_s, 100 * ns_per_s);
    EXPECT_EQ(clk.now_monotonic_ns(), 5 * ns_per_s);
    EXPECT_EQ(clk.now_realtime_ns(), 100 * ns_per_s);
    clk.advance(250);
    EXPECT_EQ(clk.now_monotonic_ns(), 5 * ns_per_s + 250);
    EXPECT_EQ(clk.now_realtime_ns(), 100 * ns_per_s + 250);
    clk.step_realtime(-3 * ns_per_s);
    EXPECT_EQ(clk.now_monotonic_ns(), 5 * ns_per_s + 250);
    EXPECT_EQ(clk.now_realtime_ns(), 97 * ns_per_s + 250);
}

TEST(clock, fake_sleep_jumps_to_the_deadline_and_never_backwards) {
    rtcore::fake_clock clk(1000, 5000);
    EXPECT_EQ(clk.sleep_until_monotonic_ns(4000), 0);
    EXPECT_EQ(clk.now_monotonic_ns(), 4000);
    EXPECT_EQ(clk.now_realtime_ns(), 8000);
    EXPECT_EQ(clk.sleep_until_monotonic_ns(2000), 0);
    EXPECT_EQ(clk.now_monotonic_ns(), 4000);
    EXPECT_EQ(clk.sleeps(), 2u);
    EXPECT_EQ(clk.last_sleep_target_ns(), 2000);
}

TEST(time_base, converts_between_realtime_and_monotonic) {
    const rtcore::time_base base(1'000'000);
    EXPECT_EQ(base.to_monotonic_ns(1'000'500), 500);
    EXPECT_EQ(base.to_realtime_ns(500), 1'000'500);
    EXPECT_EQ(base.to_realtime_ns(base.to_monotonic_ns(123'456'789)), 123'456'789);
}

TEST(time_base, sample_on_a_fake_clock_is_exact) {
    rtcore::fake_clock clk(42 * ns_per_s, 1'767'225'600 * ns_per_s);
    const auto base = rtcore::time_base::sample(clk);
    EXPECT_EQ(base.offset_ns(), (1'767'225'600 - 42) * ns_per_s);
    EXPECT_EQ(base.uncertainty_ns(), 0);
}

namespace {
// A clock whose reads cost time, with one bracket much tighter than the rest:
// sample() must pick that one.
class slow_reads_clock final : public rtcore::clock_source {
public:
    std::int64_t now_monotonic_ns() const noexcept override {
        _mono += (_calls++ / 3 == 4) ? 10 : 1000;  // round 4 is tight
        return _mono;
    }
    std::int64_t now_realtime_ns() const noexcept override {
        ++_calls;
        _mono += (_calls / 3 == 4) ? 10 : 1000;
        return _mono + 7 * ns_per_s;
    }
    int sleep_until_monotonic_ns(std::int64_t) noexcept override { return 0; }

private:
    mutable std::int64_t _mono = 0;
    mutable int _calls = 0;
};
}  // namespace

TEST(time_base, sample_takes_the_tightest_bracket) {
    slow_reads_clock clk;
    const auto base = rtcore::time_base::sample(clk, 7);
    // In the tight bracket the realtime read sits 10 ns after m1 and the
    // estimate uses the bracket's middle: error at most the half-gap.
    EXPECT_LE(base.uncertainty_ns(), 10);
    EXPECT_NEAR(static_cast<double>(base.offset_ns()), static_cast<double>(7 * ns_per_s), 10.0);
}

TEST(realtime_step_watch, arms_a_timerfd_that_stays_quiet_without_a_step) {
    rtcore::real_clock clk;
    auto w = rtcore::realtime_step_watch::open(clk);
    ASSERT_TRUE(w) << w.err().message;
    ASSERT_GE(w->fd(), 0);
    itimerspec cur{};
    ASSERT_EQ(::timerfd_gettime(w->fd(), &cur), 0);
    EXPECT_GT(cur.it_value.tv_sec, 100L * 365 * 24 * 3600) << "armed far in the future";
    pollfd p{w->fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 20), 0) << "readable without a clock step";
    auto r = w->check();
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_FALSE(r->has_value());
    // The real offset is sampled with a tight bracket.
    EXPECT_LT(w->current().uncertainty_ns(), 1'000'000);
    EXPECT_NEAR(static_cast<double>(w->current().offset_ns()),
                static_cast<double>(clk.now_realtime_ns() - clk.now_monotonic_ns()), 5e6);
}

TEST(realtime_step_watch, a_step_on_the_fake_clock_reconverts_deadlines) {
    rtcore::fake_clock clk(10 * ns_per_s, 1'767'225'600 * ns_per_s);
    auto w = rtcore::realtime_step_watch::open(clk);
    ASSERT_TRUE(w) << w.err().message;
    const std::int64_t job_scheduled_ns = 1'767'225'605 * ns_per_s;  // 5 s from now
    EXPECT_EQ(w->current().to_monotonic_ns(job_scheduled_ns), 15 * ns_per_s);

    clk.advance(ns_per_s);
    clk.step_realtime(+2 * ns_per_s);  // chrony steps the clock forward 2 s
    auto step = w->rearm_and_resample();
    ASSERT_TRUE(step) << step.err().message;
    EXPECT_EQ(step->step_ns, 2 * ns_per_s);
    EXPECT_EQ(step->before.offset_ns(), (1'767'225'600 - 10) * ns_per_s);
    EXPECT_EQ(step->after.offset_ns(), (1'767'225'600 - 10 + 2) * ns_per_s);
    // The job is due 2 s earlier on the monotonic clock now.
    EXPECT_EQ(w->current().to_monotonic_ns(job_scheduled_ns), 13 * ns_per_s);

    // After re-arming the fd is quiet again.
    auto r = w->check();
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_FALSE(r->has_value());
}

TEST(realtime_step_watch, moves_keep_a_single_owner_of_the_fd) {
    rtcore::real_clock clk;
    auto w = rtcore::realtime_step_watch::open(clk);
    ASSERT_TRUE(w);
    const int fd = w->fd();
    rtcore::realtime_step_watch moved(std::move(*w));
    EXPECT_EQ(moved.fd(), fd);
    EXPECT_EQ(w->fd(), -1);
}
