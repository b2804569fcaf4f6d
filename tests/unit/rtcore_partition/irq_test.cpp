#include <gtest/gtest.h>

#include <cerrno>
#include <optional>

#include "rtcore/irq.hpp"
#include "tree_fixture.hpp"

using namespace qrt_test;
using rtcore::cpu_set;
using rtcore::restore_journal;
using action = rtcore::irq_outcome::action;

namespace {
// The outcome for one IRQ; value() throws (failing the test) when it is missing.
std::optional<rtcore::irq_outcome> find_irq(const rtcore::irq_report& r, unsigned irq) {
    for (const auto& o : r.irqs) {
        if (o.irq == irq) {
            return o;
        }
    }
    return std::nullopt;
}
}  // namespace

TEST(irq, names_come_from_proc_interrupts) {
    tree_copy t("host8-v2");
    rtcore::host_fs fs(t.root());
    const auto names = rtcore::irq_names(fs);
    EXPECT_EQ(names.at(0), "timer");
    EXPECT_EQ(names.at(121), "nvme0q2");
    EXPECT_EQ(names.at(130), "enp2s0-rx-0, enp2s0-tx-0");
    EXPECT_EQ(rtcore::cpumask_bits(fs), 8U);
}

TEST(irq, pins_every_irq_on_an_isolated_cpu_and_the_default_mask) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    auto r = rtcore::pin_irqs(fs, *j, {1}, {0});
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(r->count(action::pinned), 6U);
    for (unsigned irq : {24U, 26U, 28U, 36U, 41U, 42U}) {
        EXPECT_EQ(read_file(t.root() / ("proc/irq/" + std::to_string(irq) + "/smp_affinity_list")), "0")
            << "irq " << irq;
    }
    EXPECT_EQ(read_file(t.root() / "proc/irq/default_smp_affinity"), "00000001");
    EXPECT_EQ(r->default_before, "3");
    EXPECT_EQ(find_irq(*r, 36).value().line(),
              "irq 36 (virtio1-req.0): pinned 0-1 -> 0; effective affinity still 1; it moves at the next interrupt");
    EXPECT_EQ(find_irq(*r, 41).value().line(), "irq 41 (virtio3-rx): pinned 0-1 -> 0");
    // every original is in the journal before the writes
    std::size_t files = 0;
    for (const auto& rec : j->records()) {
        files += std::holds_alternative<rtcore::rec::file>(rec) ? 1U : 0U;
    }
    EXPECT_EQ(files, 7U);
}

// A managed IRQ that the kernel delivers to a housekeeping CPU is only
// recorded; one it delivers to an isolated CPU is named as such, because
// then every interrupt of its device lands on a dispatch CPU.
TEST(irq, a_managed_irq_delivered_to_an_isolated_cpu_is_named) {
    tree_copy t("host8-v2");
    write_file(t.root() / "proc/irq/121/effective_affinity_list", "0\n");
    rtcore::host_fs fs(t.root());
    for (unsigned irq = 121; irq <= 122; ++irq) {
        fs.inject_write_error("/proc/irq/" + std::to_string(irq) + "/smp_affinity_list", EIO);
    }
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    auto r = rtcore::pin_irqs(fs, *j, cpu_set{2, 3, 4, 5, 6, 7}, cpu_set{0, 1});
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(find_irq(*r, 121).value().act, action::managed);
    EXPECT_EQ(find_irq(*r, 121).value().lands_on_isolated, "");
    EXPECT_EQ(find_irq(*r, 121).value().detail.find("isolated"), std::string::npos);
    EXPECT_EQ(find_irq(*r, 122).value().lands_on_isolated, "4");
    // Re-applied, the recorded one still says where it lands.
    auto again = rtcore::pin_irqs(fs, *j, cpu_set{2, 3, 4, 5, 6, 7}, cpu_set{0, 1});
    ASSERT_TRUE(again) << again.err().message;
    EXPECT_EQ(find_irq(*again, 122).value().lands_on_isolated, "4");
    EXPECT_NE(find_irq(*again, 122).value().detail.find("recorded as kernel-managed earlier"), std::string::npos);
}

