#include "rtcore/rt_thread.hpp"

#include <alloca.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <linux/capability.h>

#include "rtcore/capabilities.hpp"
#include "rtcore/memory_lock.hpp"

namespace rtcore {

namespace {

// The kernel's struct sched_attr (SCHED_ATTR_SIZE_VER0, 48 bytes); glibc
// 2.36 has no wrapper, so it is declared here rather than pulling in
// <linux/sched/types.h>, which clashes with <sched.h> on some headers.
struct kernel_sched_attr {
    std::uint32_t size;
    std::uint32_t sched_policy;
    std::uint64_t sched_flags;
    std::int32_t sched_nice;
    std::uint32_t sched_priority;
    std::uint64_t sched_runtime;
    std::uint64_t sched_deadline;
    std::uint64_t sched_period;
};
static_assert(sizeof(kernel_sched_attr) == 48);
constexpr std::uint64_t sched_flag_reset_on_fork = 0x01;

int to_kernel_policy(sched_policy p) noexcept {
    switch (p) {
    case sched_policy::fifo:
        return SCHED_FIFO;
    case sched_policy::rr:
        return SCHED_RR;
    case sched_policy::batch:
        return SCHED_BATCH;
    case sched_policy::idle:
        return SCHED_IDLE;
    case sched_policy::other:
        break;
    }
    return SCHED_OTHER;
}

bool from_kernel_policy(std::uint32_t k, sched_policy& out) noexcept {
    switch (k) {
    case SCHED_OTHER:
        out = sched_policy::other;
        return true;
    case SCHED_FIFO:
        out = sched_policy::fifo;
        return true;
    case SCHED_RR:
        out = sched_policy::rr;
        return true;
    case SCHED_BATCH:
        out = sched_policy::batch;
        return true;
    case SCHED_IDLE:
        out = sched_policy::idle;
        return true;
    default:
        return false;
    }
}

bool is_realtime(sched_policy p) noexcept { return p == sched_policy::fifo || p == sched_policy::rr; }

class system_ops final : public sched_ops {
public:
    pid_t current_tid() noexcept override { return ::gettid(); }

    int set_attr(pid_t tid, const thread_sched_attr& a) noexcept override {
        kernel_sched_attr k{};
        k.size = sizeof k;
        k.sched_policy = static_cast<std::uint32_t>(to_kernel_policy(a.policy));
        k.sched_flags = a.reset_on_fork ? sched_flag_reset_on_fork : 0;
        k.sched_nice = a.nice;
        k.sched_priority = static_cast<std::uint32_t>(a.priority);
        if (::syscall(SYS_sched_setattr, tid, &k, 0U) != 0) {
            return -errno;
        }
        return 0;
    }

    attr_result get_attr(pid_t tid) noexcept override {
        kernel_sched_attr k{};
        attr_result r;
        if (::syscall(SYS_sched_getattr, tid, &k, static_cast<unsigned>(sizeof k), 0U) != 0) {
            r.err = -errno;
            return r;
        }
        if (!from_kernel_policy(k.sched_policy, r.attr.policy)) {
            r.err = -ENOTSUP;  // SCHED_DEADLINE: not something we restore to
            return r;
        }
        r.attr.priority = static_cast<int>(k.sched_priority);
        r.attr.nice = k.sched_nice;
        r.attr.reset_on_fork = (k.sched_flags & sched_flag_reset_on_fork) != 0;
        return r;
    }

    int set_affinity(const cpu_set& cpus) noexcept override {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
            if (cpus.test(c)) {
                CPU_SET(c, &set);
            }
        }
        // pthread_* return the error number.
        return -::pthread_setaffinity_np(::pthread_self(), sizeof set, &set);
    }

    affinity_result get_affinity() noexcept override {
        cpu_set_t set;
        CPU_ZERO(&set);
        affinity_result r;
        if (const int rc = ::pthread_getaffinity_np(::pthread_self(), sizeof set, &set); rc != 0) {
            r.err = -rc;
            return r;
        }
        for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
            if (CPU_ISSET(c, &set)) {
                r.cpus.set(c);
            }
        }
        return r;
    }

