#pragma once
// Placement policies: one interface, chosen by name in the config.
//
//   fifo              append after the last reservation of a QPU, never backfill
//   edf-backfill      earliest deadline first, backfill into any gap
//   priority-preempt  backfill; when nothing fits, displace unstarted
//                     lower-priority reservations (they are re-placed or
//                     reported displaced)
//   fidelity-aware    backfill over several windows per QPU, scored by the
//                     predicted fidelity at start against the wait
//
// The ledger does the mechanics (gap search, windows, invariants); a policy
// only says how to search, how to rank candidates and how to order a batch.

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "qrt/timeline/types.hpp"

namespace qrt::timeline {

// A request waiting for a decision, as seen by a batch orderer.
struct pending_request {
    request req;
    std::int64_t arrival_ns = 0;
    std::uint64_t seq = 0;  // arrival order, the final tie-break
};

class placement_policy {
public:
    virtual ~placement_policy() = default;
    virtual std::string_view name() const noexcept = 0;
    // true: search every gap from not_before; false: only after the tail.
    virtual bool backfill() const noexcept = 0;
    // May displace unstarted lower-priority reservations when nothing fits.
    virtual bool preempts() const noexcept { return false; }
    // Candidate slots considered per QPU (successive windows).
    virtual std::size_t windows_considered() const noexcept { return 1; }
    // Lower is better.  earliest_ns is the earliest start the request allows.
    virtual double score(const candidate& c, std::int64_t earliest_ns) const noexcept = 0;
    // Batch order: true when a should be decided before b.
    virtual bool before(const pending_request& a, const pending_request& b) const noexcept = 0;
};

// Known names: fifo, edf-backfill, priority-preempt, fidelity-aware.
result<std::unique_ptr<placement_policy>> make_policy(std::string_view name);
const std::vector<std::string_view>& policy_names();

}  // namespace qrt::timeline
