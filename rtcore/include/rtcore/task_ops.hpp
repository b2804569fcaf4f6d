#pragma once
// The seam for per-task kernel calls: listing threads, their CPU affinity
// (sched_getaffinity / sched_setaffinity) and their cgroup membership.
//
//   real_task_ops   the host: /proc through host_fs, sched_*affinity(2),
//                   cgroup files ("tasks" in v1, "cgroup.threads" in v2)
//   fake_task_ops   an in-memory task table for unit tests; it also stands
//                   for cgroupfs on a fake tree (mkdir fills in the control
//                   files the kernel would create, rmdir removes them, and
//                   attaching a task to a v1 cpuset sets its affinity to the
//                   cpuset's CPUs, as the kernel does).
//
// A thread is named by its tid plus its start time in clock ticks since boot
// (field 22 of /proc/<tid>/stat), so a journal entry never touches a thread
// that merely reused the tid.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"

namespace rtcore {

struct task_info {
    pid_t tid = 0;
    pid_t tgid = 0;
    std::uint64_t start_ticks = 0;
    std::string comm;
    bool kernel_thread = false;
    // PF_NO_SETAFFINITY: the kernel fixes its affinity (per-CPU kthreads,
    // kworkers); sched_setaffinity would fail with EINVAL.
    bool per_cpu = false;
};

class task_ops {
public:
    virtual ~task_ops() = default;

    // Every thread on the host.  Threads that exit while listing are left out.
    virtual result<std::vector<task_info>> list_tasks(const host_fs& fs) = 0;
    // One thread; error ESRCH when it is gone.
    virtual result<task_info> task(const host_fs& fs, pid_t tid) = 0;

    // The real uid of a thread (the first field of "Uid:" in
    // /proc/<tid>/status); error ESRCH when it is gone.
    virtual result<uid_t> real_uid(const host_fs& fs, pid_t tid) = 0;

    virtual result<cpu_set> affinity(pid_t tid) = 0;
    virtual status set_affinity(pid_t tid, const cpu_set& cpus) = 0;

    // cgroup membership.  dir is a host path of a cgroup directory.
    virtual result<std::vector<pid_t>> cgroup_tasks(const host_fs& fs, std::string_view dir) = 0;
    virtual status attach(host_fs& fs, std::string_view dir, pid_t tid) = 0;
    virtual status make_cgroup(host_fs& fs, std::string_view dir) = 0;
    virtual status remove_cgroup(host_fs& fs, std::string_view dir) = 0;
};

// The threads of a cgroup are listed in "tasks" (v1) or "cgroup.threads" (v2).
std::string cgroup_tasks_file(const host_fs& fs, std::string_view dir);

class real_task_ops final : public task_ops {
public:
    result<std::vector<task_info>> list_tasks(const host_fs& fs) override;
    result<task_info> task(const host_fs& fs, pid_t tid) override;
    result<uid_t> real_uid(const host_fs& fs, pid_t tid) override;
    result<cpu_set> affinity(pid_t tid) override;
    status set_affinity(pid_t tid, const cpu_set& cpus) override;
    result<std::vector<pid_t>> cgroup_tasks(const host_fs& fs, std::string_view dir) override;
    status attach(host_fs& fs, std::string_view dir, pid_t tid) override;
    status make_cgroup(host_fs& fs, std::string_view dir) override;
    status remove_cgroup(host_fs& fs, std::string_view dir) override;
};

// Parses one /proc/<tid>/stat line (the comm may hold spaces and ')').
result<task_info> parse_proc_stat(std::string_view stat_line);

class fake_task_ops final : public task_ops {
public:
    struct fake_task {
        task_info info;
        cpu_set affinity;
        std::string cgroup;          // v1 cpuset directory (host path)
        bool pinned_kthread = false; // PF_NO_SETAFFINITY: affinity and moves fail with EINVAL
        uid_t uid = 0;               // real uid
    };

    // Adds a task living in cgroup (a host path) with the given affinity.
    void add_task(pid_t tid, std::string comm, cpu_set affinity, std::string cgroup,
                  bool kernel_thread = false, bool pinned_kthread = false);
    void remove_task(pid_t tid) { _tasks.erase(tid); }
    // A thread of process tgid running as uid (add_task makes each task its
    // own process, owned by root).
    void set_owner(pid_t tid, pid_t tgid, uid_t uid) {
        _tasks.at(tid).info.tgid = tgid;
        _tasks.at(tid).uid = uid;
    }
    // Another thread on the same tid: the old one exited and the tid was reused.
    void reuse_tid(pid_t tid, std::uint64_t start_ticks) { _tasks.at(tid).info.start_ticks = start_ticks; }
    // A pinned kthread whose stat flags do not say so (the kernel still
    // refuses its affinity change with EINVAL).
    void clear_per_cpu_flag(pid_t tid) { _tasks.at(tid).info.per_cpu = false; }
    // The kernel binds a kernel thread after the fact (PF_NO_SETAFFINITY set
    // later, as for a workqueue rescuer once its cpumask changed).
    void bind_kthread(pid_t tid) {
        _tasks.at(tid).pinned_kthread = true;
        _tasks.at(tid).info.per_cpu = true;
    }
    const std::map<pid_t, fake_task>& tasks() const { return _tasks; }

    // Called before every mutating call with its running count (from 1);
    // tests use it to kill the process at a chosen point.
    std::function<void(unsigned)> before_mutation;
    unsigned mutations() const { return _mutations; }
    unsigned set_affinity_calls() const { return _set_affinity_calls; }

    result<std::vector<task_info>> list_tasks(const host_fs& fs) override;
    result<task_info> task(const host_fs& fs, pid_t tid) override;
    result<uid_t> real_uid(const host_fs& fs, pid_t tid) override;
    result<cpu_set> affinity(pid_t tid) override;
    status set_affinity(pid_t tid, const cpu_set& cpus) override;
    result<std::vector<pid_t>> cgroup_tasks(const host_fs& fs, std::string_view dir) override;
    status attach(host_fs& fs, std::string_view dir, pid_t tid) override;
    status make_cgroup(host_fs& fs, std::string_view dir) override;
    status remove_cgroup(host_fs& fs, std::string_view dir) override;

private:
    void mutation();

    std::map<pid_t, fake_task> _tasks;
    unsigned _mutations = 0;
    unsigned _set_affinity_calls = 0;
};

}  // namespace rtcore
