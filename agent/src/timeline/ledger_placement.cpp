// The ledger's search and placement: calibration windows as time passes,
// occupancy (busy intervals and gaps), the search for slots, slots.query.
#include "ledger_internal.hpp"

namespace qrt::timeline {

using namespace detail;

// --------------------------------------------------------------- windows

void ledger::extend_periodic(qpu_state& qs, std::int64_t until_ns, std::int64_t now_ns) {
    const periodic_calibration& p = qs.per;
    for (;;) {
        const std::int64_t cycle_start = p.phase_ns + qs.next_cycle * p.period_ns;
        if (cycle_start >= until_ns) {
            break;
        }
        calibration_window w;
        w.calibration_id = static_cast<std::uint64_t>(qs.next_cycle) + 1;
        w.valid_from_ns = cycle_start + p.blackout_ns;
        w.valid_until_ns = cycle_start + p.period_ns;
        w.f0 = p.f0;
        w.tau_ns = p.tau_ns;
        auto it = qs.busy.lower_bound(w.valid_from_ns);
        if (w.valid_until_ns <= now_ns && (it == qs.busy.end() || it->first >= w.valid_until_ns)) {
            // A cycle already over that holds no live reservation (one loaded
            // from the store may): never generated.  Skip to the next cycle
            // that holds one, or the one holding now, so a restart after a
            // long stop costs nothing per cycle missed.
            std::int64_t next = floor_div(now_ns - p.phase_ns, p.period_ns);
            if (it != qs.busy.end()) {
                next = std::min(next, floor_div(it->first - p.phase_ns, p.period_ns));
            }
            qs.next_cycle = std::max(qs.next_cycle + 1, next);
            continue;
        }
        ++_window_visits;
        if (qs.windows.empty()) {
            qs.first_cycle = qs.next_cycle;
        }
        if (qs.windows.emplace(w.valid_from_ns, w).second) {
            // A new window may already hold reservations and calibration
            // blocks loaded from the store.
            const auto q = static_cast<std::size_t>(&qs - _qpus.data());
            std::int64_t free_from = w.valid_from_ns;
            for (; it != qs.busy.end() && it->first < w.valid_until_ns; ++it) {
                const reservation& r = _res.at(it->second);
                if (r.start_ns > free_from) {
                    add_free(q, free_from, r.start_ns);
                }
                free_from = std::max(free_from, r.end_ns());
            }
            if (free_from < w.valid_until_ns) {
                add_free(q, free_from, w.valid_until_ns);
            }
        }
        ++qs.next_cycle;
    }
}

void ledger::advance(std::int64_t now_ns) {
    for (std::size_t q = 0; q < _qpus.size(); ++q) {
        qpu_state& qs = _qpus[q];
        if (qs.periodic) {
            // Windows up to the horizon, but at most max_windows cycles from
            // the one holding now: a short period must not mean millions of
            // windows (and gaps) ahead.
            const periodic_calibration& p = qs.per;
            const std::int64_t c_now = floor_div(now_ns - p.phase_ns, p.period_ns);
            const auto max_cycles = static_cast<std::int64_t>(
                std::min<std::size_t>(_opts.max_windows, static_cast<std::size_t>(
                                                             std::numeric_limits<std::int64_t>::max())));
            const std::int64_t reach = max_cycles > std::numeric_limits<std::int64_t>::max() / p.period_ns
                                           ? std::numeric_limits<std::int64_t>::max()
                                           : max_cycles * p.period_ns;
            const std::int64_t until = std::min(sat_add(now_ns, _opts.horizon_ns),
                                                sat_add(p.phase_ns + c_now * p.period_ns, reach));
            extend_periodic(qs, until, now_ns);
            if (qs.windows.size() > 2 * _opts.max_windows) {
                prune_windows(q, std::numeric_limits<std::int64_t>::min(), now_ns);
            }
        }
        update_placeable(qs, now_ns);
        // Free time in the past can never be used again.
        if (now_ns <= qs.pruned_before_ns) {
            continue;
        }
        for (auto g = qs.gaps.first(); g && g->end_ns <= now_ns; g = qs.gaps.first()) {
            qs.gaps.erase(g->start_ns);
        }
        qs.pruned_before_ns = std::max(qs.pruned_before_ns, now_ns);
    }
}

void ledger::add_window(std::size_t q, const calibration_window& w, bool durable) {
    qpu_state& qs = _qpus[q];
    ++_window_visits;
    qs.windows.emplace(w.valid_from_ns, w);
    if (!qs.periodic) {
        qs.window_ids[w.calibration_id] = w.valid_from_ns;
        qs.window_lengths.insert(w.length_ns());
        if (durable) {
            _dirty_windows.push_back({q, w.calibration_id, w});
        }
    }
}

std::map<std::int64_t, calibration_window>::iterator ledger::drop_window(
    std::size_t q, std::map<std::int64_t, calibration_window>::iterator it) {
    qpu_state& qs = _qpus[q];
    ++_window_visits;
    if (!qs.periodic) {
        const calibration_window& w = it->second;
        if (const auto i = qs.window_ids.find(w.calibration_id);
            i != qs.window_ids.end() && i->second == it->first) {
            qs.window_ids.erase(i);
        }
        if (const auto l = qs.window_lengths.find(w.length_ns()); l != qs.window_lengths.end()) {
            qs.window_lengths.erase(l);
        }
        _dirty_windows.push_back({q, w.calibration_id, std::nullopt});
    }
    return qs.windows.erase(it);
}

bool ledger::holds_live(std::size_t q, const calibration_window& w) const {
    const qpu_state& qs = _qpus[q];
    const auto b = qs.busy.lower_bound(w.valid_from_ns);
    return b != qs.busy.end() && b->first < w.valid_until_ns;
}

std::size_t ledger::prune_windows(std::size_t q, std::int64_t before_ns, std::int64_t now_ns) {
    qpu_state& qs = _qpus[q];
    std::size_t dropped = 0;
    // Windows are disjoint and ordered, so those that ended come first: walk
    // from the oldest and stop at the first one the rules keep.  Windows
    // kept for a live reservation are stepped over (at most one per live
    // reservation).
    auto it = qs.windows.begin();
    while (it != qs.windows.end()) {
        const calibration_window& w = it->second;
        const bool old = w.valid_until_ns < before_ns;
        const bool over = qs.windows.size() > 2 * _opts.max_windows && w.valid_until_ns <= now_ns;
        if (!old && !over) {
            break;
        }
        ++_window_visits;
        if (holds_live(q, w)) {
            ++it;
            continue;
        }
        for (auto g = qs.gaps.first_fit(w.valid_from_ns, 1); g && g->start_ns < w.valid_until_ns;
             g = qs.gaps.first_fit(w.valid_from_ns, 1)) {
            qs.gaps.erase(g->start_ns);
        }
        it = drop_window(q, it);
        ++dropped;
    }
    if (qs.periodic && !qs.windows.empty()) {
        qs.first_cycle = std::max(
            qs.first_cycle, static_cast<std::int64_t>(qs.windows.begin()->second.calibration_id) - 1);
    }
    return dropped;
}

std::optional<calibration_window> ledger::window_at(std::size_t q, std::int64_t t_ns) const {
    const qpu_state& qs = _qpus[q];
    if (qs.periodic) {
        // Periodic windows are arithmetic: no map walk on the hot path.
        const periodic_calibration& p = qs.per;
        const std::int64_t cycle = floor_div(t_ns - p.phase_ns, p.period_ns);
        if (cycle < qs.first_cycle || cycle >= qs.next_cycle) {
            return std::nullopt;
        }
        const std::int64_t cycle_start = p.phase_ns + cycle * p.period_ns;
        if (t_ns < cycle_start + p.blackout_ns) {
            return std::nullopt;
        }
        return calibration_window{static_cast<std::uint64_t>(cycle) + 1,
                                  cycle_start + p.blackout_ns, cycle_start + p.period_ns, p.f0,
                                  p.tau_ns};
    }
    const auto& ws = qs.windows;
    auto it = ws.upper_bound(t_ns);
    if (it == ws.begin()) {
        return std::nullopt;
    }
    --it;
    if (!it->second.contains(t_ns)) {
        return std::nullopt;
    }
    return it->second;
}

void ledger::rebuild_gaps(std::size_t q) {
    qpu_state& qs = _qpus[q];
    qs.gaps.clear();
    // Free time before the pruning point is never used again (advance), so
    // the rebuild starts at the first window ending after it: its cost
    // follows the windows ahead, not the history held.
    const std::int64_t from_ns = qs.pruned_before_ns;
    auto wit = qs.windows.upper_bound(from_ns);
    if (wit != qs.windows.begin() && std::prev(wit)->second.valid_until_ns > from_ns) {
        --wit;
    }
    const auto add = [&](std::int64_t s, std::int64_t e) {
        if (e > from_ns) {
            add_free(q, s, e);
        }
    };
    for (; wit != qs.windows.end(); ++wit) {
        ++_window_visits;
        const calibration_window& w = wit->second;
        std::int64_t free_from = w.valid_from_ns;
        auto it = qs.busy.lower_bound(w.valid_from_ns);
        if (it != qs.busy.begin()) {
            const reservation& prev = _res.at(std::prev(it)->second);
            free_from = std::max(free_from, prev.end_ns());
        }
        for (; it != qs.busy.end() && it->first < w.valid_until_ns; ++it) {
            const reservation& r = _res.at(it->second);
            if (r.start_ns > free_from) {
                add(free_from, r.start_ns);
            }
            free_from = std::max(free_from, r.end_ns());
        }
        if (free_from < w.valid_until_ns) {
            add(free_from, w.valid_until_ns);
        }
    }
}

// ------------------------------------------------------ occupancy helpers

void ledger::occupy(std::size_t q, const reservation& r) {
    qpu_state& qs = _qpus[q];
    qs.busy.emplace(r.start_ns, r.id);
    _booked.add(r.tenant, r.id, r.start_ns, r.end_ns());
    if (r.state == res_state::committed) {
        qs.pending.emplace(r.start_ns, r.id);
    }
    carve(q, r.start_ns, r.end_ns());
}

void ledger::carve(std::size_t q, std::int64_t s, std::int64_t e) {
    qpu_state& qs = _qpus[q];
    auto g = qs.gaps.containing(s);
    if (!g) {
        g = qs.gaps.first_fit(s, 1);
    }
    while (g && g->start_ns < e) {
        qs.gaps.erase(g->start_ns);
        if (g->start_ns < s) {
            qs.gaps.insert({g->start_ns, s});
        }
        if (e < g->end_ns) {
            qs.gaps.insert({e, g->end_ns});
            break;
        }
        g = qs.gaps.first_fit(s, 1);
    }
}

void ledger::vacate(std::size_t q, const reservation& r) {
    qpu_state& qs = _qpus[q];
    const auto b = qs.busy.find(r.start_ns);
    if (b == qs.busy.end() || b->second != r.id) {
        return;  // not placed
    }
    qs.busy.erase(b);
    _booked.remove(r.tenant, r.id, r.start_ns, r.end_ns());
    if (const auto p = qs.pending.find(r.start_ns); p != qs.pending.end() && p->second == r.id) {
        qs.pending.erase(p);
    }
    free_interval(q, r.start_ns, r.end_ns());
}

void ledger::add_free(std::size_t q, std::int64_t s, std::int64_t e) {
    qpu_state& qs = _qpus[q];
    // Live blocks are few (timeline.max_calibration_blocks): a gap is the
    // free time between them.
    auto b = qs.blocks.lower_bound(s);
    if (b != qs.blocks.begin()) {
        --b;
    }
    for (; b != qs.blocks.end() && b->first < e && s < e; ++b) {
        const calibration_block& blk = _blocks.at(b->second);
        if (blk.end_ns() <= s) {
            continue;
        }
        if (blk.start_ns > s) {
            qs.gaps.insert({s, blk.start_ns});
        }
        s = std::max(s, blk.end_ns());
    }
    if (s < e) {
        qs.gaps.insert({s, e});
    }
}

void ledger::free_interval(std::size_t q, std::int64_t s0, std::int64_t e0) {
    qpu_state& qs = _qpus[q];
    // Give back the part of [s0, e0) that lies inside windows and outside
    // reservations and live blocks, merged with neighbouring gaps of the
    // same window.
    const auto insert_merged = [&](const calibration_window& w, std::int64_t s, std::int64_t e) {
        if (s > w.valid_from_ns) {
            if (const auto left = qs.gaps.containing(s - 1); left && left->end_ns == s) {
                qs.gaps.erase(left->start_ns);
                s = left->start_ns;
            }
        }
        if (e < w.valid_until_ns) {
            if (const auto right = qs.gaps.find(e)) {
                qs.gaps.erase(right->start_ns);
                e = right->end_ns;
            }
        }
        qs.gaps.insert({s, e});
    };
    auto wit = qs.windows.upper_bound(s0);
    if (wit != qs.windows.begin()) {
        --wit;
    }
    for (; wit != qs.windows.end() && wit->second.valid_from_ns < e0; ++wit) {
        ++_window_visits;
        const calibration_window& w = wit->second;
        std::int64_t t = std::max(s0, w.valid_from_ns);
        const std::int64_t end = std::min(e0, w.valid_until_ns);
        while (t < end) {
            // Step over what holds t (a reservation, a live block), then
            // free up to the next thing that starts.
            auto bi = qs.busy.upper_bound(t);
            if (bi != qs.busy.begin()) {
                if (const reservation& r = _res.at(std::prev(bi)->second); r.end_ns() > t) {
                    t = r.end_ns();
                    continue;
                }
            }
            if (const calibration_block* blk = live_block_at(q, t)) {
                t = blk->end_ns();
                continue;
            }
            std::int64_t next = end;
            if (bi != qs.busy.end()) {
                next = std::min(next, bi->first);
            }
            if (const auto nb = qs.blocks.upper_bound(t); nb != qs.blocks.end()) {
                next = std::min(next, nb->first);
            }
            if (next > t) {
                insert_merged(w, t, next);
            }
            t = next;
        }
    }
}

// ---------------------------------------------------------------- search

result<std::vector<std::size_t>> ledger::resolve_qpus(const request& req) const {
    std::vector<std::size_t> out;
    if (req.qpus.empty()) {
        out.resize(_qpus.size());
        for (std::size_t i = 0; i < out.size(); ++i) {
            out[i] = i;
        }
        return out;
    }
    for (const std::string& name : req.qpus) {
        const auto it = _qpu_index.find(name);
        if (it == _qpu_index.end()) {
            return make_error(reason::unknown_qpu, "qpus: \"" + name + "\" is not a QPU of this host");
        }
        if (std::find(out.begin(), out.end(), it->second) != out.end()) {
            return make_error(reason::invalid_argument, "qpus: \"" + name + "\" is listed twice");
        }
        out.push_back(it->second);
    }
    return out;
}

std::int64_t ledger::earliest_start(const request& req, std::int64_t now_ns) const {
    // Never a start the dispatcher cannot meet: an acknowledged job must be
    // dispatchable (options().min_lead_ns).
    // The commit backlog counts too: a change waits for its group before
    // it is acknowledged and handed over (commit_lead_ns).
    return std::max(now_ns + _opts.min_lead_ns + commit_lead_ns(), req.not_before_ns);
}

// ------------------------------------------------------------ endpoints

bool ledger::set_endpoint_state(std::string_view qpu, bool up, std::string error,
                                std::string remedy, std::int64_t now_ns) {
    const auto it = _qpu_index.find(std::string(qpu));
    if (it == _qpu_index.end()) {
        return false;
    }
    qpu_state& qs = _qpus[it->second];
    const bool changed = qs.endpoint.up != up;
    if (changed) {
        qs.endpoint.since_ns = now_ns;
    }
    qs.endpoint.up = up;
    qs.endpoint.error = up ? std::string() : std::move(error);
    qs.endpoint.remedy = up ? std::string() : std::move(remedy);
    update_placeable(qs, now_ns);
    if (changed) {
        event ev;
        ev.type = std::string(up ? event_type::endpoint_up : event_type::endpoint_down);
        ev.qpu = qs.spec.name;
        ev.reason = qs.endpoint.error;
        ev.time_ns = now_ns;
        // Not a durable change: out at once, not behind commits in flight.
        _events.push_back(std::move(ev));
    }
    return true;
}

const ledger::endpoint_state* ledger::endpoint_down(std::string_view qpu) const {
    const auto it = _qpu_index.find(std::string(qpu));
    if (it == _qpu_index.end() || _qpus[it->second].endpoint.up) {
        return nullptr;
    }
    return &_qpus[it->second].endpoint;
}

error ledger::endpoint_down_error(std::size_t q, std::string_view what, std::int64_t now_ns) const {
    const qpu_state& qs = _qpus[q];
    error e = make_error(reason::endpoint_down,
                         std::string(what) + ": the endpoint of qpu \"" + qs.spec.name +
                             "\" is not connected (since " + n2s(qs.endpoint.since_ns) + ": " +
                             (qs.endpoint.error.empty() ? std::string("no connection yet")
                                                        : qs.endpoint.error) +
                             "); a start before " +
                             n2s(sat_add(now_ns, _opts.endpoint_down_horizon_ns)) +
                             " (timeline.endpoint_down_horizon_ns " +
                             n2s(_opts.endpoint_down_horizon_ns) +
                             ") could not be dispatched" +
                             (qs.endpoint.remedy.empty() ? std::string() : "; " + qs.endpoint.remedy));
    e.qpu = qs.spec.name;
    return e;
}

timeline::status ledger::check_endpoints(const request& req, const std::vector<std::size_t>& qs,
                                         const std::vector<std::size_t>& placed,
                                         std::int64_t now_ns) const {
    if (_opts.endpoint_down_horizon_ns <= 0 ||
        earliest_start(req, now_ns) >= sat_add(now_ns, _opts.endpoint_down_horizon_ns)) {
        return {};  // asked further ahead: accepted (the reply says the endpoint is down)
    }
    const auto down = [&](std::size_t q) { return !_qpus[q].endpoint.up; };
    for (const std::size_t q : placed) {
        if (down(q)) {
            return endpoint_down_error(q, "no slot on a connected QPU within the horizon", now_ns);
        }
    }
    if (placed.empty()) {
        for (const std::size_t q : qs) {
            if (down(q)) {
                return endpoint_down_error(q, "no slot on a connected QPU", now_ns);
            }
        }
    }
    return {};
}

std::int64_t ledger::deadline_of(const request& req) const {
    return req.deadline_ns > 0 ? req.deadline_ns : k_no_deadline_ns;
}

status ledger::validate(const request& req, std::int64_t now_ns) const {
    (void)now_ns;
    if (req.duration_ns <= 0) {
        return make_error(reason::invalid_argument,
                          "duration_ns must be > 0, got " + n2s(req.duration_ns));
    }
    if (req.not_before_ns < 0) {
        return make_error(reason::invalid_argument,
                          "not_before_ns must be >= 0, got " + n2s(req.not_before_ns));
    }
    if (req.deadline_ns < 0) {
        return make_error(reason::invalid_argument,
                          "deadline_ns must be >= 0 (0 = none), got " + n2s(req.deadline_ns));
    }
    if (req.deadline_ns > 0) {
        if (req.deadline_ns < req.not_before_ns) {
            return make_error(reason::invalid_argument,
                              "deadline_ns " + n2s(req.deadline_ns) + " is before not_before_ns " +
                                  n2s(req.not_before_ns));
        }
        if (req.deadline_ns - req.not_before_ns < req.duration_ns) {
            return make_error(reason::invalid_argument,
                              "deadline_ns " + n2s(req.deadline_ns) + " leaves less than duration_ns " +
                                  n2s(req.duration_ns) + " after not_before_ns " +
                                  n2s(req.not_before_ns));
        }
    }
    if (!(req.min_fidelity >= 0.0 && req.min_fidelity <= 1.0)) {
        return make_error(reason::invalid_argument,
                          "min_fidelity must be in [0, 1], got " + fmt_double(req.min_fidelity));
    }
    if (req.max_candidates == 0 || req.max_candidates > 1000) {
        return make_error(reason::invalid_argument,
                          "max_candidates must be in [1, 1000], got " +
                              std::to_string(req.max_candidates));
    }
    auto qs = resolve_qpus(req);
    if (!qs) {
        return std::move(qs).err();
    }
    // A request longer than every window can never be placed.
    std::int64_t longest = 0;
    bool any_windows = false;
    for (const std::size_t q : *qs) {
        const qpu_state& st = _qpus[q];
        if (st.periodic) {
            longest = std::max(longest, st.per.period_ns - st.per.blackout_ns);
            any_windows = true;
        } else if (!st.window_lengths.empty()) {
            longest = std::max(longest, *st.window_lengths.rbegin());
            any_windows = true;
        }
    }
    if (any_windows && req.duration_ns > longest) {
        return make_error(reason::invalid_argument,
                          "duration_ns " + n2s(req.duration_ns) +
                              " is longer than the longest calibration window (" + n2s(longest) +
                              " ns) of the requested QPUs");
    }
    return {};
}

void ledger::update_placeable(qpu_state& qs, std::int64_t now_ns) const {
    qs.placeable_from_ns = !qs.endpoint.up && _opts.endpoint_down_horizon_ns > 0
                               ? sat_add(now_ns, _opts.endpoint_down_horizon_ns)
                               : std::numeric_limits<std::int64_t>::min();
    if (qs.extra_lead_ns > 0) {
        qs.placeable_from_ns = std::max(
            qs.placeable_from_ns, sat_add(now_ns, sat_add(_opts.min_lead_ns + commit_lead_ns(), qs.extra_lead_ns)));
    }
}

bool ledger::set_extra_lead(std::string_view qpu, std::int64_t ns, std::int64_t now_ns) {
    const auto it = _qpu_index.find(std::string(qpu));
    if (it == _qpu_index.end()) {
        return false;
    }
    qpu_state& qs = _qpus[it->second];
    qs.extra_lead_ns = std::max<std::int64_t>(ns, 0);
    update_placeable(qs, now_ns);
    return true;
}

std::int64_t ledger::extra_lead_ns(std::string_view qpu) const {
    const auto it = _qpu_index.find(std::string(qpu));
    return it == _qpu_index.end() ? 0 : _qpus[it->second].extra_lead_ns;
}

std::optional<ledger::slot> ledger::earliest_fit(std::size_t q, std::int64_t from_ns,
                                                 const request& req, bool backfill) const {
    const qpu_state& qs = _qpus[q];
    const std::int64_t d = req.duration_ns;
    const std::int64_t latest_start = deadline_of(req) - d;
    std::int64_t t = std::max(from_ns, qs.placeable_from_ns);  // endpoint down: past the horizon
    if (!backfill && !qs.busy.empty()) {
        t = std::max(t, _res.at(qs.busy.rbegin()->second).end_ns());
    }
    while (t <= latest_start) {
        std::int64_t s = 0;
        const auto g = qs.gaps.containing(t);
        if (g && g->end_ns - t >= d) {
            s = t;
        } else {
            const auto f = qs.gaps.first_fit(t + 1, d);
            if (!f) {
                return std::nullopt;
            }
            s = f->start_ns;
        }
        if (s > latest_start) {
            return std::nullopt;
        }
        const auto w = window_at(q, s);
        if (!w) {
            return std::nullopt;  // gaps only exist inside windows
        }
        if (req.min_fidelity > 0.0 &&
            w->predicted_fidelity(s) + k_fidelity_slack < req.min_fidelity) {
            // Fidelity only falls within a window: try the next one.
            t = w->valid_until_ns;
            continue;
        }
        return slot{q, s, *w};
    }
    return std::nullopt;
}

candidate ledger::to_candidate(const slot& s, const request& req, std::int64_t earliest_ns) const {
    candidate c;
    c.qpu = _qpus[s.q].spec.name;
    c.start_ns = s.start_ns;
    c.end_ns = s.start_ns + req.duration_ns;
    c.calibration_id = s.window.calibration_id;
    c.calibration_age_ns = s.start_ns - s.window.valid_from_ns;
    c.predicted_fidelity = s.window.predicted_fidelity(s.start_ns);
    c.window_until_ns = s.window.valid_until_ns;
    c.window_tau_ns = s.window.tau_ns;
    c.score = _policy->score(c, earliest_ns);
    return c;
}

std::vector<candidate> ledger::candidates_for(const request& req,
                                              const std::vector<std::size_t>& qs,
                                              std::int64_t now_ns, std::size_t per_qpu) const {
    const std::int64_t earliest = earliest_start(req, now_ns);
    std::vector<std::pair<candidate, std::size_t>> all;
    for (const std::size_t q : qs) {
        std::int64_t t = earliest;
        for (std::size_t i = 0; i < per_qpu; ++i) {
            const auto s = earliest_fit(q, t, req, _policy->backfill());
            if (!s) {
                break;
            }
            all.emplace_back(to_candidate(*s, req, earliest), q);
            t = s->window.valid_until_ns;
        }
    }
    std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
        if (a.first.score != b.first.score) {
            return a.first.score < b.first.score;
        }
        if (a.first.start_ns != b.first.start_ns) {
            return a.first.start_ns < b.first.start_ns;
        }
        return a.second < b.second;
    });
    std::vector<candidate> out;
    out.reserve(all.size());
    for (auto& [c, q] : all) {
        out.push_back(std::move(c));
    }
    return out;
}

