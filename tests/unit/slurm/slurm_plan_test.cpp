// `qrtd host plan --slurm` (agent/src/daemon/slurm_plan.cpp) on synthetic
// topologies: the lines that keep Slurm off the isolated CPUs, in Slurm's
// CPU numbering.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "qrt/slurm_plan.hpp"

namespace {

qrt::config two_qpus() {
    qrt::config c;
    c.rpc.socket_path = "/run/qrtd/qrtd.sock";
    c.qpus.resize(2);
    c.qpus[0].name = "qpu0";
    c.qpus[1].name = "qpu1";
    return c;
}

rtcore::partition_plan isolating(const char* list) {
    rtcore::partition_plan p;
    p.isolated = *rtcore::cpu_set::parse_list(list);
    return p;
}

bool has(const std::vector<std::string>& lines, const std::string& want) {
    return std::find(lines.begin(), lines.end(), want) != lines.end();
}

TEST(slurm_plan, a_two_core_vm_reserves_its_isolated_cpu_and_offers_two_qpus) {
    auto topo = rtcore::topology::from_synthetic("package:1 core:2 pu:1");
    ASSERT_TRUE(topo) << topo.err().message;
    qrt::slurm_plan_options o;
    o.node_name = "vm";
    const auto p = qrt::plan_slurm(*topo, isolating("1"), two_qpus(), o);
    EXPECT_EQ(p.isolated_abstract_cpus, "1");
    EXPECT_TRUE(has(p.slurm_conf, "NodeName=vm CPUs=2 Sockets=1 CoresPerSocket=2 "
                                  "ThreadsPerCore=1 CpuSpecList=1 Gres=qpu:2 State=UNKNOWN"));
    EXPECT_TRUE(has(p.slurm_conf, "TaskPlugin=task/affinity,task/cgroup"));
    EXPECT_TRUE(has(p.slurm_conf, "TaskPluginParam=SlurmdOffSpec"));
    EXPECT_TRUE(has(p.slurm_conf, "GresTypes=qpu"));
    EXPECT_TRUE(has(p.cgroup_conf, "ConstrainCores=yes"));
    EXPECT_TRUE(has(p.gres_conf, "NodeName=vm Name=qpu Count=2"));
    ASSERT_EQ(p.plugstack_conf.size(), 1U);
    EXPECT_EQ(p.plugstack_conf[0], "required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_qrt.so");
    const std::string text = qrt::format_slurm_plan(p);
    EXPECT_NE(text.find("# ---- gres.conf ----\nNodeName=vm Name=qpu Count=2\n"), std::string::npos)
        << text;
}

TEST(slurm_plan, interleaved_smt_siblings_are_renumbered_the_way_slurm_counts) {
    // Kernel numbering cpu N and N+4 on one core (a common BIOS order):
    // Slurm counts the two threads of a core together, so the last core
    // (kernel CPUs 3 and 7) is abstract CPUs 6-7.
    auto topo = rtcore::topology::from_synthetic("package:1 core:4 pu:2(indexes=0,4,1,5,2,6,3,7)");
    ASSERT_TRUE(topo) << topo.err().message;
    ASSERT_TRUE(topo->core_of(7) != nullptr);
    ASSERT_EQ(topo->core_of(7)->cpus.to_list(), "3,7");
    qrt::slurm_plan_options o;
    o.node_name = "n1";
    const auto p = qrt::plan_slurm(*topo, isolating("3,7"), two_qpus(), o);
    EXPECT_EQ(p.isolated_os_cpus, "3,7");
    EXPECT_EQ(p.isolated_abstract_cpus, "6-7");
    EXPECT_TRUE(has(p.slurm_conf, "NodeName=n1 CPUs=8 Sockets=1 CoresPerSocket=4 "
                                  "ThreadsPerCore=2 CpuSpecList=6-7 Gres=qpu:2 State=UNKNOWN"));
}

TEST(slurm_plan, a_socket_elsewhere_is_passed_to_the_plugin_and_no_isolation_is_said) {
    auto topo = rtcore::topology::from_synthetic("package:2 core:2 pu:1");
    ASSERT_TRUE(topo);
    auto cfg = two_qpus();
    cfg.rpc.socket_path = "/run/lab/qrtd.sock";
    cfg.qpus.clear();
    const auto p = qrt::plan_slurm(*topo, isolating(""), cfg, {});
    EXPECT_EQ(p.plugstack_conf[0],
              "required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_qrt.so socket=/run/lab/qrtd.sock");
    EXPECT_TRUE(p.gres_conf.empty());
    EXPECT_TRUE(has(p.slurm_conf, "NodeName=NODE CPUs=4 Sockets=2 CoresPerSocket=2 "
                                  "ThreadsPerCore=1 State=UNKNOWN"));
    const std::string notes = qrt::format_slurm_plan(p);
    EXPECT_NE(notes.find("isolates no CPU"), std::string::npos) << notes;
    EXPECT_NE(notes.find("host.isolation = \"fence\""), std::string::npos) << notes;
    cfg.host.isolation = qrt::isolation_mode::fence;
    const auto fenced = qrt::format_slurm_plan(qrt::plan_slurm(*topo, isolating(""), cfg, {}));
    EXPECT_EQ(fenced.find("host.isolation"), std::string::npos) << fenced;
}

}  // namespace
