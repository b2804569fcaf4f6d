// The runtime knobs of tuned's cpu-partitioning profile (host_knobs.hpp) on
// fake trees: apply writes each, journals it first, restore puts every byte
// back; a knob the kernel lacks is absent and skipped, one it refuses is
// named and left; verify sets a drifted knob again; per-CPU kernel threads
// are recorded once and never retried.

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include "rtcore/host_knobs.hpp"
#include "rtcore/host_partition.hpp"
#include "tree_fixture.hpp"

using namespace qrt_test;
using rtcore::cpu_set;
using rtcore::knob_outcome;
namespace hp = rtcore::host_partition;

namespace {

struct knob_case {
    const char* tree;
    cpu_set isolated;
    cpu_set housekeeping;
    rtcore::knob_options knobs;
    std::map<std::string, std::string> after;  // tree path -> bytes after apply
};

rtcore::knob_options all_knobs() {
    rtcore::knob_options o;
    o.mce_ignore_ce = true;
    o.rt_throttling_off = true;
    return o;
}

const knob_case cases[] = {
    {"vm2-v1", {1}, {0}, {},
     {{"sys/devices/virtual/workqueue/cpumask", "00000001"},
      {"sys/devices/virtual/workqueue/writeback/cpumask", "00000001"},
      {"sys/devices/virtual/workqueue/blkcg_punt_bio/cpumask", "00000001"},
      {"proc/sys/vm/stat_interval", "10"},
      {"proc/sys/kernel/timer_migration", "0"},
      {"proc/sys/kernel/watchdog_cpumask", "0"},
      {"proc/sys/kernel/sched_rt_runtime_us", "950000\n"}}},  // reported, not changed
    {"host8-v2", {4, 5, 6, 7}, {0, 1, 2, 3}, all_knobs(),
     {{"sys/devices/virtual/workqueue/cpumask", "0000000f"},
      {"sys/devices/virtual/workqueue/nvme-wq/cpumask", "0000000f"},
      {"proc/sys/vm/stat_interval", "10"},
      {"proc/sys/kernel/watchdog_cpumask", "0-3"},
      {"proc/sys/kernel/sched_rt_runtime_us", "-1"},
      {"sys/kernel/debug/sched/fair_server/cpu5/runtime", "0"},
      {"sys/kernel/debug/sched/fair_server/cpu3/runtime", "50000000\n"},  // a housekeeping CPU keeps it
      {"sys/devices/system/machinecheck/machinecheck2/ignore_ce", "1"}}},
    {"host4-nocg", {2, 3}, {0, 1}, all_knobs(),
     {{"proc/sys/vm/stat_interval", "10"}, {"proc/sys/kernel/sched_rt_runtime_us", "-1\n"}}},
};

void add_tasks(const knob_case& c, rtcore::fake_task_ops& tasks) {
    if (std::string(c.tree) == "vm2-v1") {
        add_vm2_tasks(tasks);
    } else {
        add_plain_tasks(tasks, c.isolated | c.housekeeping);
    }
}

hp::apply_options with(const rtcore::knob_options& k) {
    hp::apply_options o;
    o.knobs = k;
    return o;
}

const knob_outcome* find_knob(const rtcore::knob_report& r, const std::string& path) {
    for (const auto& k : r.knobs) {
        if (k.path == path) {
            return &k;
        }
    }
    return nullptr;
}

std::vector<rtcore::rec::knob> knob_records(const tree_copy& t, const rtcore::host_fs& fs) {
    std::vector<rtcore::rec::knob> out;
    auto j = load_journal(t, fs);
    EXPECT_TRUE(j) << j.err().message;
    if (j) {
        for (const auto& r : j->records) {
            if (const auto* k = std::get_if<rtcore::rec::knob>(&r)) {
                out.push_back(*k);
            }
        }
    }
    return out;
}

bool has_line(const std::vector<std::string>& lines, const std::string& want) {
    for (const auto& l : lines) {
        if (l == want) {
            return true;
        }
    }
    return false;
}

std::string all_lines(const std::vector<std::string>& lines) {
    std::string s;
    for (const auto& l : lines) {
        s += l + "\n";
    }
    return s;
}

}  // namespace

