// Priority ceilings, quotas and the request bucket of [tenants], on made-up
// sessions and a virtual clock (the socket-level tests are in
// tests/integration/rpc/server_test.cpp, rpc_tenants.*).

#include <gtest/gtest.h>

#include <string>

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
