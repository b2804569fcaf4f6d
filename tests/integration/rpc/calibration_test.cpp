// Calibration blocks over the socket (qrtd(8), CALIBRATION BLOCKS): the
// answer of calibration.request, its refusals with nothing stored, the
// announcements (events, qpus.list), the yield request a holder receives,
// and who may place a job inside a block.
#include <cmath>
#include <string>
#include <vector>

#include "rpc_harness.hpp"

using namespace qrt::testing::rpc_harness;

namespace {

// The pushed QPU "qp": window 1 [10 s, 110 s) and window 2 [110 s, 210 s)
// from t0, f0 0.99 and tau 1000 s.
struct calibrated {
    std::int64_t t0 = 0;
    std::int64_t at(std::int64_t s) const { return t0 + s * s_ns; }
};

calibrated push_windows(harness& h, client& c) {
    calibrated cal{h.now()};
    c.ok("calibration.update", {{"qpu", "qp"},
                                {"windows", {{{"calibration_id", 1},
                                              {"valid_from_ns", cal.at(10)},
                                              {"valid_until_ns", cal.at(110)},
                                              {"f0", 0.99},
                                              {"tau_ns", 1000 * s_ns}},
                                             {{"calibration_id", 2},
                                              {"valid_from_ns", cal.at(110)},
                                              {"valid_until_ns", cal.at(210)},
                                              {"f0", 0.99},
                                              {"tau_ns", 1000 * s_ns}}}}});
    return cal;
}

harness_options calibration_service(bool scheduler = true) {
    harness_options o;
    o.roles.calibration = {me()};
    o.roles.reader = {me()};
    if (scheduler) {
        o.roles.scheduler = {me()};
    }
    return o;
}

json ask(const calibrated& cal, std::int64_t duration_s, std::int64_t needed_by_s, const std::string& key,
         std::int64_t urgency = 0) {
    return json{{"qpu", "qp"},
                {"step", "x_amplitude"},
                {"duration_ns", duration_s * s_ns},
                {"needed_by_ns", cal.at(needed_by_s)},
                {"urgency", urgency},
                {"idempotency_key", key}};
}

json job_at(const calibrated& cal, std::int64_t from_s, std::int64_t duration_s, const std::string& key) {
    return json{{"duration_ns", duration_s * s_ns},
                {"not_before_ns", cal.at(from_s)},
                {"deadline_ns", cal.at(from_s + duration_s)},
                {"qpus", {"qp"}},
                {"idempotency_key", key}};
}

// The next event of `type` (others are skipped), or null after a few lines.
json next_event(client& c, const std::string& type) {
    for (int i = 0; i < 32; ++i) {
        const auto line = c.read_json();
        if (!line) {
            return nullptr;
        }
        if (line->value("method", "") == "events.event" && line->at("params").at("type") == type) {
            return line->at("params");
        }
    }
    return nullptr;
}

void housekeeping(harness& h) {
    h.on_loop([&] {
        rpc::ledger_housekeeping(*h.eng, *h.ledger, h.now());
        return 0;
    });
}

json qp_entry(client& c) {
    const json list = c.ok("qpus.list");
    for (const json& q : list.at("qpus")) {
        if (q.at("name") == "qp") {
            return q;
        }
    }
    return nullptr;
}

}  // namespace

