#pragma once
// Runtime isolation of the isolated CPUs, best method first:
//
//   cgroup-v2-partition  a child cgroup of the v2 root with cpuset.cpus =
//                        isolated and cpuset.cpus.partition = isolated: the
//                        kernel takes the CPUs out of every other cgroup and
//                        out of load balancing.  Needs the cpuset controller
//                        in the v2 hierarchy.
//   cgroup-v1-cpuset     <prefix>-isolated (cpus = isolated, mems = root mems,
//                        cpu_exclusive = 1, sched_load_balance = 0) and
//                        <prefix>-housekeeping (cpus = housekeeping) under the
//                        v1 cpuset root, root sched_load_balance = 0, and every
//                        movable task of the root moved to housekeeping (kernel
//                        threads that refuse are counted and left).
//   affinity-fence       every movable task's affinity loses the isolated CPUs.
//
// A cgroup method whose cgroup directory already exists without a mkcg record
// in this boot's journal (another tool's, or left by a run whose journal is
// gone) is not used: its files are never written and restore never removes
// it; the reason names the path.
//
// Each change is journaled before it is made.  A method that cannot be used
// says why; a method that fails half way is unwound (journal records since
// its start) and the next one is tried.  Real-time threads join the isolated
// cgroup (isolation_report::isolated_cgroup) or set their affinity.
//
// DESIGN: how the dispatch threads reach their isolated CPU under systemd,
// on cgroup v1 and v2.
//
// The dispatch threads are threads of `qrtd run`, whose other threads (the
// event loop, the ledger, the probes) must stay on the housekeeping CPUs,
// and `qrtd run` lives wherever its starter put it: under systemd in
// /system.slice/qrtd.service, by hand in a session scope.  Whether a thread
// of that process can run on an isolated CPU depends on the method:
//
//   cgroup-v1-cpuset     yes.  v1 cpusets hold threads, not processes, and a
//                        user may move its own threads (the kernel checks
//                        the writer's euid against the task's uid), so each
//                        dispatch thread writes its TID into
//                        <v1 root>/<prefix>-isolated/tasks and then pins
//                        itself.  The root helper that builds the cpuset
//                        (`qrtd host apply`, or `qrtd run` as root) hands
//                        exactly that one file to agent.user
//                        (delegate_rt_cgroup); the unit makes it writable
//                        under ProtectControlGroups= with ReadWritePaths=.
//                        systemd never manages the v1 cpuset hierarchy, so
//                        this IS the delegation to the unit.  Root still
//                        reads that file at restore (to move what is left to
//                        the root cpuset); what it lists is the kernel's,
//                        and a write by user qrtd can only add qrtd's own
//                        threads, so the root boundary holds.
//   cgroup-v2-partition  no, on the kernels qrtd targets (Debian 12: 6.1).
//                        A partition takes its CPUs out of every other
//                        cgroup's cpuset.cpus.effective, so a thread must be
//                        IN the partition (or below it) to run there.  But
//                        (1) a partition's parent must itself be a valid
//                        partition root, up to the root cgroup (remote
//                        partitions with cpuset.cpus.exclusive exist only
//                        from 6.7), and every partition root owns its CPUs
//                        exclusively against its siblings; (2) a thread may
//                        only move within its process's threaded subtree;
//                        (3) a move needs write access to the cgroup.procs
//                        of the common ancestor.  A partition holding the
//                        dispatch thread would therefore have to sit in the
//                        daemon's own (delegated, Delegate=) subtree, and
//                        every ancestor of it -- qrtd.service, its slice --
//                        would have to be a partition root owning the
//                        daemon's housekeeping CPUs exclusively, taking them
//                        from the rest of the system (a dedicated top-level
//                        qrt.slice does not escape this: its CPUs are then
//                        qrtd's alone, or its housekeeping threads run on
//                        the isolated CPU).  The only other placement, the
//                        root cgroup as threaded domain, needs the daemon's
//                        process moved out of its unit, which systemd
//                        forbids.  So when the caller runs real-time
//                        threads (isolation_options::rt_threads), automatic
//                        selection does not use the v2 partition: it says
//                        why (not_used) and takes the next method.  Forced
//                        (host.isolation = "cgroup2"), it is applied and the
//                        report says the dispatch threads cannot reach it;
//                        dispatch.require_rt then refuses to start.
//   affinity-fence       yes: the isolated CPUs stay in every cpuset; every
//                        movable task is moved off them and each dispatch
//                        thread pins itself with sched_setaffinity.  This is
//                        what a pure cgroup v2 host (Debian 12) gets.
//
// rt_reach_for() states this for a method, in one line the log,
// agent.status and `qrtd host plan` print.

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtcore/cgroup_mounts.hpp"
#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/isolation_method.hpp"
#include "rtcore/restore_journal.hpp"
#include "rtcore/task_move.hpp"
#include "rtcore/task_ops.hpp"

