// The partition on the real host: apply isolated={last CPU}, check that
// /proc/irq and the cpuset really changed, restore, and check that every IRQ
// affinity, default_smp_affinity, the cpuset tree, the runtime knobs (the
// workqueue cpumasks, vm.stat_interval, timer_migration, watchdog_cpumask)
// and every task's cpuset and affinity are as before.  Also with the
// applying process killed by SIGKILL.
//
// Guarded: the journal directory is fixed (so a run killed by a timeout is
// restored by the next run), the cgroups are named qrt-it-* (so a daemon
// under test elsewhere is not disturbed), and restore runs in TearDown even
// when an assertion failed.  Each call opens and locks the journal
// directory as the qrtd commands do.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "rtcore/host_partition.hpp"

namespace fs = std::filesystem;
namespace hp = rtcore::host_partition;
using rtcore::cpu_set;

namespace {

const fs::path journal_dir = fs::temp_directory_path() / "qrt-it-host-real-journal";
constexpr const char* prefix = "qrt-it";

rtcore::journal_dir locked() {
    auto d = rtcore::journal_dir::open(journal_dir, {});
    if (!d) {
        ADD_FAILURE() << d.err().message;
        throw std::runtime_error(d.err().message);
    }
    return std::move(*d);
}

rtcore::result<hp::apply_report> apply(rtcore::host_fs& fs, rtcore::task_ops& tasks, const cpu_set& iso,
                                       const cpu_set& hk, const hp::apply_options& o) {
    const auto d = locked();
    return hp::apply(fs, tasks, &d, iso, hk, o);
}

rtcore::result<hp::restore_report> restore(rtcore::host_fs& fs, rtcore::task_ops& tasks) {
    const auto d = locked();
    return hp::restore(fs, tasks, &d, {prefix});
}

rtcore::result<hp::verify_report> verify(rtcore::host_fs& fs, rtcore::task_ops& tasks, const hp::apply_options& o) {
    const auto d = locked();
    return hp::verify(fs, tasks, d, o);
}

struct host_snapshot {
    std::map<std::string, std::string> files;  // IRQ and cpuset files, exact bytes
    struct task {
        std::uint64_t start = 0;
        std::string comm;
        std::string cpuset;
        cpu_set affinity;
    };
    std::map<pid_t, task> tasks;
};

// The runtime knob files of this kernel (host_knobs.hpp), exact bytes.
std::vector<std::string> knob_files(const rtcore::host_fs& fs) {
    std::vector<std::string> out = {"/sys/devices/virtual/workqueue/cpumask", "/proc/sys/vm/stat_interval",
                                    "/proc/sys/kernel/timer_migration", "/proc/sys/kernel/watchdog_cpumask",
                                    "/proc/sys/kernel/sched_rt_runtime_us"};
    if (auto ents = fs.list("/sys/devices/virtual/workqueue")) {
        for (const auto& e : *ents) {
            const auto p = "/sys/devices/virtual/workqueue/" + e + "/cpumask";
            if (fs.exists(p)) {
                out.push_back(p);
            }
        }
    }
    return out;
}

// Files whose content is the kernel's live state, not configuration.
bool volatile_cgroup_file(const std::string& name) {
    return name == "tasks" || name == "cgroup.procs" || name == "cpuset.memory_pressure";
}

host_snapshot take_snapshot(rtcore::host_fs& fs, rtcore::task_ops& tasks) {
    host_snapshot s;
    if (auto irqs = rtcore::list_irqs(fs)) {
        for (unsigned irq : *irqs) {
            const auto p = "/proc/irq/" + std::to_string(irq) + "/smp_affinity_list";
            if (auto v = fs.read(p)) {
                s.files[p] = *v;
            }
        }
    }
    if (auto v = fs.read("/proc/irq/default_smp_affinity")) {
        s.files["/proc/irq/default_smp_affinity"] = *v;
    }
    for (const auto& p : knob_files(fs)) {
        if (auto v = fs.read(p)) {
            s.files[p] = *v;
        }
    }
    const auto mounts = rtcore::find_cgroup_mounts(fs);
    if (!mounts.v1_cpuset_root.empty()) {
        std::error_code ec;
        for (const auto& e : fs::recursive_directory_iterator(mounts.v1_cpuset_root, ec)) {
            const auto name = e.path().filename().string();
            if (e.is_directory()) {
                s.files[e.path().string()] = "<dir>";
            } else if (!volatile_cgroup_file(name)) {
                if (auto v = fs.read(e.path().string())) {
                    s.files[e.path().string()] = *v;
                }
            }
        }
    }
    if (!mounts.v2_root.empty()) {
        for (const char* f : {"cgroup.subtree_control", "cpuset.cpus.effective"}) {
            const auto p = mounts.v2_root + "/" + f;
            if (auto v = fs.read(p)) {
                s.files[p] = *v;
            }
        }
    }
    if (auto all = tasks.list_tasks(fs)) {
        for (const auto& t : *all) {
            auto aff = tasks.affinity(t.tid);
            auto cs = fs.read("/proc/" + std::to_string(t.tid) + "/cpuset");
            if (aff && cs) {
                s.tasks[t.tid] = host_snapshot::task{t.start_ticks, t.comm, *cs, *aff};
            }
        }
    }
    return s;
}

// Compares two snapshots; returns what differs, one line each.
std::vector<std::string> differences(const host_snapshot& a, const host_snapshot& b, const cpu_set& housekeeping,
                                     std::vector<std::string>& tolerated) {
    std::vector<std::string> out;
    for (const auto& [p, v] : a.files) {
        auto it = b.files.find(p);
        if (it == b.files.end()) {
            out.push_back(p + " is gone");
        } else if (it->second != v) {
            out.push_back(p + ": \"" + v + "\" became \"" + it->second + "\"");
        }
    }
    for (const auto& [p, v] : b.files) {
        if (a.files.count(p) == 0 && p.find("/proc/irq/") != 0) {
            out.push_back(p + " appeared");
        }
    }
    for (const auto& [tid, t] : a.tasks) {
        auto it = b.tasks.find(tid);
        if (it == b.tasks.end() || it->second.start != t.start) {
            continue;  // exited meanwhile
        }
        const auto& now = it->second;
        if (now.cpuset != t.cpuset) {
            out.push_back("task " + std::to_string(tid) + " (" + t.comm + ") cpuset " + t.cpuset + " -> " + now.cpuset);
        }
        if (!(now.affinity == t.affinity)) {
            const std::string what = "task " + std::to_string(tid) + " (" + t.comm + ") affinity " +
                                     t.affinity.to_list() + " -> " + now.affinity.to_list();
            // Left on exactly the housekeeping set is our signature; any other
            // value is the task (or another test) changing itself meanwhile.
            if (now.affinity == housekeeping) {
                out.push_back(what);
            } else {
                tolerated.push_back(what);
            }
        }
    }
    return out;
}

// Forwards to the real calls and dies by SIGKILL before the n-th change.
class killing_task_ops final : public rtcore::task_ops {
public:
    explicit killing_task_ops(unsigned kill_at) : _kill_at(kill_at) {}
    rtcore::result<std::vector<rtcore::task_info>> list_tasks(const rtcore::host_fs& fs) override {
        return _real.list_tasks(fs);
    }
    rtcore::result<rtcore::task_info> task(const rtcore::host_fs& fs, pid_t tid) override {
        return _real.task(fs, tid);
    }
    rtcore::result<uid_t> real_uid(const rtcore::host_fs& fs, pid_t tid) override { return _real.real_uid(fs, tid); }
    rtcore::result<cpu_set> affinity(pid_t tid) override { return _real.affinity(tid); }
    rtcore::status set_affinity(pid_t tid, const cpu_set& cpus) override {
        tick();
        return _real.set_affinity(tid, cpus);
    }
    rtcore::result<std::vector<pid_t>> cgroup_tasks(const rtcore::host_fs& fs, std::string_view dir) override {
        return _real.cgroup_tasks(fs, dir);
    }
    rtcore::status attach(rtcore::host_fs& fs, std::string_view dir, pid_t tid) override {
        tick();
        return _real.attach(fs, dir, tid);
    }
    rtcore::status make_cgroup(rtcore::host_fs& fs, std::string_view dir) override {
        tick();
        return _real.make_cgroup(fs, dir);
    }
    rtcore::status remove_cgroup(rtcore::host_fs& fs, std::string_view dir) override {
        tick();
        return _real.remove_cgroup(fs, dir);
    }

private:
    void tick() {
        if (++_n == _kill_at) {
            ::kill(::getpid(), SIGKILL);
        }
    }
    rtcore::real_task_ops _real;
    unsigned _kill_at;
    unsigned _n = 0;
};

class host_real : public ::testing::Test {
protected:
    void SetUp() override {
        if (::geteuid() != 0) {
            GTEST_SKIP() << "needs root: changes IRQ affinity, cpusets and task affinity of the real host";
        }
        if (::access("/proc/irq/default_smp_affinity", W_OK) != 0) {
            GTEST_SKIP() << "/proc/irq is not writable here (container?)";
        }
        auto online = _fs.read_line("/sys/devices/system/cpu/online");
        auto cpus = online ? cpu_set::parse_list(*online) : rtcore::result<cpu_set>(online.err());
        if (!cpus || cpus->count() < 2) {
            GTEST_SKIP() << "needs at least 2 online CPUs";
        }
        _isolated = cpu_set{static_cast<unsigned>(cpus->last())};
        _housekeeping = *cpus - _isolated;
        // A run killed by a timeout left its journal: put the host back first.
        auto left = restore(_fs, _tasks);
        ASSERT_TRUE(left) << left.err().message;
        if (left->journal_found) {
            std::fprintf(stderr, "host_real: restored a journal left by an earlier run (%zu items)\n",
                         left->items.size());
        }
        ASSERT_TRUE(left->complete);
        _opts.isolation.cgroup_prefix = prefix;
        _armed = true;
    }
    void TearDown() override {
        if (!_armed) {
            return;
        }
        auto r = restore(_fs, _tasks);  // idempotent; a no-op after a passing test
        if (!r || !r->complete) {
            ADD_FAILURE() << "TearDown restore did not complete: "
                          << (r ? (r->lines.empty() ? "" : r->lines.back()) : r.err().message);
        }
    }
    void expect_restored(const host_snapshot& before) {
        const auto after = take_snapshot(_fs, _tasks);
        std::vector<std::string> tolerated;
        const auto diff = differences(before, after, _housekeeping, tolerated);
        for (const auto& t : tolerated) {
            std::fprintf(stderr, "host_real: note (changed by someone else meanwhile): %s\n", t.c_str());
        }
        EXPECT_TRUE(diff.empty()) << diff.size() << " differences, first: " << diff.front();
        EXPECT_FALSE(fs::exists(journal_dir / "host-journal"));
    }

