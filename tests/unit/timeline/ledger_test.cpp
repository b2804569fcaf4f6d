// Reservations and jobs: placement invariants, every state transition (legal
// and illegal), ownership, fencing, idempotency, bad input, gangs, events.
#include <algorithm>
#include <cstdint>

#include "helpers.hpp"

namespace qrt::timeline {
namespace {

using namespace qrt::timeline::test;

const std::int64_t w0 = t0_ns + blackout_ns;  // first window [w0, w0 + 90 s)

TEST(ledger, reserve_places_at_the_first_window_after_the_blackout) {
    auto l = make_ledger();
    auto r = l->reserve("alice", req(30), "", 0, t0_ns);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_EQ(r->qpu, "q0");
    EXPECT_EQ(r->start_ns, w0);
    EXPECT_EQ(r->calibration_id, 10001U);
    EXPECT_EQ(r->state, res_state::held);
    EXPECT_EQ(r->lease_expires_ns, t0_ns + l->options().default_lease_ns);
    EXPECT_GT(r->fencing_token, 0U);
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, reservations_never_overlap_nor_straddle_a_window_boundary) {
    auto l = make_ledger();
    request r40 = req(40);
    r40.qpus = {"q0"};
    auto a = l->reserve("t", r40, "", 0, t0_ns);
    auto b = l->reserve("t", r40, "", 0, t0_ns);
    auto c = l->reserve("t", r40, "", 0, t0_ns);
    ASSERT_TRUE(a && b && c);
    EXPECT_EQ(a->start_ns, w0);
    EXPECT_EQ(b->start_ns, w0 + 40 * s_ns);
    // [w0+80, w0+120) would cross into the blackout: the next window instead.
    EXPECT_EQ(c->start_ns, w0 + period_ns);
    EXPECT_EQ(c->calibration_id, 10002U);
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, start_honours_not_before_and_end_honours_deadline) {
    auto l = make_ledger();
    auto a = l->reserve("t", req(10, w0 + 55 * s_ns), "", 0, t0_ns);
    ASSERT_TRUE(a);
    EXPECT_EQ(a->start_ns, w0 + 55 * s_ns);
    // Both QPUs busy at w0+55 on q0 only; q0 taken -> the next request with
    // the same not_before lands on q1.
    auto b = l->reserve("t", req(10, w0 + 55 * s_ns, w0 + 65 * s_ns), "", 0, t0_ns);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->qpu, "q1");
    request only_q0 = req(10, w0 + 55 * s_ns, w0 + 70 * s_ns);
    only_q0.qpus = {"q0"};
    auto c = l->reserve("t", only_q0, "", 0, t0_ns);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.err().reason, reason::no_fit);
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, min_fidelity_moves_the_start_to_a_fresher_window) {
    auto l = make_ledger();
    request first = req(30);
    first.qpus = {"q0"};
    ASSERT_TRUE(l->reserve("t", first, "", 0, t0_ns));
    // f(t) = 0.99 exp(-age / 1000 s) >= 0.97 needs age <= 20.4 s: the gap at
    // age 30 s is too stale, the next window's start is fresh.
    request fresh = req(10);
    fresh.qpus = {"q0"};
    fresh.min_fidelity = 0.97;
    auto r = l->reserve("t", fresh, "", 0, t0_ns);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->start_ns, w0 + period_ns);
    EXPECT_INVARIANTS(*l);
}

struct bad_case {
    const char* name;
    request rq;
    std::string_view reason;
    const char* mentions;
};

