#pragma once
// The hand-over table: the one record of where a job is between the plan
// the event loop publishes and the outcome the QPU link reports back
// (agent/src/handover/README.md).  One table per QPU, inside the job pump's
// lane for that QPU and guarded by the lane's priority-inheriting mutex:
// the pump's pass and the loop's calls (the dispatch gate, outcomes,
// publish) reach it only under that lock, so the table itself holds no lock.
//
// States of one job (no entry: the job is only planned, or forgotten):
//
//   (none) --claim-----> claimed      the pump took it from its plan; only
//                                     within one pass, before submit
//   claimed --hand-----> handed       the link accepted it (in the ring)
//   claimed --refuse---> refused      missed before hand-over, refused by
//                                     the link, or the loop's own reason
//   handed --withdraw--> withdrawn    pulled back from the dispatcher: by
//                                     the pump (no longer planned so) or by
//                                     the ledger's gate (cancel, preemption,
//                                     calibration update)
//   withdrawn --restore-> handed      the gate's change was abandoned and
//                                     the dispatcher took the job back
//   (none) | released --withhold--> withheld
//                                     the gate pulled a job the link does
//                                     not hold: the pump may not hand it
//                                     from a plan built before the change
//   withheld --restore--> (none), or released when withheld from there
//   withheld --publish--> (none)
//   handed | withdrawn | refused --release--> released
//                                     the loop took its outcome or report
//   released --forget--> (none)       the pump took a plan published after
//                                     the release (a re-placed job still
//                                     planned is then handed over again)
//
// Wire version 2 adds a second column, where the instruments are with a
// job the link holds (handed or withdrawn).  A column of its own because a
// withdrawal is orthogonal to it: an armed job can be withdrawn (the link
// then DISARMs it) and a withdrawal by the gate can be restored while the
// job stays armed.
//
//   none --arm_sent--> arming    the link sent its ARM
//   arming --armed---> armed     the endpoint answered ARMED
//   arming | armed --unarmed--> none
//                                the connection was lost (re-armed after
//                                the reconnect, if time allows) or the
//                                link DISARMed it to arm it again
//   armed --fired----> fired     the dispatch thread sent its FIRE: only
//                                from armed and handed, so a FIRE for a job
//                                not armed, or withdrawn, is a refused
//                                transition, counted as the bug it is
//
// release ends a job in any of these (its outcome came back: RESULT, or
// ERROR at ARM, or not_armed at T).  Only a handed or withdrawn entry has
// an arm state other than none.
//
// Every other (state, event) pair is refused: the call returns why
// (refusal), changes nothing and never asserts, so a caller's mistake is a
// counted error, never undefined behaviour.  This is the one place these
// invariants are checked; tests/unit/handover table-tests every pair.
//
// Bounded: at most max_jobs entries (the pump's options: 4 x plan_max_jobs
// in the daemon, qrtd.toml(5) LIMITS).  The pump's pass never allocates:
// claim() fails with `full` once the storage the loop reserved is used up,
// and the job waits for the next pass.  A withhold() on a full table is
// refused too (the gate then refuses the change, retryable), never grown.
//
// Not in this table, on purpose (each is another thread's private state):
//   - the in-flight and undurable sets of the ledger's durability tracker
//     (timeline/durability.hpp, one member of the ledger): the
//     group commit's writer-thread protocol, before a job is planned at all;
//   - qpu_link's _ids_in_flight: the dispatch ring's duplicate guard, kept
//     by the link for whoever submits, read on the pump's submit path;
//   - the plan's by_id index: an immutable index of one published plan,
//     saying where a job is planned, not what became of it.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "qrt/dispatch/job.hpp"

namespace qrt::handover {

enum class job_state : std::uint8_t { claimed, handed, refused, withdrawn, withheld, released };
// The second column (wire version 2); the events are the link's
// (dispatch::arm_event), reported through the room.
enum class arm_state : std::uint8_t { none, arming, armed, fired };

// Why a transition was refused (none: it was made).
enum class refusal : std::uint8_t {
    none,
    unknown_job,      // no entry for this id
    already_decided,  // claim: the job has an entry (decided, withheld or released)
    wrong_state,      // the entry's state does not allow this transition
    not_by_gate,      // restore: withdrawn by the pump, not the gate
    full,             // no room: max_jobs, or the storage the loop reserved
};

std::string_view to_string(job_state s) noexcept;
std::string_view to_string(arm_state s) noexcept;
std::string_view to_string(refusal r) noexcept;

struct job_entry {
    std::uint64_t id = 0;
    std::int64_t start_ns = 0;          // as claimed from the plan
    std::uint64_t calibration_id = 0;   // likewise
    job_state state = job_state::claimed;
    arm_state arm = arm_state::none;    // wire version 2 only
    bool by_gate = false;               // withdrawn by the ledger's gate
    std::uint64_t released_at = 0;      // released: the publish count then
    bool was_released = false;          // withheld from released: restore goes back there
};

class handover_table {
public:
    explicit handover_table(std::size_t max_jobs = 4096) : _max(max_jobs) {}

    std::size_t max_jobs() const noexcept { return _max; }
    std::size_t size() const noexcept { return _jobs.size(); }
    std::size_t count(job_state s) const noexcept;
    std::size_t count(arm_state s) const noexcept;
    // The jobs the link holds or may still report (handed or withdrawn).
    std::size_t in_flight() const noexcept { return count(job_state::handed) + count(job_state::withdrawn); }
    const job_entry* find(std::uint64_t id) const noexcept;
    // Sorted by id.
    const std::vector<job_entry>& entries() const noexcept { return _jobs; }

    // ---- the loop (may allocate) ----
    // Room for `more` entries beyond those held, up to max_jobs, so that
    // the pump's claims need no allocation.
    void reserve(std::size_t more);
    // A plan is published: withheld entries end (the plan was built after
    // the changes they stood for).  Returns the plan's sequence number.
    std::uint64_t on_publish() noexcept;
    refusal withhold(std::uint64_t id);
    refusal restore(std::uint64_t id) noexcept;
    refusal release(std::uint64_t id) noexcept;
    // Released since the last publish: the next plan lets the pump forget them.
    std::size_t released_unpublished() const noexcept { return _released_unpublished; }

    // ---- the pump (never allocates) ----
    bool has_room() const noexcept { return _jobs.size() < _jobs.capacity() && _jobs.size() < _max; }
    refusal claim(std::uint64_t id, std::int64_t start_ns, std::uint64_t calibration_id) noexcept;
    refusal hand(std::uint64_t id) noexcept;
    refusal refuse(std::uint64_t id) noexcept;
    // Either side: handed -> withdrawn; by_gate says which.
    refusal withdraw(std::uint64_t id, bool by_gate) noexcept;
    // The link's arm events (the loop, under the lane's lock like the rest).
    refusal on_arm(std::uint64_t id, dispatch::arm_event e) noexcept;
    // The pump took the plan numbered plan_seq: forget what was released
    // before that plan was published.
    void forget_released(std::uint64_t plan_seq) noexcept;

private:
    job_entry* find_mut(std::uint64_t id) noexcept;
    // From -> to when the entry is in `from`; the refusal otherwise.
    refusal move(std::uint64_t id, job_state from, job_state to) noexcept;

    std::vector<job_entry> _jobs;  // sorted by id; job_entry is trivially copyable
    std::size_t _max;
    std::uint64_t _published = 0;
    std::size_t _released_unpublished = 0;
};

}  // namespace qrt::handover
