// The root boundary on fake trees: what a root helper replays comes only
// from a directory nobody else can write, every record passes the restore
// allow-list, no write goes through a symlink, and a refused journal writes
// nothing at all.  Tests that need another owner (chown) skip
// without root.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "rtcore/host_partition.hpp"
#include "rtcore/journal_undo.hpp"
#include "rtcore/secure_dir.hpp"
#include "tree_fixture.hpp"

using namespace qrt_test;
using rtcore::journal_record;
namespace rec = rtcore::rec;
namespace hp = rtcore::host_partition;

namespace {

const char* const irq36 = "/proc/irq/36/smp_affinity_list";

std::string boot_id(const tree_copy& t) {
    std::string id = read_file(t.root() / "proc/sys/kernel/random/boot_id");
    while (!id.empty() && id.back() == '\n') {
        id.pop_back();
    }
    return id;
}

// A journal of this boot with a good checksum on every line, as a forger
// who can compute CRC-32 writes it.  The first record after the header
// restores IRQ 36 (which the test changes), so a restore that writes
// anything at all is seen.
void write_journal(const tree_copy& t, const std::vector<journal_record>& extra, mode_t mode = 0600) {
    std::string text = rtcore::journal_format(rec::header{2, boot_id(t), t.root().string()});
    text += rtcore::journal_format(rec::apply{{1}, {0}, rec::applier::run});
    text += rtcore::journal_format(rec::file{irq36, "0-1\n"});
    for (const auto& r : extra) {
        text += rtcore::journal_format(r);
    }
    fs::create_directories(t.journal_dir());
    fs::permissions(t.journal_dir(), fs::perms::owner_all, fs::perm_options::replace);
    write_file(t.journal(), text);
    ::chmod(t.journal().c_str(), mode);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(root_boundary, a_forged_record_naming_a_root_only_file_is_refused_and_nothing_is_written) {
    tree_copy t("vm2-v1");
    const fs::path secret = t.root() / "etc/qrt-secret";
    write_file(secret, "the admin's secret\n");
    ::chmod(secret.c_str(), 0600);
    write_journal(t, {rec::file{"/etc/qrt-secret", "owned\n"}});
    write_file(t.root() / "proc/irq/36/smp_affinity_list", "0\n");  // what restore would put back
    const auto before = snapshot(t.root());
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    auto r = restore_in(t, fs, tasks);
    ASSERT_FALSE(r) << "a journal naming /etc/qrt-secret was replayed";
    EXPECT_EQ(r.err().code, EPERM);
    const std::string& m = r.err().message;
    EXPECT_TRUE(contains(m, t.journal().string() + " line 4: record `file /etc/qrt-secret (6 bytes)`")) << m;
    EXPECT_TRUE(contains(m, "path /etc/qrt-secret is not on the restore allow-list")) << m;
    EXPECT_TRUE(contains(m, "the whole journal is refused and nothing was written")) << m;
    EXPECT_EQ(read_file(secret), "the admin's secret\n");
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "") << "a refused journal wrote something";
    EXPECT_TRUE(fs::exists(t.journal())) << "the evidence must stay";
    // apply refuses to continue it as well.
    auto a = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_FALSE(a);
    EXPECT_TRUE(contains(a.err().message, "/etc/qrt-secret is not on the restore allow-list")) << a.err().message;
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
}

TEST(root_boundary, every_path_kind_outside_the_allow_list_refuses_the_journal) {
    const std::vector<std::pair<journal_record, std::string>> forged = {
        {rec::file{"/sys/fs/cgroup/cpuset/cpuset.cpus", "0-1\n"}, "path /sys/fs/cgroup/cpuset/cpuset.cpus"},
        {rec::file{"/proc/irq/36/spurious", "x"}, "path /proc/irq/36/spurious"},
        {rec::file{"/proc/sys/kernel/core_pattern", "|/tmp/x"}, "path /proc/sys/kernel/core_pattern"},
        {rec::file{"/sys/devices/virtual/workqueue/cpumask", "1"}, "path /sys/devices/virtual/workqueue/cpumask"},
        {rec::ctl{"/sys/fs/cgroup/cpuset/cgroup.subtree_control", "memory"}, "controller \"memory\""},
        {rec::ctl{"/etc/cgroup.subtree_control", "cpuset"}, "path /etc/cgroup.subtree_control"},
        {rec::mkcg{"/sys/fs/cgroup/cpuset/system.slice", "/sys/fs/cgroup/cpuset"},
         "cgroup /sys/fs/cgroup/cpuset/system.slice"},
        {rec::mkcg{"/tmp/qrt-isolated", "/tmp"}, "cgroup /tmp/qrt-isolated"},
        {rec::cg{1, 1, "/etc", std::nullopt}, "cgroup /etc"},
        {rec::cg{1, 1, "/sys/fs/cgroup/cpuset/user.slice", std::nullopt}, "cgroup /sys/fs/cgroup/cpuset/user.slice"},
    };
    for (const auto& [r, why] : forged) {
        SCOPED_TRACE(rtcore::describe(r));
        tree_copy t("vm2-v1");
        write_journal(t, {r});
        write_file(t.root() / "proc/irq/36/smp_affinity_list", "0\n");
        const auto before = snapshot(t.root());
        rtcore::host_fs fs(t.root());
        rtcore::fake_task_ops tasks;
        add_vm2_tasks(tasks);
        auto out = restore_in(t, fs, tasks);
        ASSERT_FALSE(out);
        EXPECT_TRUE(contains(out.err().message, why)) << out.err().message;
        EXPECT_TRUE(contains(out.err().message, t.journal().string() + " line 4")) << out.err().message;
        EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
        EXPECT_EQ(tasks.mutations(), 0U);
    }
}

TEST(root_boundary, the_allow_list_admits_exactly_the_kernel_paths_qrtd_writes) {
    rtcore::restore_allow_list a{{"/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/unified"}, "qrt", false};
    for (const char* p : {"/proc/irq/default_smp_affinity", "/proc/irq/0/smp_affinity", "/proc/irq/123/smp_affinity_list",
                          "/sys/fs/cgroup/cpuset/cpuset.sched_load_balance",
                          "/sys/fs/cgroup/cpuset/qrt-isolated/cpuset.cpus",
                          "/sys/fs/cgroup/unified/qrt-isolated/cpuset.cpus.partition",
                          "/sys/fs/cgroup/cpuset/qrt-housekeeping/cpuset.mems"}) {
        EXPECT_TRUE(a.allows_file(p)) << p;
    }
    for (const char* p : {"/etc/shadow", "/proc/irq/default_smp_affinity/x", "/proc/irq/x1/smp_affinity",
                          "/proc/irq//smp_affinity", "/proc/irq/1/2/smp_affinity", "/sys/fs/cgroup/cpuset/cpuset.cpus",
                          "/sys/fs/cgroup/cpuset/qrt-isolated/tasks", "/sys/fs/cgroup/cpuset/qrt-other/cpuset.cpus",
                          "/sys/fs/cgroup/cpuset/x/qrt-isolated/cpuset.cpus", "/sys/fs/cgroup/memory/cpuset.sched_load_balance",
                          "/sys/devices/virtual/workqueue/cpumask", "/sys/bus/workqueue/devices/writeback/cpumask"}) {
        EXPECT_FALSE(a.allows_file(p)) << p;
    }
    // The hook for the workqueue knobs: their canonical paths, once enabled.
    a.workqueue_cpumasks = true;
    EXPECT_TRUE(a.allows_file("/sys/devices/virtual/workqueue/cpumask"));
    EXPECT_TRUE(a.allows_file("/sys/devices/virtual/workqueue/writeback/cpumask"));
    EXPECT_FALSE(a.allows_file("/sys/bus/workqueue/devices/writeback/cpumask")) << "a symlink, not canonical";
    // The prefix is the configured one.
    a.cgroup_prefix = "qrt-it";
    EXPECT_FALSE(a.is_qrt_cgroup("/sys/fs/cgroup/cpuset/qrt-isolated"));
    EXPECT_TRUE(a.is_qrt_cgroup("/sys/fs/cgroup/cpuset/qrt-it-isolated"));
}

TEST(root_boundary, apply_never_journals_what_restore_would_refuse) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j) << j.err().message;
    const auto size = j->size();
    auto st = j->append(rec::file{"/etc/motd", "hello\n"});
    ASSERT_FALSE(st);
    EXPECT_TRUE(contains(st.err().message, "would not be restorable: path /etc/motd is not on the restore allow-list"))
        << st.err().message;
    EXPECT_EQ(j->size(), size);
    EXPECT_FALSE(contains(read_file(t.journal()), "motd"));
}

