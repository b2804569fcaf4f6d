#pragma once
// Real-time setup of the CALLING thread: CPU affinity, timer slack, locked
// and prefaulted memory, and a real-time scheduling policy.
//
//   rtcore::rt_thread_config cfg;
//   cfg.cpu = 3;  cfg.priority = 80;            // SCHED_FIFO by default
//   auto rt = rtcore::scoped_rt_thread::enter(cfg);   // on the dispatch thread
//   if (!rt) { /* rt.err().message names the call and the missing capability */ }
//   // ... real-time loop (no allocation from here on) ...
//   // ~scoped_rt_thread puts the thread back as it was.
//
// Steps, in this order (each reported, and undone in reverse order if a later
// step fails):
//   1. pthread_setaffinity_np to the one CPU (so later page faults are
//      served from that CPU's node);
//   2. prctl(PR_SET_TIMERSLACK, timer_slack_ns);
//   3. mlockall(MCL_CURRENT | MCL_FUTURE);
//   4. touch prefault_stack_bytes of stack below the caller's frame;
//   5. sched_setattr(policy, priority, SCHED_FLAG_RESET_ON_FORK).
// EPERM is explained: sched_setattr needs CAP_SYS_NICE or a high enough
// RLIMIT_RTPRIO; mlockall needs CAP_IPC_LOCK or a large enough
// RLIMIT_MEMLOCK.
//
// The system calls go through sched_ops, so unit tests drive every error path
// with a fake and no root.

#include <sys/resource.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"

namespace rtcore {

// batch and idle exist so a thread's previous policy can be restored; setup
// uses fifo, rr or other.
enum class sched_policy { other, fifo, rr, batch, idle };

// "SCHED_FIFO", "SCHED_RR", "SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE".
std::string_view sched_policy_name(sched_policy p) noexcept;
// Accepts "fifo", "rr", "other" (config spelling) and the SCHED_* names.
result<sched_policy> parse_sched_policy(std::string_view text);

struct rt_thread_config {
    int cpu = -1;                                  // -1: leave affinity alone
    sched_policy policy = sched_policy::fifo;
    int priority = 80;                             // 1..99 for fifo/rr, 0 for other
    bool reset_on_fork = true;                     // children do not inherit RT
    bool lock_memory = true;                       // mlockall(MCL_CURRENT|MCL_FUTURE)
    std::size_t prefault_stack_bytes = 256 * 1024; // 0: skip
    std::int64_t timer_slack_ns = 1;               // <= 0: leave alone
};

// Checks ranges only (priority vs policy, cpu number); no system calls.
status validate(const rt_thread_config& cfg);

// A thread's scheduling attributes as sched_getattr reports them.
struct thread_sched_attr {
    sched_policy policy = sched_policy::other;
    int priority = 0;
    int nice = 0;
    bool reset_on_fork = false;
    bool operator==(const thread_sched_attr&) const = default;
};

// The seam in front of the scheduling system calls.  Integer returns are 0 or
// -errno.  Affinity and timer slack act on the calling thread.
class sched_ops {
public:
    struct attr_result {
        int err = 0;  // 0 or -errno
        thread_sched_attr attr;
    };
    struct affinity_result {
        int err = 0;  // 0 or -errno
        cpu_set cpus;
    };

    sched_ops() = default;
    sched_ops(const sched_ops&) = delete;
    sched_ops& operator=(const sched_ops&) = delete;
    virtual ~sched_ops() = default;

    virtual pid_t current_tid() noexcept = 0;
    virtual int set_attr(pid_t tid, const thread_sched_attr& attr) noexcept = 0;
    virtual attr_result get_attr(pid_t tid) noexcept = 0;
    virtual int set_affinity(const cpu_set& cpus) noexcept = 0;
    virtual affinity_result get_affinity() noexcept = 0;
    virtual int set_timer_slack_ns(std::int64_t ns) noexcept = 0;
    virtual std::int64_t get_timer_slack_ns() noexcept = 0;
    virtual int lock_all_memory() noexcept = 0;    // mlockall(MCL_CURRENT|MCL_FUTURE)
    virtual int unlock_all_memory() noexcept = 0;  // munlockall()
    // True when the process already has locked pages (VmLck > 0).
    virtual bool memory_locked() noexcept = 0;
    virtual rlimit get_rlimit(int resource) noexcept = 0;
    virtual bool has_capability(int cap) noexcept = 0;

