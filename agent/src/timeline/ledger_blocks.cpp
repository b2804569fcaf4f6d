// The ledger's calibration blocks: calibration.request (the latest start
// that ends by needed_by, around every committed job), the yield of held
// reservations in a block's way, settle (cleared, started, ended, failed),
// cancel, and the block as a blackout that only its own jobs use.
#include "ledger_internal.hpp"

namespace qrt::timeline {

using namespace detail;

namespace {

constexpr std::size_t k_max_step = 64;

bool valid_step(std::string_view s) {
    if (s.empty() || s.size() > k_max_step) {
        return false;
    }
    return std::all_of(s.begin(), s.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
               c == '.' || c == ':' || c == '/' || c == '-';
    });
}

bool same_block_request(const calibration_block& b, const block_request& req) {
    return b.qpu == req.qpu && b.step == req.step && b.duration_ns == req.duration_ns &&
           b.needed_by_ns == req.needed_by_ns && b.urgency == req.urgency;
}

std::string block_name(const calibration_block& b) {
    return "calibration block " + u2s(b.id) + " (step " + b.step + ")";
}

}  // namespace

// ---------------------------------------------------------------- lookups

const calibration_block* ledger::live_block_at(std::size_t q, std::int64_t t_ns) const {
    const auto& bs = _qpus[q].blocks;
    auto it = bs.upper_bound(t_ns);
    if (it == bs.begin()) {
        return nullptr;
    }
    --it;
    const calibration_block& b = _blocks.at(it->second);
    return t_ns < b.end_ns() ? &b : nullptr;
}

const calibration_block* ledger::live_block_over(std::size_t q, std::int64_t s, std::int64_t e) const {
    if (const calibration_block* b = live_block_at(q, s)) {
        return b;
    }
    const auto& bs = _qpus[q].blocks;
    const auto it = bs.upper_bound(s);
    return it != bs.end() && it->first < e ? &_blocks.at(it->second) : nullptr;
}

std::vector<std::uint64_t> ledger::overlapping(std::size_t q, std::int64_t s, std::int64_t e,
                                               std::uint64_t block_id) const {
    const qpu_state& qs = _qpus[q];
    std::vector<std::uint64_t> out;
    const auto own = [block_id](const reservation& r) { return block_id != 0 && r.block_id == block_id; };
    // Placed reservations never overlap: only the one starting last at or
    // before s can reach into [s, e) from the left.
    auto it = qs.busy.upper_bound(s);
    if (it != qs.busy.begin()) {
        const reservation& r = _res.at(std::prev(it)->second);
        if (r.end_ns() > s && !own(r)) {
            out.push_back(r.id);
        }
    }
    for (; it != qs.busy.end() && it->first < e; ++it) {
        if (const reservation& r = _res.at(it->second); !own(r)) {
            out.push_back(r.id);
        }
    }
    return out;
}

const calibration_block* ledger::find_block(std::uint64_t id) const {
    const auto it = _blocks.find(id);
    return it == _blocks.end() ? nullptr : &it->second;
}

std::vector<std::uint64_t> ledger::yielders(std::uint64_t block_id) const {
    const calibration_block* b = find_block(block_id);
    if (b == nullptr || b->state != block_state::yielding) {
        return {};
    }
    return overlapping(_qpu_index.at(b->qpu), b->start_ns, b->end_ns(), b->id);
}

std::vector<calibration_block> ledger::blocks(std::string_view qpu) const {
    std::vector<calibration_block> out;
    for (const auto& [id, b] : _blocks) {
        if (qpu.empty() || b.qpu == qpu) {
            out.push_back(b);
        }
    }
    std::sort(out.begin(), out.end(), [](const calibration_block& a, const calibration_block& b) {
        return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.id < b.id;
    });
    return out;
}

std::optional<calibration_block> ledger::next_block(std::string_view qpu, std::int64_t now_ns) const {
    const auto qit = _qpu_index.find(std::string(qpu));
    if (qit == _qpu_index.end()) {
        return std::nullopt;
    }
    if (const calibration_block* b = live_block_at(qit->second, now_ns)) {
        return *b;
    }
    const auto& bs = _qpus[qit->second].blocks;
    const auto it = bs.upper_bound(now_ns);
    if (it == bs.end()) {
        return std::nullopt;
    }
    return _blocks.at(it->second);
}