namespace rtcore {

// The caller's own real-time threads, which the affinity fence leaves where
// they pinned themselves.  On a fence host a dispatch thread reaches its
// isolated CPU by sched_setaffinity alone, so a sweep that moved every task
// touching the isolated CPUs would move it too (and a SCHED_FIFO thread
// would then spin on the housekeeping CPUs).  A thread is left alone only
// when all of these hold, checked on what the kernel says (/proc), never on
// anything the daemon's user writes:
//   - its name is comm (the dispatch threads name themselves);
//   - its affinity is exactly one CPU, and that CPU is one of cpus (the
//     planned dispatch CPUs);
//   - its process is process when that is known (the root helper knows its
//     parent), and its process's real uid is uid when that is set (the
//     re-pin timer knows only agent.user);
//   - no other thread already claimed that CPU in this sweep (one thread a
//     CPU: a second one is moved like any other task).
// Empty cpus: nothing is exempt.
struct rt_exemption {
    std::string comm = "qrt-dispatch";
    cpu_set cpus;
    std::optional<pid_t> process;
    std::optional<uid_t> uid;
    bool any() const { return !cpus.empty() && (process || uid); }
};

struct isolation_options {
    std::optional<isolation_method> force;  // nullopt: the best that works
    std::string cgroup_prefix = "qrt";       // <prefix>-isolated, <prefix>-housekeeping
    // The caller will run real-time threads on the isolated CPUs (qrtd's
    // dispatch threads): a method they cannot reach is not chosen
    // automatically (see DESIGN above).  rt_cgroup names the v2 cgroup of
    // that process ("/system.slice/qrtd.service") in the messages.
    bool rt_threads = false;
    std::string rt_cgroup;
    // The fence leaves these threads on their CPUs (see rt_exemption).
    rt_exemption own_rt;
    // How the operator restores the host, for the messages that ask for it
    // (a cgroup of ours left by an earlier run).  Empty: "restore the host
    // partition first".  The caller's command, e.g. "run `qrtd host restore`".
    std::string restore_hint;
};

struct isolation_report {
    isolation_method method = isolation_method::none;
    std::vector<std::string> not_used;  // "cgroup-v2-partition: <why not>"
    std::string isolated_cgroup;        // host path RT threads may join, "" for the fence
    std::string housekeeping_cgroup;
    std::size_t tasks_moved = 0;
    std::size_t tasks_refused = 0;      // kernel threads that may not move
    std::size_t tasks_gone = 0;         // exited while we worked
    // The fence: the caller's own real-time threads found on their planned
    // CPUs and left there ("tid 812 on CPU 1"), one a CPU.
    std::vector<std::string> rt_threads_left;
    std::vector<std::string> lines;     // every action, one line of words each
    bool drift = false;                 // verify: something had to be fixed or is broken
};

result<isolation_report> apply_isolation(host_fs& fs, task_ops& tasks, restore_journal& journal,
                                         const cpu_set& isolated, const cpu_set& housekeeping,
                                         const isolation_options& opts);

// What apply_isolation would choose on this host, without changing
// anything (`qrtd host plan`): method, not_used and one line per reason.
// journal may be null (a cgroup of ours that exists then counts as
// another tool's).
isolation_report preview_isolation(const host_fs& fs, const restore_journal* journal, const isolation_options& opts);

// How real-time threads of the caller's process reach the isolated CPUs
// under method m.
struct rt_reach {
    bool reachable = false;  // a dispatch thread can be pinned to an isolated CPU
    std::string tasks_file;  // v1: each thread writes its TID here before pinning; "" otherwise
    std::string how;         // one line: "dispatch threads: ..."
};
rt_reach rt_reach_for(const host_fs& fs, isolation_method m, const isolation_options& opts);

// The v2 cgroup path in /proc/<pid>/cgroup text (the "0::" line), "" when
// there is none.
std::string v2_cgroup_of(std::string_view proc_cgroup);

// cgroup-v1-cpuset: hands <isolated cgroup>/tasks, and nothing else, to
// uid:gid, so the daemon's dispatch threads (agent.user) can join the
// isolated cpuset themselves.  Nothing to do for the other methods.  The
// line says what was done; a dry run only says what would be.
status delegate_rt_cgroup(host_fs& fs, const isolation_report& rep, uid_t uid, gid_t gid, const std::string& user,
                          std::vector<std::string>& lines);

// Checks the method in use still holds and sweeps tasks that arrived since
// (v1: new tasks in the root cpuset; fence: tasks whose affinity reaches an
// isolated CPU), journaling first.
result<isolation_report> verify_isolation(host_fs& fs, task_ops& tasks, restore_journal& journal,
                                          const cpu_set& isolated, const cpu_set& housekeeping,
                                          isolation_method method, const isolation_options& opts);

}  // namespace rtcore
