// The hand-over table, table-tested: every (state, event) pair from the
// state diagram in qrt/handover/handover_table.hpp, the ones it makes and
// the ones it refuses (refused: changes nothing, says why), and its bounds.

#include "qrt/handover/handover_table.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace {

using qrt::dispatch::arm_event;
using qrt::handover::arm_state;
using qrt::handover::handover_table;
using qrt::handover::job_state;
using qrt::handover::refusal;

constexpr std::uint64_t k_id = 7;

// The states a job can be in, each reached from an empty table by the
// transitions the pump and the loop make.
enum class start { none, claimed, handed, refused, withdrawn_by_pump, withdrawn_by_gate, withheld,
                   withheld_from_released, released };

const char* name(start s) {
    switch (s) {
        case start::none: return "none";
        case start::claimed: return "claimed";
        case start::handed: return "handed";
        case start::refused: return "refused";
        case start::withdrawn_by_pump: return "withdrawn_by_pump";
        case start::withdrawn_by_gate: return "withdrawn_by_gate";
        case start::withheld: return "withheld";
        case start::withheld_from_released: return "withheld_from_released";
        case start::released: return "released";
    }
    return "?";
}

handover_table table_in(start s) {
    handover_table t(16);
    t.reserve(16);
    const auto must = [](refusal r) { EXPECT_EQ(r, refusal::none) << qrt::handover::to_string(r); };
    switch (s) {
        case start::none: break;
        case start::claimed: must(t.claim(k_id, 100, 1)); break;
        case start::handed: must(t.claim(k_id, 100, 1)); must(t.hand(k_id)); break;
        case start::refused: must(t.claim(k_id, 100, 1)); must(t.refuse(k_id)); break;
        case start::withdrawn_by_pump:
            must(t.claim(k_id, 100, 1)); must(t.hand(k_id)); must(t.withdraw(k_id, false)); break;
        case start::withdrawn_by_gate:
            must(t.claim(k_id, 100, 1)); must(t.hand(k_id)); must(t.withdraw(k_id, true)); break;
        case start::withheld: must(t.withhold(k_id)); break;
        case start::withheld_from_released:
            must(t.claim(k_id, 100, 1)); must(t.hand(k_id)); must(t.release(k_id)); must(t.withhold(k_id)); break;
        case start::released: must(t.claim(k_id, 100, 1)); must(t.hand(k_id)); must(t.release(k_id)); break;
    }
    return t;
}

enum class event { claim, hand, refuse, withdraw_by_pump, withdraw_by_gate, restore, withhold, release };

const char* name(event e) {
    switch (e) {
        case event::claim: return "claim";
        case event::hand: return "hand";
        case event::refuse: return "refuse";
        case event::withdraw_by_pump: return "withdraw_by_pump";
        case event::withdraw_by_gate: return "withdraw_by_gate";
        case event::restore: return "restore";
        case event::withhold: return "withhold";
        case event::release: return "release";
    }
    return "?";
}

refusal apply(handover_table& t, event e) {
    switch (e) {
        case event::claim: return t.claim(k_id, 200, 2);
        case event::hand: return t.hand(k_id);
        case event::refuse: return t.refuse(k_id);
        case event::withdraw_by_pump: return t.withdraw(k_id, false);
        case event::withdraw_by_gate: return t.withdraw(k_id, true);
        case event::restore: return t.restore(k_id);
        case event::withhold: return t.withhold(k_id);
        case event::release: return t.release(k_id);
    }
    return refusal::none;
}

struct row {
    start from;
    event what;
    refusal expect;
    std::optional<job_state> after;  // nullopt: no entry
    bool by_gate_after = false;
};

std::optional<job_state> state_of(const handover_table& t) {
    const auto* e = t.find(k_id);
    return e ? std::optional<job_state>(e->state) : std::nullopt;
}

// The state a start leaves the job in (for refused rows: unchanged).
std::optional<job_state> state_of(start s) { return state_of(table_in(s)); }

