#include <gtest/gtest.h>

#include <cerrno>

#include "rtcore/isolation.hpp"
#include "tree_fixture.hpp"

using namespace qrt_test;
using rtcore::cpu_set;
using rtcore::isolation_method;
using rtcore::restore_journal;

TEST(isolation, finds_cgroup_mounts_from_proc_mounts) {
    tree_copy a("vm2-v1");
    auto m = rtcore::find_cgroup_mounts(rtcore::host_fs(a.root()));
    EXPECT_EQ(m.v2_root, "/sys/fs/cgroup/unified");
    EXPECT_EQ(m.v1_cpuset_root, "/sys/fs/cgroup/cpuset");
    tree_copy b("host4-nocg");
    m = rtcore::find_cgroup_mounts(rtcore::host_fs(b.root()));
    EXPECT_EQ(m.v2_root, "");
    EXPECT_EQ(m.v1_cpuset_root, "");
}

TEST(isolation, cgroup_v2_partition_when_cpuset_is_in_the_v2_hierarchy) {
    tree_copy t("host8-v2");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(8));
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    auto r = rtcore::apply_isolation(fs, tasks, *j, {4, 5, 6, 7}, {0, 1, 2, 3}, {});
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(r->method, isolation_method::cgroup_v2_partition);
    EXPECT_TRUE(r->not_used.empty());
    EXPECT_EQ(r->isolated_cgroup, "/sys/fs/cgroup/qrt-isolated");
    EXPECT_EQ(read_file(t.root() / "sys/fs/cgroup/qrt-isolated/cpuset.cpus"), "4-7");
    EXPECT_EQ(read_file(t.root() / "sys/fs/cgroup/qrt-isolated/cpuset.cpus.partition"), "isolated");
    EXPECT_EQ(tasks.set_affinity_calls(), 0U) << "the partition needs no per-task changes";
}

TEST(isolation, an_invalid_v2_partition_is_unwound_and_the_next_method_used) {
    tree_copy t("host8-v2");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(8));
    const auto before = snapshot(t.root());
    // The kernel refuses the partition (a sibling claims the CPUs).
    fs.inject_write_error("/sys/fs/cgroup/qrt-isolated/cpuset.cpus.partition", EINVAL);
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    auto r = rtcore::apply_isolation(fs, tasks, *j, {4, 5, 6, 7}, {0, 1, 2, 3}, {});
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(r->method, isolation_method::affinity_fence);
    ASSERT_EQ(r->not_used.size(), 2U);
    EXPECT_EQ(r->not_used[0],
              "cgroup-v2-partition: tried and unwound: write /sys/fs/cgroup/qrt-isolated/cpuset.cpus.partition: "
              "Invalid argument");
    EXPECT_EQ(r->not_used[1], "cgroup-v1-cpuset: no cgroup v1 cpuset hierarchy is mounted");
    EXPECT_FALSE(fs::exists(t.root() / "sys/fs/cgroup/qrt-isolated"));
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
}

TEST(isolation, cgroup_v1_cpuset_on_this_vm_falls_through_v2_and_moves_movable_tasks) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    auto r = rtcore::apply_isolation(fs, tasks, *j, {1}, {0}, {});
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(r->method, isolation_method::cgroup_v1_cpuset);
    ASSERT_EQ(r->not_used.size(), 1U);
    EXPECT_EQ(r->not_used[0],
              "cgroup-v2-partition: cgroup2 is mounted at /sys/fs/cgroup/unified but the cpuset controller is not "
              "in its cgroup.controllers (it is bound to a v1 hierarchy, or the kernel lacks it)");
    const auto cs = t.root() / "sys/fs/cgroup/cpuset";
    EXPECT_EQ(read_file(cs / "qrt-isolated/cpuset.cpus"), "1");
    EXPECT_EQ(read_file(cs / "qrt-isolated/cpuset.mems"), "0");
    EXPECT_EQ(read_file(cs / "qrt-isolated/cpuset.cpu_exclusive"), "1");
    EXPECT_EQ(read_file(cs / "qrt-housekeeping/cpuset.cpus"), "0");
    EXPECT_EQ(read_file(cs / "cpuset.sched_load_balance"), "0");
    EXPECT_EQ(r->tasks_moved, 5U);
    EXPECT_EQ(r->tasks_refused, 2U);  // ksoftirqd/1, migration/1
    EXPECT_EQ(tasks.tasks().at(400).cgroup, "/sys/fs/cgroup/cpuset/qrt-housekeeping");
    EXPECT_EQ(tasks.tasks().at(401).affinity, cpu_set{0}) << "the cpuset moved the pinned app off CPU 1";
    EXPECT_EQ(tasks.tasks().at(19).cgroup, v1_root);
    EXPECT_EQ(r->isolated_cgroup, "/sys/fs/cgroup/cpuset/qrt-isolated");
}