    rtcore::host_fs _fs = rtcore::host_fs::system();
    rtcore::real_task_ops _tasks;
    cpu_set _isolated;
    cpu_set _housekeeping;
    hp::apply_options _opts;
    bool _armed = false;
};

}  // namespace

TEST_F(host_real, apply_changes_irqs_and_cpusets_and_restore_puts_back_every_byte) {
    const auto before = take_snapshot(_fs, _tasks);
    auto rep = apply(_fs, _tasks, _isolated, _housekeeping, _opts);
    ASSERT_TRUE(rep) << rep.err().message;
    for (const auto& l : rep->lines) {
        if (l.find(": pinned ") == std::string::npos) {
            std::fprintf(stderr, "  %s\n", l.c_str());
        }
    }

    // IRQs really moved (managed and refused ones excepted).
    std::size_t checked = 0;
    for (const auto& o : rep->irqs.irqs) {
        if (o.act == rtcore::irq_outcome::action::pinned) {
            auto now = _fs.read_line("/proc/irq/" + std::to_string(o.irq) + "/smp_affinity_list");
            ASSERT_TRUE(now);
            auto s = cpu_set::parse_list(*now);
            ASSERT_TRUE(s);
            EXPECT_FALSE(s->intersects(_isolated)) << o.line() << " reads " << *now;
            ++checked;
        }
    }
    EXPECT_GT(checked, 0U) << "no IRQ was pinned";
    auto dflt = cpu_set::parse_mask(*_fs.read_line("/proc/irq/default_smp_affinity"));
    ASSERT_TRUE(dflt);
    EXPECT_EQ(*dflt, _housekeeping);

    // The cpuset really exists and holds us.
    if (rep->isolation.method == rtcore::isolation_method::cgroup_v1_cpuset) {
        const auto root = rtcore::find_cgroup_mounts(_fs).v1_cpuset_root;
        EXPECT_EQ(*_fs.read_line(root + "/" + prefix + "-isolated/cpuset.cpus"), _isolated.to_list());
        EXPECT_EQ(*_fs.read_line(root + "/" + prefix + "-housekeeping/cpuset.cpus"), _housekeeping.to_list());
        EXPECT_EQ(*_fs.read_line(root + "/cpuset.sched_load_balance"), "0");
        EXPECT_EQ(*_fs.read_line("/proc/self/cpuset"), std::string("/") + prefix + "-housekeeping");
        auto self = _tasks.affinity(::getpid());
        ASSERT_TRUE(self);
        EXPECT_EQ(*self, _housekeeping);
        EXPECT_GT(rep->isolation.tasks_moved, 0U);
    } else {
        std::fprintf(stderr, "host_real: isolation used %s\n", rtcore::to_string(rep->isolation.method));
    }

    auto v = verify(_fs, _tasks, _opts);
    ASSERT_TRUE(v) << v.err().message;
    EXPECT_EQ(v->irqs.count(rtcore::irq_outcome::action::repinned), 0U);
    EXPECT_EQ(v->isolation.isolated_cgroup, rep->isolation.isolated_cgroup);

    auto back = restore(_fs, _tasks);
    ASSERT_TRUE(back) << back.err().message;
    for (const auto& l : back->lines) {
        if (l.find("FAILED") != std::string::npos) {
            std::fprintf(stderr, "  %s\n", l.c_str());
        }
    }
    EXPECT_TRUE(back->complete) << back->lines.back();
    EXPECT_TRUE(back->journal_removed);
    expect_restored(before);
}

