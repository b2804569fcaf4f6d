#include "qrt/timeline/ledger.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

namespace qrt::timeline {

namespace {

constexpr double k_fidelity_slack = 1e-12;

std::string n2s(std::int64_t v) { return std::to_string(v); }
std::string u2s(std::uint64_t v) { return std::to_string(v); }

std::string idem_key(std::string_view tenant, std::string_view key) {
    std::string k;
    k.reserve(tenant.size() + key.size() + 1);
    k.append(tenant);
    k.push_back('\0');
    k.append(key);
    return k;
}

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
    std::int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) {
        --q;
    }
    return q;
}

// a + b, held at INT64_MAX (b >= 0).
std::int64_t sat_add(std::int64_t a, std::int64_t b) {
    return a > std::numeric_limits<std::int64_t>::max() - b ? std::numeric_limits<std::int64_t>::max()
                                                            : a + b;
}

std::string fmt_double(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

}  // namespace

struct ledger::qpu_state {
    qpu_spec spec;
    bool periodic = false;
    periodic_calibration per;
    std::int64_t next_cycle = 0;  // periodic: first cycle not generated yet
    std::int64_t first_cycle = 0;  // periodic: first cycle generated
    std::map<std::int64_t, calibration_window> windows;  // by valid_from
    // Pushed: calibration_id -> valid_from of its window, and the lengths of
    // all windows (validate()'s longest window), kept by add_window and
    // drop_window so no lookup walks the window history.
    std::unordered_map<std::uint64_t, std::int64_t> window_ids;
    std::multiset<std::int64_t> window_lengths;
    gap_index gaps;
    std::map<std::int64_t, std::uint64_t> busy;     // active reservations by start
    std::map<std::int64_t, std::uint64_t> pending;  // committed jobs by start
    std::int64_t pruned_before_ns = std::numeric_limits<std::int64_t>::min();
};

struct ledger::slot {
    std::size_t q = 0;
    std::int64_t start_ns = 0;
    calibration_window window;
};

struct ledger::preempt_plan {
    slot s;
    std::vector<std::uint64_t> victims;
};

// ------------------------------------------------------------ construction

ledger::ledger(std::vector<qpu_spec> qpus, ledger_options opts,
               std::unique_ptr<placement_policy> policy)
    : _opts(std::move(opts)), _policy(std::move(policy)) {
    _qpus.resize(qpus.size());
    for (std::size_t i = 0; i < qpus.size(); ++i) {
        qpu_state& qs = _qpus[i];
        qs.spec = std::move(qpus[i]);
        if (const auto* p = std::get_if<periodic_calibration>(&qs.spec.calibration)) {
            qs.periodic = true;
            qs.per = *p;
        }
        _qpu_index.emplace(qs.spec.name, i);
    }
}

ledger::~ledger() = default;

