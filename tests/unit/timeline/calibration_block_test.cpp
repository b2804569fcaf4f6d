// Calibration blocks (calibration.request): placement at the latest start
// that ends by needed_by around every committed job, the yield of held
// reservations, the block as a blackout, bad requests, durability.
#include <filesystem>

#include "helpers.hpp"

namespace qrt::timeline {
namespace {

using namespace qrt::timeline::test;
namespace fs = std::filesystem;

// Seconds from t0 on p0: window 1 [0, 100), window 2 [100, 200).
calibration_window win(std::uint64_t id, std::int64_t from_s, std::int64_t until_s) {
    return calibration_window{id, t0_ns + from_s * s_ns, t0_ns + until_s * s_ns, 0.99, 1000 * s_ns};
}

std::int64_t at(std::int64_t s) { return t0_ns + s * s_ns; }

std::unique_ptr<ledger> open_blocks(calibration_preempt preempt = calibration_preempt::never,
                                    const std::string& store_path = "", std::int64_t now_ns = t0_ns,
                                    std::size_t max_blocks = 16) {
    ledger_options o;
    o.horizon_ns = 20 * period_ns;
    o.calibration_preempt = preempt;
    o.calibration_yield_ns = 10 * s_ns;
    o.max_calibration_blocks = max_blocks;
    auto l = ledger::open({pushed_qpu("p0"), pushed_qpu("p1")}, o, store_path, now_ns);
    EXPECT_TRUE(l.has_value()) << (l ? "" : l.err().message);
    if (!l) {
        return nullptr;
    }
    if ((*l)->calibration("p0", now_ns)->empty()) {
        EXPECT_TRUE((*l)->update_calibration("p0", {win(1, 0, 100), win(2, 100, 200)}, now_ns));
        EXPECT_TRUE((*l)->update_calibration("p1", {win(1, 0, 200)}, now_ns));
    }
    (void)(*l)->drain_events();
    return std::move(*l);
}

request job(std::int64_t duration_s, std::int64_t not_before_s, std::int32_t priority = 0) {
    request r = req(duration_s, at(not_before_s));
    r.qpus = {"p0"};
    r.priority = priority;
    return r;
}

block_request cal(std::int64_t duration_s, std::int64_t needed_by_s, std::int32_t urgency = 0) {
    return block_request{"p0", "x_amplitude", duration_s * s_ns, at(needed_by_s), urgency};
}

std::vector<event> of_type(const std::vector<event>& evs, std::string_view type) {
    std::vector<event> out;
    for (const event& e : evs) {
        if (e.type == type) {
            out.push_back(e);
        }
    }
    return out;
}

TEST(calibration_block, goes_at_the_latest_free_start_that_ends_by_needed_by) {
    auto l = open_blocks();
    auto c = l->submit("carol", job(10, 40), "c", {1}, t0_ns);
    ASSERT_TRUE(c);
    ASSERT_EQ(c->start_ns, at(40));
    auto b = l->request_block("calsvc", cal(10, 60), "k1", t0_ns);
    ASSERT_TRUE(b) << b.err().message;
    EXPECT_EQ(b->state, block_state::scheduled);
    EXPECT_EQ(b->start_ns, at(50));  // as late as ends by 60, right after the committed job
    EXPECT_EQ(b->end_ns(), at(60));
    EXPECT_EQ(b->calibration_id, 1U);
    EXPECT_EQ(l->find(c->id)->start_ns, at(40));
    EXPECT_EQ(l->find(c->id)->state, res_state::committed);
    const auto evs = of_type(l->drain_events(), event_type::calibration_scheduled);
    ASSERT_EQ(evs.size(), 1U);
    ASSERT_TRUE(evs[0].block);
    EXPECT_EQ(evs[0].block->id, b->id);
    EXPECT_INVARIANTS(*l);
}

// slots.query never offers the block's time, a reservation that would start
// in it goes after it, and a no_fit whose request needs it names it.
TEST(calibration_block, placement_never_offers_the_block) {
    auto l = open_blocks();
    auto b = l->request_block("calsvc", cal(10, 60), "k1", t0_ns);
    ASSERT_TRUE(b);
    ASSERT_EQ(b->start_ns, at(50));
    request q = job(5, 0);
    q.max_candidates = 50;
    for (std::int64_t from = 0; from < 100; from += 3) {
        q.not_before_ns = at(from);
        auto got = l->query(q, t0_ns);
        ASSERT_TRUE(got);
        for (const candidate& c : got->candidates) {
            EXPECT_FALSE(c.start_ns < b->end_ns() && b->start_ns < c.end_ns)
                << "offered " << c.start_ns << " inside the block";
        }
    }
    auto r = l->reserve("alice", job(5, 52), "r", 0, t0_ns);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->start_ns, at(60));
    request tight = job(5, 51);
    tight.deadline_ns = at(59);
    auto refused = l->reserve("alice", tight, "t", 0, t0_ns);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.err().reason, reason::no_fit);
    EXPECT_NE(refused.err().message.find("calibration block 1 (step x_amplitude) holds qpu p0"), std::string::npos)
        << refused.err().message;
    EXPECT_NE(refused.err().message.find("the earliest start after it is " + std::to_string(at(65))),
              std::string::npos)
        << refused.err().message;
    EXPECT_INVARIANTS(*l);
}

