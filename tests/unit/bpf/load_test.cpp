// Loading tests: need root (or CAP_BPF + CAP_PERFMON) and kernel BTF, and a
// build with probes.  They skip with the reason otherwise.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "drop_caps.hpp"
#include "qrt_bpf/availability.hpp"
#include "qrt_bpf/probe_set.hpp"

using namespace qrt_bpf;

namespace {

pid_t this_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

#define QRT_SKIP_UNLESS_PROBES_LOAD()                                                   \
    do {                                                                                \
        const availability pre_ = preflight(rtcore::host_fs::system());                 \
        if (!pre_.available()) {                                                        \
            GTEST_SKIP() << "probes " << pre_.to_string();                              \
        }                                                                               \
    } while (0)

void sleep_ms(int n) {
    for (int i = 0; i < n; ++i) {
        timespec ts{0, 1'000'000};
        ::clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, nullptr);
    }
}

// Sleeps 1 ms at a time until the probe has measured at least `want`
// wake-ups, at most `bound` sleeps; returns the last reading.  A 1 ms sleep
// is not always a measured wake-up: when its timer fires before the thread
// has left the CPU (a busy CPU, a SCHED_IDLE neighbour), the kernel wakes a
// task that never switched out, and no switch-in follows to measure.
template <typename Probe>
auto sleep_until_measured(Probe& probe, std::uint64_t want, int bound) {
    auto h = probe.read();
    for (int i = 0; i < bound && h && h->count < want; ++i) {
        sleep_ms(1);
        h = probe.read();
    }
    return h;
}

}  // namespace

TEST(wakeup_probe_load, counts_every_wakeup_of_a_registered_thread_only) {
    QRT_SKIP_UNLESS_PROBES_LOAD();
    auto probe = wakeup_probe::load({});
    ASSERT_TRUE(probe) << probe.err().message;
    sleep_ms(5);
    auto before = probe->read();
    ASSERT_TRUE(before) << before.err().message;
    EXPECT_EQ(before->count, 0U) << "no TID registered yet";

    ASSERT_TRUE(probe->add_tid(this_tid()));
    sleep_ms(20);
    (void)sleep_until_measured(*probe, 20, 400);
    ASSERT_TRUE(probe->remove_tid(this_tid()));
    auto after = probe->read();
    ASSERT_TRUE(after) << after.err().message;
    EXPECT_GE(after->count, 20U) << "each switched-out clock_nanosleep ends with a wakeup";
    std::uint64_t in_buckets = 0;
    for (auto n : after->buckets) {
        in_buckets += n;
    }
    EXPECT_EQ(in_buckets, after->count);
    EXPECT_GE(after->max_ns, static_cast<std::uint64_t>(after->quantile_ns(0.5)));

    sleep_ms(5);
    auto later = probe->read();
    ASSERT_TRUE(later);
    EXPECT_EQ(later->count, after->count) << "removed TID is no longer counted";
}

TEST(wakeup_probe_load, per_cpu_histograms_add_up_to_the_total_and_name_the_cpu) {
    QRT_SKIP_UNLESS_PROBES_LOAD();
    cpu_set_t saved;
    ASSERT_EQ(::sched_getaffinity(0, sizeof(saved), &saved), 0);
    cpu_set_t cpu0;
    CPU_ZERO(&cpu0);
    CPU_SET(0, &cpu0);
    ASSERT_EQ(::sched_setaffinity(0, sizeof(cpu0), &cpu0), 0);
    auto probe = wakeup_probe::load({});
    ASSERT_TRUE(probe) << probe.err().message;
    ASSERT_TRUE(probe->add_tid(this_tid()));
    sleep_ms(10);
    (void)sleep_until_measured(*probe, 10, 400);
    ASSERT_TRUE(probe->remove_tid(this_tid()));
    ::sched_setaffinity(0, sizeof(saved), &saved);
    auto total = probe->read();
    auto per_cpu = probe->read_per_cpu();
    ASSERT_TRUE(total && per_cpu);
    ASSERT_GE(per_cpu->size(), 1U);
    std::uint64_t sum = 0;
    for (const auto& h : *per_cpu) {
        sum += h.count;
    }
    EXPECT_EQ(sum, total->count);
    EXPECT_EQ((*per_cpu)[0].count, total->count) << "the thread only ran on CPU 0";
    EXPECT_GE(total->count, 10U);
}

TEST(probe_set_load, a_probe_that_cannot_load_is_reported_while_the_others_run) {
    QRT_SKIP_UNLESS_PROBES_LOAD();
    probe_config cfg;  // no isolated CPUs: the intrusion probe refuses
    probe_set set = probe_set::start(cfg);
    EXPECT_FALSE(set.availability().available());
    EXPECT_NE(set.availability().reason().find("intrusions: "), std::string::npos)
        << set.availability().to_string();
    EXPECT_NE(set.wakeup(), nullptr);
    EXPECT_EQ(set.intrusions(), nullptr);
    EXPECT_NE(set.outliers(), nullptr);
    EXPECT_NE(set.describe().find("wakeup: available ("), std::string::npos) << set.describe();
    EXPECT_TRUE(set.add_tid(this_tid()));
}

TEST(wakeup_probe_load, rejects_invalid_tids_and_tolerates_double_remove) {
    QRT_SKIP_UNLESS_PROBES_LOAD();
    auto probe = wakeup_probe::load({});
    ASSERT_TRUE(probe) << probe.err().message;
    const auto bad = probe->add_tid(0);
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.err().message.find("invalid tid 0"), std::string::npos) << bad.err().message;
    EXPECT_TRUE(probe->remove_tid(12345678));
}