TEST(ledger, bad_input_is_rejected_with_a_stable_reason_and_changes_nothing) {
    auto l = make_ledger();
    ASSERT_TRUE(l->reserve("t", req(10), "k", 0, t0_ns));
    l->drain_events();
    const auto before = snapshot(*l);
    const auto stats_before = l->stats();
    request unknown = req(10);
    unknown.qpus = {"nope"};
    request fid = req(10);
    fid.min_fidelity = 1.5;
    request negfid = req(10);
    negfid.min_fidelity = -0.1;
    request twice = req(10);
    twice.qpus = {"q0", "q0"};
    const std::vector<bad_case> cases = {
        {"zero duration", req(0), reason::invalid_argument, "duration_ns"},
        {"negative duration", req(-5), reason::invalid_argument, "duration_ns"},
        {"deadline before not_before", req(10, t0_ns + 50 * s_ns, t0_ns + 40 * s_ns),
         reason::invalid_argument, "deadline_ns"},
        {"deadline shorter than duration", req(10, t0_ns, t0_ns + 5 * s_ns), "invalid_argument",
         "deadline_ns"},
        {"negative not_before", req(10, -1), "invalid_argument", "not_before_ns"},
        {"unknown qpu", unknown, reason::unknown_qpu, "nope"},
        {"min_fidelity above 1", fid, reason::invalid_argument, "min_fidelity"},
        {"min_fidelity below 0", negfid, reason::invalid_argument, "min_fidelity"},
        {"qpu listed twice", twice, reason::invalid_argument, "q0"},
        {"longer than any window", req(91), reason::invalid_argument, "longest calibration window"},
    };
    for (const bad_case& c : cases) {
        SCOPED_TRACE(c.name);
        auto r = l->reserve("t", c.rq, "", 0, t0_ns);
        ASSERT_FALSE(r);
        EXPECT_EQ(r.err().reason, c.reason);
        EXPECT_NE(r.err().message.find(c.mentions), std::string::npos) << r.err().message;
        auto q = l->query(c.rq, t0_ns);
        ASSERT_FALSE(q);
        EXPECT_EQ(q.err().reason, c.reason);
        auto s = l->submit("t", c.rq, "", {1}, t0_ns);
        ASSERT_FALSE(s);
        EXPECT_EQ(s.err().reason, c.reason);
        auto g = l->reserve_gang("t", c.rq, 2, "", 0, t0_ns);
        ASSERT_FALSE(g);
        EXPECT_EQ(g.err().reason, c.reason);
    }
    EXPECT_EQ(l->reserve("", req(10), "", 0, t0_ns).err().reason, reason::invalid_argument);
    EXPECT_EQ(l->reserve("t", req(10), "", -1, t0_ns).err().reason, reason::invalid_argument);
    EXPECT_EQ(l->reserve_gang("t", req(10), 3, "", 0, t0_ns).err().reason, reason::invalid_argument);
    EXPECT_EQ(l->reserve_gang("t", req(10), 0, "", 0, t0_ns).err().reason, reason::invalid_argument);
    EXPECT_EQ(l->mark_missed(t0_ns, -1).err().reason, reason::invalid_argument);
    EXPECT_EQ(snapshot(*l), before);
    EXPECT_EQ(l->stats().active, stats_before.active);
    EXPECT_EQ(l->stats().gaps, stats_before.gaps);
    EXPECT_TRUE(l->drain_events().empty());
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, same_idempotency_key_and_tenant_returns_the_same_reservation) {
    auto l = make_ledger();
    auto a = l->reserve("alice", req(10), "job-1", 0, t0_ns);
    auto b = l->reserve("alice", req(10), "job-1", 0, t0_ns + s_ns);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->id, b->id);
    EXPECT_EQ(a->fencing_token, b->fencing_token);
    EXPECT_EQ(l->stats().active, 1U);
    // Another tenant's key space is separate.
    auto c = l->reserve("bob", req(10), "job-1", 0, t0_ns);
    ASSERT_TRUE(c);
    EXPECT_NE(c->id, a->id);
    // The same key with a different request is refused.
    auto d = l->reserve("alice", req(20), "job-1", 0, t0_ns);
    ASSERT_FALSE(d);
    EXPECT_EQ(d.err().reason, reason::duplicate);
    // Still the same reservation after it was committed.
    ASSERT_TRUE(l->commit("alice", a->id, a->fencing_token, {1, 2}, t0_ns));
    auto e = l->reserve("alice", req(10), "job-1", 0, t0_ns);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->id, a->id);
    EXPECT_EQ(e->state, res_state::committed);
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, a_tenant_never_sees_nor_changes_another_tenants_reservation) {
    auto l = make_ledger();
    auto a = l->reserve("alice", req(10), "", 0, t0_ns);
    ASSERT_TRUE(a);
    const auto before = snapshot(*l);
    EXPECT_EQ(l->status("bob", a->id).err().reason, reason::not_owner);
    EXPECT_EQ(l->job_result_of("bob", a->id).err().reason, reason::not_owner);
    EXPECT_EQ(l->heartbeat("bob", a->id, a->fencing_token, t0_ns).err().reason, reason::not_owner);
    EXPECT_EQ(l->release("bob", a->id, a->fencing_token, t0_ns).err().reason, reason::not_owner);
    EXPECT_EQ(l->commit("bob", a->id, a->fencing_token, {}, t0_ns).err().reason, reason::not_owner);
    EXPECT_EQ(l->cancel("bob", a->id, t0_ns).err().reason, reason::not_owner);
    EXPECT_EQ(l->status("alice", 999).err().reason, reason::not_found);
    EXPECT_EQ(snapshot(*l), before);
}

TEST(ledger, a_stale_fencing_token_is_refused) {
    auto l = make_ledger();
    auto a = l->reserve("alice", req(10), "", 0, t0_ns);
    ASSERT_TRUE(a);
    const auto before = snapshot(*l);
    EXPECT_EQ(l->heartbeat("alice", a->id, a->fencing_token + 1, t0_ns).err().reason,
              reason::bad_fencing_token);
    EXPECT_EQ(l->release("alice", a->id, a->fencing_token + 1, t0_ns).err().reason,
              reason::bad_fencing_token);
    EXPECT_EQ(l->commit("alice", a->id, 0, {}, t0_ns).err().reason, reason::bad_fencing_token);
    EXPECT_EQ(snapshot(*l), before);
    // A cancel that gives a token is fenced the same way.
    ASSERT_TRUE(l->commit("alice", a->id, a->fencing_token, {1}, t0_ns));
    const auto committed = snapshot(*l);
    EXPECT_EQ(l->cancel("alice", a->id, t0_ns, a->fencing_token + 1).err().reason,
              reason::bad_fencing_token);
    EXPECT_EQ(snapshot(*l), committed);
    ASSERT_TRUE(l->cancel("alice", a->id, t0_ns, a->fencing_token));
    EXPECT_EQ(l->find(a->id)->state, res_state::cancelled);
    // Every reservation gets a fresh token of its own.
    auto b = l->reserve("alice", req(10), "", 0, t0_ns);
    ASSERT_TRUE(b);
    EXPECT_NE(b->fencing_token, a->fencing_token);
}

