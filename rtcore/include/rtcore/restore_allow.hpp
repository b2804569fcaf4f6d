#pragma once
// Where a root helper may write when it replays the restore journal.
//
// Every record of a journal is checked against this list before anything
// is written (restore), and before it is appended (apply): a record outside
// it refuses the whole journal, naming the file and the record.  The list:
//   - /proc/irq/<n>/smp_affinity, /proc/irq/<n>/smp_affinity_list and
//     /proc/irq/default_smp_affinity;
//   - the qrt cgroups: <root>/<prefix>-isolated and <root>/<prefix>-housekeeping
//     directly under a mounted cgroup hierarchy (from /proc/mounts), the
//     cpuset files qrtd writes in them, and <root>/cpuset.sched_load_balance
//     and <root>/cgroup.subtree_control (controller "cpuset" only);
//   - task records (cg) only name one of those roots or qrt cgroups;
//   - the workqueue cpumasks, when workqueue_cpumasks is set (the hook for
//     the knobs qrtd will manage; the journal holds their canonical paths:
//     /sys/bus/workqueue/devices/writeback is a symlink to
//     /sys/devices/virtual/workqueue/writeback);
//   - knob records (runtime_knobs): only the knob paths of knob_catalogue.hpp
//     (knob_at): the workqueue cpumasks, vm.stat_interval,
//     kernel.timer_migration, kernel.watchdog_cpumask,
//     kernel.sched_rt_runtime_us, machinecheck<n>/ignore_ce and
//     /sys/kernel/debug/sched/fair_server/cpu<n>/runtime.
// Paths are compared as written, and the parser only accepts canonical
// ones (no "..", no "//"); host_fs refuses a symlink anywhere under its
// root when it writes, so the path checked is the file written.
//
// check() is pure: no I/O.  for_host() reads /proc/mounts through host_fs.

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/journal_record.hpp"

namespace rtcore {

inline constexpr std::array<std::string_view, 2> workqueue_cpumask_paths = {
    "/sys/devices/virtual/workqueue/cpumask",
    "/sys/devices/virtual/workqueue/writeback/cpumask",
};

struct restore_allow_list {
    std::vector<std::string> cgroup_roots;  // mount points: the v2 root, the v1 cpuset root
    std::string cgroup_prefix = "qrt";
    bool workqueue_cpumasks = false;
    bool runtime_knobs = true;  // knob records (knob_catalogue.hpp)

    // The cgroup roots of the host (or tree) fs describes.
    static restore_allow_list for_host(const host_fs& fs, std::string cgroup_prefix = "qrt");

    // ok, or an error (EPERM) saying which path of the record is not on the
    // list and what is.
    status check(const journal_record& r) const;

    bool allows_file(std::string_view path) const;
    bool is_qrt_cgroup(std::string_view dir) const;  // <root>/<prefix>-isolated|-housekeeping
    bool is_cgroup(std::string_view dir) const;      // a root or a qrt cgroup
    // One line naming what is allowed, for errors.
    std::string summary() const;
};

}  // namespace rtcore
