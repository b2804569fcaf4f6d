// Host-safety regressions: a journal left by an earlier boot, and a cgroup
// with our name that qrtd did not create.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rtcore/host_partition.hpp"
#include "tree_fixture.hpp"

using namespace qrt_test;
using rtcore::isolation_method;
namespace rec = rtcore::rec;
namespace hp = rtcore::host_partition;

namespace {

const char* const old_boot = "00000000-1111-2222-3333-444444444444";

// A journal as an apply in an earlier boot left it: IRQ 36 recorded at its
// boot value and a cgroup created (both long gone after the reboot).
void write_old_boot_journal(const tree_copy& t) {
    std::string text;
    text += rtcore::journal_format(rec::header{2, old_boot, t.root().string()});
    text += rtcore::journal_format(rec::apply{{1}, {0}, rec::applier::run});
    text += rtcore::journal_format(rec::file{"/proc/irq/36/smp_affinity_list", "0-1\n"});
    text += rtcore::journal_format(rec::mkcg{"/sys/fs/cgroup/cpuset/qrt-isolated", "/sys/fs/cgroup/cpuset"});
    fs::create_directories(t.journal_dir());
    fs::permissions(t.journal_dir(), fs::perms::owner_all);
    write_file(t.journal(), text);
    fs::permissions(t.journal(), fs::perms::owner_read | fs::perms::owner_write);
}

// Puts the tree back to its snapshot at boot (cgroups qrtd made vanish) with a new boot id.
void reboot(const tree_copy& t, const tree_snapshot& boot_tree, const std::string& new_boot_id) {
    for (const auto& [k, v] : snapshot(t.root())) {
        if (boot_tree.count(k) == 0) {
            fs::remove_all(t.root() / k);
        }
    }
    for (const auto& [k, v] : boot_tree) {
        if (v != "<dir>") {
            write_file(t.root() / k, v);
        }
    }
    write_file(t.root() / "proc/sys/kernel/random/boot_id", new_boot_id);
}

fs::path stale_path(const tree_copy& t) {
    return t.journal_dir() / (std::string("host-journal.") + old_boot + ".stale");
}

}  // namespace

TEST(host_safety, a_journal_from_an_earlier_boot_is_set_aside_and_this_boots_apply_is_undone) {
    tree_copy t("vm2-v1");
    write_old_boot_journal(t);
    const std::string old_text = read_file(t.journal());
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    const auto tasks_before = task_states(tasks);
    ASSERT_EQ(before.at("proc/irq/36/smp_affinity_list"), "0-1\n");

    auto rep = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_TRUE(rep) << rep.err().message;
    EXPECT_FALSE(rep->continued_journal);
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0");
    // The old journal is kept aside, untouched, and the report says why.
    ASSERT_TRUE(fs::exists(stale_path(t)));
    EXPECT_EQ(read_file(stale_path(t)), old_text);
    bool said = false;
    for (const auto& l : rep->lines) {
        if (l.find(stale_path(t).string()) != std::string::npos &&
            l.find("the reboot already reset") != std::string::npos) {
            said = true;
        }
    }
    EXPECT_TRUE(said) << "apply does not report the set-aside journal";
    // The new journal belongs to this boot and holds this boot's originals.
    auto recs = load_journal(t, fs);
    ASSERT_TRUE(recs);
    ASSERT_FALSE(recs->records.empty());
    EXPECT_EQ(std::get<rec::header>(recs->records.front()).boot_id, "148e24da-ef85-4d2b-baf4-da6d1156975d");

    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_FALSE(back->other_boot);
    EXPECT_TRUE(back->complete);
    EXPECT_TRUE(back->journal_removed);
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0-1\n");
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_TRUE(task_states(tasks) == tasks_before);
    EXPECT_FALSE(fs::exists(t.journal()));
    EXPECT_TRUE(fs::exists(stale_path(t)));  // kept for the admin to read
}

// The review's case: a crash mid-apply, a reboot, then apply and restore.
TEST(host_safety, crash_then_reboot_then_apply_then_restore_gets_back_to_this_boots_values) {
    tree_copy t("vm2-v1");
    const auto boot_tree = snapshot(t.root());
    const std::string old_id = boot_tree.at("proc/sys/kernel/random/boot_id");
    ASSERT_EQ(apply_killed_before_mutation(t, add_vm2_tasks, {1}, {0}, 4).signal, SIGKILL);
    ASSERT_TRUE(fs::exists(t.journal()));
    // The reboot: every runtime value back at its boot value, a new boot id.
    reboot(t, boot_tree, "99999999-8888-7777-6666-555555555555\n");
    ASSERT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0-1\n");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    // Everything but the old journal's IRQ files is as at boot: compare the whole tree.
    const auto before = snapshot(t.root());
    auto rep = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_TRUE(rep) << rep.err().message;
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0");
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_TRUE(back->complete);
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0-1\n");
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    std::string id = old_id;  // the boot the crashed apply ran in
    while (!id.empty() && id.back() == '\n') {
        id.pop_back();
    }
    EXPECT_TRUE(fs::exists(t.journal_dir() / ("host-journal." + id + ".stale")));
}