// A fencing token is the capability to change a reservation: a tenant must
// not be able to work out another's from its own.  Drawn at random, never
// 0, at most INT64_MAX (the wire's and SQLite's integers are signed), and
// no two of a thousand draws are next to each other (a counter's are).
TEST(ledger, fencing_tokens_are_drawn_at_random_and_never_next_to_each_other) {
    auto l = make_ledger();
    std::vector<std::uint64_t> tokens;
    for (int i = 0; i < 1000; ++i) {
        const std::string tenant = i % 2 == 0 ? "alice" : "bob";
        auto r = l->reserve(tenant, req(1), "", 0, t0_ns);
        ASSERT_TRUE(r) << r.err().message;
        tokens.push_back(r->fencing_token);
        ASSERT_TRUE(l->release(tenant, r->id, r->fencing_token, t0_ns));
    }
    std::sort(tokens.begin(), tokens.end());
    EXPECT_NE(tokens.front(), 0U);
    EXPECT_LE(tokens.back(), static_cast<std::uint64_t>(INT64_MAX));
    std::size_t next_to = 0;
    for (std::size_t i = 1; i < tokens.size(); ++i) {
        EXPECT_NE(tokens[i], tokens[i - 1]) << "two reservations share token " << tokens[i];
        next_to += tokens[i] - tokens[i - 1] == 1 ? 1U : 0U;
    }
    EXPECT_EQ(next_to, 0U) << "of 1000 tokens, " << next_to << " pairs are n, n+1 (first "
                           << tokens.front() << ", last " << tokens.back() << ")";
}

TEST(blob, copies_share_the_bytes_and_compare_by_content) {
    const blob empty;
    EXPECT_TRUE(empty.empty());
    EXPECT_EQ(empty.size(), 0U);
    EXPECT_EQ(empty.begin(), empty.end());
    const blob a{1, 2, 3};
    const blob copy = a;  // NOLINT(performance-unnecessary-copy-initialization): the point of the test
    EXPECT_EQ(copy.data(), a.data()) << "a copy must not duplicate the bytes";
    EXPECT_EQ(copy, a);
    EXPECT_EQ(blob(std::vector<std::uint8_t>{1, 2, 3}), a) << "equal content, separate storage";
    EXPECT_NE(blob({1, 2}), a);
    const std::span<const std::uint8_t> view = a;
    ASSERT_EQ(view.size(), 3U);
    EXPECT_EQ(view[2], 3);
    EXPECT_EQ(a.front(), 1);
}

TEST(ledger, due_jobs_hands_out_the_payload_without_copying_it) {
    // The job pump asks for the due jobs every 2 ms; a 1 MiB payload must
    // not be copied each time.
    auto l = make_ledger();
    auto a = l->reserve("alice", req(10), "", 0, t0_ns);
    ASSERT_TRUE(a);
    ASSERT_TRUE(l->commit("alice", a->id, a->fencing_token, blob(std::vector<std::uint8_t>(1 << 20, 7)), t0_ns + s_ns));
    const auto first = l->due_jobs("q0", w0 + 1);
    const auto second = l->due_jobs("q0", w0 + 1);
    ASSERT_EQ(first.size(), 1U);
    ASSERT_EQ(second.size(), 1U);
    EXPECT_EQ(first[0].payload.size(), std::size_t{1} << 20);
    EXPECT_EQ(first[0].payload.data(), second[0].payload.data());
}