TEST(isolation, affinity_fence_when_no_cpuset_exists) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(4));
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    auto r = rtcore::apply_isolation(fs, tasks, *j, {2, 3}, {0, 1}, {});
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(r->method, isolation_method::affinity_fence);
    ASSERT_EQ(r->not_used.size(), 2U);
    EXPECT_EQ(r->not_used[0], "cgroup-v2-partition: no cgroup2 hierarchy is mounted");
    EXPECT_EQ(tasks.tasks().at(1).affinity, (cpu_set{0, 1}));
    EXPECT_EQ(tasks.tasks().at(501).affinity, (cpu_set{0, 1})) << "a task only on isolated CPUs goes to housekeeping";
    EXPECT_EQ(tasks.tasks().at(502).affinity, cpu_set{0}) << "a task already off them is untouched";
    EXPECT_EQ(tasks.tasks().at(30).affinity, cpu_set{3}) << "a per-CPU kernel thread cannot move";
    EXPECT_EQ(r->tasks_moved, 4U);  // systemd, kthreadd, postgres, pinned-app
    EXPECT_EQ(r->tasks_refused, 1U);
}

TEST(isolation, a_forced_method_that_is_unavailable_is_an_error) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    rtcore::isolation_options o;
    o.force = isolation_method::cgroup_v2_partition;
    auto r = rtcore::apply_isolation(fs, tasks, *j, {1}, {0}, o);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, ENOTSUP);
    EXPECT_NE(r.err().message.find("isolation cgroup-v2-partition was asked for but cgroup2 is mounted at"),
              std::string::npos)
        << r.err().message;
}

TEST(isolation, verify_v1_moves_tasks_that_appeared_in_the_root) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    ASSERT_TRUE(rtcore::apply_isolation(fs, tasks, *j, {1}, {0}, {}));
    tasks.add_task(900, "late-daemon", {0, 1}, v1_root);
    auto v = rtcore::verify_isolation(fs, tasks, *j, {1}, {0}, isolation_method::cgroup_v1_cpuset, {});
    ASSERT_TRUE(v) << v.err().message;
    EXPECT_EQ(v->tasks_moved, 1U);
    EXPECT_TRUE(v->drift);
    EXPECT_EQ(tasks.tasks().at(900).cgroup, "/sys/fs/cgroup/cpuset/qrt-housekeeping");
    EXPECT_TRUE(j->has_task(900));
}

TEST(isolation, verify_fence_refences_a_task_that_moved_itself_back) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(4));
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    ASSERT_TRUE(rtcore::apply_isolation(fs, tasks, *j, {2, 3}, {0, 1}, {}));
    ASSERT_TRUE(tasks.set_affinity(500, {0, 1, 2, 3}));
    auto v = rtcore::verify_isolation(fs, tasks, *j, {2, 3}, {0, 1}, isolation_method::affinity_fence, {});
    ASSERT_TRUE(v);
    EXPECT_EQ(v->tasks_moved, 1U);
    EXPECT_EQ(tasks.tasks().at(500).affinity, (cpu_set{0, 1}));
}

