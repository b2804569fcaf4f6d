#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "rtcore/host_partition.hpp"
#include "tree_fixture.hpp"

using namespace qrt_test;
using rtcore::cpu_set;
using rtcore::isolation_method;
namespace hp = rtcore::host_partition;

namespace {

struct tree_case {
    const char* tree;
    cpu_set isolated;
    cpu_set housekeeping;
    isolation_method expect;
};

void add_tasks(const tree_case& c, rtcore::fake_task_ops& tasks) {
    if (std::string(c.tree) == "vm2-v1") {
        add_vm2_tasks(tasks);
    } else {
        add_plain_tasks(tasks, c.isolated | c.housekeeping);
    }
}

const tree_case cases[] = {
    {"vm2-v1", {1}, {0}, isolation_method::cgroup_v1_cpuset},
    {"host8-v2", {4, 5, 6, 7}, {0, 1, 2, 3}, isolation_method::cgroup_v2_partition},
    {"host4-nocg", {2, 3}, {0, 1}, isolation_method::affinity_fence},
};

}  // namespace

TEST(host_partition, apply_then_restore_leaves_every_tree_byte_identical) {
    for (const auto& c : cases) {
        SCOPED_TRACE(c.tree);
        tree_copy t(c.tree);
        rtcore::host_fs fs(t.root());
        rtcore::fake_task_ops tasks;
        add_tasks(c, tasks);
        const auto before = snapshot(t.root());
        const auto tasks_before = task_states(tasks);

        auto rep = apply_in(t, fs, tasks, c.isolated, c.housekeeping);
        ASSERT_TRUE(rep) << rep.err().message;
        EXPECT_EQ(rep->isolation.method, c.expect);
        EXPECT_NE(first_difference(before, snapshot(t.root())), "") << "apply changed nothing";
        EXPECT_TRUE(fs::exists(t.journal()));
        EXPECT_EQ(rep->lines.back(), std::string("partition: applied (") + rtcore::to_string(c.expect) +
                                         "); restore puts every value back");

        auto back = restore_in(t, fs, tasks);
        ASSERT_TRUE(back) << back.err().message;
        EXPECT_TRUE(back->complete);
        EXPECT_TRUE(back->journal_removed);
        EXPECT_EQ(back->count(rtcore::restore_item::outcome::failed), 0U);
        EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
        EXPECT_TRUE(task_states(tasks) == tasks_before) << "a task's affinity or cpuset was not restored";
        EXPECT_FALSE(fs::exists(t.journal()));

        auto again = restore_in(t, fs, tasks);
        ASSERT_TRUE(again);
        EXPECT_FALSE(again->journal_found);
        EXPECT_EQ(again->lines.back(), "restore: no journal in " + t.journal_dir().string() + ": nothing to restore");
    }
}

TEST(host_partition, reapply_keeps_the_first_originals_and_restore_still_gets_back_to_boot_values) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    const auto tasks_before = task_states(tasks);
    ASSERT_TRUE(apply_in(t, fs, tasks, {1}, {0}));
    auto second = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_TRUE(second) << second.err().message;
    EXPECT_TRUE(second->continued_journal);
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back);
    EXPECT_TRUE(back->complete);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_TRUE(task_states(tasks) == tasks_before);
}

TEST(host_partition, a_managed_irq_is_reported_and_apply_still_succeeds) {
    tree_copy t("host8-v2");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(8));
    fs.inject_write_error("/proc/irq/122/smp_affinity_list", EIO);
    fs.inject_write_error("/proc/irq/123/smp_affinity_list", EPERM);
    const auto before = snapshot(t.root());
    auto rep = apply_in(t, fs, tasks, {4, 5, 6, 7}, {0, 1, 2, 3});
    ASSERT_TRUE(rep) << rep.err().message;
    EXPECT_EQ(rep->irqs.count(rtcore::irq_outcome::action::managed), 2U);
    bool named = false;
    for (const auto& l : rep->lines) {
        named |= l.rfind("irq 123 (nvme0q4): managed 6-7 -> 6-7; write /proc/irq/123/smp_affinity_list: Operation "
                         "not permitted",
                         0) == 0;
    }
    EXPECT_TRUE(named);
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back);
    EXPECT_TRUE(back->complete) << "the managed IRQ was never changed, so there is nothing to fail on";
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
}