TEST(host_safety, dry_run_over_an_earlier_boots_journal_changes_nothing_and_says_it_would_set_it_aside) {
    tree_copy t("vm2-v1");
    write_old_boot_journal(t);
    const std::string old_text = read_file(t.journal());
    rtcore::host_fs fs(t.root(), rtcore::host_fs::mode::dry_run);
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    auto rep = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_TRUE(rep) << rep.err().message;
    EXPECT_FALSE(rep->continued_journal);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_EQ(read_file(t.journal()), old_text);
    EXPECT_FALSE(fs::exists(stale_path(t)));
    bool said = false;
    for (const auto& l : rep->lines) {
        if (l.find("would be set aside") != std::string::npos) {
            said = true;
        }
    }
    EXPECT_TRUE(said);
}

// A cgroup named like ours that qrtd did not create is never taken over.
TEST(host_safety, a_foreign_v1_cgroup_with_our_name_is_left_alone_and_apply_falls_back) {
    tree_copy t("vm2-v1");
    const fs::path foreign = t.root() / "sys/fs/cgroup/cpuset/qrt-isolated";
    write_file(foreign / "cpuset.cpus", "0-1\n");
    write_file(foreign / "cpuset.mems", "0\n");
    write_file(foreign / "cpuset.cpu_exclusive", "0\n");
    write_file(foreign / "cpuset.sched_load_balance", "1\n");
    write_file(foreign / "tasks", "");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    const auto tasks_before = task_states(tasks);

    auto rep = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_TRUE(rep) << rep.err().message;
    EXPECT_EQ(rep->isolation.method, isolation_method::affinity_fence);
    const std::string why = "cgroup /sys/fs/cgroup/cpuset/qrt-isolated already exists (left by another tool or an "
                            "earlier run that was not restored); remove it or restore the host partition first";
    bool named = false;
    for (const auto& n : rep->isolation.not_used) {
        if (n.find(why) != std::string::npos) {
            named = true;
        }
    }
    EXPECT_TRUE(named) << "the refusal does not name the path";
    auto after_apply = snapshot(t.root());
    for (const auto& [k, v] : before) {
        if (k.rfind("sys/fs/cgroup/cpuset/qrt-isolated", 0) == 0) {
            EXPECT_EQ(after_apply.at(k), v) << k << " was changed by apply";
        }
    }
    EXPECT_EQ(after_apply.count("sys/fs/cgroup/cpuset/qrt-housekeeping"), 0U);
    auto recs = load_journal(t, fs);
    ASSERT_TRUE(recs);
    for (const auto& r : recs->records) {
        EXPECT_FALSE(std::holds_alternative<rec::mkcg>(r)) << "a cgroup was recorded as created";
    }

    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_TRUE(back->complete);
    EXPECT_TRUE(fs::is_directory(foreign));
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_TRUE(task_states(tasks) == tasks_before);
}

// rtcore says how to restore in its own words; the caller (qrtd) names its
// command, and the refusal carries it.
TEST(host_safety, a_foreign_cgroup_refusal_carries_the_callers_restore_command) {
    tree_copy t("vm2-v1");
    write_file(t.root() / "sys/fs/cgroup/cpuset/qrt-isolated" / "cpuset.cpus", "0-1\n");
    rtcore::host_fs fs(t.root());
    rtcore::isolation_options opts;
    auto joined = [](const rtcore::isolation_report& r) {
        std::string all;
        for (const auto& n : r.not_used) {
            all += n + "\n";
        }
        return all;
    };
    const std::string plain = joined(rtcore::preview_isolation(fs, nullptr, opts));
    EXPECT_NE(plain.find("qrt-isolated already exists (a partition is applied, or an earlier run was not "
                         "restored; restore the host partition first)"),
              std::string::npos)
        << plain;
    EXPECT_EQ(plain.find("qrtd"), std::string::npos) << plain;
    opts.restore_hint = "run `qrtd host restore`";
    const std::string hinted = joined(rtcore::preview_isolation(fs, nullptr, opts));
    EXPECT_NE(hinted.find("was not restored; run `qrtd host restore`)"), std::string::npos) << hinted;
}

TEST(host_safety, a_forced_method_over_a_foreign_cgroup_fails_cleanly_and_changes_nothing) {
    tree_copy t("vm2-v1");
    const fs::path foreign = t.root() / "sys/fs/cgroup/cpuset/qrt-housekeeping";
    write_file(foreign / "cpuset.cpus", "0\n");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    hp::apply_options opts;
    opts.isolation.force = isolation_method::cgroup_v1_cpuset;
    auto rep = apply_in(t, fs, tasks, {1}, {0}, opts);
    ASSERT_FALSE(rep);
    EXPECT_NE(rep.err().message.find("cgroup /sys/fs/cgroup/cpuset/qrt-housekeeping already exists"),
              std::string::npos)
        << rep.err().message;
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_FALSE(fs::exists(t.journal()));
}

// Our own cgroup from a crashed apply in this boot is still ours: re-apply uses it.
TEST(host_safety, our_own_cgroup_recorded_in_this_boots_journal_is_reused) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    ASSERT_TRUE(apply_in(t, fs, tasks, {1}, {0}));
    auto again = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_TRUE(again) << again.err().message;
    EXPECT_EQ(again->isolation.method, isolation_method::cgroup_v1_cpuset);
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back);
    EXPECT_TRUE(back->complete);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
}