TEST(ledger, job_lifecycle_held_committed_dispatched_completed_with_events) {
    auto l = make_ledger();
    auto a = l->reserve("alice", req(10), "", 0, t0_ns);
    ASSERT_TRUE(a);
    EXPECT_EQ(l->job_result_of("alice", a->id).err().reason, reason::not_ready);
    auto c = l->commit("alice", a->id, a->fencing_token, {0xde, 0xad}, t0_ns + s_ns);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->state, res_state::committed);
    EXPECT_EQ(c->payload, (blob{0xde, 0xad}));
    auto due = l->due_jobs("q0", w0 + 1);
    ASSERT_EQ(due.size(), 1U);
    EXPECT_EQ(due[0].id, a->id);
    EXPECT_TRUE(l->due_jobs("q0", w0).empty());  // horizon is exclusive
    auto d = l->mark_dispatched(a->id, w0 + 5);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->state, res_state::dispatched);
    EXPECT_EQ(d->sent_ns, w0 + 5);
    EXPECT_TRUE(l->due_jobs("q0", w0 + period_ns).empty());
    EXPECT_EQ(l->job_result_of("alice", a->id).err().reason, reason::not_ready);
    auto done = l->complete(a->id, {42}, w0 + 10 * s_ns);
    ASSERT_TRUE(done);
    auto res = l->job_result_of("alice", a->id);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->state, res_state::completed);
    EXPECT_EQ(res->result, (blob{42}));
    const auto evs = l->drain_events();
    std::vector<std::string> types;
    for (const event& e : evs) {
        EXPECT_EQ(e.reservation_id, a->id);
        EXPECT_EQ(e.tenant, "alice");
        EXPECT_EQ(e.qpu, "q0");
        types.push_back(e.type);
    }
    EXPECT_EQ(types, (std::vector<std::string>{"reserved", "committed", "dispatched", "completed"}));
    EXPECT_TRUE(l->drain_events().empty());
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, dispatched_job_can_fail_with_a_reason) {
    auto l = make_ledger();
    auto a = l->submit("alice", req(10), "", {1}, t0_ns);
    ASSERT_TRUE(a);
    EXPECT_EQ(a->state, res_state::committed);
    ASSERT_TRUE(l->mark_dispatched(a->id, w0));
    auto f = l->fail(a->id, "endpoint closed the connection", w0 + s_ns);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->state, res_state::failed);
    auto res = l->job_result_of("alice", a->id);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->state, res_state::failed);
    EXPECT_EQ(res->reason, "endpoint closed the connection");
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, a_job_sent_to_a_write_only_endpoint_ends_sent_with_no_result_never_completed) {
    auto l = make_ledger();
    auto a = l->submit("alice", req(10), "", {1}, t0_ns);
    ASSERT_TRUE(a);
    ASSERT_TRUE(l->mark_dispatched(a->id, w0));
    auto s = l->mark_sent(a->id, "written on time to file:///dev/shm/q, a write-only endpoint", w0 + s_ns);
    ASSERT_TRUE(s) << s.err().message;
    EXPECT_EQ(s->state, res_state::sent);
    EXPECT_TRUE(is_terminal(res_state::sent));
    EXPECT_EQ(to_string(res_state::sent), "sent");
    auto res = l->job_result_of("alice", a->id);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->state, res_state::sent);
    EXPECT_TRUE(res->result.empty());
    EXPECT_NE(res->reason.find("write-only"), std::string::npos);
    EXPECT_EQ(l->complete(a->id, {42}, w0 + 2 * s_ns).err().reason, reason::illegal_transition);
    EXPECT_EQ(l->mark_sent(a->id, "", w0).err().reason, reason::illegal_transition) << "terminal";
    auto c = l->submit("alice", req(10, t0_ns + 2 * period_ns), "", {1}, t0_ns);
    ASSERT_TRUE(c);
    EXPECT_EQ(l->mark_sent(c->id, "", w0).err().reason, reason::illegal_transition) << "only a dispatched job is sent";
    std::vector<std::string> types;
    for (const event& e : l->drain_events()) {
        if (e.reservation_id == a->id) {
            types.push_back(e.type);
        }
    }
    ASSERT_GE(types.size(), 2u);
    EXPECT_EQ(types[types.size() - 2], "dispatched");
    EXPECT_EQ(types.back(), "sent");
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, transition_table_allows_exactly_the_documented_edges) {
    using st = res_state;
    const std::vector<std::pair<st, st>> legal = {
        {st::held, st::committed},       {st::held, st::expired},
        {st::held, st::released},        {st::held, st::displaced},
        {st::committed, st::dispatched}, {st::committed, st::cancelled},
        {st::committed, st::missed},     {st::committed, st::displaced},
        {st::committed, st::failed},  // refused by the endpoint at ARM
        {st::dispatched, st::completed}, {st::dispatched, st::failed},
        {st::dispatched, st::sent},
    };
    for (int f = 0; f <= static_cast<int>(st::sent); ++f) {
        for (int t = 0; t <= static_cast<int>(st::sent); ++t) {
            const auto from = static_cast<st>(f);
            const auto to = static_cast<st>(t);
            const bool want =
                std::find(legal.begin(), legal.end(), std::make_pair(from, to)) != legal.end();
            EXPECT_EQ(transition_allowed(from, to), want)
                << to_string(from) << " -> " << to_string(to);
        }
        EXPECT_EQ(res_state_from_string(to_string(static_cast<st>(f))), static_cast<st>(f));
    }
}