    int set_timer_slack_ns(std::int64_t ns) noexcept override {
        if (::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(ns), 0UL, 0UL, 0UL) != 0) {
            return -errno;
        }
        return 0;
    }

    std::int64_t get_timer_slack_ns() noexcept override {
        const int v = ::prctl(PR_GET_TIMERSLACK, 0UL, 0UL, 0UL, 0UL);
        return v < 0 ? -errno : static_cast<std::int64_t>(v);
    }

    int lock_all_memory() noexcept override {
        return ::mlockall(MCL_CURRENT | MCL_FUTURE) != 0 ? -errno : 0;
    }

    int unlock_all_memory() noexcept override { return ::munlockall() != 0 ? -errno : 0; }

    bool memory_locked() noexcept override {
        std::FILE* f = std::fopen("/proc/self/status", "re");
        if (f == nullptr) {
            return false;
        }
        char line[256];
        long kb = 0;
        while (std::fgets(line, sizeof line, f) != nullptr) {
            if (std::strncmp(line, "VmLck:", 6) == 0) {
                kb = std::strtol(line + 6, nullptr, 10);
                break;
            }
        }
        std::fclose(f);
        return kb > 0;
    }

    rlimit get_rlimit(int resource) noexcept override {
        rlimit r{};
        if (::getrlimit(static_cast<__rlimit_resource_t>(resource), &r) != 0) {
            r.rlim_cur = 0;
            r.rlim_max = 0;
        }
        return r;
    }

    bool has_capability(int cap) noexcept override { return rtcore::has_capability(cap); }
};

std::string limit_text(rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v); }

std::string sched_call_text(pid_t tid, const thread_sched_attr& a) {
    std::string s = "sched_setattr(tid " + std::to_string(tid) + ", " + std::string(sched_policy_name(a.policy));
    if (is_realtime(a.policy)) {
        s += ", priority " + std::to_string(a.priority);
    } else {
        s += ", nice " + std::to_string(a.nice);
    }
    if (a.reset_on_fork) {
        s += ", SCHED_FLAG_RESET_ON_FORK";
    }
    return s + ")";
}

error sched_error(int neg_errno, pid_t tid, const thread_sched_attr& a, sched_ops& ops) {
    error e = error::from_errno(-neg_errno, sched_call_text(tid, a));
    if (-neg_errno == EPERM) {
        const rlimit rl = ops.get_rlimit(RLIMIT_RTPRIO);
        e.message += ": needs CAP_SYS_NICE";
        e.message += ops.has_capability(CAP_SYS_NICE) ? " (present: the RT group runtime or a cgroup may refuse it)"
                                                       : " (missing)";
        if (is_realtime(a.policy)) {
            e.message += " or RLIMIT_RTPRIO >= " + std::to_string(a.priority) + " (now " + limit_text(rl.rlim_cur) +
                         "; LimitRTPRIO= in the unit)";
        }
    }
    return e;
}

error mlock_error(int neg_errno, sched_ops& ops) {
    error e = error::from_errno(-neg_errno, "mlockall(MCL_CURRENT|MCL_FUTURE)");
    const rlimit rl = ops.get_rlimit(RLIMIT_MEMLOCK);
    if (-neg_errno == EPERM) {
        e.message += ": needs CAP_IPC_LOCK";
        e.message += ops.has_capability(CAP_IPC_LOCK) ? " (present)" : " (missing)";
        e.message += " or a non-zero RLIMIT_MEMLOCK (now " + limit_text(rl.rlim_cur) + " bytes)";
    } else if (-neg_errno == ENOMEM || -neg_errno == EAGAIN) {
        e.message += ": the process needs more locked memory than RLIMIT_MEMLOCK (" + limit_text(rl.rlim_cur) +
                     " bytes) allows; grant CAP_IPC_LOCK or set LimitMEMLOCK=infinity";
    }
    return e;
}

// Touch the pages of a `bytes` long alloca'd block, then give it back.
[[gnu::noinline]] void touch_stack(std::size_t bytes) noexcept {
    auto* p = static_cast<volatile unsigned char*>(alloca(bytes));
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    for (std::size_t i = 0; i < bytes; i += page) {
        p[i] = 0;
    }
    p[bytes - 1] = 0;
}

}  // namespace

