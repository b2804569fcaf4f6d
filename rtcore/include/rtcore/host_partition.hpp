#pragma once
// The host partition as the daemon sees it: apply, restore, verify.
//
//   auto fs = rtcore::host_fs::system();
//   rtcore::real_task_ops tasks;
//   auto rep = rtcore::host_partition::apply(fs, tasks, "/var/lib/qrtd", {1}, {0}, {});
//   ...
//   auto back = rtcore::host_partition::restore(fs, tasks, "/var/lib/qrtd");
//
// apply validates first and changes nothing when validation fails: the
// isolated set must not cover every online CPU, every CPU must be online
// (/sys/devices/system/cpu/online), the sets must not overlap, and the state
// directory must exist and be writable.  Then, each change journaled first:
// IRQs (and default_smp_affinity) to housekeeping, then runtime isolation.
// If a step fails half way, what apply changed is unwound with the journal
// and the error says what failed and what was unwound.  With a dry-run
// host_fs, apply only lists the writes it would make.
//
// restore puts back everything the journal holds (newest first), byte for
// byte, also after the applying process was killed; it is idempotent and
// removes the journal only when everything was restored.
//
// Reports are plain structs whose lines are words; the daemon renders them.

#include <filesystem>
#include <string>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/irq.hpp"
#include "rtcore/isolation.hpp"
#include "rtcore/restore_journal.hpp"
#include "rtcore/task_ops.hpp"

namespace rtcore::host_partition {

struct apply_options {
    bool pin_irqs = true;
    isolation_options isolation;  // method (best available by default), cgroup name prefix
};

struct apply_report {
    cpu_set isolated;
    cpu_set housekeeping;
    bool dry_run = false;
    std::string journal_path;
    bool continued_journal = false;  // an earlier apply was never restored; its originals are kept
    irq_report irqs;
    isolation_report isolation;
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
};

struct verify_report {
    bool applied = false;         // a journal exists
    bool clean = false;           // nothing drifted, nothing new
    cpu_set isolated;
    cpu_set housekeeping;
    isolation_method method = isolation_method::none;
    irq_report irqs;
    isolation_report isolation;
    std::vector<std::string> lines;
};

// Every check apply makes before touching anything.  Reads only.
status validate(const host_fs& fs, const std::filesystem::path& state_dir, const cpu_set& isolated,
                const cpu_set& housekeeping, const apply_options& opts = {});

result<apply_report> apply(host_fs& fs, task_ops& tasks, const std::filesystem::path& state_dir,
                           const cpu_set& isolated, const cpu_set& housekeeping, const apply_options& opts = {});

result<restore_report> restore(host_fs& fs, task_ops& tasks, const std::filesystem::path& state_dir);

// Reads the sets, the isolation method and the cgroup names from the journal
// (opts only switches IRQ checks); re-pins drifted and new IRQs and sweeps
// tasks that arrived since, journaling first.  No journal: applied = false.
result<verify_report> verify(host_fs& fs, task_ops& tasks, const std::filesystem::path& state_dir,
                             const apply_options& opts = {});

}  // namespace rtcore::host_partition
