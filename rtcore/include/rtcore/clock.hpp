#pragma once
// The clock seam, realtime <-> monotonic conversion, and realtime step watch.
//
// The API speaks realtime nanoseconds (UTC since the epoch); the dispatcher
// sleeps on CLOCK_MONOTONIC.  Deadlines are converted at enqueue with a
// time_base and re-converted when the realtime clock steps (PTP, chrony,
// date -s), which realtime_step_watch detects with TFD_TIMER_CANCEL_ON_SET.
//
//   rtcore::real_clock clk;                      // or rtcore::fake_clock in tests
//   auto base = rtcore::time_base::sample(clk);
//   const std::int64_t t_mono = base.to_monotonic_ns(job.scheduled_ns);
//   clk.sleep_until_monotonic_ns(t_mono - lead_ns);
//
// Every clock_source method is noexcept and allocation-free, so the dispatch
// thread may call it.

#include <time.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <optional>

#include "rtcore/error.hpp"
#include "rtcore/unique_fd.hpp"

namespace rtcore {

inline constexpr std::int64_t ns_per_s = 1'000'000'000;

constexpr timespec to_timespec(std::int64_t ns) noexcept {
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(ns / ns_per_s);
    ts.tv_nsec = static_cast<long>(ns % ns_per_s);
    if (ts.tv_nsec < 0) {
        ts.tv_nsec += ns_per_s;
        ts.tv_sec -= 1;
    }
    return ts;
}

constexpr std::int64_t to_ns(const timespec& ts) noexcept {
    return static_cast<std::int64_t>(ts.tv_sec) * ns_per_s + static_cast<std::int64_t>(ts.tv_nsec);
}

// The one direct read of each clock, for hot paths and tools that do not go
// through the seam (clock_source below): every clock_gettime in qrtd is here.
inline std::int64_t clock_now_ns(clockid_t clock) noexcept {
    timespec ts{};
    ::clock_gettime(clock, &ts);
    return to_ns(ts);
}
inline std::int64_t monotonic_now_ns() noexcept { return clock_now_ns(CLOCK_MONOTONIC); }
inline std::int64_t realtime_now_ns() noexcept { return clock_now_ns(CLOCK_REALTIME); }

// A word another thread bumps to cut a sleep short (see wake_sleepers and
// clock_source::sleep_until_or_woken).  A futex: no signal, no lock.
using wake_word = std::atomic<std::uint32_t>;
static_assert(sizeof(wake_word) == sizeof(std::uint32_t) && wake_word::is_always_lock_free,
              "wake_word must be a plain 32-bit futex word");

// Bump the word and wake every thread sleeping on it.
void wake_sleepers(wake_word& word) noexcept;

// The seam.  sleep_until_monotonic_ns returns 0 once CLOCK_MONOTONIC >= t_ns,
// or -errno on failure (EINVAL for a bad time); it is never interrupted
// early by a signal (EINTR is retried with the same absolute time).
// sleep_until_or_woken sleeps the same way (an absolute hrtimer on
// CLOCK_MONOTONIC, the caller's timer slack) unless `word` no longer holds
// `seen`, or changes while asleep and wake_sleepers() is called: then it
// returns -EAGAIN at once, and the caller re-reads what it was waiting for.
class clock_source {
public:
    clock_source() = default;
    clock_source(const clock_source&) = delete;
    clock_source& operator=(const clock_source&) = delete;
    virtual ~clock_source() = default;

