#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "rtcore/partition_plan.hpp"

using rtcore::cpu_set;
using rtcore::partition_plan;
using rtcore::plan_partition;
using rtcore::plan_request;
using rtcore::topology;

namespace {
const std::string xml_dual = std::string(QRT_TEST_DATA_DIR) + "/topology/dual-socket-16cpu-nics.xml";

topology synthetic(const char* desc) {
    auto t = topology::from_synthetic(desc);
    EXPECT_TRUE(t) << (t ? "" : t.err().message);
    return std::move(t).value();
}

cpu_set list(const char* s) { return cpu_set::parse_list(s).value(); }

bool any_reason_contains(const partition_plan& p, const std::string& needle) {
    return std::any_of(p.reasons.begin(), p.reasons.end(),
                       [&](const std::string& r) { return r.find(needle) != std::string::npos; });
}

std::string all_reasons(const partition_plan& p) {
    std::string out;
    for (const auto& r : p.reasons) {
        out += "  " + r + "\n";
    }
    return out;
}

// Invariants every accepted plan keeps.
void expect_sound(const topology& t, const partition_plan& p, unsigned rt_threads) {
    EXPECT_EQ(p.isolated | p.housekeeping, t.online_cpus());
    EXPECT_FALSE(p.isolated.intersects(p.housekeeping));
    EXPECT_FALSE(p.housekeeping.empty());
    EXPECT_FALSE(p.isolated.empty());
    for (const auto& c : t.cores()) {
        EXPECT_TRUE(c.cpus.is_subset_of(p.isolated) || !c.cpus.intersects(p.isolated))
            << "core " << c.index << " (" << c.cpus.to_list() << ") is split";
    }
    ASSERT_EQ(p.rt_cpus.size(), rt_threads);
    for (unsigned cpu : p.rt_cpus) {
        EXPECT_TRUE(p.isolated.test(cpu)) << "RT CPU " << cpu;
    }
    EXPECT_TRUE(p.kernel_cmdline.needs_reboot);
    EXPECT_EQ(p.kernel_cmdline.args, rtcore::recommended_kernel_cmdline(p.isolated, p.housekeeping));
    EXPECT_FALSE(p.reasons.empty());
}
}  // namespace

TEST(partition_plan, one_cpu_host_is_refused_because_nothing_would_be_left_for_housekeeping) {
    const auto t = synthetic("pu:1");
    auto p = plan_partition(t, plan_request{});
    ASSERT_FALSE(p);
    EXPECT_EQ(p.err().message,
              "plan: topology synthetic:pu:1 has 1 core (CPU 0) and 1 must stay housekeeping, so no whole core "
              "is left to isolate; an RT CPU needs a host with at least 2 cores");
}

TEST(partition_plan, one_core_with_two_smt_threads_is_refused_too) {
    const auto t = synthetic("core:1 pu:2");
    auto p = plan_partition(t, plan_request{});
    ASSERT_FALSE(p);
    EXPECT_NE(p.err().message.find("has 1 core (CPUs 0-1)"), std::string::npos) << p.err().message;
}

TEST(partition_plan, two_cpu_host_isolates_cpu_1_and_keeps_cpu_0_for_housekeeping) {
    const auto t = synthetic("package:1 core:2 pu:1");
    auto p = plan_partition(t, plan_request{});
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(t, *p, 1);
    EXPECT_EQ(p->isolated, cpu_set{1});
    EXPECT_EQ(p->housekeeping, cpu_set{0});
    EXPECT_EQ(p->rt_cpus, std::vector<unsigned>{1});
    EXPECT_EQ(p->kernel_cmdline.args, "isolcpus=managed_irq,domain,1 nohz_full=1 rcu_nocbs=1 irqaffinity=0");
    EXPECT_TRUE(any_reason_contains(*p, "CPU 0 stays housekeeping")) << all_reasons(*p);
    EXPECT_TRUE(any_reason_contains(*p, "needs") || any_reason_contains(*p, "reboot")) << all_reasons(*p);
}

TEST(partition_plan, eight_cpu_smt_host_isolates_the_last_whole_core_and_leaves_the_sibling_idle) {
    const auto t = synthetic("package:1 core:4 pu:2");
    auto p = plan_partition(t, plan_request{});
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(t, *p, 1);
    EXPECT_EQ(p->isolated, list("6-7"));
    EXPECT_EQ(p->housekeeping, list("0-5"));
    EXPECT_EQ(p->rt_cpus, std::vector<unsigned>{6});
    EXPECT_TRUE(any_reason_contains(*p, "RT thread 0 runs on CPU 6, the first CPU of isolated core 3 (CPUs 6-7); "
                                        "its SMT sibling CPU 7 stays idle"))
        << all_reasons(*p);
    EXPECT_TRUE(any_reason_contains(*p, "isolated core 3 (CPUs 6-7): highest-numbered free core")) << all_reasons(*p);
}

