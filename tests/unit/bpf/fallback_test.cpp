// The tp_btf -> raw_tp fallback per program, and error messages that name
// the real cause.  The loading test makes the kernel's verifier really
// reject one tp_btf program, the way Debian 12's 6.1 rejects
// tp_btf_sched_switch: it retargets that program to sched_wakeup, whose BTF
// prototype has a single argument, so its reads of prev, next and
// prev_state fail verification with EACCES.
#include <bpf/libbpf.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "feature_probe.hpp"
#include "qrt_bpf/availability.hpp"
#include "rtcore/host_fs.hpp"
#include "shared_abi.hpp"

#ifndef QRT_BPF_HAVE_PROBES
#define QRT_BPF_HAVE_PROBES 0
#endif
#if QRT_BPF_HAVE_PROBES
#include "wakeup.skel.h"
#endif

using namespace qrt_bpf;
namespace d = qrt_bpf::detail;

namespace {

constexpr auto npos = std::string::npos;

TEST(flavour_plan, describes_what_runs_as_raw_tp) {
    d::flavour_plan p;
    EXPECT_EQ(p.describe(), "tp_btf");
    p.raw.insert("sched_switch");
    p.raw.insert("irq_handler_entry");
    EXPECT_TRUE(p.is_raw("sched_switch"));
    EXPECT_FALSE(p.is_raw("sched_wakeup"));
    EXPECT_EQ(p.describe(), "tp_btf, raw_tp for irq_handler_entry,sched_switch");
    p.all_raw = true;
    EXPECT_TRUE(p.is_raw("sched_wakeup"));
    EXPECT_EQ(p.describe(), "raw_tp");
}

TEST(log_tail, keeps_the_last_non_empty_lines) {
    const std::string log =
        "func#0 @0\n"
        "reg type unsupported for arg#0 function tp_btf_sched_switch#5\n"
        "0: R1=ctx(off=0,imm=0) R10=fp0\n"
        "; int BPF_PROG(tp_btf_sched_switch, ...)\n"
        "\n"
        "func 'sched_wakeup' doesn't have 2-th argument\n"
        "invalid bpf_context access off=8 size=8\n"
        "processed 3 insns (limit 1000000)\n\n";
    EXPECT_EQ(d::log_tail(log, 3),
              "func 'sched_wakeup' doesn't have 2-th argument | invalid bpf_context access off=8 "
              "size=8 | processed 3 insns (limit 1000000)");
    EXPECT_EQ(d::log_tail("", 3), "");
    EXPECT_EQ(d::log_tail("one", 3), "one");
}

TEST(libbpf_error, eacces_quotes_the_verifier_and_blames_no_capability) {
    const auto e = d::libbpf_error("wakeup: load program tp_btf_sched_switch", -EACCES,
                                   "a\nb\nR1 invalid mem access 'scalar'\nprocessed 9 insns\n");
    EXPECT_EQ(e.code, EACCES);
    EXPECT_NE(e.message.find("Permission denied"), npos) << e.message;
    EXPECT_NE(e.message.find("verifier: b | R1 invalid mem access 'scalar' | processed 9 insns"), npos)
        << e.message;
    EXPECT_EQ(e.message.find("capabilit"), npos) << e.message;
    EXPECT_EQ(e.message.find("CAP_"), npos) << e.message;
}

TEST(libbpf_error, eperm_blames_a_capability_only_when_one_is_missing) {
    const auto e = d::libbpf_error("wakeup: load", -EPERM);
    const std::string missing = d::missing_bpf_capabilities();
    if (missing.empty()) {
        EXPECT_NE(e.message.find("CAP_BPF and CAP_PERFMON are held"), npos) << e.message;
        EXPECT_EQ(e.message.find("missing capability"), npos) << e.message;
    } else {
        EXPECT_NE(e.message.find("missing capability " + missing), npos) << e.message;
    }
}

#if QRT_BPF_HAVE_PROBES

struct skel_deleter {
    void operator()(qrt_wakeup* s) const noexcept { qrt_wakeup__destroy(s); }
};

TEST(flavour_fallback, a_tp_btf_program_the_verifier_rejects_falls_back_to_raw_tp_alone_and_measures) {
    if (!preflight(rtcore::host_fs::system()).available()) {
        GTEST_SKIP() << "probes " << preflight(rtcore::host_fs::system()).to_string();
    }
    if (!d::kernel_has_tp_btf("sched_switch")) {
        GTEST_SKIP() << "this kernel loads no tp_btf program: everything is raw_tp already";
    }
    std::unique_ptr<qrt_wakeup, skel_deleter> skel;
    unsigned opens = 0;
    auto r = d::load_with_fallback(
        "wakeup", false,
        [&]() -> rtcore::result<bpf_object*> {
            skel.reset(qrt_wakeup__open());
            if (!skel) {
                const int err = errno;
                return rtcore::error::from_errno(err, "qrt_wakeup__open");
            }
            ++opens;
            if (const int err = bpf_program__set_attach_target(skel->progs.tp_btf_sched_switch, 0,
                                                               "sched_wakeup");
                err != 0) {
                return rtcore::error::from_errno(-err, "bpf_program__set_attach_target");
            }
            return skel->obj;
        },
        [&] { return qrt_wakeup__load(skel.get()); });
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(opens, 2U) << "one rejection, one reload";
    EXPECT_EQ(r->flavour, "tp_btf, raw_tp for sched_switch");
    EXPECT_NE(r->tp_btf_rejections.find("tp_btf_sched_switch: Permission denied: "), npos)
        << r->tp_btf_rejections;
    EXPECT_NE(r->tp_btf_rejections.find("sched_wakeup"), npos)
        << "the verifier's own words are quoted: " << r->tp_btf_rejections;
    // Only the rejected handler moved.
    EXPECT_GE(bpf_program__fd(skel->progs.raw_tp_sched_switch), 0);
    EXPECT_LT(bpf_program__fd(skel->progs.tp_btf_sched_switch), 0);
    EXPECT_GE(bpf_program__fd(skel->progs.tp_btf_sched_wakeup), 0);
    EXPECT_LT(bpf_program__fd(skel->progs.raw_tp_sched_wakeup), 0);

    // And the mixed set measures: this thread's wakeups from its sleeps.
    ASSERT_EQ(qrt_wakeup__attach(skel.get()), 0);
    const auto tid = static_cast<std::uint32_t>(::syscall(SYS_gettid));
    const std::uint8_t one = 1;
    ASSERT_EQ(bpf_map__update_elem(skel->maps.dispatch_tids, &tid, sizeof(tid), &one, sizeof(one), BPF_ANY), 0);
    for (int i = 0; i < 10; ++i) {
        timespec ts{0, 1'000'000};
        ::clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, nullptr);
    }
    const int ncpus = libbpf_num_possible_cpus();
    ASSERT_GT(ncpus, 0);
    std::vector<qrt_wakeup_hist> per_cpu(static_cast<std::size_t>(ncpus));
    const std::uint32_t zero = 0;
    ASSERT_EQ(bpf_map__lookup_elem(skel->maps.wakeup_hist, &zero, sizeof(zero), per_cpu.data(),
                                   per_cpu.size() * sizeof(per_cpu[0]), 0),
              0);
    std::uint64_t count = 0;
    for (const auto& h : per_cpu) {
        count += h.count;
    }
    EXPECT_GE(count, 10U) << "raw_tp_sched_switch and tp_btf_sched_wakeup together measure";
}

#endif

}  // namespace