std::optional<double> ledger::predicted_fidelity(std::string_view qpu, std::int64_t t_ns) const {
    const auto qit = _qpu_index.find(std::string(qpu));
    if (qit == _qpu_index.end()) {
        return std::nullopt;
    }
    const auto& ws = _qpus[qit->second].windows;
    auto it = ws.upper_bound(t_ns);
    if (it == ws.begin()) {
        return std::nullopt;
    }
    return std::prev(it)->second.predicted_fidelity(t_ns);
}

std::optional<candidate> ledger::earliest_block(std::string_view qpu, std::int64_t duration_ns,
                                                std::int64_t now_ns) {
    const auto qit = _qpu_index.find(std::string(qpu));
    if (qit == _qpu_index.end() || duration_ns <= 0) {
        return std::nullopt;
    }
    advance(now_ns);
    request req;
    req.duration_ns = duration_ns;
    const std::int64_t from = earliest_start(req, now_ns);
    if (const auto s = earliest_fit(qit->second, from, req, true)) {
        return to_candidate(*s, req, from);
    }
    return std::nullopt;
}

std::string ledger::earliest_block_text(std::size_t q, std::int64_t d, std::int64_t now_ns) {
    const auto c = earliest_block(_qpus[q].spec.name, d, now_ns);
    if (!c) {
        return "; no block of duration_ns " + n2s(d) + " fits within the windows qrtd holds for qpu " +
               _qpus[q].spec.name;
    }
    return "; the earliest block is start_ns " + n2s(c->start_ns) + " to end_ns " + n2s(c->end_ns) +
           " (calibration_id " + u2s(c->calibration_id) + ")";
}

std::string ledger::blocks_in_the_way(const request& req, const std::vector<std::size_t>& qs,
                                      std::int64_t now_ns) const {
    std::string out;
    const std::int64_t from = earliest_start(req, now_ns);
    const std::int64_t until = deadline_of(req);
    for (const std::size_t q : qs) {
        const calibration_block* b = live_block_over(q, from, until);
        if (b == nullptr) {
            continue;
        }
        out += "; " + block_name(*b) + " holds qpu " + b->qpu + " from " + n2s(b->start_ns) + " to " +
               n2s(b->end_ns());
        request after = req;
        after.deadline_ns = 0;
        if (const auto s = earliest_fit(q, std::max(from, b->end_ns()), after, _policy->backfill())) {
            out += "; the earliest start after it is " + n2s(s->start_ns);
        }
    }
    return out;
}

// ---------------------------------------------------------------- placement

std::optional<ledger::block_place> ledger::place_block(std::size_t q, std::int64_t d, std::int64_t from_ns,
                                                       std::int64_t until_ns) const {
    const qpu_state& qs = _qpus[q];
    from_ns = std::max(from_ns, qs.placeable_from_ns);
    if (until_ns - d < from_ns) {
        return std::nullopt;
    }
    // 1. The latest free time that ends by until: gaps lie inside one
    // window and outside every reservation and live block.
    if (const auto g = qs.gaps.last_fit(until_ns, d)) {
        const std::int64_t s = std::min(g->end_ns, until_ns) - d;
        if (s >= from_ns) {
            if (const auto w = window_at(q, s)) {
                return block_place{s, *w, {}};
            }
        }
    }
    // 2. The latest place in one window where only held reservations stand
    // in the way: each committed or dispatched job (an acknowledgement)
    // and each live block moves the search to before it.
    std::size_t steps = 0;
    auto wit = qs.windows.lower_bound(until_ns);
    while (wit != qs.windows.begin()) {
        --wit;
        ++_window_visits;
        const calibration_window& w = wit->second;
        if (w.valid_until_ns <= from_ns) {
            break;
        }
        const std::int64_t lo = std::max(w.valid_from_ns, from_ns);
        std::int64_t e = std::min(w.valid_until_ns, until_ns);
        while (e - d >= lo && steps++ < _opts.max_gang_search_steps) {
            const std::int64_t s = e - d;
            if (const calibration_block* b = live_block_over(q, s, e)) {
                e = b->start_ns;
                continue;
            }
            std::vector<std::uint64_t> held;
            std::int64_t blocked_at = std::numeric_limits<std::int64_t>::max();
            for (const std::uint64_t id : overlapping(q, s, e, 0)) {
                const reservation& r = _res.at(id);
                if (r.state == res_state::held) {
                    held.push_back(id);
                } else {
                    blocked_at = std::min(blocked_at, r.start_ns);
                }
            }
            if (blocked_at != std::numeric_limits<std::int64_t>::max()) {
                e = blocked_at;
                continue;
            }
            return block_place{s, w, std::move(held)};
        }
        if (steps >= _opts.max_gang_search_steps) {
            break;
        }
    }
    return std::nullopt;
}