TEST(partition_plan, sixty_four_cpu_smt_host_gives_each_rt_thread_its_own_whole_core) {
    const auto t = synthetic("package:2 core:16 pu:2");
    plan_request req;
    req.rt_cpu_count = 2;
    auto p = plan_partition(t, req);
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(t, *p, 2);
    EXPECT_EQ(p->isolated, list("60-63"));
    EXPECT_NE(t.core_of(p->rt_cpus[0]), t.core_of(p->rt_cpus[1]));
    EXPECT_EQ(p->housekeeping.count(), 60U);
    EXPECT_TRUE(any_reason_contains(*p, "isolating 2 whole cores: one per RT thread (2 RT threads)")) << all_reasons(*p);
}

TEST(partition_plan, sixty_four_cpu_host_can_isolate_all_but_the_housekeeping_minimum) {
    const auto t = synthetic("package:2 core:16 pu:2");
    plan_request req;
    req.isolate_cores = 28;
    req.min_housekeeping_cores = 4;
    auto p = plan_partition(t, req);
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(t, *p, 1);
    EXPECT_EQ(p->housekeeping, list("0-7"));
    req.isolate_cores = 29;
    auto refused = plan_partition(t, req);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.err().message,
              "plan: cannot isolate 29 cores: topology synthetic:package:2 core:16 pu:2 has 32 cores and 4 must "
              "stay housekeeping, so at most 28 can be isolated");
}

TEST(partition_plan, explicit_list_that_splits_an_smt_core_is_widened_with_the_reason) {
    const auto t = synthetic("package:1 core:4 pu:2(indexes=0,4,1,5,2,6,3,7)");
    plan_request req;
    req.isolated = cpu_set{3};
    auto p = plan_partition(t, req);
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(t, *p, 1);
    EXPECT_EQ(p->isolated, (cpu_set{3, 7}));
    EXPECT_EQ(p->housekeeping, list("0-2,4-6"));
    EXPECT_TRUE(any_reason_contains(*p, "widened the isolated list to the whole of core 3 (CPUs 3,7): CPU 3 was "
                                        "listed without SMT sibling CPU 7"))
        << all_reasons(*p);
}

TEST(partition_plan, explicit_list_that_splits_an_smt_core_is_refused_when_widening_is_off) {
    const auto t = synthetic("package:1 core:4 pu:2(indexes=0,4,1,5,2,6,3,7)");
    plan_request req;
    req.isolated = cpu_set{3};
    req.on_split_core = plan_request::split_core::refuse;
    auto p = plan_partition(t, req);
    ASSERT_FALSE(p);
    EXPECT_EQ(p.err().message,
              "plan: isolated list 3 splits core 3 (CPUs 3,7): CPU 3 would be isolated while SMT sibling CPU 7 runs "
              "housekeeping work on the same execution units and L1/L2 cache; list the whole core (3,7) or allow "
              "widening");
}

TEST(partition_plan, unknown_cpu_is_refused_naming_it_and_the_online_set) {
    const auto t = synthetic("package:1 core:4 pu:2");
    plan_request req;
    req.isolated = cpu_set{6, 7, 9};
    auto p = plan_partition(t, req);
    ASSERT_FALSE(p);
    EXPECT_EQ(p.err().message, "plan: isolated CPU 9 is not online (online CPUs: 0-7)");
    req.isolated = cpu_set{8, 12};
    auto p2 = plan_partition(t, req);
    ASSERT_FALSE(p2);
    EXPECT_EQ(p2.err().message, "plan: isolated CPUs 8,12 are not online (online CPUs: 0-7)");
}

TEST(partition_plan, isolating_every_cpu_is_refused) {
    const auto t = synthetic("package:1 core:4 pu:2");
    plan_request req;
    req.isolated = list("0-7");
    auto p = plan_partition(t, req);
    ASSERT_FALSE(p);
    EXPECT_EQ(p.err().message,
              "plan: isolated set 0-7 covers every online CPU (0-7); at least 1 whole core must stay housekeeping");
}

TEST(partition_plan, widening_that_would_eat_the_last_housekeeping_core_is_refused) {
    const auto t = synthetic("package:1 core:2 pu:2");
    plan_request req;
    req.isolated = list("1-2");   // splits both cores
    auto p = plan_partition(t, req);
    ASSERT_FALSE(p);
    EXPECT_EQ(p.err().message,
              "plan: isolated set 0-3 covers every online CPU (0-3); at least 1 whole core must stay housekeeping");
}

