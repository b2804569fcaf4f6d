#pragma once
// The runtime knobs of tuned's cpu-partitioning profile that can change
// without a reboot, applied for the isolated CPUs, journaled and restored.
//
// What each knob is, its file and how its values compare: the catalogue,
// knob_catalogue.hpp (which the journal's restore and allow-list read
// without the applier).  This is the applier.
//
// A knob whose file the kernel lacks (older kernel, no debugfs, no MCE) is
// reported absent and skipped.  A knob the kernel refuses is reported with
// the errno and left as it was; it never fails apply.  Only a journal that
// cannot be written fails it (the caller unwinds).  Each change is
// journaled first (rec::knob: path, original bytes, value set); restore
// writes the original bytes back when the file still reads the value set,
// and leaves a value someone else changed since (reported as skipped).

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/knob_catalogue.hpp"
#include "rtcore/restore_journal.hpp"
#include "rtcore/task_ops.hpp"

namespace rtcore {

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
