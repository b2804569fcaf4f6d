// The task-move helper the affinity fence and the knobs' kernel-thread
// sweep share (rtcore/task_move.hpp): where a task goes, what the journal
// must hold first, and what became of the move.

#include <gtest/gtest.h>

#include <cerrno>

#include "rtcore/task_move.hpp"
#include "tree_fixture.hpp"

using namespace qrt_test;
using rtcore::cpu_set;
using rtcore::move_outcome;

namespace {

// The fake's tasks, with every sched_setaffinity refused as the kernel
// refuses one for a task of another user without CAP_SYS_NICE.
class eperm_task_ops final : public rtcore::task_ops {
public:
    explicit eperm_task_ops(rtcore::fake_task_ops& inner) : _inner(inner) {}
    rtcore::result<std::vector<rtcore::task_info>> list_tasks(const rtcore::host_fs& fs) override {
        return _inner.list_tasks(fs);
    }
    rtcore::result<rtcore::task_info> task(const rtcore::host_fs& fs, pid_t tid) override {
        return _inner.task(fs, tid);
    }
    rtcore::result<uid_t> real_uid(const rtcore::host_fs& fs, pid_t tid) override { return _inner.real_uid(fs, tid); }
    rtcore::result<cpu_set> affinity(pid_t tid) override { return _inner.affinity(tid); }
    rtcore::status set_affinity(pid_t tid, const cpu_set& cpus) override {
        return rtcore::error::from_errno(EPERM, "sched_setaffinity " + std::to_string(tid) + " " + cpus.to_list());
    }
    rtcore::result<std::vector<pid_t>> cgroup_tasks(const rtcore::host_fs& fs, std::string_view dir) override {
        return _inner.cgroup_tasks(fs, dir);
    }
    rtcore::status attach(rtcore::host_fs& fs, std::string_view dir, pid_t tid) override {
        return _inner.attach(fs, dir, tid);
    }
    rtcore::status make_cgroup(rtcore::host_fs& fs, std::string_view dir) override {
        return _inner.make_cgroup(fs, dir);
    }
    rtcore::status remove_cgroup(rtcore::host_fs& fs, std::string_view dir) override {
        return _inner.remove_cgroup(fs, dir);
    }

private:
    rtcore::fake_task_ops& _inner;
};

rtcore::task_info info_of(rtcore::fake_task_ops& tasks, pid_t tid) { return tasks.tasks().at(tid).info; }

}  // namespace

TEST(task_move, a_task_keeps_its_cpus_outside_the_isolated_ones_and_the_journal_gets_its_original_first) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(4));
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j) << j.err().message;
    std::vector<rtcore::journal_record> recs;
    const auto m = rtcore::plan_move_off(*j, info_of(tasks, 500), cpu_set::first_n(4), {2, 3}, {0}, recs);
    EXPECT_EQ(m.from, cpu_set::first_n(4));
    EXPECT_EQ(m.to, (cpu_set{0, 1})) << "its own CPUs outside isolated, not just housekeeping";
    ASSERT_EQ(recs.size(), 1U);
    const auto* aff = std::get_if<rtcore::rec::aff>(&recs[0]);
    ASSERT_NE(aff, nullptr);
    EXPECT_EQ(aff->tid, 500);
    EXPECT_EQ(aff->original, cpu_set::first_n(4));
    // A task on isolated CPUs only goes to housekeeping.
    const auto p = rtcore::plan_move_off(*j, info_of(tasks, 501), {3}, {2, 3}, {0}, recs);
    EXPECT_EQ(p.to, cpu_set{0});
    // Once the journal holds the task's original, it is not recorded again.
    ASSERT_TRUE(j->append(recs));
    std::vector<rtcore::journal_record> again;
    (void)rtcore::plan_move_off(*j, info_of(tasks, 500), cpu_set::first_n(4), {2, 3}, {0}, again);
    EXPECT_TRUE(again.empty());
}

TEST(task_move, make_move_says_moved_gone_refused_or_failed_as_the_kernel_answers) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(4));
    rtcore::error why;

    const rtcore::affinity_move postgres{info_of(tasks, 500), cpu_set::first_n(4), {0, 1}};
    EXPECT_EQ(rtcore::make_move(fs, tasks, postgres, why), move_outcome::moved);
    EXPECT_EQ(tasks.tasks().at(500).affinity, (cpu_set{0, 1}));

    // ksoftirqd/3 is bound by the kernel: EINVAL, left where it is.
    const rtcore::affinity_move ksoftirqd{info_of(tasks, 30), {3}, {0}};
    EXPECT_EQ(rtcore::make_move(fs, tasks, ksoftirqd, why), move_outcome::refused);
    EXPECT_EQ(why.code, EINVAL);
    EXPECT_EQ(tasks.tasks().at(30).affinity, cpu_set{3});

    // A task that exited between the listing and the move: ESRCH.
    const rtcore::affinity_move pinned{info_of(tasks, 501), {3}, {0}};
    tasks.remove_task(501);
    EXPECT_EQ(rtcore::make_move(fs, tasks, pinned, why), move_outcome::gone);
    EXPECT_EQ(why.code, ESRCH);

    // Any other error is a failure, the kernel's words kept.
    eperm_task_ops refusing(tasks);
    const rtcore::affinity_move cpu0{info_of(tasks, 2), cpu_set::first_n(4), {0, 1}};
    EXPECT_EQ(rtcore::make_move(fs, refusing, cpu0, why), move_outcome::failed);
    EXPECT_EQ(why.code, EPERM);
    EXPECT_NE(why.message.find("sched_setaffinity 2"), std::string::npos) << why.message;
}

TEST(task_move, a_dry_run_counts_the_move_and_changes_nothing) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root(), rtcore::host_fs::mode::dry_run);
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(4));
    rtcore::error why;
    const rtcore::affinity_move postgres{info_of(tasks, 500), cpu_set::first_n(4), {0, 1}};
    EXPECT_EQ(rtcore::make_move(fs, tasks, postgres, why), move_outcome::moved);
    EXPECT_EQ(tasks.set_affinity_calls(), 0U);
    EXPECT_EQ(tasks.tasks().at(500).affinity, cpu_set::first_n(4));
}