TEST(host_knobs, apply_writes_each_knob_journals_it_first_and_restore_puts_back_every_byte) {
    for (const auto& c : cases) {
        SCOPED_TRACE(c.tree);
        tree_copy t(c.tree);
        rtcore::host_fs fs(t.root());
        rtcore::fake_task_ops tasks;
        add_tasks(c, tasks);
        const auto before = snapshot(t.root());
        const auto tasks_before = task_states(tasks);

        auto rep = apply_in(t, fs, tasks, c.isolated, c.housekeeping, with(c.knobs));
        ASSERT_TRUE(rep) << rep.err().message;
        for (const auto& [path, bytes] : c.after) {
            EXPECT_EQ(read_file(t.root() / path), bytes) << path;
        }
        // Every knob that changed has its original journaled, byte for byte.
        const auto changed = rep->knobs.count(knob_outcome::action::set);
        EXPECT_GT(changed, 0U);
        const auto recs = knob_records(t, fs);
        EXPECT_EQ(recs.size(), changed);
        for (const auto& r : recs) {
            EXPECT_EQ(r.original, before.at(r.path.substr(1))) << r.path;
        }
        EXPECT_EQ(rep->knobs.count(knob_outcome::action::failed), 0U) << all_lines(rep->lines);

        auto back = restore_in(t, fs, tasks);
        ASSERT_TRUE(back) << back.err().message;
        EXPECT_TRUE(back->complete) << all_lines(back->lines);
        EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
        EXPECT_TRUE(task_states(tasks) == tasks_before) << "a kernel thread's affinity was not restored";
    }
}

TEST(host_knobs, the_plan_lists_each_knob_before_and_after_and_the_workqueue_lines_name_them) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    auto rep = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_TRUE(rep) << rep.err().message;
    const auto& l = rep->knobs.lines;
    EXPECT_TRUE(has_line(l, "knob: workqueue cpumask: 3 -> 00000001 (/sys/devices/virtual/workqueue/cpumask): unbound "
                            "kworkers (kworker/uN:M) run on housekeeping CPUs only"))
        << all_lines(l);
    EXPECT_TRUE(has_line(l, "knob: workqueue writeback cpumask: 3 -> 00000001 "
                            "(/sys/devices/virtual/workqueue/writeback/cpumask): its unbound workers run on "
                            "housekeeping CPUs only"))
        << all_lines(l);
    EXPECT_TRUE(has_line(l, "knob: vm.stat_interval: 1 -> 10 (/proc/sys/vm/stat_interval): the per-CPU "
                            "vmstat_update work wakes the isolated CPUs every 10 s, not every second"))
        << all_lines(l);
    EXPECT_TRUE(has_line(l, "knob: kernel.sched_rt_runtime_us: 950000 (/proc/sys/kernel/sched_rt_runtime_us): RT "
                            "tasks may run 950000 us of every 1000000 us; host.disable_rt_throttling = true sets -1"))
        << all_lines(l);
    EXPECT_TRUE(has_line(l, "knob: not in host.runtime_knobs, left alone: mce_ignore_ce")) << all_lines(l);
    // "power" is no workqueue: never written.
    EXPECT_EQ(find_knob(rep->knobs, "/sys/devices/virtual/workqueue/power/cpumask"), nullptr);
    ASSERT_TRUE(restore_in(t, fs, tasks)->complete);
}