// The only room before needed_by is where a held reservation sits: its
// holder is asked to yield; once it releases, the block is scheduled.
class yield_fixture : public ::testing::Test {
protected:
    void place(calibration_preempt preempt, std::int32_t urgency) {
        l = open_blocks(preempt);
        // [0, 20) and [60, 100) committed, [20, 60) held by bob.
        ASSERT_TRUE(l->submit("carol", job(20, 0), "c1", {1}, t0_ns));
        ASSERT_TRUE(l->submit("carol", job(40, 60), "c2", {1}, t0_ns));
        auto h = l->reserve("bob", job(40, 20), "h", 60 * s_ns, t0_ns);
        ASSERT_TRUE(h);
        ASSERT_EQ(h->start_ns, at(20));
        held = *h;
        (void)l->drain_events();
        auto b = l->request_block("calsvc", cal(10, 70, urgency), "k", t0_ns);
        ASSERT_TRUE(b) << b.err().message;
        block = *b;
        const auto evs = l->drain_events();
        yields = of_type(evs, event_type::yield_requested);
    }
    std::unique_ptr<ledger> l;
    reservation held;
    calibration_block block;
    std::vector<event> yields;
};

TEST_F(yield_fixture, the_holder_is_asked_to_yield_releases_and_the_block_is_placed) {
    place(calibration_preempt::never, 5);
    EXPECT_EQ(block.state, block_state::yielding);
    EXPECT_EQ(block.start_ns, at(50));  // the latest start that displaces no committed job
    EXPECT_EQ(block.yield_deadline_ns, at(10));
    EXPECT_EQ(l->yielders(block.id), std::vector<std::uint64_t>{held.id});
    ASSERT_EQ(yields.size(), 1U);
    EXPECT_EQ(yields[0].reservation_id, held.id);
    EXPECT_EQ(yields[0].tenant, "bob");
    EXPECT_EQ(yields[0].deadline_ns, at(10));
    EXPECT_EQ(yields[0].free_start_ns, at(100));  // where its 40 s fit, outside the block
    EXPECT_EQ(yields[0].at_deadline, "keep");
    ASSERT_TRUE(yields[0].block);
    EXPECT_EQ(yields[0].block->id, block.id);
    EXPECT_INVARIANTS(*l);
    // Nothing else goes into the block's time meanwhile.
    EXPECT_FALSE(l->reserve("alice", [] { auto r = job(5, 50); r.deadline_ns = at(60); return r; }(), "a", 0,
                            at(1)));
    ASSERT_TRUE(l->settle_blocks(at(1)));
    EXPECT_EQ(l->find_block(block.id)->state, block_state::yielding);
    ASSERT_TRUE(l->release("bob", held.id, held.fencing_token, at(2)));
    (void)l->drain_events();
    ASSERT_TRUE(l->settle_blocks(at(2)));
    EXPECT_EQ(l->find_block(block.id)->state, block_state::scheduled);
    EXPECT_EQ(of_type(l->drain_events(), event_type::calibration_scheduled).size(), 1U);
    // What bob gave back, outside the block, is free again.
    auto r = l->reserve("alice", job(30, 20), "a2", 0, at(2));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->start_ns, at(20));
    EXPECT_INVARIANTS(*l);
}

