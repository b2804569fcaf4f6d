// Pushed calibration windows: get/update, validation, and the calibration
// guard (re-place or fail every reservation whose window changed).
#include "helpers.hpp"

namespace qrt::timeline {
namespace {

using namespace qrt::timeline::test;

calibration_window win(std::uint64_t id, std::int64_t from_s, std::int64_t until_s,
                       double f0 = 0.99, std::int64_t tau_s = 0) {
    return calibration_window{id, t0_ns + from_s * s_ns, t0_ns + until_s * s_ns, f0, tau_s * s_ns};
}

std::unique_ptr<ledger> pushed(on_calibration_change occ = on_calibration_change::replace,
                               std::string policy = "edf-backfill") {
    return make_ledger(std::move(policy), {pushed_qpu("p0"), pushed_qpu("p1")}, occ);
}

request on(std::string qpu, std::int64_t duration_s, std::int64_t deadline_ns = 0) {
    request r = req(duration_s, 0, deadline_ns);
    r.qpus = {std::move(qpu)};
    return r;
}

TEST(calibration, a_pushed_qpu_has_no_windows_until_an_update) {
    auto l = pushed();
    auto r = l->reserve("a", on("p0", 10), "", 0, t0_ns);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().reason, reason::no_fit);
    auto u = l->update_calibration("p0", {win(1, 100, 200), win(2, 300, 400)}, t0_ns);
    ASSERT_TRUE(u) << u.err().message;
    EXPECT_EQ(u->windows, 2U);
    auto got = l->calibration("p0", t0_ns);
    ASSERT_TRUE(got);
    EXPECT_EQ(*got, (std::vector<calibration_window>{win(1, 100, 200), win(2, 300, 400)}));
    auto ok = l->reserve("a", on("p0", 10), "", 0, t0_ns);
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->start_ns, t0_ns + 100 * s_ns);
    EXPECT_EQ(ok->calibration_id, 1U);
    auto later = l->calibration("p0", t0_ns + 250 * s_ns);
    ASSERT_TRUE(later);
    EXPECT_EQ(later->size(), 1U);  // only windows ending after now
    const auto evs = l->drain_events();
    ASSERT_FALSE(evs.empty());
    EXPECT_EQ(evs.front().type, "calibration");
    EXPECT_EQ(evs.front().qpu, "p0");
    EXPECT_EQ(l->calibration("nope", t0_ns).err().reason, reason::unknown_qpu);
    EXPECT_INVARIANTS(*l);
}

TEST(calibration, bad_updates_are_rejected_and_change_nothing) {
    auto l = pushed();
    ASSERT_TRUE(l->update_calibration("p0", {win(1, 100, 200)}, t0_ns));
    ASSERT_TRUE(l->reserve("a", on("p0", 10), "", 0, t0_ns));
    l->drain_events();
    const auto before = snapshot(*l);
    struct bad {
        const char* name;
        std::vector<calibration_window> ws;
        const char* reason;
        const char* mentions;
    };
    const std::vector<bad> cases = {
        {"backwards", {win(5, 200, 100)}, "invalid_argument", "runs backwards"},
        {"empty", {win(5, 200, 200)}, "invalid_argument", "runs backwards"},
        {"overlap", {win(5, 100, 200), win(6, 150, 300)}, "invalid_argument", "overlaps"},
        {"overlap unsorted", {win(6, 150, 300), win(5, 100, 200)}, "invalid_argument", "overlaps"},
        {"duplicate id", {win(5, 100, 200), win(5, 300, 400)}, "duplicate", "calibration_id 5"},
        {"zero id", {win(0, 100, 200)}, "invalid_argument", "calibration_id"},
        {"f0 above 1", {win(5, 100, 200, 1.5)}, "invalid_argument", "f0"},
        {"negative tau", {win(5, 100, 200, 0.9, -1)}, "invalid_argument", "tau_ns"},
    };
    for (const bad& c : cases) {
        SCOPED_TRACE(c.name);
        auto u = l->update_calibration("p0", c.ws, t0_ns);
        ASSERT_FALSE(u);
        EXPECT_EQ(u.err().reason, c.reason);
        EXPECT_NE(u.err().message.find(c.mentions), std::string::npos) << u.err().message;
    }
    EXPECT_EQ(l->update_calibration("nope", {}, t0_ns).err().reason, reason::unknown_qpu);
    auto periodic = make_ledger();
    EXPECT_EQ(periodic->update_calibration("q0", {win(1, 100, 200)}, t0_ns).err().reason,
              reason::invalid_argument);
    EXPECT_EQ(snapshot(*l), before);
    EXPECT_EQ(*l->calibration("p0", t0_ns), (std::vector<calibration_window>{win(1, 100, 200)}));
    EXPECT_TRUE(l->drain_events().empty());
    EXPECT_INVARIANTS(*l);
}