TEST(root_boundary, a_symlink_planted_where_restore_writes_is_refused_before_any_write) {
    tree_copy t("vm2-v1");
    const fs::path target = t.base() / "not-a-kernel-file";
    write_file(target, "untouched\n");
    write_journal(t, {rec::file{"/proc/irq/41/smp_affinity_list", "0-1\n"}});
    write_file(t.root() / "proc/irq/36/smp_affinity_list", "0\n");
    // IRQ 41's directory replaced by a symlink to a directory the attacker chose.
    const fs::path decoy = t.base() / "decoy";
    write_file(decoy / "smp_affinity_list", "0\n");
    fs::remove_all(t.root() / "proc/irq/41");
    fs::create_directory_symlink(decoy, t.root() / "proc/irq/41");
    const auto before = snapshot(t.root());
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    auto r = restore_in(t, fs, tasks);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, ELOOP);
    EXPECT_TRUE(contains(r.err().message, "/proc/irq/41 is a symlink; refused")) << r.err().message;
    EXPECT_TRUE(contains(r.err().message, t.journal().string() + " line 4")) << r.err().message;
    EXPECT_EQ(read_file(decoy / "smp_affinity_list"), "0\n");
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0\n") << "IRQ 36 was written before the refusal";
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    // The write path refuses it on its own too.
    auto w = fs.write("/proc/irq/41/smp_affinity_list", "1");
    ASSERT_FALSE(w);
    EXPECT_EQ(w.err().code, ELOOP);
    EXPECT_EQ(read_file(decoy / "smp_affinity_list"), "0\n");
    // And a symlink as the last component.
    fs::remove(t.root() / "proc/irq/41");
    fs::create_directories(t.root() / "proc/irq/41");
    fs::create_symlink(target, t.root() / "proc/irq/41/smp_affinity_list");
    auto w2 = fs.write("/proc/irq/41/smp_affinity_list", "1");
    ASSERT_FALSE(w2);
    EXPECT_EQ(w2.err().code, ELOOP);
    EXPECT_EQ(read_file(target), "untouched\n");
}