TEST(host_knobs, a_dry_run_lists_before_and_after_and_changes_nothing) {
    tree_copy t("host8-v2");
    rtcore::host_fs fs(t.root(), rtcore::host_fs::mode::dry_run);
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(8));
    const auto before = snapshot(t.root());
    auto journal = rtcore::restore_journal::open_dry_run(fs, nullptr, rtcore::restore_allow_list::for_host(fs));
    ASSERT_TRUE(journal) << journal.err().message;
    auto rep = rtcore::apply_knobs(fs, tasks, *journal, {4, 5, 6, 7}, {0, 1, 2, 3}, all_knobs());
    ASSERT_TRUE(rep) << rep.err().message;
    const auto* wq = find_knob(*rep, "/sys/devices/virtual/workqueue/cpumask");
    ASSERT_NE(wq, nullptr);
    EXPECT_EQ(wq->act, knob_outcome::action::set);
    EXPECT_EQ(wq->before, "ff");
    EXPECT_EQ(wq->after, "0000000f");
    const auto* fair = find_knob(*rep, "/sys/kernel/debug/sched/fair_server/cpu4/runtime");
    ASSERT_NE(fair, nullptr);
    EXPECT_EQ(fair->before, "50000000");
    EXPECT_EQ(fair->after, "0");
    EXPECT_EQ(rep->kthreads.moved, 1U) << all_lines(rep->lines);  // kthreadd; ksoftirqd/3 is on housekeeping
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_EQ(tasks.mutations(), 0U);
}

TEST(host_knobs, a_knob_missing_on_an_old_kernel_is_reported_absent_and_skipped) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(4));
    auto rep = apply_in(t, fs, tasks, {2, 3}, {0, 1}, with(all_knobs()));
    ASSERT_TRUE(rep) << rep.err().message;
    const auto& l = rep->knobs.lines;
    EXPECT_TRUE(has_line(l, "knob: workqueue cpumask: absent (/sys/devices/virtual/workqueue/cpumask): the kernel has "
                            "no such file; skipped"))
        << all_lines(l);
    EXPECT_TRUE(has_line(l, "knob: kernel.timer_migration: absent (/proc/sys/kernel/timer_migration): the kernel has "
                            "no such file; skipped"))
        << all_lines(l);
    EXPECT_TRUE(has_line(l, "knob: kernel.sched_rt_runtime_us: already -1 (/proc/sys/kernel/sched_rt_runtime_us)"))
        << all_lines(l);
    EXPECT_TRUE(has_line(l, "knob: fair server runtime: absent (/sys/kernel/debug/sched/fair_server/cpuN/runtime): "
                            "/sys/kernel/debug/sched/fair_server is not there (a kernel before 6.12 has no fair "
                            "server; on a newer one debugfs is not mounted: mount -t debugfs none /sys/kernel/debug "
                            "to see it); skipped"))
        << all_lines(l);
    EXPECT_EQ(rep->knobs.count(knob_outcome::action::absent), 5U) << all_lines(l);
    EXPECT_FALSE(rtcore::host_fs(t.root()).exists("/sys/devices/virtual/workqueue/cpumask"));
    // Only the knob the kernel has was journaled.
    const auto recs = knob_records(t, fs);
    ASSERT_EQ(recs.size(), 1U);
    EXPECT_EQ(recs[0].path, "/proc/sys/vm/stat_interval");
    ASSERT_TRUE(restore_in(t, fs, tasks)->complete);
}

TEST(host_knobs, a_knob_the_kernel_refuses_is_named_and_left_and_apply_goes_on) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    fs.inject_write_error("/proc/sys/vm/stat_interval", EACCES);
    fs.inject_write_error("/sys/devices/virtual/workqueue/writeback/cpumask", EINVAL);
    const auto before = snapshot(t.root());
    auto rep = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_TRUE(rep) << rep.err().message;
    const auto& l = rep->knobs.lines;
    EXPECT_TRUE(has_line(l, "knob: vm.stat_interval: FAILED (/proc/sys/vm/stat_interval): write "
                            "/proc/sys/vm/stat_interval: Permission denied; left at 1"))
        << all_lines(l);
    EXPECT_TRUE(has_line(l, "knob: workqueue writeback cpumask: FAILED "
                            "(/sys/devices/virtual/workqueue/writeback/cpumask): write "
                            "/sys/devices/virtual/workqueue/writeback/cpumask: Invalid argument; left at 3"))
        << all_lines(l);
    EXPECT_EQ(rep->knobs.count(knob_outcome::action::failed), 2U);
    EXPECT_EQ(read_file(t.root() / "sys/devices/virtual/workqueue/cpumask"), "00000001") << "the others still apply";
    EXPECT_EQ(read_file(t.root() / "proc/sys/vm/stat_interval"), "1\n");
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_TRUE(back->complete) << all_lines(back->lines);
    EXPECT_TRUE(has_line(back->lines, "restore: unchanged /proc/sys/vm/stat_interval: already 1")) << all_lines(back->lines);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
}