TEST(calibration_rpc, a_block_is_granted_announced_started_and_ended) {
    harness h(calibration_service());
    client c(h.socket_path);
    client watcher(h.socket_path);
    watcher.ok("events.subscribe",
               {{"topics", {"calibration.scheduled", "calibration.started", "calibration.ended"}}});
    const calibrated cal = push_windows(h, c);
    const json b = c.ok("calibration.request", ask(cal, 5, 60, "k1", 3));
    EXPECT_EQ(b.at("state"), "scheduled");
    EXPECT_EQ(b.at("start_ns"), cal.at(55));  // the latest start that ends by needed_by
    EXPECT_EQ(b.at("end_ns"), cal.at(60));
    EXPECT_EQ(b.at("step"), "x_amplitude");
    EXPECT_EQ(b.at("urgency"), 3);
    EXPECT_EQ(b.at("calibration_id"), 1);
    EXPECT_EQ(b.at("yielding"), json::array());
    EXPECT_NEAR(b.at("predicted_fidelity_at_start").get<double>(), 0.99 * std::exp(-45.0 / 1000.0), 1e-9);
    EXPECT_NEAR(b.at("predicted_fidelity_at_needed_by").get<double>(), 0.99 * std::exp(-50.0 / 1000.0), 1e-9);
    // The same key returns it; the announcement, the list and qpus.list.
    EXPECT_EQ(c.ok("calibration.request", ask(cal, 5, 60, "k1", 3)).at("block_id"), b.at("block_id"));
    const json scheduled = next_event(watcher, "calibration.scheduled");
    ASSERT_FALSE(scheduled.is_null());
    EXPECT_EQ(scheduled.at("data").at("block").at("block_id"), b.at("block_id"));
    EXPECT_EQ(scheduled.at("data").at("qpu"), "qp");
    const json listed = c.ok("calibration.blocks", {{"qpu", "qp"}}).at("blocks");
    ASSERT_EQ(listed.size(), 1U);
    EXPECT_EQ(listed[0].at("block_id"), b.at("block_id"));
    json q = qp_entry(c);
    EXPECT_EQ(q.at("calibration_block").at("block_id"), b.at("block_id"));
    EXPECT_EQ(q.at("calibrating"), false);
    // slots.query offers nothing inside it.
    json probe = job_at(cal, 54, 2, "");
    probe.erase("idempotency_key");
    probe["deadline_ns"] = cal.at(61);
    const json none = c.ok("slots.query", probe);
    EXPECT_TRUE(none.at("candidates").empty()) << none.dump();
    EXPECT_NE(none.at("why_none").get<std::string>().find("calibration block"), std::string::npos) << none.dump();
    // Its start, then its end.
    h.skew_ns += 56 * s_ns;
    housekeeping(h);
    const json started = next_event(watcher, "calibration.started");
    ASSERT_FALSE(started.is_null());
    EXPECT_EQ(started.at("data").at("state"), "started");
    EXPECT_EQ(qp_entry(c).at("calibrating"), true);
    h.skew_ns += 5 * s_ns;
    housekeeping(h);
    const json ended = next_event(watcher, "calibration.ended");
    ASSERT_FALSE(ended.is_null());
    EXPECT_EQ(ended.at("data").at("block").at("state"), "ended");
    q = qp_entry(c);
    EXPECT_TRUE(q.at("calibration_block").is_null());
    EXPECT_EQ(q.at("calibrating"), false);
    EXPECT_TRUE(h.on_loop([&] { return h.ledger->check_invariants(); }).empty());
}

TEST(calibration_rpc, a_request_that_cannot_meet_needed_by_carries_the_earliest_block_and_the_fidelity) {
    harness h(calibration_service());
    client c(h.socket_path);
    const calibrated cal = push_windows(h, c);
    json full = job_at(cal, 10, 100, "full");
    full["payload"] = rpc::base64_encode("x");
    c.ok("jobs.submit", full);
    const json r = c.call("calibration.request", ask(cal, 10, 100, "late"));
    ASSERT_EQ(reason_of(r), rpc::reason::no_fit) << r.dump();
    const json& data = r.at("error").at("data");
    EXPECT_EQ(data.at("cause"), "needed_by");
    EXPECT_EQ(data.at("needed_by_ns"), cal.at(100));
    EXPECT_EQ(data.at("earliest").at("start_ns"), cal.at(110));
    EXPECT_EQ(data.at("earliest").at("end_ns"), cal.at(120));
    EXPECT_EQ(data.at("earliest").at("calibration_id"), 2);
    EXPECT_NEAR(data.at("predicted_fidelity_at_needed_by").get<double>(), 0.99 * std::exp(-90.0 / 1000.0), 1e-9);
    EXPECT_NE(r.at("error").at("message").get<std::string>().find("the earliest block is start_ns"),
              std::string::npos);
    EXPECT_TRUE(c.ok("calibration.blocks").at("blocks").empty());
}

