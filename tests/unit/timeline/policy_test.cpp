// The four placement policies behind one interface.
#include "helpers.hpp"

namespace qrt::timeline {
namespace {

using namespace qrt::timeline::test;

const std::int64_t w0 = t0_ns + blackout_ns;

request on_q0(std::int64_t duration_s, std::int64_t not_before_ns = 0,
              std::int64_t deadline_ns = 0, std::int32_t priority = 0) {
    request r = req(duration_s, not_before_ns, deadline_ns, priority);
    r.qpus = {"q0"};
    return r;
}

TEST(policy, names_make_policies_and_unknown_names_fail) {
    for (const std::string_view n : policy_names()) {
        auto p = make_policy(n);
        ASSERT_TRUE(p);
        EXPECT_EQ((*p)->name(), n);
    }
    auto bad = make_policy("round-robin");
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.err().reason, reason::invalid_argument);
    ledger_options o;
    o.policy = "round-robin";
    auto l = ledger::open({periodic_qpu("q0")}, o, "", t0_ns);
    ASSERT_FALSE(l);
    EXPECT_EQ(l.err().reason, reason::invalid_argument);
}

TEST(policy, fifo_appends_after_the_last_reservation_and_never_backfills) {
    auto l = make_ledger("fifo");
    auto late = l->reserve("a", on_q0(10, w0 + 60 * s_ns), "", 0, t0_ns);
    ASSERT_TRUE(late);
    EXPECT_EQ(late->start_ns, w0 + 60 * s_ns);
    auto next = l->reserve("a", on_q0(10), "", 0, t0_ns);
    ASSERT_TRUE(next);
    EXPECT_EQ(next->start_ns, w0 + 70 * s_ns);  // not into the gap at w0
    EXPECT_INVARIANTS(*l);
}

TEST(policy, edf_backfill_fills_the_gap_before_a_later_reservation) {
    auto l = make_ledger("edf-backfill");
    ASSERT_TRUE(l->reserve("a", on_q0(10, w0 + 60 * s_ns), "", 0, t0_ns));
    auto next = l->reserve("a", on_q0(10), "", 0, t0_ns);
    ASSERT_TRUE(next);
    EXPECT_EQ(next->start_ns, w0);
    EXPECT_INVARIANTS(*l);
}

TEST(policy, batch_orders_are_arrival_deadline_and_priority) {
    auto mk = [](std::int64_t deadline, std::int32_t prio, std::uint64_t seq) {
        pending_request p;
        p.req.duration_ns = s_ns;
        p.req.deadline_ns = deadline;
        p.req.priority = prio;
        p.seq = seq;
        return p;
    };
    const auto early_low = mk(100, 0, 2);
    const auto late_high = mk(500, 5, 1);
    const auto none_low = mk(0, 0, 0);
    EXPECT_TRUE((*make_policy("fifo"))->before(none_low, late_high));
    EXPECT_TRUE((*make_policy("fifo"))->before(late_high, early_low));
    EXPECT_TRUE((*make_policy("edf-backfill"))->before(early_low, late_high));
    EXPECT_TRUE((*make_policy("edf-backfill"))->before(late_high, none_low));  // no deadline last
    EXPECT_TRUE((*make_policy("priority-preempt"))->before(late_high, early_low));
    EXPECT_TRUE((*make_policy("fidelity-aware"))->before(early_low, late_high));
}

TEST(policy, priority_preempt_displaces_unstarted_lower_priority_and_re_places_it) {
    auto l = make_ledger("priority-preempt");
    // Low-priority job fills q0's first window but could also run later.
    auto low = l->submit("low", on_q0(90, 0, 0, 1), "", {1}, t0_ns);
    ASSERT_TRUE(low);
    ASSERT_EQ(low->start_ns, w0);
    l->drain_events();
    // A high-priority job that must finish in the first window.
    auto high = l->reserve("high", on_q0(30, 0, w0 + 90 * s_ns, 5), "", 0, t0_ns);
    ASSERT_TRUE(high) << high.err().message;
    EXPECT_EQ(high->start_ns, w0);
    const auto moved = l->status("low", low->id);
    EXPECT_EQ(moved->state, res_state::committed);
    EXPECT_EQ(moved->start_ns, w0 + period_ns);
    EXPECT_EQ(l->stats().preemptions, 1U);
    bool told = false;
    for (const event& e : l->drain_events()) {
        if (e.reservation_id == low->id) {
            told = true;
            EXPECT_EQ(e.type, "replaced");
            EXPECT_EQ(e.tenant, "low");
            EXPECT_NE(e.reason.find("preempted by reservation"), std::string::npos);
        }
    }
    EXPECT_TRUE(told);
    EXPECT_INVARIANTS(*l);
}

TEST(policy, priority_preempt_reports_a_victim_it_cannot_re_place) {
    auto l = make_ledger("priority-preempt");
    auto low = l->reserve("low", on_q0(90, 0, w0 + 90 * s_ns, 1), "", 0, t0_ns);
    ASSERT_TRUE(low);
    auto high = l->reserve("high", on_q0(30, 0, w0 + 90 * s_ns, 5), "", 0, t0_ns);
    ASSERT_TRUE(high);
    const auto v = l->status("low", low->id);
    EXPECT_EQ(v->state, res_state::displaced);
    EXPECT_NE(v->reason.find("preempted"), std::string::npos);
    EXPECT_INVARIANTS(*l);
}

TEST(policy, priority_preempt_never_displaces_equal_priority_or_started_work) {
    auto l = make_ledger("priority-preempt");
    auto same = l->reserve("x", on_q0(90, 0, 0, 5), "", 0, t0_ns);
    ASSERT_TRUE(same);
    auto r = l->reserve("high", on_q0(30, 0, w0 + 90 * s_ns, 5), "", 0, t0_ns);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().reason, reason::no_fit);
    // Started (start <= now) lower-priority work stays.
    auto l2 = make_ledger("priority-preempt");
    auto low = l2->submit("low", on_q0(90, 0, 0, 1), "", {1}, t0_ns);
    ASSERT_TRUE(low);
    ASSERT_TRUE(l2->mark_dispatched(low->id, w0));
    auto r2 = l2->reserve("high", on_q0(30, 0, w0 + 90 * s_ns, 5), "", 0, w0 + s_ns);
    ASSERT_FALSE(r2);
    EXPECT_EQ(l2->stats().preemptions, 0U);
    EXPECT_INVARIANTS(*l2);
}