std::vector<row> every_pair() {
    using js = job_state;
    const std::vector<start> all{start::none, start::claimed, start::handed, start::refused,
                                 start::withdrawn_by_pump, start::withdrawn_by_gate, start::withheld,
                                 start::withheld_from_released, start::released};
    std::vector<row> rows;
    for (const auto s : all) {
        const auto same = state_of(s);
        const bool gate_before = s == start::withdrawn_by_gate || s == start::withheld ||
                                 s == start::withheld_from_released;
        const auto refused = [&](event e, refusal r) { rows.push_back({s, e, r, same, gate_before}); };
        const auto unknown_or_wrong = [&](event e) {
            refused(e, s == start::none ? refusal::unknown_job : refusal::wrong_state);
        };
        // claim: only a job with no entry.
        if (s == start::none) {
            rows.push_back({s, event::claim, refusal::none, js::claimed});
        } else {
            refused(event::claim, refusal::already_decided);
        }
        // hand, refuse: only a claimed job.
        if (s == start::claimed) {
            rows.push_back({s, event::hand, refusal::none, js::handed});
            rows.push_back({s, event::refuse, refusal::none, js::refused});
        } else {
            unknown_or_wrong(event::hand);
            unknown_or_wrong(event::refuse);
        }
        // withdraw: only a handed job.
        if (s == start::handed) {
            rows.push_back({s, event::withdraw_by_pump, refusal::none, js::withdrawn, false});
            rows.push_back({s, event::withdraw_by_gate, refusal::none, js::withdrawn, true});
        } else {
            unknown_or_wrong(event::withdraw_by_pump);
            unknown_or_wrong(event::withdraw_by_gate);
        }
        // restore: the gate's withdrawal or hold.
        switch (s) {
            case start::withdrawn_by_gate: rows.push_back({s, event::restore, refusal::none, js::handed}); break;
            case start::withdrawn_by_pump: refused(event::restore, refusal::not_by_gate); break;
            case start::withheld: rows.push_back({s, event::restore, refusal::none, std::nullopt}); break;
            case start::withheld_from_released:
                rows.push_back({s, event::restore, refusal::none, js::released});
                break;
            default: unknown_or_wrong(event::restore); break;
        }
        // withhold: a job the link does not hold.
        switch (s) {
            case start::none:
            case start::released: rows.push_back({s, event::withhold, refusal::none, js::withheld, true}); break;
            case start::withheld:
            case start::withheld_from_released:
                rows.push_back({s, event::withhold, refusal::none, js::withheld, true});
                break;
            default: refused(event::withhold, refusal::wrong_state); break;
        }
        // release: a job the link held or the pump refused.
        switch (s) {
            case start::handed:
            case start::refused:
            case start::withdrawn_by_pump:
            case start::withdrawn_by_gate:
                rows.push_back({s, event::release, refusal::none, js::released, gate_before});
                break;
            default: unknown_or_wrong(event::release); break;
        }
    }
    return rows;
}

TEST(handover_table, every_state_and_event_pair_is_made_or_refused_as_the_diagram_says) {
    const auto rows = every_pair();
    EXPECT_EQ(rows.size(), 9U * 8U) << "one row per (state, event) pair";
    for (const auto& r : rows) {
        SCOPED_TRACE(std::string(name(r.from)) + " --" + name(r.what) + "-->");
        auto t = table_in(r.from);
        const auto size_before = t.size();
        EXPECT_EQ(apply(t, r.what), r.expect) << qrt::handover::to_string(apply(t, r.what));
        const auto after = state_of(t);
        ASSERT_EQ(after.has_value(), r.after.has_value());
        if (after) {
            EXPECT_EQ(*after, *r.after) << qrt::handover::to_string(*after);
            EXPECT_EQ(t.find(k_id)->by_gate, r.by_gate_after);
        }
        if (r.expect != refusal::none) {
            EXPECT_EQ(t.size(), size_before) << "a refused transition changes nothing";
        }
    }
}