TEST(irq, a_managed_irq_is_reported_and_never_retried) {
    tree_copy t("host8-v2");
    rtcore::host_fs fs(t.root());
    for (unsigned irq = 120; irq <= 123; ++irq) {
        fs.inject_write_error("/proc/irq/" + std::to_string(irq) + "/smp_affinity_list", EIO);
    }
    const cpu_set iso{2, 3, 4, 5, 6, 7};
    const cpu_set hk{0, 1};
    {
        auto j = open_journal(t, fs);
        ASSERT_TRUE(j);
        auto r = rtcore::pin_irqs(fs, *j, iso, hk);
        ASSERT_TRUE(r) << r.err().message;
        EXPECT_EQ(r->count(action::managed), 3U);  // 121..123; 120 is already on 0-1
        EXPECT_EQ(find_irq(*r, 120).value().act, action::already_ok);
        EXPECT_EQ(find_irq(*r, 122).value().line(),
                  "irq 122 (nvme0q3): managed 4-5 -> 4-5; write /proc/irq/122/smp_affinity_list: "
                  "Input/output error (kernel-managed IRQ; recorded, not retried); delivered to isolated "
                  "CPU 4 (effective_affinity_list): its every interrupt lands there until a boot with "
                  "isolcpus=managed_irq");
        EXPECT_EQ(find_irq(*r, 122).value().lands_on_isolated, "4");
        EXPECT_EQ(r->count(action::pinned), 4U);
    }
    // Any further write to them would now fail the whole apply: re-apply and
    // verify must not even try.
    for (unsigned irq = 121; irq <= 123; ++irq) {
        fs.inject_write_error("/proc/irq/" + std::to_string(irq) + "/smp_affinity_list", EROFS);
    }
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    auto again = rtcore::pin_irqs(fs, *j, iso, hk);
    ASSERT_TRUE(again) << again.err().message;
    EXPECT_EQ(again->count(action::managed), 3U);
    EXPECT_EQ(find_irq(*again, 121).value().detail,
              "recorded as kernel-managed earlier; not retried; delivered to isolated CPU 2 "
              "(effective_affinity_list): its every interrupt lands there until a boot with isolcpus=managed_irq");
    auto v = rtcore::verify_irqs(fs, *j, iso, hk);
    ASSERT_TRUE(v) << v.err().message;
    EXPECT_EQ(v->count(action::managed), 3U);
}

TEST(irq, verify_repins_drift_and_new_irqs_journaling_new_originals_first) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    ASSERT_TRUE(rtcore::pin_irqs(fs, *j, {1}, {0}));
    auto clean = rtcore::verify_irqs(fs, *j, {1}, {0});
    ASSERT_TRUE(clean);
    EXPECT_TRUE(clean->irqs.empty()) << clean->irqs.front().line();

    write_file(t.root() / "proc/irq/36/smp_affinity_list", "0-1\n");  // drift
    write_file(t.root() / "proc/irq/50/smp_affinity_list", "1\n");    // hot-plugged device
    write_file(t.root() / "proc/irq/50/effective_affinity_list", "1\n");
    auto v = rtcore::verify_irqs(fs, *j, {1}, {0});
    ASSERT_TRUE(v) << v.err().message;
    EXPECT_EQ(find_irq(*v, 36).value().act, action::repinned);
    EXPECT_EQ(find_irq(*v, 50).value().act, action::new_pinned);
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0");
    EXPECT_EQ(read_file(t.root() / "proc/irq/50/smp_affinity_list"), "0");
    EXPECT_TRUE(j->has_file("/proc/irq/50/smp_affinity_list"));
    // The first original of irq 36 is still the boot value, not the drifted one.
    for (const auto& rec : j->records()) {
        const auto* f = std::get_if<rtcore::rec::file>(&rec);
        if (f != nullptr && f->path == "/proc/irq/50/smp_affinity_list") {
            EXPECT_EQ(f->original, "1\n");
        }
    }
    // A vanished IRQ is reported as gone.
    fs::remove_all(t.root() / "proc/irq/42");
    auto gone = rtcore::verify_irqs(fs, *j, {1}, {0});
    ASSERT_TRUE(gone);
    EXPECT_EQ(find_irq(*gone, 42).value().act, action::gone);
}

