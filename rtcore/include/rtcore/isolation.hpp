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

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/isolation_method.hpp"
#include "rtcore/restore_journal.hpp"
#include "rtcore/task_ops.hpp"

namespace rtcore {


struct cgroup_mounts {
    std::string v2_root;         // "" when no cgroup2 mount
    std::string v1_cpuset_root;  // "" when no v1 cpuset mount
};
// From /proc/mounts, or the usual places when it cannot be read.
cgroup_mounts find_cgroup_mounts(const host_fs& fs);

struct isolation_options {
    std::optional<isolation_method> force;  // nullopt: the best that works
    std::string cgroup_prefix = "qrt";       // <prefix>-isolated, <prefix>-housekeeping
};

struct isolation_report {
    isolation_method method = isolation_method::none;
    std::vector<std::string> not_used;  // "cgroup-v2-partition: <why not>"
    std::string isolated_cgroup;        // host path RT threads may join, "" for the fence
    std::string housekeeping_cgroup;
    std::size_t tasks_moved = 0;
    std::size_t tasks_refused = 0;      // kernel threads that may not move
    std::size_t tasks_gone = 0;         // exited while we worked
    std::vector<std::string> lines;     // every action, one line of words each
    bool drift = false;                 // verify: something had to be fixed or is broken
};

result<isolation_report> apply_isolation(host_fs& fs, task_ops& tasks, restore_journal& journal,
                                         const cpu_set& isolated, const cpu_set& housekeeping,
                                         const isolation_options& opts);

// Checks the method in use still holds and sweeps tasks that arrived since
// (v1: new tasks in the root cpuset; fence: tasks whose affinity reaches an
// isolated CPU), journaling first.
result<isolation_report> verify_isolation(host_fs& fs, task_ops& tasks, restore_journal& journal,
                                          const cpu_set& isolated, const cpu_set& housekeeping,
                                          isolation_method method, const isolation_options& opts);

}  // namespace rtcore
