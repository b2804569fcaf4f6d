// The ledger's state changes (reserve, heartbeat, release, commit, cancel,
// housekeeping, the dispatcher's transitions, forgetting) and their
// durability: every public mutating operation ends with persist(), which
// hands its rows to the durability tracker (durability.cpp).
#include "ledger_internal.hpp"

namespace qrt::timeline {

using namespace detail;

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
    if (from == res_state::committed) {
        _going_out.erase(r.id);
    }
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
        _new_commits.push_back(r.id);
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
    hold_token(it->second.fencing_token);
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

// What every new booking (one reservation or a gang) checks first: a
// tenant, a lease within timeline.max_lease_ns, and a valid request.
timeline::status ledger::check_booking(std::string_view tenant, const request& req, std::int64_t lease_ns,
                             std::int64_t now_ns) const {
    if (tenant.empty()) {
        return make_error(reason::invalid_argument, "tenant is empty");
    }
    if (lease_ns < 0 || lease_ns > _opts.max_lease_ns) {
        return make_error(reason::invalid_argument, "lease_ns must be in [0, " +
                                                        n2s(_opts.max_lease_ns) + "], got " +
                                                        n2s(lease_ns));
    }
    return validate(req, now_ns);
}

result<reservation> ledger::reserve_impl(std::string_view tenant, const request& req,
                                         std::string_view idempotency_key,
                                         std::int64_t lease_ns, blob* payload,
                                         std::int64_t now_ns) {
    if (auto v = check_booking(tenant, req, lease_ns, now_ns); !v) {
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
    std::optional<slot> chosen;
    std::vector<std::uint64_t> victims;
    if (req.block_id != 0) {
        // A calibration service's job, inside its own block only.
        auto b = block_for_job(tenant, req);
        if (!b) {
            return std::move(b).err();
        }
        const calibration_block& blk = **b;
        *qs = {_qpu_index.at(blk.qpu)};
        chosen = block_fit(blk, earliest_start(req, now_ns), req);
        if (!chosen) {
            return make_error(reason::no_fit, "no slot of duration_ns " + n2s(req.duration_ns) +
                                                  " inside calibration block " + u2s(blk.id) + " (start_ns " +
                                                  n2s(blk.start_ns) + " to end_ns " + n2s(blk.end_ns()) +
                                                  ") from " + n2s(earliest_start(req, now_ns)));
        }
    }
    const auto cands = req.block_id != 0 ? std::vector<candidate>{}
                                         : candidates_for(req, *qs, now_ns, _policy->windows_considered());
    if (chosen) {
        // placed in its block above
    } else if (!cands.empty()) {
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
            if (const auto refused = withdraw_all(plan->victims)) {
                pinned.insert(*refused);
                continue;
            }
            chosen = plan->s;
            victims = std::move(plan->victims);
            break;
        }
    }
    {
        std::vector<std::size_t> placed;
        if (chosen) {
            placed.push_back(chosen->q);
        }
        if (auto ep = check_endpoints(req, *qs, placed, now_ns); !ep) {
            return std::move(ep).err();
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
    r.fencing_token = draw_token();
    r.created_ns = now_ns;
    r.updated_ns = now_ns;
    r.block_id = req.block_id;
    if (payload != nullptr) {
        r.state = res_state::committed;
        r.payload = std::move(*payload);
        r.shots = req.shots;
        r.lease_expires_ns = 0;
    } else {
        r.state = res_state::held;
        r.lease_expires_ns = now_ns + r.lease_ns;
    }
    reservation& placed = insert_new(std::move(r));
    place(placed, *chosen);
    if (placed.state == res_state::held) {
        _leases.emplace(placed.lease_expires_ns, placed.id);
    } else {
        _new_commits.push_back(placed.id);
        mark_with_commit(placed, now_ns);
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
    if (auto v = check_booking(tenant, req, lease_ns, now_ns); !v) {
        return std::move(v).err();
    }
    if (req.block_id != 0) {
        return make_error(reason::invalid_argument,
                          "block_id: a gang does not go into a calibration block (gang_size 1 only)");
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
    {
        std::vector<std::size_t> placed;
        if (slots) {
            for (const slot& s : *slots) {
                placed.push_back(s.q);
            }
        }
        if (auto ep = check_endpoints(req, *qs, placed, now_ns); !ep) {
            error e = std::move(ep).err();
            e.message = "gang of " + std::to_string(k) + ": " + e.message;
            return e;
        }
    }
    if (!slots) {
        error e = no_fit_error(req, *qs, now_ns);
        e.message = "gang of " + std::to_string(k) + ": " + e.message;
        return e;
    }
    const std::uint64_t gang = _next_gang++;
    const std::uint64_t token = draw_token();
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
        const std::int64_t earliest = std::max(
            now_ns + std::max<std::int64_t>(_opts.min_lead_ns, 1) + commit_lead_ns(), r.not_before_ns);
        const calibration_block* blk = r.block_id != 0 ? find_block(r.block_id) : nullptr;
        if (try_replace && movable) {
            if (blk != nullptr && is_live(blk->state)) {
                // A calibration service's job stays inside its block.
                if (auto s = block_fit(*blk, earliest, req)) {
                    slots = std::vector<slot>{std::move(*s)};
                }
            } else if (group.size() == 1) {
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
    auto o = checked(tenant, id, fencing_token, lease_check::must_be_live, now_ns);
    if (!o) {
        return std::move(o).err();
    }
    reservation& r = **o;
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
    auto o = checked(tenant, id, fencing_token, lease_check::none, now_ns);
    if (!o) {
        return std::move(o).err();
    }
    reservation& r = **o;
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
                                   std::int64_t now_ns, std::uint32_t shots) {
    auto o = checked(tenant, id, fencing_token, lease_check::must_be_live, now_ns);
    if (!o) {
        return std::move(o).err();
    }
    reservation& r = **o;
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
    // Acknowledged means dispatchable: a start the hand-over can no longer
    // meet (the lead, and the commit backlog ahead of this change) is
    // refused now rather than acknowledged and missed.
    const auto group = members(r);
    std::int64_t extra = 0;
    for (const std::uint64_t m : group) {
        extra = std::max(extra, _qpus[_qpu_index.at(_res.at(m).qpu)].extra_lead_ns);
    }
    if (const std::int64_t lead = _opts.min_lead_ns + commit_lead_ns() + extra;
        _opts.min_lead_ns > 0 && r.start_ns < now_ns + lead) {
        error e = make_error(reason::unavailable,
                             "reservation " + u2s(id) + " start_ns " + n2s(r.start_ns) +
                                 " is less than the hand-over lead (" + n2s(lead) +
                                 " ns, min_lead_ns, the QPU's learned arm lead and the commit backlog) away; "
                                 "it can no longer be dispatched on time");
        e.next_start_ns = sat_add(now_ns, lead);
        return e;
    }
    // Acknowledged means dispatchable: not while the endpoint is down and
    // the start is within the horizon (the reservation stays held).
    for (const std::uint64_t m : group) {
        const reservation& mr = _res.at(m);
        const std::size_t q = _qpu_index.at(mr.qpu);
        if (_opts.endpoint_down_horizon_ns > 0 && !_qpus[q].endpoint.up &&
            mr.start_ns < sat_add(now_ns, _opts.endpoint_down_horizon_ns)) {
            return endpoint_down_error(q, "commit of reservation " + u2s(mr.id) + " (start_ns " +
                                              n2s(mr.start_ns) + ")",
                                       now_ns);
        }
    }
    for (const std::uint64_t m : group) {
        reservation& mr = _res.at(m);
        account(mr, -1);
        mr.payload = payload;
        mr.shots = shots;
        account(mr, +1);
        set_state(mr, res_state::committed, "", now_ns, event_type::committed);
        mark_with_commit(mr, now_ns);
        // Now an acknowledged job: a block waiting for it to yield fails.
        fail_blocks_of(mr, now_ns);
    }
    if (auto s = persist(); !s) {
        return std::move(s).err();
    }
    return _res.at(id);
}

result<reservation> ledger::cancel(std::string_view tenant, std::uint64_t id,
                                   std::int64_t now_ns, std::optional<std::uint64_t> fencing_token) {
    auto o = checked(tenant, id, fencing_token, lease_check::none, now_ns);
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
    if (const auto refused = withdraw_all(members(r))) {
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
        // Only what is on disk is handed over: a job whose commit has not
        // reached the disk was never acknowledged, and may yet be undone.
        if (!_durable.all_durable() && _durable.change_seq_of(p->second) != 0) {
            continue;
        }
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
    const reservation& done = _res.at(id);
    if (_durable.has_writer() && change_seq_of(id) != 0) {
        // Kept until durable: a failed group must not lose what happened
        // on the wire (replay_agent_ops).
        agent_op op;
        op.seq = change_seq_of(id);
        op.id = id;
        op.verb = std::string(verb);
        op.from = from;
        op.to = to;
        op.why = std::string(why);
        op.at_ns = now_ns;
        op.ev_type = std::string(ev_type);
        op.sent_ns = done.sent_ns;
        if (to == res_state::completed) {
            op.result = done.result;
        }
        _agent_ops.push_back(std::move(op));
    }
    return done;
}

// After a failed group and the reload: the agent's own transitions that it
// undid are applied again, in order, each a new change.  One whose
// reservation is not in the state it needs (its earlier steps were never
// durable and are gone too) is dropped.
void ledger::replay_agent_ops() {
    std::deque<agent_op> ops;
    ops.swap(_agent_ops);
    for (agent_op& op : ops) {
        const std::int64_t sent_ns = op.sent_ns;
        blob res = std::move(op.result);
        const bool completes = op.to == res_state::completed;
        const bool dispatches = op.to == res_state::dispatched;
        (void)dispatch_transition(op.id, op.verb, op.from, op.to, op.why, op.at_ns, op.ev_type,
                                  [&](reservation& r) {
                                      if (dispatches) {
                                          r.sent_ns = sent_ns;
                                      }
                                      if (completes) {
                                          r.result = std::move(res);
                                      }
                                  });
    }
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

result<reservation> ledger::fail_unsent(std::uint64_t id, std::string_view why, std::int64_t now_ns) {
    return dispatch_transition(id, "fail_unsent", res_state::committed, res_state::failed, why, now_ns,
                               event_type::failed, {});
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
        drop_token(r.fencing_token);
        _res.erase(id);
        touch(id);
    }
    forget_blocks(before_ns);
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

}  // namespace qrt::timeline
