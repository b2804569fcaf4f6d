// The network listener (rpc.listen) end to end with a REAL munged: the
// server in process on 127.0.0.1 (an ephemeral port), a real ledger, two
// munged daemons started here, each with its own key made by mungekey, its
// own socket and state under a temporary directory, ended by pid.  Clients:
// raw TCP sockets (to send what a client would not), libqrt-client's
// connection (tcp://), and qrtctl run as another uid (setpriv).
//
// Skips, naming why, when munged or mungekey is missing (deps.sh installs
// munge), and the role tests when not root (a credential of another uid
// needs a process of that uid).
#include "munge_harness.hpp"
#include "qrt/client.h"

namespace {

using namespace qrt_munge_test;

TEST_F(munge_listener, a_good_credential_is_served_with_the_roles_of_its_uid) {
    auto r = qrt::client::connection::open(h().url(), client_options());
    ASSERT_EQ(r.index(), 0U) << std::get<1>(r).message;
    auto& c = *std::get<0>(r);
    EXPECT_EQ(c.authenticated_as().value("uid", -1), static_cast<int>(::geteuid()));
    const auto hello = c.call("agent.hello");
    ASSERT_TRUE(hello) << hello.error().message;
    EXPECT_EQ(hello.result()["peer"].value("uid", -1), static_cast<int>(::geteuid()));
    const auto q = c.call("slots.query", json{{"duration_ns", 1'000'000}});
    ASSERT_TRUE(q) << q.error().message;
    if (::geteuid() == 0) {
        EXPECT_EQ(hello.result()["peer"]["roles"], json::array({"scheduler"}));
        const auto res = c.call(
            "slots.reserve", json{{"duration_ns", 1'000'000}, {"lease_ns", 60 * s_ns}, {"idempotency_key", "k1"}});
        EXPECT_TRUE(res) << res.error().message;
    }
    EXPECT_NE(h().metrics().find("qrt_rpc_remote_authenticated_total 1"), std::string::npos);
}

TEST_F(munge_listener, requests_before_auth_are_refused_reads_included) {
    for (const std::string method : {"agent.hello", "slots.query", "metrics"}) {
        raw_tcp t(h().port);
        EXPECT_FALSE(t.challenge().empty());
        t.send_line(json{{"jsonrpc", "2.0"}, {"id", 7}, {"method", method}, {"params", json::object()}}.dump());
        const json reply = t.next();
        EXPECT_EQ(cause_of(reply), "unauthenticated/auth_required") << method;
        EXPECT_EQ(reply.value("id", 0), 7);
        EXPECT_EQ(reply.find("result"), reply.end());
        EXPECT_TRUE(t.closed_by_peer());
    }
    raw_tcp t(h().port);
    t.challenge();
    t.send_line("not json at all");
    EXPECT_EQ(cause_of(t.next()), "unauthenticated/auth_required");
    EXPECT_TRUE(t.closed_by_peer());
}

TEST_F(munge_listener, garbage_is_refused_as_malformed) {
    for (const std::string cred : {"MUNGE:garbage:", "hello"}) {
        raw_tcp t(h().port);
        t.challenge();
        t.auth(cred);
        EXPECT_EQ(cause_of(t.next()), "unauthenticated/malformed") << cred;
        EXPECT_TRUE(t.closed_by_peer());
    }
    raw_tcp t(h().port);
    t.challenge();
    t.send_line(R"({"jsonrpc":"2.0","id":1,"method":"auth.munge","params":{"credential":5}})");
    EXPECT_EQ(cause_of(t.next()), "unauthenticated/malformed");
    raw_tcp big(h().port);
    big.challenge();
    big.send_line(std::string(8192, 'x'));
    EXPECT_EQ(cause_of(big.next()), "unauthenticated/malformed");
}

TEST_F(munge_listener, a_credential_of_another_key_is_refused_as_invalid) {
    raw_tcp t(h().port);
    const std::string nonce = t.challenge();
    t.auth(encode(key_b->socket, t.payload(nonce)));
    EXPECT_EQ(cause_of(t.next()), "unauthenticated/invalid");
    EXPECT_TRUE(t.closed_by_peer());
}

TEST_F(munge_listener, a_credential_used_once_is_refused_on_another_connection) {
    raw_tcp first(h().port);
    const std::string cred = encode(key_a->socket, first.payload(first.challenge()));
    first.auth(cred);
    const json ok = first.next();
    ASSERT_TRUE(ok.contains("result")) << ok.dump();
    // The credential as an eavesdropper would replay it.
    raw_tcp second(h().port);
    second.challenge();
    second.auth(cred);
    EXPECT_EQ(cause_of(second.next()), "unauthenticated/replayed");
    EXPECT_TRUE(second.closed_by_peer());
    // A fresh credential made for another connection's nonce (never used).
    raw_tcp third(h().port);
    third.challenge();
    third.auth(encode(key_a->socket, third.payload("00112233445566778899aabbccddeeff")));
    EXPECT_EQ(cause_of(third.next()), "unauthenticated/nonce_mismatch");
    EXPECT_TRUE(third.closed_by_peer());
    // The first connection is served.
    first.send_line(R"({"jsonrpc":"2.0","id":2,"method":"agent.hello"})");
    EXPECT_TRUE(first.next().contains("result"));
}

TEST_F(munge_listener, an_expired_credential_is_refused) {
    rpc::server_options so;
    so.auth_silent_timeout = 10000ms;  // it waits for the credential to expire before sending
    so.auth_timeout = 10000ms;
    raw_tcp t(h(so).port);
    const std::string nonce = t.challenge();
    const std::int64_t made = ::time(nullptr);
    const std::string cred = encode(key_a->socket, t.payload(nonce), 1);
    // TTL 1 s: past encode time + ttl by the wall clock (bounded wait).
    for (int i = 0; i < 100 && ::time(nullptr) <= made + 2; ++i) {
        std::this_thread::sleep_for(50ms);
    }
    t.auth(cred);
    const json reply = t.next();
    EXPECT_EQ(cause_of(reply), "unauthenticated/expired");
    EXPECT_NE(reply["error"].value("message", "").find("clocks"), std::string::npos) << reply.dump();
}

TEST_F(munge_listener, a_silent_peer_is_dropped_after_the_auth_timeout) {
    rpc::server_options so;
    so.auth_timeout = 100ms;
    so.idle_timeout = 800ms;  // the sweep runs every idle_timeout / 4
    raw_tcp t(h(so).port);
    t.challenge();
    EXPECT_EQ(cause_of(t.next()), "unauthenticated/auth_timeout");
    EXPECT_TRUE(t.closed_by_peer());
}

TEST_F(munge_listener, connections_per_host_are_capped_before_authentication) {
    rpc::server_options so;
    so.max_connections_per_host = 2;
    harness& hh = h(so);
    raw_tcp a(hh.port);
    raw_tcp b(hh.port);
    a.challenge();
    b.challenge();
    raw_tcp c(hh.port);
    const json refused = c.next();
    EXPECT_EQ(refused["error"]["data"].value("cause", ""), "connections_per_host") << refused.dump();
    EXPECT_EQ(refused["error"]["data"].value("reason", ""), "overloaded");
}

// Before authentication a connection is in a pool of its own: capped per
// host and in all (max_unauthenticated), not counted in max_connections;
// once authenticated it is, and a full max_connections refuses it then.
TEST_F(munge_listener, unauthenticated_connections_have_a_pool_of_their_own) {
    rpc::server_options so;
    so.max_connections = 2;
    so.reserved_connections = 0;
    so.max_unauthenticated = 3;
    so.max_unauthenticated_per_host = 2;
    harness& hh = h(so);
    auto a1 = std::make_unique<raw_tcp>(hh.port, "127.0.0.1");
    raw_tcp a2(hh.port, "127.0.0.1");
    raw_tcp b1(hh.port, "127.0.0.2");
    const std::string a1_nonce = a1->challenge();
    for (raw_tcp* t : {&a2, &b1}) {
        EXPECT_FALSE(t->challenge().empty());
    }
    raw_tcp a3(hh.port, "127.0.0.1");
    const json per_host = a3.next();
    EXPECT_EQ(cause_of(per_host), "overloaded/unauthenticated_per_host") << per_host.dump();
    EXPECT_NE(per_host["error"].value("message", "").find("rpc.max_unauthenticated_per_host"), std::string::npos);
    raw_tcp c1(hh.port, "127.0.0.3");
    const json pool = c1.next();
    EXPECT_EQ(cause_of(pool), "overloaded/unauthenticated_connections") << pool.dump();
    EXPECT_EQ(pool["error"]["data"].value("limit", 0), 3);
    // None of them is in max_connections (2): two local peers are served.
    qrt::testing::rpc_client local1(hh.socket_path);
    qrt::testing::rpc_client local2(hh.socket_path);
    EXPECT_TRUE(local1.call("agent.hello").contains("result"));
    EXPECT_TRUE(local2.call("agent.hello").contains("result"));
    // Authenticated, a1 would be the third: refused then, and its slot in
    // the pool is free again for another host.
    a1->auth(encode(key_a->socket, a1->payload(a1_nonce)));
    const json full = a1->next();
    EXPECT_EQ(cause_of(full), "overloaded/connections") << full.dump();
    EXPECT_NE(full["error"].value("message", "").find("rpc.max_connections"), std::string::npos);
    EXPECT_TRUE(a1->closed_by_peer());
    a1.reset();
    std::optional<json> let_in;
    for (int i = 0; i < 100 && !let_in; ++i) {  // the server reaps a1 on its next pass
        raw_tcp again(hh.port, "127.0.0.3");
        const json first = again.next();
        if (first.value("method", "") == "auth.challenge") {
            let_in = first;
        } else {
            std::this_thread::sleep_for(10ms);
        }
    }
    EXPECT_TRUE(let_in.has_value()) << "the pool stayed full after a1 was closed";
    EXPECT_NE(hh.metrics().find("qrt_rpc_connections_rejected_total{cause=\"unauthenticated_per_host\"} 1"),
              std::string::npos);
}

// A peer that has sent nothing is dropped after rpc.auth_silent_timeout_ms;
// one that is sending (its line not complete yet) has rpc.auth_timeout_ms.
TEST_F(munge_listener, a_peer_that_sends_nothing_is_dropped_before_a_slow_one) {
    rpc::server_options so;
    so.auth_silent_timeout = 100ms;
    so.auth_timeout = 10000ms;
    harness& hh = h(so);
    raw_tcp silent(hh.port);
    raw_tcp slow(hh.port);
    const std::string nonce = slow.challenge();
    silent.challenge();
    const std::string line = json{{"jsonrpc", "2.0"}, {"id", 1}, {"method", "auth.munge"},
                                  {"params", {{"credential", encode(key_a->socket, slow.payload(nonce))}}}}
                                 .dump();
    slow.send_raw(line.substr(0, 10));  // started, not finished
    const json dropped = silent.next();
    EXPECT_EQ(cause_of(dropped), "unauthenticated/auth_timeout") << dropped.dump();
    EXPECT_NE(dropped["error"].value("message", "").find("rpc.auth_silent_timeout_ms"), std::string::npos)
        << dropped.dump();
    EXPECT_TRUE(silent.closed_by_peer());
    // Well past the silent timeout, the slow one finishes and is served.
    std::this_thread::sleep_for(300ms);
    slow.send_raw(line.substr(10) + "\n");
    EXPECT_TRUE(slow.next().contains("result"));
}

// The per-uid cap of the UNIX socket counts remote connections of the uid
// too (the credential's uid is the peer's uid).
TEST_F(munge_listener, a_remote_connection_counts_in_its_uids_cap) {
    rpc::server_options so;
    so.max_connections_per_uid = 1;
    harness& hh = h(so);
    auto first = qrt::client::connection::open(hh.url(), client_options());
    ASSERT_EQ(first.index(), 0U) << std::get<1>(first).message;
    // The same uid again, over the network: refused once its identity is known.
    auto second = qrt::client::connection::open(hh.url(), client_options());
    ASSERT_EQ(second.index(), 1U);
    const auto& e2 = std::get<1>(second);
    EXPECT_EQ(e2.reason, "overloaded") << e2.message;
    ASSERT_TRUE(e2.data.is_object()) << e2.message;
    EXPECT_EQ(e2.data.value("cause", ""), "connections_per_uid") << e2.message;
    // And over the UNIX socket, with the remote one open: the refusal line.
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", hh.socket_path.c_str());
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    pollfd p{fd, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1);
    char buf[4096] = {};
    const ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    ASSERT_GT(n, 0);
    const json refused = json::parse(std::string(buf, static_cast<std::size_t>(n)), nullptr, false);
    EXPECT_EQ(refused["error"]["data"].value("cause", ""), "connections_per_uid") << buf;
}

TEST_F(munge_listener, a_quiet_remote_peer_is_dropped_after_the_idle_timeout) {
    rpc::server_options so;
    so.idle_timeout = 200ms;
    harness& hh = h(so);
    raw_tcp t(hh.port);
    t.auth(encode(key_a->socket, t.payload(t.challenge())));
    ASSERT_TRUE(t.next().contains("result"));
    const json idle = t.next();  // nothing sent since: the idle timeout's line
    EXPECT_EQ(idle["error"]["data"].value("reason", ""), "idle_timeout") << idle.dump();
    EXPECT_TRUE(t.closed_by_peer());
}

TEST_F(munge_listener, the_client_says_when_munged_is_not_running) {
    qrt::client::connect_options co;
    co.munge_socket = (dir / "no-munged.sock").string();
    auto r = qrt::client::connection::open(h().url(), co);
    ASSERT_EQ(r.index(), 1U);
    const auto& e = std::get<1>(r);
    EXPECT_EQ(e.reason, "munge_error");
    EXPECT_NE(e.message.find("munged is not running"), std::string::npos) << e.message;
    EXPECT_EQ(qrt::client::exit_code_for(e.reason), 23);
}

TEST_F(munge_listener, the_client_reports_another_key_as_the_agents_refusal) {
    qrt::client::connect_options co;
    co.munge_socket = key_b->socket;
    auto r = qrt::client::connection::open(h().url(), co);
    ASSERT_EQ(r.index(), 1U);
    const auto& e = std::get<1>(r);
    EXPECT_EQ(e.reason, "unauthenticated");
    EXPECT_EQ(e.data.value("cause", ""), "invalid");
    EXPECT_NE(e.message.find("munge key"), std::string::npos) << e.message;
}

// A uid without the scheduler role (nobody: reader only) is refused
// slots.reserve over the network exactly as over the UNIX socket, by
// qrtctl running as that uid (its credential is made by munged for it).
TEST_F(munge_listener, a_uid_without_the_scheduler_role_is_refused_remotely_as_locally) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root: a credential of uid 65534 needs a process of that uid";
    }
    const char* env = std::getenv("QRTCTL");
    const std::string qrtctl = env != nullptr ? env : QRT_TEST_QRTCTL;
    if (::access(qrtctl.c_str(), X_OK) != 0 || which("setpriv").empty()) {
        GTEST_SKIP() << "qrtctl (" << qrtctl << ") is not built or setpriv (util-linux) is missing";
    }
    harness& hh = h();
    qrt::testing::run_options ro;
    ro.env = {"QRT_MUNGE_SOCKET=" + key_a->socket};
    for (const std::string& where : {hh.url(), hh.socket_path}) {
        const auto hello = qrt::testing::run(
            {which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", qrtctl, "--json",
             "--socket", where, "raw", "agent.hello"},
            ro);
        ASSERT_EQ(hello.exit_code, 0) << where << ": " << hello.out << hello.err;
        const json h = json::parse(hello.out, nullptr, false);
        EXPECT_EQ(h["peer"].value("uid", -1), 65534) << where;
        EXPECT_EQ(h["peer"]["roles"], json::array({"reader"})) << where;
        const auto reserve = qrt::testing::run(
            {which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", qrtctl, "--json",
             "--socket", where, "raw", "slots.reserve", R"({"duration_ns":1000000,"lease_ns":60000000000,"idempotency_key":"k"})"},
            ro);
        EXPECT_EQ(reserve.exit_code, 6) << where << ": " << reserve.out << reserve.err;
        EXPECT_NE((reserve.out + reserve.err).find("permission_denied"), std::string::npos) << where;
    }
}