TEST(handover_table, a_claim_keeps_the_start_and_calibration_it_was_handed_with) {
    auto t = table_in(start::handed);
    ASSERT_NE(t.find(k_id), nullptr);
    EXPECT_EQ(t.find(k_id)->start_ns, 100);
    EXPECT_EQ(t.find(k_id)->calibration_id, 1U);
    EXPECT_EQ(t.in_flight(), 1U);
    ASSERT_EQ(t.withdraw(k_id, false), refusal::none);
    EXPECT_EQ(t.in_flight(), 1U) << "withdrawn: its record is still to come";
    ASSERT_EQ(t.release(k_id), refusal::none);
    EXPECT_EQ(t.in_flight(), 0U);
}

TEST(handover_table, a_publish_ends_every_hold_and_nothing_else) {
    for (const auto s : {start::claimed, start::handed, start::refused, start::withdrawn_by_pump,
                         start::withdrawn_by_gate, start::released, start::withheld,
                         start::withheld_from_released}) {
        SCOPED_TRACE(name(s));
        auto t = table_in(s);
        const auto before = state_of(t);
        t.on_publish();
        if (s == start::withheld || s == start::withheld_from_released) {
            EXPECT_EQ(t.find(k_id), nullptr);
        } else {
            EXPECT_EQ(state_of(t), before);
        }
    }
}

TEST(handover_table, a_released_job_is_forgotten_only_with_a_plan_published_after_its_release) {
    handover_table t(16);
    t.reserve(16);
    const auto first = t.on_publish();
    ASSERT_EQ(t.claim(k_id, 100, 1), refusal::none);
    ASSERT_EQ(t.hand(k_id), refusal::none);
    ASSERT_EQ(t.release(k_id), refusal::none);
    EXPECT_EQ(t.released_unpublished(), 1U);
    // The plan published before the release may still hold the job as it
    // was: taking it forgets nothing, so the job is not handed again from it.
    t.forget_released(first);
    ASSERT_NE(t.find(k_id), nullptr);
    EXPECT_EQ(t.claim(k_id, 100, 1), refusal::already_decided);
    const auto second = t.on_publish();
    EXPECT_EQ(t.released_unpublished(), 0U);
    t.forget_released(second);
    EXPECT_EQ(t.find(k_id), nullptr);
    EXPECT_EQ(t.claim(k_id, 300, 2), refusal::none) << "re-placed: handed over again from the new plan";
}

TEST(handover_table, a_restored_hold_on_a_released_job_keeps_its_release) {
    handover_table t(16);
    t.reserve(16);
    ASSERT_EQ(t.claim(k_id, 100, 1), refusal::none);
    ASSERT_EQ(t.hand(k_id), refusal::none);
    ASSERT_EQ(t.release(k_id), refusal::none);
    ASSERT_EQ(t.withhold(k_id), refusal::none);
    ASSERT_EQ(t.restore(k_id), refusal::none);
    ASSERT_NE(t.find(k_id), nullptr);
    EXPECT_EQ(t.find(k_id)->state, job_state::released);
    t.forget_released(t.on_publish());
    EXPECT_EQ(t.find(k_id), nullptr);
}

TEST(handover_table, the_pump_never_grows_it_and_it_never_holds_more_than_max_jobs) {
    handover_table t(3);
    EXPECT_FALSE(t.has_room()) << "no storage reserved by the loop yet";
    EXPECT_EQ(t.claim(1, 100, 1), refusal::full);
    EXPECT_EQ(t.size(), 0U);
    t.reserve(100);  // capped at max_jobs
    EXPECT_EQ(t.claim(1, 100, 1), refusal::none);
    EXPECT_EQ(t.claim(2, 100, 1), refusal::none);
    EXPECT_EQ(t.withhold(3), refusal::none);
    EXPECT_FALSE(t.has_room());
    EXPECT_EQ(t.claim(4, 100, 1), refusal::full);
    EXPECT_EQ(t.withhold(5), refusal::full) << "the gate's change is refused, the table not grown";
    EXPECT_EQ(t.size(), 3U);
    EXPECT_EQ(t.max_jobs(), 3U);
}