TEST_F(host_real, restore_after_the_applying_process_was_killed_puts_back_every_byte) {
    const auto before = take_snapshot(_fs, _tasks);
    // Killed after the cgroups exist and a few tasks moved (or a few fenced).
    for (unsigned kill_at : {6U, 1000000U}) {
        SCOPED_TRACE("kill at change " + std::to_string(kill_at));
        const pid_t child = ::fork();
        ASSERT_GE(child, 0);
        if (child == 0) {
            rtcore::host_fs fs = rtcore::host_fs::system();
            killing_task_ops tasks(kill_at);
            auto r = apply(fs, tasks, _isolated, _housekeeping, _opts);
            if (r) {
                ::kill(::getpid(), SIGKILL);  // applied fully: die without restoring
            }
            ::_exit(2);
        }
        int wstatus = 0;
        ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
        ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << "child status " << wstatus;
        ASSERT_TRUE(fs::exists(journal_dir / "host-journal"));
        // The host really is changed now.
        auto dflt = cpu_set::parse_mask(*_fs.read_line("/proc/irq/default_smp_affinity"));
        ASSERT_TRUE(dflt);
        EXPECT_EQ(*dflt, _housekeeping);

        auto back = restore(_fs, _tasks);
        ASSERT_TRUE(back) << back.err().message;
        EXPECT_TRUE(back->complete) << back->lines.back();
        expect_restored(before);
    }
}

