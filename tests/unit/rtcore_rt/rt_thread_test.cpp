#include <gtest/gtest.h>

#include <linux/capability.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "qrt_test/process.hpp"
#include "qrt_test/sanitizer.hpp"
#include "rtcore/capabilities.hpp"
#include "rtcore/rt_thread.hpp"

using rtcore::rt_thread_config;

namespace {
// AddressSanitizer intercepts mlockall and makes it a no-op returning 0.
constexpr bool mlockall_is_real = !qrt::testing::address_sanitized;
}  // namespace
using rtcore::sched_policy;
using rtcore::thread_sched_attr;

namespace {

// Records every call; each call can be told to fail with an errno.
class fake_sched_ops final : public rtcore::sched_ops {
public:
    std::vector<std::string> calls;
    std::map<std::string, int> fail;  // call name -> errno
    thread_sched_attr attr;
    rtcore::cpu_set affinity{0, 1, 2, 3};
    std::int64_t slack_ns = 50'000;
    bool locked = false;
    rlimit rtprio{0, 0};
    rlimit memlock{8 * 1024 * 1024, 8 * 1024 * 1024};
    std::map<int, bool> caps{{CAP_SYS_NICE, false}, {CAP_IPC_LOCK, false}};

    pid_t current_tid() noexcept override { return 4242; }
    int set_attr(pid_t tid, const thread_sched_attr& a) noexcept override {
        calls.push_back("set_attr " + std::to_string(tid) + " " + std::string(rtcore::sched_policy_name(a.policy)) +
                        " " + std::to_string(a.priority) + (a.reset_on_fork ? " rof" : ""));
        if (int e = take("set_attr")) {
            return -e;
        }
        attr = a;
        return 0;
    }
    attr_result get_attr(pid_t) noexcept override { return {take("get_attr") ? -EINVAL : 0, attr}; }
    int set_affinity(const rtcore::cpu_set& cpus) noexcept override {
        calls.push_back("set_affinity " + cpus.to_list());
        if (int e = take("set_affinity")) {
            return -e;
        }
        affinity = cpus;
        return 0;
    }
    affinity_result get_affinity() noexcept override { return {0, affinity}; }
    int set_timer_slack_ns(std::int64_t ns) noexcept override {
        calls.push_back("set_timer_slack " + std::to_string(ns));
        slack_ns = ns;
        return 0;
    }
    std::int64_t get_timer_slack_ns() noexcept override { return slack_ns; }
    int lock_all_memory() noexcept override {
        calls.push_back("mlockall");
        if (int e = take("mlockall")) {
            return -e;
        }
        locked = true;
        return 0;
    }
    int unlock_all_memory() noexcept override {
        calls.push_back("munlockall");
        locked = false;
        return 0;
    }
    bool memory_locked() noexcept override { return locked; }
    rlimit get_rlimit(int resource) noexcept override { return resource == RLIMIT_RTPRIO ? rtprio : memlock; }
    bool has_capability(int cap) noexcept override { return caps[cap]; }

private:
    int take(const std::string& name) {
        const auto it = fail.find(name);
        return it == fail.end() ? 0 : it->second;
    }
};

rt_thread_config dispatch_config() {
    rt_thread_config cfg;
    cfg.cpu = 3;
    cfg.priority = 80;
    cfg.prefault_stack_bytes = 64 * 1024;
    return cfg;
}

}  // namespace

TEST(rt_thread, validate_checks_priority_against_the_policy) {
    rt_thread_config cfg;
    cfg.priority = 0;
    EXPECT_EQ(rtcore::validate(cfg).err().message, "rt thread: priority 0 out of range 1..99 for SCHED_FIFO");
    cfg.priority = 100;
    cfg.policy = sched_policy::rr;
    EXPECT_EQ(rtcore::validate(cfg).err().message, "rt thread: priority 100 out of range 1..99 for SCHED_RR");
    cfg.policy = sched_policy::other;
    cfg.priority = 5;
    EXPECT_EQ(rtcore::validate(cfg).err().message, "rt thread: priority 5 must be 0 for SCHED_OTHER");
    cfg.priority = 0;
    EXPECT_TRUE(rtcore::validate(cfg));
    cfg.cpu = -2;
    EXPECT_EQ(rtcore::validate(cfg).err().message, "rt thread: cpu -2 out of range -1..4095");
}