TEST(irqbalance, running_unconfigured_gets_exact_advice_and_is_not_fought) {
    tree_copy t("host8-v2");
    rtcore::host_fs fs(t.root());
    const cpu_set iso{4, 5, 6, 7};
    const cpu_set hk{0, 1, 2, 3};
    auto s = rtcore::probe_irqbalance(fs, iso);
    EXPECT_EQ(s.st, rtcore::irqbalance_status::state::not_configured);
    EXPECT_EQ(s.pid, 812);
    EXPECT_EQ(s.line(),
              "irqbalance: running (pid 812) and not banning the isolated CPUs: set IRQBALANCE_BANNED_CPULIST=4-7 "
              "in /etc/default/irqbalance (irqbalance >= 1.8; older versions: IRQBALANCE_BANNED_CPUS=000000f0) "
              "and run `systemctl restart irqbalance`; qrtd does not restart services, and will not fight "
              "irqbalance over IRQs it moves back");

    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    ASSERT_TRUE(rtcore::pin_irqs(fs, *j, iso, hk));
    write_file(t.root() / "proc/irq/130/smp_affinity_list", "5\n");  // irqbalance moved it back
    auto v = rtcore::verify_irqs(fs, *j, iso, hk);
    ASSERT_TRUE(v);
    EXPECT_EQ(find_irq(*v, 130).value().act, action::left_to_irqbalance);
    EXPECT_EQ(read_file(t.root() / "proc/irq/130/smp_affinity_list"), "5\n") << "verify fought irqbalance";
}

TEST(irqbalance, config_without_restart_and_running_with_the_ban) {
    tree_copy t("host8-v2");
    rtcore::host_fs fs(t.root());
    const cpu_set iso{4, 5, 6, 7};
    write_file(t.root() / "etc/default/irqbalance", "IRQBALANCE_BANNED_CPULIST=\"4-7\"\n");
    auto s = rtcore::probe_irqbalance(fs, iso);
    EXPECT_EQ(s.st, rtcore::irqbalance_status::state::needs_restart);
    EXPECT_NE(s.advice.find("run `systemctl restart irqbalance`"), std::string::npos) << s.advice;

    static constexpr char env[] = "PATH=/usr/bin\0IRQBALANCE_BANNED_CPULIST=4-7\0";
    write_file(t.root() / "proc/812/environ", std::string(env, sizeof env - 1));
    s = rtcore::probe_irqbalance(fs, iso);
    EXPECT_EQ(s.st, rtcore::irqbalance_status::state::coordinated);
    EXPECT_EQ(s.line(), "irqbalance: running (pid 812) with banned CPUs 4-7: coordinated");

    // Coordinated: drift onto an isolated CPU is something else, and is re-pinned.
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    ASSERT_TRUE(rtcore::pin_irqs(fs, *j, iso, {0, 1, 2, 3}));
    write_file(t.root() / "proc/irq/130/smp_affinity_list", "5\n");
    auto v = rtcore::verify_irqs(fs, *j, iso, {0, 1, 2, 3});
    ASSERT_TRUE(v);
    EXPECT_EQ(find_irq(*v, 130).value().act, action::repinned);
}

TEST(irq, a_read_only_proc_is_a_fatal_error_naming_the_path) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    fs.inject_write_error("/proc/irq/28/smp_affinity_list", EROFS);
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    auto r = rtcore::pin_irqs(fs, *j, {1}, {0});
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, EROFS);
    EXPECT_EQ(r.err().message,
              "write /proc/irq/28/smp_affinity_list: Read-only file system (IRQ 28 virtio0-config)");
}