TEST(ledger, illegal_transitions_are_errors_and_change_nothing) {
    auto l = make_ledger();
    auto held = l->reserve("a", req(10), "", 0, t0_ns);
    auto committed = l->submit("a", req(10), "", {1}, t0_ns);
    auto released = l->reserve("a", req(10), "", 0, t0_ns);
    ASSERT_TRUE(held && committed && released);
    ASSERT_TRUE(l->release("a", released->id, released->fencing_token, t0_ns));
    const auto before = snapshot(*l);
    l->drain_events();
    auto expect_illegal = [&](auto&& r, const char* what) {
        ASSERT_FALSE(r) << what;
        EXPECT_EQ(r.err().reason, reason::illegal_transition) << what << ": " << r.err().message;
    };
    expect_illegal(l->cancel("a", held->id, t0_ns), "cancel held");
    expect_illegal(l->mark_dispatched(held->id, t0_ns), "dispatch held");
    expect_illegal(l->complete(held->id, {}, t0_ns), "complete held");
    expect_illegal(l->fail(held->id, "x", t0_ns), "fail held");
    expect_illegal(l->release("a", committed->id, committed->fencing_token, t0_ns), "release committed");
    expect_illegal(l->heartbeat("a", committed->id, committed->fencing_token, t0_ns), "heartbeat committed");
    expect_illegal(l->commit("a", committed->id, committed->fencing_token, {}, t0_ns), "commit committed");
    expect_illegal(l->complete(committed->id, {}, t0_ns), "complete committed");
    expect_illegal(l->fail(committed->id, "x", t0_ns), "fail committed");
    expect_illegal(l->release("a", released->id, released->fencing_token, t0_ns), "release released");
    expect_illegal(l->commit("a", released->id, released->fencing_token, {}, t0_ns), "commit released");
    expect_illegal(l->cancel("a", released->id, t0_ns), "cancel released");
    expect_illegal(l->mark_dispatched(released->id, t0_ns), "dispatch released");
    EXPECT_EQ(l->mark_dispatched(777, t0_ns).err().reason, reason::not_found);
    EXPECT_EQ(l->complete(777, {}, t0_ns).err().reason, reason::not_found);
    EXPECT_EQ(l->fail(777, "x", t0_ns).err().reason, reason::not_found);
    EXPECT_EQ(snapshot(*l), before);
    EXPECT_TRUE(l->drain_events().empty());
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, leases_expire_unless_heartbeated_and_free_their_slot) {
    auto l = make_ledger();
    auto a = l->reserve("a", req(10), "", 5 * s_ns, t0_ns);
    ASSERT_TRUE(a);
    EXPECT_EQ(*l->expire_leases(t0_ns + 4 * s_ns), 0U);
    auto hb = l->heartbeat("a", a->id, a->fencing_token, t0_ns + 4 * s_ns);
    ASSERT_TRUE(hb);
    EXPECT_EQ(hb->lease_expires_ns, t0_ns + 9 * s_ns);
    EXPECT_EQ(*l->expire_leases(t0_ns + 8 * s_ns), 0U);
    // Past the lease but before housekeeping ran: refused, not silently renewed.
    EXPECT_EQ(l->heartbeat("a", a->id, a->fencing_token, t0_ns + 9 * s_ns).err().reason,
              reason::lease_expired);
    EXPECT_EQ(l->commit("a", a->id, a->fencing_token, {}, t0_ns + 9 * s_ns).err().reason,
              reason::lease_expired);
    EXPECT_EQ(*l->expire_leases(t0_ns + 9 * s_ns), 1U);
    EXPECT_EQ(l->status("a", a->id)->state, res_state::expired);
    EXPECT_EQ(l->heartbeat("a", a->id, a->fencing_token, t0_ns + 9 * s_ns).err().reason,
              reason::lease_expired);
    const auto evs = l->drain_events();
    ASSERT_FALSE(evs.empty());
    EXPECT_EQ(evs.back().type, "expired");
    // The slot is free again.
    auto b = l->reserve("b", req(10), "", 0, t0_ns + 9 * s_ns);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->start_ns, a->start_ns);
    EXPECT_EQ(b->qpu, a->qpu);
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, commit_after_the_start_passed_is_refused) {
    auto l = make_ledger();
    auto a = l->reserve("a", req(10), "", 600 * s_ns, t0_ns);
    ASSERT_TRUE(a);
    EXPECT_EQ(l->commit("a", a->id, a->fencing_token, {}, a->start_ns).err().reason,
              reason::lease_expired);
}

TEST(ledger, committed_jobs_whose_start_passed_undispatched_become_missed) {
    auto l = make_ledger();
    auto a = l->submit("a", req(10), "", {1}, t0_ns);
    auto b = l->submit("a", req(10), "", {1}, t0_ns);
    ASSERT_TRUE(a && b);
    ASSERT_EQ(a->qpu, "q0");
    ASSERT_EQ(b->qpu, "q1");  // both at w0
    EXPECT_EQ(*l->mark_missed(w0, 0), 0U);
    EXPECT_EQ(*l->mark_missed(w0 + 100, 1000), 0U);  // within tolerance
    ASSERT_TRUE(l->mark_dispatched(b->id, w0 + 50));
    EXPECT_EQ(*l->mark_missed(w0 + 2000, 1000), 1U);
    const auto m = l->status("a", a->id);
    EXPECT_EQ(m->state, res_state::missed);
    EXPECT_NE(m->reason.find("not dispatched"), std::string::npos);
    EXPECT_TRUE(l->due_jobs("q0", w0 + period_ns).empty());
    EXPECT_EQ(l->mark_dispatched(a->id, w0 + 3000).err().reason, reason::illegal_transition);
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, due_jobs_lists_committed_jobs_in_start_order) {
    auto l = make_ledger();
    request r = req(10);
    r.qpus = {"q1"};
    auto a = l->submit("a", r, "", {1}, t0_ns);
    auto held = l->reserve("a", r, "", 0, t0_ns);
    auto c = l->submit("a", r, "", {3}, t0_ns);
    ASSERT_TRUE(a && held && c);
    auto due = l->due_jobs("q1", t0_ns + 10 * period_ns);
    ASSERT_EQ(due.size(), 2U);
    EXPECT_EQ(due[0].id, a->id);
    EXPECT_EQ(due[1].id, c->id);
    EXPECT_LT(due[0].start_ns, due[1].start_ns);
    EXPECT_TRUE(l->due_jobs("q0", t0_ns + 10 * period_ns).empty());
    EXPECT_TRUE(l->due_jobs("nope", t0_ns + 10 * period_ns).empty());
}