TEST(probe_flavour, tp_btf_is_chosen_where_it_loads_and_raw_tp_can_be_forced) {
    QRT_SKIP_UNLESS_PROBES_LOAD();
    auto btf = wakeup_probe::load({});
    ASSERT_TRUE(btf) << btf.err().message;
    EXPECT_TRUE(btf->flavour() == "tp_btf" || btf->flavour() == "raw_tp") << btf->flavour();

    wakeup_options raw_opts;
    raw_opts.force_raw_tp = true;
    auto raw = wakeup_probe::load(raw_opts);
    ASSERT_TRUE(raw) << raw.err().message;
    EXPECT_EQ(raw->flavour(), "raw_tp");
    ASSERT_TRUE(raw->add_tid(this_tid()));
    // At least 5 measured wake-ups, bounded at 200 sleeps.
    auto h = sleep_until_measured(*raw, 5, 200);
    ASSERT_TRUE(h) << h.err().message;
    EXPECT_GE(h->count, 5U) << "the raw_tp fallback measures too";

    intrusion_options io;
    io.isolated_cpus = {0};
    io.force_raw_tp = true;
    auto intr = intrusion_probe::load(io);
    ASSERT_TRUE(intr) << intr.err().message;
    EXPECT_EQ(intr->flavour(), "raw_tp");
    outlier_options oo;
    oo.force_raw_tp = true;
    auto outl = outlier_probe::load(oo);
    ASSERT_TRUE(outl) << outl.err().message;
    EXPECT_EQ(outl->flavour(), "raw_tp");
}

TEST(intrusion_probe_load, refuses_an_empty_cpu_set_with_a_reason) {
    QRT_SKIP_UNLESS_PROBES_LOAD();
    auto probe = intrusion_probe::load({});
    ASSERT_FALSE(probe);
    EXPECT_NE(probe.err().message.find("no isolated CPUs"), std::string::npos);
}

TEST(outlier_probe_load, reports_a_wakeup_over_the_threshold_with_its_thread) {
    QRT_SKIP_UNLESS_PROBES_LOAD();
    outlier_options oo;
    oo.threshold_ns = 1;  // every wakeup is an outlier
    auto probe = outlier_probe::load(oo);
    ASSERT_TRUE(probe) << probe.err().message;
    ASSERT_TRUE(probe->add_tid(this_tid()));
    sleep_ms(3);
    ASSERT_TRUE(probe->remove_tid(this_tid()));
    auto events = probe->poll(100);
    ASSERT_TRUE(events) << events.err().message;
    ASSERT_FALSE(events->empty());
    for (const outlier& o : *events) {
        EXPECT_EQ(o.tid, static_cast<std::uint32_t>(this_tid()));
        EXPECT_GE(o.latency_ns, 1U);
        EXPECT_EQ(o.latency_ns, o.switch_ns - o.wakeup_ns);
    }
    EXPECT_GE(probe->epoll_fd(), 0);
    auto dropped = probe->dropped();
    ASSERT_TRUE(dropped);
    EXPECT_EQ(*dropped, 0U);
}

// The daemon runs as user qrtd with CAP_BPF and CAP_PERFMON: every probe must
// load and attach with those two alone (no CAP_SYS_ADMIN, no tracefs).
TEST(capabilities, all_probes_load_and_attach_with_cap_bpf_and_cap_perfmon_alone) {
    QRT_SKIP_UNLESS_PROBES_LOAD();
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to hand CAP_BPF and CAP_PERFMON to the child";
    }
    for (bool force_raw : {false, true}) {
        const auto r = qrt::testing::run_in_child([force_raw](std::string& out) {
            if (!qrt_bpf_test::drop_caps_except({CAP_BPF, CAP_PERFMON})) {
                out = "cap_set_proc failed";
                return 3;
            }
            cap_t caps = cap_get_proc();
            cap_flag_value_t admin = CAP_SET;
            cap_get_flag(caps, CAP_SYS_ADMIN, CAP_EFFECTIVE, &admin);
            cap_free(caps);
            if (admin == CAP_SET) {
                out = "CAP_SYS_ADMIN still held";
                return 4;
            }
            probe_config cfg;
            cfg.isolated_cpus = {0};
            cfg.force_raw_tp = force_raw;
            probe_set set = probe_set::start(cfg);
            out = set.describe();
            if (!set.availability().available()) {
                out += " / " + set.availability().to_string();
                return 1;
            }
            return set.add_tid(::getpid()).has_value() ? 0 : 2;
        });
        EXPECT_EQ(r.exit_code, 0) << (force_raw ? "raw_tp: " : "auto: ") << r.reply;
    }
}

TEST(capabilities, loading_without_cap_perfmon_fails_with_eperm_and_says_which_capability) {
    QRT_SKIP_UNLESS_PROBES_LOAD();
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to hand CAP_BPF to the child";
    }
    const auto r = qrt::testing::run_in_child([](std::string& out) {
        if (!qrt_bpf_test::drop_caps_except({CAP_BPF})) {
            return 3;
        }
        auto probe = wakeup_probe::load({});
        if (probe) {
            out = "loaded without CAP_PERFMON";
            return 1;
        }
        out = probe.err().message;
        return probe.err().code == EPERM || probe.err().code == EACCES ? 0 : 2;
    });
    EXPECT_EQ(r.exit_code, 0) << r.reply;
    EXPECT_NE(r.reply.find("missing capability"), std::string::npos) << r.reply;
}