TEST(root_boundary, a_symlinked_journal_or_journal_directory_is_refused_and_its_target_untouched) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    const fs::path target = t.base() / "precious";
    write_file(target, "do not truncate\n");
    fs::create_directories(t.journal_dir());
    fs::permissions(t.journal_dir(), fs::perms::owner_all, fs::perm_options::replace);
    fs::create_symlink(target, t.journal());
    auto a = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_FALSE(a);
    EXPECT_TRUE(contains(a.err().message, t.journal().string() + " is a symlink; refused")) << a.err().message;
    auto r = restore_in(t, fs, tasks);
    ASSERT_FALSE(r);
    EXPECT_TRUE(contains(r.err().message, "is a symlink")) << r.err().message;
    EXPECT_EQ(read_file(target), "do not truncate\n");

    tree_copy u("vm2-v1");
    const fs::path real_dir = u.base() / "elsewhere";
    fs::create_directories(real_dir);
    fs::permissions(real_dir, fs::perms::owner_all, fs::perm_options::replace);
    fs::create_directory_symlink(real_dir, u.journal_dir());
    auto d = rtcore::journal_dir::open(u.journal_dir(), {});
    ASSERT_FALSE(d);
    EXPECT_TRUE(contains(d.err().message, "journal directory " + u.journal_dir().string() +
                                              " is a symlink or not a directory; refused"))
        << d.err().message;
    EXPECT_TRUE(fs::is_empty(real_dir)) << "no lock file may appear behind the symlink";
}