TEST(calibration, moved_window_re_places_its_reservations_and_says_why) {
    auto l = pushed();
    ASSERT_TRUE(l->update_calibration("p0", {win(1, 100, 200)}, t0_ns));
    auto held = l->reserve("a", on("p0", 10), "", 0, t0_ns);
    auto job = l->submit("b", on("p0", 10), "", {9}, t0_ns);
    ASSERT_TRUE(held && job);
    l->drain_events();
    // Window 1 is cancelled; window 2 comes later.
    auto u = l->update_calibration("p0", {win(2, 300, 400)}, t0_ns);
    ASSERT_TRUE(u);
    EXPECT_EQ(u->replaced, 2U);
    EXPECT_EQ(u->displaced, 0U);
    const auto h = l->status("a", held->id);
    EXPECT_EQ(h->state, res_state::held);
    EXPECT_EQ(h->calibration_id, 2U);
    EXPECT_EQ(h->start_ns, t0_ns + 300 * s_ns);
    EXPECT_EQ(h->fencing_token, held->fencing_token);
    const auto j = l->status("b", job->id);
    EXPECT_EQ(j->state, res_state::committed);
    EXPECT_EQ(j->start_ns, t0_ns + 310 * s_ns);
    const auto due = l->due_jobs("p0", t0_ns + 1000 * s_ns);
    ASSERT_EQ(due.size(), 1U);
    EXPECT_EQ(due[0].start_ns, t0_ns + 310 * s_ns);
    std::size_t replaced = 0;
    for (const event& e : l->drain_events()) {
        if (e.type == "replaced") {
            ++replaced;
            EXPECT_NE(e.reason.find("calibration of qpu p0 changed"), std::string::npos);
        }
    }
    EXPECT_EQ(replaced, 2U);
    EXPECT_INVARIANTS(*l);
}

TEST(calibration, shortened_window_keeps_untouched_reservations) {
    auto l = pushed();
    ASSERT_TRUE(l->update_calibration("p0", {win(1, 100, 200)}, t0_ns));
    auto a = l->reserve("a", on("p0", 10), "", 0, t0_ns);  // [100, 110)
    auto b = l->reserve("a", req(10, t0_ns + 185 * s_ns), "", 0, t0_ns);  // [185, 195)
    ASSERT_TRUE(a && b);
    ASSERT_EQ(b->qpu, "p0");
    auto u = l->update_calibration("p0", {win(1, 100, 150), win(3, 160, 250)}, t0_ns);
    ASSERT_TRUE(u);
    EXPECT_EQ(u->replaced, 1U);
    EXPECT_EQ(l->status("a", a->id)->start_ns, a->start_ns);  // still inside window 1
    const auto moved = l->status("a", b->id);
    EXPECT_EQ(moved->calibration_id, 3U);
    EXPECT_EQ(moved->start_ns, t0_ns + 185 * s_ns);  // same time, new window
    EXPECT_INVARIANTS(*l);
}

TEST(calibration, with_fail_policy_changed_reservations_are_displaced) {
    auto l = pushed(on_calibration_change::fail);
    ASSERT_TRUE(l->update_calibration("p0", {win(1, 100, 200)}, t0_ns));
    auto held = l->reserve("a", on("p0", 10), "", 0, t0_ns);
    ASSERT_TRUE(held);
    l->drain_events();
    auto u = l->update_calibration("p0", {win(2, 300, 400)}, t0_ns);
    ASSERT_TRUE(u);
    EXPECT_EQ(u->displaced, 1U);
    const auto h = l->status("a", held->id);
    EXPECT_EQ(h->state, res_state::displaced);
    EXPECT_NE(h->reason.find("calibration"), std::string::npos);
    EXPECT_EQ(l->commit("a", held->id, held->fencing_token, {}, t0_ns).err().reason,
              reason::calibration_changed);
    bool saw = false;
    for (const event& e : l->drain_events()) {
        saw = saw || (e.type == "displaced" && e.reservation_id == held->id && e.tenant == "a");
    }
    EXPECT_TRUE(saw);
    EXPECT_INVARIANTS(*l);
}

TEST(calibration, replace_displaces_when_no_slot_is_left_before_the_deadline) {
    auto l = pushed();
    ASSERT_TRUE(l->update_calibration("p0", {win(1, 100, 200)}, t0_ns));
    auto a = l->reserve("a", on("p0", 10, t0_ns + 250 * s_ns), "", 0, t0_ns);
    ASSERT_TRUE(a);
    auto u = l->update_calibration("p0", {win(2, 300, 400)}, t0_ns);
    ASSERT_TRUE(u);
    EXPECT_EQ(u->displaced, 1U);
    const auto r = l->status("a", a->id);
    EXPECT_EQ(r->state, res_state::displaced);
    EXPECT_NE(r->reason.find("no other slot"), std::string::npos);
    EXPECT_INVARIANTS(*l);
}