TEST(partition_plan, fewer_housekeeping_cores_than_required_is_refused) {
    const auto t = synthetic("package:1 core:4 pu:1");
    plan_request req;
    req.isolated = list("1-3");
    req.min_housekeeping_cores = 2;
    auto p = plan_partition(t, req);
    ASSERT_FALSE(p);
    EXPECT_EQ(p.err().message, "plan: isolated set 1-3 leaves 1 housekeeping core, fewer than the 2 required");
}

TEST(partition_plan, zero_housekeeping_cores_is_refused) {
    const auto t = synthetic("package:1 core:4 pu:1");
    plan_request req;
    req.min_housekeeping_cores = 0;
    auto p = plan_partition(t, req);
    ASSERT_FALSE(p);
    EXPECT_EQ(p.err().message, "plan: min_housekeeping_cores is 0; at least 1 whole core must stay housekeeping");
}

TEST(partition_plan, cores_near_the_endpoint_nic_are_preferred_over_higher_numbered_ones) {
    auto t = topology::from_xml(xml_dual);
    ASSERT_TRUE(t) << t.err().message;
    plan_request req;
    req.near_device = "eno1";   // package 0, CPUs 0-7
    auto p = plan_partition(*t, req);
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(*t, *p, 1);
    EXPECT_EQ(p->isolated, list("6-7"));
    EXPECT_EQ(p->near_device_cpus, list("0-7"));
    EXPECT_EQ(p->rt_cpus, std::vector<unsigned>{6});
    EXPECT_TRUE(any_reason_contains(*p, "device eno1 is local to CPUs 0-7")) << all_reasons(*p);
    EXPECT_TRUE(any_reason_contains(*p, "isolated core 3 (CPUs 6-7, package 0): it is near device eno1"))
        << all_reasons(*p);
}

TEST(partition_plan, locality_by_pci_bus_id_picks_the_package_holding_the_device) {
    auto t = topology::from_xml(xml_dual);
    ASSERT_TRUE(t) << t.err().message;
    plan_request req;
    req.near_device = "0000:81:00.0";
    req.rt_cpu_count = 2;
    auto p = plan_partition(*t, req);
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(*t, *p, 2);
    EXPECT_EQ(p->isolated, list("12-15"));
    EXPECT_TRUE(p->isolated.is_subset_of(p->near_device_cpus));
}

TEST(partition_plan, near_cores_run_out_before_cpu_0_is_given_up) {
    auto t = topology::from_xml(xml_dual);
    ASSERT_TRUE(t) << t.err().message;
    plan_request req;
    req.near_device = "eno1";
    req.isolate_cores = 4;   // package 0 has 4 cores, one of them holds CPU 0
    auto p = plan_partition(*t, req);
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(*t, *p, 1);
    EXPECT_EQ(p->isolated, list("2-7,14-15"));
    EXPECT_FALSE(p->isolated.test(0));
    EXPECT_TRUE(any_reason_contains(*p, "isolated core 7 (CPUs 14-15, package 1): no free core near device eno1 "
                                        "was left"))
        << all_reasons(*p);
    // The RT CPU is on a near core.
    EXPECT_TRUE(p->near_device_cpus.test(p->rt_cpus[0]));
}

TEST(partition_plan, an_unknown_locality_device_is_refused_naming_it) {
    auto t = topology::from_xml(xml_dual);
    ASSERT_TRUE(t) << t.err().message;
    plan_request req;
    req.near_device = "eth9";
    auto p = plan_partition(*t, req);
    ASSERT_FALSE(p);
    EXPECT_EQ(p.err().message, "plan: locality hint: network interface eth9 not found in topology xml:" + xml_dual +
                                   " (network interfaces: eno1, ens1f0)");
}

TEST(partition_plan, requested_rt_cpus_pull_their_whole_cores_into_the_isolated_set) {
    const auto t = synthetic("package:1 core:4 pu:2");
    plan_request req;
    req.rt_cpu_count = 2;
    req.rt_cpus = {5, 2};
    auto p = plan_partition(t, req);
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(t, *p, 2);
    EXPECT_EQ(p->isolated, list("2-5"));
    EXPECT_EQ(p->rt_cpus, (std::vector<unsigned>{5, 2}));
    EXPECT_TRUE(any_reason_contains(*p, "isolated core 2 (CPUs 4-5): it holds CPU 5, requested as the CPU "
                                        "of RT thread 0"))
        << all_reasons(*p);
}

