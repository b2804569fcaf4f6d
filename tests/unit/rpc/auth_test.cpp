#include <gtest/gtest.h>

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "qrt/rpc/auth.hpp"

using namespace qrt::rpc;

TEST(rpc_auth, principals_parse_strictly) {
    auto u = principal::parse("user:alice");
    ASSERT_TRUE(u);
    EXPECT_EQ(u->what, principal::kind::user);
    EXPECT_EQ(u->name, "alice");
    auto g = principal::parse("gid:4242");
    ASSERT_TRUE(g);
    EXPECT_EQ(g->what, principal::kind::gid);
    EXPECT_EQ(g->id, 4242U);
    EXPECT_EQ(g->to_string(), "gid:4242");
    for (const char* bad : {"alice", "user:", "uid:-1", "uid: 5", "uid:5x", "uid:4294967296",
                            "host:x", "group:a b", ":x"}) {
        auto p = principal::parse(bad);
        EXPECT_FALSE(p) << bad;
        if (!p) {
            EXPECT_NE(p.err().message.find(bad), std::string::npos) << p.err().message;
        }
    }
}

TEST(rpc_auth, role_semantics_admin_implies_all_and_every_role_implies_reader) {
    const role_set none;
    EXPECT_TRUE(none.allows(role::none));
    EXPECT_FALSE(none.allows(role::reader));
    const role_set sched = role_set{}.with(role::scheduler);
    EXPECT_TRUE(sched.allows(role::reader));
    EXPECT_TRUE(sched.allows(role::scheduler));
    EXPECT_FALSE(sched.allows(role::calibration));
    EXPECT_FALSE(sched.allows(role::admin));
    const role_set cal = role_set{}.with(role::calibration);
    EXPECT_TRUE(cal.allows(role::reader));
    EXPECT_FALSE(cal.allows(role::scheduler));
    const role_set admin = role_set{}.with(role::admin);
    for (const role r : {role::reader, role::scheduler, role::calibration, role::admin}) {
        EXPECT_TRUE(admin.allows(r));
    }
    EXPECT_EQ(role_from_name("calibration"), role::calibration);
    EXPECT_EQ(role_from_name("root"), std::nullopt);
}

TEST(rpc_auth, compile_rejects_bad_principals_and_unknown_groups_naming_the_role) {
    role_map m;
    m.scheduler = {"uid:12", "wheel"};
    auto a = authorizer::compile(m);
    ASSERT_FALSE(a);
    EXPECT_NE(a.err().message.find("roles.scheduler"), std::string::npos) << a.err().message;
    role_map g;
    g.admin = {"group:qrt-no-such-group-xyz"};
    auto b = authorizer::compile(g);
    ASSERT_FALSE(b);
    EXPECT_NE(b.err().message.find("qrt-no-such-group-xyz"), std::string::npos);
}

TEST(rpc_auth, roles_match_by_uid_gid_user_name_and_supplementary_group) {
    role_map m;
    m.reader = {"uid:1001"};
    m.scheduler = {"user:carol"};
    m.calibration = {"gid:777"};
    m.admin = {"gid:0"};
    auto a = authorizer::compile(m);
    ASSERT_TRUE(a) << a.err().message;
    peer_identity p;
    p.uid = 1001;
    p.gid = 1001;
    EXPECT_EQ(a->roles_of(p).names(), std::vector<std::string>{"reader"});
    p.user_name = "carol";
    p.groups = {1001, 777};
    EXPECT_EQ(a->roles_of(p).names(), (std::vector<std::string>{"reader", "scheduler", "calibration"}));
    peer_identity stranger;
    stranger.uid = 5000;
    stranger.gid = 5000;
    EXPECT_TRUE(a->roles_of(stranger).empty());
    peer_identity rootish;
    rootish.uid = 5001;
    rootish.gid = 0;  // primary group counts too
    EXPECT_TRUE(a->roles_of(rootish).holds(role::admin));
}

TEST(rpc_auth, group_names_resolve_through_the_group_database) {
    const group* gr = ::getgrgid(::getgid());
    if (gr == nullptr) {
        GTEST_SKIP() << "the test's own gid has no group entry";
    }
    role_map m;
    m.reader = {std::string("group:") + gr->gr_name};
    auto a = authorizer::compile(m);
    ASSERT_TRUE(a) << a.err().message;
    peer_identity p;
    p.uid = 99999;
    p.gid = 99999;
    p.groups = {::getgid()};
    EXPECT_TRUE(a->roles_of(p).holds(role::reader));
}

TEST(rpc_auth, peer_identity_of_a_socketpair_is_this_process) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    auto id = peer_identity_of(sv[0]);
    ASSERT_TRUE(id) << id.err().message;
    EXPECT_EQ(id->uid, ::getuid());
    EXPECT_EQ(id->gid, ::getgid());
    EXPECT_EQ(id->pid, ::getpid());
    EXPECT_TRUE(id->in_group(::getgid()));
    EXPECT_FALSE(id->groups_source.empty());
    if (const passwd* pw = ::getpwuid(::getuid()); pw != nullptr) {
        EXPECT_EQ(id->tenant(), pw->pw_name);
    } else {
        EXPECT_EQ(id->tenant(), "uid:" + std::to_string(::getuid()));
    }
    ::close(sv[0]);
    ::close(sv[1]);
    auto bad = peer_identity_of(-1);
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.err().message.find("SO_PEERCRED"), std::string::npos);
}

TEST(rpc_auth, the_accept_path_asks_nss_once_per_uid_and_ttl_and_holds_a_bounded_table) {
    std::vector<uid_t> asked;
    nss_cache::options o;
    o.capacity = 8;
    o.ttl_ns = 1'000;
    nss_cache names(o, [&](uid_t uid) -> std::optional<std::string> {
        asked.push_back(uid);
        if (uid == 4242) {
            return std::nullopt;  // no passwd entry
        }
        return "user" + std::to_string(uid);
    });
    for (int i = 0; i < 100; ++i) {
        EXPECT_EQ(names.user_name(1000, 10), "user1000");
        EXPECT_EQ(names.user_name(4242, 10), std::nullopt);
    }
    EXPECT_EQ(asked, (std::vector<uid_t>{1000, 4242}));
    // After the ttl the name is looked up again (a renamed user is seen).
    EXPECT_EQ(names.user_name(1000, 10 + 1'000), "user1000");
    EXPECT_EQ(asked.size(), 3u);
    // Many uids: never more than capacity entries.
    for (uid_t u = 2000; u < 2100; ++u) {
        names.user_name(u, 2'000);
        ASSERT_LE(names.size(), 8u);
    }
}
