// How the dispatch threads reach their isolated CPU under systemd, on fake cgroup
// v1 and v2 trees.  The kernel rules these trees stand for (Linux 6.1):
//   v2: a partition takes its CPUs from every other cgroup; its parent must
//       be a partition root; a thread moves only inside its process's
//       threaded subtree.  So the daemon's threads (under systemd in
//       /system.slice/qrtd.service) can never enter the qrt-isolated
//       partition: the fence is used, and every message says why.
//   v1: a thread joins a cpuset by writing its TID into its tasks file; the
//       kernel then sets its allowed CPUs to the cpuset's.  The root helper
//       hands that file, and only it, to the daemon's user.
// Each case checks the methods chosen, the operator messages in order, what
// was written, and that restore leaves the tree byte for byte as before.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rtcore/isolation.hpp"
#include "tree_fixture.hpp"

using namespace qrt_test;
using rtcore::cpu_set;
using rtcore::isolation_method;

namespace {

constexpr const char* service_cgroup = "/system.slice/qrtd.service";

// host8-v2 as a Debian 12 guest runs the unit: the daemon's cgroup exists
// and /proc/self/cgroup names it.
void as_systemd_service(const tree_copy& t) {
    fs::create_directories(t.root() / "sys/fs/cgroup/system.slice/qrtd.service");
    write_file(t.root() / "sys/fs/cgroup/system.slice/qrtd.service/cgroup.procs", "");
    write_file(t.root() / "proc/self/cgroup", std::string("0::") + service_cgroup + "\n");
}

rtcore::host_partition::apply_options rt_opts(const rtcore::host_fs& fs) {
    rtcore::host_partition::apply_options o;
    o.isolation.rt_threads = true;
    o.isolation.rt_cgroup = rtcore::v2_cgroup_of(fs.read("/proc/self/cgroup").value());
    return o;
}

const std::string v2_reason =
    "cgroup-v2-partition: the dispatch threads could not run in it: a partition takes its CPUs from every other "
    "cgroup, a thread may join only a cgroup of its own process's threaded subtree (cgroup "
    "/system.slice/qrtd.service), and a partition's parent must be a partition root owning its CPUs exclusively, so "
    "every ancestor would take the housekeeping CPUs from the rest of the system (remote partitions, "
    "cpuset.cpus.exclusive, need Linux 6.7)";

const std::string fence_reach =
    "isolation: dispatch threads: each pins itself to its CPU with sched_setaffinity (the fence leaves the isolated "
    "CPUs in every cpuset and moves every movable task off them)";

std::vector<std::string> isolation_lines(const std::vector<std::string>& lines) {
    std::vector<std::string> out;
    for (const auto& l : lines) {
        if (l.rfind("isolation: ", 0) == 0) {
            out.push_back(l);
        }
    }
    return out;
}

}  // namespace

TEST(rt_placement, the_v2_cgroup_is_read_from_proc_self_cgroup) {
    EXPECT_EQ(rtcore::v2_cgroup_of("0::/system.slice/qrtd.service\n"), "/system.slice/qrtd.service");
    EXPECT_EQ(rtcore::v2_cgroup_of("12:cpuset:/\n3:memory:/x\n0::/user.slice/session-1.scope\n"),
              "/user.slice/session-1.scope");
    EXPECT_EQ(rtcore::v2_cgroup_of("3:cpuset:/\n"), "") << "pure v1: no v2 cgroup";
}

