// The hand-over room's late-commit withdrawal (room::on_commit), against a
// real ledger (no store: every change is durable at once, and the commit
// listener's notice is written here) and a real qpu_link (untuned dispatch
// thread, write-only /dev/null endpoint) behind a real job pump.  The test
// thread is the event loop.  Starts are seconds apart from the hand-over's
// need, so nothing depends on how fast the machine is.

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "qrt/dispatch/qpu_link.hpp"
#include "qrt/event_loop.hpp"
#include "qrt/handover/room.hpp"
#include "qrt/timeline/ledger.hpp"
#include "rtcore/clock.hpp"

using namespace qrt;

namespace {

constexpr std::int64_t ms = 1'000'000;
constexpr std::int64_t s = 1000 * ms;

class handover_room : public ::testing::Test {
protected:
    void SetUp() override {
        _now = _clock.now_realtime_ns();
        // One window from a second ago for an hour: every start below is
        // inside it.
        timeline::ledger_options lo;
        lo.min_lead_ns = 1 * ms;
        auto l = timeline::ledger::open(
            {timeline::qpu_spec{"q0", timeline::periodic_calibration{3600 * s, 1 * ms, _now - 1 * s, 0.99, 0}}},
            lo, "", _now);
        ASSERT_TRUE(l.has_value()) << l.err().message;
        _ledger = std::move(*l);

        dispatch::qpu_link_config lc;
        lc.endpoint = "file:///dev/null";
        lc.dispatch.mode = dispatch::dispatch_mode::untuned;
        lc.dispatch.slots = 64;
        lc.dispatch.max_payload_bytes = 256;
        _link = std::make_unique<dispatch::qpu_link>(_loop, _clock, lc, dispatch::qpu_link_callbacks{});
        ASSERT_TRUE(_link->start());

        handover::room::options ro;
        ro.plan_horizon_ns = 60 * s;
        ro.plan_max_jobs = 16;
        ro.handover_ns = 2 * s;  // a job starting sooner than this after its commit is late
        _room = std::make_unique<handover::room>(
            _loop, *_ledger, _clock, ro,
            std::vector<handover::qpu_target>{{0, "q0", _link.get(), 300 * ms}}, [] {});
        job_pump::options po;
        po.period_ns = 1 * ms;
        po.horizon_ns = 250 * ms;
        po.max_jobs = 64;
        ASSERT_TRUE(_room->start(po));
    }
    void TearDown() override {
        if (_room) {
            _room->stop();
        }
        if (_link) {
            _link->stop();
        }
        _room.reset();
    }

    timeline::reservation submit(const std::string& key, std::int64_t start_ns) {
        timeline::request r;
        r.duration_ns = 1 * ms;
        r.not_before_ns = start_ns;
        r.qpus = {"q0"};
        auto job = _ledger->submit("tenant", r, key, timeline::blob{1, 2}, _now);
        EXPECT_TRUE(job.has_value()) << (job ? "" : job.err().message);
        return job ? *job : timeline::reservation{};
    }

    rtcore::real_clock _clock;
    event_loop _loop;
    std::int64_t _now = 0;
    std::unique_ptr<timeline::ledger> _ledger;
    std::unique_ptr<dispatch::qpu_link> _link;
    std::unique_ptr<handover::room> _room;
};

// Acknowledged means dispatchable: the job whose start is closer than the
// hand-over needs when its commit becomes durable is taken back and handed
// to the caller (to refuse its request, with the next possible start); the
// one still on time is kept and planned for the pump.
TEST_F(handover_room, a_job_durable_too_late_for_its_start_is_withdrawn_and_the_rest_is_planned) {
    const auto late = submit("late", _now + 500 * ms);
    const auto on_time = submit("on-time", _now + 20 * s);
    ASSERT_EQ(late.start_ns, _now + 500 * ms);
    ASSERT_EQ(on_time.start_ns, _now + 20 * s);
    (void)_ledger->drain_events();

    timeline::commit_notice n;
    n.committed = {{7, late.id}, {8, on_time.id}};
    const auto withdrawn = _room->on_commit(n);

    ASSERT_EQ(withdrawn.size(), 1U);
    EXPECT_EQ(withdrawn[0].id, late.id);
    EXPECT_EQ(withdrawn[0].seq, 7U);  // the change whose request gets the refusal
    EXPECT_EQ(withdrawn[0].start_ns, late.start_ns);
    EXPECT_GT(withdrawn[0].next_start_ns, 0) << withdrawn[0].message;
    EXPECT_NE(withdrawn[0].message.find("retry"), std::string::npos) << withdrawn[0].message;
    EXPECT_EQ(_ledger->find(late.id), nullptr);  // a one-shot submit: forgotten
    ASSERT_NE(_ledger->find(on_time.id), nullptr);
    EXPECT_EQ(_ledger->find(on_time.id)->state, timeline::res_state::committed);
    for (const auto& e : _ledger->drain_events()) {
        EXPECT_FALSE(e.type == timeline::event_type::committed && e.reservation_id == late.id)
            << "the withdrawn job's committed event was published";
    }
    const auto c = _room->counts();
    EXPECT_EQ(c.late_commits, 1U);
    EXPECT_EQ(c.published_jobs, 1U);  // the on-time job, in the pump's plan
}

// A group that failed was undone: nothing of it is judged, late or not.
TEST_F(handover_room, a_failed_group_withdraws_nothing) {
    const auto late = submit("late", _now + 500 * ms);
    timeline::commit_notice n;
    n.failed_from = 7;
    n.failed_to = 7;
    n.why = "test: the disk said no";
    n.committed = {{7, late.id}};
    EXPECT_TRUE(_room->on_commit(n).empty());
    ASSERT_NE(_ledger->find(late.id), nullptr);
    EXPECT_EQ(_ledger->find(late.id)->state, timeline::res_state::committed);
    EXPECT_EQ(_room->counts().late_commits, 0U);
}

}  // namespace