TEST(policy, other_policies_never_preempt) {
    for (const char* p : {"fifo", "edf-backfill", "fidelity-aware"}) {
        SCOPED_TRACE(p);
        auto l = make_ledger(p);
        ASSERT_TRUE(l->reserve("low", on_q0(90, 0, 0, 1), "", 0, t0_ns));
        auto r = l->reserve("high", on_q0(30, 0, w0 + 90 * s_ns, 5), "", 0, t0_ns);
        ASSERT_FALSE(r);
        EXPECT_EQ(r.err().reason, reason::no_fit);
    }
}

TEST(policy, fidelity_aware_trades_a_short_wait_for_a_fresher_calibration) {
    // q0 is calibrated worse (f0 0.90) than q1 (0.99); q1 is busy for 30 s.
    std::vector<qpu_spec> qs = {periodic_qpu("q0", 0.90), periodic_qpu("q1", 0.99)};
    for (const char* p : {"edf-backfill", "fidelity-aware"}) {
        auto l = make_ledger(p, qs);
        request busy = req(30);
        busy.qpus = {"q1"};
        ASSERT_TRUE(l->reserve("x", busy, "", 0, t0_ns));
        auto r = l->reserve("a", req(10), "", 0, t0_ns);
        ASSERT_TRUE(r);
        if (std::string(p) == "edf-backfill") {
            EXPECT_EQ(r->qpu, "q0");  // earliest
            EXPECT_EQ(r->start_ns, w0);
        } else {
            EXPECT_EQ(r->qpu, "q1");  // -ln(.99)+0.03+0.03 < -ln(.90)
            EXPECT_EQ(r->start_ns, w0 + 30 * s_ns);
        }
        EXPECT_INVARIANTS(*l);
    }
}