TEST(rt_placement, a_v2_host_running_the_unit_gets_the_fence_and_every_message_says_why) {
    tree_copy t("host8-v2");
    as_systemd_service(t);
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(8));
    const auto before = snapshot(t.root());
    const auto tasks_before = task_states(tasks);

    auto rep = apply_in(t, fs, tasks, {4, 5, 6, 7}, {0, 1, 2, 3}, rt_opts(fs));
    ASSERT_TRUE(rep) << rep.err().message;
    EXPECT_EQ(rep->isolation.method, isolation_method::affinity_fence);
    ASSERT_EQ(rep->isolation.not_used.size(), 2U);
    EXPECT_EQ(rep->isolation.not_used[0], v2_reason);
    EXPECT_EQ(rep->isolation.not_used[1], "cgroup-v1-cpuset: no cgroup v1 cpuset hierarchy is mounted");
    EXPECT_EQ(isolation_lines(rep->lines),
              (std::vector<std::string>{
                  "isolation: not used: " + v2_reason,
                  "isolation: not used: cgroup-v1-cpuset: no cgroup v1 cpuset hierarchy is mounted",
                  "isolation: fenced 3 tasks off CPUs 4-7, 0 kernel threads refused, 0 exited meanwhile",
                  "isolation: the fence is advisory: a task that sets its own affinity later can reach the isolated "
                  "CPUs again (verify re-fences it)",
                  "isolation: using affinity-fence for CPUs 4-7",
                  fence_reach,
              }));
    // Nothing in the cgroup tree was written: no partition, no subtree_control.
    EXPECT_FALSE(fs::exists(t.root() / "sys/fs/cgroup/qrt-isolated"));
    EXPECT_EQ(read_file(t.root() / "sys/fs/cgroup/cgroup.subtree_control"),
              before.at("sys/fs/cgroup/cgroup.subtree_control"));
    EXPECT_EQ(tasks.tasks().at(500).affinity, (cpu_set{0, 1, 2, 3}));
    // The dispatch thread may pin itself: CPU 4 is still in its cpuset.
    const auto reach = rtcore::rt_reach_for(fs, rep->isolation.method, rt_opts(fs).isolation);
    EXPECT_TRUE(reach.reachable);
    EXPECT_EQ(reach.tasks_file, "");

    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_TRUE(back->complete) << back->summary();
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_EQ(task_states(tasks), tasks_before);
}

TEST(rt_placement, without_rt_threads_the_v2_partition_is_still_the_first_choice) {
    tree_copy t("host8-v2");
    as_systemd_service(t);
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(8));
    rtcore::host_partition::apply_options o;  // dispatch.mode = "untuned", or no [[qpu]]
    auto rep = apply_in(t, fs, tasks, {4, 5, 6, 7}, {0, 1, 2, 3}, o);
    ASSERT_TRUE(rep) << rep.err().message;
    EXPECT_EQ(rep->isolation.method, isolation_method::cgroup_v2_partition);
}

TEST(rt_placement, a_forced_v2_partition_is_applied_but_says_the_dispatch_threads_cannot_reach_it) {
    tree_copy t("host8-v2");
    as_systemd_service(t);
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(8));
    const auto before = snapshot(t.root());
    auto o = rt_opts(fs);
    o.isolation.force = isolation_method::cgroup_v2_partition;
    auto rep = apply_in(t, fs, tasks, {4, 5, 6, 7}, {0, 1, 2, 3}, o);
    ASSERT_TRUE(rep) << rep.err().message;
    EXPECT_EQ(rep->isolation.method, isolation_method::cgroup_v2_partition);
    const auto lines = isolation_lines(rep->lines);
    ASSERT_FALSE(lines.empty());
    EXPECT_EQ(lines.back(),
              "isolation: dispatch threads: cannot reach the isolated CPUs: " +
                  v2_reason.substr(std::string("cgroup-v2-partition: ").size()) +
                  "; use host.isolation = \"auto\" (the fence) or \"fence\"");
    EXPECT_FALSE(rtcore::rt_reach_for(fs, isolation_method::cgroup_v2_partition, o.isolation).reachable);
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
}

TEST(rt_placement, a_kernel_with_remote_partitions_is_named_as_such) {
    tree_copy t("host8-v2");
    as_systemd_service(t);
    // Linux >= 6.7: every non-root cpuset cgroup has cpuset.cpus.exclusive.
    write_file(t.root() / "sys/fs/cgroup/system.slice/qrtd.service/cpuset.cpus.exclusive", "\n");
    rtcore::host_fs fs(t.root());
    const auto plan = rtcore::preview_isolation(fs, nullptr, rt_opts(fs).isolation);
    EXPECT_EQ(plan.method, isolation_method::affinity_fence);
    ASSERT_FALSE(plan.not_used.empty());
    EXPECT_NE(plan.not_used[0].find("(this kernel has remote partitions, cpuset.cpus.exclusive, but qrtd does not "
                                    "build them yet)"),
              std::string::npos)
        << plan.not_used[0];
}