TEST_F(yield_fixture, a_holder_that_does_not_release_keeps_its_reservation_under_never) {
    place(calibration_preempt::never, 5);
    ASSERT_TRUE(l->settle_blocks(at(9)));
    EXPECT_EQ(l->find_block(block.id)->state, block_state::yielding);
    ASSERT_TRUE(l->heartbeat("bob", held.id, held.fencing_token, at(9)));
    ASSERT_TRUE(l->settle_blocks(at(10)));
    const calibration_block* b = l->find_block(block.id);
    EXPECT_EQ(b->state, block_state::failed);
    EXPECT_NE(b->reason.find("did not yield"), std::string::npos) << b->reason;
    EXPECT_NE(b->reason.find("the earliest block is start_ns " + std::to_string(at(100))), std::string::npos)
        << b->reason;
    EXPECT_EQ(l->find(held.id)->state, res_state::held);
    const auto ended = of_type(l->drain_events(), event_type::calibration_ended);
    ASSERT_EQ(ended.size(), 1U);
    EXPECT_EQ(ended[0].block->state, block_state::failed);
    // Its time is ordinary free time again (here: bob's still).
    EXPECT_TRUE(l->commit("bob", held.id, held.fencing_token, {1}, at(11)));
    EXPECT_INVARIANTS(*l);
}

TEST_F(yield_fixture, a_holder_that_does_not_release_is_revoked_under_held_when_less_urgent) {
    place(calibration_preempt::held, 5);
    ASSERT_EQ(yields.size(), 1U);
    EXPECT_EQ(yields[0].at_deadline, "revoke");
    ASSERT_TRUE(l->settle_blocks(at(10)));
    EXPECT_EQ(l->find_block(block.id)->state, block_state::scheduled);
    const reservation* r = l->find(held.id);
    EXPECT_EQ(r->state, res_state::displaced);
    EXPECT_NE(r->reason.find("revoked for calibration block"), std::string::npos) << r->reason;
    // Its fencing token is dead.
    auto commit = l->commit("bob", held.id, held.fencing_token, {1}, at(11));
    ASSERT_FALSE(commit);
    EXPECT_NE(commit.err().message.find("revoked"), std::string::npos) << commit.err().message;
    EXPECT_FALSE(l->heartbeat("bob", held.id, held.fencing_token, at(11)));
    EXPECT_FALSE(l->release("bob", held.id, held.fencing_token, at(11)));
    const auto evs = l->drain_events();
    EXPECT_EQ(of_type(evs, event_type::displaced).size(), 1U);
    EXPECT_EQ(of_type(evs, event_type::calibration_scheduled).size(), 1U);
    EXPECT_INVARIANTS(*l);
}

TEST_F(yield_fixture, held_policy_does_not_revoke_a_reservation_of_equal_priority) {
    place(calibration_preempt::held, 0);
    EXPECT_EQ(yields.at(0).at_deadline, "keep");
    ASSERT_TRUE(l->settle_blocks(at(10)));
    EXPECT_EQ(l->find_block(block.id)->state, block_state::failed);
    EXPECT_EQ(l->find(held.id)->state, res_state::held);
    EXPECT_INVARIANTS(*l);
}

// A held reservation committed before the deadline is an acknowledged job:
// it stays, and the block fails at once.
TEST_F(yield_fixture, a_holder_that_commits_keeps_its_job_and_the_block_fails) {
    place(calibration_preempt::held, 5);
    auto c = l->commit("bob", held.id, held.fencing_token, {1}, at(3));
    ASSERT_TRUE(c) << c.err().message;
    EXPECT_EQ(l->find_block(block.id)->state, block_state::failed);
    ASSERT_TRUE(l->settle_blocks(at(10)));
    EXPECT_EQ(l->find(held.id)->state, res_state::committed);
    EXPECT_EQ(l->find(held.id)->start_ns, at(20));
    EXPECT_INVARIANTS(*l);
}

