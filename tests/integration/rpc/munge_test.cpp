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
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <munge.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "connection.hpp"
#include "qrt/event_loop.hpp"
#include "qrt/rpc/methods.hpp"
#include "qrt/rpc/munge_auth.hpp"
#include "qrt/rpc/server.hpp"
#include "qrt/rpc/timeline_methods.hpp"
#include "qrt/telemetry.hpp"
#include "qrt/timeline/ledger.hpp"
#include "qrt_test/process.hpp"
#include "rtcore/clock.hpp"

using namespace std::chrono_literals;
using qrt::rpc::json;
namespace rpc = qrt::rpc;
namespace tl = qrt::timeline;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t s_ns = 1'000'000'000;

std::string which(const std::string& name) {
    for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin"}) {
        const fs::path p = fs::path(dir) / name;
        if (::access(p.c_str(), X_OK) == 0) {
            return p.string();
        }
    }
    return {};
}

// One munged of the test: its own key, socket, pid and seed files.
class munged {
public:
    munged(const fs::path& dir, const std::string& name) : _dir(dir / name) {
        fs::create_directories(_dir);
        fs::permissions(_dir, fs::perms(0755));  // the socket, for every uid
        const std::string key = (_dir / "munge.key").string();
        const auto made = qrt::testing::run({which("mungekey"), "--create", "--keyfile=" + key});
        if (made.exit_code != 0) {
            throw std::runtime_error("mungekey: " + made.err);
        }
        ::chmod(key.c_str(), 0400);
        socket = (_dir / "munge.sock").string();
        const std::vector<std::string> argv{which("munged"), "--foreground", "--force",
                                            "--socket=" + socket, "--key-file=" + key,
                                            "--pid-file=" + (_dir / "munged.pid").string(),
                                            "--seed-file=" + (_dir / "seed").string(),
                                            "--log-file=" + (_dir / "munged.log").string()};
        _pid = ::fork();
        if (_pid == 0) {
            std::vector<char*> args;
            for (const auto& a : argv) {
                args.push_back(const_cast<char*>(a.c_str()));
            }
            args.push_back(nullptr);
            ::execv(args[0], args.data());
            ::_exit(127);
        }
        for (int i = 0; i < 200 && !fs::exists(socket); ++i) {
            std::this_thread::sleep_for(50ms);
        }
        if (!fs::exists(socket)) {
            stop();
            throw std::runtime_error("munged did not create " + socket);
        }
    }
    ~munged() { stop(); }
    munged(const munged&) = delete;
    munged& operator=(const munged&) = delete;

    void stop() {
        if (_pid <= 0) {
            return;
        }
        ::kill(_pid, SIGTERM);
        int status = 0;
        for (int i = 0; i < 100; ++i) {
            if (::waitpid(_pid, &status, WNOHANG) == _pid) {
                _pid = -1;
                return;
            }
            std::this_thread::sleep_for(50ms);
        }
        ::kill(_pid, SIGKILL);
        ::waitpid(_pid, &status, 0);
        _pid = -1;
    }

    std::string socket;

private:
    fs::path _dir;
    pid_t _pid = -1;
};

// A credential over payload from the munged at socket (ttl 0: its default).
std::string encode(const std::string& socket, const std::string& payload, int ttl = 0) {
    munge_ctx_t ctx = munge_ctx_create();
    munge_ctx_set(ctx, MUNGE_OPT_SOCKET, socket.c_str());
    if (ttl > 0) {
        munge_ctx_set(ctx, MUNGE_OPT_TTL, ttl);
    }
    char* cred = nullptr;
    const munge_err_t e = munge_encode(&cred, ctx, payload.data(), static_cast<int>(payload.size()));
    munge_ctx_destroy(ctx);
    if (e != EMUNGE_SUCCESS) {
        throw std::runtime_error(std::string("munge_encode: ") + munge_strerror(e));
    }
    std::string out(cred);
    std::free(cred);
    return out;
}

