// The job pump against a real qpu_link (untuned dispatch thread, write-only
// /dev/null endpoint: every job sent on time ends `sent`).  The test thread
// is the event loop, and it runs only when a test says so: what the pump does
// meanwhile is what it does for a stalled loop.  Behaviour only, no timing
// is asserted (the horizons are generous).

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "qrt/handover/job_pump.hpp"
#include "qrt/dispatch/qpu_link.hpp"
#include "qrt/event_loop.hpp"
#include "rtcore/clock.hpp"

using namespace qrt;

// Every allocation and free of this test binary, counted per thread, with a
// switch that makes them fail: the pump's pass must do neither (it once
// allocated under its priority-inheriting lock on its SCHED_FIFO
// thread, and an allocation failure after submit reported a queued job as
// missed).
namespace {
thread_local std::size_t t_allocations = 0;
thread_local std::size_t t_frees = 0;
thread_local bool t_fail_allocations = false;
}  // namespace

void* operator new(std::size_t n) {
    ++t_allocations;
    if (t_fail_allocations) {
        throw std::bad_alloc();
    }
    if (void* p = std::malloc(n == 0 ? 1 : n)) {
        return p;
    }
    throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept {
    if (p != nullptr) {
        ++t_frees;
    }
    std::free(p);
}
void operator delete[](void* p) noexcept { ::operator delete(p); }
void operator delete(void* p, std::size_t) noexcept { ::operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { ::operator delete(p); }

namespace {

constexpr std::int64_t ms = 1'000'000;

class job_pump_fixture : public ::testing::Test {
protected:
    void SetUp() override {
        dispatch::qpu_link_config lc;
        lc.endpoint = "file:///dev/null";
        lc.dispatch.mode = dispatch::dispatch_mode::untuned;
        lc.dispatch.slots = 64;
        lc.dispatch.max_payload_bytes = 256;
        dispatch::qpu_link_callbacks cb;
        cb.on_outcome = [this](const dispatch::dispatch_outcome& o) {
            _outcomes[o.job_id] = o;
            _outcome_log.push_back(o.job_id);
        };
        _link = std::make_unique<dispatch::qpu_link>(_loop, _clock, lc, std::move(cb));
        ASSERT_TRUE(_link->start());
        ASSERT_TRUE(_link->endpoint_up()) << _link->last_endpoint_error();
    }
    void TearDown() override {
        if (_pump) {
            _pump->stop();
        }
        _link->stop();
    }

    void make_pump(std::int64_t horizon_ns = 250 * ms) {
        job_pump::options o;
        o.period_ns = 1 * ms;
        o.horizon_ns = horizon_ns;
        _pump = std::make_unique<job_pump>(std::vector<dispatch::qpu_link*>{_link.get()}, _clock, o);
    }

    handover_entry entry(std::uint64_t id, std::int64_t start_ns) const {
        handover_entry e;
        e.job.job_id = id;
        e.job.scheduled_ns = start_ns;
        e.job.window_start_ns = start_ns - 1000 * ms;
        e.job.window_end_ns = start_ns + 1000 * ms;
        e.job.duration_ns = 100'000;
        e.job.calibration_id = 1;
        e.job.tolerance_ns = 300 * ms;  // a loaded machine wakes an untuned thread late
        e.job.shots = 1;
        e.payload = timeline::blob(std::vector<std::uint8_t>{'{', '}'});
        return e;
    }

    handover_plan plan_of(std::vector<handover_entry> jobs, std::int64_t horizon_ns = 1000 * ms) const {
        handover_plan p;
        p.jobs = std::move(jobs);
        p.complete_until_ns = _clock.now_realtime_ns() + horizon_ns;
        return p;
    }

    // Run the loop until every id has an outcome (bounded).
    void run_loop_until_outcomes(const std::vector<std::uint64_t>& ids, std::chrono::seconds limit) {
        const auto give_up = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < give_up) {
            _loop.run_once(std::chrono::milliseconds(5));
            bool all = true;
            for (const auto id : ids) {
                all = all && _outcomes.count(id) != 0;
            }
            if (all) {
                return;
            }
        }
    }

    std::map<std::uint64_t, std::string> handed_reports() {
        std::map<std::uint64_t, std::string> out;
        for (const auto& r : _pump->take_reports(0)) {
            out[r.id] = r.what == pump_report::kind::handed ? "handed" : r.reason_text(*_link);
        }
        return out;
    }

    rtcore::real_clock _clock;
    event_loop _loop;
    std::unique_ptr<dispatch::qpu_link> _link;
    std::unique_ptr<job_pump> _pump;
    std::map<std::uint64_t, dispatch::dispatch_outcome> _outcomes;  // the last one of each job
    std::vector<std::uint64_t> _outcome_log;                         // every outcome, in order
};

}  // namespace

TEST_F(job_pump_fixture, planned_jobs_reach_the_dispatch_ring_while_the_loop_does_not_run) {
    make_pump();
    const std::int64_t now = _clock.now_realtime_ns();
    std::vector<handover_entry> jobs;
    std::vector<std::uint64_t> ids;
    for (std::uint64_t i = 1; i <= 20; ++i) {
        jobs.push_back(entry(i, now + 400 * ms + static_cast<std::int64_t>(i) * 5 * ms));
        ids.push_back(i);
    }
    _pump->publish(0, plan_of(std::move(jobs)));
    ASSERT_TRUE(_pump->start());
    // The loop stays stalled: nothing here runs it.  The jobs enter the
    // hand-over horizon (250 ms) about 150 ms from now; wait until the pump
    // has handed every one to the dispatcher, bounded at 5 s.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    std::size_t queued = 0;
    while (std::chrono::steady_clock::now() < give_up) {
        queued = 0;
        for (const auto id : ids) {
            queued += _link->dispatch().queued_deadline_ns(id).has_value() ? 1U : 0U;
        }
        if (queued == ids.size() || !_outcomes.empty()) {
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(queued, ids.size()) << "jobs in the dispatcher's ring while the loop was stalled";
    EXPECT_TRUE(_outcomes.empty());
    // Now the loop runs: every job was sent (write-only endpoint), none missed.
    run_loop_until_outcomes(ids, std::chrono::seconds(10));
    for (const auto id : ids) {
        ASSERT_EQ(_outcomes.count(id), 1U) << "job " << id << " has no outcome";
        EXPECT_EQ(_outcomes[id].state, dispatch::job_state::sent) << "job " << id << ": " << _outcomes[id].reason;
    }
    const auto reports = handed_reports();
    EXPECT_EQ(reports.size(), ids.size());
    for (const auto& [id, what] : reports) {
        EXPECT_EQ(what, "handed") << "job " << id;
    }
    EXPECT_GT(_pump->stats().ticks, 0U);
}

TEST_F(job_pump_fixture, a_job_no_longer_planned_is_withdrawn_and_a_moved_one_is_handed_over_again_once_released) {
    make_pump();
    const std::int64_t now = _clock.now_realtime_ns();
    _pump->publish(0, plan_of({entry(1, now + 200 * ms), entry(2, now + 220 * ms)}));
    _pump->pass(now);
    EXPECT_TRUE(_link->dispatch().queued_deadline_ns(1).has_value());
    EXPECT_TRUE(_link->dispatch().queued_deadline_ns(2).has_value());
    // Job 1 moved 30 ms later, job 2 cancelled: both stale copies withdrawn.
    _pump->publish(0, plan_of({entry(1, now + 230 * ms)}));
    _pump->pass(now);
    run_loop_until_outcomes({1, 2}, std::chrono::seconds(5));
    ASSERT_EQ(_outcomes.count(1), 1U);
    ASSERT_EQ(_outcomes.count(2), 1U);
    EXPECT_EQ(_outcomes[1].reason, "cancelled");
    EXPECT_EQ(_outcomes[2].reason, "cancelled");
    EXPECT_EQ(_outcomes[1].sent_ns, 0);
    // Not handed again before the loop releases it...
    _outcomes.clear();
    _pump->pass(now);
    EXPECT_FALSE(_link->dispatch().queued_deadline_ns(1).has_value());
    // ...and handed over at its new start once it is.
    EXPECT_TRUE(_pump->release(0, 1));
    EXPECT_TRUE(_pump->release(0, 2));
    EXPECT_TRUE(_pump->releases_pending(0));
    _pump->publish(0, plan_of({entry(1, now + 230 * ms)}));
    EXPECT_FALSE(_pump->releases_pending(0));
    _pump->pass(now);
    const auto deadline = _link->dispatch().queued_deadline_ns(1);
    ASSERT_TRUE(deadline.has_value());
    run_loop_until_outcomes({1}, std::chrono::seconds(10));
    ASSERT_EQ(_outcomes.count(1), 1U);
    EXPECT_EQ(_outcomes[1].state, dispatch::job_state::sent) << _outcomes[1].reason;
    EXPECT_EQ(_outcomes[1].scheduled_ns, now + 230 * ms);
}

TEST_F(job_pump_fixture, a_withdrawn_job_is_not_handed_over_from_the_plan_it_was_in_until_restored) {
    make_pump();
    const std::int64_t now = _clock.now_realtime_ns();
    _pump->publish(0, plan_of({entry(7, now + 200 * ms)}));
    // The ledger's gate, before the pump's pass: nothing handed, nothing to race.
    EXPECT_EQ(_pump->withdraw(0, 7), dispatch::dispatcher::withdraw_result::not_queued);
    _pump->pass(now);
    EXPECT_FALSE(_link->dispatch().queued_deadline_ns(7).has_value());
    EXPECT_TRUE(_pump->take_reports(0).empty());
    // The change was abandoned: the job goes out from the same plan.
    EXPECT_TRUE(_pump->restore(0, 7));  // nothing was in the dispatcher: the hold ends
    _pump->pass(now);
    EXPECT_TRUE(_link->dispatch().queued_deadline_ns(7).has_value());
    EXPECT_EQ(_pump->in_flight(0), 1U);
    ASSERT_TRUE(_pump->handed_as(0, 7).has_value());
    EXPECT_EQ(_pump->handed_as(0, 7)->first, now + 200 * ms);
    // Handed, then withdrawn: the cancel wins the race; abandoned, the
    // dispatcher takes it back; withdrawn again, it comes back cancelled.
    EXPECT_EQ(_pump->withdraw(0, 7), dispatch::dispatcher::withdraw_result::withdrawn);
    // (restore is false only when the dispatch thread dropped the withdrawn
    // job at its look in between: its `cancelled` record comes back anyway.)
    const bool back = _pump->restore(0, 7);
    EXPECT_EQ(back, _link->dispatch().queued_deadline_ns(7).has_value());
    if (back) {
        EXPECT_EQ(_pump->withdraw(0, 7), dispatch::dispatcher::withdraw_result::withdrawn);
    }
    _link->report_withdrawn();
    run_loop_until_outcomes({7}, std::chrono::seconds(5));
    ASSERT_EQ(_outcomes.count(7), 1U);
    EXPECT_EQ(_outcomes[7].reason, "cancelled");
}

TEST_F(job_pump_fixture, a_start_passed_before_the_hand_over_is_reported_missed_and_never_queued) {
    make_pump();
    const std::int64_t now = _clock.now_realtime_ns();
    auto late = entry(3, now - 400 * ms);  // beyond its 300 ms tolerance
    auto refused = entry(4, now + 100 * ms);
    refused.refuse = std::make_shared<const std::string>("calibration_changed: no calibration window holds start");
    _pump->publish(0, plan_of({late, refused}));
    _pump->pass(now);
    EXPECT_FALSE(_link->dispatch().queued_deadline_ns(3).has_value());
    EXPECT_FALSE(_link->dispatch().queued_deadline_ns(4).has_value());
    const auto reports = _pump->take_reports(0);
    ASSERT_EQ(reports.size(), 2U);
    EXPECT_TRUE(reports[0].missed_before_handover);
    EXPECT_EQ(reports[0].reason_text(*_link).rfind("missed: ", 0), 0U) << reports[0].reason_text(*_link);
    EXPECT_EQ(reports[1].reason_text(*_link), *refused.refuse);
    // Reported once, not at every pass, until the loop releases them.
    _pump->pass(now);
    EXPECT_TRUE(_pump->take_reports(0).empty());
}

// For ThreadSanitizer: the pump thread hands over and withdraws while this
// thread (the loop) publishes, withdraws, drains records and releases.
TEST_F(job_pump_fixture, the_pump_thread_and_a_busy_loop_share_the_link_without_losing_a_job) {
    make_pump(50 * ms);
    ASSERT_TRUE(_pump->start());
    std::uint64_t next_id = 100;
    std::size_t outcomes_seen = 0;
    std::vector<handover_entry> planned;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
    while (std::chrono::steady_clock::now() < until) {
        const std::int64_t now = _clock.now_realtime_ns();
        planned.push_back(entry(next_id++, now + 60 * ms));
        std::erase_if(planned, [&](const handover_entry& e) { return e.job.scheduled_ns < now; });
        if (next_id % 7 == 0 && planned.size() > 1) {
            // A cancel racing the hand-over: the job leaves the plan.
            (void)_pump->withdraw(0, planned.front().job.job_id);
            planned.erase(planned.begin());
        }
        for (std::size_t i = outcomes_seen; i < _outcome_log.size(); ++i) {
            (void)_pump->release(0, _outcome_log[i]);
        }
        outcomes_seen = _outcome_log.size();
        _pump->publish(0, plan_of(planned, 200 * ms));
        (void)_pump->take_reports(0);
        (void)_pump->stats();
        _loop.run_once(std::chrono::milliseconds(1));
    }
    // Stop planning: what is queued finishes.
    _pump->publish(0, plan_of(planned, 200 * ms));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    _pump->stop();
    run_loop_until_outcomes({}, std::chrono::seconds(1));
    const auto wait_until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < wait_until && _link->pending() != 0) {
        _loop.run_once(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(_link->pending(), 0U) << "every handed job has its outcome";
    EXPECT_EQ(_link->dispatch().queued(), 0U);
    const auto tel = _link->telemetry();
    EXPECT_EQ(tel.counters.submitted, _outcome_log.size()) << "one outcome per submitted job";
    EXPECT_GT(tel.counters.submitted, 0U);
}

// A pass (hand-overs, refusals, a withdrawal after a new
// plan) neither allocates nor frees: the loop sized its storage in publish()
// and take_reports(), and the text of a refusal is made on the loop.
TEST_F(job_pump_fixture, a_pass_allocates_and_frees_nothing) {
    make_pump();
    const std::int64_t now = _clock.now_realtime_ns();
    std::vector<handover_entry> jobs;
    jobs.push_back(entry(1, now - 400 * ms));  // missed before hand-over
    auto refused = entry(2, now + 50 * ms);
    refused.refuse = std::make_shared<const std::string>("calibration_changed: placed in calibration 1");
    jobs.push_back(refused);
    for (std::uint64_t i = 3; i <= 40; ++i) {
        jobs.push_back(entry(i, now + 60 * ms + static_cast<std::int64_t>(i) * ms));
    }
    auto second = jobs;  // the next plan: job 5 cancelled, job 6 moved
    second.erase(second.begin() + 4);
    second[4].job.scheduled_ns += 3 * ms;
    _pump->publish(0, plan_of(std::move(jobs)));

    t_allocations = t_frees = 0;
    _pump->pass(now);
    EXPECT_EQ(t_allocations, 0U) << "the pass allocated";
    EXPECT_EQ(t_frees, 0U) << "the pass freed";
    auto reports = _pump->take_reports(0);
    ASSERT_EQ(reports.size(), 40U);
    EXPECT_TRUE(reports[0].missed_before_handover);
    EXPECT_EQ(reports[1].reason_text(*_link), "calibration_changed: placed in calibration 1");
    for (std::size_t i = 2; i < reports.size(); ++i) {
        EXPECT_EQ(reports[i].what, pump_report::kind::handed) << "job " << reports[i].id;
    }

    _pump->publish(0, plan_of(std::move(second)));
    t_allocations = t_frees = 0;
    _pump->pass(now);  // takes the plan: withdraws 5 and 6, hands nothing new
    EXPECT_EQ(t_allocations, 0U) << "taking a plan and withdrawing allocated";
    EXPECT_EQ(t_frees, 0U) << "taking a plan freed the old one on the pump";
    EXPECT_EQ(_pump->stats().deferred, 0U);
    run_loop_until_outcomes({5, 6}, std::chrono::seconds(5));
    EXPECT_EQ(_outcomes[5].reason, "cancelled") << "the job left the plan and was not withdrawn";
    EXPECT_EQ(_outcomes[6].reason, "cancelled") << "the moved job's old slot was not withdrawn";
}

// Decided before submitted: with every allocation failing on the pump's
// thread, each job is handed over exactly once and reported so; none is
// reported missed while it sits queued.
TEST_F(job_pump_fixture, an_allocation_failure_in_a_pass_loses_no_decision) {
    make_pump();
    const std::int64_t now = _clock.now_realtime_ns();
    std::vector<handover_entry> jobs;
    for (std::uint64_t i = 1; i <= 10; ++i) {
        jobs.push_back(entry(i, now + 100 * ms + static_cast<std::int64_t>(i) * ms));
    }
    _pump->publish(0, plan_of(std::move(jobs)));
    t_fail_allocations = true;
    _pump->pass(now);
    _pump->pass(now + ms);
    t_fail_allocations = false;
    const auto reports = handed_reports();
    ASSERT_EQ(reports.size(), 10U);
    for (const auto& [id, what] : reports) {
        EXPECT_EQ(what, "handed") << "job " << id;
        EXPECT_TRUE(_link->dispatch().queued_deadline_ns(id).has_value()) << "job " << id;
    }
}