TEST(rt_placement, host_plan_previews_the_method_and_the_placement_without_writing) {
    tree_copy t("host8-v2");
    as_systemd_service(t);
    const auto before = snapshot(t.root());
    rtcore::host_fs fs(t.root(), rtcore::host_fs::mode::dry_run);
    const auto plan = rtcore::preview_isolation(fs, nullptr, rt_opts(fs).isolation);
    EXPECT_EQ(plan.method, isolation_method::affinity_fence);
    EXPECT_EQ(plan.lines,
              (std::vector<std::string>{
                  "isolation: not used: " + v2_reason,
                  "isolation: not used: cgroup-v1-cpuset: no cgroup v1 cpuset hierarchy is mounted",
                  "isolation: apply will use affinity-fence (unless the kernel refuses a write; then the next "
                  "method, and apply says why)",
                  fence_reach,
              }));
    EXPECT_TRUE(fs.planned_writes().empty());
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");

    tree_copy v1("vm2-v1");
    rtcore::host_fs fs1(v1.root(), rtcore::host_fs::mode::dry_run);
    rtcore::isolation_options o1;
    o1.rt_threads = true;
    const auto plan1 = rtcore::preview_isolation(fs1, nullptr, o1);
    EXPECT_EQ(plan1.method, isolation_method::cgroup_v1_cpuset);
    ASSERT_EQ(plan1.lines.size(), 3U);
    EXPECT_EQ(plan1.lines[2],
              "isolation: dispatch threads: each writes its TID into /sys/fs/cgroup/cpuset/qrt-isolated/tasks "
              "(handed to the daemon's user by the root helper), then pins itself to its CPU");
}

TEST(rt_placement, a_v1_host_hands_only_the_isolated_tasks_file_and_the_thread_joins_it) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    // The daemon's dispatch thread, started on the housekeeping CPUs.
    tasks.add_task(777, "qrtd-dispatch", {0, 1}, v1_root);
    const auto before = snapshot(t.root());

    rtcore::host_partition::apply_options o;
    o.isolation.rt_threads = true;
    auto rep = apply_in(t, fs, tasks, {1}, {0}, o);
    ASSERT_TRUE(rep) << rep.err().message;
    ASSERT_EQ(rep->isolation.method, isolation_method::cgroup_v1_cpuset);
    const auto lines = isolation_lines(rep->lines);
    ASSERT_GE(lines.size(), 2U);
    EXPECT_EQ(lines[lines.size() - 2], "isolation: using cgroup-v1-cpuset for CPUs 1");
    EXPECT_EQ(lines.back(),
              "isolation: dispatch threads: each writes its TID into /sys/fs/cgroup/cpuset/qrt-isolated/tasks "
              "(handed to the daemon's user by the root helper), then pins itself to its CPU");
    // The sweep moved the daemon's thread to housekeeping, like every task.
    EXPECT_EQ(tasks.tasks().at(777).affinity, cpu_set{0});

    // The root helper hands exactly one file to agent.user.
    std::vector<std::string> out;
    ASSERT_TRUE(rtcore::delegate_rt_cgroup(fs, rep->isolation, ::getuid(), ::getgid(), "tester", out));
    ASSERT_EQ(out.size(), 1U);
    EXPECT_EQ(out[0], "isolation: handed /sys/fs/cgroup/cpuset/qrt-isolated/tasks to tester (uid " +
                          std::to_string(::getuid()) + ", gid " + std::to_string(::getgid()) +
                          "): its dispatch threads join the isolated cpuset themselves");

    // The dispatch thread writes its TID: the kernel gives it the cpuset's CPUs.
    const auto reach = rtcore::rt_reach_for(fs, rep->isolation.method, o.isolation);
    ASSERT_TRUE(reach.reachable);
    EXPECT_EQ(reach.tasks_file, "/sys/fs/cgroup/cpuset/qrt-isolated/tasks");
    ASSERT_TRUE(tasks.attach(fs, "/sys/fs/cgroup/cpuset/qrt-isolated", 777));
    EXPECT_EQ(tasks.tasks().at(777).affinity, cpu_set{1}) << "CPU 1 is now in its allowed set: it can pin there";
    EXPECT_EQ(read_file(t.root() / "sys/fs/cgroup/cpuset/qrt-isolated/cpuset.sched_load_balance"), "0");

    // Restore (the daemon still running: the thread is moved back to the
    // root cpuset) leaves the tree byte for byte as it was.
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_TRUE(back->complete) << back->summary();
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_EQ(tasks.tasks().at(777).cgroup, v1_root);
}