// needed_by cannot be met: the answer says so, with the earliest block and
// the predicted fidelity at needed_by, and nothing is stored.
TEST(calibration_block, a_request_that_cannot_meet_needed_by_names_the_earliest_block) {
    auto l = open_blocks();
    ASSERT_TRUE(l->submit("carol", job(100, 0), "full", {1}, t0_ns));
    (void)l->drain_events();
    const auto before = snapshot(*l);
    auto b = l->request_block("calsvc", cal(10, 90), "k", t0_ns);
    ASSERT_FALSE(b);
    EXPECT_EQ(b.err().reason, reason::no_fit);
    EXPECT_NE(b.err().message.find("the earliest block is start_ns " + std::to_string(at(100))), std::string::npos)
        << b.err().message;
    const auto earliest = l->earliest_block("p0", 10 * s_ns, t0_ns);
    ASSERT_TRUE(earliest);
    EXPECT_EQ(earliest->start_ns, at(100));
    EXPECT_EQ(earliest->calibration_id, 2U);
    const auto f = l->predicted_fidelity("p0", at(90));
    ASSERT_TRUE(f);
    EXPECT_NEAR(*f, 0.99 * std::exp(-90.0 / 1000.0), 1e-12);
    EXPECT_TRUE(l->blocks().empty());
    EXPECT_EQ(snapshot(*l), before);
    EXPECT_TRUE(l->drain_events().empty());
    EXPECT_INVARIANTS(*l);
}

TEST(calibration_block, bad_requests_get_a_clear_error_and_store_nothing) {
    auto l = open_blocks(calibration_preempt::never, "", t0_ns, 2);
    struct bad {
        const char* name;
        block_request req;
        const char* reason;
        const char* mentions;
    };
    block_request unknown = cal(10, 60);
    unknown.qpu = "nope";
    block_request bad_step = cal(10, 60);
    bad_step.step = "x amplitude";
    const std::vector<bad> cases = {
        {"unknown qpu", unknown, "unknown_qpu", "\"nope\""},
        {"longer than a window", cal(150, 190), "invalid_argument", "longer than the longest calibration window"},
        {"needed_by now", cal(10, 0), "deadline_passed", "needed_by_ns"},
        {"needed_by past", cal(10, -5), "deadline_passed", "stale already"},
        {"bad step", bad_step, "invalid_argument", "step"},
        {"no duration", cal(0, 60), "invalid_argument", "duration_ns"},
    };
    for (const bad& c : cases) {
        SCOPED_TRACE(c.name);
        auto b = l->request_block("calsvc", c.req, "k", t0_ns);
        ASSERT_FALSE(b);
        EXPECT_EQ(b.err().reason, c.reason);
        EXPECT_NE(b.err().message.find(c.mentions), std::string::npos) << b.err().message;
        EXPECT_TRUE(l->blocks().empty());
        EXPECT_TRUE(l->drain_events().empty());
    }
    // The same key and request: the same block; another request: duplicate.
    auto first = l->request_block("calsvc", cal(10, 60), "k", t0_ns);
    ASSERT_TRUE(first);
    auto again = l->request_block("calsvc", cal(10, 60), "k", t0_ns);
    ASSERT_TRUE(again);
    EXPECT_EQ(again->id, first->id);
    auto dup = l->request_block("calsvc", cal(10, 70), "k", t0_ns);
    ASSERT_FALSE(dup);
    EXPECT_EQ(dup.err().reason, reason::duplicate);
    // The bound: timeline.max_calibration_blocks live blocks per QPU.
    ASSERT_TRUE(l->request_block("calsvc", cal(10, 90), "k2", t0_ns));
    auto over = l->request_block("calsvc", cal(10, 190), "k3", t0_ns);
    ASSERT_FALSE(over);
    EXPECT_EQ(over.err().reason, reason::overloaded);
    EXPECT_EQ(l->blocks().size(), 2U);
    EXPECT_INVARIANTS(*l);
}

