// Priority ceilings, quotas and the request bucket of [tenants], on made-up
// sessions and a virtual clock (the socket-level tests are in
// tests/integration/rpc/server_test.cpp, rpc_tenants.*).

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "qrt/rpc/tenant_limits.hpp"

using namespace qrt::rpc;

namespace {

session peer(std::string user, uid_t uid, role r, gid_t group = 100) {
    session s;
    s.peer.uid = uid;
    s.peer.gid = group;
    s.peer.groups = {group};
    s.peer.user_name = user;
    s.roles = role_set().with(r);
    s.tenant = std::move(user);
    return s;
}

// The data.quota of the refusal f() throws, or what went wrong.
template <typename F>
std::string refused_quota(F&& f) {
    try {
        f();
    } catch (const rpc_failure& e) {
        if (e.reason() != reason::quota_exceeded) {
            return "reason " + e.reason();
        }
        return e.details().at("quota").get<std::string>();
    }
    return "admitted";
}

constexpr std::int64_t sec = 1'000'000'000;

}  // namespace

TEST(tenant_limits, the_ceiling_is_the_roles_unless_a_principal_entry_names_the_peer) {
    tenant_policy p;
    p.scheduler_max_priority = 0;
    p.admin_max_priority = 100;
    p.priority_ceilings = {{"user:alice", 10}, {"gid:200", 20}, {"uid:1003", -5}};
    auto t = tenant_limits::compile(p);
    ASSERT_TRUE(t) << t.err().message;
    EXPECT_EQ(t->priority_ceiling(peer("bob", 1002, role::scheduler)), 0);
    EXPECT_EQ(t->priority_ceiling(peer("root", 0, role::admin)), 100);
    EXPECT_EQ(t->priority_ceiling(peer("alice", 1001, role::scheduler)), 10);
    // alice is also in group 200: the highest matching entry wins.
    EXPECT_EQ(t->priority_ceiling(peer("alice", 1001, role::scheduler, 200)), 20);
    EXPECT_EQ(t->priority_ceiling(peer("carol", 1003, role::scheduler)), -5);
    EXPECT_EQ(refused_quota([&] { t->check_priority(peer("bob", 1002, role::scheduler), 1); }),
              "priority");
    EXPECT_EQ(refused_quota([&] { t->check_priority(peer("bob", 1002, role::scheduler), 0); }),
              "admitted");
}

TEST(tenant_limits, an_unknown_group_in_a_ceiling_is_an_error_naming_the_option) {
    tenant_policy p;
    p.priority_ceilings = {{"group:no-such-group-qrt", 1}};
    auto t = tenant_limits::compile(p);
    ASSERT_FALSE(t);
    EXPECT_NE(t.err().message.find("tenants.priority_ceilings"), std::string::npos);
    EXPECT_NE(t.err().message.find("no-such-group-qrt"), std::string::npos);
}

TEST(tenant_limits, bookings_past_a_quota_are_refused_and_admins_are_exempt) {
    tenant_policy p;
    p.max_reservations = 3;
    p.max_booked_ns = 10 * sec;
    p.max_payload_bytes = 100;
    auto t = tenant_limits::compile(p);
    ASSERT_TRUE(t);
    const session bob = peer("bob", 1002, role::scheduler);
    qrt::timeline::tenant_usage used{.reservations = 2, .booked_ns = 8 * sec, .payload_bytes = 90};
    EXPECT_EQ(refused_quota([&] { t->check_booking(bob, used, 1, 2 * sec, 10); }), "admitted");
    EXPECT_EQ(refused_quota([&] { t->check_booking(bob, used, 2, 1, 0); }), "reservations");
    EXPECT_EQ(refused_quota([&] { t->check_booking(bob, used, 1, 2 * sec + 1, 0); }),
              "booked_time");
    EXPECT_EQ(refused_quota([&] { t->check_booking(bob, used, 0, 0, 11); }), "payload_bytes");
    // A gang of k books k times its duration; huge durations do not overflow.
    used = {};
    EXPECT_EQ(refused_quota([&] { t->check_booking(bob, used, 3, 4 * sec, 0); }), "booked_time");
    EXPECT_EQ(refused_quota([&] { t->check_booking(bob, used, 2, INT64_MAX / 2, 0); }),
              "booked_time");
    used = {.reservations = 1000, .booked_ns = 1000 * sec, .payload_bytes = 1000};
    EXPECT_EQ(refused_quota([&] { t->check_booking(peer("root", 0, role::admin), used, 1, sec, 1); }),
              "admitted");
}

