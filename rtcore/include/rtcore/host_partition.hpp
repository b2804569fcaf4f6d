#pragma once
// The host partition as the daemon sees it: apply, restore, verify.
//
//   auto fs = rtcore::host_fs::system();
//   rtcore::real_task_ops tasks;
//   auto dir = rtcore::journal_dir::open("/var/lib/qrtd-host", {});   // checked and locked
//   auto rep = rtcore::host_partition::apply(fs, tasks, &*dir, {1}, {0}, {});
//   ...
//   auto back = rtcore::host_partition::restore(fs, tasks, &*dir);
//
// apply validates first and changes nothing when validation fails: the
// isolated set must not cover every online CPU, every CPU must be online
// (/sys/devices/system/cpu/online) and the sets must not overlap.  Then,
// each change journaled first: IRQs (and default_smp_affinity) to
// housekeeping, then runtime isolation, then the runtime knobs of tuned's
// cpu-partitioning profile (host_knobs.hpp).  If a step fails half way, what
// apply changed is unwound with the journal and the error says what failed
// and what was unwound.  With a dry-run host_fs, apply only lists the writes
// it would make (and the journal directory may be null: none yet).
//
// apply never trusts a journal of this boot blindly: when one is there (an
// earlier apply, or a crashed daemon whose restore did not finish), it is
// checked against the host.  When the journal's partition is not the one
// asked for, or its cgroups are missing or changed, or the earlier apply did
// not finish, that partition is restored and the new one applied afresh.
// Otherwise IRQs and default_smp_affinity that drifted back onto isolated
// CPUs are re-pinned and tasks re-swept in place, journaling first.  Either
// way the report says what was found and done (apply_report::drift).
//
// restore puts back everything the journal holds (newest first), byte for
// byte, also after the applying process was killed; it is idempotent and
// removes the journal only when everything was restored.  It writes only
// what the restore allow-list admits (restore_allow.hpp).
//
// Reports are plain structs whose lines are words; the daemon renders them.

#include <filesystem>
#include <string>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/host_knobs.hpp"
#include "rtcore/irq.hpp"
#include "rtcore/isolation.hpp"
#include "rtcore/journal_undo.hpp"
#include "rtcore/restore_journal.hpp"
#include "rtcore/task_ops.hpp"

namespace rtcore::host_partition {

struct apply_options {
    bool pin_irqs = true;
    isolation_options isolation;  // method (best available by default), cgroup name prefix
    knob_options knobs;           // the runtime knobs, applied after isolation (host_knobs.hpp)
    // Who applies: recorded in a new journal, so a later process can tell a
    // partition `qrtd host apply` owns from one a crashed `qrtd run` left.
    rec::applier by = rec::applier::host_apply;
};

struct restore_options {
    std::string cgroup_prefix = "qrt";  // the qrt cgroups the allow-list admits
};

struct apply_report {
    cpu_set isolated;
    cpu_set housekeeping;
    bool dry_run = false;
    std::string journal_path;
    // A journal of this boot was there and was checked against the host.
    bool continued_journal = false;
    // Its partition was restored and applied afresh (see drift for why).
    bool rebuilt = false;
    // Who started the journal in effect now.
    rec::applier journal_by = rec::applier::host_apply;
    std::vector<std::string> drift;  // what the check found, and what was done
    irq_report irqs;
    isolation_report isolation;
    knob_report knobs;
    std::vector<host_fs::planned_write> planned_writes;  // dry run only
    std::vector<std::string> lines;                      // every action, in order
};

struct restore_report {
    bool journal_found = false;
    bool complete = true;         // everything restored (or nothing to do)
    bool journal_removed = false;
    bool other_boot = false;
    std::vector<restore_item> items;
    std::vector<std::string> problems;
    std::vector<std::string> lines;
    std::size_t count(restore_item::outcome o) const;
    // "3 restored, 1 unchanged, 0 gone, 0 left as changed by others, 0 failed"
    std::string summary() const;
};

struct verify_report {
    bool applied = false;         // a journal exists
    bool clean = false;           // nothing drifted, nothing new
    cpu_set isolated;
    cpu_set housekeeping;
    isolation_method method = isolation_method::none;
    irq_report irqs;
    isolation_report isolation;
    knob_report knobs;
    std::vector<std::string> lines;
};

// Every check apply makes before touching anything.  Reads only.
status validate(const host_fs& fs, const cpu_set& isolated, const cpu_set& housekeeping,
                const apply_options& opts = {});

// dir: the journal directory, checked and locked (journal_dir::open); null
// only with a dry-run fs when there is no directory yet.
result<apply_report> apply(host_fs& fs, task_ops& tasks, const journal_dir* dir, const cpu_set& isolated,
                           const cpu_set& housekeeping, const apply_options& opts = {});

result<restore_report> restore(host_fs& fs, task_ops& tasks, const journal_dir* dir,
                               const restore_options& opts = {});

// Reads the sets and the isolation method from the journal (opts switches
// IRQ checks and names the cgroup prefix); re-pins drifted and new IRQs and
// sweeps tasks that arrived since, journaling first.  No journal:
// applied = false.
result<verify_report> verify(host_fs& fs, task_ops& tasks, const journal_dir& dir, const apply_options& opts = {});

}  // namespace rtcore::host_partition
