// dispatch.submit_mode = "auto": the submit mode and poller CPU chosen from
// the partition, on synthetic hwloc topologies (qrt/dispatch/submit_choice.hpp).
#include <gtest/gtest.h>

#include "qrt/dispatch/submit_choice.hpp"

namespace {

using qrt::dispatch::choose_submit;
using qrt::dispatch::spare_poller_cpus;
using qrt::dispatch::submit_mode;
using qrt::dispatch::submit_request;

rtcore::topology synthetic(const char* description) {
    auto t = rtcore::topology::from_synthetic(description);
    EXPECT_TRUE(t) << (t ? "" : t.err().message);
    return std::move(*t);
}

TEST(submit_choice, an_isolated_smt_sibling_of_the_dispatch_cpu_gets_the_poller) {
    const auto topo = synthetic("package:1 core:4 pu:2");  // cores {0,1} {2,3} {4,5} {6,7}
    const auto c = choose_submit(submit_request::automatic, -1, true, 0, {6}, rtcore::cpu_set{6, 7}, &topo);
    EXPECT_EQ(c.mode, submit_mode::sqpoll);
    EXPECT_EQ(c.poller_cpu, 7);
    EXPECT_NE(c.why.find("SMT sibling of the dispatch CPU"), std::string::npos) << c.why;
}

TEST(submit_choice, without_a_spare_isolated_cpu_the_dispatch_thread_makes_the_system_call) {
    const auto topo = synthetic("package:1 core:2 pu:1");  // this VM: CPU 0 housekeeping, CPU 1 isolated
    const auto c = choose_submit(submit_request::automatic, -1, true, 0, {1}, rtcore::cpu_set{1}, &topo);
    EXPECT_EQ(c.mode, submit_mode::syscall);
    EXPECT_EQ(c.poller_cpu, -1);
    EXPECT_NE(c.why.find("no isolated CPU is free for a poller (isolated 1"), std::string::npos) << c.why;
}

TEST(submit_choice, every_qpu_gets_its_own_sibling_not_the_lowest_free_cpu) {
    const auto topo = synthetic("package:1 core:4 pu:2");
    // QPU 0 dispatches on 6, QPU 1 on 4: the lowest free CPU (5) is QPU 1's sibling.
    const std::vector<unsigned> dispatch = {6, 4};
    const rtcore::cpu_set isolated{4, 5, 6, 7};
    EXPECT_EQ(spare_poller_cpus(dispatch, isolated, &topo), (std::vector<int>{7, 5}));
    EXPECT_EQ(choose_submit(submit_request::automatic, -1, true, 0, dispatch, isolated, &topo).poller_cpu, 7);
    EXPECT_EQ(choose_submit(submit_request::automatic, -1, true, 1, dispatch, isolated, &topo).poller_cpu, 5);
}

TEST(submit_choice, a_spare_isolated_core_serves_one_qpu_and_the_next_falls_back_to_syscall) {
    const auto topo = synthetic("package:1 core:4 pu:1");
    const std::vector<unsigned> dispatch = {2, 3};
    const rtcore::cpu_set isolated{1, 2, 3};
    EXPECT_EQ(spare_poller_cpus(dispatch, isolated, &topo), (std::vector<int>{1, -1}));
    EXPECT_EQ(choose_submit(submit_request::automatic, -1, true, 0, dispatch, isolated, &topo).mode,
              submit_mode::sqpoll);
    EXPECT_EQ(choose_submit(submit_request::automatic, -1, true, 1, dispatch, isolated, &topo).mode,
              submit_mode::syscall);
}

TEST(submit_choice, no_dispatch_cpu_is_ever_given_to_a_poller) {
    const auto topo = synthetic("package:1 core:4 pu:1");
    const std::vector<unsigned> dispatch = {1, 2, 3};
    EXPECT_EQ(spare_poller_cpus(dispatch, rtcore::cpu_set{1, 2, 3}, &topo), (std::vector<int>{-1, -1, -1}));
    EXPECT_EQ(spare_poller_cpus(dispatch, rtcore::cpu_set{1, 2, 3}, nullptr), (std::vector<int>{-1, -1, -1}));
}

TEST(submit_choice, an_explicit_mode_or_poller_cpu_and_untuned_dispatch_are_obeyed) {
    const auto topo = synthetic("package:1 core:4 pu:2");
    const rtcore::cpu_set isolated{6, 7};
    const auto sys = choose_submit(submit_request::syscall, -1, true, 0, {6}, isolated, &topo);
    EXPECT_EQ(sys.mode, submit_mode::syscall) << "a spare CPU does not override submit_mode = \"syscall\"";
    const auto sq = choose_submit(submit_request::sqpoll, -1, true, 0, {6}, isolated, &topo);
    EXPECT_EQ(sq.mode, submit_mode::sqpoll);
    EXPECT_EQ(sq.poller_cpu, -1) << "submit_mode = \"sqpoll\" keeps its meaning: poller on the dispatch CPU";
    const auto placed = choose_submit(submit_request::automatic, 3, true, 0, {6}, isolated, &topo);
    EXPECT_EQ(placed.mode, submit_mode::sqpoll);
    EXPECT_EQ(placed.poller_cpu, 3);
    EXPECT_EQ(choose_submit(submit_request::automatic, -1, false, 0, {6}, isolated, &topo).mode,
              submit_mode::syscall);
}

TEST(submit_choice, a_qpu_without_a_dispatch_cpu_makes_the_system_call) {
    const std::vector<unsigned> dispatch = {rtcore::cpu_set::max_cpus};
    EXPECT_EQ(spare_poller_cpus(dispatch, rtcore::cpu_set{1, 2}, nullptr), (std::vector<int>{-1}));
    EXPECT_EQ(choose_submit(submit_request::automatic, -1, true, 0, dispatch, rtcore::cpu_set{1, 2}, nullptr).mode,
              submit_mode::syscall);
    EXPECT_EQ(choose_submit(submit_request::automatic, -1, true, 3, {1}, rtcore::cpu_set{1, 2}, nullptr).mode,
              submit_mode::syscall);
}

}  // namespace
