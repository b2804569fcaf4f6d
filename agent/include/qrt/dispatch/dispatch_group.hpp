#pragma once
// The one owner of a dispatch thread: ONE real-time thread on one CPU
// serving one dispatcher (a lone QPU: dispatcher::start makes a group of
// one) or several (dispatch.qpus_per_cpu > 1, for a host that cannot spare
// an isolated core per QPU; README "Threads and cores").
//
// Each member keeps everything that is per QPU: its slot pool, job ring,
// pending array, io_uring ring with its registered buffers and endpoint
// file, calibration guard, lead controller, records, withdraw/restore,
// placement figures and counters (dispatcher.hpp).  The housekeeping side
// talks to each member exactly as to a dispatcher with its own thread; only
// the wake word is the group's, so a submit, step, endpoint change or
// withdrawal on any member wakes the one thread.
//
// The group's loop (one SCHED_FIFO thread, "qrt-dispatch"):
// - looks at every member in [[qpu]] order: completions, leftover SQEs,
//   new jobs, withdrawals, a realtime step, missed heads;
// - takes the member whose head job has the earliest start T (compared as
//   placed, in realtime: each member converts with its own time base, so
//   equal starts can differ by its sampling error in monotonic time; equal
//   starts: the earlier member, i.e. [[qpu]] order) and sleeps towards
//   that job's T - lead, spins to T and sends it with that member's guard
//   and ring;  so frames go out in start order across the members;
// - while it sleeps, a member with nothing pending is marked idle, so a job
//   handed to it wakes the thread (as on a dispatcher's own thread), and a
//   job earlier than the member's queued ones wakes it too.
// Same rules as the dispatcher's own loop: everything (member list, per-
// member loop state) is allocated in the constructor, the loop never
// allocates, locks, logs or throws.  A group of several submits by
// `syscall` only: a member configured for sqpoll is refused (the SQPOLL
// yield and pre-wake logic is per ring and assumes the thread serves one
// ring); a group of one keeps sqpoll (the poller woken before the last
// sleep, a bounded yield when the next job is too close to sleep).
//
// Members must agree on mode, dispatch_cpu, rt_priority, require_rt and
// hold_cpu_dma_latency, share one clock, and must not be running.  The
// first member's before_rt_setup runs once on the group's thread.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "qrt/dispatch/dispatcher.hpp"

namespace qrt::dispatch {

class dispatch_group {
public:
    // The upper bound of dispatch.qpus_per_cpu: one thread's loop looks at
    // every member on each pass, so the pass stays short.
    static constexpr std::size_t max_members = 4;

    // members in [[qpu]] order (ties in start time go to the earlier one).
    // Throws std::invalid_argument naming the disagreement.
    explicit dispatch_group(std::vector<dispatcher*> members);
    ~dispatch_group();
    dispatch_group(const dispatch_group&) = delete;
    dispatch_group& operator=(const dispatch_group&) = delete;

    // Starts the one thread (tuned: the RT setup on it, as dispatcher::start).
    rtcore::status start();
    // Stops and joins it; every member's queued jobs come back `cancelled`.
    void stop() noexcept;
    bool running() const noexcept { return _thread.joinable(); }
    std::size_t size() const noexcept { return _members.size(); }
    int dispatch_cpu() const noexcept { return _members.front()->config().dispatch_cpu; }
    const std::string& setup_error() const noexcept { return _setup_error; }

private:
    struct member_loop {  // run_loop's per-job locals, one per member
        std::uint32_t cur_slot = UINT32_MAX;
        std::int64_t first_seen = 0;
        std::uint32_t withdrawals_seen = 0;
    };
    void thread_main() noexcept;
    void run_loop() noexcept;
    // One member's look before the choice: completions, leftovers, new jobs,
    // withdrawals, then drop missed heads and follow a step.  Its head's
    // deadline, or INT64_MAX when nothing is pending.
    std::int64_t look(std::size_t i, std::int64_t now) noexcept;
    void finish_member(dispatcher& m) noexcept;

    std::vector<dispatcher*> _members;           // fixed at construction
    std::unique_ptr<member_loop[]> _loop_state;  // one per member
    rtcore::clock_source& _clock;
    rtcore::wake_word _wake{0};
    std::atomic<bool> _stop{false};
    std::atomic<int> _setup_done{0};  // 0 pending, 1 ok, -errno failed
    std::string _setup_error;
    std::vector<rtcore::locked_region> _locked;  // the group's own state (thread, setup and exit)
    std::thread _thread;
};

}  // namespace qrt::dispatch