TEST(tenant_limits, the_request_bucket_refills_at_the_rate_and_is_per_tenant) {
    tenant_policy p;
    p.max_requests_per_s = 10;
    p.request_burst = 5;
    auto t = tenant_limits::compile(p);
    ASSERT_TRUE(t);
    const session bob = peer("bob", 1002, role::scheduler);
    const session amy = peer("amy", 1004, role::scheduler);
    for (int i = 0; i < 5; ++i) {
        EXPECT_EQ(refused_quota([&] { t->admit(bob, 0); }), "admitted") << i;
    }
    EXPECT_EQ(refused_quota([&] { t->admit(bob, 0); }), "requests");
    EXPECT_EQ(refused_quota([&] { t->admit(amy, 0); }), "admitted");
    // 100 ms later one token (10/s) is back, not two.
    EXPECT_EQ(refused_quota([&] { t->admit(bob, sec / 10); }), "admitted");
    EXPECT_EQ(refused_quota([&] { t->admit(bob, sec / 10); }), "requests");
    // Admins are not limited.
    const session root = peer("root", 0, role::admin);
    for (int i = 0; i < 50; ++i) {
        ASSERT_EQ(refused_quota([&] { t->admit(root, 0); }), "admitted");
    }
}

TEST(tenant_limits, the_bucket_table_stays_bounded_with_many_tenants) {
    tenant_policy p;
    p.max_requests_per_s = 1;
    p.request_burst = 2;
    auto t = tenant_limits::compile(p);
    ASSERT_TRUE(t);
    for (std::size_t i = 0; i < 5 * tenant_limits::max_tracked_tenants; ++i) {
        const session s = peer(fmt::format("u{}", i), static_cast<uid_t>(10'000 + i), role::scheduler);
        t->admit(s, static_cast<std::int64_t>(i));
        ASSERT_LE(t->tracked_tenants(), tenant_limits::max_tracked_tenants);
    }
}

TEST(tenant_limits, a_line_costs_its_requests_and_one_dearer_than_the_burst_empties_a_full_bucket) {
    tenant_policy p;
    p.max_requests_per_s = 1;
    p.request_burst = 10;
    auto t = tenant_limits::compile(p);
    ASSERT_TRUE(t);
    const session bob = peer("bob", 1002, role::scheduler);
    EXPECT_EQ(refused_quota([&] { t->admit(bob, 0, 7); }), "admitted");
    EXPECT_EQ(refused_quota([&] { t->admit(bob, 0, 4); }), "requests");  // 3 left: none taken
    EXPECT_EQ(refused_quota([&] { t->admit(bob, 0, 3); }), "admitted");
    EXPECT_EQ(refused_quota([&] { t->admit(bob, 0, 1); }), "requests");
    // A line costing more than the burst is not refused forever.
    const session amy = peer("amy", 1004, role::scheduler);
    EXPECT_EQ(refused_quota([&] { t->admit(amy, 0, 1000); }), "admitted");
    EXPECT_EQ(refused_quota([&] { t->admit(amy, 0, 1); }), "requests");
}

TEST(tenant_limits, the_near_term_share_refuses_past_it_and_names_the_start_to_ask_for) {
    tenant_policy p;
    p.near_term_ns = 600 * sec;
    p.max_near_term_ns = 120 * sec;
    auto t = tenant_limits::compile(p);
    ASSERT_TRUE(t);
    const session bob = peer("bob", 1002, role::scheduler);
    const std::int64_t now = 1'000 * sec;
    EXPECT_TRUE(t->near_term_applies(bob, 0, now));
    EXPECT_TRUE(t->near_term_applies(bob, now + 599 * sec, now));
    EXPECT_FALSE(t->near_term_applies(bob, now + 600 * sec, now));
    EXPECT_EQ(refused_quota([&] { t->check_near_term(bob, 100 * sec, 2, 10 * sec, now); }), "admitted");
    EXPECT_EQ(refused_quota([&] { t->check_near_term(bob, 100 * sec, 3, 10 * sec, now); }), "near_term");
    try {
        t->check_near_term(bob, 115 * sec, 1, 10 * sec, now);
        ADD_FAILURE() << "not refused";
    } catch (const rpc_failure& e) {
        EXPECT_EQ(e.details().at("not_before_ns"), now + 600 * sec);
        EXPECT_EQ(e.details().at("used"), 115 * sec);
        EXPECT_NE(e.message().find("tenants.max_near_term_ns"), std::string::npos) << e.message();
    }
    // A reservation longer than the near term counts as all of it, once.
    tenant_policy wide = p;
    wide.max_near_term_ns = 600 * sec;
    auto w = tenant_limits::compile(wide);
    ASSERT_TRUE(w);
    EXPECT_EQ(refused_quota([&] { w->check_near_term(bob, 0, 1, 3600 * sec, now); }), "admitted");
    const session root = peer("root", 0, role::admin);
    EXPECT_FALSE(t->near_term_applies(root, 0, now));
    EXPECT_EQ(refused_quota([&] { t->check_near_term(root, 600 * sec, 10, 60 * sec, now); }), "admitted");
}

// A priority_ceilings entry names the delegate's own principal: it is the
// delegate's ceiling for its own calls, never one every tenant it books for
// inherits.
TEST(tenant_limits, a_delegated_tenant_has_its_own_ceiling_not_the_delegates_entry) {
    tenant_policy p;
    p.delegates = {"user:k8s"};
    p.priority_ceilings = {{"user:k8s", 50}};
    auto t = tenant_limits::compile(p);
    ASSERT_TRUE(t);
    const session driver = peer("k8s", 1500, role::scheduler);
    EXPECT_EQ(t->priority_ceiling(driver), 50);
    const session a = t->delegated(driver, "team-a");
    EXPECT_EQ(t->priority_ceiling(a), 0) << "team-a inherited the driver's own ceiling";
    EXPECT_EQ(refused_quota([&] { t->check_priority(a, 1); }), "priority");
    EXPECT_EQ(refused_quota([&] { t->check_priority(a, 0); }), "admitted");
    EXPECT_EQ(refused_quota([&] { t->check_priority(driver, 50); }), "admitted");
}

TEST(tenant_limits, a_delegated_session_is_the_named_tenant_without_admin_and_under_its_quotas) {
    tenant_policy p;
    p.delegates = {"uid:0", "user:k8s"};
    p.max_reservations = 1;
    p.max_delegated_tenants = 2;
    auto t = tenant_limits::compile(p);
    ASSERT_TRUE(t);
    const session root = peer("root", 0, role::admin);
    const session driver = peer("k8s", 1500, role::scheduler);
    const session bob = peer("bob", 1002, role::scheduler);
    EXPECT_TRUE(t->may_delegate(root));
    EXPECT_TRUE(t->may_delegate(driver));
    EXPECT_FALSE(t->may_delegate(bob));

    const session a = t->delegated(root, "team-a");
    EXPECT_EQ(a.tenant, "root/team-a");
    EXPECT_EQ(a.delegate, "root");
    EXPECT_FALSE(a.roles.holds(role::admin));
    // The admin's exemption is gone: the namespace's quota applies.
    qrt::timeline::tenant_usage used{.reservations = 1};
    EXPECT_EQ(refused_quota([&] { t->check_booking(a, used, 1, sec, 0); }), "reservations");
    EXPECT_EQ(refused_quota([&] { t->check_booking(root, used, 1, sec, 0); }), "admitted");
    EXPECT_EQ(t->priority_ceiling(a), p.scheduler_max_priority);
    // max_delegated_tenants: a third tenant, not one already holding.
    EXPECT_EQ(refused_quota([&] { t->check_delegated_tenants(a, 2, false); }), "delegated_tenants");
    EXPECT_EQ(refused_quota([&] { t->check_delegated_tenants(a, 2, true); }), "admitted");
    EXPECT_EQ(refused_quota([&] { t->check_delegated_tenants(a, 1, false); }), "admitted");
    EXPECT_EQ(refused_quota([&] { t->check_delegated_tenants(bob, 9, false); }), "admitted");

    // Names: a Kubernetes namespace (DNS label) and nothing else.
    EXPECT_EQ(t->delegated(driver, std::string(63, 'a')).tenant, "k8s/" + std::string(63, 'a'));
    EXPECT_EQ(t->delegated(driver, "a-b-0").tenant, "k8s/a-b-0");
    const auto refusal = [&](const session& s, const std::string& name) {
        try {
            (void)t->delegated(s, name);
        } catch (const rpc_failure& e) {
            return e.reason() + ":" + e.details().value("field", std::string());
        }
        return std::string("accepted");
    };
    for (const std::string& bad :
         std::vector<std::string>{"", std::string(64, 'a'), "A", "a_b", "a/b", "-a", "a-", "a.b", "..", "a b"}) {
        EXPECT_EQ(refusal(driver, bad), "invalid_params:on_behalf_of") << bad;
    }
    EXPECT_EQ(refusal(bob, "team-a"), "permission_denied:on_behalf_of");
    // No delegation of a delegated session.
    EXPECT_EQ(refusal(a, "team-b"), "permission_denied:on_behalf_of");
}