TEST(host_partition, a_read_only_proc_is_a_clear_error_and_changes_nothing) {
    for (const char* path : {"/proc/irq/default_smp_affinity", "/proc/irq/41/smp_affinity_list"}) {
        SCOPED_TRACE(path);
        tree_copy t("vm2-v1");
        rtcore::host_fs fs(t.root());
        rtcore::fake_task_ops tasks;
        add_vm2_tasks(tasks);
        fs.inject_write_error(path, EROFS);
        const auto before = snapshot(t.root());
        const auto tasks_before = task_states(tasks);
        auto rep = apply_in(t, fs, tasks, {1}, {0});
        ASSERT_FALSE(rep);
        EXPECT_EQ(rep.err().code, EROFS);
        EXPECT_NE(rep.err().message.find(std::string("apply: pinning IRQs: write ") + path +
                                         ": Read-only file system"),
                  std::string::npos)
            << rep.err().message;
        EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
        EXPECT_TRUE(task_states(tasks) == tasks_before);
        EXPECT_FALSE(fs::exists(t.journal())) << "the unwind should leave no journal behind";
    }
}

TEST(host_partition, a_task_exiting_mid_apply_is_not_a_failure) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(4));
    const auto before = snapshot(t.root());
    tasks.before_mutation = [&tasks](unsigned n) {
        if (n == 2) {
            tasks.remove_task(500);  // exits between listing and its affinity change
        }
    };
    auto rep = apply_in(t, fs, tasks, {2, 3}, {0, 1});
    ASSERT_TRUE(rep) << rep.err().message;
    EXPECT_EQ(rep->isolation.tasks_gone, 1U);
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back);
    EXPECT_TRUE(back->complete);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
}

TEST(host_partition, a_failure_in_isolation_unwinds_the_irqs_too) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(4));
    const auto before = snapshot(t.root());
    const auto tasks_before = task_states(tasks);
    hp::apply_options o;
    o.isolation.force = isolation_method::cgroup_v1_cpuset;
    auto bad = apply_in(t, fs, tasks, {2, 3}, {0, 1}, o);
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.err().code, ENOTSUP);
    EXPECT_EQ(bad.err().message,
              "apply: isolation cgroup-v1-cpuset was asked for but no cgroup v1 cpuset hierarchy is mounted; every "
              "change was unwound (3 values put back)");
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_TRUE(task_states(tasks) == tasks_before);
    EXPECT_FALSE(fs::exists(t.journal()));
}

TEST(host_partition, bad_inputs_are_clear_errors_that_change_nothing) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    struct bad {
        cpu_set iso;
        cpu_set hk;
        int code;
        std::string message;
    };
    const bad cases_[] = {
        {{0, 1}, {}, EINVAL,
         "apply: the isolated set 0-1 covers every online CPU (0-1); keep at least one housekeeping CPU; nothing "
         "was changed"},
        {{1, 5}, {0}, EINVAL,
         "apply: isolated CPUs 5 do not exist or are offline (online CPUs: 0-1); nothing was changed"},
        {{1}, {0, 7}, EINVAL,
         "apply: housekeeping CPUs 7 do not exist or are offline (online CPUs: 0-1); nothing was changed"},
        {{1}, {}, EINVAL,
         "apply: the housekeeping CPU set is empty; keep at least one CPU for the system; nothing was changed"},
        {{}, {0}, EINVAL, "apply: the isolated CPU set is empty: nothing to isolate; nothing was changed"},
        {{1}, {0, 1}, EINVAL, "apply: CPUs 1 are in both the isolated and the housekeeping set; nothing was changed"},
    };
    for (const auto& c : cases_) {
        auto r = apply_in(t, fs, tasks, c.iso, c.hk);
        ASSERT_FALSE(r) << c.message;
        EXPECT_EQ(r.err().code, c.code);
        EXPECT_EQ(r.err().message, c.message);
    }
    // Without a journal directory a real apply or restore does nothing.
    auto a = hp::apply(fs, tasks, nullptr, {1}, {0});
    ASSERT_FALSE(a);
    EXPECT_EQ(a.err().message, "apply: no journal directory; nothing was changed");
    auto r = hp::restore(fs, tasks, nullptr);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, EINVAL);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_FALSE(fs::exists(t.journal()));
    EXPECT_EQ(tasks.mutations(), 0U);
}