// A raw TCP client: lines in and out, every wait bounded.
class raw_tcp {
public:
    explicit raw_tcp(std::uint16_t port) {
        _fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
            throw std::runtime_error("connect 127.0.0.1");
        }
    }
    ~raw_tcp() { ::close(_fd); }
    raw_tcp(const raw_tcp&) = delete;
    raw_tcp& operator=(const raw_tcp&) = delete;

    void send_line(const std::string& s) {
        const std::string l = s + "\n";
        ASSERT_EQ(::send(_fd, l.data(), l.size(), MSG_NOSIGNAL), static_cast<ssize_t>(l.size()));
    }
    // The next line; nullopt at EOF or after the timeout.
    std::optional<std::string> line(std::chrono::milliseconds timeout = 5000ms) {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            if (const auto nl = _in.find('\n'); nl != std::string::npos) {
                std::string l = _in.substr(0, nl);
                _in.erase(0, nl + 1);
                return l;
            }
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            if (left.count() <= 0) {
                return std::nullopt;
            }
            pollfd p{_fd, POLLIN, 0};
            if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
                return std::nullopt;
            }
            char buf[4096];
            const ssize_t n = ::recv(_fd, buf, sizeof buf, 0);
            if (n <= 0) {
                return std::nullopt;
            }
            _in.append(buf, static_cast<std::size_t>(n));
        }
    }
    json next() {
        auto l = line();
        if (!l) {
            return json();
        }
        return json::parse(*l, nullptr, false);
    }
    // After the server's last line: EOF (not a timeout).
    bool closed_by_peer(std::chrono::milliseconds timeout = 5000ms) {
        pollfd p{_fd, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) {
            return false;
        }
        char c = 0;
        return ::recv(_fd, &c, 1, 0) <= 0;
    }
    // The challenge's nonce.
    std::string challenge() {
        const json c = next();
        EXPECT_EQ(c.value("method", ""), "auth.challenge") << c.dump();
        return c["params"].value("nonce", "");
    }
    void auth(const std::string& cred, int id = 1) {
        send_line(json{{"jsonrpc", "2.0"}, {"id", id}, {"method", "auth.munge"},
                       {"params", {{"credential", cred}}}}.dump());
    }

private:
    int _fd = -1;
    std::string _in;
};

std::string cause_of(const json& reply) {
    if (!reply.is_object() || !reply.contains("error")) {
        return "(no error: " + reply.dump() + ")";
    }
    return reply["error"]["data"].value("reason", "?") + "/" + reply["error"]["data"].value("cause", "?");
}

// Server (UNIX socket and 127.0.0.1:0) + ledger + loop thread.
class harness {
public:
    harness(const fs::path& dir, const std::string& munge_socket, rpc::server_options so = {}) {
        socket_path = (dir / "qrtd.sock").string();
        std::vector<tl::qpu_spec> qpus;
        qpus.push_back(tl::qpu_spec{"q0", tl::periodic_calibration{10 * s_ns, s_ns, 0, 0.99, 0}});
        tl::ledger_options lo;
        lo.policy = "edf-backfill";
        fs::remove(dir / "ledger.db");
        auto l = tl::ledger::open(std::move(qpus), lo, (dir / "ledger.db").string(),
                                  rtcore::realtime_now_ns());
        if (!l) {
            throw std::runtime_error(l.err().message);
        }
        ledger = std::move(*l);
        rpc::role_map roles;
        roles.scheduler = {"uid:0"};
        roles.reader = {"uid:65534"};
        auto a = rpc::authorizer::compile(roles);
        if (!a) {
            throw std::runtime_error(a.err().message);
        }
        auth = std::make_unique<rpc::authorizer>(std::move(*a));
        eng = std::make_unique<rpc::engine>(rpc::engine_limits{});
        so.socket_path = socket_path;
        so.socket_mode = 0666;
        so.socket_activation = false;
        so.listen = "tcp://127.0.0.1:0";
        so.munge_socket = munge_socket;
        srv = std::make_unique<rpc::server>(loop, *eng, *auth, so);
        hooks.status = [] { return json{{"health", "ok"}}; };
        hooks.transport = [this] { return srv->stats(); };
        rpc::register_agent_methods(*eng, hooks);
        rpc::timeline_options to;
        to.now_ns = [] { return rtcore::realtime_now_ns(); };
        rpc::register_timeline_methods(*eng, *ledger, to);
        if (auto st = srv->start(); !st) {
            throw std::runtime_error(st.err().message);
        }
        port = srv->tcp_port();
        thread = std::thread([this] { loop.run(); });
    }
    ~harness() {
        std::promise<void> done;
        loop.post([&] {
            srv->stop();
            done.set_value();
        });
        done.get_future().wait();
        loop.stop();
        thread.join();
    }
    std::string url() const { return fmt::format("tcp://127.0.0.1:{}", port); }
    std::string metrics() {
        std::promise<std::string> p;
        loop.post([&] {
            auto t = qrt::telemetry::to_prometheus(srv->stats());
            p.set_value(t ? *t : std::string());
        });
        return p.get_future().get();
    }