result<std::unique_ptr<ledger>> ledger::open(std::vector<qpu_spec> qpus, ledger_options opts,
                                             const std::string& store_path,
                                             std::int64_t now_ns) {
    if (qpus.empty()) {
        return make_error(reason::invalid_argument, "qpus: at least one QPU is required");
    }
    std::set<std::string> names;
    for (std::size_t i = 0; i < qpus.size(); ++i) {
        const qpu_spec& q = qpus[i];
        const std::string where = "qpu[" + std::to_string(i) + "]";
        if (q.name.empty()) {
            return make_error(reason::invalid_argument, where + ".name is empty");
        }
        if (!names.insert(q.name).second) {
            return make_error(reason::duplicate, where + ".name \"" + q.name + "\" is used twice");
        }
        if (const auto* p = std::get_if<periodic_calibration>(&q.calibration)) {
            if (p->period_ns <= 0) {
                return make_error(reason::invalid_argument,
                                  where + ".period_ns must be > 0, got " + n2s(p->period_ns));
            }
            if (p->blackout_ns < 0 || p->blackout_ns >= p->period_ns) {
                return make_error(reason::invalid_argument,
                                  where + ".blackout_ns must be in [0, period_ns), got " +
                                      n2s(p->blackout_ns));
            }
            if (!(p->f0 > 0.0 && p->f0 <= 1.0)) {
                return make_error(reason::invalid_argument,
                                  where + ".f0 must be in (0, 1], got " + fmt_double(p->f0));
            }
            if (p->tau_ns < 0) {
                return make_error(reason::invalid_argument,
                                  where + ".tau_ns must be >= 0, got " + n2s(p->tau_ns));
            }
        }
    }
    if (opts.default_lease_ns <= 0 || opts.max_lease_ns < opts.default_lease_ns) {
        return make_error(reason::invalid_argument,
                          "default_lease_ns must be in (0, max_lease_ns], got " +
                              n2s(opts.default_lease_ns));
    }
    if (opts.horizon_ns <= 0) {
        return make_error(reason::invalid_argument,
                          "horizon_ns must be > 0, got " + n2s(opts.horizon_ns));
    }
    if (opts.max_windows == 0 || opts.max_windows > std::numeric_limits<std::size_t>::max() / 2) {
        return make_error(reason::invalid_argument,
                          "max_windows must be > 0, got " + std::to_string(opts.max_windows));
    }
    auto policy = make_policy(opts.policy);
    if (!policy) {
        return std::move(policy).err();
    }
    std::unique_ptr<ledger> l(new ledger(std::move(qpus), std::move(opts), std::move(*policy)));
    for (qpu_state& qs : l->_qpus) {
        if (qs.periodic) {
            qs.next_cycle = std::max<std::int64_t>(
                0, floor_div(now_ns - qs.per.phase_ns, qs.per.period_ns) - 1);
        }
    }
    if (!store_path.empty()) {
        auto st = store::open(store_path, l->_opts.store_busy_timeout_ms);
        if (!st) {
            return std::move(st).err();
        }
        l->_store = std::move(*st);
        if (auto s = l->reload(); !s) {
            return std::move(s).err();
        }
    }
    l->advance(now_ns);
    // Startup: nothing is ever dispatched late, leases kept running while
    // the agent was down, and results of jobs in flight are lost.
    std::vector<std::uint64_t> ids;
    ids.reserve(l->_res.size());
    for (const auto& [id, r] : l->_res) {
        ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    for (const std::uint64_t id : ids) {
        reservation& r = l->_res.at(id);
        if (r.state == res_state::committed && r.start_ns < now_ns) {
            l->set_state(r, res_state::missed, "agent was down at start", now_ns,
                         event_type::missed);
        } else if (r.state == res_state::held && r.lease_expires_ns <= now_ns) {
            l->set_state(r, res_state::expired, "lease ran out while the agent was down",
                         now_ns, event_type::expired);
        } else if (r.state == res_state::dispatched) {
            l->set_state(r, res_state::failed, "agent restarted before the result arrived",
                         now_ns, event_type::failed);
        }
    }
    if (auto s = l->persist(); !s) {
        return std::move(s).err();
    }
    return l;
}

status ledger::reload() {
    auto loaded = _store->load();
    if (!loaded) {
        return std::move(loaded).err();
    }
    _res.clear();
    _idem.clear();
    _usage.clear();
    _gangs.clear();
    _leases.clear();
    _dirty.clear();
    _dirty_windows.clear();
    _pending_events.clear();
    _next_id = std::max<std::uint64_t>(1, loaded->next_id);
    _next_token = std::max<std::uint64_t>(1, loaded->next_token);
    _next_gang = std::max<std::uint64_t>(1, loaded->next_gang);
    for (qpu_state& qs : _qpus) {
        qs.busy.clear();
        qs.pending.clear();
        qs.gaps.clear();
        if (!qs.periodic) {
            qs.windows.clear();
            qs.window_ids.clear();
            qs.window_lengths.clear();
        }
    }
    for (const auto& [name, w] : loaded->windows) {
        const auto it = _qpu_index.find(name);
        if (it != _qpu_index.end() && !_qpus[it->second].periodic) {
            add_window(it->second, w, false);
        }
    }
    for (reservation& r : loaded->reservations) {
        _next_id = std::max(_next_id, r.id + 1);
        _next_token = std::max(_next_token, r.fencing_token + 1);
        _next_gang = std::max(_next_gang, r.gang_id + 1);
        const auto qit = _qpu_index.find(r.qpu);
        if (qit == _qpu_index.end()) {
            if (is_active(r.state)) {
                return make_error(reason::unknown_qpu,
                                  "store: reservation " + u2s(r.id) + " is on qpu \"" + r.qpu +
                                      "\", which the configuration no longer declares");
            }
        } else if (is_active(r.state)) {
            qpu_state& qs = _qpus[qit->second];
            if (qs.periodic) {
                const std::int64_t cycle =
                    std::max<std::int64_t>(0, floor_div(r.start_ns - qs.per.phase_ns,
                                                        qs.per.period_ns));
                if (qs.windows.empty()) {
                    qs.next_cycle = std::min(qs.next_cycle, cycle);
                }
            }
            qs.busy.emplace(r.start_ns, r.id);
            if (r.state == res_state::committed) {
                qs.pending.emplace(r.start_ns, r.id);
            }
        }
        if (r.state == res_state::held) {
            _leases.emplace(r.lease_expires_ns, r.id);
        }
        if (!r.idempotency_key.empty()) {
            const std::string k = idem_key(r.tenant, r.idempotency_key);
            const auto it = _idem.find(k);
            if (it == _idem.end() || r.id < it->second) {
                _idem[k] = r.id;
            }
        }
        if (r.gang_id != 0) {
            _gangs[r.gang_id].push_back(r.id);
        }
        if (is_active(r.state)) {
            account(r, +1);
        }
        const std::uint64_t id = r.id;
        _res.emplace(id, std::move(r));
    }
    for (auto& [gid, ids] : _gangs) {
        std::sort(ids.begin(), ids.end());
    }
    for (std::size_t q = 0; q < _qpus.size(); ++q) {
        rebuild_gaps(q);
    }
    return {};
}

std::vector<std::string> ledger::qpu_names() const {
    std::vector<std::string> out;
    out.reserve(_qpus.size());
    for (const qpu_state& qs : _qpus) {
        out.push_back(qs.spec.name);
    }
    return out;
}

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
            // A new window may already hold reservations loaded from the store.
            std::int64_t free_from = w.valid_from_ns;
            for (; it != qs.busy.end() && it->first < w.valid_until_ns; ++it) {
                const reservation& r = _res.at(it->second);
                if (r.start_ns > free_from) {
                    qs.gaps.insert({free_from, r.start_ns});
                }
                free_from = std::max(free_from, r.end_ns());
            }
            if (free_from < w.valid_until_ns) {
                qs.gaps.insert({free_from, w.valid_until_ns});
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
            qs.gaps.insert({s, e});
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
    const std::int64_t s = r.start_ns;
    const std::int64_t e = r.end_ns();
    qs.busy.emplace(s, r.id);
    if (r.state == res_state::committed) {
        qs.pending.emplace(s, r.id);
    }
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
    if (const auto p = qs.pending.find(r.start_ns); p != qs.pending.end() && p->second == r.id) {
        qs.pending.erase(p);
    }
    // Give back the part of [start, end) that lies inside windows, merged
    // with neighbouring gaps of the same window.
    auto wit = qs.windows.upper_bound(r.start_ns);
    if (wit != qs.windows.begin()) {
        --wit;
    }
    for (; wit != qs.windows.end() && wit->second.valid_from_ns < r.end_ns(); ++wit) {
        ++_window_visits;
        const calibration_window& w = wit->second;
        std::int64_t s = std::max(r.start_ns, w.valid_from_ns);
        std::int64_t e = std::min(r.end_ns(), w.valid_until_ns);
        if (s >= e) {
            continue;
        }
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
    }
}

void ledger::emit(std::string_view type, const reservation& r, std::string_view why,
                  std::int64_t now_ns) {
    event ev;
    ev.type = std::string(type);
    ev.reservation_id = r.id;
    ev.tenant = r.tenant;
    ev.qpu = r.qpu;
    ev.reason = std::string(why);
    ev.time_ns = now_ns;
    ev.start_ns = r.start_ns;
    ev.state = r.state;
    _pending_events.push_back(std::move(ev));
}

void ledger::set_state(reservation& r, res_state to, std::string_view why, std::int64_t now_ns,
                       std::string_view ev_type) {
    const res_state from = r.state;
    const std::size_t q = _qpu_index.at(r.qpu);
    if (from == res_state::held) {
        _leases.erase({r.lease_expires_ns, r.id});
    }
    if (is_active(from) && !is_active(to)) {
        vacate(q, r);
        account(r, -1);
    } else if (from == res_state::committed) {
        if (const auto p = _qpus[q].pending.find(r.start_ns);
            p != _qpus[q].pending.end() && p->second == r.id) {
            _qpus[q].pending.erase(p);
        }
    }
    r.state = to;
    r.reason = std::string(why);
    r.updated_ns = now_ns;
    if (to == res_state::committed) {
        _qpus[q].pending.emplace(r.start_ns, r.id);
    }
    touch(r.id);
    emit(ev_type, r, why, now_ns);
}

void ledger::place(reservation& r, const slot& s) {
    r.qpu = _qpus[s.q].spec.name;
    r.start_ns = s.start_ns;
    r.calibration_id = s.window.calibration_id;
    occupy(s.q, r);
    touch(r.id);
}

reservation& ledger::insert_new(reservation r) {
    const std::uint64_t id = r.id;
    auto [it, inserted] = _res.emplace(id, std::move(r));
    (void)inserted;
    if (is_active(it->second.state)) {
        account(it->second, +1);
    }
    touch(id);
    return it->second;
}

void ledger::account(const reservation& r, int sign) {
    if (sign > 0) {
        tenant_usage& u = _usage[r.tenant];
        u.reservations += 1;
        u.booked_ns += r.duration_ns;
        u.payload_bytes += r.payload.size();
        return;
    }
    const auto it = _usage.find(r.tenant);
    if (it == _usage.end()) {
        return;
    }
    tenant_usage& u = it->second;
    u.reservations -= std::min<std::size_t>(u.reservations, 1);
    u.booked_ns -= std::min(u.booked_ns, r.duration_ns);
    u.payload_bytes -= std::min<std::uint64_t>(u.payload_bytes, r.payload.size());
    if (u.reservations == 0) {
        _usage.erase(it);  // bounded by the tenants holding something
    }
}

tenant_usage ledger::usage_of(std::string_view tenant) const {
    const auto it = _usage.find(std::string(tenant));
    return it == _usage.end() ? tenant_usage{} : it->second;
}

bool ledger::has_idempotency_key(std::string_view tenant, std::string_view key) const {
    return !key.empty() && _idem.count(idem_key(tenant, key)) != 0;
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
    return std::max(now_ns + _opts.min_lead_ns, req.not_before_ns);
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

std::optional<ledger::slot> ledger::earliest_fit(std::size_t q, std::int64_t from_ns,
                                                 const request& req, bool backfill) const {
    const qpu_state& qs = _qpus[q];
    const std::int64_t d = req.duration_ns;
    const std::int64_t latest_start = deadline_of(req) - d;
    std::int64_t t = from_ns;
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

std::optional<std::uint64_t> ledger::take_all(const std::vector<std::uint64_t>& ids) {
    if (!_gate.take) {
        return std::nullopt;
    }
    std::vector<std::uint64_t> taken;
    for (const std::uint64_t id : ids) {
        if (_res.at(id).state != res_state::committed) {
            continue;  // held: never handed over
        }
        if (!_gate.take(id)) {
            for (const std::uint64_t t : taken) {
                if (_gate.give_back) {
                    _gate.give_back(t);
                }
            }
            return id;
        }
        taken.push_back(id);
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

result<const reservation*> ledger::owned(std::string_view tenant, std::uint64_t id) const {
    const auto it = _res.find(id);
    if (it == _res.end()) {
        return make_error(reason::not_found, "reservation " + u2s(id) + " does not exist");
    }
    if (it->second.tenant != tenant) {
        return make_error(reason::not_owner, "reservation " + u2s(id) +
                                                 " does not belong to tenant \"" +
                                                 std::string(tenant) + "\"");
    }
    return &it->second;
}

result<reservation*> ledger::owned(std::string_view tenant, std::uint64_t id) {
    auto r = static_cast<const ledger*>(this)->owned(tenant, id);
    if (!r) {
        return std::move(r).err();
    }
    return const_cast<reservation*>(*r);
}

std::vector<std::uint64_t> ledger::members(const reservation& r) const {
    if (r.gang_id != 0) {
        if (const auto it = _gangs.find(r.gang_id); it != _gangs.end()) {
            return it->second;
        }
    }
    return {r.id};
}

bool ledger::gang_movable(const reservation& r) const {
    for (const std::uint64_t m : members(r)) {
        const res_state st = _res.at(m).state;
        if (st != res_state::held && st != res_state::committed) {
            return false;  // a member was dispatched or finished: the gang diverged
        }
    }
    return true;
}

result<reservation> ledger::status(std::string_view tenant, std::uint64_t id) const {
    auto r = owned(tenant, id);
    if (!r) {
        return std::move(r).err();
    }
    return **r;
}

result<job_result> ledger::job_result_of(std::string_view tenant, std::uint64_t id) const {
    auto r = owned(tenant, id);
    if (!r) {
        return std::move(r).err();
    }
    const reservation& res = **r;
    if (is_active(res.state)) {
        return make_error(reason::not_ready, "reservation " + u2s(id) + " is " +
                                                 std::string(to_string(res.state)) +
                                                 "; no result yet");
    }
    return job_result{res.id, res.state, res.result, res.reason, res.sent_ns, res.updated_ns};
}

const reservation* ledger::find(std::uint64_t id) const {
    const auto it = _res.find(id);
    return it == _res.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------- reservations

namespace {

bool same_request(const reservation& r, const request& req) {
    const std::int64_t deadline = req.deadline_ns > 0 ? req.deadline_ns : k_no_deadline_ns;
    return r.duration_ns == req.duration_ns && r.not_before_ns == req.not_before_ns &&
           r.deadline_ns == deadline && r.priority == req.priority &&
           r.min_fidelity == req.min_fidelity &&
           (req.qpus.empty() ||
            std::find(req.qpus.begin(), req.qpus.end(), r.qpu) != req.qpus.end());
}

}  // namespace

result<reservation> ledger::reserve(std::string_view tenant, const request& req,
                                    std::string_view idempotency_key, std::int64_t lease_ns,
                                    std::int64_t now_ns) {
    return reserve_impl(tenant, req, idempotency_key, lease_ns, nullptr, now_ns);
}

result<reservation> ledger::submit(std::string_view tenant, const request& req,
                                   std::string_view idempotency_key, blob payload,
                                   std::int64_t now_ns) {
    return reserve_impl(tenant, req, idempotency_key, 0, &payload, now_ns);
}

result<reservation> ledger::reserve_impl(std::string_view tenant, const request& req,
                                         std::string_view idempotency_key,
                                         std::int64_t lease_ns, blob* payload,
                                         std::int64_t now_ns) {
    if (tenant.empty()) {
        return make_error(reason::invalid_argument, "tenant is empty");
    }
    if (lease_ns < 0 || lease_ns > _opts.max_lease_ns) {
        return make_error(reason::invalid_argument, "lease_ns must be in [0, " +
                                                        n2s(_opts.max_lease_ns) + "], got " +
                                                        n2s(lease_ns));
    }
    if (auto v = validate(req, now_ns); !v) {
        return std::move(v).err();
    }
    if (!idempotency_key.empty()) {
        if (const auto it = _idem.find(idem_key(tenant, idempotency_key)); it != _idem.end()) {
            const reservation& prev = _res.at(it->second);
            if (prev.gang_id != 0 || !same_request(prev, req)) {
                return make_error(reason::duplicate,
                                  "idempotency_key \"" + std::string(idempotency_key) +
                                      "\" was already used by tenant \"" + std::string(tenant) +
                                      "\" for reservation " + u2s(prev.id) +
                                      " with a different request");
            }
            return prev;
        }
    }
    auto qs = resolve_qpus(req);
    advance(now_ns);
    const auto cands = candidates_for(req, *qs, now_ns, _policy->windows_considered());
    std::optional<slot> chosen;
    std::vector<std::uint64_t> victims;
    if (!cands.empty()) {
        const candidate& c = cands.front();
        const std::size_t q = _qpu_index.at(c.qpu);
        chosen = slot{q, c.start_ns, *window_at(q, c.start_ns)};
    } else if (_policy->preempts()) {
        // A committed victim the dispatcher already sends is pinned: the
        // QPU runs it, so it cannot be displaced; plan again without it.
        std::set<std::uint64_t> pinned;
        for (std::size_t attempt = 0; attempt < 16; ++attempt) {
            auto plan = preemption_fit(req, *qs, now_ns, pinned);
            if (!plan) {
                break;
            }
            if (const auto refused = take_all(plan->victims)) {
                pinned.insert(*refused);
                continue;
            }
            chosen = plan->s;
            victims = std::move(plan->victims);
            break;
        }
    }
    if (!chosen) {
        return no_fit_error(req, *qs, now_ns);
    }
    // From here on nothing fails.
    for (const std::uint64_t v : victims) {
        const reservation& vr = _res.at(v);
        vacate(_qpu_index.at(vr.qpu), vr);
    }
    reservation r;
    r.id = _next_id++;
    r.tenant = std::string(tenant);
    r.duration_ns = req.duration_ns;
    r.not_before_ns = req.not_before_ns;
    r.deadline_ns = deadline_of(req);
    r.priority = req.priority;
    r.min_fidelity = req.min_fidelity;
    r.idempotency_key = std::string(idempotency_key);
    r.lease_ns = lease_ns > 0 ? lease_ns : _opts.default_lease_ns;
    r.fencing_token = _next_token++;
    r.created_ns = now_ns;
    r.updated_ns = now_ns;
    if (payload != nullptr) {
        r.state = res_state::committed;
        r.payload = std::move(*payload);
        r.lease_expires_ns = 0;
    } else {
        r.state = res_state::held;
        r.lease_expires_ns = now_ns + r.lease_ns;
    }
    reservation& placed = insert_new(std::move(r));
    place(placed, *chosen);
    if (placed.state == res_state::held) {
        _leases.emplace(placed.lease_expires_ns, placed.id);
    }
    if (!placed.idempotency_key.empty()) {
        _idem.emplace(idem_key(tenant, idempotency_key), placed.id);
    }
    emit(placed.state == res_state::held ? event_type::reserved : event_type::committed, placed,
         "", now_ns);
    if (!victims.empty()) {
        _preemptions += victims.size();
        replace_or_displace(std::move(victims), true,
                            "preempted by reservation " + u2s(placed.id) + " (priority " +
                                std::to_string(req.priority) + ")",
                            now_ns, nullptr);
    }
    const std::uint64_t id = placed.id;
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return _res.at(id);
}

result<std::vector<reservation>> ledger::reserve_gang(std::string_view tenant, const request& req,
                                                      std::size_t k,
                                                      std::string_view idempotency_key,
                                                      std::int64_t lease_ns,
                                                      std::int64_t now_ns) {
    if (tenant.empty()) {
        return make_error(reason::invalid_argument, "tenant is empty");
    }
    if (lease_ns < 0 || lease_ns > _opts.max_lease_ns) {
        return make_error(reason::invalid_argument, "lease_ns must be in [0, " +
                                                        n2s(_opts.max_lease_ns) + "], got " +
                                                        n2s(lease_ns));
    }
    if (auto v = validate(req, now_ns); !v) {
        return std::move(v).err();
    }
    auto qs = resolve_qpus(req);
    if (k < 1 || k > qs->size()) {
        return make_error(reason::invalid_argument,
                          "gang size k must be in [1, " + std::to_string(qs->size()) +
                              "] (the QPUs requested), got " + std::to_string(k));
    }
    if (!idempotency_key.empty()) {
        if (const auto it = _idem.find(idem_key(tenant, idempotency_key)); it != _idem.end()) {
            const reservation& prev = _res.at(it->second);
            const auto ids = members(prev);
            if (prev.gang_id == 0 || ids.size() != k || !same_request(prev, req)) {
                return make_error(reason::duplicate,
                                  "idempotency_key \"" + std::string(idempotency_key) +
                                      "\" was already used by tenant \"" + std::string(tenant) +
                                      "\" for reservation " + u2s(prev.id) +
                                      " with a different request");
            }
            std::vector<reservation> out;
            for (const std::uint64_t id : ids) {
                out.push_back(_res.at(id));
            }
            return out;
        }
    }
    advance(now_ns);
    const auto slots = gang_fit(req, *qs, k, earliest_start(req, now_ns));
    if (!slots) {
        error e = no_fit_error(req, *qs, now_ns);
        e.message = "gang of " + std::to_string(k) + ": " + e.message;
        return e;
    }
    const std::uint64_t gang = _next_gang++;
    const std::uint64_t token = _next_token++;
    std::vector<std::uint64_t> ids;
    for (const slot& s : *slots) {
        reservation r;
        r.id = _next_id++;
        r.tenant = std::string(tenant);
        r.duration_ns = req.duration_ns;
        r.not_before_ns = req.not_before_ns;
        r.deadline_ns = deadline_of(req);
        r.priority = req.priority;
        r.min_fidelity = req.min_fidelity;
        r.idempotency_key = std::string(idempotency_key);
        r.lease_ns = lease_ns > 0 ? lease_ns : _opts.default_lease_ns;
        r.lease_expires_ns = now_ns + r.lease_ns;
        r.fencing_token = token;
        r.gang_id = gang;
        r.created_ns = now_ns;
        r.updated_ns = now_ns;
        reservation& placed = insert_new(std::move(r));
        place(placed, s);
        _leases.emplace(placed.lease_expires_ns, placed.id);
        ids.push_back(placed.id);
        emit(event_type::reserved, placed, "gang " + u2s(gang), now_ns);
    }
    _gangs.emplace(gang, ids);
    if (!idempotency_key.empty()) {
        _idem.emplace(idem_key(tenant, idempotency_key), ids.front());
    }
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    std::vector<reservation> out;
    for (const std::uint64_t id : ids) {
        out.push_back(_res.at(id));
    }
    return out;
}

std::size_t ledger::replace_or_displace(std::vector<std::uint64_t> ids, bool try_replace,
                                        std::string_view why, std::int64_t now_ns,
                                        std::size_t* replaced) {
    std::size_t displaced = 0;
    std::sort(ids.begin(), ids.end(), [&](std::uint64_t a, std::uint64_t b) {
        const reservation& ra = _res.at(a);
        const reservation& rb = _res.at(b);
        if (ra.priority != rb.priority) {
            return ra.priority > rb.priority;
        }
        if (ra.start_ns != rb.start_ns) {
            return ra.start_ns < rb.start_ns;
        }
        return a < b;
    });
    std::set<std::uint64_t> done_gangs;
    for (const std::uint64_t id : ids) {
        reservation& r = _res.at(id);
        if (!is_active(r.state) || r.state == res_state::dispatched) {
            continue;
        }
        // A gang moves as one while all its members are unsent; once one
        // member was dispatched the others can only be displaced alone.
        const bool movable = gang_movable(r);
        if (r.gang_id != 0 && movable && !done_gangs.insert(r.gang_id).second) {
            continue;
        }
        const std::vector<std::uint64_t> group =
            movable ? members(r) : std::vector<std::uint64_t>{r.id};
        request req;
        req.duration_ns = r.duration_ns;
        req.not_before_ns = r.not_before_ns;
        req.deadline_ns = r.deadline_ns == k_no_deadline_ns ? 0 : r.deadline_ns;
        req.priority = r.priority;
        req.min_fidelity = r.min_fidelity;
        std::vector<std::size_t> qs;
        for (const std::uint64_t m : group) {
            qs.push_back(_qpu_index.at(_res.at(m).qpu));
        }
        std::optional<std::vector<slot>> slots;
        const std::int64_t earliest = std::max(now_ns + std::max<std::int64_t>(_opts.min_lead_ns, 1), r.not_before_ns);
        if (try_replace && movable) {
            if (group.size() == 1) {
                if (auto s = earliest_fit(qs.front(), earliest, req, _policy->backfill())) {
                    slots = std::vector<slot>{std::move(*s)};
                }
            } else {
                slots = gang_fit(req, qs, group.size(), earliest);
            }
        }
        if (slots) {
            // gang_fit returns slots ordered by QPU index; match members by QPU.
            for (const std::uint64_t m : group) {
                reservation& mr = _res.at(m);
                const std::size_t mq = _qpu_index.at(mr.qpu);
                for (const slot& s : *slots) {
                    if (s.q == mq) {
                        place(mr, s);
                        mr.updated_ns = now_ns;
                        emit(event_type::replaced, mr, why, now_ns);
                        break;
                    }
                }
            }
            if (replaced != nullptr) {
                *replaced += group.size();
            }
        } else {
            const std::string msg =
                std::string(why) + (try_replace ? "; no other slot before its deadline" : "");
            for (const std::uint64_t m : group) {
                reservation& mr = _res.at(m);
                set_state(mr, res_state::displaced, msg, now_ns, event_type::displaced);
            }
            displaced += group.size();
        }
    }
    return displaced;
}

result<reservation> ledger::heartbeat(std::string_view tenant, std::uint64_t id,
                                      std::uint64_t fencing_token, std::int64_t now_ns) {
    auto o = owned(tenant, id);
    if (!o) {
        return std::move(o).err();
    }
    reservation& r = **o;
    if (r.fencing_token != fencing_token) {
        return make_error(reason::bad_fencing_token,
                          "fencing_token " + u2s(fencing_token) + " is stale for reservation " +
                              u2s(id));
    }
    if (r.state == res_state::expired ||
        (r.state == res_state::held && r.lease_expires_ns <= now_ns)) {
        return make_error(reason::lease_expired, "reservation " + u2s(id) + " lease expired at " +
                                                     n2s(r.lease_expires_ns));
    }
    if (r.state != res_state::held) {
        return make_error(reason::illegal_transition,
                          "heartbeat on reservation " + u2s(id) + " in state " +
                              std::string(to_string(r.state)) + " (only held has a lease)");
    }
    for (const std::uint64_t m : members(r)) {
        reservation& mr = _res.at(m);
        _leases.erase({mr.lease_expires_ns, mr.id});
        mr.lease_expires_ns = now_ns + mr.lease_ns;
        mr.updated_ns = now_ns;
        _leases.emplace(mr.lease_expires_ns, mr.id);
        touch(m);
    }
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return _res.at(id);
}

result<reservation> ledger::release(std::string_view tenant, std::uint64_t id,
                                    std::uint64_t fencing_token, std::int64_t now_ns) {
    auto o = owned(tenant, id);
    if (!o) {
        return std::move(o).err();
    }
    reservation& r = **o;
    if (r.fencing_token != fencing_token) {
        return make_error(reason::bad_fencing_token,
                          "fencing_token " + u2s(fencing_token) + " is stale for reservation " +
                              u2s(id));
    }
    if (r.state != res_state::held) {
        return make_error(reason::illegal_transition,
                          "release of reservation " + u2s(id) + " in state " +
                              std::string(to_string(r.state)) +
                              (r.state == res_state::committed ? " (use jobs.cancel)" : ""));
    }
    for (const std::uint64_t m : members(r)) {
        set_state(_res.at(m), res_state::released, "released by tenant", now_ns,
                  event_type::released);
    }
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return _res.at(id);
}

result<reservation> ledger::commit(std::string_view tenant, std::uint64_t id,
                                   std::uint64_t fencing_token, blob payload,
                                   std::int64_t now_ns) {
    auto o = owned(tenant, id);
    if (!o) {
        return std::move(o).err();
    }
    reservation& r = **o;
    if (r.fencing_token != fencing_token) {
        return make_error(reason::bad_fencing_token,
                          "fencing_token " + u2s(fencing_token) + " is stale for reservation " +
                              u2s(id));
    }
    if (r.state == res_state::expired ||
        (r.state == res_state::held && r.lease_expires_ns <= now_ns)) {
        return make_error(reason::lease_expired, "reservation " + u2s(id) + " lease expired at " +
                                                     n2s(r.lease_expires_ns));
    }
    if (r.state == res_state::displaced) {
        return make_error(reason::calibration_changed,
                          "reservation " + u2s(id) + " was displaced: " + r.reason);
    }
    if (r.state != res_state::held) {
        return make_error(reason::illegal_transition,
                          "commit of reservation " + u2s(id) + " in state " +
                              std::string(to_string(r.state)));
    }
    if (r.start_ns <= now_ns) {
        return make_error(reason::lease_expired, "reservation " + u2s(id) + " start_ns " +
                                                     n2s(r.start_ns) + " passed before commit");
    }
    const auto group = members(r);
    for (const std::uint64_t m : group) {
        reservation& mr = _res.at(m);
        account(mr, -1);
        mr.payload = payload;
        account(mr, +1);
        set_state(mr, res_state::committed, "", now_ns, event_type::committed);
    }
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return _res.at(id);
}

result<reservation> ledger::cancel(std::string_view tenant, std::uint64_t id,
                                   std::int64_t now_ns) {
    auto o = owned(tenant, id);
    if (!o) {
        return std::move(o).err();
    }
    reservation& r = **o;
    if (r.state != res_state::committed) {
        return make_error(reason::illegal_transition,
                          "cancel of reservation " + u2s(id) + " in state " +
                              std::string(to_string(r.state)) +
                              (r.state == res_state::held ? " (use slots.release)" : ""));
    }
    for (const std::uint64_t m : members(r)) {
        const reservation& mr = _res.at(m);
        if (mr.state != res_state::committed) {
            return make_error(reason::illegal_transition,
                              "cancel of gang reservation " + u2s(id) + ": member " + u2s(m) +
                                  " is already " + std::string(to_string(mr.state)));
        }
    }
    if (const auto refused = take_all(members(r))) {
        return make_error(reason::illegal_transition,
                          "cancel of job " + u2s(id) + ": job " + u2s(*refused) +
                              " is already being sent to the QPU; its outcome will follow the send");
    }
    for (const std::uint64_t m : members(r)) {
        set_state(_res.at(m), res_state::cancelled, "cancelled by tenant", now_ns,
                  event_type::cancelled);
    }
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return _res.at(id);
}

// ----------------------------------------------------------- calibration

result<std::vector<calibration_window>> ledger::calibration(std::string_view qpu,
                                                            std::int64_t now_ns,
                                                            std::int64_t until_ns) {
    const auto it = _qpu_index.find(std::string(qpu));
    if (it == _qpu_index.end()) {
        return make_error(reason::unknown_qpu,
                          "qpu \"" + std::string(qpu) + "\" is not a QPU of this host");
    }
    advance(now_ns);
    std::vector<calibration_window> out;
    const auto& ws = _qpus[it->second].windows;
    // Windows are disjoint and ordered: only the last one starting at or
    // before now can still be open; every later one ends after now.
    auto w = ws.upper_bound(now_ns);
    if (w != ws.begin() && std::prev(w)->second.valid_until_ns > now_ns) {
        --w;
    }
    for (; w != ws.end(); ++w) {
        ++_window_visits;
        out.push_back(w->second);
        if (w->second.valid_from_ns >= until_ns) {
            break;
        }
    }
    return out;
}

result<calibration_report> ledger::update_calibration(std::string_view qpu,
                                                      std::vector<calibration_window> windows,
                                                      std::int64_t now_ns) {
    const auto qit = _qpu_index.find(std::string(qpu));
    if (qit == _qpu_index.end()) {
        return make_error(reason::unknown_qpu,
                          "qpu \"" + std::string(qpu) + "\" is not a QPU of this host");
    }
    const std::size_t q = qit->second;
    qpu_state& qs = _qpus[q];
    if (qs.periodic) {
        return make_error(reason::invalid_argument,
                          "qpu \"" + std::string(qpu) +
                              "\" has a periodic calibration source; windows cannot be pushed");
    }
    std::set<std::uint64_t> ids;
    for (std::size_t i = 0; i < windows.size(); ++i) {
        const calibration_window& w = windows[i];
        const std::string where = "windows[" + std::to_string(i) + "]";
        if (w.calibration_id == 0) {
            return make_error(reason::invalid_argument, where + ".calibration_id must be > 0");
        }
        if (!ids.insert(w.calibration_id).second) {
            return make_error(reason::duplicate, where + ".calibration_id " +
                                                     u2s(w.calibration_id) + " is used twice");
        }
        if (w.valid_until_ns <= w.valid_from_ns) {
            return make_error(reason::invalid_argument,
                              where + " runs backwards: valid_until_ns " + n2s(w.valid_until_ns) +
                                  " <= valid_from_ns " + n2s(w.valid_from_ns));
        }
        if (!(w.f0 > 0.0 && w.f0 <= 1.0)) {
            return make_error(reason::invalid_argument,
                              where + ".f0 must be in (0, 1], got " + fmt_double(w.f0));
        }
        if (w.tau_ns < 0) {
            return make_error(reason::invalid_argument,
                              where + ".tau_ns must be >= 0, got " + n2s(w.tau_ns));
        }
    }
    std::vector<std::size_t> order(windows.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
        order[i] = i;
    }
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return windows[a].valid_from_ns < windows[b].valid_from_ns;
    });
    for (std::size_t i = 1; i < order.size(); ++i) {
        const calibration_window& a = windows[order[i - 1]];
        const calibration_window& b = windows[order[i]];
        if (b.valid_from_ns < a.valid_until_ns) {
            return make_error(reason::invalid_argument,
                              "windows[" + std::to_string(order[i]) + "] (calibration_id " +
                                  u2s(b.calibration_id) + ", valid_from_ns " +
                                  n2s(b.valid_from_ns) + ") overlaps windows[" +
                                  std::to_string(order[i - 1]) + "] (calibration_id " +
                                  u2s(a.calibration_id) + ", valid_until_ns " +
                                  n2s(a.valid_until_ns) + ")");
        }
    }
    // The update's windows that end after now replace every window ending
    // after now; those that ended already are history it cannot change.
    std::vector<const calibration_window*> fresh;
    for (const std::size_t i : order) {
        if (windows[i].valid_until_ns > now_ns) {
            fresh.push_back(&windows[i]);
        }
    }
    if (fresh.size() > _opts.max_windows) {
        return make_error(reason::invalid_argument,
                          "windows: " + std::to_string(fresh.size()) +
                              " windows end after now, more than the " +
                              std::to_string(_opts.max_windows) +
                              " a QPU holds ahead (timeline.max_windows)");
    }
    std::unordered_map<std::uint64_t, const calibration_window*> fresh_by_id;
    for (const calibration_window* f : fresh) {
        fresh_by_id.emplace(f->calibration_id, f);
    }
    // The windows the update takes out (keys of qs.windows): every one
    // ending after now, and history that overlaps a fresh window or carries
    // an id of the update.  Found by lookups, so the cost follows the update
    // and the windows ahead, never the history held.
    const auto first_ending_after = [&qs](std::int64_t t) {
        auto it = qs.windows.upper_bound(t);
        if (it != qs.windows.begin() && std::prev(it)->second.valid_until_ns > t) {
            --it;
        }
        return it;
    };
    std::vector<std::int64_t> drop;
    for (auto it = first_ending_after(now_ns); it != qs.windows.end(); ++it) {
        ++_window_visits;
        drop.push_back(it->first);
    }
    for (const calibration_window* f : fresh) {
        if (f->valid_from_ns >= now_ns) {
            break;  // sorted: no later one reaches back into history
        }
        for (auto it = first_ending_after(f->valid_from_ns);
             it != qs.windows.end() && it->second.valid_from_ns < f->valid_until_ns &&
             it->second.valid_until_ns <= now_ns;
             ++it) {
            ++_window_visits;
            drop.push_back(it->first);
        }
    }
    for (const std::uint64_t id : ids) {
        if (const auto k = qs.window_ids.find(id); k != qs.window_ids.end()) {
            ++_window_visits;
            if (qs.windows.at(k->second).valid_until_ns <= now_ns) {
                drop.push_back(k->second);
            }
        }
    }
    std::sort(drop.begin(), drop.end());
    drop.erase(std::unique(drop.begin(), drop.end()), drop.end());
    // The window a calibration_id names once the update is applied.
    const auto window_after = [&](std::uint64_t id) -> const calibration_window* {
        if (const auto f = fresh_by_id.find(id); f != fresh_by_id.end()) {
            return f->second;
        }
        if (ids.count(id) != 0) {
            return nullptr;  // named by the update, which says it ended
        }
        const auto k = qs.window_ids.find(id);
        if (k == qs.window_ids.end() || std::binary_search(drop.begin(), drop.end(), k->second)) {
            return nullptr;
        }
        return &qs.windows.at(k->second);
    };
    // Reservations whose window changed: gone, moved off them, or no longer
    // predicted good enough at their start.
    std::vector<std::uint64_t> affected;
    std::set<std::uint64_t> seen;
    for (const auto& [start, id] : qs.busy) {
        const reservation& r = _res.at(id);
        if (r.state == res_state::dispatched) {
            continue;
        }
        const calibration_window* w = window_after(r.calibration_id);
        const bool ok = w != nullptr && w->valid_from_ns <= r.start_ns &&
                        r.end_ns() <= w->valid_until_ns &&
                        (r.min_fidelity <= 0.0 ||
                         w->predicted_fidelity(r.start_ns) + k_fidelity_slack >= r.min_fidelity);
        if (!ok) {
            const std::vector<std::uint64_t> group =
                gang_movable(r) ? members(r) : std::vector<std::uint64_t>{r.id};
            for (const std::uint64_t m : group) {
                if (seen.insert(m).second) {
                    affected.push_back(m);
                }
            }
        }
    }
    // Apply: nothing below fails.
    for (const std::uint64_t id : affected) {
        const reservation& r = _res.at(id);
        vacate(_qpu_index.at(r.qpu), r);
    }
    for (const std::int64_t key : drop) {
        drop_window(q, qs.windows.find(key));
    }
    for (const calibration_window* f : fresh) {
        add_window(q, *f, true);
    }
    if (qs.windows.size() > 2 * _opts.max_windows) {
        prune_windows(q, std::numeric_limits<std::int64_t>::min(), now_ns);
    }
    rebuild_gaps(q);
    for (const std::uint64_t id : affected) {
        const reservation& r = _res.at(id);
        if (r.qpu != qs.spec.name) {
            rebuild_gaps(_qpu_index.at(r.qpu));  // a gang member elsewhere was vacated
        }
    }
    calibration_report rep;
    rep.windows = qs.windows.size();
    const bool try_replace = _opts.calibration_change == on_calibration_change::replace;
    const std::string why = "calibration of qpu " + std::string(qpu) + " changed";
    std::vector<std::uint64_t> future;
    for (const std::uint64_t id : affected) {
        reservation& r = _res.at(id);
        if (r.start_ns < now_ns && r.gang_id == 0) {
            set_state(r, res_state::displaced, why + " after its start passed", now_ns,
                      event_type::displaced);
            ++rep.displaced;
        } else {
            future.push_back(id);
        }
    }
    rep.displaced += replace_or_displace(std::move(future), try_replace, why, now_ns, &rep.replaced);
    event ev;
    ev.type = std::string(event_type::calibration);
    ev.qpu = std::string(qpu);
    ev.reason = std::to_string(rep.windows) + " windows; " + std::to_string(rep.replaced) +
                " reservations re-placed, " + std::to_string(rep.displaced) + " displaced";
    ev.time_ns = now_ns;
    _pending_events.push_back(std::move(ev));
    ++_generation;  // the windows changed, even when no row did
    advance(now_ns);
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return rep;
}

// ---------------------------------------------------------- housekeeping

result<std::size_t> ledger::expire_leases(std::int64_t now_ns) {
    std::vector<std::uint64_t> ids;
    for (auto it = _leases.begin(); it != _leases.end() && it->first <= now_ns; ++it) {
        ids.push_back(it->second);
    }
    for (const std::uint64_t id : ids) {
        reservation& r = _res.at(id);
        set_state(r, res_state::expired,
                  "lease ran out at " + n2s(r.lease_expires_ns) + " without a heartbeat", now_ns,
                  event_type::expired);
    }
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return ids.size();
}

result<std::size_t> ledger::mark_missed(std::int64_t now_ns, std::int64_t tolerance_ns) {
    if (tolerance_ns < 0) {
        return make_error(reason::invalid_argument,
                          "tolerance_ns must be >= 0, got " + n2s(tolerance_ns));
    }
    std::vector<std::uint64_t> ids;
    for (const qpu_state& qs : _qpus) {
        for (auto it = qs.pending.begin();
             it != qs.pending.end() && it->first < now_ns - tolerance_ns; ++it) {
            ids.push_back(it->second);
        }
    }
    for (const std::uint64_t id : ids) {
        reservation& r = _res.at(id);
        set_state(r, res_state::missed,
                  "not dispatched by start_ns " + n2s(r.start_ns) + " + tolerance " +
                      n2s(tolerance_ns) + " ns (now " + n2s(now_ns) + ")",
                  now_ns, event_type::missed);
    }
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return ids.size();
}

std::vector<reservation> ledger::due_jobs(std::string_view qpu,
                                          std::int64_t horizon_end_ns) const {
    std::vector<reservation> out;
    const auto it = _qpu_index.find(std::string(qpu));
    if (it == _qpu_index.end()) {
        return out;
    }
    const qpu_state& qs = _qpus[it->second];
    for (auto p = qs.pending.begin(); p != qs.pending.end() && p->first < horizon_end_ns; ++p) {
        out.push_back(_res.at(p->second));
    }
    return out;
}

// The dispatcher's four transitions share one shape: look the reservation
// up, check the state it must be in, change it, commit, return the record.
result<reservation> ledger::dispatch_transition(std::uint64_t id, std::string_view verb,
                                                res_state from, res_state to,
                                                std::string_view why, std::int64_t now_ns,
                                                std::string_view ev_type,
                                                const std::function<void(reservation&)>& change) {
    const auto it = _res.find(id);
    if (it == _res.end()) {
        return make_error(reason::not_found, "reservation " + u2s(id) + " does not exist");
    }
    reservation& r = it->second;
    if (r.state != from) {
        return make_error(reason::illegal_transition,
                          std::string(verb) + " of reservation " + u2s(id) + " in state " +
                              std::string(to_string(r.state)));
    }
    if (change) {
        change(r);
    }
    set_state(r, to, why, now_ns, ev_type);
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return _res.at(id);
}

result<reservation> ledger::mark_dispatched(std::uint64_t id, std::int64_t sent_ns) {
    return dispatch_transition(id, "mark_dispatched", res_state::committed, res_state::dispatched, "",
                               sent_ns, event_type::dispatched,
                               [sent_ns](reservation& r) { r.sent_ns = sent_ns; });
}

result<reservation> ledger::complete(std::uint64_t id, blob result_blob, std::int64_t now_ns) {
    return dispatch_transition(id, "complete", res_state::dispatched, res_state::completed, "", now_ns,
                               event_type::completed,
                               [&result_blob](reservation& r) { r.result = std::move(result_blob); });
}

result<reservation> ledger::fail(std::uint64_t id, std::string_view why, std::int64_t now_ns) {
    return dispatch_transition(id, "fail", res_state::dispatched, res_state::failed, why, now_ns,
                               event_type::failed, {});
}

result<reservation> ledger::mark_sent(std::uint64_t id, std::string_view why, std::int64_t now_ns) {
    return dispatch_transition(id, "mark_sent", res_state::dispatched, res_state::sent, why, now_ns,
                               event_type::sent, {});
}

result<reservation> ledger::miss(std::uint64_t id, std::string_view why, std::int64_t now_ns) {
    return dispatch_transition(id, "miss", res_state::committed, res_state::missed, why, now_ns,
                               event_type::missed, {});
}

result<std::size_t> ledger::forget_terminal(std::int64_t before_ns) {
    std::vector<std::uint64_t> ids;
    for (const auto& [id, r] : _res) {
        if (is_terminal(r.state) && r.end_ns() < before_ns) {
            bool whole_gang_done = true;
            for (const std::uint64_t m : members(r)) {
                const reservation& mr = _res.at(m);
                whole_gang_done = whole_gang_done && is_terminal(mr.state) && mr.end_ns() < before_ns;
            }
            if (whole_gang_done) {
                ids.push_back(id);
            }
        }
    }
    for (const std::uint64_t id : ids) {
        const reservation& r = _res.at(id);
        if (!r.idempotency_key.empty()) {
            const auto k = _idem.find(idem_key(r.tenant, r.idempotency_key));
            if (k != _idem.end() && k->second == id) {
                _idem.erase(k);
            }
        }
        if (r.gang_id != 0) {
            _gangs.erase(r.gang_id);
        }
        _res.erase(id);
        touch(id);
    }
    // Calibration windows follow the same rule, unless a live reservation
    // still sits in one.
    for (std::size_t q = 0; q < _qpus.size(); ++q) {
        prune_windows(q, before_ns, before_ns);
    }
    // A burst of records that has been forgotten leaves its hash buckets
    // behind: give them back once the tables are under a quarter full (the
    // tables double as they grow, so this never rehashes back and forth).
    const auto shrink = [](auto& table) {
        if (table.bucket_count() > 1024 && table.size() < table.bucket_count() / 4) {
            table.rehash(0);
        }
    };
    shrink(_res);
    shrink(_idem);
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return ids.size();
}

status ledger::checkpoint() {
    return _store ? _store->checkpoint() : timeline::status{};
}

std::vector<event> ledger::drain_events() {
    std::vector<event> out;
    out.swap(_events);
    return out;
}

ledger_stats ledger::stats() const {
    ledger_stats s;
    s.reservations = _res.size();
    s.preemptions = _preemptions;
    for (const qpu_state& qs : _qpus) {
        s.active += qs.busy.size();
        s.windows += qs.windows.size();
        s.gaps += qs.gaps.size();
    }
    s.reservation_buckets = _res.bucket_count();
    s.window_visits = _window_visits;
    s.store_rows_written = _store_rows;
    return s;
}

// ------------------------------------------------------------ durability

status ledger::persist() {
    if (!_dirty.empty() || !_dirty_windows.empty()) {
        ++_generation;
    }
    if (!_store || (_dirty.empty() && _dirty_windows.empty())) {
        // In memory, or nothing changed (an idle housekeeping tick): no
        // transaction, no fsync.
        _dirty.clear();
        _dirty_windows.clear();
        for (event& e : _pending_events) {
            _events.push_back(std::move(e));
        }
        _pending_events.clear();
        return {};
    }
    auto fail_with = [&](error e) -> timeline::status {
        _store->rollback();
        // Memory holds the failed operation; the store does not.  Reload so
        // that the ledger again equals what was acknowledged.
        (void)reload();
        return e;
    };
    if (auto s = _store->begin(); !s) {
        return fail_with(std::move(s).err());
    }
    std::sort(_dirty.begin(), _dirty.end());
    _dirty.erase(std::unique(_dirty.begin(), _dirty.end()), _dirty.end());
    for (const std::uint64_t id : _dirty) {
        const auto it = _res.find(id);
        auto s = it == _res.end() ? _store->erase(id) : _store->put(it->second);
        if (!s) {
            return fail_with(std::move(s).err());
        }
        ++_store_rows;
    }
    if (auto s = _store->put_counters(_next_id, _next_token, _next_gang); !s) {
        return fail_with(std::move(s).err());
    }
    // In the order they happened: a window dropped and one with its id
    // added by the same update end as the added one.
    for (const window_change& c : _dirty_windows) {
        const std::string& name = _qpus[c.q].spec.name;
        auto s = c.put ? _store->put_window(name, *c.put) : _store->erase_window(name, c.calibration_id);
        if (!s) {
            return fail_with(std::move(s).err());
        }
        ++_store_rows;
    }
    if (auto s = _store->commit(); !s) {
        return fail_with(std::move(s).err());
    }
    _dirty.clear();
    _dirty_windows.clear();
    for (event& e : _pending_events) {
        _events.push_back(std::move(e));
    }
    _pending_events.clear();
    return {};
}

// ------------------------------------------------------------ invariants

std::vector<std::string> ledger::check_invariants() const {
    std::vector<std::string> bad;
    auto fail = [&](std::string m) { bad.push_back(std::move(m)); };
    std::size_t active = 0;
    for (const auto& [id, r] : _res) {
        const std::string who = "reservation " + u2s(id) + " (" +
                                std::string(to_string(r.state)) + ")";
        if (r.id != id) {
            fail(who + ": id field " + u2s(r.id));
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
        if (r.state == res_state::held || r.state == res_state::committed) {
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
    for (std::size_t q = 0; q < _qpus.size(); ++q) {
        const qpu_state& qs = _qpus[q];
        const std::string& name = qs.spec.name;
        busy_total += qs.busy.size();
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
        // Gaps must equal windows minus busy intervals (from the pruning point).
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
    if (busy_total != active) {
        fail("busy maps hold " + std::to_string(busy_total) + " entries for " +
             std::to_string(active) + " active reservations");
    }
    return bad;
}

}  // namespace qrt::timeline