TEST(handover_table, entries_stay_sorted_by_id_whatever_the_order_of_claims) {
    handover_table t(16);
    t.reserve(16);
    for (const std::uint64_t id : {5U, 1U, 9U, 3U}) {
        ASSERT_EQ(t.claim(id, 100, 1), refusal::none);
    }
    std::vector<std::uint64_t> ids;
    for (const auto& e : t.entries()) {
        ids.push_back(e.id);
    }
    EXPECT_EQ(ids, (std::vector<std::uint64_t>{1, 3, 5, 9}));
    EXPECT_EQ(t.count(job_state::claimed), 4U);
}

// ---- the arm column (wire version 2) ----

const char* name(arm_event e) {
    switch (e) {
        case arm_event::arm_sent: return "arm_sent";
        case arm_event::armed: return "armed";
        case arm_event::unarmed: return "unarmed";
        case arm_event::fired: return "fired";
    }
    return "?";
}

// Brings a job in start s to arm state a by the link's own steps; false
// when no such path exists (only a job the link holds is ever armed).
bool arm_to(handover_table& t, start s, arm_state a) {
    if (a == arm_state::none) {
        return true;
    }
    const bool withdrawn = s == start::withdrawn_by_pump || s == start::withdrawn_by_gate;
    if (s != start::handed && !withdrawn) {
        return false;
    }
    // Arm while handed, then withdraw as the start says (a fired job is
    // only ever fired while handed).
    handover_table fresh(16);
    fresh.reserve(16);
    const auto must = [](refusal r) { EXPECT_EQ(r, refusal::none) << qrt::handover::to_string(r); };
    must(fresh.claim(k_id, 100, 1));
    must(fresh.hand(k_id));
    must(fresh.on_arm(k_id, arm_event::arm_sent));
    if (a != arm_state::arming) {
        must(fresh.on_arm(k_id, arm_event::armed));
    }
    if (a == arm_state::fired) {
        must(fresh.on_arm(k_id, arm_event::fired));
    }
    if (withdrawn) {
        must(fresh.withdraw(k_id, s == start::withdrawn_by_gate));
    }
    t = fresh;
    return true;
}

TEST(handover_table, every_arm_state_and_arm_event_pair_is_made_or_refused_as_the_diagram_says) {
    // The diagram's arm column, written out: (arm state, event) -> after,
    // for a job the link holds; nullopt: refused.  fired is made from a
    // handed job only (a withdrawn one is never fired).
    struct rule {
        arm_state from;
        arm_event what;
        std::optional<arm_state> after;
    };
    const std::vector<rule> made{
        {arm_state::none, arm_event::arm_sent, arm_state::arming},
        {arm_state::arming, arm_event::armed, arm_state::armed},
        {arm_state::arming, arm_event::unarmed, arm_state::none},
        {arm_state::armed, arm_event::unarmed, arm_state::none},
        {arm_state::armed, arm_event::fired, arm_state::fired},
    };
    const std::vector<start> all{start::none, start::claimed, start::handed, start::refused,
                                 start::withdrawn_by_pump, start::withdrawn_by_gate, start::withheld,
                                 start::withheld_from_released, start::released};
    std::size_t pairs = 0, made_n = 0;
    for (const auto s : all) {
        for (const auto a : {arm_state::none, arm_state::arming, arm_state::armed, arm_state::fired}) {
            auto base = table_in(s);
            if (!arm_to(base, s, a)) {
                continue;
            }
            for (const auto e : {arm_event::arm_sent, arm_event::armed, arm_event::unarmed, arm_event::fired}) {
                SCOPED_TRACE(std::string(name(s)) + "/" + std::string(qrt::handover::to_string(a)) + " --" +
                             name(e) + "-->");
                ++pairs;
                auto t = base;
                const bool held = s == start::handed || s == start::withdrawn_by_pump || s == start::withdrawn_by_gate;
                std::optional<arm_state> want;
                for (const auto& r : made) {
                    if (r.from == a && r.what == e && held && (e != arm_event::fired || s == start::handed)) {
                        want = r.after;
                    }
                }
                const auto before = state_of(t);
                const refusal got = t.on_arm(k_id, e);
                if (want) {
                    ++made_n;
                    EXPECT_EQ(got, refusal::none) << qrt::handover::to_string(got);
                    EXPECT_EQ(t.find(k_id)->arm, *want) << qrt::handover::to_string(t.find(k_id)->arm);
                } else {
                    EXPECT_EQ(got, s == start::none ? refusal::unknown_job : refusal::wrong_state)
                        << qrt::handover::to_string(got);
                    if (const auto* entry = t.find(k_id)) {
                        EXPECT_EQ(entry->arm, a) << "a refused arm event changes nothing";
                    }
                }
                EXPECT_EQ(state_of(t), before) << "an arm event never changes the job's own state";
            }
        }
    }
    // 9 starts at none, handed and both withdrawn ones at arming, armed,
    // fired too: (9 + 3 x 3) x 4 events.
    EXPECT_EQ(pairs, (9U + 9U) * 4U);
    EXPECT_EQ(made_n, 3U * 4U + 1U) << "arm_sent, armed, 2 x unarmed for each held start, fired for handed";
}