TEST(host_partition, dry_run_lists_the_writes_and_changes_nothing) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root(), rtcore::host_fs::mode::dry_run);
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    auto rep = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_TRUE(rep) << rep.err().message;
    EXPECT_TRUE(rep->dry_run);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_FALSE(fs::exists(t.journal())) << "dry run wrote a journal";
    EXPECT_EQ(tasks.mutations(), 0U);
    std::map<std::string, std::string> planned;
    for (const auto& w : rep->planned_writes) {
        planned[w.path] = w.data;
    }
    EXPECT_EQ(planned.at("/proc/irq/36/smp_affinity_list"), "0");
    EXPECT_EQ(planned.at("/proc/irq/default_smp_affinity"), "00000001");
    EXPECT_EQ(planned.at("/sys/fs/cgroup/cpuset/qrt-isolated"), "<mkdir>");
    EXPECT_EQ(planned.at("/sys/fs/cgroup/cpuset/qrt-isolated/cpuset.cpus"), "1");
    EXPECT_EQ(planned.at("/sys/fs/cgroup/cpuset/cpuset.sched_load_balance"), "0");
    EXPECT_EQ(planned.count("/sys/fs/cgroup/cpuset/qrt-housekeeping/tasks"), 1U);
}

TEST(host_partition, dry_run_restore_lists_what_it_would_put_back_and_changes_nothing) {
    for (const auto& c : cases) {
        SCOPED_TRACE(c.tree);
        tree_copy t(c.tree);
        rtcore::host_fs fs(t.root());
        rtcore::fake_task_ops tasks;
        add_tasks(c, tasks);
        ASSERT_TRUE(apply_in(t, fs, tasks, c.isolated, c.housekeeping));
        const auto applied = snapshot(t.root());
        const auto tasks_applied = task_states(tasks);
        const unsigned mutations = tasks.mutations();
        rtcore::host_fs dry(t.root(), rtcore::host_fs::mode::dry_run);
        {
            // A dry run reads the journal without its lock.
            auto d = rtcore::journal_dir::open(t.journal_dir(), {.create = false, .lock = false, .wait = {}, .holder = ""});
            ASSERT_TRUE(d) << d.err().message;
            auto r = hp::restore(dry, tasks, &*d);
            ASSERT_TRUE(r) << r.err().message;
            EXPECT_FALSE(r->journal_removed);
            EXPECT_TRUE(fs::exists(t.journal()));
            EXPECT_EQ(first_difference(applied, snapshot(t.root())), "");
            EXPECT_TRUE(task_states(tasks) == tasks_applied);
            EXPECT_EQ(tasks.mutations(), mutations);
            EXPECT_FALSE(dry.planned_writes().empty());
            EXPECT_EQ(r->lines.back(), "restore: dry run: nothing was changed and the journal is kept");
        }
        ASSERT_TRUE(restore_in(t, fs, tasks)->complete);
    }
}

