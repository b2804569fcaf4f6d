#pragma once
// IRQ pinning: every IRQ in /proc/irq/<n>/smp_affinity_list that reaches an
// isolated CPU is moved to the housekeeping set, and so is
// /proc/irq/default_smp_affinity (mask form) for IRQs that appear later.
//
//   - Originals go to the restore journal (one fsync for the batch) before
//     the first write.
//   - A managed IRQ (the kernel spreads it itself; the write fails with EIO
//     or EPERM) is recorded in the journal as managed, reported, and never
//     written again.  It never makes apply fail.
//   - EINVAL (the IRQ chip refuses the mask) is reported as refused; ENOENT
//     (the IRQ went away) as gone.  Any other error (EROFS, EACCES, ...) is
//     fatal and returned: the caller unwinds with the journal.
//   - irqbalance is coordinated, not fought: qrtd does not restart services,
//     it tells the operator exactly what to set (IRQBALANCE_BANNED_CPULIST,
//     irqbalance >= 1.8), and verify never re-pins what an unconfigured
//     irqbalance keeps moving.

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/restore_journal.hpp"

namespace rtcore {

struct irq_outcome {
    enum class action {
        pinned,            // moved to the housekeeping CPUs
        already_ok,        // did not reach an isolated CPU; left alone
        managed,           // kernel-managed (EIO/EPERM); recorded, never retried
        refused,           // EINVAL from the IRQ chip
        gone,              // the IRQ went away
        repinned,          // verify: drifted back onto an isolated CPU; pinned again
        new_pinned,        // verify: appeared after apply; pinned
        left_to_irqbalance,// verify: irqbalance moved it back and is not configured; not fought
        moved_within,      // verify: changed, but still only on housekeeping CPUs
    };
    unsigned irq = 0;
    std::string name;    // action names from /proc/interrupts ("virtio1-req.0")
    action act = action::pinned;
    std::string before;  // smp_affinity_list before
    std::string after;   // smp_affinity_list after (read back)
    std::string detail;  // why, or the follow-up (effective affinity pending, the errno)
    // managed: the isolated CPUs its effective affinity delivers it to ("" if
    // none, or the kernel does not say).  Every interrupt of that device then
    // lands on them, and only isolcpus=managed_irq at boot moves it.
    std::string lands_on_isolated{};
    std::string line() const;
};
const char* to_string(irq_outcome::action a);

struct irqbalance_status {
    enum class state {
        not_running,
        coordinated,      // running, and its banned CPUs cover the isolated set
        needs_restart,    // the config file bans them but the running daemon does not
        not_configured,   // running without banning the isolated CPUs
    };
    state st = state::not_running;
    pid_t pid = 0;
    std::optional<cpu_set> banned_in_effect;  // from its environment or command line
    std::string config_path;                  // /etc/default/irqbalance (or sysconfig)
    std::string advice;                       // what the operator must do, or ""
    std::string line() const;
};

irqbalance_status probe_irqbalance(const host_fs& fs, const cpu_set& isolated);

struct irq_report {
    std::vector<irq_outcome> irqs;
    std::string default_before;  // default_smp_affinity, mask form
    std::string default_after;
    irqbalance_status irqbalance;
    std::vector<std::string> lines;  // every action, one line of words each
    std::size_t count(irq_outcome::action a) const;
};

// IRQ numbers under /proc/irq, ascending.
result<std::vector<unsigned>> list_irqs(const host_fs& fs);
// IRQ number -> action names, from /proc/interrupts (or /proc/irq/<n>/<action> dirs).
std::map<unsigned, std::string> irq_names(const host_fs& fs);
// Bits in the kernel's cpumask files: nr_cpu_ids, from /sys/devices/system/cpu/possible.
unsigned cpumask_bits(const host_fs& fs);

result<irq_report> pin_irqs(host_fs& fs, restore_journal& journal, const cpu_set& isolated,
                            const cpu_set& housekeeping);

// Finds drift (an IRQ back on an isolated CPU) and IRQs that appeared since
// apply, re-pins them (originals journaled first) unless an unconfigured
// irqbalance is the one moving them (repin_despite_irqbalance: re-pin those
// too, as apply does), and reports.
result<irq_report> verify_irqs(host_fs& fs, restore_journal& journal, const cpu_set& isolated,
                               const cpu_set& housekeeping, bool repin_despite_irqbalance = false);

}  // namespace rtcore