std::optional<std::vector<ledger::slot>> ledger::gang_fit(const request& req,
                                                          const std::vector<std::size_t>& qs,
                                                          std::size_t k,
                                                          std::int64_t from_ns) const {
    if (k == 0 || qs.size() < k) {
        return std::nullopt;
    }
    std::int64_t t = from_ns;
    for (std::size_t step = 0; step < _opts.max_gang_search_steps; ++step) {
        std::vector<slot> found;
        std::vector<std::int64_t> starts;
        for (const std::size_t q : qs) {
            if (auto s = earliest_fit(q, t, req, _policy->backfill())) {
                starts.push_back(s->start_ns);
                found.push_back(std::move(*s));
            }
        }
        if (found.size() < k) {
            return std::nullopt;
        }
        std::sort(starts.begin(), starts.end());
        const std::int64_t tk = starts[k - 1];
        if (tk == t) {
            std::vector<std::pair<double, slot>> exact;
            for (slot& s : found) {
                if (s.start_ns == t) {
                    const double sc = to_candidate(s, req, from_ns).score;
                    exact.emplace_back(sc, std::move(s));
                }
            }
            std::stable_sort(exact.begin(), exact.end(),
                             [](const auto& a, const auto& b) { return a.first < b.first; });
            std::vector<slot> out;
            for (std::size_t i = 0; i < k; ++i) {
                out.push_back(std::move(exact[i].second));
            }
            std::sort(out.begin(), out.end(),
                      [](const slot& a, const slot& b) { return a.q < b.q; });
            return out;
        }
        t = tk;
    }
    return std::nullopt;
}

