// The network listener against hostile peers, with a REAL munged (the
// harness of munge_harness.hpp): a relay that passes the real qrtd's
// challenge to a client must not get the client's credential accepted, and
// unauthenticated connections flooding it from two source addresses must
// not keep local users out or take the slots of authenticated peers.
//
// Skips, naming why, without munge installed, and when not root (a local
// connection of another uid needs a thread of that uid).
#include <sys/syscall.h>

#include <latch>
#include <map>
#include <mutex>

#include "munge_harness.hpp"
#include "qrt_test/rpc_client.hpp"

namespace {

using namespace qrt_munge_test;

// A peer that connects from `source` and never authenticates, holding up
// to `keep` connections: each one the server closes (or refuses) is
// re-opened at once, for as long as it runs.
class flood {
public:
    flood(std::uint16_t port, const char* source, std::size_t keep)
        : _thread([this, port, source, keep] { run(port, source, keep); }) {}
    ~flood() {
        _stop = true;
        _thread.join();
    }
    flood(const flood&) = delete;
    flood& operator=(const flood&) = delete;

    // Connections refused at once (the server's first line an error), by
    // data.cause.
    std::map<std::string, int> refusals() const {
        const std::lock_guard<std::mutex> lock(_mu);
        return _refusals;
    }
    int refused() const { return _refused.load(); }
    // Connections that got a challenge, then were closed by the server.
    int closed_by_server() const { return _closed.load(); }
    std::size_t most_held() const { return _most_held.load(); }

private:
    void run(std::uint16_t port, const char* source, std::size_t keep) {
        std::vector<std::unique_ptr<raw_tcp>> open;
        while (!_stop) {
            // A connection with anything to read is being closed by the
            // server (its auth timeout line): let it go.
            for (auto it = open.begin(); it != open.end();) {
                pollfd p{(*it)->fd(), POLLIN, 0};
                if (::poll(&p, 1, 0) == 1) {
                    ++_closed;
                    it = open.erase(it);
                } else {
                    ++it;
                }
            }
            bool refused_now = false;
            while (open.size() < keep && !refused_now && !_stop) {
                std::unique_ptr<raw_tcp> t;
                try {
                    t = std::make_unique<raw_tcp>(port, source);
                } catch (const std::exception&) {
                    refused_now = true;  // the backlog is full: try again shortly
                    break;
                }
                const auto first = t->line(2000ms);
                const json j = first ? json::parse(*first, nullptr, false) : json();
                if (j.is_object() && j.value("method", "") == "auth.challenge") {
                    open.push_back(std::move(t));
                    _most_held = std::max(_most_held.load(), open.size());
                    continue;
                }
                refused_now = true;
                ++_refused;
                const std::string cause = j.is_object() && j.contains("error")
                                              ? j["error"]["data"].value("cause", "(none)")
                                              : std::string("(no line)");
                const std::lock_guard<std::mutex> lock(_mu);
                ++_refusals[cause];
            }
            std::this_thread::sleep_for(5ms);
        }
    }

