#pragma once
// Helpers for partition tests: a private copy of a fake tree, a state
// directory and a journal directory beside it, a recursive snapshot for
// byte-for-byte comparison, the fake tasks that live on each tree, and the
// host_partition calls with the tree's journal directory opened and locked
// for the call (as a command would).

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include "qrt_test/process.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/host_partition.hpp"
#include "rtcore/restore_journal.hpp"
#include "rtcore/task_ops.hpp"

namespace qrt_test {

namespace fs = std::filesystem;

// Path -> bytes for files, path -> "<dir>" for directories.
using tree_snapshot = std::map<std::string, std::string>;

inline tree_snapshot snapshot(const fs::path& root) {
    tree_snapshot out;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
        const auto rel = fs::relative(e.path(), root).string();
        if (e.is_directory()) {
            out[rel] = "<dir>";
        } else {
            std::ifstream in(e.path(), std::ios::binary);
            std::ostringstream ss;
            ss << in.rdbuf();
            out[rel] = ss.str();
        }
    }
    return out;
}

// Names the first difference, so a failure says what was left changed.
inline std::string first_difference(const tree_snapshot& a, const tree_snapshot& b) {
    for (const auto& [k, v] : a) {
        auto it = b.find(k);
        if (it == b.end()) {
            return k + " missing afterwards";
        }
        if (it->second != v) {
            return k + ": \"" + v + "\" became \"" + it->second + "\"";
        }
    }
    for (const auto& [k, v] : b) {
        if (a.count(k) == 0) {
            return k + " appeared";
        }
    }
    return "";
}

inline std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

inline void write_file(const fs::path& p, const std::string& s) {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << s;
}

// A copy of tests/data/trees/<name> and an empty state dir, both removed at the end.
class tree_copy {
public:
    explicit tree_copy(const std::string& name) {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        _base = fs::temp_directory_path() /
                ("qrt-partition-" + std::to_string(::getpid()) + "-" + info->test_suite_name() + "-" + info->name());
        fs::remove_all(_base);
        fs::create_directories(_base);
        fs::copy(fs::path(QRT_TREES_DIR) / name, _base / "root", fs::copy_options::recursive);
        fs::create_directories(_base / "state");
    }
    tree_copy(const tree_copy&) = delete;
    tree_copy& operator=(const tree_copy&) = delete;
    ~tree_copy() {
        std::error_code ec;
        fs::remove_all(_base, ec);
    }
    fs::path root() const { return _base / "root"; }
    fs::path state() const { return _base / "state"; }
    fs::path journal_dir() const { return _base / "journal"; }
    fs::path journal() const { return journal_dir() / "host-journal"; }
    fs::path base() const { return _base; }

    // The journal directory (created 0700 when missing), checked and locked
    // until the returned object dies.  A failure fails the test.
    rtcore::journal_dir jd() const {
        auto d = rtcore::journal_dir::open(journal_dir(), {});
        if (!d) {
            ADD_FAILURE() << "journal_dir::open: " << d.err().message;
            throw std::runtime_error(d.err().message);
        }
        return std::move(*d);
    }

private:
    fs::path _base;
};

