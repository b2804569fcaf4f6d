// The ledger's durability: persist() turns the rows an operation changed
// into one change set for the durability tracker (durability.cpp), and
// withdraw_late() takes back a job whose commit became durable too late.
#include "ledger_internal.hpp"

namespace qrt::timeline {

using namespace detail;

// ------------------------------------------------------------ durability

// Every public mutating operation ends here.  The rows it changed become one
// change_set with the next sequence number, handed to the durability
// tracker: without a writer it commits at once (one transaction, one
// fsync), with one it is queued and made durable (or undone) later.
status ledger::persist() {
    const bool changed = !_dirty.empty() || !_dirty_windows.empty() || !_dirty_blocks.empty() ||
                         _durable.mark_pending();
    if (changed) {
        ++_generation;
    }
    if (!_durable.has_store() || !changed) {
        // In memory, or nothing changed (an idle housekeeping tick): no
        // transaction, no fsync.  Events of an unchanged operation follow
        // the changes still in flight.
        _dirty.clear();
        _dirty_windows.clear();
        _dirty_blocks.clear();
        _new_commits.clear();
        _durable.follow(_pending_events);
        return {};
    }
    change_set c = take_changes();
    _store_rows += c.rows() - 1;
    return _durable.persist(std::move(c), _pending_events, _new_commits);
}

// The rows the operation changed, in the order they must be written, and the
// dirty lists cleared.
change_set ledger::take_changes() {
    change_set c;
    c.seq = _durable.next_seq();
    std::sort(_dirty.begin(), _dirty.end());
    _dirty.erase(std::unique(_dirty.begin(), _dirty.end()), _dirty.end());
    for (const std::uint64_t id : _dirty) {
        const auto it = _res.find(id);
        if (it == _res.end()) {
            c.erases.push_back(id);
        } else {
            c.puts.push_back(it->second);
        }
    }
    c.next_id = _next_id;
    c.next_gang = _next_gang;
    c.next_block = _next_block;
    std::sort(_dirty_blocks.begin(), _dirty_blocks.end());
    _dirty_blocks.erase(std::unique(_dirty_blocks.begin(), _dirty_blocks.end()), _dirty_blocks.end());
    for (const std::uint64_t id : _dirty_blocks) {
        const auto it = _blocks.find(id);
        if (it == _blocks.end()) {
            c.block_erases.push_back(id);
        } else {
            c.block_puts.push_back(it->second);
        }
    }
    _dirty_blocks.clear();
    c.dispatch_mark = _durable.take_mark();
    c.windows.reserve(_dirty_windows.size());
    for (window_change& w : _dirty_windows) {
        c.windows.push_back({_qpus[w.q].spec.name, w.calibration_id, std::move(w.put)});
    }
    _dirty.clear();
    _dirty_windows.clear();
    return c;
}

void ledger::release_events(std::vector<event>& evs) {
    for (event& e : evs) {
        _events.push_back(std::move(e));
    }
    evs.clear();
}

void ledger::start_writer(commit_writer::post_fn post) { _durable.start_writer(std::move(post)); }

std::uint64_t ledger::change_seq_of(std::uint64_t id) const { return _durable.change_seq_of(id); }

std::size_t ledger::commit_backlog() const { return _durable.backlog(); }

std::int64_t ledger::commit_lead_ns() const { return _durable.commit_lead_ns(); }

std::vector<late_job> ledger::withdraw_late(const commit_notice& n, std::int64_t now_ns,
                                            std::int64_t handover_ns) {
    std::vector<late_job> out;
    const std::int64_t need = sat_add(now_ns, std::max<std::int64_t>(handover_ns, 1));
    std::set<std::uint64_t> gone;
    for (const commit_notice::durable_job& dj : n.committed) {
        const auto it = _res.find(dj.id);
        if (it == _res.end() || gone.count(dj.id) != 0) {
            continue;
        }
        const reservation& r = it->second;
        const std::int64_t need_here = sat_add(need, _qpus[_qpu_index.at(r.qpu)].extra_lead_ns);
        if (r.state != res_state::committed || r.start_ns >= need_here || change_seq_of(r.id) != 0) {
            continue;  // on time, already changed again, or not this change's to judge
        }
        const std::vector<std::uint64_t> ids = members(r);
        bool all_committed = true;
        for (const std::uint64_t m : ids) {
            all_committed = all_committed && _res.at(m).state == res_state::committed;
        }
        if (!all_committed || withdraw_all(ids)) {
            continue;  // a member went on, or the dispatcher already sends one
        }
        late_job lj;
        lj.seq = dj.seq;
        lj.id = r.id;
        lj.start_ns = r.start_ns;
        request req;
        req.duration_ns = r.duration_ns;
        req.not_before_ns = r.not_before_ns;
        req.deadline_ns = r.deadline_ns == k_no_deadline_ns ? 0 : r.deadline_ns;
        req.priority = r.priority;
        req.min_fidelity = r.min_fidelity;
        req.qpus = {r.qpu};
        const std::size_t q = _qpu_index.at(r.qpu);
        for (const std::uint64_t m : ids) {
            reservation& mr = _res.at(m);
            gone.insert(m);
            // The "committed" event never reached a subscriber: drop it.
            _events.erase(std::remove_if(_events.begin(), _events.end(),
                                         [m](const event& e) {
                                             return e.reservation_id == m &&
                                                    e.type == event_type::committed;
                                         }),
                          _events.end());
            const std::size_t mq = _qpu_index.at(mr.qpu);
            if (mr.lease_expires_ns != 0) {
                // A held reservation's commit: it is held again, as before.
                if (const auto p = _qpus[mq].pending.find(mr.start_ns);
                    p != _qpus[mq].pending.end() && p->second == mr.id) {
                    _qpus[mq].pending.erase(p);
                }
                account(mr, -1);
                mr.payload = blob{};
                account(mr, +1);
                mr.state = res_state::held;
                mr.reason.clear();
                mr.updated_ns = now_ns;
                _leases.emplace(mr.lease_expires_ns, mr.id);
                touch(m);
            } else {
                // A one-shot submit: forgotten, as if it never happened.
                vacate(mq, mr);
                account(mr, -1);
                if (!mr.idempotency_key.empty()) {
                    const auto k = _idem.find(idem_key(mr.tenant, mr.idempotency_key));
                    if (k != _idem.end() && k->second == m) {
                        _idem.erase(k);
                    }
                }
                drop_token(mr.fencing_token);
                _res.erase(m);
                touch(m);
            }
        }
        if (const auto c = candidates_for(req, {q}, now_ns, 1); !c.empty()) {
            lj.next_start_ns = c.front().start_ns;
        }
        lj.message = "job " + u2s(lj.id) + " became durable at " + n2s(now_ns) +
                     ", too late to hand over for its start_ns " + n2s(lj.start_ns) +
                     " (the hand-over needs " + n2s(need_here - now_ns) +
                     " ns); it was not kept, retry" +
                     (lj.next_start_ns > 0 ? ": the next possible start is " + n2s(lj.next_start_ns)
                                           : std::string());
        out.push_back(std::move(lj));
    }
    if (!out.empty()) {
        (void)persist();
    }
    return out;
}

}  // namespace qrt::timeline
