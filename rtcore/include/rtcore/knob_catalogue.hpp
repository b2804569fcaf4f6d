#pragma once
// The catalogue of runtime knobs: what each knob of tuned's
// cpu-partitioning profile is, the file it lives in, and how its values
// compare -- what the journal's restore (journal_undo.cpp) and allow-list
// (restore_allow.cpp) need to know of a knob record, kept apart from the
// applier (host_knobs.hpp), which reads and sets knobs and journals them.
// Depends on no journal code, so the journal and the applier both depend on
// it and not on each other's knob half.
//
// What tuned's cpu-partitioning profile sets (with network-latency, its
// parent), and what qrtd does with each:
//
//   /sys/devices/virtual/workqueue/cpumask            set: housekeeping mask
//   /sys/devices/virtual/workqueue/<wq>/cpumask       set: housekeeping mask
//     (tuned also names /sys/bus/workqueue/devices/writeback/cpumask: the
//     same file through a symlink; qrtd writes the canonical path)
//       Unbound kworkers (kworker/uN:M) run where these masks say; nothing
//       else moves them (they refuse sched_setaffinity).
//   [scheduler] isolated_cores                        kernel threads: movable
//       ones get the housekeeping CPUs; per-CPU ones (PF_NO_SETAFFINITY in
//       /proc/<tid>/stat, as tuned checks) are recorded, never retried.
//   vm.stat_interval = 10                             set: 10 s
//       The per-CPU vmstat_update work runs on every CPU once per interval;
//       10 s wakes the isolated CPU's kworker a tenth as often.
//   kernel.timer_migration = 0                        set: 0
//       With migration on, a busy CPU (an isolated one spinning a dispatch
//       thread) is where idle CPUs' timers are sent to expire; 0 keeps
//       every timer on the CPU that armed it.
//   kernel.nmi_watchdog = 0 (and nosoftlockup, boot)  not set; instead
//   kernel.watchdog_cpumask                           set: housekeeping list
//       The watchdog's hrtimer, stopper-thread work and perf NMI then stay
//       off the isolated CPUs, and lockup detection keeps running on the
//       others (nmi_watchdog=0 would turn it off for the whole host).
//   machinecheck*/ignore_ce = 1                       opt-in (mce_ignore_ce)
//       Stops the corrected-error poll timer (every 5 min per CPU), but
//       also corrected-memory-error reporting for the whole host.
//   kernel.hung_task_timeout_secs = 600               not set: only quiets
//       warnings; khungtaskd runs on housekeeping CPUs anyway.
//   kernel.sched_rt_runtime_us = -1 (the realtime profile, not this one)
//   and, on kernels with a fair server, its runtime on the isolated CPUs
//       (/sys/kernel/debug/sched/fair_server/cpuN/runtime): reported;
//       changed (to -1 and 0) only with knob_options::rt_throttling_off.
//

#include <optional>
#include <string_view>

namespace rtcore {

// The knob files, as host paths.
namespace knob_path {
inline constexpr std::string_view wq_dir = "/sys/devices/virtual/workqueue";
inline constexpr std::string_view wq_global = "/sys/devices/virtual/workqueue/cpumask";
inline constexpr std::string_view stat_interval = "/proc/sys/vm/stat_interval";
inline constexpr std::string_view timer_migration = "/proc/sys/kernel/timer_migration";
inline constexpr std::string_view watchdog_cpumask = "/proc/sys/kernel/watchdog_cpumask";
inline constexpr std::string_view rt_runtime = "/proc/sys/kernel/sched_rt_runtime_us";
inline constexpr std::string_view mce_dir = "/sys/devices/system/machinecheck";
inline constexpr std::string_view fair_server_dir = "/sys/kernel/debug/sched/fair_server";
}  // namespace knob_path

// One component of a workqueue name as sysfs shows it (a directory of
// knob_path::wq_dir holding a cpumask).
bool workqueue_name(std::string_view s);

struct knob_options {
    bool workqueues = true;        // the unbound workqueue cpumasks
    bool kthreads = true;          // movable kernel threads off the isolated CPUs
    bool vm_stat_interval = true;  // vm.stat_interval = 10
    bool timer_migration = true;   // kernel.timer_migration = 0
    bool watchdog_cpumask = true;  // kernel.watchdog_cpumask = housekeeping
    bool mce_ignore_ce = false;    // machinecheck*/ignore_ce = 1
    bool rt_throttling_off = false;  // sched_rt_runtime_us = -1, fair server runtime 0 on isolated CPUs
    bool operator==(const knob_options&) const = default;
};

// The names of knob_options' switches, as host.runtime_knobs spells them
// (rt throttling has its own option).
inline constexpr std::string_view knob_names[] = {"workqueues", "kthreads", "vm_stat_interval",
                                                  "timer_migration", "watchdog_cpumask", "mce_ignore_ce"};
// Sets the switch named; false when the name is not a knob.
bool enable_knob(knob_options& o, std::string_view name);

enum class knob_form { cpumask, cpulist, integer };

// A path a knob record may name, and how its values compare; nullopt for
// any other path (the restore allow-list admits exactly these).
struct knob_path_info {
    std::string_view name;  // "workqueue cpumask", "vm.stat_interval", ...
    knob_form form;
};
std::optional<knob_path_info> knob_at(std::string_view path);

// Equal as the kernel means them: "00000001" and "1\n" are the same mask.
bool same_knob_value(knob_form form, std::string_view a, std::string_view b);

}  // namespace rtcore
