// The protocol's one table (qrt/proto/protocol.hpp, generated from
// agent/proto/protocol.toml): what every client relies on.

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "qrt/proto/protocol.hpp"

using namespace qrt::proto;

TEST(proto_reasons, every_reason_is_unique_and_every_code_is_standard_or_application_range) {
    std::set<std::string_view> names;
    for (const auto& e : reasons) {
        EXPECT_TRUE(names.insert(e.name).second) << "duplicate reason " << e.name;
        EXPECT_TRUE(e.error || e.outcome != outcome_kind::none) << e.name << " is neither an error nor an outcome";
        if (!e.error) {
            continue;
        }
        const bool standard = e.code == code_parse_error || e.code == code_invalid_request ||
                              e.code == code_method_not_found || e.code == code_invalid_params ||
                              e.code == code_internal_error;
        const bool app = e.code >= code_app_first && e.code <= code_app_last;
        EXPECT_TRUE(standard || app) << e.name << " has code " << e.code;
        EXPECT_GT(e.exit_code, 0) << e.name;
        EXPECT_FALSE(e.meaning.empty()) << e.name;
    }
    for (const auto& e : client_reasons) {
        EXPECT_TRUE(names.insert(e.name).second) << "client reason " << e.name << " shadows another";
    }
}

TEST(proto_reasons, the_ledger_reasons_are_errors_in_the_application_range) {
    for (const char* r : {"no_fit", "lease_expired", "not_owner", "calibration_changed", "unknown_qpu",
                          "invalid_argument", "permission_denied", "overloaded", "not_found", "illegal_transition",
                          "bad_fencing_token", "unavailable", "duplicate", "not_ready", "store_error",
                          "quota_exceeded", "endpoint_down"}) {
        const auto* e = find_reason(r);
        ASSERT_NE(e, nullptr) << r;
        EXPECT_GE(e->code, code_app_first) << r;
        EXPECT_LE(e->code, code_app_last) << r;
    }
}

TEST(proto_reasons, unlisted_reasons_get_the_pass_through_code_and_exit_one) {
    EXPECT_EQ(code_for_reason("some_future_reason"), code_unlisted_reason);
    EXPECT_EQ(exit_code_for_reason("some_future_reason"), 1);
    EXPECT_EQ(code_for_reason("permission_denied"), -32000);
    EXPECT_EQ(default_reason_for_code(code_parse_error), reason::parse_error);
    EXPECT_EQ(default_reason_for_code(-32003), reason::no_fit);
    // An outcome reason is not raised: it has no code of its own.
    EXPECT_EQ(code_for_reason(reason::endpoint_stalled), code_unlisted_reason);
    EXPECT_NE(find_outcome(reason::endpoint_stalled), nullptr);
    EXPECT_EQ(find_outcome(reason::no_fit), nullptr);
    // The client's own reasons have exit statuses too.
    EXPECT_EQ(exit_code_for_reason(client_reason::timeout), 75);
}

TEST(proto_reasons, every_wire_error_maps_to_an_outcome_reason) {
    for (const auto& w : wire_errors) {
        if (w.status == 0) {
            continue;
        }
        const auto* o = find_outcome(w.outcome);
        ASSERT_NE(o, nullptr) << "wire error " << w.name << " -> " << w.outcome;
        EXPECT_EQ(o->outcome, outcome_kind::failed) << w.name;
    }
}

TEST(proto_states, the_job_ending_states_are_the_ones_a_client_waits_for) {
    std::set<std::string_view> finishing;
    for (const auto& s : states) {
        if (s.finishes_job) {
            finishing.insert(s.name);
        }
    }
    EXPECT_EQ(finishing, (std::set<std::string_view>{"completed", "failed", "missed", "sent"}));
    EXPECT_TRUE(is_active(state::held) && is_active(state::committed) && is_active(state::dispatched));
    EXPECT_TRUE(is_terminal(state::sent) && is_terminal(state::displaced));
}

TEST(proto_states, names_round_trip_and_transitions_follow_the_table) {
    for (std::size_t i = 0; i < states.size(); ++i) {
        const auto s = static_cast<state>(i);
        ASSERT_EQ(state_from_string(to_string(s)), s);
    }
    EXPECT_FALSE(state_from_string("no_such_state").has_value());
    EXPECT_TRUE(transition_allowed(state::committed, state::dispatched));
    EXPECT_TRUE(transition_allowed(state::dispatched, state::sent));
    EXPECT_FALSE(transition_allowed(state::held, state::dispatched));
    for (std::size_t i = 0; i < states.size(); ++i) {
        for (std::size_t j = 0; j < states.size(); ++j) {
            if (is_terminal(static_cast<state>(i))) {
                EXPECT_FALSE(transition_allowed(static_cast<state>(i), static_cast<state>(j)))
                    << states[i].name << " is terminal";
            }
        }
    }
}

TEST(proto_methods, every_method_names_its_role_and_events_are_known) {
    EXPECT_EQ(method_role(method::jobs_submit), role::scheduler);
    EXPECT_EQ(method_role(method::calibration_update), role::calibration);
    EXPECT_EQ(method_role(method::agent_hello), role::none);
    EXPECT_FALSE(method_role("jobs.teleport").has_value());
    EXPECT_TRUE(is_event(event::job_finished));
    EXPECT_EQ(role_name(role::admin), "admin");
    EXPECT_EQ(role_from_name("scheduler"), role::scheduler);
}