TEST(calibration_rpc, bad_requests_get_a_clear_error_and_nothing_is_stored) {
    {
        harness h(calibration_service());
        client c(h.socket_path);
        const calibrated cal = push_windows(h, c);
        struct bad {
            const char* name;
            json params;
            const char* reason;
            const char* mentions;
        };
        json unknown = ask(cal, 10, 60, "a");
        unknown["qpu"] = "nope";
        json no_key = ask(cal, 10, 60, "a");
        no_key.erase("idempotency_key");
        json stray = ask(cal, 10, 60, "a");
        stray["priority"] = 3;
        const std::vector<bad> cases = {
            {"unknown qpu", unknown, "unknown_qpu", "nope"},
            {"longer than a window", ask(cal, 150, 200, "a"), "invalid_argument", "longest calibration window"},
            {"needed_by in the past", ask(cal, 10, -1, "a"), "deadline_passed", "needed_by_ns"},
            {"no idempotency key", no_key, "invalid_params", "idempotency_key"},
            {"an unknown member", stray, "invalid_params", "priority"},
        };
        for (const bad& b : cases) {
            SCOPED_TRACE(b.name);
            const json r = c.call("calibration.request", b.params);
            EXPECT_EQ(reason_of(r), b.reason) << r.dump();
            EXPECT_NE(r.at("error").at("message").get<std::string>().find(b.mentions), std::string::npos)
                << r.dump();
            EXPECT_TRUE(c.ok("calibration.blocks").at("blocks").empty());
        }
    }
    // A caller without the calibration role.
    harness_options o;
    o.roles.scheduler = {me()};
    harness h(o);
    client c(h.socket_path);
    const calibrated cal{h.now()};
    const json r = c.call("calibration.request", ask(cal, 10, 60, "a"));
    EXPECT_EQ(reason_of(r), rpc::reason::permission_denied) << r.dump();
    EXPECT_NE(r.at("error").at("message").get<std::string>().find("calibration.request"), std::string::npos);
    EXPECT_TRUE(c.ok("calibration.blocks").at("blocks").empty());
    EXPECT_TRUE(h.on_loop([&] { return h.ledger->blocks(); }).empty());
}

// The only room before needed_by is where a held reservation sits: its
// holder hears reservation.yield_requested (block, deadline, the nearest
// free start); it releases and the block is scheduled.
TEST(calibration_rpc, the_holder_is_asked_to_yield_and_releasing_clears_the_block) {
    harness h(calibration_service());
    client c(h.socket_path);
    client watcher(h.socket_path);
    // calibration.scheduled (the block placed, yielding) comes first and is
    // passed over; the one after the release says scheduled.
    watcher.ok("events.subscribe", {{"topics", {"reservation.yield_requested", "calibration.scheduled"}}});
    const calibrated cal = push_windows(h, c);
    json a = job_at(cal, 70, 40, "a");
    a["payload"] = rpc::base64_encode("x");
    c.ok("jobs.submit", a);
    json hold = job_at(cal, 10, 60, "h");
    hold.erase("deadline_ns");
    hold["lease_ns"] = 120 * s_ns;
    const json held = c.ok("slots.reserve", hold);
    ASSERT_EQ(held.at("start_ns"), cal.at(10));
    const json b = c.ok("calibration.request", ask(cal, 10, 80, "y"));
    EXPECT_EQ(b.at("state"), "yielding");
    EXPECT_EQ(b.at("start_ns"), cal.at(60));
    EXPECT_EQ(b.at("yielding"), json::array({held.at("reservation_id")}));
    const json yield = next_event(watcher, "reservation.yield_requested");
    ASSERT_FALSE(yield.is_null());
    const json& d = yield.at("data");
    EXPECT_EQ(d.at("reservation_id"), held.at("reservation_id"));
    EXPECT_EQ(d.at("block").at("block_id"), b.at("block_id"));
    EXPECT_EQ(d.at("deadline_ns"), b.at("yield_deadline_ns"));
    EXPECT_EQ(d.at("free_start_ns"), cal.at(110));
    EXPECT_EQ(d.at("at_deadline"), "keep");
    c.ok("slots.release", {{"reservation_id", held.at("reservation_id")},
                           {"fencing_token", held.at("fencing_token")}});
    housekeeping(h);
    const json cleared = next_event(watcher, "calibration.scheduled");
    ASSERT_FALSE(cleared.is_null());
    EXPECT_EQ(cleared.at("data").at("block").at("state"), "scheduled");
    EXPECT_TRUE(h.on_loop([&] { return h.ledger->check_invariants(); }).empty());
}