TEST(rt_placement, delegation_is_nothing_for_the_fence_and_a_dry_run_only_says_it) {
    rtcore::isolation_report fence;
    fence.method = isolation_method::affinity_fence;
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root(), rtcore::host_fs::mode::dry_run);
    std::vector<std::string> out;
    ASSERT_TRUE(rtcore::delegate_rt_cgroup(fs, fence, 998, 997, "qrtd", out));
    EXPECT_TRUE(out.empty());
    rtcore::isolation_report v1;
    v1.method = isolation_method::cgroup_v1_cpuset;
    v1.isolated_cgroup = "/sys/fs/cgroup/cpuset/qrt-isolated";
    ASSERT_TRUE(rtcore::delegate_rt_cgroup(fs, v1, 998, 997, "qrtd", out));
    EXPECT_EQ(out, (std::vector<std::string>{
                       "isolation: would hand /sys/fs/cgroup/cpuset/qrt-isolated/tasks to qrtd (uid 998, gid 997)"}));
}

// The writes apply makes, in order (dry run), with the dispatch threads to
// place: on v2 not one cgroup file (no partition, no subtree_control); on v1
// the two cpusets, then the root's load balancing off.
TEST(rt_placement, the_cgroup_writes_in_order_on_v1_and_none_on_v2) {
    auto cgroup_writes = [](const std::vector<rtcore::host_fs::planned_write>& w) {
        std::vector<std::string> out;
        for (const auto& x : w) {
            if (x.path.rfind("/sys/fs/cgroup", 0) == 0) {
                out.push_back(x.path + " = " + x.data);
            }
        }
        return out;
    };
    tree_copy v2("host8-v2");
    as_systemd_service(v2);
    rtcore::host_fs fs2(v2.root(), rtcore::host_fs::mode::dry_run);
    rtcore::fake_task_ops t2;
    add_plain_tasks(t2, cpu_set::first_n(8));
    auto r2 = rtcore::host_partition::apply(fs2, t2, nullptr, {4, 5, 6, 7}, {0, 1, 2, 3}, rt_opts(fs2));
    ASSERT_TRUE(r2) << r2.err().message;
    EXPECT_EQ(r2->isolation.method, isolation_method::affinity_fence);
    EXPECT_EQ(cgroup_writes(r2->planned_writes), std::vector<std::string>{});

    tree_copy v1("vm2-v1");
    rtcore::host_fs fs1(v1.root(), rtcore::host_fs::mode::dry_run);
    rtcore::fake_task_ops t1;
    add_vm2_tasks(t1);
    rtcore::host_partition::apply_options o;
    o.isolation.rt_threads = true;
    auto r1 = rtcore::host_partition::apply(fs1, t1, nullptr, {1}, {0}, o);
    ASSERT_TRUE(r1) << r1.err().message;
    const auto w = cgroup_writes(r1->planned_writes);
    const std::string hk = "/sys/fs/cgroup/cpuset/qrt-housekeeping/";
    const std::string iso = "/sys/fs/cgroup/cpuset/qrt-isolated/";
    ASSERT_GE(w.size(), 9U);
    EXPECT_EQ(std::vector<std::string>(w.begin(), w.begin() + 8),
              (std::vector<std::string>{"/sys/fs/cgroup/cpuset/qrt-housekeeping = <mkdir>", hk + "cpuset.cpus = 0",
                                        hk + "cpuset.mems = 0", "/sys/fs/cgroup/cpuset/qrt-isolated = <mkdir>",
                                        iso + "cpuset.cpus = 1", iso + "cpuset.mems = 0",
                                        iso + "cpuset.cpu_exclusive = 1", iso + "cpuset.sched_load_balance = 0"}));
    EXPECT_EQ(w[8], hk + "tasks = 1") << "then the sweep moves every movable task to housekeeping";
    EXPECT_EQ(w.back(), "/sys/fs/cgroup/cpuset/cpuset.sched_load_balance = 0");
}