    std::string socket_path;
    std::uint16_t port = 0;
    qrt::event_loop loop;
    std::unique_ptr<tl::ledger> ledger;
    std::unique_ptr<rpc::authorizer> auth;
    std::unique_ptr<rpc::engine> eng;
    rpc::agent_hooks hooks;
    std::unique_ptr<rpc::server> srv;
    std::thread thread;
};

class munge_listener : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        if (which("munged").empty() || which("mungekey").empty()) {
            skip_reason = "munged or mungekey is not installed (tools/quickstart/deps.sh installs munge)";
            return;
        }
        dir = fs::temp_directory_path() / fmt::format("qrt-munge-{}", ::getpid());
        fs::create_directories(dir);
        fs::permissions(dir, fs::perms(0755));
        try {
            key_a = std::make_unique<munged>(dir, "a");
            key_b = std::make_unique<munged>(dir, "b");
        } catch (const std::exception& e) {
            skip_reason = std::string("cannot start munged here: ") + e.what();
        }
    }
    static void TearDownTestSuite() {
        key_a.reset();
        key_b.reset();
        if (!dir.empty()) {
            fs::remove_all(dir);
        }
    }
    void SetUp() override {
        if (!skip_reason.empty()) {
            GTEST_SKIP() << skip_reason;
        }
    }
    harness& h(rpc::server_options so = {}) {
        if (!_h) {
            _h = std::make_unique<harness>(dir, key_a->socket, std::move(so));
        }
        return *_h;
    }
    qrt::client::connect_options client_options() const {
        qrt::client::connect_options co;
        co.munge_socket = key_a->socket;
        return co;
    }

    static inline std::string skip_reason;
    static inline fs::path dir;
    static inline std::unique_ptr<munged> key_a;
    static inline std::unique_ptr<munged> key_b;
    std::unique_ptr<harness> _h;
};

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
    t.auth(encode(key_b->socket, rpc::auth_payload(nonce)));
    EXPECT_EQ(cause_of(t.next()), "unauthenticated/invalid");
    EXPECT_TRUE(t.closed_by_peer());
}

TEST_F(munge_listener, a_credential_used_once_is_refused_on_another_connection) {
    raw_tcp first(h().port);
    const std::string cred = encode(key_a->socket, rpc::auth_payload(first.challenge()));
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
    third.auth(encode(key_a->socket, rpc::auth_payload("00112233445566778899aabbccddeeff")));
    EXPECT_EQ(cause_of(third.next()), "unauthenticated/nonce_mismatch");
    EXPECT_TRUE(third.closed_by_peer());
    // The first connection is served.
    first.send_line(R"({"jsonrpc":"2.0","id":2,"method":"agent.hello"})");
    EXPECT_TRUE(first.next().contains("result"));
}

TEST_F(munge_listener, an_expired_credential_is_refused) {
    raw_tcp t(h().port);
    const std::string nonce = t.challenge();
    const std::int64_t made = ::time(nullptr);
    const std::string cred = encode(key_a->socket, rpc::auth_payload(nonce), 1);
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
    t.auth(encode(key_a->socket, rpc::auth_payload(t.challenge())));
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

}  // namespace

namespace {

// The Python client (tools/python/qrt_client.py) over tcp://: a good
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