// The root boundary: later applies trusted a journal whose partition had drifted (a
// restore helper that stopped half way put the IRQs back on every CPU).
// apply now checks the journal against the host and re-pins.
TEST_F(host_real, apply_over_a_journal_whose_irqs_drifted_back_re_pins_them) {
    const auto before = take_snapshot(_fs, _tasks);
    auto rep = apply(_fs, _tasks, _isolated, _housekeeping, _opts);
    ASSERT_TRUE(rep) << rep.err().message;
    // Every pinned IRQ and the default mask back on all CPUs, as a
    // half-finished restore leaves them.
    std::vector<unsigned> drifted;
    for (const auto& o : rep->irqs.irqs) {
        if (o.act == rtcore::irq_outcome::action::pinned &&
            _fs.write("/proc/irq/" + std::to_string(o.irq) + "/smp_affinity_list", o.before)) {
            drifted.push_back(o.irq);
        }
    }
    ASSERT_FALSE(drifted.empty()) << "no IRQ could be moved back";
    ASSERT_TRUE(_fs.write("/proc/irq/default_smp_affinity", rep->irqs.default_before));
    auto again = apply(_fs, _tasks, _isolated, _housekeeping, _opts);
    ASSERT_TRUE(again) << again.err().message;
    EXPECT_TRUE(again->continued_journal);
    ASSERT_FALSE(again->drift.empty()) << "apply trusted the journal and said nothing";
    for (unsigned irq : drifted) {
        auto now = cpu_set::parse_list(*_fs.read_line("/proc/irq/" + std::to_string(irq) + "/smp_affinity_list"));
        ASSERT_TRUE(now);
        EXPECT_FALSE(now->intersects(_isolated)) << "irq " << irq << " was not re-pinned";
    }
    auto dflt = cpu_set::parse_mask(*_fs.read_line("/proc/irq/default_smp_affinity"));
    ASSERT_TRUE(dflt);
    EXPECT_EQ(*dflt, _housekeeping);
    auto back = restore(_fs, _tasks);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_TRUE(back->complete) << back->lines.back();
    expect_restored(before);
}

