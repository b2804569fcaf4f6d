#include <gtest/gtest.h>

#include <set>
#include <string>

#include "qrt/rpc/errors.hpp"

using namespace qrt::rpc;

TEST(rpc_errors, every_reason_is_unique_and_every_code_is_standard_or_application_range) {
    std::set<std::string_view> reasons;
    for (const auto& e : reason_table) {
        EXPECT_TRUE(reasons.insert(e.reason).second) << "duplicate reason " << e.reason;
        const bool standard = e.code == code_parse_error || e.code == code_invalid_request ||
                              e.code == code_method_not_found || e.code == code_invalid_params ||
                              e.code == code_internal_error;
        const bool app = e.code >= code_app_first && e.code <= code_app_last;
        EXPECT_TRUE(standard || app) << e.reason << " has code " << e.code;
        EXPECT_GT(e.exit_code, 0) << e.reason;
        EXPECT_FALSE(e.meaning.empty()) << e.reason;
    }
}

TEST(rpc_errors, the_ledger_reasons_and_the_issue_reasons_are_listed) {
    for (const char* r : {"no_fit", "lease_expired", "not_owner", "calibration_changed",
                          "unknown_qpu", "invalid_argument", "permission_denied", "overloaded",
                          "not_found", "illegal_transition", "bad_fencing_token", "unavailable",
                          "duplicate", "not_ready", "store_error", "quota_exceeded"}) {
        const auto* e = find_reason(r);
        ASSERT_NE(e, nullptr) << r;
        EXPECT_GE(e->code, code_app_first) << r;
        EXPECT_LE(e->code, code_app_last) << r;
    }
}

TEST(rpc_errors, unlisted_reasons_get_the_pass_through_code_and_exit_one) {
    EXPECT_EQ(code_for_reason("some_future_reason"), code_unlisted_reason);
    EXPECT_EQ(exit_code_for_reason("some_future_reason"), 1);
    EXPECT_EQ(code_for_reason("permission_denied"), -32000);
    EXPECT_EQ(default_reason_for_code(code_parse_error), reason::parse_error);
    EXPECT_EQ(default_reason_for_code(-32003), reason::no_fit);
}
