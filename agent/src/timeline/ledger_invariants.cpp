// The ledger's invariants, checked from scratch (tests, the random test, the soak).
#include "ledger_internal.hpp"

namespace qrt::timeline {

using namespace detail;

// ------------------------------------------------------------ invariants

std::vector<std::string> ledger::check_invariants() const {
    std::vector<std::string> bad;
    auto fail = [&](std::string m) { bad.push_back(std::move(m)); };
    std::size_t active = 0;
    // The held tokens: exactly the records' (a gang's members share one),
    // and no two reservations outside one gang share a token.
    std::unordered_map<std::uint64_t, std::uint32_t> tokens;
    std::unordered_map<std::uint64_t, std::uint64_t> token_owner;  // token -> gang or id
    for (const auto& [id, r] : _res) {
        const std::string who = "reservation " + u2s(id) + " (" +
                                std::string(to_string(r.state)) + ")";
        if (r.id != id) {
            fail(who + ": id field " + u2s(r.id));
        }
        ++tokens[r.fencing_token];
        const std::uint64_t holder = r.gang_id != 0 ? r.gang_id : ~id;
        if (const auto [it, fresh] = token_owner.emplace(r.fencing_token, holder);
            !fresh && it->second != holder) {
            fail(who + ": fencing token " + u2s(r.fencing_token) + " is another reservation's");
        }
        if (r.fencing_token == 0) {
            fail(who + ": fencing token 0");
        }
        const auto qit = _qpu_index.find(r.qpu);
        if (qit == _qpu_index.end()) {
            if (is_active(r.state)) {
                fail(who + ": unknown qpu " + r.qpu);
            }
            continue;
        }
        const qpu_state& qs = _qpus[qit->second];
        if (is_active(r.state)) {
            ++active;
            const auto b = qs.busy.find(r.start_ns);
            if (b == qs.busy.end() || b->second != id) {
                fail(who + ": missing from the busy map of " + r.qpu);
            }
        }
        const auto p = qs.pending.find(r.start_ns);
        const bool in_pending = p != qs.pending.end() && p->second == id;
        if (in_pending != (r.state == res_state::committed)) {
            fail(who + ": dispatch queue membership is " + (in_pending ? "set" : "unset"));
        }
        const bool in_leases = _leases.count({r.lease_expires_ns, id}) != 0;
        if (in_leases != (r.state == res_state::held)) {
            fail(who + ": lease index membership is " + (in_leases ? "set" : "unset"));
        }
        if ((r.state == res_state::held || r.state == res_state::committed) && _going_out.count(id) == 0) {
            const auto w = window_at(qit->second, r.start_ns);
            if (!w) {
                fail(who + ": start " + n2s(r.start_ns) + " is in no window (blackout)");
            } else {
                if (w->calibration_id != r.calibration_id) {
                    fail(who + ": records calibration_id " + u2s(r.calibration_id) +
                         ", its window is " + u2s(w->calibration_id));
                }
                if (r.end_ns() > w->valid_until_ns) {
                    fail(who + ": straddles the end of window " + u2s(w->calibration_id));
                }
                if (r.min_fidelity > 0.0 &&
                    w->predicted_fidelity(r.start_ns) + 1e-9 < r.min_fidelity) {
                    fail(who + ": predicted fidelity below min_fidelity");
                }
            }
            if (r.start_ns < r.not_before_ns) {
                fail(who + ": starts before not_before_ns");
            }
            if (r.end_ns() > r.deadline_ns) {
                fail(who + ": ends after deadline_ns");
            }
        }
        if (!r.idempotency_key.empty()) {
            const auto k = _idem.find(idem_key(r.tenant, r.idempotency_key));
            const std::uint64_t want = members(r).front();
            if (k == _idem.end() || k->second != want) {
                fail(who + ": idempotency key does not map back to it");
            }
        }
        if (r.gang_id != 0) {
            const auto g = _gangs.find(r.gang_id);
            if (g == _gangs.end() ||
                std::find(g->second.begin(), g->second.end(), id) == g->second.end()) {
                fail(who + ": not in its gang " + u2s(r.gang_id));
            } else {
                std::set<std::string> qpus;
                for (const std::uint64_t m : g->second) {
                    const reservation& mr = _res.at(m);
                    // Gang-wide states are uniform; dispatcher-side ones
                    // (dispatched, completed, failed, missed) are per member.
                    const auto whole = [](res_state st) {
                        return st == res_state::held || st == res_state::released ||
                               st == res_state::expired || st == res_state::cancelled;
                    };
                    if (mr.start_ns != r.start_ns || mr.fencing_token != r.fencing_token ||
                        ((whole(mr.state) || whole(r.state)) && mr.state != r.state)) {
                        fail(who + ": gang member " + u2s(m) + " differs in start/state/token");
                    }
                    qpus.insert(mr.qpu);
                }
                if (qpus.size() != g->second.size()) {
                    fail(who + ": gang " + u2s(r.gang_id) + " uses a QPU twice");
                }
            }
        }
    }
    for (const auto& [key, id] : _idem) {
        if (_res.count(id) == 0) {
            fail("idempotency key maps to missing reservation " + u2s(id));
        }
    }
    {
        std::unordered_map<std::string, tenant_usage> usage;
        for (const auto& [id, r] : _res) {
            if (is_active(r.state)) {
                tenant_usage& u = usage[r.tenant];
                u.reservations += 1;
                u.booked_ns += r.duration_ns;
                u.payload_bytes += r.payload.size();
            }
        }
        if (usage != _usage) {
            fail("per-tenant usage (" + u2s(_usage.size()) +
                 " tenants) differs from the live reservations (" + u2s(usage.size()) +
                 " tenants)");
        }
    }
    for (const auto& [expiry, id] : _leases) {
        const auto it = _res.find(id);
        if (it == _res.end() || it->second.lease_expires_ns != expiry) {
            fail("lease index entry for reservation " + u2s(id) + " is stale");
        }
    }
    std::size_t busy_total = 0;
    std::map<std::string, std::int64_t> booked;  // tenant -> the durations its busy entries hold
    for (std::size_t q = 0; q < _qpus.size(); ++q) {
        const qpu_state& qs = _qpus[q];
        const std::string& name = qs.spec.name;
        busy_total += qs.busy.size();
        for (const auto& [start, id] : qs.busy) {
            if (const auto it = _res.find(id); it != _res.end()) {
                booked[it->second.tenant] += it->second.duration_ns;
            }
        }
        std::int64_t prev_end = std::numeric_limits<std::int64_t>::min();
        std::uint64_t prev_id = 0;
        for (const auto& [start, id] : qs.busy) {
            const auto it = _res.find(id);
            if (it == _res.end() || !is_active(it->second.state) || it->second.start_ns != start ||
                it->second.qpu != name) {
                fail("busy map of " + name + " holds stale entry " + u2s(id));
                continue;
            }
            if (start < prev_end) {
                fail("reservations " + u2s(prev_id) + " and " + u2s(id) + " overlap on " + name);
            }
            prev_end = it->second.end_ns();
            prev_id = id;
        }
        for (const auto& [start, id] : qs.pending) {
            const auto it = _res.find(id);
            if (it == _res.end() || it->second.state != res_state::committed) {
                fail("dispatch queue of " + name + " holds stale entry " + u2s(id));
            }
        }
        std::int64_t wprev = std::numeric_limits<std::int64_t>::min();
        std::multiset<std::int64_t> lengths;
        for (const auto& [from, w] : qs.windows) {
            if (w.valid_from_ns >= w.valid_until_ns || w.valid_from_ns < wprev ||
                from != w.valid_from_ns) {
                fail("windows of " + name + " overlap or run backwards at " + u2s(w.calibration_id));
            }
            wprev = w.valid_until_ns;
            if (!qs.periodic) {
                lengths.insert(w.length_ns());
                const auto k = qs.window_ids.find(w.calibration_id);
                if (k == qs.window_ids.end() || k->second != from) {
                    fail("window id index of " + name + " misses calibration_id " +
                         u2s(w.calibration_id));
                }
            }
        }
        if (!qs.periodic && (qs.window_ids.size() != qs.windows.size() || lengths != qs.window_lengths)) {
            fail("window indexes of " + name + " hold " + u2s(qs.window_ids.size()) + " ids and " +
                 u2s(qs.window_lengths.size()) + " lengths for " + u2s(qs.windows.size()) +
                 " windows");
        }
        // The bound: 2 * max_windows, plus the windows kept for a live reservation.
        if (qs.windows.size() > 2 * _opts.max_windows + qs.busy.size()) {
            fail(name + " holds " + u2s(qs.windows.size()) + " windows, more than 2 x max_windows (" +
                 u2s(_opts.max_windows) + ") and one per live reservation");
        }
        // Live calibration blocks: indexed by start, disjoint, and a
        // blackout: no active reservation in one but its own jobs and, while
        // it is yielding, the held reservations asked to yield.
        std::int64_t bprev = std::numeric_limits<std::int64_t>::min();
        for (const auto& [start, id] : qs.blocks) {
            const auto it = _blocks.find(id);
            if (it == _blocks.end() || !is_live(it->second.state) || it->second.start_ns != start ||
                it->second.qpu != name) {
                fail("block index of " + name + " holds stale entry " + u2s(id));
                continue;
            }
            const calibration_block& b = it->second;
            if (start < bprev) {
                fail("calibration block " + u2s(id) + " overlaps another on " + name);
            }
            bprev = b.end_ns();
            for (const std::uint64_t rid : overlapping(q, b.start_ns, b.end_ns(), b.id)) {
                const reservation& r = _res.at(rid);
                if (b.state != block_state::yielding || r.state != res_state::held) {
                    fail("reservation " + u2s(rid) + " (" + std::string(to_string(r.state)) +
                         ") lies in calibration block " + u2s(id) + " (" + std::string(to_string(b.state)) +
                         ") on " + name);
                }
            }
        }
        // Gaps must equal windows minus busy intervals minus live blocks
        // (from the pruning point).
        std::vector<gap_index::gap> want;
        for (const auto& [from, w] : qs.windows) {
            std::int64_t free_from = w.valid_from_ns;
            auto it = qs.busy.lower_bound(w.valid_from_ns);
            if (it != qs.busy.begin()) {
                free_from = std::max(free_from, _res.at(std::prev(it)->second).end_ns());
            }
            for (; it != qs.busy.end() && it->first < w.valid_until_ns; ++it) {
                const reservation& r = _res.at(it->second);
                if (r.start_ns > free_from) {
                    want.push_back({free_from, r.start_ns});
                }
                free_from = std::max(free_from, r.end_ns());
            }
            if (free_from < w.valid_until_ns) {
                want.push_back({free_from, w.valid_until_ns});
            }
        }
        {
            std::vector<gap_index::gap> cut;
            for (gap_index::gap g : want) {
                for (const auto& [start, id] : qs.blocks) {
                    const calibration_block& b = _blocks.at(id);
                    if (!b.overlaps(g.start_ns, g.end_ns)) {
                        continue;
                    }
                    if (b.start_ns > g.start_ns) {
                        cut.push_back({g.start_ns, b.start_ns});
                    }
                    g.start_ns = std::max(g.start_ns, b.end_ns());
                }
                if (g.start_ns < g.end_ns) {
                    cut.push_back(g);
                }
            }
            want = std::move(cut);
        }
        auto clip = [&](std::vector<gap_index::gap> gs) {
            std::vector<gap_index::gap> out;
            for (gap_index::gap g : gs) {
                g.start_ns = std::max(g.start_ns, qs.pruned_before_ns);
                if (g.start_ns < g.end_ns) {
                    out.push_back(g);
                }
            }
            return out;
        };
        if (clip(want) != clip(qs.gaps.to_vector())) {
            fail("free-gap index of " + name + " differs from windows minus reservations (" +
                 std::to_string(qs.gaps.size()) + " gaps, want " + std::to_string(want.size()) +
                 ")");
        }
    }
    for (const auto& [id, b] : _blocks) {
        if (b.id != id) {
            fail("calibration block " + u2s(id) + ": id field " + u2s(b.id));
        }
        const auto qit = _qpu_index.find(b.qpu);
        const bool indexed = qit != _qpu_index.end() && _qpus[qit->second].blocks.count(b.start_ns) != 0 &&
                             _qpus[qit->second].blocks.at(b.start_ns) == id;
        if (indexed != is_live(b.state)) {
            fail("calibration block " + u2s(id) + " (" + std::string(to_string(b.state)) +
                 "): block index membership is " + (indexed ? "set" : "unset"));
        }
        if (b.id >= _next_block) {
            fail("calibration block " + u2s(id) + " is not below the next id " + u2s(_next_block));
        }
    }
    if (busy_total != active) {
        fail("busy maps hold " + std::to_string(busy_total) + " entries for " +
             std::to_string(active) + " active reservations");
    }
    if (tokens != _tokens) {
        fail("the held-token index has " + std::to_string(_tokens.size()) + " tokens, the records " +
             std::to_string(tokens.size()));
    }
    // The near-term index (booked_time) holds exactly the busy entries.
    if (_booked.intervals() != busy_total || _booked.tenants() != booked.size()) {
        fail("the booked-time index holds " + std::to_string(_booked.intervals()) + " intervals of " +
             std::to_string(_booked.tenants()) + " tenants for " + std::to_string(busy_total) +
             " busy entries of " + std::to_string(booked.size()));
    }
    for (const auto& [tenant, total] : booked) {
        const std::int64_t held = _booked.within(tenant, std::numeric_limits<std::int64_t>::min(),
                                                 std::numeric_limits<std::int64_t>::max());
        if (held != total) {
            fail("the booked-time index holds " + n2s(held) + " ns for tenant " + tenant + ", its busy entries " +
                 n2s(total));
        }
    }
    return bad;
}

}  // namespace qrt::timeline