std::optional<ledger::preempt_plan> ledger::preemption_fit(const request& req,
                                                           const std::vector<std::size_t>& qs,
                                                           std::int64_t now_ns,
                                                           const std::set<std::uint64_t>& pinned) const {
    const std::int64_t earliest = earliest_start(req, now_ns);
    const std::int64_t deadline = deadline_of(req);
    const std::int64_t d = req.duration_ns;
    std::optional<preempt_plan> best;
    auto eligible = [&](const reservation& r) {
        return (r.state == res_state::held || r.state == res_state::committed) &&
               r.start_ns > now_ns && r.priority < req.priority && r.gang_id == 0 &&
               pinned.count(r.id) == 0;
    };
    for (const std::size_t q : qs) {
        const qpu_state& st = _qpus[q];
        auto wit = st.windows.upper_bound(earliest);
        if (wit != st.windows.begin() && std::prev(wit)->second.valid_until_ns > earliest) {
            --wit;
        }
        bool done = false;
        for (; !done && wit != st.windows.end() && wit->second.valid_from_ns <= deadline - d;
             ++wit) {
            ++_window_visits;
            const calibration_window& w = wit->second;
            if (best && w.valid_from_ns >= best->s.start_ns) {
                break;
            }
            std::int64_t s = std::max(earliest, w.valid_from_ns);
            const std::int64_t limit = std::min(w.valid_until_ns, deadline);
            while (s <= limit - d) {
                if (req.min_fidelity > 0.0 &&
                    w.predicted_fidelity(s) + k_fidelity_slack < req.min_fidelity) {
                    break;
                }
                if (const calibration_block* blk = live_block_over(q, s, s + d)) {
                    s = blk->end_ns();  // a blackout: never preempted into
                    continue;
                }
                std::vector<std::uint64_t> victims;
                bool blocked = false;
                auto b = st.busy.upper_bound(s);
                if (b != st.busy.begin()) {
                    --b;
                }
                for (; b != st.busy.end() && b->first < s + d; ++b) {
                    const reservation& r = _res.at(b->second);
                    if (r.end_ns() <= s) {
                        continue;
                    }
                    if (!eligible(r)) {
                        blocked = true;
                        s = r.end_ns();
                        break;
                    }
                    victims.push_back(r.id);
                }
                if (!blocked) {
                    if (!best || s < best->s.start_ns) {
                        best = preempt_plan{slot{q, s, w}, std::move(victims)};
                    }
                    done = true;
                    break;
                }
            }
        }
    }
    return best;
}