TEST(host_partition, verify_reports_clean_then_drift_and_a_new_irq_and_repins) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    auto none = verify_in(t, fs, tasks);
    ASSERT_TRUE(none);
    EXPECT_FALSE(none->applied);
    ASSERT_TRUE(apply_in(t, fs, tasks, {1}, {0}));
    auto clean = verify_in(t, fs, tasks);
    ASSERT_TRUE(clean) << clean.err().message;
    EXPECT_TRUE(clean->applied);
    EXPECT_TRUE(clean->clean) << clean->lines.front();
    EXPECT_EQ(clean->method, isolation_method::cgroup_v1_cpuset);

    write_file(t.root() / "proc/irq/26/smp_affinity_list", "1\n");
    write_file(t.root() / "proc/irq/60/smp_affinity_list", "0-1\n");
    auto v = verify_in(t, fs, tasks);
    ASSERT_TRUE(v) << v.err().message;
    EXPECT_FALSE(v->clean);
    EXPECT_EQ(v->irqs.count(rtcore::irq_outcome::action::repinned), 1U);
    EXPECT_EQ(v->irqs.count(rtcore::irq_outcome::action::new_pinned), 1U);
    EXPECT_EQ(read_file(t.root() / "proc/irq/60/smp_affinity_list"), "0");
    EXPECT_TRUE(verify_in(t, fs, tasks)->clean);

    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back);
    EXPECT_TRUE(back->complete);
    auto after = snapshot(t.root());
    // irq 60 appeared during the test and goes back to its own original.
    EXPECT_EQ(after.at("proc/irq/60/smp_affinity_list"), "0-1\n");
    after.erase("proc/irq/60/smp_affinity_list");
    after.erase("proc/irq/60");
    EXPECT_EQ(first_difference(before, after), "");
}

// The applying process dies by SIGKILL at every point where it changes a
// task or a cgroup; the next restore puts the tree back byte for byte.
TEST(host_partition, a_crash_at_any_point_of_apply_is_recovered_by_the_next_restore) {
    for (const auto& c : cases) {
        SCOPED_TRACE(c.tree);
        unsigned total = 0;
        {
            tree_copy probe(c.tree);
            rtcore::host_fs fs(probe.root());
            rtcore::fake_task_ops tasks;
            add_tasks(c, tasks);
            ASSERT_TRUE(apply_in(probe, fs, tasks, c.isolated, c.housekeeping));
            total = tasks.mutations();
        }
        ASSERT_GT(total, 0U);
        for (unsigned kill_at = 1; kill_at <= total; ++kill_at) {
            SCOPED_TRACE("killed before mutation " + std::to_string(kill_at) + " of " + std::to_string(total));
            tree_copy t(c.tree);
            const auto before = snapshot(t.root());
            const auto crashed = apply_killed_before_mutation(
                t, [&](rtcore::fake_task_ops& tasks) { add_tasks(c, tasks); }, c.isolated, c.housekeeping, kill_at);
            ASSERT_EQ(crashed.signal, SIGKILL) << "exit status " << crashed.exit_code;
            ASSERT_TRUE(fs::exists(t.journal()));

            rtcore::host_fs fs(t.root());
            rtcore::fake_task_ops tasks;  // the killed process's tasks, as they were
            add_tasks(c, tasks);
            auto back = restore_in(t, fs, tasks);
            ASSERT_TRUE(back) << back.err().message;
            EXPECT_TRUE(back->complete);
            EXPECT_TRUE(back->journal_removed);
            EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
        }
    }
}

// A crash, then a second apply before anyone restores: the journal still
// holds the boot values, so one restore undoes both.
TEST(host_partition, a_crash_then_reapply_then_restore_gets_back_to_boot_values) {
    tree_copy t("vm2-v1");
    const auto before = snapshot(t.root());
    ASSERT_EQ(apply_killed_before_mutation(t, add_vm2_tasks, {1}, {0}, 4).signal, SIGKILL);
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    auto again = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_TRUE(again) << again.err().message;
    EXPECT_TRUE(again->continued_journal);
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back);
    EXPECT_TRUE(back->complete);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
}