TEST(root_boundary, a_group_or_other_writable_journal_or_directory_is_refused_naming_owner_mode_and_fix) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    write_journal(t, {}, 0620);
    write_file(t.root() / "proc/irq/36/smp_affinity_list", "0\n");
    auto r = restore_in(t, fs, tasks);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, EPERM);
    EXPECT_TRUE(contains(r.err().message, "file " + t.journal().string() + " has mode 0620")) << r.err().message;
    EXPECT_TRUE(contains(r.err().message, "fix: chown")) << r.err().message;
    EXPECT_TRUE(contains(r.err().message, "chmod 0600 " + t.journal().string())) << r.err().message;
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0\n");

    ::chmod(t.journal().c_str(), 0600);
    ::chmod(t.journal_dir().c_str(), 0770);
    auto d = rtcore::journal_dir::open(t.journal_dir(), {});
    ASSERT_FALSE(d);
    EXPECT_TRUE(contains(d.err().message, "journal directory " + t.journal_dir().string() + " has mode 0770"))
        << d.err().message;
    EXPECT_TRUE(contains(d.err().message, "chmod 0700 " + t.journal_dir().string())) << d.err().message;

    // A parent others may write, without the sticky bit, could have the
    // directory renamed away: refused too.  (/tmp is sticky: accepted.)
    ::chmod(t.journal_dir().c_str(), 0700);
    ::chmod(t.base().c_str(), 0777);
    auto p = rtcore::journal_dir::open(t.journal_dir(), {});
    ::chmod(t.base().c_str(), 0755);
    ASSERT_FALSE(p);
    EXPECT_TRUE(contains(p.err().message, "its parent " + t.base().string() + " has mode 0777")) << p.err().message;
}

TEST(root_boundary, a_journal_or_directory_owned_by_another_user_is_refused) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to give a file to another uid";
    }
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    write_journal(t, {});
    write_file(t.root() / "proc/irq/36/smp_affinity_list", "0\n");
    ASSERT_EQ(::chown(t.journal().c_str(), 4242, 4242), 0);
    auto r = restore_in(t, fs, tasks);
    ASSERT_FALSE(r);
    EXPECT_TRUE(contains(r.err().message, "file " + t.journal().string() + " is owned by uid 4242")) << r.err().message;
    EXPECT_TRUE(contains(r.err().message, "must belong to uid 0")) << r.err().message;
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0\n");

    ASSERT_EQ(::chown(t.journal().c_str(), 0, 0), 0);
    ASSERT_EQ(::chown(t.journal_dir().c_str(), 4242, 4242), 0);
    auto d = rtcore::journal_dir::open(t.journal_dir(), {});
    ASSERT_FALSE(d);
    EXPECT_TRUE(contains(d.err().message, "journal directory " + t.journal_dir().string() + " is owned by uid 4242"))
        << d.err().message;
    EXPECT_TRUE(contains(d.err().message, "with mode 0700")) << d.err().message;
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0\n");
}

TEST(root_boundary, a_hard_linked_or_special_file_in_the_journal_directory_is_refused_without_blocking) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    write_journal(t, {});
    ASSERT_EQ(::link(t.journal().c_str(), (t.base() / "second-name").c_str()), 0);
    auto r = restore_in(t, fs, tasks);
    ASSERT_FALSE(r);
    EXPECT_TRUE(contains(r.err().message, "has 2 hard links; refused")) << r.err().message;
    fs::remove(t.base() / "second-name");
    // A FIFO where the lock is: an open would block forever; it is refused.
    fs::remove(t.journal_dir() / "host.lock");
    ASSERT_EQ(::mkfifo((t.journal_dir() / "host.lock").c_str(), 0600), 0);
    auto d = rtcore::journal_dir::open(t.journal_dir(), {});
    ASSERT_FALSE(d);
    EXPECT_TRUE(contains(d.err().message, "host.lock is not a regular file (mode 0600, type FIFO)"))
        << d.err().message;
}