std::optional<std::uint64_t> ledger::withdraw_all(const std::vector<std::uint64_t>& ids) {
    if (!_gate.withdraw) {
        return std::nullopt;
    }
    std::vector<std::uint64_t> withdrawn;
    for (const std::uint64_t id : ids) {
        if (_res.at(id).state != res_state::committed) {
            continue;  // held: never handed over
        }
        if (!_gate.withdraw(id)) {
            for (const std::uint64_t w : withdrawn) {
                if (_gate.restore) {
                    _gate.restore(w);
                }
            }
            return id;
        }
        withdrawn.push_back(id);
    }
    return std::nullopt;
}

error ledger::no_fit_error(const request& req, const std::vector<std::size_t>& qs,
                           std::int64_t now_ns) const {
    std::string names;
    for (const std::size_t q : qs) {
        names += (names.empty() ? "" : ",") + _qpus[q].spec.name;
    }
    std::string msg = "no slot of duration_ns " + n2s(req.duration_ns) + " on qpus [" + names +
                      "] from " + n2s(earliest_start(req, now_ns)) +
                      (_opts.min_lead_ns > 0 ? " (now + min_lead_ns " + n2s(_opts.min_lead_ns) + " at the earliest)" : "");
    if (req.deadline_ns > 0) {
        msg += " to deadline_ns " + n2s(req.deadline_ns);
    }
    if (req.min_fidelity > 0.0) {
        msg += " with min_fidelity " + fmt_double(req.min_fidelity);
    }
    msg += blocks_in_the_way(req, qs, now_ns);
    return make_error(reason::no_fit, msg);
}

