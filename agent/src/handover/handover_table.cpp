// The hand-over table: see qrt/handover/handover_table.hpp.

#include "qrt/handover/handover_table.hpp"

#include <algorithm>
#include <type_traits>

namespace qrt::handover {

// The pump inserts and erases within the reserved capacity: shifting
// trivially copyable entries never allocates and never throws.
static_assert(std::is_trivially_copyable_v<job_entry>);

std::string_view to_string(job_state s) noexcept {
    switch (s) {
        case job_state::claimed: return "claimed";
        case job_state::handed: return "handed";
        case job_state::refused: return "refused";
        case job_state::withdrawn: return "withdrawn";
        case job_state::withheld: return "withheld";
        case job_state::released: return "released";
    }
    return "unknown";
}

std::string_view to_string(arm_state s) noexcept {
    switch (s) {
        case arm_state::none: return "none";
        case arm_state::arming: return "arming";
        case arm_state::armed: return "armed";
        case arm_state::fired: return "fired";
    }
    return "unknown";
}

std::string_view to_string(refusal r) noexcept {
    switch (r) {
        case refusal::none: return "none";
        case refusal::unknown_job: return "unknown_job";
        case refusal::already_decided: return "already_decided";
        case refusal::wrong_state: return "wrong_state";
        case refusal::not_by_gate: return "not_by_gate";
        case refusal::full: return "full";
    }
    return "unknown";
}

namespace {

template <typename V>
auto lower(V& jobs, std::uint64_t id) noexcept {
    return std::lower_bound(jobs.begin(), jobs.end(), id,
                            [](const job_entry& e, std::uint64_t v) { return e.id < v; });
}

}  // namespace

std::size_t handover_table::count(job_state s) const noexcept {
    return static_cast<std::size_t>(
        std::count_if(_jobs.begin(), _jobs.end(), [s](const job_entry& e) { return e.state == s; }));
}

std::size_t handover_table::count(arm_state s) const noexcept {
    return static_cast<std::size_t>(
        std::count_if(_jobs.begin(), _jobs.end(), [s](const job_entry& e) { return e.arm == s; }));
}

const job_entry* handover_table::find(std::uint64_t id) const noexcept {
    const auto it = lower(_jobs, id);
    return it != _jobs.end() && it->id == id ? &*it : nullptr;
}

job_entry* handover_table::find_mut(std::uint64_t id) noexcept {
    const auto it = lower(_jobs, id);
    return it != _jobs.end() && it->id == id ? &*it : nullptr;
}

void handover_table::reserve(std::size_t more) {
    _jobs.reserve(std::min(_jobs.size() + more, _max));
}

std::uint64_t handover_table::on_publish() noexcept {
    _jobs.erase(std::remove_if(_jobs.begin(), _jobs.end(),
                               [](const job_entry& e) { return e.state == job_state::withheld; }),
                _jobs.end());
    _released_unpublished = 0;
    return ++_published;
}

refusal handover_table::withhold(std::uint64_t id) {
    const auto it = lower(_jobs, id);
    if (it != _jobs.end() && it->id == id) {
        if (it->state == job_state::withheld) {
            return refusal::none;  // already: one gate change may name a job twice
        }
        if (it->state != job_state::released) {
            return refusal::wrong_state;  // the link holds it, or it is decided: withdraw or leave it
        }
        it->state = job_state::withheld;
        it->by_gate = true;
        it->was_released = true;
        return refusal::none;
    }
    if (_jobs.size() >= _max) {
        return refusal::full;
    }
    job_entry e;
    e.id = id;
    e.state = job_state::withheld;
    e.by_gate = true;
    _jobs.insert(it, e);  // the loop: may grow
    return refusal::none;
}

refusal handover_table::restore(std::uint64_t id) noexcept {
    const auto it = lower(_jobs, id);
    if (it == _jobs.end() || it->id != id) {
        return refusal::unknown_job;
    }
    if (it->state == job_state::withheld) {
        if (it->was_released) {
            it->state = job_state::released;  // released_at kept: forgotten as it would have been
            it->was_released = false;
            it->by_gate = false;
        } else {
            _jobs.erase(it);
        }
        return refusal::none;
    }
    if (it->state != job_state::withdrawn) {
        return refusal::wrong_state;
    }
    if (!it->by_gate) {
        return refusal::not_by_gate;  // the pump's withdrawal stands: the plan moved the job
    }
    it->state = job_state::handed;
    it->by_gate = false;
    return refusal::none;
}

refusal handover_table::release(std::uint64_t id) noexcept {
    job_entry* e = find_mut(id);
    if (e == nullptr) {
        return refusal::unknown_job;
    }
    if (e->state != job_state::handed && e->state != job_state::withdrawn && e->state != job_state::refused) {
        return refusal::wrong_state;
    }
    e->state = job_state::released;
    e->arm = arm_state::none;  // its outcome came back: the instruments hold it no more
    e->released_at = _published;
    ++_released_unpublished;
    return refusal::none;
}

refusal handover_table::claim(std::uint64_t id, std::int64_t start_ns, std::uint64_t calibration_id) noexcept {
    const auto it = lower(_jobs, id);
    if (it != _jobs.end() && it->id == id) {
        return refusal::already_decided;
    }
    if (!has_room()) {
        return refusal::full;
    }
    job_entry e;
    e.id = id;
    e.start_ns = start_ns;
    e.calibration_id = calibration_id;
    e.state = job_state::claimed;
    _jobs.insert(it, e);  // within capacity (has_room): shifts, never allocates
    return refusal::none;
}

refusal handover_table::move(std::uint64_t id, job_state from, job_state to) noexcept {
    job_entry* e = find_mut(id);
    if (e == nullptr) {
        return refusal::unknown_job;
    }
    if (e->state != from) {
        return refusal::wrong_state;
    }
    e->state = to;
    return refusal::none;
}

refusal handover_table::hand(std::uint64_t id) noexcept { return move(id, job_state::claimed, job_state::handed); }

refusal handover_table::refuse(std::uint64_t id) noexcept { return move(id, job_state::claimed, job_state::refused); }

refusal handover_table::withdraw(std::uint64_t id, bool by_gate) noexcept {
    const refusal r = move(id, job_state::handed, job_state::withdrawn);
    if (r == refusal::none) {
        find_mut(id)->by_gate = by_gate;
    }
    return r;
}

refusal handover_table::on_arm(std::uint64_t id, dispatch::arm_event ev) noexcept {
    job_entry* e = find_mut(id);
    if (e == nullptr) {
        return refusal::unknown_job;
    }
    const bool held = e->state == job_state::handed || e->state == job_state::withdrawn;
    arm_state to = e->arm;
    bool ok = false;
    switch (ev) {
        case dispatch::arm_event::arm_sent:
            ok = held && e->arm == arm_state::none;
            to = arm_state::arming;
            break;
        case dispatch::arm_event::armed:
            ok = held && e->arm == arm_state::arming;
            to = arm_state::armed;
            break;
        case dispatch::arm_event::unarmed:
            ok = held && (e->arm == arm_state::arming || e->arm == arm_state::armed);
            to = arm_state::none;
            break;
        case dispatch::arm_event::fired:  // never from withdrawn: the dispatcher's compare-and-swap
            ok = e->state == job_state::handed && e->arm == arm_state::armed;
            to = arm_state::fired;
            break;
    }
    if (!ok) {
        return refusal::wrong_state;
    }
    e->arm = to;
    return refusal::none;
}

void handover_table::forget_released(std::uint64_t plan_seq) noexcept {
    _jobs.erase(std::remove_if(_jobs.begin(), _jobs.end(),
                               [plan_seq](const job_entry& e) {
                                   return e.state == job_state::released && e.released_at < plan_seq;
                               }),
                _jobs.end());
}

}  // namespace qrt::handover