TEST(root_boundary, a_version_1_journal_or_one_for_another_tree_is_never_replayed) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    std::string v1 = rtcore::journal_format(rec::header{1, boot_id(t), ""});
    v1 += "00000000 apply 1 0\n";
    fs::create_directories(t.journal_dir());
    fs::permissions(t.journal_dir(), fs::perms::owner_all, fs::perm_options::replace);
    write_file(t.journal(), v1);
    ::chmod(t.journal().c_str(), 0600);
    auto r = restore_in(t, fs, tasks);
    ASSERT_FALSE(r);
    EXPECT_TRUE(contains(r.err().message, "is a version-1 journal; this qrtd reads version 2 only")) << r.err().message;

    std::string other = rtcore::journal_format(rec::header{2, boot_id(t), "/somewhere/else"});
    other += rtcore::journal_format(rec::file{irq36, "0-1\n"});
    write_file(t.journal(), other);
    write_file(t.root() / "proc/irq/36/smp_affinity_list", "0\n");
    auto o = restore_in(t, fs, tasks);
    ASSERT_FALSE(o);
    EXPECT_TRUE(contains(o.err().message, "was written for the tree at /somewhere/else")) << o.err().message;
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0\n");
}

TEST(root_boundary, a_second_lock_holder_waits_and_is_named) {
    tree_copy t("vm2-v1");
    rtcore::journal_dir::options first;
    first.holder = "pid 1: the first holder";
    auto a = rtcore::journal_dir::open(t.journal_dir(), first);
    ASSERT_TRUE(a) << a.err().message;
    rtcore::journal_dir::options second;
    second.wait.max = std::chrono::milliseconds(300);
    auto b = rtcore::journal_dir::open(t.journal_dir(), second);
    ASSERT_FALSE(b);
    EXPECT_EQ(b.err().code, EWOULDBLOCK);
    EXPECT_TRUE(contains(b.err().message, "host.lock is held by pid 1: the first holder")) << b.err().message;
    a->release_lock();
    auto c = rtcore::journal_dir::open(t.journal_dir(), second);
    ASSERT_TRUE(c) << c.err().message;
}

// The one "check a directory and take its lock" (the daemon's state
// directory uses it with its remedies): each failure names the path, what
// is wrong, and the caller's remedy for that case.
TEST(root_boundary, a_locked_directory_names_the_path_the_problem_and_the_callers_remedy) {
    tree_copy t("vm2-v1");
    rtcore::locked_dir_options o;
    o.what = "state directory";
    o.policy = rtcore::dir_policy::any_owner;
    o.must_write = true;
    o.lock_name = "qrtd.lock";
    o.if_missing = "; REMEDY-MISSING";
    o.if_not_writable = "; REMEDY-WRITE";
    o.if_held = ": REMEDY-HELD";

    auto missing = rtcore::open_locked_dir(t.base() / "no-such-dir", o);
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.err().code, ENOENT);
    EXPECT_EQ(missing.err().message, "state directory " + (t.base() / "no-such-dir").string() +
                                         ": No such file or directory; REMEDY-MISSING");

    auto first = rtcore::open_locked_dir(t.state(), o);
    ASSERT_TRUE(first) << first.err().message;
    auto second = rtcore::open_locked_dir(t.state(), o);
    ASSERT_FALSE(second);
    EXPECT_EQ(second.err().code, EWOULDBLOCK);
    EXPECT_EQ(second.err().message,
              (t.state() / "qrtd.lock").string() + " is held by another process: REMEDY-HELD");
    first->lock.release();

    if (::geteuid() != 0) {
        GTEST_SKIP() << "the not-writable case needs root to become another user";
    }
    // A directory root owns (0755), opened by user nobody: refused before the
    // lock, naming owner and mode.  In a child, which becomes nobody.
    const fs::path root_owned = t.base() / "root-owned";
    fs::create_directory(root_owned);
    ASSERT_EQ(::chmod(t.base().c_str(), 0755), 0);
    ASSERT_EQ(::chmod(root_owned.c_str(), 0755), 0);
    int pipefd[2];
    ASSERT_EQ(::pipe(pipefd), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        ::close(pipefd[0]);  // after fork, in the child
        int code = 1;
        if (::setresgid(65534, 65534, 65534) == 0 && ::setresuid(65534, 65534, 65534) == 0) {
            auto r = rtcore::open_locked_dir(root_owned, o);
            const std::string msg = r ? std::string("opened") : r.err().message;
            code = ::write(pipefd[1], msg.data(), msg.size()) == static_cast<ssize_t>(msg.size()) ? 0 : 1;
        }
        ::_exit(code);
    }
    ::close(pipefd[1]);
    std::string msg;
    char buf[1024];
    for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof buf)) > 0;) {
        msg.append(buf, static_cast<std::size_t>(n));
    }
    ::close(pipefd[0]);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not become nobody";
    EXPECT_EQ(msg, "state directory " + root_owned.string() + " (owner " + rtcore::secure_dir::describe_owner(0) +
                       ", mode 0755): " + rtcore::secure_dir::describe_owner(65534) +
                       " cannot write in it (Permission denied); REMEDY-WRITE");
    EXPECT_FALSE(fs::exists(root_owned / "qrtd.lock")) << "nothing is created in a refused directory";
}