TEST(ledger, cancel_and_release_free_the_slot) {
    auto l = make_ledger();
    request r = req(90);
    r.qpus = {"q0"};
    auto a = l->submit("a", r, "", {1}, t0_ns);
    ASSERT_TRUE(a);
    ASSERT_TRUE(l->cancel("a", a->id, t0_ns));
    EXPECT_EQ(l->status("a", a->id)->state, res_state::cancelled);
    auto b = l->reserve("a", r, "", 0, t0_ns);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->start_ns, a->start_ns);
    ASSERT_TRUE(l->release("a", b->id, b->fencing_token, t0_ns));
    auto c = l->reserve("a", r, "", 0, t0_ns);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->start_ns, a->start_ns);
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, gang_reserves_one_start_on_k_qpus) {
    auto l = make_ledger();
    request only_q0 = req(40);
    only_q0.qpus = {"q0"};
    ASSERT_TRUE(l->reserve("x", only_q0, "", 0, t0_ns));  // q0 busy [w0, w0+40)
    auto g = l->reserve_gang("a", req(20), 2, "gang-1", 0, t0_ns);
    ASSERT_TRUE(g) << g.err().message;
    ASSERT_EQ(g->size(), 2U);
    EXPECT_EQ((*g)[0].start_ns, w0 + 40 * s_ns);
    EXPECT_EQ((*g)[1].start_ns, w0 + 40 * s_ns);
    EXPECT_NE((*g)[0].qpu, (*g)[1].qpu);
    EXPECT_EQ((*g)[0].gang_id, (*g)[1].gang_id);
    EXPECT_NE((*g)[0].gang_id, 0U);
    EXPECT_EQ((*g)[0].fencing_token, (*g)[1].fencing_token);
    // Idempotent as a whole.
    auto again = l->reserve_gang("a", req(20), 2, "gang-1", 0, t0_ns);
    ASSERT_TRUE(again);
    EXPECT_EQ((*again)[0].id, (*g)[0].id);
    EXPECT_EQ(l->reserve("a", req(20), "gang-1", 0, t0_ns).err().reason, reason::duplicate);
    // Commit on one member commits the gang; cancel on the other cancels it.
    ASSERT_TRUE(l->commit("a", (*g)[1].id, (*g)[1].fencing_token, {7}, t0_ns));
    EXPECT_EQ(l->status("a", (*g)[0].id)->state, res_state::committed);
    EXPECT_EQ(l->due_jobs("q0", w0 + period_ns).size(), 1U);
    EXPECT_EQ(l->due_jobs("q1", w0 + period_ns).size(), 1U);
    ASSERT_TRUE(l->cancel("a", (*g)[0].id, t0_ns));
    EXPECT_EQ(l->status("a", (*g)[1].id)->state, res_state::cancelled);
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, a_gang_query_shows_what_a_gang_reserve_would_take) {
    auto l = make_ledger();
    request only_q0 = req(40);
    only_q0.qpus = {"q0"};
    ASSERT_TRUE(l->reserve("x", only_q0, "", 0, t0_ns));  // q0 busy [w0, w0+40)
    request gang = req(20);
    gang.gang_size = 2;
    const auto before = snapshot(*l);
    auto q = l->query(gang, t0_ns);
    ASSERT_TRUE(q) << q.err().message;
    ASSERT_EQ(q->candidates.size(), 2U);
    EXPECT_EQ(q->candidates[0].start_ns, w0 + 40 * s_ns) << "one start, after q0 is free";
    EXPECT_EQ(q->candidates[1].start_ns, w0 + 40 * s_ns);
    EXPECT_NE(q->candidates[0].qpu, q->candidates[1].qpu);
    EXPECT_EQ(snapshot(*l), before) << "a query reserves nothing";
    // The reserve then takes exactly that.
    auto g = l->reserve_gang("a", req(20), 2, "", 0, t0_ns);
    ASSERT_TRUE(g);
    EXPECT_EQ((*g)[0].start_ns, q->candidates[0].start_ns);
    // Larger than the QPUs asked for: an error that names the bound.
    gang.gang_size = 3;
    auto bad = l->query(gang, t0_ns);
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.err().reason, reason::invalid_argument);
    EXPECT_NE(bad.err().message.find("gang_size must be in [1, 2]"), std::string::npos) << bad.err().message;
    // No common start before the deadline: no candidate, and why.
    gang.gang_size = 2;
    gang.deadline_ns = w0 + 41 * s_ns;
    auto none = l->query(gang, t0_ns);
    ASSERT_TRUE(none);
    EXPECT_TRUE(none->candidates.empty());
    EXPECT_EQ(none->why_none.rfind("gang of 2: ", 0), 0U) << none->why_none;
}

