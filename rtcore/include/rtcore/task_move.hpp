#pragma once
// Moving a task off the isolated CPUs: the one helper the affinity fence
// (isolation.cpp, sweep_fence) and the runtime knobs' kernel-thread sweep
// (host_knobs.cpp, move_kthreads) share.  plan_move_off says where the task
// goes and what the journal must hold first; make_move makes the move and
// says what became of it, so each caller only counts and words the outcome.

#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/journal_record.hpp"
#include "rtcore/task_ops.hpp"

namespace rtcore {

class restore_journal;

// One task moved off the isolated CPUs (the affinity fence, and the knobs'
// kernel threads): from its affinity now to its CPUs outside isolated, or
// to housekeeping when none of its CPUs is left.
struct affinity_move {
    task_info task;
    cpu_set from;
    cpu_set to;
};
// The move for t, whose affinity is from.  Its original affinity is added to
// recs (an aff record, to be appended before the move is made) unless the
// journal already holds one for t.
affinity_move plan_move_off(const restore_journal& journal, const task_info& t, const cpu_set& from,
                            const cpu_set& isolated, const cpu_set& housekeeping, std::vector<journal_record>& recs);

// What became of one move (make_move).
enum class move_outcome {
    moved,    // its affinity is m.to now (dry-run fs: would be; nothing is written)
    gone,     // ESRCH: the task exited meanwhile
    refused,  // EINVAL: the kernel keeps it where it is (a per-CPU kernel thread)
    failed,   // any other error, given in why
};
// Sets m.task's affinity to m.to (with a dry-run fs only counts it).  why
// holds the kernel's error for refused and failed.
move_outcome make_move(const host_fs& fs, task_ops& tasks, const affinity_move& m, error& why);

}  // namespace rtcore
