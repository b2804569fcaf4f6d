// The hand-over between the ledger and the dispatch threads, the event
// loop's side of it: each QPU's plan for the job pump (job_pump.hpp, its own
// thread), the pump's reports and the dispatch outcomes back into the
// ledger, and the calibration each link's guard follows (see handover_timing
// in services.hpp).

#include "services.hpp"
#include "services_internal.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include <fmt/format.h>

#include "qrt/dispatch/guard.hpp"
#include "qrt/log.hpp"

namespace qrt {
namespace {

using json = nlohmann::json;
using services_detail::k_ms;
using services_detail::tl_error;
// jobs.submit carries no shot count; a JSON payload may say {"shots": N}.
constexpr std::uint32_t k_default_shots = 1000;
constexpr std::uint32_t k_max_shots = 1'000'000;

std::uint32_t shots_of(const timeline::blob& payload) {
    if (payload.empty() || payload.front() != '{') {
        return k_default_shots;
    }
    const json j = json::parse(payload.begin(), payload.end(), nullptr, false);
    if (j.is_object()) {
        const auto it = j.find("shots");
        if (it != j.end() && it->is_number_unsigned()) {
            return static_cast<std::uint32_t>(std::min<std::uint64_t>(it->get<std::uint64_t>(), k_max_shots));
        }
    }
    return k_default_shots;
}


}  // namespace

void services::sync_pump() noexcept {
    if (_pumping || !_pump || _stopped) {
        return;  // publish_ledger_events() below drains the sources, hand_over_now() among them
    }
    _pumping = true;
    try {
        const std::int64_t began = _clock.now_monotonic_ns();
        const std::int64_t now = _clock.now_realtime_ns();
        for (auto& q : _qpus) {
            apply_pump_reports(*q);
        }
        _pumped_generation = _ledger->generation();
        for (auto& q : _qpus) {
            publish_plan(*q, now);
        }
        // The first term of the hand-over bound (job_pump.hpp), as measured.
        _max_plan_publish_ns = std::max(_max_plan_publish_ns, _clock.now_monotonic_ns() - began);
        publish_ledger_events();
    } catch (const std::exception& e) {
        static log::rate_limiter rl{std::chrono::seconds(10)};
        log::warn_rl(rl, "dispatch", "job pump: {}", e.what());
    }
    _pumping = false;
}

void services::hand_over_now() noexcept {
    if (!_ledger || !_pump) {
        return;
    }
    bool released = false;
    for (const auto& q : _qpus) {
        released = released || !q->released.empty();
    }
    if (released || _ledger->generation() != _pumped_generation) {
        sync_pump();
    }
}

// What the pump did since the last look: hand-overs into the mirror the
// outcomes and the status read, refusals into the ledger.
void services::apply_pump_reports(qpu_runtime& q) {
    if (!_pump) {
        return;
    }
    for (auto& r : _pump->take_reports(q.index)) {
        if (r.what == pump_report::kind::handed) {
            q.handed[r.id] = {r.start_ns, r.calibration_id};
            ++_handed_total;
            continue;
        }
        _missed_before_handover += r.missed_before_handover ? 1 : 0;
        _refused_total += r.dispatch_refused ? 1 : 0;
        ++q.missed;
        q.released.push_back(r.id);
        const std::string reason = r.reason_text(*q.link);
        if (auto m = _ledger->miss(r.id, reason, _clock.now_realtime_ns()); !m) {
            ++_ledger_errors;
            log::warn("timeline", "{}: miss job {}: {}", q.name, r.id, tl_error(m.err()));
        } else {
            log::debug("dispatch", "{}: job {} not dispatched: {}", q.name, r.id, reason);
        }
    }
}

void services::refresh_calibration(qpu_runtime& q, std::int64_t now_ns) {
    // Only the windows the plan can hold jobs in (those starting before
    // the plan horizon, and the next one): this runs at every window
    // end, so with a 1 ms period, copying every window up to
    // timeline.horizon_ns here was the daemon's CPU.
    auto ws = _ledger->calibration(q.name, now_ns, now_ns + _handover.plan_horizon_ns);
    if (!ws) {
        log::warn("calibration", "{}: {}", q.name, tl_error(ws.err()));
        return;
    }
    q.windows = std::move(*ws);
    q.calibration_dirty = false;
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
        log::debug("calibration", "{}: current calibration id {} (until {})", q.name, id, until);
    }
    q.calibration_id = id;
    q.current_until_ns = until;
    q.link->set_calibration(id, next_id, switch_ns);
    // A one-shot timer at the window's end, so the guard switches on time
    // and not at the next pump tick.
    if (q.switch_timer) {
        _loop.cancel_timer(*q.switch_timer);
        q.switch_timer.reset();
    }
    const auto delay = std::chrono::nanoseconds(std::max<std::int64_t>(until - _clock.now_realtime_ns(), 1));
    qpu_runtime* qp = &q;
    auto t = _loop.add_timer(delay, std::chrono::nanoseconds(0), [this, qp] {
        qp->switch_timer.reset();
        refresh_calibration(*qp, _clock.now_realtime_ns());
    });
    if (t) {
        q.switch_timer = *t;
    }
}

