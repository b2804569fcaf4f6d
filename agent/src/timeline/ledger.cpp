// The ledger: construction, reload from the store, lookups, the one ownership check and
// fencing tokens.
#include <sys/random.h>

#include <cerrno>
#include <random>

#include "ledger_internal.hpp"

namespace qrt::timeline {

using namespace detail;

// ------------------------------------------------------------ construction

ledger::ledger(std::vector<qpu_spec> qpus, ledger_options opts,
               std::unique_ptr<placement_policy> policy)
    : _opts(std::move(opts)),
      _policy(std::move(policy)),
      _durable(durability_options{_opts.commit_group_max, _opts.commit_group_wait, _opts.commit_hook,
                                  _opts.reload_hook},
               durability_side()) {
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

ledger::~ledger() = default;  // _durable stops the writer first

void ledger::close() { _durable.close(); }

std::int64_t ledger::extend_dispatch_mark(std::int64_t to_ns) {
    if (!_durable.has_store() || to_ns <= _durable.mark_ns() ||
        to_ns <= _durable.mark_requested_ns()) {
        return dispatch_mark_ns();
    }
    if (_durable.request_mark(to_ns)) {
        (void)persist();  // no writer: the mark goes with a change of its own
    }
    return _durable.mark_ns();
}

void ledger::mark_with_commit(const reservation& r, std::int64_t now_ns) {
    if (_opts.dispatch_mark_reach_ns <= 0 || r.start_ns <= _durable.mark_requested_ns() ||
        r.start_ns >= sat_add(now_ns, sat_add(_opts.dispatch_mark_reach_ns, commit_lead_ns()))) {
        return;
    }
    _durable.mark_with_next(r.start_ns);
}

// What the durability tracker does to the ledger, on the loop thread.
durability_hooks ledger::durability_side() {
    durability_hooks h;
    h.publish = [this](std::vector<event>& evs) { release_events(evs); };
    h.durable = [this](std::uint64_t seq) {
        while (!_agent_ops.empty() && _agent_ops.front().seq <= seq) {
            _agent_ops.pop_front();
        }
        ++_generation;  // the hand-over plan follows what is durable
    };
    h.undo = [this](stored_state* disk) {
        _pending_events.clear();
        if (disk != nullptr) {
            (void)reload_from(std::move(*disk));
        }
        ++_calibration_generation;  // the reload may have put other windows back
    };
    h.redo = [this] {
        ++_generation;
        replay_agent_ops();
    };
    return h;
}

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
        l->_durable.attach(std::move(*st));
        if (auto s = l->reload(); !s) {
            return std::move(s).err();
        }
    }
    l->advance(now_ns);
    // Startup: nothing is ever dispatched late, leases kept running while
    // the agent was down, and results of jobs in flight are lost.  After a
    // crash (the last ledger never closed the database) a committed job
    // whose start passed may have been sent just before it, its
    // mark_dispatched never written: whether the QPU ran it is unknown, and
    // it is recorded so (failed, dispatch_unknown), never as missed.  Only
    // a job starting at or before the durable dispatch mark can have been
    // handed over (extend_dispatch_mark); a clean close resets it to 0.
    const std::int64_t mark = l->_durable.mark_ns();
    std::vector<std::uint64_t> ids;
    ids.reserve(l->_res.size());
    for (const auto& [id, r] : l->_res) {
        ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    for (const std::uint64_t id : ids) {
        reservation& r = l->_res.at(id);
        if (r.state == res_state::committed && r.start_ns < now_ns && r.start_ns <= mark) {
            l->set_state(r, res_state::failed,
                         "dispatch_unknown: qrtd stopped without closing its ledger after "
                         "handing the job (start_ns " + n2s(r.start_ns) +
                             ") to its dispatch thread; it may have been sent, so whether the "
                             "QPU ran it is unknown",
                         now_ns, event_type::failed);
        } else if (r.state == res_state::committed && r.start_ns < now_ns) {
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
    // Calibration blocks go on as time went: one whose end passed while
    // qrtd was down ended, one whose start passed started.
    if (auto s = l->settle_blocks(now_ns); !s) {
        return std::move(s).err();
    }
    if (mark != 0) {
        // The jobs it covered are resolved (and durable) above.  Best
        // effort: a mark left behind only makes a later crash report more
        // jobs unknown.
        l->_durable.reset_mark();
    }
    return l;
}

status ledger::reload() {
    auto loaded = _durable.load();  // adopts the store's dispatch mark
    if (!loaded) {
        return std::move(loaded).err();
    }
    return reload_from(std::move(*loaded));
}

status ledger::reload_from(stored_state state) {
    stored_state* loaded = &state;
    _res.clear();
    _new_commits.clear();
    _idem.clear();
    _usage.clear();
    _gangs.clear();
    _leases.clear();
    _dirty.clear();
    _dirty_windows.clear();
    _pending_events.clear();
    _going_out.clear();
    _tokens.clear();
    _booked.clear();
    _blocks.clear();
    _block_idem.clear();
    _dirty_blocks.clear();
    _next_id = std::max<std::uint64_t>(1, loaded->next_id);
    _next_gang = std::max<std::uint64_t>(1, loaded->next_gang);
    _next_block = std::max<std::uint64_t>(1, loaded->next_block);
    for (qpu_state& qs : _qpus) {
        qs.busy.clear();
        qs.pending.clear();
        qs.blocks.clear();
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
            _booked.add(r.tenant, r.id, r.start_ns, r.end_ns());
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
        hold_token(r.fencing_token);
        _res.emplace(id, std::move(r));
    }
    for (auto& [gid, ids] : _gangs) {
        std::sort(ids.begin(), ids.end());
    }
    for (calibration_block& b : loaded->blocks) {
        _next_block = std::max(_next_block, b.id + 1);
        const auto qit = _qpu_index.find(b.qpu);
        if (qit == _qpu_index.end()) {
            if (is_live(b.state)) {
                return make_error(reason::unknown_qpu,
                                  "store: calibration block " + u2s(b.id) + " is on qpu \"" + b.qpu +
                                      "\", which the configuration no longer declares");
            }
        } else if (is_live(b.state)) {
            _qpus[qit->second].blocks.emplace(b.start_ns, b.id);
        }
        if (!b.idempotency_key.empty()) {
            _block_idem[idem_key(b.tenant, b.idempotency_key)] = b.id;
        }
        const std::uint64_t id = b.id;
        _blocks.emplace(id, std::move(b));
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

std::size_t ledger::queued_jobs(std::string_view qpu) const {
    const auto it = _qpu_index.find(std::string(qpu));
    return it == _qpu_index.end() ? 0 : _qpus[it->second].pending.size();
}

tenant_usage ledger::usage_of(std::string_view tenant) const {
    const auto it = _usage.find(std::string(tenant));
    return it == _usage.end() ? tenant_usage{} : it->second;
}

std::size_t ledger::tenants_with_prefix(std::string_view prefix) const {
    return static_cast<std::size_t>(std::count_if(_usage.begin(), _usage.end(), [&](const auto& kv) {
        return kv.second.reservations > 0 && std::string_view(kv.first).starts_with(prefix);
    }));
}

bool ledger::has_idempotency_key(std::string_view tenant, std::string_view key) const {
    return !key.empty() && _idem.count(idem_key(tenant, key)) != 0;
}

std::int64_t ledger::booked_within(std::string_view tenant, std::int64_t from_ns,
                                   std::int64_t until_ns) const {
    return _booked.within(tenant, from_ns, until_ns);
}

// ---------------------------------------------------------------- lookups

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

// The one check every tenant's change of a reservation goes through, in the
// order the reasons are promised: it exists (not_found), it is the tenant's
// (not_owner), the caller's fencing token is current (bad_fencing_token),
// and, where the change needs a live lease, the lease has not run out
// (lease_expired: expired, or held past lease_expires_ns and not yet swept).
result<reservation*> ledger::checked(std::string_view tenant, std::uint64_t id,
                                     std::optional<std::uint64_t> fencing_token, lease_check lease,
                                     std::int64_t now_ns) {
    auto o = static_cast<const ledger*>(this)->owned(tenant, id);
    if (!o) {
        return std::move(o).err();
    }
    auto* r = const_cast<reservation*>(*o);
    if (fencing_token && r->fencing_token != *fencing_token) {
        return make_error(reason::bad_fencing_token,
                          "fencing_token " + u2s(*fencing_token) + " is stale for reservation " +
                              u2s(id));
    }
    if (lease == lease_check::must_be_live &&
        (r->state == res_state::expired ||
         (r->state == res_state::held && r->lease_expires_ns <= now_ns))) {
        return make_error(reason::lease_expired, "reservation " + u2s(id) + " lease expired at " +
                                                     n2s(r->lease_expires_ns));
    }
    return r;
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

status ledger::checkpoint() { return _durable.checkpoint(); }

std::vector<event> ledger::drain_events() {
    std::vector<event> out;
    out.swap(_events);
    return out;
}

ledger_stats ledger::stats() const {
    ledger_stats s;
    s.reservations = _res.size();
    s.preemptions = _preemptions;
    s.calibration_pinned = _calibration_pinned;
    for (const qpu_state& qs : _qpus) {
        s.active += qs.busy.size();
        s.windows += qs.windows.size();
        s.gaps += qs.gaps.size();
        s.live_blocks += qs.blocks.size();
    }
    s.blocks = _blocks.size();
    s.reservation_buckets = _res.bucket_count();
    s.window_visits = _window_visits;
    s.store_rows_written = _store_rows;
    return s;
}

// ------------------------------------------------------------ fencing tokens

namespace {

// 64 bits from the kernel's CSPRNG (getrandom blocks only until it is
// seeded, early at boot).
std::uint64_t random_u64() {
    std::uint64_t v = 0;
    for (;;) {
        const ssize_t n = ::getrandom(&v, sizeof(v), 0);
        if (n == static_cast<ssize_t>(sizeof(v))) {
            return v;
        }
        if (n < 0 && errno != EINTR) {
            // No getrandom (a kernel before 3.17): the C++ library's device.
            std::random_device dev;
            return (static_cast<std::uint64_t>(dev()) << 32) ^ dev();
        }
    }
}

}  // namespace

// A fencing token is the capability to change a reservation (heartbeat,
// release, commit, cancel): drawn at random, so that a tenant cannot work
// out another's from its own, as it could from a counter.  63 bits (every
// client reads it as a signed 64-bit integer: the RPC's params reader,
// SQLite, Go), never 0, and never a token a record still holds.  Nothing
// compares tokens by size: each is checked for equality against its own
// reservation only (checked()).  A draw that is 0 or taken is drawn again;
// after 8 such (a broken source), the next free value upward is taken, so
// this always ends.
std::uint64_t ledger::draw_token() const {
    constexpr std::uint64_t mask = std::numeric_limits<std::int64_t>::max();
    std::uint64_t t = 0;
    for (int attempt = 0; attempt < 8; ++attempt) {
        t = (_opts.token_source ? _opts.token_source() : random_u64()) & mask;
        if (t != 0 && !_tokens.contains(t)) {
            return t;
        }
    }
    do {
        t = (t + 1) & mask;
    } while (t == 0 || _tokens.contains(t));
    return t;
}

void ledger::hold_token(std::uint64_t token) { ++_tokens[token]; }

void ledger::drop_token(std::uint64_t token) {
    const auto it = _tokens.find(token);
    if (it != _tokens.end() && --it->second == 0) {
        _tokens.erase(it);
    }
}

}  // namespace qrt::timeline
