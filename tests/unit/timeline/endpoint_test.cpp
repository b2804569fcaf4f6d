// A QPU whose endpoint is down: what the ledger offers, accepts and refuses
// (timeline.endpoint_down_horizon_ns), and the events it emits.
#include <algorithm>

#include "helpers.hpp"

namespace qrt::timeline::test {
namespace {

// Now is inside cycle 10000's window: [t0+10 s, t0+100 s) holds it.
constexpr std::int64_t now = t0_ns + 20 * s_ns;
constexpr std::int64_t horizon = 30 * s_ns;

std::unique_ptr<ledger> ledger_with_horizon(std::vector<qpu_spec> qpus = {}) {
    if (qpus.empty()) {
        qpus = {periodic_qpu("q0"), periodic_qpu("q1")};
    }
    ledger_options o;
    o.horizon_ns = 20 * period_ns;
    o.endpoint_down_horizon_ns = horizon;
    auto l = ledger::open(std::move(qpus), o, "", now);
    EXPECT_TRUE(l.has_value());
    return l ? std::move(*l) : nullptr;
}

request on(std::vector<std::string> qpus, std::int64_t duration_s, std::int64_t not_before_ns = 0,
           std::int64_t deadline_ns = 0) {
    request r = req(duration_s, not_before_ns, deadline_ns);
    r.qpus = std::move(qpus);
    return r;
}

std::size_t count_events(const std::vector<event>& evs, std::string_view type, std::string_view qpu) {
    return static_cast<std::size_t>(std::count_if(evs.begin(), evs.end(), [&](const event& e) {
        return e.type == type && e.qpu == qpu;
    }));
}

}  // namespace

TEST(ledger_endpoint, a_request_within_the_horizon_on_a_down_qpu_is_refused_naming_it_and_changes_nothing) {
    auto l = ledger_with_horizon();
    ASSERT_TRUE(l->set_endpoint_state("q0", false, "connect: Permission denied", "fix the socket", now));
    const auto before = snapshot(*l);
    auto r = l->reserve("t", on({"q0"}, 1), "k1", 0, now);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().reason, reason::endpoint_down);
    EXPECT_EQ(r.err().qpu, "q0");
    EXPECT_NE(r.err().message.find("Permission denied"), std::string::npos) << r.err().message;
    EXPECT_NE(r.err().message.find("fix the socket"), std::string::npos) << r.err().message;
    auto s = l->submit("t", on({"q0"}, 1), "k2", blob(std::vector<std::uint8_t>{1}), now);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.err().reason, reason::endpoint_down);
    request gang = req(1);
    auto g = l->reserve_gang("t", gang, 2, "k3", 0, now);
    ASSERT_FALSE(g);
    EXPECT_EQ(g.err().reason, reason::endpoint_down);
    EXPECT_EQ(snapshot(*l), before);
    const auto* st = l->endpoint_down("q0");
    ASSERT_NE(st, nullptr);
    EXPECT_EQ(st->since_ns, now);
    EXPECT_EQ(st->error, "connect: Permission denied");
    EXPECT_EQ(l->endpoint_down("q1"), nullptr);
    EXPECT_INVARIANTS(*l);
}

TEST(ledger_endpoint, a_request_further_ahead_than_the_horizon_is_accepted_there) {
    auto l = ledger_with_horizon();
    ASSERT_TRUE(l->set_endpoint_state("q0", false, "connect: No such file or directory", "", now));
    auto r = l->reserve("t", on({"q0"}, 1, now + horizon + 5 * s_ns), "k1", 0, now);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_GE(r->start_ns, now + horizon);
    EXPECT_INVARIANTS(*l);
}

TEST(ledger_endpoint, with_another_qpu_connected_the_request_goes_there) {
    auto l = ledger_with_horizon();
    ASSERT_TRUE(l->set_endpoint_state("q0", false, "endpoint_disconnected: EOF", "", now));
    for (int i = 0; i < 5; ++i) {
        auto r = l->submit("t", req(1), "k" + std::to_string(i), blob(std::vector<std::uint8_t>{1}), now);
        ASSERT_TRUE(r) << r.err().message;
        EXPECT_EQ(r->qpu, "q1");
        EXPECT_LT(r->start_ns, now + horizon);
    }
    // slots.query offers nothing on q0 within the horizon either.
    request q = on({"q0"}, 1);
    q.max_candidates = 4;
    auto found = l->query(q, now);
    ASSERT_TRUE(found);
    for (const auto& c : found->candidates) {
        EXPECT_GE(c.start_ns, now + horizon) << c.qpu;
    }
}

TEST(ledger_endpoint, committing_a_held_reservation_within_the_horizon_is_refused_and_it_stays_held) {
    auto l = ledger_with_horizon();
    auto held = l->reserve("t", on({"q0"}, 1, now + 5 * s_ns), "k1", 0, now);
    ASSERT_TRUE(held);
    ASSERT_LT(held->start_ns, now + horizon);
    ASSERT_TRUE(l->set_endpoint_state("q0", false, "connect: Connection refused", "", now));
    auto c = l->commit("t", held->id, held->fencing_token, blob(std::vector<std::uint8_t>{1}), now);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.err().reason, reason::endpoint_down);
    EXPECT_EQ(l->find(held->id)->state, res_state::held);
    // Back up: the same commit is accepted.
    ASSERT_TRUE(l->set_endpoint_state("q0", true, "", "", now + 1));
    auto again = l->commit("t", held->id, held->fencing_token, blob(std::vector<std::uint8_t>{1}), now + 1);
    ASSERT_TRUE(again) << again.err().message;
    EXPECT_EQ(again->state, res_state::committed);
}

TEST(ledger_endpoint, each_change_emits_one_event_and_up_again_accepts_at_the_least_lead) {
    auto l = ledger_with_horizon();
    (void)l->drain_events();
    ASSERT_TRUE(l->set_endpoint_state("q0", false, "connect: Permission denied", "", now));
    ASSERT_TRUE(l->set_endpoint_state("q0", false, "connect: Permission denied", "", now + 5));  // no change
    ASSERT_TRUE(l->set_endpoint_state("q0", true, "", "", now + 10));
    EXPECT_FALSE(l->set_endpoint_state("nope", false, "", "", now));
    const auto evs = l->drain_events();
    EXPECT_EQ(count_events(evs, event_type::endpoint_down, "q0"), 1U);
    EXPECT_EQ(count_events(evs, event_type::endpoint_up, "q0"), 1U);
    auto r = l->submit("t", on({"q0"}, 1), "k", blob(std::vector<std::uint8_t>{1}), now + 10);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_LT(r->start_ns, now + horizon);
}

TEST(ledger_endpoint, a_zero_horizon_ignores_the_endpoint_state) {
    ledger_options o;
    o.horizon_ns = 20 * period_ns;
    o.endpoint_down_horizon_ns = 0;
    auto l = ledger::open({periodic_qpu("q0")}, o, "", now);
    ASSERT_TRUE(l);
    ASSERT_TRUE((*l)->set_endpoint_state("q0", false, "connect: Permission denied", "", now));
    auto r = (*l)->reserve("t", req(1), "k", 0, now);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_LT(r->start_ns, now + horizon);
}

}  // namespace qrt::timeline::test