    std::atomic<bool> _stop{false};
    std::atomic<int> _refused{0};
    std::atomic<int> _closed{0};
    std::atomic<std::size_t> _most_held{0};
    mutable std::mutex _mu;
    std::map<std::string, int> _refusals;
    std::thread _thread;
};

// A connection to the UNIX socket made by a thread that holds `uid` (the
// kernel takes SO_PEERCRED from the connecting thread's credentials).
std::unique_ptr<qrt::testing::rpc_client> connect_as(const std::string& path, uid_t uid) {
    std::unique_ptr<qrt::testing::rpc_client> out;
    std::thread t([&] {
        const gid_t g = uid;
        if (::syscall(SYS_setgroups, 1, &g) != 0 || ::syscall(SYS_setresgid, g, g, g) != 0 ||
            ::syscall(SYS_setresuid, uid, uid, uid) != 0) {
            return;
        }
        out = std::make_unique<qrt::testing::rpc_client>(path);
    });
    t.join();
    return out;
}

// agent.hello on a fresh UNIX connection of uid: the reply ("" when served,
// else what came instead).
std::string hello_refusal(const std::string& path, uid_t uid) {
    auto c = connect_as(path, uid);
    if (!c || !c->connected()) {
        return "could not connect as uid " + std::to_string(uid);
    }
    const json r = c->call("agent.hello");
    return r.contains("result") ? std::string() : r.dump();
}

// An authenticated peer from `source`: the reply to its auth.munge and
// agent.hello ("" when served).
std::string remote_refusal(std::uint16_t port, const char* source, const std::string& munge_socket) {
    std::unique_ptr<raw_tcp> t;
    try {
        t = std::make_unique<raw_tcp>(port, source);
    } catch (const std::exception& e) {
        return e.what();
    }
    const auto first = t->line(5000ms);
    const json challenge = first ? json::parse(*first, nullptr, false) : json();
    if (!challenge.is_object() || challenge.value("method", "") != "auth.challenge") {
        return "instead of a challenge: " + (first ? *first : std::string("nothing"));
    }
    t->auth(encode(munge_socket, t->payload(challenge["params"].value("nonce", ""))));
    const json authed = t->next();
    if (!authed.contains("result")) {
        return "auth.munge: " + authed.dump();
    }
    t->send_line(R"({"jsonrpc":"2.0","id":2,"method":"agent.hello"})");
    const json hello = t->next();
    return hello.contains("result") ? std::string() : "agent.hello: " + hello.dump();
}

// A relay a client can be steered to (its own listener on 127.0.0.1, a
// port of its own): each connection it accepts is passed on, byte for byte
// both ways, to the real listener at `port`.
class relay {
public:
    explicit relay(std::uint16_t port) : _to(port) {
        _listen = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        if (_listen < 0 || ::bind(_listen, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
            ::listen(_listen, 8) != 0 || ::getsockname(_listen, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
            throw std::runtime_error("relay: bind 127.0.0.1");
        }
        _port = ntohs(a.sin_port);
        _thread = std::thread([this] { serve(); });
    }
    ~relay() {
        _stop = true;
        _thread.join();
        ::close(_listen);
    }
    relay(const relay&) = delete;
    relay& operator=(const relay&) = delete;
    std::string url() const { return fmt::format("tcp://127.0.0.1:{}", _port); }
    int relayed() const { return _relayed.load(); }

private:
    void serve() {
        while (!_stop) {
            pollfd p{_listen, POLLIN, 0};
            if (::poll(&p, 1, 50) != 1) {
                continue;
            }
            const int in = ::accept4(_listen, nullptr, nullptr, SOCK_CLOEXEC);
            if (in < 0) {
                continue;
            }
            ++_relayed;
            const int out = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_port = htons(_to);
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            if (::connect(out, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
                pass(in, out);
            }
            ::close(out);
            ::close(in);
        }
    }
    // Both ways until either side closes (or the relay stops).
    void pass(int a, int b) {
        char buf[4096];
        while (!_stop) {
            pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
            if (::poll(p, 2, 50) <= 0) {
                continue;
            }
            for (int i = 0; i < 2; ++i) {
                if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
                    continue;
                }
                const ssize_t n = ::recv(p[i].fd, buf, sizeof buf, 0);
                if (n <= 0 || ::send(i == 0 ? b : a, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL) != n) {
                    return;
                }
            }
        }
    }
    std::uint16_t _to;
    std::uint16_t _port = 0;
    int _listen = -1;
    std::atomic<bool> _stop{false};
    std::atomic<int> _relayed{0};
    std::thread _thread;
};

// A client steered to a relay (a squatted port, a wrong QRT_SOCKET, a node
// entry naming the wrong host) gets the real qrtd's challenge through it
// and signs a credential: the credential names the relay's address, so the
// real qrtd refuses it, says why, and serves nothing.  libqrt-client (and
// qrtctl on it) and the Python client alike; dialled directly they are
// served.
TEST_F(munge_listener, a_credential_made_for_a_relay_does_not_open_the_qrtd_behind_it) {
    harness& hh = h();
    relay r(hh.port);
    auto through = qrt::client::connection::open(r.url(), client_options());
    ASSERT_EQ(through.index(), 1U) << "libqrt-client was authenticated through a relay at " << r.url();
    const auto& e = std::get<1>(through);
    EXPECT_EQ(e.reason, "unauthenticated") << e.message;
    EXPECT_EQ(e.data.value("cause", ""), "address_mismatch") << e.message;
    EXPECT_NE(e.message.find(r.url()), std::string::npos) << e.message;  // what it was made for
    EXPECT_NE(e.message.find(hh.url()), std::string::npos) << e.message;  // what this qrtd is
    EXPECT_GE(r.relayed(), 1);
    auto direct = qrt::client::connection::open(hh.url(), client_options());
    EXPECT_EQ(direct.index(), 0U) << std::get<1>(direct).message;

    const std::string qrtctl = std::getenv("QRTCTL") != nullptr ? std::getenv("QRTCTL") : QRT_TEST_QRTCTL;
    qrt::testing::run_options ro;
    ro.env = {"QRT_MUNGE_SOCKET=" + key_a->socket};
    const auto ctl = qrt::testing::run({qrtctl, "--socket", r.url(), "agent", "hello"}, ro);
    EXPECT_EQ(ctl.exit_code, 22) << ctl.out << ctl.err;  // unauthenticated
    EXPECT_NE(ctl.err.find("is not this qrtd (" + hh.url()), std::string::npos) << ctl.err;

    const std::string python = which("python3");
    if (python.empty()) {
        GTEST_SKIP() << "python3 is not installed: the Python client is not tried";
    }
    const std::string script = R"(
import json, sys
sys.path.insert(0, sys.argv[1])
from qrt_client import Client, QrtError
try:
    with Client(sys.argv[2], munge_socket=sys.argv[3]) as c:
        print(json.dumps({"peer": c.hello()["peer"]}))
except QrtError as e:
    print(json.dumps({"reason": e.reason, "message": e.message,
                      "cause": (getattr(e, "data", None) or {}).get("cause", "")}))
)";
    for (const std::string& where : {r.url(), hh.url()}) {
        const auto py = qrt::testing::run({python, "-c", script, QRT_TEST_PYTHON_DIR, where, key_a->socket});
        ASSERT_EQ(py.exit_code, 0) << py.err;
        const json got = json::parse(py.out, nullptr, false);
        if (where == hh.url()) {
            EXPECT_EQ(got["peer"].value("uid", -1), static_cast<int>(::geteuid())) << got.dump();
        } else {
            EXPECT_EQ(got.value("reason", ""), "unauthenticated") << got.dump();
            EXPECT_EQ(got.value("cause", ""), "address_mismatch") << got.dump();
            EXPECT_NE(got.value("message", "").find(r.url()), std::string::npos) << got.dump();
        }
    }
}

// Many clients of one node connecting at the same moment (the tasks of a
// Slurm step) meet the cap per host before authentication: a refusal at
// accept for that cap is passing, and libqrt-client and the Python client
// try again within their connect timeout, so every one of them gets in.
TEST_F(munge_listener, a_burst_of_clients_from_one_host_all_get_in) {
    rpc::server_options so;
    so.max_unauthenticated_per_host = 2;
    harness& hh = h(so);
    constexpr int clients = 16;
    std::vector<std::string> failed(clients);
    {
        std::latch go(clients);
        std::vector<std::thread> ts;
        for (int i = 0; i < clients; ++i) {
            ts.emplace_back([&, i] {
                auto co = client_options();
                co.connect_timeout = 20s;  // generous: a loaded machine; a retry takes milliseconds
                go.arrive_and_wait();
                auto r = qrt::client::connection::open(hh.url(), co);
                if (r.index() == 1) {
                    failed[static_cast<std::size_t>(i)] = std::get<1>(r).message;
                }
            });
        }
        for (auto& t : ts) {
            t.join();
        }
    }
    for (int i = 0; i < clients; ++i) {
        EXPECT_EQ(failed[static_cast<std::size_t>(i)], "") << "client " << i;
    }
    const std::string m = hh.metrics();
    EXPECT_EQ(m.find("qrt_rpc_connections_rejected_total{cause=\"unauthenticated_per_host\"} 0"), std::string::npos)
        << "the burst never met the cap, so it tested nothing";

    const std::string python = which("python3");
    if (python.empty()) {
        GTEST_SKIP() << "python3 is not installed: the Python client is not tried";
    }
    const std::string script = R"(
import sys, threading
sys.path.insert(0, sys.argv[1])
from qrt_client import Client, QrtError
failed = []
go = threading.Barrier(12)
def one():
    go.wait()
    try:
        with Client(sys.argv[2], connect_timeout=20, munge_socket=sys.argv[3]) as c:
            c.hello()
    except QrtError as e:
        failed.append(f"{e.reason}: {e.message}")
ts = [threading.Thread(target=one) for _ in range(12)]
[t.start() for t in ts]
[t.join() for t in ts]
print("\n".join(failed) or "all in")
)";
    qrt::testing::run_options ro;
    ro.timeout = 60s;
    const auto py = qrt::testing::run({python, "-c", script, QRT_TEST_PYTHON_DIR, hh.url(), key_a->socket}, ro);
    EXPECT_EQ(py.exit_code, 0) << py.err;
    EXPECT_EQ(py.out, "all in\n") << py.err;
}

// Two hosts (127.0.0.1 and 127.0.0.2) hold every connection they may before
// authentication and re-open each one the auth timeout closes.  Meanwhile
// root and an ordinary user are served on the UNIX socket, never
// `overloaded`, and a peer from a third address authenticates and is
// served: unauthenticated connections have a pool of their own, outside
// rpc.max_connections, and a low cap per host.
TEST_F(munge_listener, an_unauthenticated_flood_from_two_hosts_keeps_no_one_out) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to connect as a second uid";
    }
    rpc::server_options so;
    so.max_connections = 64;  // the daemon's defaults (qrtd.toml(5))
    so.reserved_connections = 8;
    so.max_connections_per_host = 32;
    so.auth_timeout = 1000ms;  // the flood turns over within the test
    harness& hh = h(so);
    constexpr std::size_t keep = 40;  // more than any cap per host lets through
    flood one(hh.port, "127.0.0.1", keep);
    flood two(hh.port, "127.0.0.2", keep);
    // Both have reached their cap (bounded wait).
    for (int i = 0; i < 400 && (one.refused() == 0 || two.refused() == 0); ++i) {
        std::this_thread::sleep_for(25ms);
    }
    ASSERT_GT(one.refused(), 0) << "the flood from 127.0.0.1 was never refused";
    ASSERT_GT(two.refused(), 0) << "the flood from 127.0.0.2 was never refused";

    // Over three auth timeouts, while the flood re-opens what is closed.
    std::vector<std::string> failures;
    const auto until = std::chrono::steady_clock::now() + 3 * so.auth_timeout;
    int rounds = 0;
    while (std::chrono::steady_clock::now() < until || rounds < 10) {
        ++rounds;
        if (auto r = hello_refusal(hh.socket_path, 0); !r.empty()) {
            failures.push_back("root: " + r);
        }
        if (auto r = hello_refusal(hh.socket_path, 65534); !r.empty()) {
            failures.push_back("uid 65534: " + r);
        }
        if (rounds % 5 == 1) {
            if (auto r = remote_refusal(hh.port, "127.0.0.3", key_a->socket); !r.empty()) {
                failures.push_back("remote peer from 127.0.0.3: " + r);
            }
        }
        std::this_thread::sleep_for(50ms);
    }
    EXPECT_TRUE(failures.empty()) << failures.size() << " refusals in " << rounds << " rounds, first: "
                                  << (failures.empty() ? std::string() : failures.front());
    EXPECT_GT(one.closed_by_server() + two.closed_by_server(), 0) << "the flood never turned over";
    for (const flood* f : {&one, &two}) {
        const auto seen = f->refusals();
        EXPECT_GT(seen.count("unauthenticated_per_host"), 0U)
            << "refused as: " << json(seen).dump();
        EXPECT_LE(f->most_held(), so.max_unauthenticated_per_host);
    }
}

}  // namespace