std::string_view sched_policy_name(sched_policy p) noexcept {
    switch (p) {
    case sched_policy::fifo:
        return "SCHED_FIFO";
    case sched_policy::rr:
        return "SCHED_RR";
    case sched_policy::batch:
        return "SCHED_BATCH";
    case sched_policy::idle:
        return "SCHED_IDLE";
    case sched_policy::other:
        break;
    }
    return "SCHED_OTHER";
}

result<sched_policy> parse_sched_policy(std::string_view text) {
    std::string t(text);
    std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (t.rfind("sched_", 0) == 0) {
        t.erase(0, 6);
    }
    if (t == "fifo") {
        return sched_policy::fifo;
    }
    if (t == "rr") {
        return sched_policy::rr;
    }
    if (t == "other") {
        return sched_policy::other;
    }
    return error::invalid("unknown scheduling policy \"" + std::string(text) + "\" (expected fifo, rr or other)");
}

status validate(const rt_thread_config& cfg) {
    if (cfg.cpu < -1 || cfg.cpu >= static_cast<int>(cpu_set::max_cpus)) {
        return error::invalid("rt thread: cpu " + std::to_string(cfg.cpu) + " out of range -1.." +
                              std::to_string(cpu_set::max_cpus - 1));
    }
    if (cfg.policy != sched_policy::fifo && cfg.policy != sched_policy::rr && cfg.policy != sched_policy::other) {
        return error::invalid("rt thread: policy " + std::string(sched_policy_name(cfg.policy)) +
                              " is not one of SCHED_FIFO, SCHED_RR, SCHED_OTHER");
    }
    if (is_realtime(cfg.policy) && (cfg.priority < 1 || cfg.priority > 99)) {
        return error::invalid("rt thread: priority " + std::to_string(cfg.priority) + " out of range 1..99 for " +
                              std::string(sched_policy_name(cfg.policy)));
    }
    if (cfg.policy == sched_policy::other && cfg.priority != 0) {
        return error::invalid("rt thread: priority " + std::to_string(cfg.priority) +
                              " must be 0 for SCHED_OTHER");
    }
    return ok();
}

sched_ops& system_sched_ops() {
    static system_ops ops;
    return ops;
}

result<thread_sched_state> capture_current_thread(sched_ops& ops) {
    thread_sched_state s;
    s.tid = ops.current_tid();
    const auto attr = ops.get_attr(s.tid);
    if (attr.err != 0) {
        return error::from_errno(-attr.err, "sched_getattr(tid " + std::to_string(s.tid) + ")");
    }
    s.attr = attr.attr;
    const auto aff = ops.get_affinity();
    if (aff.err != 0) {
        return error::from_errno(-aff.err, "pthread_getaffinity_np(tid " + std::to_string(s.tid) + ")");
    }
    s.affinity = aff.cpus;
    const std::int64_t slack = ops.get_timer_slack_ns();
    if (slack < 0) {
        return error::from_errno(static_cast<int>(-slack), "prctl(PR_GET_TIMERSLACK)");
    }
    s.timer_slack_ns = slack;
    s.memory_was_locked = ops.memory_locked();
    return s;
}

rlim_t rtprio_limit(sched_ops& ops) { return ops.get_rlimit(RLIMIT_RTPRIO).rlim_cur; }

status check_rt_priority_allowed(int priority, sched_ops& ops) {
    if (ops.has_capability(CAP_SYS_NICE)) {
        return ok();
    }
    const rlim_t lim = rtprio_limit(ops);
    if (lim == RLIM_INFINITY || (priority >= 0 && lim >= static_cast<rlim_t>(priority))) {
        return ok();
    }
    return error{EPERM, "real-time priority " + std::to_string(priority) + " needs CAP_SYS_NICE (missing) or " +
                            "RLIMIT_RTPRIO >= " + std::to_string(priority) + " (now " + limit_text(lim) +
                            "; LimitRTPRIO= in the unit)"};
}