TEST(host_knobs, a_journal_that_cannot_take_the_knob_fails_apply_and_unwinds_everything) {
    // A forged allow-list refusing knob records stands for a journal append
    // that fails: apply stops and puts back what it changed.
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    const auto tasks_before = task_states(tasks);
    auto d = t.jd();
    auto allow = rtcore::restore_allow_list::for_host(fs);
    allow.runtime_knobs = false;
    auto journal = rtcore::restore_journal::open(fs, d, allow);
    ASSERT_TRUE(journal) << journal.err().message;
    auto rep = rtcore::apply_knobs(fs, tasks, *journal, {1}, {0}, {});
    ASSERT_FALSE(rep);
    EXPECT_EQ(rep.err().code, EPERM);
    EXPECT_NE(rep.err().message.find("knob workqueue cpumask: journaling /sys/devices/virtual/workqueue/cpumask: "),
              std::string::npos)
        << rep.err().message;
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "") << "nothing is written before its record";
    EXPECT_TRUE(task_states(tasks) == tasks_before);
}

TEST(host_knobs, restore_leaves_a_knob_someone_else_changed_since_and_says_so) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    auto before = snapshot(t.root());
    ASSERT_TRUE(apply_in(t, fs, tasks, {1}, {0}));
    write_file(t.root() / "proc/sys/vm/stat_interval", "5\n");  // an admin's sysctl since
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_TRUE(back->complete);
    EXPECT_TRUE(has_line(back->lines, "restore: skipped /proc/sys/vm/stat_interval: changed by someone else since (now "
                                      "5, qrtd had set 10); left as is"))
        << all_lines(back->lines);
    EXPECT_EQ(read_file(t.root() / "proc/sys/vm/stat_interval"), "5\n");
    before["proc/sys/vm/stat_interval"] = "5\n";
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
}

TEST(host_knobs, verify_sets_a_drifted_knob_again_and_restore_still_gets_the_boot_value) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    ASSERT_TRUE(apply_in(t, fs, tasks, {1}, {0}));
    auto clean = verify_in(t, fs, tasks);
    ASSERT_TRUE(clean) << clean.err().message;
    EXPECT_TRUE(clean->clean) << all_lines(clean->lines);

    write_file(t.root() / "sys/devices/virtual/workqueue/cpumask", "3\n");
    write_file(t.root() / "proc/sys/kernel/timer_migration", "1\n");
    auto v = verify_in(t, fs, tasks);
    ASSERT_TRUE(v) << v.err().message;
    EXPECT_FALSE(v->clean);
    EXPECT_TRUE(v->knobs.drift);
    EXPECT_TRUE(has_line(v->lines, "knob: workqueue cpumask: DRIFT: read 3, qrtd had set it: 00000001 again "
                                   "(/sys/devices/virtual/workqueue/cpumask)"))
        << all_lines(v->lines);
    EXPECT_EQ(read_file(t.root() / "proc/sys/kernel/timer_migration"), "0");
    EXPECT_TRUE(verify_in(t, fs, tasks)->clean);

    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back);
    EXPECT_TRUE(back->complete);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
}