const timeline::calibration_window* services::window_of(qpu_runtime& q, std::int64_t start_ns,
                                                         std::int64_t now_ns) {
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
bool services::durable(const timeline::reservation& r) const {
    return _ledger->change_seq_of(r.id) == 0;
}

// The plan of one QPU: every durable committed job starting within the plan
// horizon, in start order, at most plan_max_jobs, each with the window the
// dispatch guard checks it against (or why it cannot be sent).
void services::publish_plan(qpu_runtime& q, std::int64_t now_ns) {
    if (q.calibration_dirty || now_ns >= q.current_until_ns) {
        refresh_calibration(q, now_ns);
    }
    const std::int64_t plan_end = now_ns + _handover.plan_horizon_ns;
    const auto due = _ledger->due_jobs(q.name, plan_end);
    // A job is handed over only once the ledger's dispatch mark covers its
    // start (durable), so that a restart after a crash tells a job that may
    // have been sent (dispatch_unknown) from one that was not (missed).
    // The mark is asked for one plan horizon further than needed, so it is
    // written about once per plan horizon while jobs flow, never when idle.
    std::int64_t mark = _ledger->dispatch_mark_ns();
    if (!due.empty() && due.back().start_ns > mark) {
        mark = _ledger->extend_dispatch_mark(plan_end + _handover.plan_horizon_ns);
    }
    handover_plan plan;
    plan.complete_until_ns = plan_end;
    plan.jobs.reserve(std::min(due.size(), _handover.plan_max_jobs));
    for (const auto& r : due) {
        if (!durable(r)) {
            continue;
        }
        if (plan.jobs.size() == _handover.plan_max_jobs ||
            (r.start_ns > mark && r.start_ns + q.tolerance_ns >= now_ns)) {
            plan.complete_until_ns = r.start_ns;  // what starts from here on waits for a later plan
            break;
        }
        handover_entry e;
        auto& j = e.job;
        j.job_id = r.id;
        j.qpu_index = q.index;
        j.scheduled_ns = r.start_ns;
        j.duration_ns = r.duration_ns;
        j.calibration_id = r.calibration_id;
        j.tolerance_ns = q.tolerance_ns;
        j.shots = shots_of(r.payload);
        e.payload = r.payload;
        if (r.start_ns + q.tolerance_ns >= now_ns) {  // else the pump reports it missed
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
    _pump->publish(q.index, std::move(plan), std::exchange(q.released, {}));
    // The dispatch gate's withdrawals are final once the request line that
    // made them is done: their stale copies come back `cancelled` now.
    if (q.withdrawals_pending) {
        q.link->report_withdrawn();
        q.withdrawals_pending = false;
    }
}

void services::on_dispatched(qpu_runtime& q, std::uint64_t id, std::int64_t sent_ns) {
    if (auto r = _ledger->mark_dispatched(id, sent_ns); !r) {
        // e.g. cancelled after the hand-over: the frame left anyway.
        ++_ledger_errors;
        log::debug("timeline", "{}: mark_dispatched {}: {}", q.name, id, tl_error(r.err()));
    }
    publish_ledger_events();
}

void services::on_outcome(qpu_runtime& q, const dispatch::dispatch_outcome& o) {
    // The pump's report of this hand-over is in by now: its pass ended
    // before the link could show the job to the loop.
    apply_pump_reports(q);
    std::optional<std::pair<std::int64_t, std::uint64_t>> as_handed;
    if (const auto h = q.handed.find(o.job_id); h != q.handed.end()) {
        as_handed = h->second;
        q.handed.erase(h);
    }
    q.released.push_back(o.job_id);
    const std::int64_t now = _clock.now_realtime_ns();
    const timeline::reservation* r = _ledger ? _ledger->find(o.job_id) : nullptr;
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
        log::debug("dispatch", "{}: job {} re-placed after hand-over ({}): handing it over again",
                   q.name, o.job_id, o.reason);
        return;
    }
    std::string why = o.reason;
    if (!o.detail.empty()) {
        why += ": " + o.detail;
    }
    if (r->state == timeline::res_state::committed) {
        // Never sent (missed, calibration guard, endpoint down, stopped).
        ++q.missed;
        if (auto m = _ledger->miss(o.job_id, why, now); !m) {
            ++_ledger_errors;
            log::warn("timeline", "{}: miss {}: {}", q.name, o.job_id, tl_error(m.err()));
        }
    } else if (r->state == timeline::res_state::dispatched) {
        if (o.state == dispatch::job_state::completed) {
            ++q.completed;
            if (auto c = _ledger->complete(o.job_id, o.result, now); !c) {
                ++_ledger_errors;
                log::warn("timeline", "{}: complete {}: {}", q.name, o.job_id, tl_error(c.err()));
            }
        } else if (o.state == dispatch::job_state::sent) {
            ++q.sent;
            if (auto s = _ledger->mark_sent(o.job_id, o.detail, now); !s) {
                ++_ledger_errors;
                log::warn("timeline", "{}: mark_sent {}: {}", q.name, o.job_id, tl_error(s.err()));
            }
        } else {
            ++q.failed;
            if (auto f = _ledger->fail(o.job_id, why, now); !f) {
                ++_ledger_errors;
                log::warn("timeline", "{}: fail {}: {}", q.name, o.job_id, tl_error(f.err()));
            }
        }
    }
    publish_ledger_events();
}

void services::publish_ledger_events() {
    if (_engine) {
        _engine->drain_event_sources();
    }
}

void services::on_realtime_step() {
    auto step = _step_watch->check();
    if (!step) {
        log::warn("clock", "realtime step watch: {}", step.err().message);
        return;
    }
    if (!*step) {
        return;
    }
    const auto& s = **step;
    std::size_t n = 0;
    for (auto& q : _qpus) {
        n += q->link->on_realtime_step(s.after);
        q->calibration_dirty = true;
    }
    log::warn("clock", "CLOCK_REALTIME stepped by {} ns: {} queued deadlines re-converted", s.step_ns, n);
}


}  // namespace qrt
