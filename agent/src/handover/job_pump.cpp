// The job pump's thread: see job_pump.hpp.

#include "qrt/handover/job_pump.hpp"

#include <pthread.h>
#include <sched.h>
#include <time.h>

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

timespec to_timespec(std::int64_t ns) noexcept {
    return timespec{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
}

}  // namespace

job_pump::job_pump(std::vector<dispatch::qpu_link*> links, rtcore::clock_source& clock, options opts)
    : _clock(clock), _opts(opts) {
    for (auto* l : links) {
        auto ln = std::make_unique<lane>();
        ln->link = l;
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
        const timespec ts = to_timespec(next);
        while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
        }
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

namespace {

// The decision for id in the sorted vector, or its end.
template <typename V>
auto find_decision(V& decisions, std::uint64_t id) noexcept {
    auto it = std::lower_bound(decisions.begin(), decisions.end(), id,
                               [](const auto& d, std::uint64_t v) { return d.id < v; });
    return it != decisions.end() && it->id == id ? it : decisions.end();
}

}  // namespace

// Under l.mu.  Allocates nothing: every vector it grows was given its
// capacity by the loop (publish, take_reports); when one is full anyway the
// job waits for the next pass (counted as deferred) instead.
void job_pump::pass_lane(lane& l, std::int64_t now_rt_ns) noexcept {
    if (l.next && !l.spent) {
        // Moves only: the old plan waits in spent for the loop to free.
        l.spent.emplace(std::move(l.plan));
        l.plan = std::move(*l.next);
        l.next.reset();  // a moved-from plan: nothing left to free
        for (const auto id : l.released) {
            const auto it = find_decision(l.decisions, id);
            if (it != l.decisions.end()) {
                l.decisions.erase(it);  // shifts down: never allocates
            }
        }
        l.released.clear();
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
    for (auto& d : l.decisions) {
        if (!d.handed || d.withdrawn) {
            continue;
        }
        if (const auto* e = planned_at(d.id)) {
            if (e->job.scheduled_ns == d.start_ns && e->job.calibration_id == d.calibration_id) {
                continue;
            }
        } else if (d.start_ns >= l.plan.complete_until_ns) {
            continue;
        }
        d.withdrawn = true;
        withdrew = l.link->withdraw(d.id) == dispatch::dispatcher::withdraw_result::withdrawn || withdrew;
    }
    // The stale copies come back `cancelled` now rather than at their old
    // start, so a re-placed job is handed over again in time.
    if (withdrew) {
        l.link->report_withdrawn();
    }
    const std::int64_t horizon_end = now_rt_ns + _opts.horizon_ns;
    for (const auto& e : l.plan.jobs) {
        const auto& j = e.job;
        if (j.scheduled_ns >= horizon_end) {
            break;  // start order
        }
        const auto at = std::lower_bound(l.decisions.begin(), l.decisions.end(), j.job_id,
                                         [](const decided& d, std::uint64_t v) { return d.id < v; });
        if ((at != l.decisions.end() && at->id == j.job_id) || l.revoked.count(j.job_id) != 0) {
            continue;
        }
        if (l.decisions.size() == l.decisions.capacity() || l.reports.size() == l.reports.capacity()) {
            _deferred.fetch_add(1, std::memory_order_relaxed);
            break;  // the loop grows them with its next publish or take_reports
        }
        // Decided first, then submitted: the decision is on record before
        // the job is in the ring, whatever happens next.
        auto& d = *l.decisions.insert(at, decided{j.job_id, j.scheduled_ns, j.calibration_id, false, false});
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
            d.handed = true;
        } else {
            r.dispatch_refused = true;
            r.refusal = why;
        }
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
    // Each job of the current and of the next plan is decided and reported
    // at most once, so this much room is all the pump can use before the
    // loop comes back.
    const std::size_t may_add = l.plan.jobs.size() + (l.next ? l.next->jobs.size() : 0);
    l.decisions.reserve(l.decisions.size() + may_add);
    l.reports.reserve(l.reports.size() + may_add);
}

void job_pump::publish(std::uint32_t qpu, handover_plan plan, std::vector<std::uint64_t> released) {
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
    l.next = std::move(plan);
    l.released.insert(l.released.end(), released.begin(), released.end());
    // Built after every change the revocations stood for.
    l.revoked.clear();
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

dispatch::dispatcher::withdraw_result job_pump::revoke(std::uint32_t qpu, std::uint64_t id) {
    lane& l = *_lanes.at(qpu);
    std::lock_guard<rtcore::pi_mutex> lk(l.mu);
    l.revoked.insert(id);
    return l.link->withdraw(id);
}

bool job_pump::give_back(std::uint32_t qpu, std::uint64_t id) {
    lane& l = *_lanes.at(qpu);
    std::lock_guard<rtcore::pi_mutex> lk(l.mu);
    l.revoked.erase(id);
    return l.link->restore(id);
}

pump_stats job_pump::stats() const {
    pump_stats s;
    {
        std::lock_guard<rtcore::pi_mutex> lk(_sched_mu);
        s.sched = _sched;
    }
    s.ticks = _ticks.load(std::memory_order_relaxed);
    s.ticks_skipped = _ticks_skipped.load(std::memory_order_relaxed);
    s.max_lateness_ns = _max_lateness_ns.load(std::memory_order_relaxed);
    s.max_work_ns = _max_work_ns.load(std::memory_order_relaxed);
    s.plan_jobs = _plan_jobs.load(std::memory_order_relaxed);
    s.plans_taken = _plans_taken.load(std::memory_order_relaxed);
    s.deferred = _deferred.load(std::memory_order_relaxed);
    return s;
}

}  // namespace qrt