TEST(calibration, fidelity_drop_counts_as_a_change) {
    auto l = pushed();
    ASSERT_TRUE(l->update_calibration("p0", {win(1, 100, 200, 0.99)}, t0_ns));
    request r = on("p0", 10);
    r.min_fidelity = 0.95;
    auto a = l->reserve("a", r, "", 0, t0_ns);
    ASSERT_TRUE(a);
    auto u = l->update_calibration("p0", {win(1, 100, 200, 0.90), win(2, 300, 400, 0.99)}, t0_ns);
    ASSERT_TRUE(u);
    EXPECT_EQ(u->replaced, 1U);
    EXPECT_EQ(l->status("a", a->id)->calibration_id, 2U);
    EXPECT_INVARIANTS(*l);
}

TEST(calibration, a_gang_moves_or_fails_as_one) {
    auto l = pushed();
    ASSERT_TRUE(l->update_calibration("p0", {win(1, 100, 200), win(2, 300, 400)}, t0_ns));
    ASSERT_TRUE(l->update_calibration("p1", {win(7, 100, 200), win(8, 300, 400)}, t0_ns));
    auto g = l->reserve_gang("a", req(10), 2, "", 0, t0_ns);
    ASSERT_TRUE(g);
    ASSERT_EQ((*g)[0].start_ns, t0_ns + 100 * s_ns);
    // Only p0's first window goes away; p1's member must move too.
    auto u = l->update_calibration("p0", {win(2, 300, 400)}, t0_ns);
    ASSERT_TRUE(u);
    const auto m0 = l->status("a", (*g)[0].id);
    const auto m1 = l->status("a", (*g)[1].id);
    EXPECT_EQ(m0->start_ns, t0_ns + 300 * s_ns);
    EXPECT_EQ(m1->start_ns, t0_ns + 300 * s_ns);
    EXPECT_EQ(m0->state, res_state::held);
    EXPECT_INVARIANTS(*l);
    // Now nothing common is left: both are displaced.
    ASSERT_TRUE(l->update_calibration("p1", {win(7, 100, 200)}, t0_ns));
    EXPECT_EQ(l->status("a", (*g)[0].id)->state, res_state::displaced);
    EXPECT_EQ(l->status("a", (*g)[1].id)->state, res_state::displaced);
    EXPECT_INVARIANTS(*l);
}

TEST(calibration, dispatched_jobs_are_left_to_the_dispatcher_guard) {
    auto l = pushed();
    ASSERT_TRUE(l->update_calibration("p0", {win(1, 100, 200)}, t0_ns));
    auto a = l->submit("a", on("p0", 10), "", {1}, t0_ns);
    ASSERT_TRUE(a);
    ASSERT_TRUE(l->mark_dispatched(a->id, a->start_ns));
    auto u = l->update_calibration("p0", {win(2, 300, 400)}, a->start_ns + 1);
    ASSERT_TRUE(u);
    EXPECT_EQ(l->status("a", a->id)->state, res_state::dispatched);
    EXPECT_INVARIANTS(*l);
    ASSERT_TRUE(l->complete(a->id, {}, a->start_ns + 5 * s_ns));
    EXPECT_INVARIANTS(*l);
}

TEST(calibration, a_job_whose_frame_is_going_out_is_left_in_place_and_the_others_move) {
    // The update goes through the dispatch gate as a cancel does: a's frame
    // is on its way (the take is refused), b is withdrawn in time.  a stays
    // where it is and is then marked dispatched; b is re-placed.
    auto l = pushed();
    ASSERT_TRUE(l->update_calibration("p0", {win(1, 100, 200)}, t0_ns));
    auto a = l->submit("t", on("p0", 10), "", {1}, t0_ns);
    auto b = l->submit("t", on("p0", 10), "", {2}, t0_ns);
    ASSERT_TRUE(a && b);
    std::vector<std::uint64_t> asked;
    ledger::dispatch_gate gate;
    gate.withdraw = [&](std::uint64_t id) {
        asked.push_back(id);
        return id != a->id;
    };
    l->set_dispatch_gate(gate);
    auto u = l->update_calibration("p0", {win(2, 300, 400)}, t0_ns);
    ASSERT_TRUE(u) << u.err().message;
    EXPECT_EQ(asked, (std::vector<std::uint64_t>{a->id, b->id}));
    EXPECT_EQ(u->replaced, 1U);
    const auto sa = l->status("t", a->id);
    EXPECT_EQ(sa->state, res_state::committed);
    EXPECT_EQ(sa->start_ns, a->start_ns) << "never re-placed while its frame goes out";
    EXPECT_EQ(sa->calibration_id, 1U);
    const auto sb = l->status("t", b->id);
    EXPECT_EQ(sb->calibration_id, 2U);
    EXPECT_GE(sb->start_ns, t0_ns + 300 * s_ns);
    EXPECT_EQ(l->stats().calibration_pinned, 1U);
    EXPECT_INVARIANTS(*l);
    // What happened on the wire decides a's outcome.
    ASSERT_TRUE(l->mark_dispatched(a->id, a->start_ns));
    ASSERT_TRUE(l->complete(a->id, {}, a->start_ns + 11 * s_ns));
    EXPECT_EQ(l->status("t", a->id)->state, res_state::completed);
}

}  // namespace
}  // namespace qrt::timeline