// On a fence host the dispatch threads reach their CPU by
// pinning themselves, and the drift watch (verify --repin, the root
// helper) used to move them off it like any other task.  The sweep leaves
// exactly the daemon's own dispatch threads, each alone on its planned CPU,
// and fences everything else, look-alikes included.
TEST(isolation, verify_fence_leaves_the_daemons_dispatch_threads_on_their_planned_cpus) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(4));
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    ASSERT_TRUE(rtcore::apply_isolation(fs, tasks, *j, {2, 3}, {0, 1}, {}));
    constexpr pid_t daemon = 800;
    constexpr uid_t qrtd_uid = 999;
    const auto thread_of = [&](pid_t tid, const char* comm, cpu_set aff, pid_t tgid, uid_t uid) {
        tasks.add_task(tid, comm, aff, "");
        tasks.set_owner(tid, tgid, uid);
    };
    thread_of(daemon, "qrtd", {0, 1}, daemon, qrtd_uid);
    thread_of(801, "qrt-dispatch", {2}, daemon, qrtd_uid);     // QPU 0's thread, pinned to CPU 2
    thread_of(802, "qrt-dispatch", {3}, daemon, qrtd_uid);     // QPU 1's, on CPU 3
    thread_of(803, "qrt-dispatch", {2}, daemon, qrtd_uid);     // a second one on CPU 2: not planned
    thread_of(804, "qrtd-loop", {2}, daemon, qrtd_uid);        // another thread of the daemon
    thread_of(805, "qrt-dispatch", {2, 3}, daemon, qrtd_uid);  // not pinned to one CPU
    thread_of(900, "qrt-dispatch", {3}, 900, 1000);            // another user's look-alike
    thread_of(901, "qrt-dispatch", {3}, 901, qrtd_uid);        // agent.user, another process

    rtcore::isolation_options o;
    o.own_rt.cpus = {2, 3};
    o.own_rt.uid = qrtd_uid;
    o.own_rt.process = daemon;
    for (int round = 0; round < 2; ++round) {  // the re-pin timer fires again and again
        auto v = rtcore::verify_isolation(fs, tasks, *j, {2, 3}, {0, 1}, isolation_method::affinity_fence, o);
        ASSERT_TRUE(v) << v.err().message;
        EXPECT_EQ(tasks.tasks().at(801).affinity, cpu_set{2}) << "round " << round;
        EXPECT_EQ(tasks.tasks().at(802).affinity, cpu_set{3}) << "round " << round;
        ASSERT_EQ(v->rt_threads_left.size(), 2U) << "round " << round;
        EXPECT_EQ(v->rt_threads_left[0], "tid 801 on CPU 2");
        EXPECT_EQ(v->rt_threads_left[1], "tid 802 on CPU 3");
        if (round == 0) {
            EXPECT_EQ(v->tasks_moved, 5U);  // 803, 804, 805, 900, 901
            EXPECT_TRUE(v->drift);
        } else {
            EXPECT_EQ(v->tasks_moved, 0U) << "nothing drifted since the last run";
            EXPECT_FALSE(v->drift) << "the dispatch threads on their CPUs are not drift";
        }
    }
    for (pid_t moved : {803, 804, 805, 900, 901}) {
        EXPECT_FALSE(tasks.tasks().at(moved).affinity.intersects({2, 3})) << "tid " << moved;
    }
    EXPECT_FALSE(j->has_task(801)) << "a thread left alone is not journaled";

    // Known only by uid (the re-pin timer does not know the daemon's pid):
    // 901 (agent.user, pinned to CPU 3 again) may take CPU 3's place only
    // when 802 is not there first; either way one thread a CPU.
    rtcore::isolation_options by_uid;
    by_uid.own_rt.cpus = {2, 3};
    by_uid.own_rt.uid = qrtd_uid;
    ASSERT_TRUE(tasks.set_affinity(900, {3}));
    auto v = rtcore::verify_isolation(fs, tasks, *j, {2, 3}, {0, 1}, isolation_method::affinity_fence, by_uid);
    ASSERT_TRUE(v) << v.err().message;
    EXPECT_EQ(tasks.tasks().at(802).affinity, cpu_set{3});
    EXPECT_FALSE(tasks.tasks().at(900).affinity.intersects({2, 3})) << "another uid is never exempt";

    // Without an exemption (untuned, or an older caller) every task is fenced.
    auto plain = rtcore::verify_isolation(fs, tasks, *j, {2, 3}, {0, 1}, isolation_method::affinity_fence, {});
    ASSERT_TRUE(plain);
    EXPECT_EQ(tasks.tasks().at(801).affinity, (cpu_set{0, 1}));
}