std::optional<ledger::slot> ledger::block_fit(const calibration_block& b, std::int64_t from_ns,
                                              const request& req) const {
    const std::size_t q = _qpu_index.at(b.qpu);
    const qpu_state& qs = _qpus[q];
    const std::int64_t d = req.duration_ns;
    const std::int64_t limit = std::min(b.end_ns(), deadline_of(req));
    std::int64_t s = std::max({from_ns, b.start_ns, req.not_before_ns, qs.placeable_from_ns});
    // Bounded by the block's own jobs and the windows it spans.
    while (s <= limit - d) {
        const auto w = window_at(q, s);
        if (!w) {
            const auto next = qs.windows.upper_bound(s);
            if (next == qs.windows.end()) {
                return std::nullopt;
            }
            s = next->first;
            continue;
        }
        if (s + d > w->valid_until_ns ||
            (req.min_fidelity > 0.0 && w->predicted_fidelity(s) + k_fidelity_slack < req.min_fidelity)) {
            s = w->valid_until_ns;
            continue;
        }
        auto it = qs.busy.upper_bound(s);
        if (it != qs.busy.begin()) {
            if (const reservation& r = _res.at(std::prev(it)->second); r.end_ns() > s) {
                s = r.end_ns();
                continue;
            }
        }
        if (it != qs.busy.end() && it->first < s + d) {
            s = _res.at(it->second).end_ns();
            continue;
        }
        return slot{q, s, *w};
    }
    return std::nullopt;
}

result<const calibration_block*> ledger::block_for_job(std::string_view tenant, const request& req) const {
    const auto it = _blocks.find(req.block_id);
    if (it == _blocks.end()) {
        return make_error(reason::not_found, "block_id: calibration block " + u2s(req.block_id) + " does not exist");
    }
    const calibration_block& b = it->second;
    if (b.tenant != tenant) {
        return make_error(reason::not_owner, "block_id: " + block_name(b) + " belongs to another tenant than \"" +
                                                 std::string(tenant) + "\"");
    }
    if (b.state != block_state::scheduled && b.state != block_state::started) {
        return make_error(reason::illegal_transition,
                          "block_id: " + block_name(b) + " is " + std::string(to_string(b.state)) +
                              "; jobs go into a block that is scheduled or started");
    }
    if (!req.qpus.empty() && (req.qpus.size() != 1 || req.qpus.front() != b.qpu)) {
        return make_error(reason::invalid_argument,
                          "qpus: " + block_name(b) + " is on qpu \"" + b.qpu + "\" only");
    }
    return &b;
}

// ---------------------------------------------------------------- changes

void ledger::emit_block(std::string_view type, const calibration_block& b, std::int64_t now_ns) {
    event ev;
    ev.type = std::string(type);
    ev.qpu = b.qpu;
    ev.tenant = b.tenant;
    ev.reason = b.reason;
    ev.time_ns = now_ns;
    ev.start_ns = b.start_ns;
    ev.block = b;
    _pending_events.push_back(std::move(ev));
}

void ledger::set_block_state(calibration_block& b, block_state to, std::string_view why, std::int64_t now_ns) {
    b.state = to;
    b.reason = std::string(why);
    b.updated_ns = now_ns;
    if (to != block_state::yielding) {
        b.yield_deadline_ns = 0;
    }
    touch_block(b.id);
    ++_generation;
}