// The C library's own calls (qrt/client.h, libqrt-client.so) over tcp://,
// named and from $QRT_SOCKET as a Slurm step on a compute node has it, and
// qrtctl from $QRT_SOCKET: README "From other nodes" names each.
TEST_F(munge_listener, the_c_library_and_qrtctl_speak_tcp_from_qrt_socket) {
    harness& hh = h();
    ASSERT_EQ(::setenv("QRT_MUNGE_SOCKET", key_a->socket.c_str(), 1), 0);
    ASSERT_EQ(::setenv("QRT_SOCKET", hh.url().c_str(), 1), 0);
    const std::string url = hh.url();
    for (const char* path : {url.c_str(), static_cast<const char*>(nullptr)}) {
        qrt_client* c = nullptr;
        qrt_error err{};
        ASSERT_EQ(qrt_connect(path, &c, &err), 0) << err.reason << ": " << err.message;
        char* hello = nullptr;
        ASSERT_EQ(qrt_hello(c, &hello, &err), 0) << err.reason << ": " << err.message;
        const json got = json::parse(hello, nullptr, false);
        qrt_free(hello);
        qrt_close(c);
        EXPECT_EQ(got["peer"].value("uid", -1), static_cast<int>(::geteuid())) << got.dump();
        EXPECT_EQ(got["peer"].value("pid", -1), 0) << "not a process of this host";
    }
    const std::string qrtctl = std::getenv("QRTCTL") != nullptr ? std::getenv("QRTCTL") : QRT_TEST_QRTCTL;
    qrt::testing::run_options ro;
    ro.env = {"QRT_MUNGE_SOCKET=" + key_a->socket, "QRT_SOCKET=" + hh.url()};
    const auto ctl = qrt::testing::run({qrtctl, "--json", "agent", "hello"}, ro);
    ::unsetenv("QRT_SOCKET");
    ::unsetenv("QRT_MUNGE_SOCKET");
    ASSERT_EQ(ctl.exit_code, 0) << ctl.out << ctl.err;
    EXPECT_EQ(json::parse(ctl.out, nullptr, false)["peer"].value("uid", -1), static_cast<int>(::geteuid()));
}

}  // namespace