// Runtime isolation at parity with tuned's cpu-partitioning profile: unbound
// kworkers ran on the isolated CPU because nothing set the
// workqueue cpumask.  apply sets it (and the writeback workqueue's) to the
// housekeeping CPUs; restore puts back the exact bytes.
TEST_F(host_real, apply_sets_the_workqueue_cpumasks_to_housekeeping_and_restore_puts_back_the_exact_bytes) {
    const std::string global = "/sys/devices/virtual/workqueue/cpumask";
    const std::string writeback = "/sys/devices/virtual/workqueue/writeback/cpumask";
    if (!_fs.exists(global)) {
        GTEST_SKIP() << global << " does not exist: this kernel has no workqueue cpumask (before 4.2)";
    }
    const auto before = take_snapshot(_fs, _tasks);
    auto rep = apply(_fs, _tasks, _isolated, _housekeeping, _opts);
    ASSERT_TRUE(rep) << rep.err().message;
    for (const auto& l : rep->knobs.lines) {
        std::fprintf(stderr, "  %s\n", l.c_str());
    }
    for (const auto& p : {global, writeback}) {
        if (!_fs.exists(p)) {
            continue;
        }
        auto now = _fs.read_line(p);
        ASSERT_TRUE(now) << now.err().message;
        auto mask = cpu_set::parse_mask(*now);
        ASSERT_TRUE(mask) << p << " reads " << *now;
        EXPECT_EQ(*mask, _housekeeping) << p << " reads " << *now;
    }
    EXPECT_EQ(*_fs.read_line("/proc/sys/vm/stat_interval"), "10");
    EXPECT_EQ(*_fs.read_line("/proc/sys/kernel/timer_migration"), "0");
    EXPECT_EQ(*_fs.read_line("/proc/sys/kernel/watchdog_cpumask"), _housekeeping.to_list());
    EXPECT_EQ(rep->knobs.count(rtcore::knob_outcome::action::failed), 0U);
    // Kernel threads that may move are off the isolated CPU.
    EXPECT_EQ(rep->knobs.kthreads.failed, 0U) << rep->knobs.kthreads.failure;
    if (auto all = _tasks.list_tasks(_fs)) {
        for (const auto& t : *all) {
            auto aff = _tasks.affinity(t.tid);
            if (t.kernel_thread && !t.per_cpu && aff) {
                EXPECT_FALSE(aff->intersects(_isolated)) << t.comm << " (" << t.tid << ") " << aff->to_list();
            }
        }
    }
    auto v = verify(_fs, _tasks, _opts);
    ASSERT_TRUE(v) << v.err().message;
    EXPECT_FALSE(v->knobs.drift);

    auto back = restore(_fs, _tasks);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_TRUE(back->complete) << back->lines.back();
    for (const auto& p : knob_files(_fs)) {
        auto now = _fs.read(p);
        ASSERT_TRUE(now);
        EXPECT_EQ(*now, before.files.at(p)) << p;
    }
    expect_restored(before);
}
