#include "rtcore/clock.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <limits>
#include <utility>

namespace rtcore {

int real_clock::sleep_until_monotonic_ns(std::int64_t t_ns) noexcept {
    if (t_ns < 0) {
        return -EINVAL;
    }
    const timespec ts = to_timespec(t_ns);
    while (true) {
        // clock_nanosleep returns the error number; it does not set errno.
        const int rc = ::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
        if (rc == 0) {
            return 0;
        }
        if (rc != EINTR) {
            return -rc;
        }
    }
}

int real_clock::sleep_until_or_woken(std::int64_t t_ns, const wake_word& word, std::uint32_t seen) noexcept {
    if (t_ns < 0) {
        return -EINVAL;
    }
    const timespec ts = to_timespec(t_ns);
    // FUTEX_WAIT_BITSET takes an absolute timeout on CLOCK_MONOTONIC (no
    // FUTEX_CLOCK_REALTIME): the same hrtimer sleep as clock_nanosleep.
    // The word is only read by the kernel: const_cast for the syscall ABI.
    auto* addr = const_cast<std::uint32_t*>(reinterpret_cast<const std::uint32_t*>(&word));
    while (true) {
        const long rc = ::syscall(SYS_futex, addr, FUTEX_WAIT_BITSET_PRIVATE, seen, &ts, nullptr,
                                  FUTEX_BITSET_MATCH_ANY);
        if (rc == 0) {
            return -EAGAIN;  // woken (or spurious): the caller re-checks
        }
        switch (errno) {
            case ETIMEDOUT:
                return 0;
            case EAGAIN:
                return -EAGAIN;  // the word had already changed
            case EINTR:
                continue;
            default:
                return -errno;
        }
    }
}

void wake_sleepers(wake_word& word) noexcept {
    word.fetch_add(1, std::memory_order_acq_rel);
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

int fake_clock::sleep_until_monotonic_ns(std::int64_t t_ns) noexcept {
    if (t_ns < 0) {
        return -EINVAL;
    }
    _sleeps.fetch_add(1, std::memory_order_acq_rel);
    _last_target.store(t_ns, std::memory_order_release);
    const std::int64_t now = _mono.load(std::memory_order_acquire);
    if (t_ns > now) {
        advance(t_ns - now);
    }
    return 0;
}

void fake_clock::advance(std::int64_t delta_ns) noexcept {
    if (delta_ns <= 0) {
        return;
    }
    _mono.fetch_add(delta_ns, std::memory_order_acq_rel);
    _real.fetch_add(delta_ns, std::memory_order_acq_rel);
}

time_base time_base::sample(const clock_source& clk, int rounds) noexcept {
    if (rounds < 1) {
        rounds = 1;
    }
    std::int64_t best_gap = std::numeric_limits<std::int64_t>::max();
    std::int64_t best_offset = 0;
    for (int i = 0; i < rounds; ++i) {
        const std::int64_t m1 = clk.now_monotonic_ns();
        const std::int64_t r = clk.now_realtime_ns();
        const std::int64_t m2 = clk.now_monotonic_ns();
        const std::int64_t gap = m2 - m1;
        if (gap >= 0 && gap < best_gap) {
            best_gap = gap;
            best_offset = r - (m1 + gap / 2);
        }
    }
    if (best_gap == std::numeric_limits<std::int64_t>::max()) {
        // Monotonic went backwards in every round: only a broken fake does that.
        const std::int64_t m = clk.now_monotonic_ns();
        return time_base(clk.now_realtime_ns() - m, 0);
    }
    return time_base(best_offset, (best_gap + 1) / 2);
}

realtime_step_watch::realtime_step_watch(unique_fd fd, const clock_source& clk) noexcept
    : _fd(std::move(fd)), _clk(&clk), _base(time_base::sample(clk)) {}

result<realtime_step_watch> realtime_step_watch::open(const clock_source& clk) {
    unique_fd fd(::timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK | TFD_CLOEXEC));
    if (!fd) {
        const int err = errno;
        return error::from_errno(err, "timerfd_create(CLOCK_REALTIME)");
    }
    realtime_step_watch w(std::move(fd), clk);
    if (auto st = w.arm(); !st) {
        return std::move(st).err();
    }
    // Sample after arming: a step between the two is then seen by check().
    w._base = time_base::sample(clk);
    return w;
}

status realtime_step_watch::arm() {
    // Far future, as systemd does for its time-change fd: the timer never
    // expires, it only gets cancelled when the clock is set.
    itimerspec its{};
    its.it_value.tv_sec = std::numeric_limits<time_t>::max();
    if (::timerfd_settime(_fd.get(), TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, &its, nullptr) < 0) {
        const int err = errno;
        return error::from_errno(err, "timerfd_settime(CLOCK_REALTIME, TFD_TIMER_ABSTIME|TFD_TIMER_CANCEL_ON_SET)");
    }
    return ok();
}

result<realtime_step> realtime_step_watch::rearm_and_resample() {
    if (auto st = arm(); !st) {
        return std::move(st).err();
    }
    realtime_step step;
    step.before = _base;
    _base = time_base::sample(*_clk);
    step.after = _base;
    step.step_ns = step.after.offset_ns() - step.before.offset_ns();
    return step;
}

result<std::optional<realtime_step>> realtime_step_watch::check() {
    std::uint64_t expirations = 0;
    while (true) {
        const ssize_t n = ::read(_fd.get(), &expirations, sizeof expirations);
        if (n == static_cast<ssize_t>(sizeof expirations)) {
            // The far-future timer expired (the clock was set beyond it):
            // treat it as a step too.
            break;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && errno == EAGAIN) {
            return std::optional<realtime_step>{};
        }
        if (n < 0 && errno == ECANCELED) {
            break;
        }
        if (n < 0) {
            const int err = errno;
            return error::from_errno(err, "read timerfd(CLOCK_REALTIME)");
        }
        return error{EIO, "read timerfd(CLOCK_REALTIME): short read of " + std::to_string(n) + " bytes"};
    }
    auto step = rearm_and_resample();
    if (!step) {
        return std::move(step).err();
    }
    return std::optional<realtime_step>{*step};
}

}  // namespace rtcore