TEST(rt_thread, parses_policy_names) {
    EXPECT_EQ(*rtcore::parse_sched_policy("fifo"), sched_policy::fifo);
    EXPECT_EQ(*rtcore::parse_sched_policy("SCHED_RR"), sched_policy::rr);
    EXPECT_EQ(*rtcore::parse_sched_policy("other"), sched_policy::other);
    EXPECT_EQ(rtcore::parse_sched_policy("deadline").err().message,
              "unknown scheduling policy \"deadline\" (expected fifo, rr or other)");
}

TEST(rt_thread, configures_affinity_slack_memory_then_scheduler_in_order) {
    fake_sched_ops ops;
    auto r = rtcore::configure_current_thread(dispatch_config(), ops);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(ops.calls, (std::vector<std::string>{"set_affinity 3", "set_timer_slack 1", "mlockall",
                                                   "set_attr 4242 SCHED_FIFO 80 rof"}));
    EXPECT_EQ(r->tid, 4242);
    EXPECT_EQ(r->steps,
              (std::vector<std::string>{"affinity: CPU 3 (was 0-3)", "timer slack: 1 ns (was 50000 ns)",
                                        "memory: mlockall(MCL_CURRENT|MCL_FUTURE)", "stack: prefaulted 65536 bytes",
                                        "scheduler: SCHED_FIFO priority 80, reset on fork (was SCHED_OTHER priority 0)"}));
    EXPECT_TRUE(r->memory_locked_by_us);
}

TEST(rt_thread, restore_puts_every_setting_back) {
    fake_sched_ops ops;
    ops.attr.nice = -5;
    const auto before_attr = ops.attr;
    auto r = rtcore::configure_current_thread(dispatch_config(), ops);
    ASSERT_TRUE(r) << r.err().message;
    ASSERT_TRUE(rtcore::restore_current_thread(*r, ops));
    EXPECT_EQ(ops.attr, before_attr);
    EXPECT_EQ(ops.affinity, (rtcore::cpu_set{0, 1, 2, 3}));
    EXPECT_EQ(ops.slack_ns, 50'000);
    EXPECT_FALSE(ops.locked);
}

TEST(rt_thread, memory_locked_before_setup_stays_locked_after_restore) {
    fake_sched_ops ops;
    ops.locked = true;
    auto r = rtcore::configure_current_thread(dispatch_config(), ops);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_FALSE(r->memory_locked_by_us);
    ASSERT_TRUE(rtcore::restore_current_thread(*r, ops));
    EXPECT_TRUE(ops.locked);
}

TEST(rt_thread, eperm_from_sched_setattr_names_cap_sys_nice_and_rlimit_rtprio_and_undoes_earlier_steps) {
    fake_sched_ops ops;
    ops.fail["set_attr"] = EPERM;
    ops.caps[CAP_IPC_LOCK] = true;
    auto r = rtcore::configure_current_thread(dispatch_config(), ops);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, EPERM);
    EXPECT_EQ(r.err().message,
              "sched_setattr(tid 4242, SCHED_FIFO, priority 80, SCHED_FLAG_RESET_ON_FORK): Operation not permitted: "
              "needs CAP_SYS_NICE (missing) or RLIMIT_RTPRIO >= 80 (now 0; LimitRTPRIO= in the unit)");
    EXPECT_EQ(ops.affinity, (rtcore::cpu_set{0, 1, 2, 3}));
    EXPECT_EQ(ops.slack_ns, 50'000);
    EXPECT_FALSE(ops.locked);
}

TEST(rt_thread, eperm_from_mlockall_names_cap_ipc_lock) {
    fake_sched_ops ops;
    ops.fail["mlockall"] = EPERM;
    ops.memlock = {0, 0};
    auto r = rtcore::configure_current_thread(dispatch_config(), ops);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().message,
              "mlockall(MCL_CURRENT|MCL_FUTURE): Operation not permitted: needs CAP_IPC_LOCK (missing) "
              "or a non-zero RLIMIT_MEMLOCK (now 0 bytes)");
    EXPECT_EQ(ops.calls.back(), "set_affinity 0-3") << "affinity undone after the failure";
}