    virtual std::int64_t now_monotonic_ns() const noexcept = 0;
    virtual std::int64_t now_realtime_ns() const noexcept = 0;
    virtual int sleep_until_monotonic_ns(std::int64_t t_ns) noexcept = 0;
    virtual int sleep_until_or_woken(std::int64_t t_ns, const wake_word& word, std::uint32_t seen) noexcept {
        if (word.load(std::memory_order_acquire) != seen) {
            return -EAGAIN;
        }
        return sleep_until_monotonic_ns(t_ns);
    }
};

// The host's clocks: clock_gettime and clock_nanosleep(CLOCK_MONOTONIC,
// TIMER_ABSTIME).
class real_clock final : public clock_source {
public:
    std::int64_t now_monotonic_ns() const noexcept override { return monotonic_now_ns(); }
    std::int64_t now_realtime_ns() const noexcept override { return realtime_now_ns(); }
    int sleep_until_monotonic_ns(std::int64_t t_ns) noexcept override;
    // FUTEX_WAIT_BITSET with an absolute CLOCK_MONOTONIC timeout.
    int sleep_until_or_woken(std::int64_t t_ns, const wake_word& word, std::uint32_t seen) noexcept override;
};

// A clock for tests: time moves only when told to.  sleep_until moves both
// clocks forward to the wake-up time (never backwards) and counts the sleep.
// Safe to drive from one thread while another reads it.
class fake_clock final : public clock_source {
public:
    explicit fake_clock(std::int64_t monotonic_ns = 1'000 * ns_per_s,
                        std::int64_t realtime_ns = 1'767'225'600 * ns_per_s) noexcept  // 2026-01-01
        : _mono(monotonic_ns), _real(realtime_ns) {}

    std::int64_t now_monotonic_ns() const noexcept override { return _mono.load(std::memory_order_acquire); }
    std::int64_t now_realtime_ns() const noexcept override { return _real.load(std::memory_order_acquire); }
    int sleep_until_monotonic_ns(std::int64_t t_ns) noexcept override;

    // Both clocks move forward by delta_ns (time passing).
    void advance(std::int64_t delta_ns) noexcept;
    // Only the realtime clock jumps (a PTP or chrony step, date -s).
    void step_realtime(std::int64_t delta_ns) noexcept { _real.fetch_add(delta_ns, std::memory_order_acq_rel); }

    std::uint64_t sleeps() const noexcept { return _sleeps.load(std::memory_order_acquire); }
    std::int64_t last_sleep_target_ns() const noexcept { return _last_target.load(std::memory_order_acquire); }

private:
    std::atomic<std::int64_t> _mono;
    std::atomic<std::int64_t> _real;
    std::atomic<std::uint64_t> _sleeps{0};
    std::atomic<std::int64_t> _last_target{0};
};

// realtime = monotonic + offset.  Pure conversion once sampled.
class time_base {
public:
    constexpr time_base() noexcept = default;
    constexpr explicit time_base(std::int64_t realtime_minus_monotonic_ns, std::int64_t uncertainty_ns = 0) noexcept
        : _offset_ns(realtime_minus_monotonic_ns), _uncertainty_ns(uncertainty_ns) {}

    // Sample the offset: `rounds` brackets of monotonic / realtime / monotonic
    // reads; the bracket with the smallest gap wins, and the realtime read is
    // taken to lie at its middle.  uncertainty_ns is half that gap.
    static time_base sample(const clock_source& clk, int rounds = 7) noexcept;

    constexpr std::int64_t offset_ns() const noexcept { return _offset_ns; }
    constexpr std::int64_t uncertainty_ns() const noexcept { return _uncertainty_ns; }
    constexpr std::int64_t to_monotonic_ns(std::int64_t realtime_ns) const noexcept { return realtime_ns - _offset_ns; }
    constexpr std::int64_t to_realtime_ns(std::int64_t monotonic_ns) const noexcept { return monotonic_ns + _offset_ns; }

    constexpr bool operator==(const time_base&) const noexcept = default;

private:
    std::int64_t _offset_ns = 0;
    std::int64_t _uncertainty_ns = 0;
};

// One detected realtime step: the offsets before and after and the jump.
struct realtime_step {
    time_base before;
    time_base after;
    std::int64_t step_ns = 0;  // after.offset_ns() - before.offset_ns()
};

// Watches for CLOCK_REALTIME being set (stepped).  Put fd() in the main
// loop's epoll (EPOLLIN); when it is readable, call check().
//
// The timerfd is armed on CLOCK_REALTIME with TFD_TIMER_ABSTIME |
// TFD_TIMER_CANCEL_ON_SET at the far future, so it never expires; a clock
// set makes read() fail with ECANCELED.  check() then re-arms (so the fd is
// quiet again), re-samples the time base through the clock seam and returns
// the step.  Gradual slewing (adjtime) does not fire it; steps of any size do.
class realtime_step_watch {
public:
    // Creates and arms the timerfd (non-blocking, close-on-exec).
    static result<realtime_step_watch> open(const clock_source& clk);

    realtime_step_watch(realtime_step_watch&& other) noexcept = default;
    realtime_step_watch& operator=(realtime_step_watch&& other) noexcept = default;
    realtime_step_watch(const realtime_step_watch&) = delete;
    realtime_step_watch& operator=(const realtime_step_watch&) = delete;
    ~realtime_step_watch() = default;

    int fd() const noexcept { return _fd.get(); }
    const time_base& current() const noexcept { return _base; }

    // Reads the fd without blocking.  No step: an empty optional.  A step:
    // the fd is re-armed and the new time base returned with the jump.
    result<std::optional<realtime_step>> check();

    // What check() does after ECANCELED: re-arm, then re-sample.  Public so
    // tests can drive it with a fake clock without stepping the host clock.
    result<realtime_step> rearm_and_resample();

private:
    realtime_step_watch(unique_fd fd, const clock_source& clk) noexcept;
    status arm();

    unique_fd _fd;
    const clock_source* _clk = nullptr;
    time_base _base;
};

}  // namespace rtcore
