// The job pump's thread: see job_pump.hpp.

#include "qrt/handover/job_pump.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "rtcore/rt_thread.hpp"

namespace qrt {

namespace {

void raise_max(std::atomic<std::int64_t>& m, std::int64_t v) noexcept {
    std::int64_t cur = m.load(std::memory_order_relaxed);
    while (v > cur && !m.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
}

}  // namespace

job_pump::job_pump(std::vector<dispatch::qpu_link*> links, rtcore::clock_source& clock, options opts)
    : _clock(clock), _opts(opts) {
    for (auto* l : links) {
        auto ln = std::make_unique<lane>();
        ln->link = l;
        ln->table = handover::handover_table(opts.max_jobs);
        _lanes.push_back(std::move(ln));
    }
}

job_pump::~job_pump() { stop(); }

rtcore::status job_pump::start() {
    if (_thread.joinable()) {
        return rtcore::ok();
    }
    _stop.store(false, std::memory_order_relaxed);
    try {
        _thread = std::thread([this] { thread_main(); });
    } catch (const std::exception& e) {
        return rtcore::error{EAGAIN, fmt::format("pump: start the job pump thread: {}", e.what())};
    }
    return rtcore::ok();
}

void job_pump::stop() noexcept {
    _stop.store(true, std::memory_order_relaxed);
    if (_thread.joinable()) {
        _thread.join();
    }
}

void job_pump::thread_main() noexcept {
    ::pthread_setname_np(::pthread_self(), "qrt-pump");
    std::string sched;
    std::string pinned;
    if (!_opts.cpus.empty()) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (const unsigned c : _opts.cpus.cpus()) {
            CPU_SET(c, &set);
        }
        const int rc = ::pthread_setaffinity_np(::pthread_self(), sizeof set, &set);
        pinned = rc == 0 ? " on CPUs " + _opts.cpus.to_list()
                         : fmt::format(" (pthread_setaffinity_np {}: error {}: runs where the process may)",
                                       _opts.cpus.to_list(), rc);
    }
    std::optional<rtcore::scoped_rt_thread> rt;
    if (_opts.priority > 0) {
        rtcore::rt_thread_config c;
        c.cpu = -1;  // the housekeeping CPUs the process runs on
        c.policy = rtcore::sched_policy::fifo;
        c.priority = _opts.priority;
        c.lock_memory = false;  // not the real-time path: nothing here is locked
        c.prefault_stack_bytes = 0;
        c.timer_slack_ns = 1;
        auto entered = rtcore::scoped_rt_thread::enter(c);
        if (entered) {
            rt.emplace(std::move(*entered));
            sched = fmt::format("SCHED_FIFO {}", _opts.priority);
        } else {
            sched = "SCHED_OTHER (" + entered.err().message + ")";
        }
    } else {
        sched = "SCHED_OTHER";
    }
    {
        std::lock_guard<rtcore::pi_mutex> lk(_sched_mu);
        _sched = sched + pinned;
    }
    const std::int64_t period = std::max<std::int64_t>(_opts.period_ns, 100'000);
    std::int64_t next = _clock.now_monotonic_ns() + period;
    while (!_stop.load(std::memory_order_relaxed)) {
        // An absolute CLOCK_MONOTONIC sleep (rtcore::clock_source: EINTR
        // retried with the same absolute time).
        (void)_clock.sleep_until_monotonic_ns(next);
        if (_stop.load(std::memory_order_relaxed)) {
            break;
        }
        const std::int64_t woke = _clock.now_monotonic_ns();
        raise_max(_max_lateness_ns, woke - next);
        pass(_clock.now_realtime_ns());
        const std::int64_t done = _clock.now_monotonic_ns();
        raise_max(_max_work_ns, done - woke);
        _ticks.fetch_add(1, std::memory_order_relaxed);
        next += period;
        if (next <= done) {
            // More than a period late: the next tick is one period from now,
            // not a burst of catch-up ticks.
            _ticks_skipped.fetch_add(static_cast<std::uint64_t>((done - next) / period + 1), std::memory_order_relaxed);
            next = done + period;
        }
    }
}

void job_pump::pass(std::int64_t now_rt_ns) noexcept {
    std::uint64_t planned = 0;
    for (auto& l : _lanes) {
        // pi_mutex::lock does not throw; nothing in the pass does.
        std::lock_guard<rtcore::pi_mutex> lk(l->mu);
        pass_lane(*l, now_rt_ns);
        planned += l->plan.jobs.size();
    }
    _plan_jobs.store(planned, std::memory_order_relaxed);
}

// Under l.mu.  Allocates nothing: every vector it grows was given its
// capacity by the loop (publish, take_reports); when one is full anyway the
// job waits for the next pass (counted as deferred) instead.
void job_pump::pass_lane(lane& l, std::int64_t now_rt_ns) noexcept {
    auto& t = l.table;
    const auto refused = [this](handover::refusal r) {
        if (r != handover::refusal::none) {
            _refused_transitions.fetch_add(1, std::memory_order_relaxed);
        }
    };
    if (l.next && !l.spent) {
        // Moves only: the old plan waits in spent for the loop to free.
        l.spent.emplace(std::move(l.plan));
        l.plan = std::move(*l.next);
        l.next.reset();  // a moved-from plan: nothing left to free
        t.forget_released(l.plan.seq);  // erases within the vector: never allocates
        _plans_taken.fetch_add(1, std::memory_order_relaxed);
    }
    const auto planned_at = [&](std::uint64_t id) -> const handover_entry* {
        const auto& idx = l.plan.by_id;
        const auto it = std::lower_bound(idx.begin(), idx.end(), id,
                                         [](const auto& e, std::uint64_t v) { return e.first < v; });
        return it != idx.end() && it->first == id ? &l.plan.jobs[it->second] : nullptr;
    };
    // A handed-over job that is no longer planned as handed (cancelled,
    // displaced by preemption, or moved by a calibration change) is
    // withdrawn, so its old slot is never sent.  A moved job comes back
    // through the loop (cancelled, never sent), is released, and is handed
    // over again from the plan.  One that starts beyond what the plan is
    // complete for (a backward realtime step moved now back) is left: the
    // dispatcher re-converts its deadline.
    bool withdrew = false;
    for (const auto& e : t.entries()) {
        if (e.state != handover::job_state::handed) {
            continue;
        }
        if (const auto* p = planned_at(e.id)) {
            if (p->job.scheduled_ns == e.start_ns && p->job.calibration_id == e.calibration_id) {
                continue;
            }
        } else if (e.start_ns >= l.plan.complete_until_ns) {
            continue;
        }
        refused(t.withdraw(e.id, false));  // changes the state only: the entries stay in place
        withdrew = l.link->withdraw(e.id) == dispatch::dispatcher::withdraw_result::withdrawn || withdrew;
    }
    // The stale copies come back `cancelled` now rather than at their old
    // start, so a re-placed job is handed over again in time.
    if (withdrew) {
        l.link->report_withdrawn();
    }
    // A wire-2 QPU whose endpoint arms slower than the daemon's minimum
    // lead budgets gets its jobs that much earlier (its ARM leaves then).
    const std::int64_t horizon_end = now_rt_ns + _opts.horizon_ns + l.link->extra_lead_ns();
    for (const auto& e : l.plan.jobs) {
        const auto& j = e.job;
        if (j.scheduled_ns >= horizon_end) {
            break;  // start order
        }
        if (t.find(j.job_id) != nullptr) {
            continue;  // decided, withheld by the gate, or released and not yet forgotten
        }
        if (!t.has_room() || l.reports.size() == l.reports.capacity()) {
            _deferred.fetch_add(1, std::memory_order_relaxed);
            break;  // the loop grows them with its next publish or take_reports
        }
        // Claimed first, then submitted: the decision is on record before
        // the job is in the ring, whatever happens next.
        refused(t.claim(j.job_id, j.scheduled_ns, j.calibration_id));
        pump_report r;
        r.what = pump_report::kind::refused;
        r.id = j.job_id;
        r.start_ns = j.scheduled_ns;
        r.calibration_id = j.calibration_id;
        if (j.scheduled_ns + j.tolerance_ns < now_rt_ns) {
            r.missed_before_handover = true;
            r.passed_by_ns = now_rt_ns - j.scheduled_ns;
            r.tolerance_ns = j.tolerance_ns;
        } else if (e.refuse) {
            r.loop_reason = e.refuse;  // a reference count, no copy
        } else if (const auto why = l.link->try_submit(j, e.payload); why == dispatch::submit_refusal::none) {
            r.what = pump_report::kind::handed;
        } else {
            r.dispatch_refused = true;
            r.refusal = why;
        }
        refused(r.what == pump_report::kind::handed ? t.hand(j.job_id) : t.refuse(j.job_id));
        l.reports.push_back(std::move(r));  // within the capacity checked above
    }
}

std::string pump_report::reason_text(const dispatch::qpu_link& link) const {
    if (missed_before_handover) {
        return fmt::format("{}: start {} passed by {} ns before hand-over (tolerance {} ns)", dispatch::outcome::missed,
                           start_ns, passed_by_ns, tolerance_ns);
    }
    if (dispatch_refused) {
        dispatch::dispatch_job job;
        job.job_id = id;
        job.scheduled_ns = start_ns;
        return fmt::format("{}: {}", dispatch::outcome::dispatch_refused, link.describe_refusal(refusal, job, 0));
    }
    if (loop_reason) {
        return *loop_reason;
    }
    return "";
}

void job_pump::reserve_for_plans(lane& l) {
    // Each job of the current and of the next plan is claimed and reported
    // at most once, so this much room is all the pump can use before the
    // loop comes back.
    const std::size_t may_add = l.plan.jobs.size() + (l.next ? l.next->jobs.size() : 0);
    l.table.reserve(may_add);
    l.reports.reserve(l.reports.size() + may_add);
}

void job_pump::publish(std::uint32_t qpu, handover_plan plan) {
    if (qpu >= _lanes.size()) {
        return;
    }
    plan.by_id.clear();
    plan.by_id.reserve(plan.jobs.size());
    for (std::size_t i = 0; i < plan.jobs.size(); ++i) {
        plan.by_id.emplace_back(plan.jobs[i].job.job_id, static_cast<std::uint32_t>(i));
    }
    std::sort(plan.by_id.begin(), plan.by_id.end());
    lane& l = *_lanes[qpu];
    std::optional<handover_plan> untaken;  // freed after the lock is released
    std::optional<handover_plan> spent;    // likewise
    std::lock_guard<rtcore::pi_mutex> lk(l.mu);
    untaken.swap(l.next);
    spent.swap(l.spent);
    // Built after every change the withheld jobs stood for.
    plan.seq = l.table.on_publish();
    l.next = std::move(plan);
    reserve_for_plans(l);
}

std::vector<pump_report> job_pump::take_reports(std::uint32_t qpu) {
    std::vector<pump_report> out;
    if (qpu >= _lanes.size()) {
        return out;
    }
    lane& l = *_lanes[qpu];
    std::lock_guard<rtcore::pi_mutex> lk(l.mu);
    out.swap(l.reports);
    reserve_for_plans(l);
    return out;
}

dispatch::dispatcher::withdraw_result job_pump::withdraw(std::uint32_t qpu, std::uint64_t id) {
    using wr = dispatch::dispatcher::withdraw_result;
    if (qpu >= _lanes.size()) {
        return wr::too_late;
    }
    lane& l = *_lanes[qpu];
    std::lock_guard<rtcore::pi_mutex> lk(l.mu);
    const auto* e = l.table.find(id);
    if (e == nullptr || e->state == handover::job_state::released || e->state == handover::job_state::withheld) {
        // Not in the link: keep the pump from handing it over from a plan
        // built before the change.  A full table refuses the change.
        return l.table.withhold(id) == handover::refusal::none ? wr::not_queued : wr::too_late;
    }
    if (e->state != handover::job_state::handed) {
        return l.link->withdraw(id);  // refused or withdrawn already: nothing queued, or its record is on its way
    }
    const auto w = l.link->withdraw(id);
    if (w == wr::withdrawn && l.table.withdraw(id, true) != handover::refusal::none) {
        _refused_transitions.fetch_add(1, std::memory_order_relaxed);
    }
    return w;
}

bool job_pump::restore(std::uint32_t qpu, std::uint64_t id) {
    if (qpu >= _lanes.size()) {
        return false;
    }
    lane& l = *_lanes[qpu];
    std::lock_guard<rtcore::pi_mutex> lk(l.mu);
    const auto* e = l.table.find(id);
    if (e == nullptr) {
        return false;
    }
    if (e->state == handover::job_state::withheld) {
        (void)l.table.restore(id);
        return true;  // nothing was in the dispatcher to put back
    }
    if (e->state != handover::job_state::withdrawn || !e->by_gate) {
        return false;
    }
    if (!l.link->restore(id)) {
        return false;  // dropped already: its `cancelled` record comes back, then release()
    }
    return l.table.restore(id) == handover::refusal::none;
}

bool job_pump::release(std::uint32_t qpu, std::uint64_t id) {
    if (qpu >= _lanes.size()) {
        return false;
    }
    lane& l = *_lanes[qpu];
    std::lock_guard<rtcore::pi_mutex> lk(l.mu);
    if (l.table.release(id) != handover::refusal::none) {
        _refused_transitions.fetch_add(1, std::memory_order_relaxed);
        return false;
    }
    return true;
}

std::optional<std::pair<std::int64_t, std::uint64_t>> job_pump::handed_as(std::uint32_t qpu, std::uint64_t id) const {
    if (qpu >= _lanes.size()) {
        return std::nullopt;
    }
    const lane& l = *_lanes[qpu];
    std::lock_guard<rtcore::pi_mutex> lk(l.mu);
    const auto* e = l.table.find(id);
    if (e == nullptr || (e->state != handover::job_state::handed && e->state != handover::job_state::withdrawn)) {
        return std::nullopt;
    }
    return std::make_pair(e->start_ns, e->calibration_id);
}

std::size_t job_pump::in_flight(std::uint32_t qpu) const {
    if (qpu >= _lanes.size()) {
        return 0;
    }
    const lane& l = *_lanes[qpu];
    std::lock_guard<rtcore::pi_mutex> lk(l.mu);
    return l.table.in_flight();
}

void job_pump::on_arm(std::uint32_t qpu, std::uint64_t id, dispatch::arm_event e) {
    if (qpu >= _lanes.size()) {
        return;
    }
    lane& l = *_lanes[qpu];
    std::lock_guard<rtcore::pi_mutex> lk(l.mu);
    if (l.table.on_arm(id, e) != handover::refusal::none) {
        _refused_transitions.fetch_add(1, std::memory_order_relaxed);
    }
}

std::pair<std::size_t, std::size_t> job_pump::arming_armed(std::uint32_t qpu) const {
    if (qpu >= _lanes.size()) {
        return {0, 0};
    }
    const lane& l = *_lanes[qpu];
    std::lock_guard<rtcore::pi_mutex> lk(l.mu);
    return {l.table.count(handover::arm_state::arming), l.table.count(handover::arm_state::armed)};
}

bool job_pump::releases_pending(std::uint32_t qpu) const {
    if (qpu >= _lanes.size()) {
        return false;
    }
    const lane& l = *_lanes[qpu];
    std::lock_guard<rtcore::pi_mutex> lk(l.mu);
    return l.table.released_unpublished() != 0;
}

pump_stats job_pump::stats() const {
    pump_stats s;
    {
        std::lock_guard<rtcore::pi_mutex> lk(_sched_mu);
        s.sched = _sched;
    }
    // Counters only: each is read on its own (relaxed), none orders another.
    const auto now = [](const auto& counter) { return counter.load(std::memory_order_relaxed); };
    s.ticks = now(_ticks);
    s.ticks_skipped = now(_ticks_skipped);
    s.max_lateness_ns = now(_max_lateness_ns);
    s.max_work_ns = now(_max_work_ns);
    s.plan_jobs = now(_plan_jobs);
    s.plans_taken = now(_plans_taken);
    s.deferred = now(_deferred);
    s.refused_transitions = now(_refused_transitions);
    return s;
}

}  // namespace qrt
