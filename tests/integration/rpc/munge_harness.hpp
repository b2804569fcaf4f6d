#pragma once
// What the network listener's tests share: munged daemons started by the
// test (each its own key made by mungekey, its own socket and state under a
// temporary directory, ended by pid), credentials from them, a raw TCP
// client with bounded waits, and the server (UNIX socket and 127.0.0.1:0)
// with a real ledger on a loop thread, behind the munge_listener fixture
// (which skips, naming why, without munge installed).
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
#include "qrt_test/rpc_client.hpp"
#include "rtcore/clock.hpp"

namespace qrt_munge_test {

using namespace std::chrono_literals;
using qrt::rpc::json;
namespace rpc = qrt::rpc;
namespace tl = qrt::timeline;
namespace fs = std::filesystem;

constexpr std::int64_t s_ns = 1'000'000'000;

inline std::string which(const std::string& name) {
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
inline std::string encode(const std::string& socket, const std::string& payload, int ttl = 0) {
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
    // To 127.0.0.1:port from `source` (any address of 127.0.0.0/8 is this
    // host's: a second source address without a network namespace).
    explicit raw_tcp(std::uint16_t port, const char* source = "127.0.0.1") {
        _fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in from{};
        from.sin_family = AF_INET;
        if (::inet_pton(AF_INET, source, &from.sin_addr) != 1 ||
            ::bind(_fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) {
            ::close(_fd);
            throw std::runtime_error(std::string("bind ") + source);
        }
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
            ::close(_fd);
            throw std::runtime_error(std::string("connect 127.0.0.1 from ") + source);
        }
    }
    int fd() const noexcept { return _fd; }
    // The address this socket dialled, as a credential names it.
    std::string dialled() const {
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        (void)::getpeername(_fd, reinterpret_cast<sockaddr*>(&ss), &len);
        return rpc::tcp_address_text(reinterpret_cast<const sockaddr*>(&ss));
    }
    // What a client signs for this connection's challenge `nonce`.
    std::string payload(const std::string& nonce) const { return rpc::auth_payload(nonce, dialled()); }
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
    void send_raw(const std::string& s) {
        ASSERT_EQ(::send(_fd, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
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

inline std::string cause_of(const json& reply) {
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
            skip_reason = "munged or mungekey is not installed (tools/dev/deps.sh installs munge)";
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

}  // namespace qrt_munge_test