TEST(host_knobs, per_cpu_kernel_threads_are_recorded_once_and_never_retried) {
    tree_copy t("host8-v2");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(8));
    tasks.add_task(40, "rcu_gp", cpu_set::first_n(8), "", true);
    tasks.add_task(41, "ksoftirqd/5", {5}, "", true, true);
    tasks.add_task(42, "kworker/5:1", {5}, "", true, true);
    tasks.add_task(43, "kworker/u16:2", {4, 5, 6, 7}, "", true, true);
    tasks.add_task(44, "irq_affine", {6}, "", true, true);
    tasks.clear_per_cpu_flag(44);  // refuses, although its flags do not say so
    tasks.add_task(600, "user-app", cpu_set::first_n(8), "");
    const auto tasks_before = task_states(tasks);
    auto rep = apply_in(t, fs, tasks, {4, 5, 6, 7}, {0, 1, 2, 3});
    ASSERT_TRUE(rep) << rep.err().message;
    const auto& kt = rep->knobs.kthreads;
    EXPECT_EQ(kt.moved, 2U) << all_lines(rep->knobs.lines);  // kthreadd, rcu_gp
    EXPECT_EQ(kt.not_movable, 4U);
    EXPECT_EQ(tasks.tasks().at(40).affinity, (cpu_set{0, 1, 2, 3}));
    EXPECT_EQ(tasks.tasks().at(600).affinity, cpu_set::first_n(8)) << "a user task is isolation's business, not this knob's";
    EXPECT_TRUE(has_line(rep->knobs.lines,
                         "knob: kthreads: 4 per-CPU kernel threads on CPUs 4-7 are bound by the kernel, recorded and "
                         "never retried (ksoftirqd/5 (41), kworker/5:1 (42), kworker/u16:2 (43), irq_affine (44)); "
                         "unbound kworkers among them follow the workqueue cpumask"))
        << all_lines(rep->knobs.lines);
    const auto loaded = load_journal(t, fs);
    ASSERT_TRUE(loaded) << loaded.err().message;
    const auto nomove = std::count_if(loaded->records.begin(), loaded->records.end(), [](const auto& r) {
        return std::holds_alternative<rtcore::rec::nomove>(r);
    });
    EXPECT_EQ(nomove, 4);

    const unsigned calls = tasks.set_affinity_calls();
    auto v = verify_in(t, fs, tasks);
    ASSERT_TRUE(v) << v.err().message;
    EXPECT_TRUE(v->clean) << all_lines(v->lines);
    EXPECT_EQ(v->knobs.kthreads.not_movable, 4U);
    EXPECT_EQ(tasks.set_affinity_calls(), calls) << "a kernel thread recorded as not movable was tried again";

    // A kernel thread that appeared since is moved by verify, and that is drift.
    tasks.add_task(45, "kswapd0", cpu_set::first_n(8), "", true);
    auto v2 = verify_in(t, fs, tasks);
    ASSERT_TRUE(v2);
    EXPECT_FALSE(v2->clean);
    EXPECT_EQ(tasks.tasks().at(45).affinity, (cpu_set{0, 1, 2, 3}));

    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back);
    EXPECT_TRUE(back->complete) << all_lines(back->lines);
    auto now = task_states(tasks);
    now.erase(45);
    EXPECT_TRUE(now == tasks_before);
    EXPECT_EQ(tasks.tasks().at(45).affinity, cpu_set::first_n(8));
}