namespace {

// The Python client (tools/clients/python/src/qrt_client/__init__.py) over tcp://: a good
// credential is served; munged not running is said so (munge_error, 23);
// another key is the agent's refusal (unauthenticated/invalid, 22).
TEST_F(munge_listener, the_python_client_speaks_tcp_with_munge) {
    const std::string python = which("python3");
    if (python.empty()) {
        GTEST_SKIP() << "python3 is not installed";
    }
    const std::string script = R"(
import json, sys
sys.path.insert(0, sys.argv[1])
from qrt_client import Client, QrtError
try:
    with Client(sys.argv[2], munge_socket=sys.argv[3]) as c:
        print(json.dumps({"peer": c.hello()["peer"], "auth": c.authenticated_as}))
except QrtError as e:
    print(json.dumps({"reason": e.reason, "exit": e.exit_code, "message": e.message,
                      "cause": (getattr(e, "data", None) or {}).get("cause", "")}))
)";
    const auto run_with = [&](const std::string& munge_socket) {
        const auto r = qrt::testing::run({python, "-c", script, QRT_TEST_PYTHON_DIR, h().url(), munge_socket});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return json::parse(r.out, nullptr, false);
    };
    const json good = run_with(key_a->socket);
    EXPECT_EQ(good["peer"].value("uid", -1), static_cast<int>(::geteuid())) << good.dump();
    EXPECT_EQ(good["auth"].value("uid", -1), static_cast<int>(::geteuid())) << good.dump();
    const json down = run_with((dir / "no-munged.sock").string());
    EXPECT_EQ(down.value("reason", ""), "munge_error") << down.dump();
    EXPECT_EQ(down.value("exit", 0), 23);
    EXPECT_NE(down.value("message", "").find("munged is not running"), std::string::npos) << down.dump();
    const json other = run_with(key_b->socket);
    EXPECT_EQ(other.value("reason", ""), "unauthenticated") << other.dump();
    EXPECT_EQ(other.value("cause", ""), "invalid");
    EXPECT_EQ(other.value("exit", 0), 22);
}

}  // namespace
