#pragma once
// Undoing what the restore journal records: restore (the whole journal,
// newest first, then the journal goes) and unwind (one failed step of an
// apply, the journal stays).
//
// Before anything is written, every record passes the restore allow-list
// (restore_allow.hpp) and, on the host fs used, every path it names must
// resolve without a symlink: one record that fails refuses the whole
// journal, the error naming the file and the record, and nothing is written.
// Each record is then undone only when the host still shows qrtd's change
// (a value someone else changed since is left, and reported as skipped).
// An rmdir that fails with EBUSY (tasks still leaving the cgroup) is retried
// for a short while, moving stragglers out again each time.

#include <cstddef>
#include <string>
#include <vector>

#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/restore_journal.hpp"
#include "rtcore/task_ops.hpp"

namespace rtcore {

// One line of a restore report.
struct restore_item {
    enum class outcome { restored, unchanged, gone, skipped, failed };
    outcome result = outcome::restored;
    std::string what;    // "/proc/irq/36/smp_affinity_list", "task 812 (sshd)", ...
    std::string detail;  // "0 -> 0-1", or the reason it could not be restored
    std::string line() const;
};

struct restore_outcome {
    std::vector<restore_item> items;
    std::vector<std::string> problems;  // rotted lines, a journal that cannot be removed
    bool complete = true;               // every record restored (or nothing to do)
    bool journal_removed = false;
    bool journal_found = false;
    bool other_boot = false;            // written before the last reboot: nothing to undo
};

// Puts back everything recorded in dir's journal (dir must be locked unless
// fs is a dry run), newest first, and removes the journal when every record
// was restored.  Idempotent; a missing journal is "nothing to restore".
result<restore_outcome> restore_from_journal(host_fs& fs, task_ops& tasks, const journal_dir& dir,
                                             const restore_allow_list& allow);

// Undoes records [from, end) of an open journal (newest first) without
// removing anything from the journal: used to unwind one failed step.
restore_outcome unwind_since(host_fs& fs, task_ops& tasks, const restore_journal& journal, std::size_t from);

}  // namespace rtcore