TEST(rt_thread, enomem_from_mlockall_names_rlimit_memlock) {
    fake_sched_ops ops;
    ops.fail["mlockall"] = ENOMEM;
    auto r = rtcore::configure_current_thread(dispatch_config(), ops);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().message,
              "mlockall(MCL_CURRENT|MCL_FUTURE): Cannot allocate memory: the process needs more locked memory than "
              "RLIMIT_MEMLOCK (8388608 bytes) allows; grant CAP_IPC_LOCK or set LimitMEMLOCK=infinity");
}

TEST(rt_thread, a_thread_pins_itself_to_a_cpu_outside_the_affinity_it_inherited) {
    // Under the affinity fence every process inherits the housekeeping CPUs;
    // the kernel still lets a thread pin itself to any CPU of its cpuset.
    fake_sched_ops ops;
    ops.affinity = rtcore::cpu_set{0, 1};
    auto r = rtcore::configure_current_thread(dispatch_config(), ops);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(ops.affinity, rtcore::cpu_set{3});
    EXPECT_EQ(ops.calls.front(), "set_affinity 3");
}

TEST(rt_thread, a_cpu_the_kernel_refuses_is_named_offline_or_outside_the_cpuset_and_nothing_stays_changed) {
    fake_sched_ops ops;
    ops.affinity = rtcore::cpu_set{0, 1};
    ops.fail["set_affinity"] = EINVAL;
    auto r = rtcore::configure_current_thread(dispatch_config(), ops);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().message,
              "pthread_setaffinity_np(CPU 3): Invalid argument: CPU 3 is offline or outside this thread's cpuset "
              "(its affinity was 0-1)");
    EXPECT_EQ(ops.calls, (std::vector<std::string>{"set_affinity 3"}));
    EXPECT_EQ(ops.affinity, (rtcore::cpu_set{0, 1}));
}

TEST(rt_thread, a_stack_prefault_larger_than_the_stack_fails_cleanly) {
    fake_sched_ops ops;
    auto cfg = dispatch_config();
    cfg.prefault_stack_bytes = std::size_t{1} << 40;
    auto r = rtcore::configure_current_thread(cfg, ops);
    ASSERT_FALSE(r);
    EXPECT_NE(r.err().message.find("prefault stack: 1099511627776 bytes requested but this thread has"),
              std::string::npos)
        << r.err().message;
    EXPECT_FALSE(ops.locked);
}

TEST(rt_thread, untuned_mode_sets_sched_other_and_keeps_nice) {
    fake_sched_ops ops;
    ops.attr.nice = 3;
    rt_thread_config cfg;
    cfg.policy = sched_policy::other;
    cfg.priority = 0;
    cfg.lock_memory = false;
    cfg.prefault_stack_bytes = 0;
    cfg.timer_slack_ns = 0;
    auto r = rtcore::configure_current_thread(cfg, ops);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(ops.calls, (std::vector<std::string>{"set_attr 4242 SCHED_OTHER 0 rof"}));
    EXPECT_EQ(ops.attr.nice, 3);
}

TEST(rt_thread, rtprio_check_accepts_cap_or_limit_and_explains_otherwise) {
    fake_sched_ops ops;
    ops.rtprio = {50, 50};
    EXPECT_TRUE(rtcore::check_rt_priority_allowed(50, ops));
    const auto st = rtcore::check_rt_priority_allowed(80, ops);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.err().message,
              "real-time priority 80 needs CAP_SYS_NICE (missing) or RLIMIT_RTPRIO >= 80 (now 50; LimitRTPRIO= in the "
              "unit)");
    ops.caps[CAP_SYS_NICE] = true;
    EXPECT_TRUE(rtcore::check_rt_priority_allowed(99, ops));
    EXPECT_EQ(rtcore::rtprio_limit(ops), 50u);
}