TEST(ledger, gang_is_all_or_nothing) {
    auto l = make_ledger();
    request fill = req(90);
    fill.qpus = {"q1"};
    ASSERT_TRUE(l->reserve("x", fill, "", 0, t0_ns));
    l->drain_events();
    const auto before = snapshot(*l);
    const auto gaps_before = l->stats().gaps;
    // q0 is free, q1 is full until the next window, and the deadline ends
    // before it: no common start, so nothing is reserved on q0 either.
    auto g = l->reserve_gang("a", req(20, 0, w0 + 90 * s_ns), 2, "", 0, t0_ns);
    ASSERT_FALSE(g);
    EXPECT_EQ(g.err().reason, reason::no_fit);
    EXPECT_EQ(snapshot(*l), before);
    EXPECT_EQ(l->stats().gaps, gaps_before);
    EXPECT_TRUE(l->drain_events().empty());
    // Release one member: both go.
    auto ok = l->reserve_gang("a", req(20), 2, "", 0, t0_ns);
    ASSERT_TRUE(ok);
    EXPECT_EQ((*ok)[0].start_ns, w0 + period_ns);
    ASSERT_TRUE(l->release("a", (*ok)[0].id, (*ok)[0].fencing_token, t0_ns));
    EXPECT_EQ(l->status("a", (*ok)[1].id)->state, res_state::released);
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, gang_members_go_their_own_way_once_dispatched) {
    auto l = make_ledger();
    auto g = l->reserve_gang("a", req(20), 2, "", 0, t0_ns);
    ASSERT_TRUE(g);
    ASSERT_TRUE(l->commit("a", (*g)[0].id, (*g)[0].fencing_token, {1}, t0_ns));
    ASSERT_TRUE(l->mark_dispatched((*g)[0].id, w0));
    EXPECT_INVARIANTS(*l);
    // The gang can no longer be cancelled as a whole, and nothing changes.
    const auto before = snapshot(*l);
    auto c = l->cancel("a", (*g)[1].id, w0);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.err().reason, reason::illegal_transition);
    EXPECT_NE(c.err().message.find("dispatched"), std::string::npos);
    EXPECT_EQ(snapshot(*l), before);
    // The other member's dispatcher may report it missed on its own.
    auto m = l->miss((*g)[1].id, "endpoint down at start", w0 + 1);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->state, res_state::missed);
    EXPECT_EQ(m->reason, "endpoint down at start");
    EXPECT_EQ(l->miss((*g)[1].id, "again", w0 + 2).err().reason, reason::illegal_transition);
    ASSERT_TRUE(l->complete((*g)[0].id, {5}, w0 + 20 * s_ns));
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, query_reports_window_age_and_fidelity_or_the_next_window) {
    auto l = make_ledger();
    request r = req(10, w0 + 30 * s_ns);
    r.max_candidates = 3;
    auto q = l->query(r, t0_ns);
    ASSERT_TRUE(q);
    ASSERT_EQ(q->candidates.size(), 3U);
    const candidate& c = q->candidates[0];
    EXPECT_EQ(c.start_ns, w0 + 30 * s_ns);
    EXPECT_EQ(c.calibration_id, 10001U);
    EXPECT_EQ(c.calibration_age_ns, 30 * s_ns);
    EXPECT_NEAR(c.predicted_fidelity, 0.99 * std::exp(-0.03), 1e-9);
    EXPECT_EQ(c.window_until_ns, t0_ns + period_ns);
    EXPECT_LE(q->candidates[0].score, q->candidates[1].score);
    EXPECT_FALSE(q->next);
    // Queries change nothing.
    EXPECT_EQ(l->stats().active, 0U);
    // Nothing fits before a deadline inside the blackout: the next window is reported.
    request tight = req(10, t0_ns, t0_ns + 10 * s_ns);
    auto none = l->query(tight, t0_ns);
    ASSERT_TRUE(none);
    EXPECT_TRUE(none->candidates.empty());
    ASSERT_TRUE(none->next);
    EXPECT_EQ(none->next->window.valid_from_ns, w0);
    EXPECT_NE(none->why_none.find("no slot"), std::string::npos);
}

TEST(ledger, forget_terminal_drops_old_records_only) {
    auto l = make_ledger();
    auto a = l->reserve("a", req(10), "k", 0, t0_ns);
    auto b = l->reserve("a", req(10), "", 0, t0_ns);
    ASSERT_TRUE(a && b);
    ASSERT_TRUE(l->release("a", a->id, a->fencing_token, t0_ns));
    EXPECT_EQ(*l->forget_terminal(a->end_ns()), 0U);
    EXPECT_EQ(*l->forget_terminal(a->end_ns() + 1), 1U);
    EXPECT_EQ(l->find(a->id), nullptr);
    EXPECT_NE(l->find(b->id), nullptr);
    // The key is free again.
    auto c = l->reserve("a", req(10), "k", 0, t0_ns);
    ASSERT_TRUE(c);
    EXPECT_NE(c->id, a->id);
    EXPECT_INVARIANTS(*l);
}

std::unique_ptr<ledger> make_ledger_with_min_lead(std::int64_t min_lead_ns, std::int64_t now_ns) {
    ledger_options o;
    o.horizon_ns = 20 * period_ns;
    o.min_lead_ns = min_lead_ns;
    auto l = ledger::open({periodic_qpu("q0")}, o, "", now_ns);
    EXPECT_TRUE(l.has_value());
    return l ? std::move(*l) : nullptr;
}