void ledger::end_block(calibration_block& b, block_state to, std::string_view why, std::int64_t now_ns) {
    const std::size_t q = _qpu_index.at(b.qpu);
    qpu_state& qs = _qpus[q];
    if (const auto it = qs.blocks.find(b.start_ns); it != qs.blocks.end() && it->second == b.id) {
        qs.blocks.erase(it);
    }
    // What is left of it, and the time its yielders gave back, is free.
    free_interval(q, std::max(b.start_ns, qs.pruned_before_ns), b.end_ns());
    std::string reason(why);
    if (to == block_state::failed) {
        reason += earliest_block_text(q, b.duration_ns, now_ns);
    }
    set_block_state(b, to, reason, now_ns);
    emit_block(event_type::calibration_ended, b, now_ns);
    // Ended blocks kept per QPU: at most as many as the live bound.
    std::vector<std::pair<std::int64_t, std::uint64_t>> ended;
    for (const auto& [id, x] : _blocks) {
        if (x.qpu == b.qpu && !is_live(x.state)) {
            ended.emplace_back(x.end_ns(), id);
        }
    }
    if (ended.size() > _opts.max_calibration_blocks) {
        std::sort(ended.begin(), ended.end());
        for (std::size_t i = 0; i + _opts.max_calibration_blocks < ended.size(); ++i) {
            const std::uint64_t id = ended[i].second;
            if (id == b.id) {
                continue;
            }
            const calibration_block& old = _blocks.at(id);
            if (const auto k = _block_idem.find(idem_key(old.tenant, old.idempotency_key));
                k != _block_idem.end() && k->second == id) {
                _block_idem.erase(k);
            }
            _blocks.erase(id);
            touch_block(id);
        }
    }
}

void ledger::fail_blocks_of(const reservation& r, std::int64_t now_ns) {
    const std::size_t q = _qpu_index.at(r.qpu);
    for (;;) {
        const calibration_block* b = live_block_over(q, r.start_ns, r.end_ns());
        if (b == nullptr || b->state != block_state::yielding || r.block_id == b->id) {
            return;
        }
        end_block(_blocks.at(b->id), block_state::failed,
                  "reservation " + u2s(r.id) + " in its time was committed before yield_deadline_ns " +
                      n2s(b->yield_deadline_ns) + ": an acknowledged job is never displaced for calibration",
                  now_ns);
    }
}