TEST(rt_thread, scoped_guard_restores_on_destruction) {
    fake_sched_ops ops;
    {
        auto g = rtcore::scoped_rt_thread::enter(dispatch_config(), ops);
        ASSERT_TRUE(g) << g.err().message;
        EXPECT_EQ(ops.attr.policy, sched_policy::fifo);
        rtcore::scoped_rt_thread moved(std::move(*g));
        EXPECT_EQ(ops.attr.policy, sched_policy::fifo) << "move must not restore";
    }
    EXPECT_EQ(ops.attr.policy, sched_policy::other);
    EXPECT_EQ(ops.slack_ns, 50'000);
}

namespace {

std::map<std::string, std::string> proc_task_sched(pid_t tid) {
    std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/sched");
    std::map<std::string, std::string> fields;
    std::string line;
    while (std::getline(in, line)) {
        const auto colon = line.find(':');
        if (colon == std::string::npos) {
            continue;
        }
        std::string key = line.substr(0, colon);
        std::string value = line.substr(colon + 1);
        key.erase(key.find_last_not_of(" \t") + 1);
        value.erase(0, value.find_first_not_of(" \t"));
        fields[key] = value;
    }
    return fields;
}

long vm_locked_kb() {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("VmLck:", 0) == 0) {
            return std::stol(line.substr(6));
        }
    }
    return -1;
}

}  // namespace

// For real: a thread runs SCHED_FIFO at the priority on the CPU, and is put
// back afterwards (the guard restores even when an assertion fails).
TEST(rt_thread, really_runs_sched_fifo_on_the_cpu_and_is_reverted) {
    if (::geteuid() != 0 || !rtcore::check_rt_priority_allowed(10)) {
        GTEST_SKIP() << "needs root (CAP_SYS_NICE, CAP_IPC_LOCK) to switch a thread to SCHED_FIFO";
    }
    if (vm_locked_kb() != 0) {
        GTEST_SKIP() << "test process already has locked memory";
    }
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    ASSERT_EQ(::sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int cpu = -1;
    for (std::size_t c = CPU_SETSIZE; c-- > 0;) {
        if (CPU_ISSET(c, &allowed)) {
            cpu = static_cast<int>(c);
            break;
        }
    }
    ASSERT_GE(cpu, 0);

    std::string failures;
    std::thread worker([&] {
        const pid_t tid = ::gettid();
        const int slack_before = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
        cpu_set_t aff_before;
        ::sched_getaffinity(0, sizeof aff_before, &aff_before);
        std::ostringstream f;
        {
            rt_thread_config cfg;
            cfg.cpu = cpu;
            cfg.priority = 10;
            cfg.prefault_stack_bytes = 128 * 1024;
            auto rt = rtcore::scoped_rt_thread::enter(cfg);
            if (!rt) {
                failures = "enter: " + rt.err().message;
                return;
            }
            ::sched_yield();  // let the migration happen
            const int policy = ::sched_getscheduler(0);
            if ((policy & ~SCHED_RESET_ON_FORK) != SCHED_FIFO) {
                f << "policy " << policy << " != SCHED_FIFO;";
            }
            if ((policy & SCHED_RESET_ON_FORK) == 0) {
                f << "reset-on-fork not set;";
            }
            sched_param sp{};
            ::sched_getparam(0, &sp);
            if (sp.sched_priority != 10) {
                f << "priority " << sp.sched_priority << ";";
            }
            if (::sched_getcpu() != cpu) {
                f << "running on CPU " << ::sched_getcpu() << " not " << cpu << ";";
            }
            auto fields = proc_task_sched(tid);
            if (fields["policy"] != "1") {
                f << "/proc sched policy '" << fields["policy"] << "';";
            }
            if (fields["prio"] != std::to_string(99 - 10)) {
                f << "/proc sched prio '" << fields["prio"] << "';";
            }
            // 1 ns as asked, or 0 where the kernel zeroes slack for RT tasks.
            if (::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) > 1) {
                f << "timer slack " << ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) << ";";
            }
            if (mlockall_is_real && vm_locked_kb() <= 0) {
                f << "memory not locked;";
            }
        }
        // Reverted.
        if (::sched_getscheduler(0) != SCHED_OTHER) {
            f << "after: policy " << ::sched_getscheduler(0) << ";";
        }
        if (::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) != slack_before) {
            f << "after: timer slack not restored;";
        }
        cpu_set_t aff_after;
        ::sched_getaffinity(0, sizeof aff_after, &aff_after);
        if (!CPU_EQUAL(&aff_before, &aff_after)) {
            f << "after: affinity not restored;";
        }
        if (vm_locked_kb() != 0) {
            f << "after: memory still locked;";
        }
        failures += f.str();
    });
    worker.join();
    EXPECT_EQ(failures, "");
}

