#pragma once
// What dispatcher.cpp (setup and the housekeeping side), dispatcher_rt.cpp
// (the dispatch thread's steps) and dispatch_group.cpp (the dispatch thread
// and its loop) share inside qrt_dispatch: the io_uring state, the phases of
// a slot and the loop's margins.  Not installed; nothing outside this folder
// includes it.

#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "qrt/dispatch/dispatcher.hpp"
#include "rtcore/clock.hpp"
#include "rtcore/rt_thread.hpp"

namespace qrt::dispatch::detail {

// The dispatch loop's margins (dispatch_group.cpp runs it, dispatcher_rt.cpp
// sends):
// the lead's window quantile is taken after a send only when the next
// job's wake-up is at least this far away;
inline constexpr std::int64_t adapt_guard_ns = 50'000;
// an endpoint update (io_uring_register: microseconds) is applied only
// when the next send is further away than lead + this;
inline constexpr std::int64_t endpoint_update_guard_ns = 200'000;
// sqpoll: after a send, wait for the poller to take the write when the
// next job's wake-up is closer than this (the thread would not sleep
// before it).
inline constexpr std::int64_t sqpoll_yield_below_ns = 200'000;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

// The first thing a dispatch thread does (a dispatcher's own, or a group's):
// a write to an endpoint whose peer has gone raises SIGPIPE in the thread
// that issues it (this one, for inline io_uring writes), so it stays blocked
// and the write just completes with -EPIPE (send_failed); and a name the
// probes, ps and qrt-wakeup-trace can tell from the event loop.
inline void begin_dispatch_thread() noexcept {
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, nullptr);
    ::pthread_setname_np(::pthread_self(), "qrt-dispatch");
}

// Tuned: cfg's cpuset hook (before_rt_setup), then in_cpuset() (still
// SCHED_OTHER, inside the isolated cpuset), then SCHED_FIFO at cfg's
// priority on its CPU with 1 ns timer slack.  Not mlockall(MCL_FUTURE):
// that would lock every client connection's buffers too; the caller locks
// the dispatch path region by region.  Setup: may allocate.
template <class InCpuset>
rtcore::result<rtcore::scoped_rt_thread> enter_tuned(const dispatcher_config& cfg, InCpuset&& in_cpuset) {
    rtcore::rt_thread_config rc;
    rc.cpu = cfg.dispatch_cpu;
    rc.policy = rtcore::sched_policy::fifo;
    rc.priority = cfg.rt_priority;
    rc.timer_slack_ns = 1;
    rc.lock_memory = false;
    if (cfg.before_rt_setup) {
        if (auto joined = cfg.before_rt_setup(static_cast<pid_t>(::gettid())); !joined) {
            return std::move(joined).err();
        }
    }
    std::forward<InCpuset>(in_cpuset)();
    return rtcore::scoped_rt_thread::enter(rc);
}

// The last stretch to T: spin until `deadline`, updating now, unless the
// job's deadline word moves meanwhile (a re-conversion or a withdraw):
// then false, and the caller looks at its queue again.  spin_ns: how long
// it spun.  No syscall beyond the vDSO clock reads.
inline bool spin_to(rtcore::clock_source& clock, const std::atomic<std::int64_t>& deadline_word,
                    std::int64_t deadline, std::int64_t& now, std::int64_t& spin_ns) noexcept {
    const std::int64_t spin_start = now;
    bool moved = false;
    while (now < deadline) {
        cpu_relax();
        now = clock.now_monotonic_ns();
        if (deadline_word.load(std::memory_order_relaxed) != deadline) {
            moved = true;
            break;
        }
    }
    spin_ns = now - spin_start;
    return !moved;
}

// slot_state::phase values.
constexpr std::uint8_t phase_queued = 0;
constexpr std::uint8_t phase_withdrawn = 1;
constexpr std::uint8_t phase_sending = 2;
constexpr std::uint8_t phase_dropped = 3;

}  // namespace qrt::dispatch::detail

namespace qrt::dispatch {

struct dispatcher::uring {
    io_uring ring{};
    bool inited = false;
    ~uring() {
        if (inited) {
            io_uring_queue_exit(&ring);
        }
    }
};

}  // namespace qrt::dispatch