status prefault_stack(std::size_t bytes) {
    if (bytes == 0) {
        return ok();
    }
    const auto stack = current_thread_stack();
    if (!stack) {
        return stack.err();
    }
    constexpr std::size_t margin = 32 * 1024;  // frames of the caller and signal delivery
    const std::size_t room = stack->room();
    if (room < margin || bytes > room - margin) {
        return error{ENOMEM, "prefault stack: " + std::to_string(bytes) + " bytes requested but this thread has " +
                                 std::to_string(room > margin ? room - margin : 0) +
                                 " bytes of stack left (stack size " + std::to_string(stack->size) + ")"};
    }
    touch_stack(bytes);
    return ok();
}

status restore_current_thread(const rt_thread_report& report, sched_ops& ops) {
    // Reverse order of setup: leave the RT class first.
    std::string failures;
    const auto note = [&](const error& e) {
        failures += failures.empty() ? "" : "; ";
        failures += e.message;
    };
    const thread_sched_state& prev = report.previous;
    if (report.sched_set) {
        if (const int rc = ops.set_attr(prev.tid, prev.attr); rc != 0) {
            note(error::from_errno(-rc, sched_call_text(prev.tid, prev.attr)));
        }
    }
    if (report.memory_lock_ref) {
        sched_ops::memory_lock_count& reg = ops.memory_locks();
        const std::lock_guard<std::mutex> lock(reg.mu);
        reg.holders = std::max(reg.holders - 1, 0);
        if (reg.holders == 0 && reg.locked_by_rt) {
            reg.locked_by_rt = false;
            if (const int rc = ops.unlock_all_memory(); rc != 0) {
                note(error::from_errno(-rc, "munlockall"));
            }
        }
    }
    if (report.timer_slack_set) {
        if (const int rc = ops.set_timer_slack_ns(prev.timer_slack_ns); rc != 0) {
            note(error::from_errno(-rc, "prctl(PR_SET_TIMERSLACK, " + std::to_string(prev.timer_slack_ns) + ")"));
        }
    }
    if (report.affinity_set) {
        if (const int rc = ops.set_affinity(prev.affinity); rc != 0) {
            note(error::from_errno(-rc, "pthread_setaffinity_np(" + prev.affinity.to_list() + ")"));
        }
    }
    if (!failures.empty()) {
        return error{EIO, "restore thread " + std::to_string(prev.tid) + ": " + failures};
    }
    return ok();
}