TEST(policy, fidelity_aware_prefers_the_next_fresh_window_over_a_stale_tail) {
    // tau 100 s: late in a window fidelity has decayed a lot.
    std::vector<qpu_spec> qs = {periodic_qpu("q0", 0.99, 100 * s_ns)};
    auto l = make_ledger("fidelity-aware", qs);
    ASSERT_TRUE(l->reserve("x", req(80), "", 0, t0_ns));  // [w0, w0+80)
    auto r = l->reserve("a", req(10, w0 + 60 * s_ns), "", 0, t0_ns);
    ASSERT_TRUE(r);
    // At w0+80 the cost is 0.8 e-folds of age + 20/100 of wait; the next
    // window costs 0.01 + 40/100.
    EXPECT_EQ(r->start_ns, w0 + period_ns);
    auto e = make_ledger("edf-backfill", qs);
    ASSERT_TRUE(e->reserve("x", req(80), "", 0, t0_ns));
    EXPECT_EQ(e->reserve("a", req(10, w0 + 60 * s_ns), "", 0, t0_ns)->start_ns, w0 + 80 * s_ns);
}

TEST(policy, priority_preempt_never_displaces_a_job_whose_frame_is_going_out) {
    // The dispatcher already sends A: the QPU runs it, so it must not be
    // recorded displaced.  The preempting job takes B's place instead.
    auto l = make_ledger("priority-preempt");
    auto a = l->submit("low", on_q0(45, 0, 0, 1), "", {1}, t0_ns);
    auto b = l->submit("low", on_q0(45, 0, 0, 1), "", {1}, t0_ns);
    ASSERT_TRUE(a && b);
    ASSERT_EQ(b->start_ns, w0 + 45 * s_ns);
    ledger::dispatch_gate gate;
    gate.withdraw = [&](std::uint64_t id) { return id != a->id; };
    l->set_dispatch_gate(gate);
    auto high = l->submit("high", on_q0(30, 0, w0 + 90 * s_ns, 5), "", {1}, t0_ns);
    ASSERT_TRUE(high) << high.err().message;
    EXPECT_EQ(high->start_ns, w0 + 45 * s_ns);
    const auto ka = l->status("low", a->id);
    EXPECT_EQ(ka->state, res_state::committed);
    EXPECT_EQ(ka->start_ns, w0);
    EXPECT_NE(l->status("low", b->id)->start_ns, w0 + 45 * s_ns) << "B was moved";
    EXPECT_INVARIANTS(*l);
}

TEST(policy, priority_preempt_gives_back_the_victims_it_took_when_another_is_going_out) {
    // The preempting job needs both A and B; B's frame is going out.  A was
    // already withdrawn: it must be given back, and nothing changes.
    auto l = make_ledger("priority-preempt");
    auto a = l->submit("low", on_q0(45, 0, 0, 1), "", {1}, t0_ns);
    auto b = l->submit("low", on_q0(45, 0, 0, 1), "", {1}, t0_ns);
    ASSERT_TRUE(a && b);
    const auto before = snapshot(*l);
    std::vector<std::uint64_t> restored;
    ledger::dispatch_gate gate;
    gate.withdraw = [&](std::uint64_t id) { return id != b->id; };
    gate.restore = [&](std::uint64_t id) { restored.push_back(id); };
    l->set_dispatch_gate(gate);
    auto high = l->submit("high", on_q0(60, 0, w0 + 90 * s_ns, 5), "", {1}, t0_ns);
    ASSERT_FALSE(high);
    EXPECT_EQ(high.err().reason, reason::no_fit);
    EXPECT_EQ(restored, (std::vector<std::uint64_t>{a->id}));
    EXPECT_EQ(snapshot(*l), before);
    EXPECT_INVARIANTS(*l);
}

}  // namespace
}  // namespace qrt::timeline