// --------------------------------------------------------------- queries

result<query_result> ledger::query(const request& req, std::int64_t now_ns) {
    if (auto v = validate(req, now_ns); !v) {
        return std::move(v).err();
    }
    auto qs = resolve_qpus(req);
    if (req.gang_size > 1 && req.gang_size > qs->size()) {
        return make_error(reason::invalid_argument,
                          "gang_size must be in [1, " + std::to_string(qs->size()) +
                              "] (the QPUs requested), got " + std::to_string(req.gang_size));
    }
    advance(now_ns);
    query_result out;
    const std::int64_t earliest = earliest_start(req, now_ns);
    if (req.gang_size > 1) {
        // The gang reserve_gang would place now: one start on gang_size QPUs.
        if (const auto slots = gang_fit(req, *qs, req.gang_size, earliest)) {
            for (const slot& s : *slots) {
                out.candidates.push_back(to_candidate(s, req, earliest));
            }
        }
    } else {
        const std::size_t per_qpu = std::max(req.max_candidates, _policy->windows_considered());
        out.candidates = candidates_for(req, *qs, now_ns, per_qpu);
        if (out.candidates.size() > req.max_candidates) {
            out.candidates.resize(req.max_candidates);
        }
    }
    if (out.candidates.empty()) {
        out.why_none = no_fit_error(req, *qs, now_ns).message;
        if (req.gang_size > 1) {
            out.why_none = "gang of " + std::to_string(req.gang_size) + ": " + out.why_none;
        }
        // The next window long enough and good enough, ignoring occupancy
        // and the deadline.
        for (const std::size_t q : *qs) {
            const auto& ws = _qpus[q].windows;
            std::size_t looked = 0;
            for (auto it = ws.lower_bound(earliest); it != ws.end() && looked < 10'000;
                 ++it, ++looked) {
                ++_window_visits;
                const calibration_window& w = it->second;
                if (w.length_ns() >= req.duration_ns && w.f0 + k_fidelity_slack >= req.min_fidelity) {
                    if (!out.next || w.valid_from_ns < out.next->window.valid_from_ns) {
                        out.next = next_window{_qpus[q].spec.name, w};
                    }
                    break;
                }
            }
        }
    }
    return out;
}

}  // namespace qrt::timeline