// ------------------------------------------------------------ never trusted blindly

TEST(root_boundary, apply_over_a_journal_whose_irqs_drifted_back_re_pins_them_instead_of_trusting_it) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    ASSERT_TRUE(apply_in(t, fs, tasks, {1}, {0}));
    // What a half-finished restore leaves: IRQs and the default mask back on every CPU.
    for (const char* irq : {"24", "26", "36", "41"}) {
        write_file(t.root() / "proc/irq" / irq / "smp_affinity_list", "0-1\n");
    }
    write_file(t.root() / "proc/irq/default_smp_affinity", "3\n");
    auto again = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_TRUE(again) << again.err().message;
    EXPECT_TRUE(again->continued_journal);
    EXPECT_FALSE(again->rebuilt);
    ASSERT_EQ(again->drift.size(), 2U);
    EXPECT_EQ(again->drift[0], "4 IRQs had drifted back onto CPUs 1 and 0 new ones reached them: pinned to CPUs 0");
    EXPECT_EQ(again->drift[1], "default_smp_affinity was 3: set to 00000001");
    for (const char* irq : {"24", "26", "36", "41"}) {
        EXPECT_EQ(read_file(t.root() / "proc/irq" / irq / "smp_affinity_list"), "0") << irq;
    }
    EXPECT_EQ(read_file(t.root() / "proc/irq/default_smp_affinity"), "00000001");
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back);
    EXPECT_TRUE(back->complete);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "") << "the first originals were not kept";
}

TEST(root_boundary, apply_over_a_journal_whose_cgroups_are_gone_restores_it_and_applies_afresh) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    const auto tasks_before = task_states(tasks);
    ASSERT_TRUE(apply_in(t, fs, tasks, {1}, {0}));
    // A restore that stopped half way: the isolated cpuset removed (its
    // tasks back in the root), the root balancing again, IRQs back.
    for (const auto& [tid, ft] : tasks.tasks()) {
        if (ft.cgroup != v1_root) {
            ASSERT_TRUE(tasks.attach(fs, v1_root, tid));
        }
    }
    ASSERT_TRUE(tasks.remove_cgroup(fs, "/sys/fs/cgroup/cpuset/qrt-isolated"));
    write_file(t.root() / "sys/fs/cgroup/cpuset/cpuset.sched_load_balance", "1\n");
    write_file(t.root() / "proc/irq/36/smp_affinity_list", "0-1\n");
    auto again = apply_in(t, fs, tasks, {1}, {0});
    ASSERT_TRUE(again) << again.err().message;
    EXPECT_TRUE(again->rebuilt);
    ASSERT_FALSE(again->drift.empty());
    EXPECT_TRUE(contains(again->drift[0], "its cgroup /sys/fs/cgroup/cpuset/qrt-isolated is gone")) << again->drift[0];
    EXPECT_EQ(again->isolation.method, rtcore::isolation_method::cgroup_v1_cpuset);
    EXPECT_EQ(read_file(t.root() / "sys/fs/cgroup/cpuset/qrt-isolated/cpuset.cpus"), "1");
    EXPECT_EQ(read_file(t.root() / "sys/fs/cgroup/cpuset/cpuset.sched_load_balance"), "0");
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0");
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back);
    EXPECT_TRUE(back->complete);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_TRUE(task_states(tasks) == tasks_before);
}