// The error mapping against the real kernel: a child without capabilities
// and with RLIMIT_RTPRIO 0 / RLIMIT_MEMLOCK 0 gets the explained EPERMs.
TEST(rt_thread, real_eperm_without_capabilities_is_explained) {
    if (::geteuid() != 0 || !rtcore::has_capability(CAP_SETPCAP)) {
        GTEST_SKIP() << "needs root to drop capabilities in a child";
    }
    const auto r = qrt::testing::run_in_child([]() -> std::string {
        const rlimit zero{0, 0};
        if (::setrlimit(RLIMIT_RTPRIO, &zero) != 0 || ::setrlimit(RLIMIT_MEMLOCK, &zero) != 0) {
            return "setrlimit failed";
        }
        if (auto d = rtcore::drop_capabilities_except({}); !d) {
            return "drop failed: " + d.err().message;
        }
        std::string out;
        rt_thread_config cfg;
        cfg.priority = 10;
        cfg.lock_memory = false;
        cfg.prefault_stack_bytes = 0;
        auto a = rtcore::configure_current_thread(cfg);
        out += a ? std::string("sched: no error") : a.err().message;
        out += "\n";
        cfg.lock_memory = true;
        auto b = rtcore::configure_current_thread(cfg);
        out += b ? std::string("mlock: no error") : b.err().message;
        out += "\n";
        out += ::sched_getscheduler(0) == SCHED_OTHER ? "still SCHED_OTHER" : "policy changed";
        return out;
    });
    const std::string tid_part = "sched_setattr(tid ";
    std::istringstream lines(r.reply);
    std::string sched_line;
    std::string mlock_line;
    std::string final_line;
    std::getline(lines, sched_line);
    std::getline(lines, mlock_line);
    std::getline(lines, final_line);
    EXPECT_EQ(sched_line.rfind(tid_part, 0), 0u) << r.reply;
    EXPECT_NE(sched_line.find(", SCHED_FIFO, priority 10, SCHED_FLAG_RESET_ON_FORK): Operation not permitted: "
                              "needs CAP_SYS_NICE (missing) or RLIMIT_RTPRIO >= 10 (now 0; LimitRTPRIO= in the unit)"),
              std::string::npos)
        << sched_line;
    if (mlockall_is_real) {
        EXPECT_EQ(mlock_line,
                  "mlockall(MCL_CURRENT|MCL_FUTURE): Operation not permitted: needs CAP_IPC_LOCK (missing) "
                  "or a non-zero RLIMIT_MEMLOCK (now 0 bytes)");
    }
    EXPECT_EQ(final_line, "still SCHED_OTHER");
}

TEST(rt_thread, memory_stays_locked_until_the_last_rt_thread_restores) {
    // Two dispatch threads (two QPUs) share the process's mlockall: the first
    // one to leave must not unlock the memory under the other.
    fake_sched_ops ops;
    auto first = rtcore::configure_current_thread(dispatch_config(), ops);
    ASSERT_TRUE(first) << first.err().message;
    auto second = rtcore::configure_current_thread(dispatch_config(), ops);
    ASSERT_TRUE(second) << second.err().message;
    EXPECT_TRUE(first->memory_locked_by_us);
    EXPECT_TRUE(second->memory_locked_by_us);
    ASSERT_TRUE(rtcore::restore_current_thread(*first, ops));
    EXPECT_TRUE(ops.locked) << "the second RT thread still runs";
    ASSERT_TRUE(rtcore::restore_current_thread(*second, ops));
    EXPECT_FALSE(ops.locked);
}
