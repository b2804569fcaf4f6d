// The ledger's calibration: calibration.get and calibration.update (which
// re-places or displaces the reservations whose window changed).
#include "ledger_internal.hpp"

namespace qrt::timeline {

using namespace detail;

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
                                                      std::int64_t now_ns, std::uint64_t block_id,
                                                      std::string_view tenant) {
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
    // The block it closes: checked before anything changes.
    calibration_block* closing = nullptr;
    if (block_id != 0) {
        const auto bit = _blocks.find(block_id);
        if (bit == _blocks.end()) {
            return make_error(reason::not_found, "block_id: calibration block " + u2s(block_id) + " does not exist");
        }
        closing = &bit->second;
        if (closing->tenant != tenant) {
            return make_error(reason::not_owner, "block_id: calibration block " + u2s(block_id) +
                                                     " does not belong to tenant \"" + std::string(tenant) + "\"");
        }
        if (closing->qpu != qpu) {
            return make_error(reason::invalid_argument, "block_id: calibration block " + u2s(block_id) +
                                                            " is on qpu \"" + closing->qpu + "\", not \"" +
                                                            std::string(qpu) + "\"");
        }
        if (!is_live(closing->state)) {
            return make_error(reason::illegal_transition,
                              "block_id: calibration block " + u2s(block_id) + " is " +
                                  std::string(to_string(closing->state)) + " already");
        }
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
    // predicted good enough at their start.  A committed job goes through
    // the dispatch gate first, as for a cancel or a preemption: one whose
    // frame is already going out stays where it is (with its gang), and
    // what happened on the wire decides its outcome; it is never re-placed
    // and then marked dispatched.
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
            if (std::any_of(group.begin(), group.end(), [&](std::uint64_t m) { return seen.count(m) != 0; })) {
                continue;  // withdrawn with an earlier member
            }
            if (withdraw_all(group).has_value()) {
                ++_calibration_pinned;  // going out: left in place
                for (const std::uint64_t m : group) {
                    if (_res.at(m).state == res_state::committed) {
                        _going_out.insert(m);
                    }
                }
                continue;
            }
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
    ++_calibration_generation;
    advance(now_ns);
    if (closing != nullptr) {
        end_block(*closing, block_state::completed,
                  "closed by calibration.update (" + std::to_string(rep.windows) + " windows)", now_ns);
    }
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return rep;
}

}  // namespace qrt::timeline