// Only the block's own calibration service places jobs in it; closing the
// block with calibration.update frees what is left of it; a cancelled
// block's committed jobs stay.
TEST(calibration_block, only_its_own_jobs_run_inside_and_closing_it_frees_the_rest) {
    auto l = open_blocks();
    auto b = l->request_block("calsvc", cal(20, 60), "k", t0_ns);
    ASSERT_TRUE(b);
    ASSERT_EQ(b->start_ns, at(40));
    request in = job(5, 0);
    in.block_id = b->id;
    auto j1 = l->submit("calsvc", in, "e1", {1}, t0_ns);
    ASSERT_TRUE(j1) << j1.err().message;
    EXPECT_EQ(j1->start_ns, at(40));
    EXPECT_EQ(j1->block_id, b->id);
    auto j2 = l->reserve("calsvc", in, "e2", 0, t0_ns);
    ASSERT_TRUE(j2);
    EXPECT_EQ(j2->start_ns, at(45));
    auto other = l->submit("mallory", in, "m", {1}, t0_ns);
    ASSERT_FALSE(other);
    EXPECT_EQ(other.err().reason, reason::not_owner);
    request huge = job(25, 0);
    huge.block_id = b->id;
    EXPECT_EQ(l->submit("calsvc", huge, "h", {1}, t0_ns).err().reason, reason::no_fit);
    request gang = in;
    EXPECT_EQ(l->reserve_gang("calsvc", gang, 1, "g", 0, t0_ns).err().reason, reason::invalid_argument);
    EXPECT_INVARIANTS(*l);
    ASSERT_TRUE(l->settle_blocks(at(40)));
    EXPECT_EQ(l->find_block(b->id)->state, block_state::started);
    // The service closes it at 47 with the new calibration from then on.
    auto u = l->update_calibration("p0", {win(3, 47, 200)}, at(47), b->id, "calsvc");
    ASSERT_TRUE(u) << u.err().message;
    EXPECT_EQ(l->find_block(b->id)->state, block_state::completed);
    auto after = l->reserve("alice", job(5, 50), "a", 0, at(47));
    ASSERT_TRUE(after);
    EXPECT_EQ(after->start_ns, at(50));  // the rest of the block is free again
    EXPECT_INVARIANTS(*l);
    // A second block, cancelled: its committed job stays.
    auto b2 = l->request_block("calsvc", cal(10, 150), "k2", at(47));
    ASSERT_TRUE(b2);
    request in2 = job(5, 0);
    in2.block_id = b2->id;
    auto j3 = l->submit("calsvc", in2, "e3", {1}, at(47));
    ASSERT_TRUE(j3);
    EXPECT_EQ(l->cancel_block("mallory", b2->id, at(48)).err().reason, reason::not_owner);
    auto cancelled = l->cancel_block("calsvc", b2->id, at(48));
    ASSERT_TRUE(cancelled);
    EXPECT_EQ(cancelled->state, block_state::cancelled);
    EXPECT_EQ(l->find(j3->id)->state, res_state::committed);
    EXPECT_EQ(l->cancel_block("calsvc", b2->id, at(48)).err().reason, reason::illegal_transition);
    EXPECT_INVARIANTS(*l);
}

TEST(calibration_block, survives_a_restart_and_ends_when_its_end_passed) {
    std::string dir = (fs::temp_directory_path() / "qrt-blocks-XXXXXX").string();
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    const std::string db = (fs::path(dir) / "ledger.db").string();
    calibration_block placed;
    {
        auto l = open_blocks(calibration_preempt::never, db);
        auto b = l->request_block("calsvc", cal(10, 60), "k", t0_ns);
        ASSERT_TRUE(b);
        placed = *b;
    }
    {
        auto l = open_blocks(calibration_preempt::never, db, at(1));
        const calibration_block* b = l->find_block(placed.id);
        ASSERT_NE(b, nullptr);
        EXPECT_EQ(*b, placed);
        // Still a blackout after the restart.
        request tight = job(5, 50);
        tight.deadline_ns = at(60);
        EXPECT_EQ(l->reserve("alice", tight, "a", 0, at(1)).err().reason, reason::no_fit);
        // The same key returns it.
        auto again = l->request_block("calsvc", cal(10, 60), "k", at(1));
        ASSERT_TRUE(again);
        EXPECT_EQ(again->id, placed.id);
        EXPECT_INVARIANTS(*l);
    }
    {
        auto l = open_blocks(calibration_preempt::never, db, at(61));
        const calibration_block* b = l->find_block(placed.id);
        ASSERT_NE(b, nullptr);
        EXPECT_EQ(b->state, block_state::ended);
        auto next = l->request_block("calsvc", cal(10, 150), "k2", at(61));
        ASSERT_TRUE(next);
        EXPECT_GT(next->id, placed.id);
        EXPECT_INVARIANTS(*l);
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace qrt::timeline