// Only the calibration role places a job inside a block; the block's own
// service does, and its job runs there.
TEST(calibration_rpc, only_the_calibration_role_places_jobs_into_its_block) {
    harness h(calibration_service());
    client c(h.socket_path);
    const calibrated cal = push_windows(h, c);
    const json b = c.ok("calibration.request", ask(cal, 10, 60, "k"));
    json in = job_at(cal, 0, 2, "e1");
    in.erase("deadline_ns");
    in["block_id"] = b.at("block_id");
    in["payload"] = rpc::base64_encode("x");
    const json job = c.ok("jobs.submit", in);
    EXPECT_EQ(job.at("start_ns"), b.at("start_ns"));
    EXPECT_EQ(job.at("block_id"), b.at("block_id"));
    // A scheduler without the calibration role.
    harness_options o;
    o.roles.scheduler = {me()};
    harness h2(o);
    client s(h2.socket_path);
    json other = in;
    other["idempotency_key"] = "e2";
    const json refused = s.call("jobs.submit", other);
    EXPECT_EQ(reason_of(refused), rpc::reason::permission_denied) << refused.dump();
    EXPECT_EQ(refused.at("error").at("data").at("field"), "block_id");
}

namespace {

// The same block as above, with a holder that neither releases nor moves
// by the deadline: what the holder and every subscriber hear, under
// timeline.calibration_preempt = `preempt`.
struct unyielding {
    json held;   // the holder's reservation (slots.reserve's answer)
    json block;  // calibration.request's answer
    json yield;  // the holder's reservation.yield_requested
};

unyielding holder_does_not_yield(harness& h, client& c, client& watcher) {
    watcher.ok("events.subscribe", {{"topics",
                                     {"reservation.yield_requested", "reservation.displaced",
                                      "calibration.scheduled", "calibration.ended"}}});
    const calibrated cal = push_windows(h, c);
    json a = job_at(cal, 70, 40, "a");
    a["payload"] = rpc::base64_encode("x");
    c.ok("jobs.submit", a);
    // Held [15 s, 70 s): the 5 s free before it are too few, so the block
    // goes where it sits, and the yield deadline (10 s from now) comes
    // before its start.
    json hold = job_at(cal, 15, 55, "h");
    hold.erase("deadline_ns");
    hold["lease_ns"] = 200 * s_ns;
    unyielding u;
    u.held = c.ok("slots.reserve", hold);
    EXPECT_EQ(u.held.at("start_ns"), cal.at(15));
    // Urgency 3 above the reservation's priority 0: revocable under "held".
    u.block = c.ok("calibration.request", ask(cal, 10, 80, "y", 3));
    EXPECT_EQ(u.block.at("state"), "yielding");
    EXPECT_EQ(u.block.at("start_ns"), cal.at(60));
    EXPECT_EQ(u.block.at("yielding"), json::array({u.held.at("reservation_id")}));
    u.yield = next_event(watcher, "reservation.yield_requested");
    EXPECT_FALSE(u.yield.is_null());
    // The deadline passes with the reservation still held (its lease kept).
    c.ok("slots.heartbeat", {{"reservation_id", u.held.at("reservation_id")},
                             {"fencing_token", u.held.at("fencing_token")}});
    h.skew_ns += u.block.at("yield_deadline_ns").get<std::int64_t>() - h.now() + s_ns;
    housekeeping(h);
    return u;
}

harness_options preempting(tl::calibration_preempt p) {
    harness_options o = calibration_service();
    o.tune_ledger = [p](tl::ledger_options& lo) { lo.calibration_preempt = p; };
    return o;
}

}  // namespace