    // mlockall is per process, RT threads are not: the threads that asked
    // for the lock through these ops are counted here, and only the restore
    // that drops the last one calls munlockall (setup/restore only).
    struct memory_lock_count {
        std::mutex mu;
        int holders = 0;
        bool locked_by_rt = false;  // the first holder found the memory unlocked
    };
    memory_lock_count& memory_locks() noexcept { return _memory_locks; }

private:
    memory_lock_count _memory_locks;
};

// The real system calls (sched_setattr/sched_getattr, pthread_*affinity_np,
// prctl, mlockall, getrlimit, libcap).
sched_ops& system_sched_ops();

// What the thread looked like before setup, for restore.
struct thread_sched_state {
    pid_t tid = 0;
    thread_sched_attr attr;
    cpu_set affinity;
    std::int64_t timer_slack_ns = 0;
    bool memory_was_locked = false;
};

struct rt_thread_report {
    pid_t tid = 0;
    thread_sched_state previous;
    std::vector<std::string> steps;   // one line per step done, in order
    bool affinity_set = false;
    bool timer_slack_set = false;
    bool memory_locked_by_us = false;  // mlockall done and memory was not locked before
    // This thread holds one reference on the process-wide memory lock.
    // mlockall is per process: with several RT threads (one per QPU), only
    // the restore that drops the last reference calls munlockall, and only
    // if the memory was not locked before the first one.
    bool memory_lock_ref = false;
    bool sched_set = false;
};

// Read the calling thread's current state.
result<thread_sched_state> capture_current_thread(sched_ops& ops = system_sched_ops());

// Configure the calling thread.  On failure every step already done is undone
// and the error names the failing call (and for EPERM the missing capability
// or limit).
result<rt_thread_report> configure_current_thread(const rt_thread_config& cfg,
                                                  sched_ops& ops = system_sched_ops());

// Undo what `report` says was done, on the same thread that configured it.
status restore_current_thread(const rt_thread_report& report, sched_ops& ops = system_sched_ops());

// RLIMIT_RTPRIO (soft limit; RLIM_INFINITY as is).
rlim_t rtprio_limit(sched_ops& ops = system_sched_ops());
// ok() when this process may use `priority` (CAP_SYS_NICE, or RLIMIT_RTPRIO
// >= priority); otherwise an error saying which to grant.
status check_rt_priority_allowed(int priority, sched_ops& ops = system_sched_ops());

// Touch `bytes` of stack below the caller so later use does not page-fault.
// Fails (touching nothing) when the thread's stack has less room than that.
status prefault_stack(std::size_t bytes);

// RAII: configure on enter(), restore in the destructor.  Must be destroyed
// on the thread that entered.
class scoped_rt_thread {
public:
    static result<scoped_rt_thread> enter(const rt_thread_config& cfg, sched_ops& ops = system_sched_ops());

    scoped_rt_thread(scoped_rt_thread&& other) noexcept;
    scoped_rt_thread& operator=(scoped_rt_thread&&) = delete;
    scoped_rt_thread(const scoped_rt_thread&) = delete;
    scoped_rt_thread& operator=(const scoped_rt_thread&) = delete;
    ~scoped_rt_thread();

    const rt_thread_report& report() const noexcept { return _report; }
    // Restore now; the error of the restore, if any.
    status restore();

private:
    scoped_rt_thread(rt_thread_report report, sched_ops& ops) : _report(std::move(report)), _ops(&ops) {}

    rt_thread_report _report;
    sched_ops* _ops;
    bool _armed = true;
};

}  // namespace rtcore