result<calibration_block> ledger::request_block(std::string_view tenant, const block_request& req,
                                                std::string_view idempotency_key, std::int64_t now_ns) {
    if (tenant.empty()) {
        return make_error(reason::invalid_argument, "tenant is empty");
    }
    const auto qit = _qpu_index.find(req.qpu);
    if (qit == _qpu_index.end()) {
        return make_error(reason::unknown_qpu, "qpu \"" + req.qpu + "\" is not a QPU of this host");
    }
    const std::size_t q = qit->second;
    qpu_state& qs = _qpus[q];
    if (!valid_step(req.step)) {
        return make_error(reason::invalid_argument,
                          "step must be 1 to " + std::to_string(k_max_step) +
                              " characters of [A-Za-z0-9_.:/-]");
    }
    if (req.duration_ns <= 0) {
        return make_error(reason::invalid_argument, "duration_ns must be > 0, got " + n2s(req.duration_ns));
    }
    if (req.needed_by_ns <= now_ns) {
        return make_error(reason::deadline_passed,
                          "needed_by_ns " + n2s(req.needed_by_ns) + " is not after now (" + n2s(now_ns) +
                              "): the calibration in force is stale already");
    }
    if (!idempotency_key.empty()) {
        if (const auto it = _block_idem.find(idem_key(tenant, idempotency_key)); it != _block_idem.end()) {
            const calibration_block& prev = _blocks.at(it->second);
            if (!same_block_request(prev, req)) {
                return make_error(reason::duplicate, "idempotency_key \"" + std::string(idempotency_key) +
                                                         "\" was already used by tenant \"" + std::string(tenant) +
                                                         "\" for " + block_name(prev) + " with a different request");
            }
            return prev;
        }
    }
    std::int64_t longest = 0;
    if (qs.periodic) {
        longest = qs.per.period_ns - qs.per.blackout_ns;
    } else if (!qs.window_lengths.empty()) {
        longest = *qs.window_lengths.rbegin();
    }
    if (longest > 0 && req.duration_ns > longest) {
        return make_error(reason::invalid_argument,
                          "duration_ns " + n2s(req.duration_ns) + " is longer than the longest calibration window (" +
                              n2s(longest) + " ns) of qpu " + req.qpu + "; a block lies inside one window");
    }
    if (qs.blocks.size() >= _opts.max_calibration_blocks) {
        return make_error(reason::overloaded, "qpu " + req.qpu + " holds " + std::to_string(qs.blocks.size()) +
                                                  " live calibration blocks already (timeline.max_calibration_blocks)");
    }
    advance(now_ns);
    request probe;
    probe.duration_ns = req.duration_ns;
    const std::int64_t from = earliest_start(probe, now_ns);
    auto place = place_block(q, req.duration_ns, from, req.needed_by_ns);
    if (!place) {
        error e = make_error(reason::no_fit,
                             "no calibration block of duration_ns " + n2s(req.duration_ns) + " on qpu " + req.qpu +
                                 " ends by needed_by_ns " + n2s(req.needed_by_ns) + " from " + n2s(from) +
                                 " (now + min_lead_ns) without displacing a committed job" +
                                 earliest_block_text(q, req.duration_ns, now_ns));
        e.qpu = req.qpu;
        return e;
    }
    // From here on nothing fails.
    calibration_block b;
    b.id = _next_block++;
    b.tenant = std::string(tenant);
    b.qpu = req.qpu;
    b.step = req.step;
    b.start_ns = place->start_ns;
    b.duration_ns = req.duration_ns;
    b.needed_by_ns = req.needed_by_ns;
    b.urgency = req.urgency;
    b.calibration_id = place->window.calibration_id;
    b.idempotency_key = std::string(idempotency_key);
    b.created_ns = now_ns;
    b.updated_ns = now_ns;
    if (place->yielders.empty()) {
        b.state = block_state::scheduled;
    } else {
        b.state = block_state::yielding;
        b.yield_deadline_ns = std::min(sat_add(now_ns, _opts.calibration_yield_ns), b.start_ns);
        b.reason = std::to_string(place->yielders.size()) + " held reservation" +
                   (place->yielders.size() == 1 ? " was" : "s were") + " asked to yield";
    }
    const std::uint64_t id = b.id;
    calibration_block& placed = _blocks.emplace(id, std::move(b)).first->second;
    qs.blocks.emplace(placed.start_ns, id);
    carve(q, placed.start_ns, placed.end_ns());
    touch_block(id);
    ++_generation;
    if (!idempotency_key.empty()) {
        _block_idem.emplace(idem_key(tenant, idempotency_key), id);
    }
    emit_block(event_type::calibration_scheduled, placed, now_ns);
    for (const std::uint64_t rid : place->yielders) {
        const reservation& r = _res.at(rid);
        request move;
        move.duration_ns = r.duration_ns;
        move.not_before_ns = r.not_before_ns;
        move.deadline_ns = r.deadline_ns == k_no_deadline_ns ? 0 : r.deadline_ns;
        move.min_fidelity = r.min_fidelity;
        event ev;
        ev.type = std::string(event_type::yield_requested);
        ev.reservation_id = r.id;
        ev.tenant = r.tenant;
        ev.qpu = r.qpu;
        ev.time_ns = now_ns;
        ev.start_ns = r.start_ns;
        ev.state = r.state;
        ev.block = placed;
        ev.deadline_ns = placed.yield_deadline_ns;
        if (const auto s = earliest_fit(q, std::max(from, r.not_before_ns), move, true)) {
            ev.free_start_ns = s->start_ns;
        }
        const bool revoke = _opts.calibration_preempt == calibration_preempt::held && r.priority < placed.urgency;
        ev.at_deadline = revoke ? "revoke" : "keep";
        ev.reason = block_name(placed) + " on qpu " + placed.qpu + " needs start_ns " + n2s(placed.start_ns) +
                    " to end_ns " + n2s(placed.end_ns()) + ": release or move reservation " + u2s(r.id) +
                    " by " + n2s(ev.deadline_ns) +
                    (revoke ? ", or it is revoked then" : "; it is kept otherwise and the block fails");
        _pending_events.push_back(std::move(ev));
    }
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return _blocks.at(id);
}

result<calibration_block> ledger::cancel_block(std::string_view tenant, std::uint64_t id, std::int64_t now_ns) {
    const auto it = _blocks.find(id);
    if (it == _blocks.end()) {
        return make_error(reason::not_found, "calibration block " + u2s(id) + " does not exist");
    }
    calibration_block& b = it->second;
    if (b.tenant != tenant) {
        return make_error(reason::not_owner, "calibration block " + u2s(id) + " does not belong to tenant \"" +
                                                 std::string(tenant) + "\"");
    }
    if (!is_live(b.state)) {
        return make_error(reason::illegal_transition,
                          "cancel of " + block_name(b) + " in state " + std::string(to_string(b.state)));
    }
    advance(now_ns);
    end_block(b, block_state::cancelled, "cancelled by its calibration service", now_ns);
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return _blocks.at(id);
}