// On a fence host every verify (the repin timer) journals
// each new thread that touches an isolated CPU, and any local user can make
// threads.  200,000 short-lived threads before each of ten verifies took the
// journal past the 64 MiB load reads, and restore, repin and apply then
// refused it.  Records of threads that exited are dropped, the journal stays
// the size of one round, and restore puts back the thread still running.
//
// The bound checked is the journal's size after each verify against the
// first's: a journal that kept the exited threads' records would reach ten
// times its first round by the tenth.  That needs each round to take the
// journal past the compaction size (1 MiB), asserted below, and no more:
// 50,000 threads a round is four times that.  (200,000 a round, as the
// report had it, took 30-90 s here and timed out under a busy neighbour;
// the bound proves the same thing with a quarter.)
TEST(isolation, fence_verifies_of_many_short_lived_threads_keep_the_journal_bounded_and_restorable) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    const auto all = cpu_set::first_n(4);
    add_plain_tasks(tasks, all);
    auto applied = apply_in(t, fs, tasks, {2, 3}, {0, 1});
    ASSERT_TRUE(applied) << applied.err().message;
    constexpr pid_t per_round = 50000;
    constexpr int rounds = 10;
    std::uintmax_t first_round = 0;
    std::uintmax_t largest = 0;
    for (int round = 0; round < rounds; ++round) {
        const pid_t first = 10000 + round * per_round;
        for (pid_t tid = first; tid < first + per_round; ++tid) {
            tasks.add_task(tid, "worker", all, "");
        }
        auto v = verify_in(t, fs, tasks);
        ASSERT_TRUE(v) << "verify " << round + 1 << ": " << v.err().message;
        EXPECT_EQ(v->isolation.tasks_moved, static_cast<std::size_t>(per_round)) << "verify " << round + 1;
        EXPECT_EQ(tasks.tasks().at(first).affinity, (cpu_set{0, 1}));
        for (pid_t tid = first; tid < first + per_round; ++tid) {
            tasks.remove_task(tid);
        }
        const auto size = std::filesystem::file_size(t.journal());
        if (round == 0) {
            first_round = size;
            ASSERT_GT(first_round, rtcore::journal_compact_bytes)
                << "one round of " << per_round << " threads must take the journal past the compaction size, "
                << "or no verify has anything to drop and the bound below proves nothing";
        }
        largest = std::max(largest, size);
        ASSERT_LE(size, rtcore::journal_max_bytes) << "verify " << round + 1;
    }
    EXPECT_LT(largest, first_round + first_round / 2)
        << "the journal grew with every verify: " << largest << " bytes after " << rounds << " of "
        << first_round;
    // A running thread that moved itself back, fenced again by the last verify.
    ASSERT_TRUE(tasks.set_affinity(500, all));
    ASSERT_TRUE(verify_in(t, fs, tasks));
    auto r = restore_in(t, fs, tasks);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_TRUE(r->complete) << r->summary();
    EXPECT_EQ(tasks.tasks().at(500).affinity, all);
    EXPECT_EQ(tasks.tasks().at(1).affinity, all);
    EXPECT_FALSE(std::filesystem::exists(t.journal()));
}
