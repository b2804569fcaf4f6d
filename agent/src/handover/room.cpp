// The hand-over room, the event loop's side of it: the late-commit
// withdrawal, each QPU's plan for the job pump (job_pump.hpp, its own
// thread), the pump's reports and the dispatch outcomes back into the
// ledger, the ledger's dispatch gate, and the calibration each link's guard
// follows.  See qrt/handover/room.hpp.

#include "qrt/handover/room.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <exception>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "qrt/dispatch/guard.hpp"
#include "qrt/log.hpp"

namespace qrt::handover {
namespace {

constexpr std::int64_t k_ms = 1'000'000;

std::string tl_error(const timeline::error& e) { return e.reason + ": " + e.message; }

// The frame's shot count when the request stated none (qrtd(8), jobs.submit).
constexpr std::uint32_t k_default_shots = 1000;

}  // namespace

struct room::qpu_state {
    qpu_target target;
    bool withdrawals_pending = false;  // the dispatch gate withdrew since the last plan (report_withdrawn)
    std::vector<timeline::calibration_window> windows;  // ending after the last refresh
    std::int64_t current_until_ns = 0;  // refresh when now reaches this
    std::uint64_t calibration_id = 0;   // what the link's guard holds
    bool calibration_dirty = true;
    std::uint64_t calibration_generation = 0;  // the ledger's, as of the last refresh
    std::optional<event_loop::timer_id> switch_timer;
    qpu_counts counts;
};

room::room(event_loop& loop, timeline::ledger& ledger, rtcore::clock_source& clock, options opts,
           std::vector<qpu_target> qpus, std::function<void()> on_ledger_events)
    : _loop(loop), _ledger(ledger), _clock(clock), _opts(opts), _on_ledger_events(std::move(on_ledger_events)) {
    for (auto& t : qpus) {
        auto q = std::make_unique<qpu_state>();
        q->target = std::move(t);
        _qpus.push_back(std::move(q));
    }
}

room::~room() { stop(); }

rtcore::status room::start(job_pump::options pump) {
    std::vector<dispatch::qpu_link*> links;
    for (auto& q : _qpus) {
        links.push_back(q->target.link);
    }
    _pump = std::make_unique<job_pump>(std::move(links), _clock, pump);
    if (auto st = _pump->start(); !st) {
        return st;
    }
    for (auto& q : _qpus) {
        refresh_calibration(*q, _clock.now_realtime_ns());
    }
    return rtcore::ok();
}

void room::stop() noexcept {
    if (_stopped) {
        return;
    }
    _stopped = true;
    try {
        // Once the pump's thread is joined nothing else produces into the
        // rings; its last reports go into the ledger.
        if (_pump) {
            _pump->stop();
            for (auto& q : _qpus) {
                apply_pump_reports(*q);
            }
        }
    } catch (const std::exception& e) {
        log::warn("dispatch", "job pump: stop: {}", e.what());
    }
    for (auto& q : _qpus) {
        if (q->switch_timer) {
            _loop.cancel_timer(*q->switch_timer);
            q->switch_timer.reset();
        }
    }
}

void room::sync(bool publish_events) noexcept {
    if (_pumping || !_pump || _stopped) {
        return;
    }
    _pumping = true;
    try {
        const std::int64_t began = _clock.now_monotonic_ns();
        const std::int64_t now = _clock.now_realtime_ns();
        for (auto& q : _qpus) {
            apply_pump_reports(*q);
        }
        _pumped_generation = _ledger.generation();
        std::size_t published = 0;
        for (auto& q : _qpus) {
            published += publish_plan(*q, now);
        }
        _counts.published_jobs = published;
        // The first term of the hand-over bound (job_pump.hpp), as measured.
        _counts.max_plan_publish_ns = std::max(_counts.max_plan_publish_ns, _clock.now_monotonic_ns() - began);
        if (publish_events && _on_ledger_events) {
            _on_ledger_events();
        }
    } catch (const std::exception& e) {
        static log::rate_limiter rl{std::chrono::seconds(10)};
        log::warn_rl(rl, "dispatch", "job pump: {}", e.what());
    }
    _pumping = false;
}

// The ledger changed here: plan again when that matters to the pump (a
// release, a job moved), and publish the ledger's events either way.
void room::changed() noexcept {
    if (!_pumping && _pump && !_stopped && needs_plan()) {
        sync();  // publishes the events too
    } else if (_on_ledger_events) {
        _on_ledger_events();
    }
}

bool room::needs_plan() const noexcept {
    for (const auto& q : _qpus) {
        if (_pump->releases_pending(q->target.index)) {
            return true;
        }
    }
    return _ledger.generation() != _pumped_generation;
}

// Acknowledged means dispatchable: a job whose commit became durable too
// late for its start is withdrawn, and the request that made it is
// answered (by the caller) with a retryable error naming the next possible
// start instead.  What the group made durable is planned right after
// withdraw_late judged it against the clock -- releasing the replies serves
// more input of every released connection, which must not come between
// the two.
std::vector<timeline::late_job> room::on_commit(const timeline::commit_notice& n) {
    if (n.failed_to != 0) {
        // The reload may have changed the windows the guards follow.
        on_calibration_all();
    }
    std::vector<timeline::late_job> late;
    if (n.failed_to == 0 && !n.committed.empty()) {
        late = _ledger.withdraw_late(n, _clock.now_realtime_ns(), _opts.handover_ns);
    }
    for (const auto& j : late) {
        ++_counts.late_commits;
        static log::rate_limiter rl{std::chrono::seconds(10)};
        log::warn_rl(rl, "timeline", "ledger: {}", j.message);
    }
    on_durable();
    return late;
}

// A job is planned as soon as it is durable, before it is acknowledged: a
// burst of requests, each one commit, delays no hand-over past its group,
// and what the loop serves after the acknowledgements cannot delay it
// either.  The events are the commit listener's to publish, after the
// acknowledgements (a caller sees its reply before the events it caused).
void room::on_durable() noexcept {
    if (_pump && needs_plan()) {
        sync(false);
    }
}

// What the pump did since the last look: hand-overs counted, refusals into
// the ledger (and released in the table).
void room::apply_pump_reports(qpu_state& q) {
    if (!_pump) {
        return;
    }
    for (auto& r : _pump->take_reports(q.target.index)) {
        if (r.what == pump_report::kind::handed) {
            ++_counts.handed;
            continue;
        }
        _counts.missed_before_handover += r.missed_before_handover ? 1 : 0;
        _counts.refused_by_dispatcher += r.dispatch_refused ? 1 : 0;
        ++q.counts.missed;
        (void)_pump->release(q.target.index, r.id);
        const std::string reason = r.reason_text(*q.target.link);
        if (auto m = _ledger.miss(r.id, reason, _clock.now_realtime_ns()); !m) {
            ++_counts.ledger_errors;
            log::warn("timeline", "{}: miss job {}: {}", q.target.name, r.id, tl_error(m.err()));
        } else {
            log::debug("dispatch", "{}: job {} not dispatched: {}", q.target.name, r.id, reason);
        }
    }
}

void room::on_calibration(std::string_view qpu) {
    for (auto& q : _qpus) {
        if (q->target.name == qpu) {
            q->calibration_dirty = true;
        }
    }
}

void room::on_calibration_all() {
    for (auto& q : _qpus) {
        q->calibration_dirty = true;
    }
}

void room::refresh_calibration(qpu_state& q, std::int64_t now_ns) {
    // Only the windows the plan can hold jobs in (those starting before
    // the plan horizon, and the next one): this runs at every window
    // end, so with a 1 ms period, copying every window up to
    // timeline.horizon_ns here was the daemon's CPU.
    auto ws = _ledger.calibration(q.target.name, now_ns, now_ns + _opts.plan_horizon_ns);
    if (!ws) {
        log::warn("calibration", "{}: {}", q.target.name, tl_error(ws.err()));
        return;
    }
    q.windows = std::move(*ws);
    q.calibration_dirty = false;
    q.calibration_generation = _ledger.calibration_generation();
    // The guard follows the window that contains now, or (in a blackout)
    // the next one: it switches at each window's end.
    // With no window at all the guard gets an id that matches no job, so
    // jobs already handed over are refused rather than sent uncalibrated.
    std::uint64_t id = dispatch::no_window_calibration_id;
    std::int64_t until = now_ns + 1'000 * k_ms;
    // The next window takes over at the current one's end in the guard
    // itself (a job whose T is at or after that belongs to it; none starts
    // in a blackout): the first job of that window must not wait for the
    // switch timer below, which runs on the loop and so is late by however
    // long the loop is stalled (the pump hands that job over on time).
    std::uint64_t next_id = id;
    std::int64_t switch_ns = INT64_MAX;
    if (!q.windows.empty()) {
        id = q.windows.front().calibration_id;
        until = q.windows.front().valid_until_ns;
        next_id = id;
        if (q.windows.size() > 1 && q.windows[1].valid_from_ns >= until) {
            next_id = q.windows[1].calibration_id;
            switch_ns = until;
        }
    }
    if (id != q.calibration_id) {
        log::debug("calibration", "{}: current calibration id {} (until {})", q.target.name, id, until);
    }
    q.calibration_id = id;
    q.current_until_ns = until;
    q.target.link->set_calibration(id, next_id, switch_ns);
    // A one-shot timer at the window's end, so the guard switches on time
    // and not at the next pump tick.
    if (q.switch_timer) {
        _loop.cancel_timer(*q.switch_timer);
        q.switch_timer.reset();
    }
    if (_stopped) {
        return;
    }
    const auto delay = std::chrono::nanoseconds(std::max<std::int64_t>(until - _clock.now_realtime_ns(), 1));
    qpu_state* qp = &q;
    auto t = _loop.add_timer(delay, std::chrono::nanoseconds(0), [this, qp] {
        qp->switch_timer.reset();
        refresh_calibration(*qp, _clock.now_realtime_ns());
    });
    if (t) {
        q.switch_timer = *t;
    }
}

const timeline::calibration_window* room::window_of(qpu_state& q, std::int64_t start_ns, std::int64_t now_ns) {
    for (int attempt = 0; attempt < 2; ++attempt) {
        const auto it = std::upper_bound(q.windows.begin(), q.windows.end(), start_ns,
                                         [](std::int64_t t, const timeline::calibration_window& w) {
                                             return t < w.valid_until_ns;
                                         });
        if (it != q.windows.end() && it->contains(start_ns)) {
            return &*it;
        }
        if (attempt == 0) {
            refresh_calibration(q, now_ns);
        }
    }
    return nullptr;
}

// The contract with the ledger's group commit: only what is on disk is
// planned, so no job that was never acknowledged is dispatched.  due_jobs()
// already holds back a job whose last change is not durable; this says so
// again where the plan is built (change_seq_of() is 0 once durable).
bool room::durable(const timeline::reservation& r) const { return _ledger.change_seq_of(r.id) == 0; }

// The plan of one QPU: every durable committed job starting within the plan
// horizon, in start order, at most plan_max_jobs, each with the window the
// dispatch guard checks it against (or why it cannot be sent).
std::size_t room::publish_plan(qpu_state& q, std::int64_t now_ns) {
    // The generation catches an update whose event has not come yet (events
    // go out after the request's answer): a job it re-placed is planned
    // against its new window, never refused for the one it left.
    if (q.calibration_dirty || now_ns >= q.current_until_ns ||
        q.calibration_generation != _ledger.calibration_generation()) {
        refresh_calibration(q, now_ns);
    }
    // The plan reaches as much further as the pump hands over earlier on a
    // QPU with an extra lead (ledger::set_extra_lead).
    const std::int64_t plan_end = now_ns + _opts.plan_horizon_ns + _ledger.extra_lead_ns(q.target.name);
    const auto due = _ledger.due_jobs(q.target.name, plan_end);
    // A job is handed over only once the ledger's dispatch mark covers its
    // start (durable), so that a restart after a crash tells a job that may
    // have been sent (dispatch_unknown) from one that was not (missed).
    // The mark is asked for one plan horizon further than needed, so it is
    // written about once per plan horizon while jobs flow, never when idle.
    std::int64_t mark = _ledger.dispatch_mark_ns();
    if (!due.empty() && due.back().start_ns > mark) {
        mark = _ledger.extend_dispatch_mark(plan_end + _opts.plan_horizon_ns);
    }
    handover_plan plan;
    plan.complete_until_ns = plan_end;
    plan.jobs.reserve(std::min(due.size(), _opts.plan_max_jobs));
    for (const auto& r : due) {
        if (!durable(r)) {
            continue;
        }
        if (plan.jobs.size() == _opts.plan_max_jobs ||
            (r.start_ns > mark && r.start_ns + q.target.tolerance_ns >= now_ns)) {
            plan.complete_until_ns = r.start_ns;  // what starts from here on waits for a later plan
            break;
        }
        handover_entry e;
        auto& j = e.job;
        j.job_id = r.id;
        j.qpu_index = q.target.index;
        j.scheduled_ns = r.start_ns;
        j.duration_ns = r.duration_ns;
        j.calibration_id = r.calibration_id;
        j.tolerance_ns = q.target.tolerance_ns;
        j.shots = r.shots != 0 ? r.shots : k_default_shots;  // from the request, never the payload
        e.payload = r.payload;
        if (r.start_ns + q.target.tolerance_ns >= now_ns) {  // else the pump reports it missed
            if (const auto* w = window_of(q, r.start_ns, now_ns); w == nullptr) {
                e.refuse = std::make_shared<const std::string>(fmt::format(
                    "{}: no calibration window holds start {}", dispatch::outcome::calibration_changed, r.start_ns));
            } else if (w->calibration_id != r.calibration_id) {
                e.refuse = std::make_shared<const std::string>(
                    fmt::format("{}: placed in calibration {}, the window at start is {}",
                                dispatch::outcome::calibration_changed, r.calibration_id, w->calibration_id));
            } else {
                j.window_start_ns = w->valid_from_ns;
                j.window_end_ns = w->valid_until_ns;
            }
        }
        plan.jobs.push_back(std::move(e));
    }
    const std::size_t jobs = plan.jobs.size();
    _pump->publish(q.target.index, std::move(plan));
    // The dispatch gate's withdrawals are final once the change that made
    // them is done: their stale copies come back `cancelled` now.
    if (q.withdrawals_pending) {
        q.target.link->report_withdrawn();
        q.withdrawals_pending = false;
    }
    return jobs;
}

void room::on_dispatched(std::uint32_t qpu, std::uint64_t id, std::int64_t sent_ns) {
    if (auto r = _ledger.mark_dispatched(id, sent_ns); !r) {
        // e.g. cancelled after the hand-over: the frame left anyway.
        ++_counts.ledger_errors;
        log::debug("timeline", "{}: mark_dispatched {}: {}", qpu < _qpus.size() ? _qpus[qpu]->target.name : "?", id,
                   tl_error(r.err()));
    }
    changed();
}

void room::on_arm(std::uint32_t qpu, std::uint64_t id, dispatch::arm_event e) {
    if (qpu >= _qpus.size() || !_pump) {
        return;
    }
    // The pump's report of this hand-over is in the table already: its
    // pass (claim, submit, hand) holds the lane's lock that on_arm takes.
    _pump->on_arm(qpu, id, e);
}

void room::on_outcome(std::uint32_t qpu, const dispatch::dispatch_outcome& o) {
    if (qpu >= _qpus.size()) {
        return;
    }
    qpu_state& q = *_qpus[qpu];
    // The pump's report of this hand-over is in by now: its pass ended
    // before the link could show the job to the loop.
    apply_pump_reports(q);
    std::optional<std::pair<std::int64_t, std::uint64_t>> as_handed;
    if (_pump) {
        as_handed = _pump->handed_as(q.target.index, o.job_id);
        (void)_pump->release(q.target.index, o.job_id);
    }
    const std::int64_t now = _clock.now_realtime_ns();
    const timeline::reservation* r = _ledger.find(o.job_id);
    if (r == nullptr) {
        return;
    }
    // Re-placed after the hand-over (calibration.update or a preemption moved
    // it): the guard refused, or the withdrawal dropped, the stale copy; the
    // pump hands the job over again with its new start and calibration id.
    // Likewise a job withdrawn and then kept (a preemption that gave its
    // victims back, a cancel that could not be stored): not sent, still due.
    const bool withdrawn_kept = o.reason == dispatch::to_string(dispatch::dispatch_status::cancelled);
    if (r->state == timeline::res_state::committed && o.sent_ns == 0 && as_handed &&
        (as_handed->first != r->start_ns || as_handed->second != r->calibration_id || withdrawn_kept) &&
        !_stopped) {
        log::debug("dispatch", "{}: job {} re-placed after hand-over ({}): handing it over again", q.target.name,
                   o.job_id, o.reason);
        changed();  // the release rides with the next plan: now, not at the next tick
        return;
    }
    std::string why = o.reason;
    if (!o.detail.empty()) {
        why += ": " + o.detail;
    }
    if (r->state == timeline::res_state::committed && o.state == dispatch::job_state::failed && o.sent_ns == 0 &&
        o.reason == proto::reason::arm_refused) {
        // Refused at ARM by the endpoint: the program, not the host or the
        // clock, so failed (with its stage and reason), not missed.
        ++q.counts.failed;
        if (auto f = _ledger.fail_unsent(o.job_id, why, now); !f) {
            ++_counts.ledger_errors;
            log::warn("timeline", "{}: fail {}: {}", q.target.name, o.job_id, tl_error(f.err()));
        }
    } else if (r->state == timeline::res_state::committed) {
        // Never sent (missed, calibration guard, endpoint down, stopped).
        ++q.counts.missed;
        if (auto m = _ledger.miss(o.job_id, why, now); !m) {
            ++_counts.ledger_errors;
            log::warn("timeline", "{}: miss {}: {}", q.target.name, o.job_id, tl_error(m.err()));
        }
    } else if (r->state == timeline::res_state::dispatched) {
        if (o.state == dispatch::job_state::completed) {
            ++q.counts.completed;
            if (auto c = _ledger.complete(o.job_id, o.result, now); !c) {
                ++_counts.ledger_errors;
                log::warn("timeline", "{}: complete {}: {}", q.target.name, o.job_id, tl_error(c.err()));
            }
        } else if (o.state == dispatch::job_state::sent) {
            ++q.counts.sent;
            if (auto s = _ledger.mark_sent(o.job_id, o.detail, now); !s) {
                ++_counts.ledger_errors;
                log::warn("timeline", "{}: mark_sent {}: {}", q.target.name, o.job_id, tl_error(s.err()));
            }
        } else {
            ++q.counts.failed;
            if (auto f = _ledger.fail(o.job_id, why, now); !f) {
                ++_counts.ledger_errors;
                log::warn("timeline", "{}: fail {}: {}", q.target.name, o.job_id, tl_error(f.err()));
            }
        }
    }
    changed();
}

room::qpu_state* room::qpu_of(std::uint64_t id) {
    const timeline::reservation* r = _ledger.find(id);
    if (r == nullptr) {
        return nullptr;
    }
    for (auto& q : _qpus) {
        if (q->target.name == r->qpu) {
            return q.get();
        }
    }
    return nullptr;
}

// The ledger's dispatch gate: only the QPU the job is booked on can hold it.
dispatch::dispatcher::withdraw_result room::withdraw(std::uint64_t id) {
    if (!_pump) {
        return dispatch::dispatcher::withdraw_result::not_queued;  // nothing handed over
    }
    qpu_state* q = qpu_of(id);
    if (q == nullptr) {
        return dispatch::dispatcher::withdraw_result::not_queued;
    }
    const auto w = _pump->withdraw(q->target.index, id);
    q->withdrawals_pending = q->withdrawals_pending || w == dispatch::dispatcher::withdraw_result::withdrawn;
    return w;
}

void room::restore(std::uint64_t id) {
    if (!_pump) {
        return;
    }
    qpu_state* q = qpu_of(id);
    if (q != nullptr && !_pump->restore(q->target.index, id)) {
        // Already dropped by the dispatch thread: its `cancelled` record
        // comes back and the pump hands the job over again.
        log::debug("dispatch", "{}: job {} could not be restored after a withdrawal", q->target.name, id);
    }
}

qpu_counts room::counts(std::uint32_t qpu) const {
    if (qpu >= _qpus.size()) {
        return {};
    }
    qpu_counts c = _qpus[qpu]->counts;
    c.calibration_id = _qpus[qpu]->calibration_id;
    c.in_flight = _pump ? _pump->in_flight(qpu) : 0;
    if (_pump) {
        std::tie(c.arming, c.armed) = _pump->arming_armed(qpu);
    }
    return c;
}

room_counts room::counts() const { return _counts; }

std::optional<pump_stats> room::pump_state() const {
    if (!_pump) {
        return std::nullopt;
    }
    return _pump->stats();
}

}  // namespace qrt::handover