TEST(partition_plan, an_rt_cpu_outside_an_explicit_isolated_list_is_refused) {
    const auto t = synthetic("package:1 core:4 pu:2");
    plan_request req;
    req.isolated = list("6-7");
    req.rt_cpus = {4};
    auto p = plan_partition(t, req);
    ASSERT_FALSE(p);
    EXPECT_EQ(p.err().message, "plan: RT CPU 4 of RT thread 0 is not in the isolated set 6-7");
}

TEST(partition_plan, two_rt_threads_cannot_share_one_cpu) {
    const auto t = synthetic("package:1 core:4 pu:2");
    plan_request req;
    req.rt_cpu_count = 2;
    req.rt_cpus = {6, 6};
    auto p = plan_partition(t, req);
    ASSERT_FALSE(p);
    EXPECT_EQ(p.err().message,
              "plan: RT CPU 6 is requested for RT thread 0 and RT thread 1; each RT thread needs a CPU of its own");
}

TEST(partition_plan, more_rt_threads_than_isolated_cores_share_cores_and_say_so) {
    const auto t = synthetic("package:1 core:4 pu:2");
    plan_request req;
    req.isolated = list("6-7");
    req.rt_cpu_count = 2;
    auto p = plan_partition(t, req);
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(t, *p, 2);
    EXPECT_EQ(p->rt_cpus, (std::vector<unsigned>{6, 7}));
    EXPECT_TRUE(any_reason_contains(*p, "fewer isolated cores than RT threads")) << all_reasons(*p);
    req.rt_cpu_count = 3;
    auto refused = plan_partition(t, req);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.err().message, "plan: 3 RT threads need a CPU each but the isolated set 6-7 has only 2");
}

TEST(partition_plan, isolating_cpu_0_on_request_is_allowed_but_explained) {
    const auto t = synthetic("package:1 core:4 pu:1");
    plan_request req;
    req.isolated = cpu_set{0};
    auto p = plan_partition(t, req);
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(t, *p, 1);
    EXPECT_TRUE(any_reason_contains(*p, "CPU 0 is isolated as requested")) << all_reasons(*p);
    EXPECT_EQ(p->kernel_cmdline.args, "isolcpus=managed_irq,domain,0 nohz_full=0 rcu_nocbs=0 irqaffinity=1-3");
}

TEST(partition_plan, the_plan_renders_as_text_with_the_reboot_warning) {
    const auto t = synthetic("package:1 core:2 pu:1");
    auto p = plan_partition(t, plan_request{});
    ASSERT_TRUE(p) << p.err().message;
    const std::string text = rtcore::format_plan(*p);
    EXPECT_NE(text.find("isolated:     1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("rt thread 0 cpu: 1\n"), std::string::npos) << text;
    // The caller names what each RT thread is for.
    const std::string named = rtcore::format_plan(*p, [](std::size_t q) { return "qpu " + std::to_string(q) + " dispatch cpu"; });
    EXPECT_NE(named.find("qpu 0 dispatch cpu: 1\n"), std::string::npos) << named;
    EXPECT_NE(text.find("kernel command line (needs reboot): isolcpus=managed_irq,domain,1"), std::string::npos)
        << text;
}

TEST(partition_plan, this_host_can_be_planned_or_is_refused_with_a_reason) {
    auto t = topology::from_system();
    ASSERT_TRUE(t) << t.err().message;
    auto p = plan_partition(*t, plan_request{});
    if (t->cores().size() < 2) {
        ASSERT_FALSE(p);
        EXPECT_NE(p.err().message.find("no whole core is left to isolate"), std::string::npos);
        return;
    }
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(*t, *p, 1);
    EXPECT_FALSE(p->isolated.test(0));
}

TEST(partition_plan, an_explicit_list_keeps_its_cpus_but_dispatches_near_the_device_and_notes_the_far_ones) {
    auto t = topology::from_xml(xml_dual);
    ASSERT_TRUE(t) << t.err().message;
    plan_request req;
    req.isolated = list("6-7,14-15");
    req.near_device = "ens1f0";   // package 1
    auto p = plan_partition(*t, req);
    ASSERT_TRUE(p) << p.err().message;
    expect_sound(*t, *p, 1);
    EXPECT_EQ(p->isolated, list("6-7,14-15"));
    EXPECT_EQ(p->rt_cpus, std::vector<unsigned>{14});
    EXPECT_TRUE(any_reason_contains(*p, "note: isolated CPUs 6-7 not near device ens1f0")) << all_reasons(*p);
}