// Under "never" the holder keeps its reservation (and may still commit it);
// the block fails, and its end names the earliest block there is then.
TEST(calibration_rpc, a_holder_that_does_not_yield_keeps_its_slot_under_never_and_the_block_fails) {
    harness h(preempting(tl::calibration_preempt::never));
    client c(h.socket_path);
    client watcher(h.socket_path);
    const unyielding u = holder_does_not_yield(h, c, watcher);
    ASSERT_FALSE(u.yield.is_null());
    EXPECT_EQ(u.yield.at("data").at("at_deadline"), "keep");
    const json ended = next_event(watcher, "calibration.ended");
    ASSERT_FALSE(ended.is_null());
    const json& b = ended.at("data").at("block");
    EXPECT_EQ(b.at("block_id"), u.block.at("block_id"));
    EXPECT_EQ(b.at("state"), "failed");
    EXPECT_NE(b.at("reason").get<std::string>().find("did not yield"), std::string::npos) << b.dump();
    EXPECT_NE(b.at("reason").get<std::string>().find("the earliest block is start_ns"), std::string::npos)
        << b.dump();
    const json id = u.held.at("reservation_id");
    EXPECT_EQ(c.ok("jobs.status", {{"job_id", id}}).at("state"), "held");
    EXPECT_EQ(c.ok("calibration.blocks", {{"qpu", "qp"}}).at("blocks").at(0).at("state"), "failed");
    // An acknowledged hold stays a promise: it commits in its slot.
    const json committed = c.ok("jobs.submit", {{"reservation_id", id},
                                                {"fencing_token", u.held.at("fencing_token")},
                                                {"payload", rpc::base64_encode("x")}});
    EXPECT_EQ(committed.at("start_ns"), u.held.at("start_ns"));
    EXPECT_TRUE(h.on_loop([&] { return h.ledger->check_invariants(); }).empty());
}

// Under "held" (the block's urgency above the reservation's priority) the
// reservation is revoked at the deadline: its holder hears
// reservation.displaced naming the block, its fencing token is dead, and
// the block is scheduled.
TEST(calibration_rpc, a_holder_that_does_not_yield_is_revoked_under_held_and_its_token_is_dead) {
    harness h(preempting(tl::calibration_preempt::held));
    client c(h.socket_path);
    client watcher(h.socket_path);
    const unyielding u = holder_does_not_yield(h, c, watcher);
    ASSERT_FALSE(u.yield.is_null());
    EXPECT_EQ(u.yield.at("data").at("at_deadline"), "revoke");
    const json id = u.held.at("reservation_id");
    const json displaced = next_event(watcher, "reservation.displaced");
    ASSERT_FALSE(displaced.is_null());
    EXPECT_EQ(displaced.at("data").at("reservation_id"), id);
    const std::string why = displaced.at("data").at("reason").get<std::string>();
    EXPECT_NE(why.find("revoked for calibration block " + u.block.at("block_id").dump()), std::string::npos)
        << displaced.dump();
    const json scheduled = next_event(watcher, "calibration.scheduled");
    ASSERT_FALSE(scheduled.is_null());
    EXPECT_EQ(scheduled.at("data").at("block").at("state"), "scheduled");
    EXPECT_EQ(c.ok("jobs.status", {{"job_id", id}}).at("state"), "displaced");
    // The token is dead: no commit, heartbeat or release with it.
    const json token = u.held.at("fencing_token");
    const json commit = c.call("jobs.submit", {{"reservation_id", id},
                                               {"fencing_token", token},
                                               {"payload", rpc::base64_encode("x")}});
    ASSERT_TRUE(commit.contains("error")) << commit.dump();
    EXPECT_NE(commit.at("error").at("message").get<std::string>().find("revoked"), std::string::npos)
        << commit.dump();
    EXPECT_TRUE(c.call("slots.heartbeat", {{"reservation_id", id}, {"fencing_token", token}}).contains("error"));
    EXPECT_TRUE(c.call("slots.release", {{"reservation_id", id}, {"fencing_token", token}}).contains("error"));
    // The committed job after the block was never touched.
    EXPECT_TRUE(h.on_loop([&] { return h.ledger->check_invariants(); }).empty());
}