TEST(root_boundary, apply_with_other_cpus_than_the_journal_restores_that_partition_first) {
    tree_copy t("host8-v2");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, rtcore::cpu_set::first_n(8));
    const auto before = snapshot(t.root());
    ASSERT_TRUE(apply_in(t, fs, tasks, {6, 7}, {0, 1, 2, 3, 4, 5}));
    auto again = apply_in(t, fs, tasks, {4, 5, 6, 7}, {0, 1, 2, 3});
    ASSERT_TRUE(again) << again.err().message;
    EXPECT_TRUE(again->rebuilt);
    EXPECT_TRUE(contains(again->drift.at(0), "it isolates CPUs 6-7 (housekeeping 0-5) and this apply asks for 4-7"))
        << again->drift.at(0);
    EXPECT_EQ(read_file(t.root() / "sys/fs/cgroup/qrt-isolated/cpuset.cpus"), "4-7");
    auto back = restore_in(t, fs, tasks);
    ASSERT_TRUE(back);
    EXPECT_TRUE(back->complete);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
}

// The crash case of the root boundary: a restore whose rmdir meets tasks still leaving the
// cgroup (EBUSY) retries instead of leaving a half-restored host.
TEST(root_boundary, restore_retries_an_rmdir_that_is_busy_for_a_moment) {
    class busy_twice final : public rtcore::task_ops {
    public:
        explicit busy_twice(rtcore::fake_task_ops& real) : _real(real) {}
        rtcore::result<std::vector<rtcore::task_info>> list_tasks(const rtcore::host_fs& f) override {
            return _real.list_tasks(f);
        }
        rtcore::result<rtcore::task_info> task(const rtcore::host_fs& f, pid_t tid) override { return _real.task(f, tid); }
        rtcore::result<uid_t> real_uid(const rtcore::host_fs& f, pid_t tid) override { return _real.real_uid(f, tid); }
        rtcore::result<rtcore::cpu_set> affinity(pid_t tid) override { return _real.affinity(tid); }
        rtcore::status set_affinity(pid_t tid, const rtcore::cpu_set& c) override { return _real.set_affinity(tid, c); }
        rtcore::result<std::vector<pid_t>> cgroup_tasks(const rtcore::host_fs& f, std::string_view d) override {
            return _real.cgroup_tasks(f, d);
        }
        rtcore::status attach(rtcore::host_fs& f, std::string_view d, pid_t tid) override { return _real.attach(f, d, tid); }
        rtcore::status make_cgroup(rtcore::host_fs& f, std::string_view d) override { return _real.make_cgroup(f, d); }
        rtcore::status remove_cgroup(rtcore::host_fs& f, std::string_view d) override {
            if (++busy <= 2) {
                return rtcore::error::from_errno(EBUSY, "rmdir " + std::string(d));
            }
            return _real.remove_cgroup(f, d);
        }
        int busy = 0;

    private:
        rtcore::fake_task_ops& _real;
    };
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_vm2_tasks(tasks);
    const auto before = snapshot(t.root());
    ASSERT_TRUE(apply_in(t, fs, tasks, {1}, {0}));
    busy_twice flaky(tasks);
    auto back = restore_in(t, fs, flaky);
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_TRUE(back->complete) << back->lines.back();
    EXPECT_GE(flaky.busy, 3);
    bool said = false;
    for (const auto& it : back->items) {
        said = said || contains(it.detail, "(busy for 100 ms first)");
    }
    EXPECT_TRUE(said);
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
}
