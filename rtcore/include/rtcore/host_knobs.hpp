#pragma once
// The runtime knobs of tuned's cpu-partitioning profile that can change
// without a reboot, applied for the isolated CPUs, journaled and restored.
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
// A knob whose file the kernel lacks (older kernel, no debugfs, no MCE) is
// reported absent and skipped.  A knob the kernel refuses is reported with
// the errno and left as it was; it never fails apply.  Only a journal that
// cannot be written fails it (the caller unwinds).  Each change is
// journaled first (rec::knob: path, original bytes, value set); restore
// writes the original bytes back when the file still reads the value set,
// and leaves a value someone else changed since (reported as skipped).

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/restore_journal.hpp"
#include "rtcore/task_ops.hpp"

namespace rtcore {

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

struct knob_outcome {
    enum class action {
        set,        // changed (dry run: would change)
        already,    // already what qrtd wants; nothing written
        absent,     // the kernel has no such file; skipped
        failed,     // the kernel refused the write (or the read); left as it was
        reported,   // shown only (RT throttling unless configured)
        reset,      // verify: had drifted from what qrtd set; set again
    };
    std::string name;    // "vm.stat_interval"
    std::string path;
    action act = action::set;
    std::string before;  // as read, trimmed
    std::string after;   // as read back (dry run: the value that would be written)
    std::string detail;  // the errno message, or what the value means
    std::string why;     // what it does for isolation
    std::string line() const;
};
const char* to_string(knob_outcome::action a);

struct kthread_outcome {
    std::size_t moved = 0;        // movable kernel threads given the housekeeping CPUs
    std::size_t not_movable = 0;  // per-CPU (bound) kernel threads on isolated CPUs
    std::size_t gone = 0;
    std::size_t failed = 0;
    std::vector<std::string> moved_names;        // "kthreadd (2)", at most 16
    std::vector<std::string> not_movable_names;  // "ksoftirqd/1 (19)", at most 16
    std::string failure;                         // the first failure, named
};

struct knob_report {
    bool enabled_kthreads = false;
    std::vector<knob_outcome> knobs;
    kthread_outcome kthreads;
    std::vector<std::string> off;    // knobs switched off by configuration
    std::vector<std::string> lines;  // every action, one line of words each
    bool drift = false;              // verify: something was set again or newly set
    std::size_t count(knob_outcome::action a) const;
};

enum class knob_pass { apply, verify };

// Reads each enabled knob, journals and sets the ones that differ from what
// isolation wants, then moves the kernel threads.  With a dry-run fs (and a
// dry-run journal) it only reports before -> after: `qrtd host plan`.
// verify: a knob that no longer reads what qrtd set is set again (drift).
// Errors only when the journal cannot be appended.
result<knob_report> apply_knobs(host_fs& fs, task_ops& tasks, restore_journal& journal, const cpu_set& isolated,
                                const cpu_set& housekeeping, const knob_options& opts,
                                knob_pass pass = knob_pass::apply);

}  // namespace rtcore