result<rt_thread_report> configure_current_thread(const rt_thread_config& cfg, sched_ops& ops) {
    if (auto st = validate(cfg); !st) {
        return std::move(st).err();
    }
    auto prev = capture_current_thread(ops);
    if (!prev) {
        return std::move(prev).err();
    }
    rt_thread_report report;
    report.previous = *prev;
    report.tid = prev->tid;

    // Undo what was done when a later step fails (cancellable scope guard).
    const auto fail = [&](error e) -> result<rt_thread_report> {
        if (auto st = restore_current_thread(report, ops); !st) {
            e.message += " (and undoing the earlier steps failed: " + st.err().message + ")";
        }
        return e;
    };

    if (cfg.cpu >= 0) {
        const auto cpu = static_cast<unsigned>(cfg.cpu);
        // No check against the thread's current affinity: a thread may pin
        // itself to any online CPU of its cpuset, whatever mask it inherited
        // (under the affinity fence every process inherits the housekeeping
        // CPUs from its fenced parent).  The kernel's EINVAL says the CPU is
        // offline or outside the cpuset.
        cpu_set one;
        one.set(cpu);
        if (const int rc = ops.set_affinity(one); rc != 0) {
            const int err = -rc;
            if (err == EINVAL) {
                return fail(error{EINVAL, "pthread_setaffinity_np(CPU " + std::to_string(cfg.cpu) +
                                              "): Invalid argument: CPU " + std::to_string(cfg.cpu) +
                                              " is offline or outside this thread's cpuset (its affinity was " +
                                              prev->affinity.to_list() + ")"});
            }
            return fail(error::from_errno(err, "pthread_setaffinity_np(CPU " + std::to_string(cfg.cpu) + ")"));
        }
        report.affinity_set = true;
        report.steps.push_back("affinity: CPU " + std::to_string(cfg.cpu) + " (was " + prev->affinity.to_list() +
                               ")");
    }

    if (cfg.timer_slack_ns > 0) {
        if (const int rc = ops.set_timer_slack_ns(cfg.timer_slack_ns); rc != 0) {
            return fail(error::from_errno(-rc, "prctl(PR_SET_TIMERSLACK, " + std::to_string(cfg.timer_slack_ns) +
                                                   ")"));
        }
        report.timer_slack_set = true;
        report.steps.push_back("timer slack: " + std::to_string(cfg.timer_slack_ns) + " ns (was " +
                               std::to_string(prev->timer_slack_ns) + " ns)");
    }

    if (cfg.lock_memory) {
        sched_ops::memory_lock_count& reg = ops.memory_locks();
        std::unique_lock<std::mutex> lock(reg.mu);
        // Whether the memory is locked already, read under the lock (a last
        // holder may have unlocked it since prev was captured).
        const bool was_locked = reg.holders == 0 ? ops.memory_locked() : true;
        if (const int rc = ops.lock_all_memory(); rc != 0) {
            lock.unlock();
            return fail(mlock_error(rc, ops));
        }
        if (reg.holders == 0) {
            reg.locked_by_rt = !was_locked;
        }
        ++reg.holders;
        report.memory_lock_ref = true;
        report.memory_locked_by_us = reg.locked_by_rt;
        lock.unlock();
        report.steps.push_back("memory: mlockall(MCL_CURRENT|MCL_FUTURE)");
        if (!ops.memory_locked()) {
            // AddressSanitizer, for one, turns mlockall into a no-op.
            report.steps.push_back("memory: mlockall succeeded but no page is locked (VmLck 0; sanitizer build?)");
        }
    }

    if (cfg.prefault_stack_bytes > 0) {
        if (auto st = prefault_stack(cfg.prefault_stack_bytes); !st) {
            return fail(std::move(st).err());
        }
        report.steps.push_back("stack: prefaulted " + std::to_string(cfg.prefault_stack_bytes) + " bytes");
    }

    thread_sched_attr want;
    want.policy = cfg.policy;
    want.priority = is_realtime(cfg.policy) ? cfg.priority : 0;
    want.nice = is_realtime(cfg.policy) ? 0 : prev->attr.nice;
    want.reset_on_fork = cfg.reset_on_fork;
    if (const int rc = ops.set_attr(report.tid, want); rc != 0) {
        return fail(sched_error(rc, report.tid, want, ops));
    }
    report.sched_set = true;
    report.steps.push_back("scheduler: " + std::string(sched_policy_name(want.policy)) +
                           (is_realtime(want.policy) ? " priority " + std::to_string(want.priority) : std::string()) +
                           (want.reset_on_fork ? ", reset on fork" : "") + " (was " +
                           std::string(sched_policy_name(prev->attr.policy)) + " priority " +
                           std::to_string(prev->attr.priority) + ")");
    if (cfg.timer_slack_ns > 0) {
        const std::int64_t slack_now = ops.get_timer_slack_ns();
        if (slack_now >= 0 && slack_now != cfg.timer_slack_ns) {
            report.steps.push_back("timer slack: the kernel reports " + std::to_string(slack_now) + " ns under " +
                                   std::string(sched_policy_name(want.policy)) +
                                   " (it sets its own slack for real-time tasks)");
        }
    }
    return report;
}

result<scoped_rt_thread> scoped_rt_thread::enter(const rt_thread_config& cfg, sched_ops& ops) {
    auto r = configure_current_thread(cfg, ops);
    if (!r) {
        return std::move(r).err();
    }
    return scoped_rt_thread(std::move(r).value(), ops);
}

scoped_rt_thread::scoped_rt_thread(scoped_rt_thread&& other) noexcept
    : _report(std::move(other._report)), _ops(other._ops), _armed(std::exchange(other._armed, false)) {}

scoped_rt_thread::~scoped_rt_thread() {
    if (_armed) {
        (void)restore();
    }
}

status scoped_rt_thread::restore() {
    if (!_armed) {
        return ok();
    }
    _armed = false;
    return restore_current_thread(_report, *_ops);
}

}  // namespace rtcore