// Seen on Debian's 6.1 guest: the writeback workqueue's rescuer, moved by
// apply, is bound by the kernel once the workqueue cpumask changes, and then
// refuses sched_setaffinity with EINVAL.  Restore leaves it, says why, and
// is still complete: its affinity follows the workqueue mask restored too.
TEST(host_knobs, a_kernel_thread_the_kernel_bound_since_apply_is_left_and_restore_is_complete) {
    tree_copy t("host8-v2");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, cpu_set::first_n(8));
    tasks.add_task(32, "writeback", cpu_set::first_n(8), "", true);
    auto rep = apply_in(t, fs, tasks, {4, 5, 6, 7}, {0, 1, 2, 3});
    ASSERT_TRUE(rep) << rep.err().message;
    ASSERT_EQ(tasks.tasks().at(32).affinity, (cpu_set{0, 1, 2, 3}));
    tasks.bind_kthread(32);
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_TRUE(back->complete) << all_lines(back->lines);
    bool said = false;
    for (const auto& l : back->lines) {
        said = said || (l.find("task 32 (writeback)") != std::string::npos &&
                        l.find("the kernel has bound this kernel thread since (PF_NO_SETAFFINITY, now 0-3)") !=
                            std::string::npos);
    }
    EXPECT_TRUE(said) << all_lines(back->lines);

    // Without the flag, the same EINVAL is a failed restore, journal kept.
    tree_copy t2("host8-v2");
    rtcore::host_fs fs2(t2.root());
    rtcore::fake_task_ops tasks2;
    add_plain_tasks(tasks2, cpu_set::first_n(8));
    tasks2.add_task(32, "writeback", cpu_set::first_n(8), "", true);
    ASSERT_TRUE(apply_in(t2, fs2, tasks2, {4, 5, 6, 7}, {0, 1, 2, 3}));
    tasks2.bind_kthread(32);
    tasks2.clear_per_cpu_flag(32);
    auto back2 = restore_in(t2, fs2, tasks2);
    ASSERT_TRUE(back2);
    EXPECT_FALSE(back2->complete) << all_lines(back2->lines);
}

TEST(host_knobs, knobs_switched_off_are_left_alone_and_said_to_be) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    rtcore::knob_options none{false, false, false, false, false, false, false};
    auto rep = apply_in(t, fs, tasks, {1}, {0}, with(none));
    ASSERT_TRUE(rep) << rep.err().message;
    EXPECT_TRUE(has_line(rep->knobs.lines, "knob: not in host.runtime_knobs, left alone: workqueues, "
                                           "vm_stat_interval, timer_migration, watchdog_cpumask, mce_ignore_ce"))
        << all_lines(rep->knobs.lines);
    EXPECT_TRUE(knob_records(t, fs).empty());
    auto after = snapshot(t.root());
    for (const char* p : {"sys/devices/virtual/workqueue/cpumask", "proc/sys/vm/stat_interval",
                          "proc/sys/kernel/sched_rt_runtime_us"}) {
        EXPECT_EQ(after.at(p), before.at(p)) << p;
    }
    ASSERT_TRUE(restore_in(t, fs, tasks)->complete);
}

TEST(host_knobs, the_allow_list_admits_exactly_the_knob_paths) {
    const auto allow = rtcore::restore_allow_list{};
    for (const char* p :
         {"/sys/devices/virtual/workqueue/cpumask", "/sys/devices/virtual/workqueue/writeback/cpumask",
          "/sys/devices/virtual/workqueue/nvme-wq/cpumask", "/proc/sys/vm/stat_interval",
          "/proc/sys/kernel/timer_migration", "/proc/sys/kernel/watchdog_cpumask",
          "/proc/sys/kernel/sched_rt_runtime_us", "/sys/devices/system/machinecheck/machinecheck12/ignore_ce",
          "/sys/kernel/debug/sched/fair_server/cpu3/runtime"}) {
        EXPECT_TRUE(allow.check(rtcore::rec::knob{p, "1\n", "0"})) << p;
    }
    for (const char* p : {"/proc/sys/kernel/core_pattern", "/sys/devices/virtual/workqueue/power/cpumask",
                          "/sys/devices/virtual/workqueue/a/b/cpumask", "/sys/devices/virtual/workqueue/cpumask_requested",
                          "/sys/kernel/debug/sched/fair_server/cpux/runtime", "/proc/sys/vm/stat_interval2",
                          "/sys/bus/workqueue/devices/writeback/cpumask"}) {
        auto st = allow.check(rtcore::rec::knob{p, "1\n", "0"});
        ASSERT_FALSE(st) << p;
        EXPECT_EQ(st.err().code, EPERM);
        EXPECT_EQ(st.err().message.rfind(std::string("knob ") + p + " is not on the restore allow-list (", 0), 0U)
            << st.err().message;
    }
}