// host_partition calls as a command makes them: the journal directory
// opened and locked for the call only.
inline rtcore::result<rtcore::host_partition::apply_report> apply_in(
    const tree_copy& t, rtcore::host_fs& fs, rtcore::task_ops& tasks, const rtcore::cpu_set& isolated,
    const rtcore::cpu_set& housekeeping, const rtcore::host_partition::apply_options& opts = {}) {
    const auto d = t.jd();
    return rtcore::host_partition::apply(fs, tasks, &d, isolated, housekeeping, opts);
}
// A crash mid-apply: apply_in in a child (qrt::testing::run_in_child) whose
// fake tasks come from add_tasks and which SIGKILLs itself just before
// mutation kill_at.  Returns the child's end (signal SIGKILL when it died
// there; exit status 3 when apply ran to its end).
inline qrt::testing::ran apply_killed_before_mutation(
    const tree_copy& t, const std::function<void(rtcore::fake_task_ops&)>& add_tasks,
    const rtcore::cpu_set& isolated, const rtcore::cpu_set& housekeeping, unsigned kill_at) {
    return qrt::testing::run_in_child([&](std::string&) {
        rtcore::host_fs fs(t.root());
        rtcore::fake_task_ops tasks;
        add_tasks(tasks);
        tasks.before_mutation = [kill_at](unsigned n) {
            if (n == kill_at) {
                ::kill(::getpid(), SIGKILL);
            }
        };
        (void)apply_in(t, fs, tasks, isolated, housekeeping);
        return 3;
    });
}
inline rtcore::result<rtcore::host_partition::restore_report> restore_in(const tree_copy& t, rtcore::host_fs& fs,
                                                                         rtcore::task_ops& tasks) {
    const auto d = t.jd();
    return rtcore::host_partition::restore(fs, tasks, &d);
}
inline rtcore::result<rtcore::host_partition::verify_report> verify_in(
    const tree_copy& t, rtcore::host_fs& fs, rtcore::task_ops& tasks,
    const rtcore::host_partition::apply_options& opts = {}) {
    const auto d = t.jd();
    return rtcore::host_partition::verify(fs, tasks, d, opts);
}
// The journal opened for appending, as apply opens it (allow-list of the tree).
inline rtcore::result<rtcore::restore_journal> open_journal(const tree_copy& t, const rtcore::host_fs& fs) {
    const auto d = t.jd();
    return rtcore::restore_journal::open(fs, d, rtcore::restore_allow_list::for_host(fs));
}
inline rtcore::result<rtcore::loaded_journal> load_journal(const tree_copy& t, const rtcore::host_fs& fs) {
    const auto d = t.jd();
    return rtcore::restore_journal::load(fs, d, rtcore::restore_allow_list::for_host(fs));
}
inline rtcore::result<rtcore::restore_outcome> restore_journal_in(const tree_copy& t, rtcore::host_fs& fs,
                                                                  rtcore::task_ops& tasks) {
    const auto d = t.jd();
    return rtcore::restore_from_journal(fs, tasks, d, rtcore::restore_allow_list::for_host(fs));
}

inline constexpr const char* v1_root = "/sys/fs/cgroup/cpuset";

// The tasks of vm2-v1: all in the v1 root cpuset.
inline void add_vm2_tasks(rtcore::fake_task_ops& t) {
    t.add_task(1, "systemd", {0, 1}, v1_root);
    t.add_task(2, "kthreadd", {0, 1}, v1_root, true);
    t.add_task(19, "ksoftirqd/1", {1}, v1_root, true, true);
    t.add_task(20, "migration/1", {1}, v1_root, true, true);
    t.add_task(400, "sshd", {0, 1}, v1_root);
    t.add_task(401, "pinned-app", {1}, v1_root);
    t.add_task(402, "cpu0-app", {0}, v1_root);
}

// The tasks of host8-v2 and host4-nocg: no v1 cpuset.
inline void add_plain_tasks(rtcore::fake_task_ops& t, const rtcore::cpu_set& all) {
    t.add_task(1, "systemd", all, "");
    t.add_task(2, "kthreadd", all, "", true);
    t.add_task(30, "ksoftirqd/3", {3}, "", true, true);
    t.add_task(500, "postgres", all, "");
    t.add_task(501, "pinned-app", {3}, "");
    t.add_task(502, "cpu0-app", {0}, "");
}

struct task_state {
    rtcore::cpu_set affinity;
    std::string cgroup;
    bool operator==(const task_state& o) const { return affinity == o.affinity && cgroup == o.cgroup; }
};

inline std::map<pid_t, task_state> task_states(const rtcore::fake_task_ops& t) {
    std::map<pid_t, task_state> out;
    for (const auto& [tid, ft] : t.tasks()) {
        out[tid] = task_state{ft.affinity, ft.cgroup};
    }
    return out;
}

}  // namespace qrt_test