TEST(handover_table, a_withdrawn_armed_job_keeps_its_arm_state_through_restore_and_release_clears_it) {
    handover_table t(16);
    t.reserve(16);
    ASSERT_EQ(t.claim(k_id, 100, 1), refusal::none);
    ASSERT_EQ(t.hand(k_id), refusal::none);
    ASSERT_EQ(t.on_arm(k_id, arm_event::arm_sent), refusal::none);
    ASSERT_EQ(t.on_arm(k_id, arm_event::armed), refusal::none);
    EXPECT_EQ(t.count(arm_state::armed), 1U);
    ASSERT_EQ(t.withdraw(k_id, true), refusal::none);
    EXPECT_EQ(t.on_arm(k_id, arm_event::fired), refusal::wrong_state) << "never a FIRE for a withdrawn job";
    ASSERT_EQ(t.restore(k_id), refusal::none);
    EXPECT_EQ(t.find(k_id)->arm, arm_state::armed) << "the gate's change was abandoned: still armed";
    ASSERT_EQ(t.on_arm(k_id, arm_event::fired), refusal::none);
    ASSERT_EQ(t.release(k_id), refusal::none);
    EXPECT_EQ(t.find(k_id)->arm, arm_state::none);
    EXPECT_EQ(t.count(arm_state::fired), 0U);
    // A job armed on a lost connection is armed no more, and armed again after the reconnect.
    ASSERT_EQ(t.claim(k_id + 1, 100, 1), refusal::none);
    ASSERT_EQ(t.hand(k_id + 1), refusal::none);
    ASSERT_EQ(t.on_arm(k_id + 1, arm_event::arm_sent), refusal::none);
    ASSERT_EQ(t.on_arm(k_id + 1, arm_event::armed), refusal::none);
    EXPECT_EQ(t.on_arm(k_id + 1, arm_event::arm_sent), refusal::wrong_state) << "armed already";
    ASSERT_EQ(t.on_arm(k_id + 1, arm_event::unarmed), refusal::none);
    EXPECT_EQ(t.on_arm(k_id + 1, arm_event::fired), refusal::wrong_state) << "never a FIRE for a job not armed";
    ASSERT_EQ(t.on_arm(k_id + 1, arm_event::arm_sent), refusal::none);
    EXPECT_EQ(t.count(arm_state::arming), 1U);
}

TEST(handover_table, every_state_and_refusal_has_a_name) {
    for (const auto s : {job_state::claimed, job_state::handed, job_state::refused, job_state::withdrawn,
                         job_state::withheld, job_state::released}) {
        EXPECT_NE(qrt::handover::to_string(s), "unknown");
    }
    for (const auto a : {arm_state::none, arm_state::arming, arm_state::armed, arm_state::fired}) {
        EXPECT_NE(qrt::handover::to_string(a), "unknown");
    }
    for (const auto r : {refusal::none, refusal::unknown_job, refusal::already_decided, refusal::wrong_state,
                         refusal::not_by_gate, refusal::full}) {
        EXPECT_NE(qrt::handover::to_string(r), "unknown");
    }
}

}  // namespace