result<std::size_t> ledger::settle_blocks(std::int64_t now_ns) {
    std::vector<std::uint64_t> live;
    for (const qpu_state& qs : _qpus) {
        for (const auto& [start, id] : qs.blocks) {
            live.push_back(id);
        }
    }
    std::size_t changed = 0;
    for (const std::uint64_t id : live) {
        calibration_block& b = _blocks.at(id);
        const std::size_t q = _qpu_index.at(b.qpu);
        if (b.state == block_state::yielding) {
            const auto in_way = overlapping(q, b.start_ns, b.end_ns(), b.id);
            bool acknowledged = false;
            bool revocable = _opts.calibration_preempt == calibration_preempt::held;
            for (const std::uint64_t rid : in_way) {
                const reservation& r = _res.at(rid);
                acknowledged = acknowledged || r.state != res_state::held;
                revocable = revocable && r.priority < b.urgency;
            }
            if (in_way.empty()) {
                set_block_state(b, block_state::scheduled, "the held reservations in its time yielded", now_ns);
                emit_block(event_type::calibration_scheduled, b, now_ns);
                ++changed;
            } else if (acknowledged) {
                end_block(b, block_state::failed,
                          "a reservation in its time was committed: an acknowledged job is never displaced for "
                          "calibration",
                          now_ns);
                ++changed;
                continue;
            } else if (now_ns >= b.yield_deadline_ns && revocable) {
                for (const std::uint64_t rid : in_way) {
                    const reservation& r = _res.at(rid);
                    if (r.state != res_state::held) {
                        continue;  // a gang member revoked with an earlier one
                    }
                    const std::string why = "revoked for " + block_name(b) + " on qpu " + b.qpu +
                                            ": it did not yield by " + n2s(b.yield_deadline_ns) +
                                            " and its priority " + std::to_string(r.priority) +
                                            " is below the block's urgency " + std::to_string(b.urgency);
                    for (const std::uint64_t m : members(r)) {
                        if (reservation& mr = _res.at(m); mr.state == res_state::held) {
                            set_state(mr, res_state::displaced, why, now_ns, event_type::displaced);
                        }
                    }
                }
                set_block_state(b, block_state::scheduled, "the held reservations in its time were revoked", now_ns);
                emit_block(event_type::calibration_scheduled, b, now_ns);
                ++changed;
            } else if (now_ns >= b.yield_deadline_ns) {
                std::string ids;
                for (const std::uint64_t rid : in_way) {
                    ids += (ids.empty() ? "" : ", ") + u2s(rid);
                }
                end_block(b, block_state::failed,
                          "held reservation(s) " + ids + " did not yield by yield_deadline_ns " +
                              n2s(b.yield_deadline_ns) +
                              (_opts.calibration_preempt == calibration_preempt::held
                                   ? " and not every one's priority is below the block's urgency " +
                                         std::to_string(b.urgency)
                                   : std::string(" and timeline.calibration_preempt is \"never\"")),
                          now_ns);
                ++changed;
                continue;
            }
        }
        if (b.state == block_state::scheduled && now_ns >= b.start_ns && now_ns < b.end_ns()) {
            set_block_state(b, block_state::started, "", now_ns);
            emit_block(event_type::calibration_started, b, now_ns);
            ++changed;
        }
        if ((b.state == block_state::scheduled || b.state == block_state::started) && now_ns >= b.end_ns()) {
            end_block(b, block_state::ended, "its end passed without calibration.update or calibration.cancel closing it",
                      now_ns);
            ++changed;
        }
    }
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return changed;
}

void ledger::forget_blocks(std::int64_t before_ns) {
    std::vector<std::uint64_t> ids;
    for (const auto& [id, b] : _blocks) {
        if (!is_live(b.state) && b.end_ns() < before_ns) {
            ids.push_back(id);
        }
    }
    for (const std::uint64_t id : ids) {
        const calibration_block& b = _blocks.at(id);
        if (const auto k = _block_idem.find(idem_key(b.tenant, b.idempotency_key));
            k != _block_idem.end() && k->second == id) {
            _block_idem.erase(k);
        }
        _blocks.erase(id);
        touch_block(id);
    }
}

}  // namespace qrt::timeline
