#include <gtest/gtest.h>

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

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

namespace {

// getpwuid_r as an NSS module would answer: an entry for uid 1000, no entry
// for 4242 (rc 0, null result, or ENOENT as some modules say it), and for
// 5000 a failure (sssd or LDAP down: EIO).
int fake_getpwuid_r(uid_t uid, passwd* pw, char* buf, std::size_t len, passwd** out) {
    *out = nullptr;
    if (uid == 1000 && len > 8) {
        std::snprintf(buf, len, "alice");
        pw->pw_name = buf;
        *out = pw;
        return 0;
    }
    if (uid == 4242) {
        return 0;
    }
    if (uid == 4343) {
        return ENOENT;
    }
    return EIO;
}

}  // namespace

// Only "no entry" is "no such user"; NSS failing is an error of its own,
// which the server answers with unavailable and never caches.
TEST(rpc_auth, an_nss_error_is_not_no_such_user) {
    const nss_answer found = nss_lookup_with(nss_query{1000, 1000, false}, fake_getpwuid_r);
    EXPECT_EQ(found.user_name, "alice");
    EXPECT_EQ(found.error, 0);
    for (const uid_t none : {4242U, 4343U}) {
        const nss_answer a = nss_lookup_with(nss_query{none, none, false}, fake_getpwuid_r);
        EXPECT_EQ(a.user_name, std::nullopt) << none;
        EXPECT_EQ(a.error, 0) << none;
    }
    const nss_answer failed = nss_lookup_with(nss_query{5000, 5000, true}, fake_getpwuid_r);
    EXPECT_EQ(failed.user_name, std::nullopt);
    EXPECT_EQ(failed.error, EIO);
    EXPECT_EQ(failed.groups, std::nullopt);

    // The in-place cache: a failed lookup reaches the caller and is asked
    // again next time.
    int asked = 0;
    nss_cache names(nss_cache::options{}, [&](uid_t uid) -> std::optional<std::string> {
        if (++asked == 1) {
            throw std::system_error(EIO, std::generic_category(), "getpwuid_r");
        }
        return "user" + std::to_string(uid);
    });
    EXPECT_THROW(names.user_name(5000, 10), std::system_error);
    EXPECT_EQ(names.size(), 0u);
    EXPECT_EQ(names.user_name(5000, 11), "user5000");
    EXPECT_EQ(asked, 2);
}

TEST(rpc_auth, the_resolver_asks_once_per_waiting_uid_and_refuses_past_its_queue) {
    // The lookup waits on a gate the test opens, like an NSS that hangs.
    struct state {
        std::promise<void> gate;
        std::shared_future<void> open = gate.get_future().share();
        std::mutex mu;
        std::vector<uid_t> asked;
        std::vector<std::pair<uid_t, std::string>> answered;
    };
    auto s = std::make_shared<state>();
    nss_resolver::options o;
    o.queue_capacity = 2;
    nss_resolver r(
        o,
        [s](const nss_query& q) {
            s->open.wait();
            const std::lock_guard<std::mutex> l(s->mu);
            s->asked.push_back(q.uid);
            nss_answer a;
            a.user_name = "user" + std::to_string(q.uid);
            return a;
        },
        [s](const nss_query& q, nss_answer a) {
            const std::lock_guard<std::mutex> l(s->mu);
            s->answered.emplace_back(q.uid, a.user_name.value_or("-"));
        });
    EXPECT_EQ(r.submit({1, 1, false}), nss_resolver::submitted::queued);
    for (int i = 0; i < 2000 && r.lookups() == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(r.lookups(), 1u) << "the resolver thread never took the first query";
    // uid 1 is being looked up: a second connection of it joins.
    EXPECT_EQ(r.submit({1, 1, false}), nss_resolver::submitted::joined);
    EXPECT_EQ(r.submit({2, 2, false}), nss_resolver::submitted::queued);
    EXPECT_EQ(r.submit({2, 2, false}), nss_resolver::submitted::joined);
    EXPECT_EQ(r.submit({3, 3, false}), nss_resolver::submitted::queued);
    // Two uids wait behind the stuck lookup: the queue is full.
    EXPECT_EQ(r.submit({4, 4, false}), nss_resolver::submitted::full);
    EXPECT_EQ(r.pending(), 3u);
    s->gate.set_value();
    for (int i = 0; i < 2000; ++i) {
        {
            const std::lock_guard<std::mutex> l(s->mu);
            if (s->answered.size() == 3) {
                break;
            }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const std::lock_guard<std::mutex> l(s->mu);
    EXPECT_EQ(s->asked, (std::vector<uid_t>{1, 2, 3}));
    EXPECT_EQ(s->answered, (std::vector<std::pair<uid_t, std::string>>{{1, "user1"}, {2, "user2"}, {3, "user3"}}));
}

TEST(rpc_auth, a_resolver_stuck_in_nss_does_not_hold_up_its_destruction) {
    auto release = std::make_shared<std::promise<void>>();
    auto open = release->get_future().share();
    const auto t0 = std::chrono::steady_clock::now();
    {
        nss_resolver::options o;
        o.stop_wait = std::chrono::milliseconds(50);
        nss_resolver r(o, [open](const nss_query&) {
            open.wait();
            return nss_answer{};
        }, [](const nss_query&, nss_answer) {});
        r.submit({7, 7, false});
        for (int i = 0; i < 2000 && r.lookups() == 0; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    // Destruction gave up on the stuck lookup after stop_wait, not never.
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    release->set_value();  // the left thread finishes on its own state
}

TEST(rpc_auth, the_kernel_credentials_need_no_nss_and_an_answer_completes_them) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    auto id = peer_credentials_of(sv[0]);
    ::close(sv[0]);
    ::close(sv[1]);
    ASSERT_TRUE(id) << id.err().message;
    EXPECT_EQ(id->uid, ::getuid());
    EXPECT_TRUE(id->user_name.empty());
    EXPECT_EQ(id->tenant(), "uid:" + std::to_string(::getuid()));
    nss_answer a;
    a.user_name = "alice";
    apply_nss_answer(*id, a);
    EXPECT_EQ(id->tenant(), "alice");
    EXPECT_TRUE(id->in_group(::getgid()));
}