TEST(ledger, no_start_earlier_than_now_plus_min_lead_is_offered_or_accepted) {
    // The dispatcher needs min_lead to take a job: a start the ledger
    // acknowledges sooner than that would be missed.
    const std::int64_t now = w0 + 1 * s_ns;
    const std::int64_t lead = 5 * s_ns;
    auto l = make_ledger_with_min_lead(lead, now);
    auto q = l->query(req(1), now);
    ASSERT_TRUE(q) << q.err().message;
    ASSERT_FALSE(q->candidates.empty());
    for (const auto& c : q->candidates) {
        EXPECT_GE(c.start_ns, now + lead) << "slots.query offered a start inside the minimum lead";
    }
    auto held = l->reserve("t", req(1), "", 0, now);
    ASSERT_TRUE(held);
    EXPECT_EQ(held->start_ns, now + lead);
    auto job = l->submit("t", req(1, now + 1 * s_ns), "", {1}, now);  // not_before inside the lead
    ASSERT_TRUE(job);
    EXPECT_GE(job->start_ns, now + lead);
    auto later = l->submit("t", req(1, now + 60 * s_ns), "", {1}, now);  // beyond it: as asked
    ASSERT_TRUE(later);
    EXPECT_EQ(later->start_ns, now + 60 * s_ns);
    // Only a start inside the lead would meet this deadline: refused, saying why.
    auto tight = l->submit("t", req(1, 0, now + 3 * s_ns), "", {1}, now);
    ASSERT_FALSE(tight);
    EXPECT_EQ(tight.err().reason, reason::no_fit);
    EXPECT_NE(tight.err().message.find("min_lead_ns"), std::string::npos) << tight.err().message;
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, a_qpus_extra_lead_moves_its_earliest_start_and_refuses_a_commit_inside_it) {
    // A two-phase QPU whose endpoint arms slower than min_lead_ns budgets:
    // the daemon sets the difference, and no start inside it is offered,
    // placed or acknowledged; the refusal says from when one can be.
    const std::int64_t now = w0 + 1 * s_ns;
    const std::int64_t lead = 1 * s_ns;
    const std::int64_t extra = 3 * s_ns;
    auto l = make_ledger_with_min_lead(lead, now);
    auto held = l->reserve("t", req(1, now + lead + 1 * s_ns), "", 0, now);  // inside lead + extra
    ASSERT_TRUE(held) << held.err().message;
    ASSERT_TRUE(l->set_extra_lead("q0", extra, now));
    EXPECT_FALSE(l->set_extra_lead("nope", extra, now));
    EXPECT_EQ(l->extra_lead_ns("q0"), extra);
    auto q = l->query(req(1), now);
    ASSERT_TRUE(q) << q.err().message;
    ASSERT_FALSE(q->candidates.empty());
    for (const auto& c : q->candidates) {
        EXPECT_GE(c.start_ns, now + lead + extra) << "slots.query offered a start inside the extra lead";
    }
    auto job = l->submit("t", req(1, now + 1), "", {1}, now);
    ASSERT_TRUE(job) << job.err().message;
    EXPECT_GE(job->start_ns, now + lead + extra);
    auto late = l->commit("t", held->id, held->fencing_token, {1}, now);
    ASSERT_FALSE(late);
    EXPECT_EQ(late.err().reason, reason::unavailable);
    EXPECT_EQ(late.err().next_start_ns, now + lead + extra) << late.err().message;
    // Learned down again: back to min_lead_ns alone.
    ASSERT_TRUE(l->set_extra_lead("q0", 0, now));
    auto again = l->commit("t", held->id, held->fencing_token, {1}, now);
    EXPECT_TRUE(again) << again.err().message;
    EXPECT_INVARIANTS(*l);
}

TEST(ledger, cancel_of_a_job_whose_frame_is_going_out_is_refused_and_changes_nothing) {
    auto l = make_ledger();
    auto a = l->submit("t", req(1), "", {1}, t0_ns);
    auto b = l->submit("t", req(1), "", {1}, t0_ns);
    ASSERT_TRUE(a && b);
    std::vector<std::uint64_t> asked;
    ledger::dispatch_gate gate;
    gate.withdraw = [&](std::uint64_t id) {
        asked.push_back(id);
        return id != a->id;  // a's frame is on the wire; b is withdrawn in time
    };
    l->set_dispatch_gate(gate);
    auto ca = l->cancel("t", a->id, t0_ns);
    ASSERT_FALSE(ca);
    EXPECT_EQ(ca.err().reason, reason::illegal_transition);
    EXPECT_NE(ca.err().message.find("already being sent"), std::string::npos) << ca.err().message;
    EXPECT_EQ(l->status("t", a->id)->state, res_state::committed) << "the send decides its outcome";
    ASSERT_TRUE(l->mark_dispatched(a->id, w0));
    auto cb = l->cancel("t", b->id, t0_ns);
    ASSERT_TRUE(cb) << cb.err().message;
    EXPECT_EQ(cb->state, res_state::cancelled);
    EXPECT_EQ(asked, (std::vector<std::uint64_t>{a->id, b->id}));
    EXPECT_INVARIANTS(*l);
}

}  // namespace
}  // namespace qrt::timeline
