// rpc-remote-vs-echo: what the network listener (rpc.listen) costs, in one run.
//
//   1. the floor: a raw TCP echo server and client on 127.0.0.1, or with
//      --veth across a veth pair between two network namespaces the bench
//      makes (server side 10.78.0.1, client side 10.78.0.2; needs root and
//      iproute2), one line out, the same line back;
//   2. qrtd's socket side (the real rpc server, engine and methods, in this
//      process on its own event-loop thread, as bench/rpc/rpc-vs-echo) on
//      its network listener, the connection authenticated with MUNGE first,
//      answering agent.hello, then slots.query with --reservations in the
//      ledger;
//   3. the cost of authentication per connection: connect + auth.challenge
//      + munge_encode + auth.munge (munged decodes, NSS, roles) until the
//      result is read, against a bare TCP connect that reads the challenge;
//      and munge_encode and munge_decode alone;
//   4. the real daemon: `qrtd run` (the binary, untuned, host untouched, a
//      write-only file:///dev/null endpoint, its ledger on disk under --dir
//      with group commit on its writer thread) serving its UNIX socket and
//      its network listener on the server address; --reserve-clients K
//      (default 4) connections, each pipelining --reserves slots.reserve
//      (a window of 32 in flight), over the UNIX socket and over TCP
//      (authenticated) in --reserve-rounds alternating rounds: acknowledged
//      reservations per second on each path, medians, and TCP / UNIX.
// Round trips are one request at a time, the same raw line client for the
// echo floor and the agent (it never parses replies).  Goal: remote p50 <=
// 2x the TCP echo.  Needs a running munged (--munge-socket, default
// libmunge's).  Prints the load average, a table and ends with ONE JSON
// line.
//
//   build/bench/rpc/rpc-remote-vs-echo [--munge-socket PATH] [--rtt-count 5000]
//       [--connections 200] [--reservations 1000] [--veth]
//       [--reserve-clients 4] [--reserves 2000] [--reserve-rounds 3]
//       [--qrtd build/agent/qrtd] [--dir /var/tmp]

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <munge.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "connection.hpp"
#include "qrt/rpc/munge_auth.hpp"
#include "rtcore/clock.hpp"
#include "test_agent.hpp"

namespace {

using clk = std::chrono::steady_clock;
using json = nlohmann::json;

double quantile(std::vector<std::int64_t> v, double q) {
    if (v.empty()) {
        return 0.0;
    }
    std::sort(v.begin(), v.end());
    const auto idx = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    return static_cast<double>(v[std::min(idx, v.size() - 1)]);
}

std::int64_t ns_since(clk::time_point t0) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - t0).count();
}

// Where the servers listen: 127.0.0.1, or the veth's server side.
std::string g_server_addr = "127.0.0.1";

int connect_tcp(std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    (void)::inet_pton(AF_INET, g_server_addr.c_str(), &a.sin_addr);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        throw std::runtime_error("connect " + g_server_addr + ": " + std::strerror(errno));
    }
    const int one = 1;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

// Two network namespaces joined by a veth pair, made with ip(8) and
// removed at the end; enter() moves the calling thread (sockets keep the
// namespace they were made in).
class veth_pair {
public:
    veth_pair() {
        const std::string tag = "qrtb" + std::to_string(::getpid());
        _a = tag + "-srv";
        _b = tag + "-cli";
        _orig = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
        const std::string cmds[] = {
            "ip netns add " + _a, "ip netns add " + _b,
            "ip -n " + _a + " link add eth0 type veth peer name eth0 netns " + _b,
            "ip -n " + _a + " addr add 10.78.0.1/24 dev eth0",
            "ip -n " + _b + " addr add 10.78.0.2/24 dev eth0",
            "ip -n " + _a + " link set eth0 up", "ip -n " + _b + " link set eth0 up",
            "ip -n " + _a + " link set lo up", "ip -n " + _b + " link set lo up"};
        for (const auto& c : cmds) {
            if (std::system((c + " 2>&1").c_str()) != 0) {
                remove();
                throw std::runtime_error("--veth: `" + c + "` failed (root and iproute2 needed)");
            }
        }
        _fa = ::open(("/run/netns/" + _a).c_str(), O_RDONLY | O_CLOEXEC);
        _fb = ::open(("/run/netns/" + _b).c_str(), O_RDONLY | O_CLOEXEC);
        if (_orig < 0 || _fa < 0 || _fb < 0) {
            remove();
            throw std::runtime_error("--veth: cannot open the namespaces");
        }
    }
    ~veth_pair() { remove(); }
    veth_pair(const veth_pair&) = delete;
    veth_pair& operator=(const veth_pair&) = delete;
    void enter_server() const { enter(_fa); }
    void enter_client() const { enter(_fb); }

private:
    static void enter(int fd) {
        if (::setns(fd, CLONE_NEWNET) != 0) {
            throw std::runtime_error(std::string("setns: ") + std::strerror(errno));
        }
    }
    void remove() {
        if (_orig >= 0) {
            (void)::setns(_orig, CLONE_NEWNET);
        }
        for (int* fd : {&_fa, &_fb, &_orig}) {
            if (*fd >= 0) {
                ::close(*fd);
                *fd = -1;
            }
        }
        for (const auto& ns : {_a, _b}) {
            if (!ns.empty()) {
                (void)std::system(("ip netns del " + ns + " 2>/dev/null").c_str());
            }
        }
        _a.clear();
        _b.clear();
    }
    std::string _a;
    std::string _b;
    int _orig = -1;
    int _fa = -1;
    int _fb = -1;
};

// A TCP echo on the server address, one connection at a time.
class echo_server {
public:
    echo_server() {
        _listen = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        (void)::inet_pton(AF_INET, g_server_addr.c_str(), &a.sin_addr);
        socklen_t len = sizeof a;
        if (_listen < 0 || ::bind(_listen, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
            ::listen(_listen, 16) != 0 || ::getsockname(_listen, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
            throw std::runtime_error(std::string("echo bind: ") + std::strerror(errno));
        }
        port = ntohs(a.sin_port);
        _thread = std::thread([this] { serve(); });
    }
    ~echo_server() {
        ::shutdown(_listen, SHUT_RDWR);
        ::close(_listen);
        _thread.join();
    }
    std::uint16_t port = 0;

private:
    void serve() {
        for (;;) {
            const int c = ::accept4(_listen, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) {
                return;
            }
            const int one = 1;
            (void)::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            std::vector<char> buf(64 * 1024);
            for (;;) {
                const ssize_t n = ::recv(c, buf.data(), buf.size(), 0);
                if (n <= 0 || ::send(c, buf.data(), static_cast<std::size_t>(n), MSG_NOSIGNAL) != n) {
                    break;
                }
            }
            ::close(c);
        }
    }
    int _listen = -1;
    std::thread _thread;
};

// One line out, reads until one newline back; never parses.
std::int64_t round_trip(int fd, const std::string& line, std::vector<char>& buf) {
    const auto t0 = clk::now();
    if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
        throw std::runtime_error("send");
    }
    for (;;) {
        const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
        if (n <= 0) {
            throw std::runtime_error("recv: closed");
        }
        if (std::memchr(buf.data(), '\n', static_cast<std::size_t>(n)) != nullptr) {
            break;
        }
    }
    return ns_since(t0);
}

struct rtt {
    double p50 = 0;
    double p99 = 0;
};

rtt measure(int fd, const std::string& line, int count) {
    std::vector<char> buf(1 << 20);
    for (int i = 0; i < std::min(count / 10, 500); ++i) {
        (void)round_trip(fd, line, buf);  // warm-up
    }
    std::vector<std::int64_t> s;
    s.reserve(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) {
        s.push_back(round_trip(fd, line, buf));
    }
    return {quantile(s, 0.5), quantile(s, 0.99)};
}

// An authenticated connection's fd, blocking, for the raw client.
std::unique_ptr<qrt::client::connection> open_remote(std::uint16_t port, const std::string& munge_socket) {
    qrt::client::connect_options co;
    co.munge_socket = munge_socket;
    auto r = qrt::client::connection::open("tcp://" + g_server_addr + ":" + std::to_string(port), co);
    if (auto* e = std::get_if<qrt::client::call_error>(&r)) {
        throw std::runtime_error(e->message);
    }
    auto c = std::move(std::get<0>(r));
    const int flags = ::fcntl(c->fd(), F_GETFL);
    (void)::fcntl(c->fd(), F_SETFL, flags & ~O_NONBLOCK);
    return c;
}

// n slots.reserve pipelined on fd, `window` in flight; returns when every
// reply is in, the number that are not results.  Each its own key and
// not-before, so none collide.
int pipelined_reserves(int fd, const std::string& tag, int client, int n, int window, std::int64_t base_ns) {
    std::vector<char> buf(1 << 16);
    std::string in;
    int sent = 0;
    int got = 0;
    int errors = 0;
    auto send_one = [&] {
        const std::int64_t nb = base_ns + (static_cast<std::int64_t>(client) * n + sent) * 2'000'000;
        const std::string line = R"({"jsonrpc":"2.0","id":)" + std::to_string(sent) +
                                 R"(,"method":"slots.reserve","params":{"duration_ns":1000000,"qpus":["qpu0"],)"
                                 R"("idempotency_key":"bench-)" + tag + "-" +
                                 std::to_string(client) + "-" + std::to_string(sent) +
                                 R"(","not_before_ns":)" + std::to_string(nb) + "}}\n";
        if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
            throw std::runtime_error("send");
        }
        ++sent;
    };
    while (sent < std::min(window, n)) {
        send_one();
    }
    while (got < n) {
        const ssize_t r = ::recv(fd, buf.data(), buf.size(), 0);
        if (r <= 0) {
            throw std::runtime_error("recv: closed");
        }
        in.append(buf.data(), static_cast<std::size_t>(r));
        std::size_t pos = 0;
        for (std::size_t nl; (nl = in.find('\n', pos)) != std::string::npos; pos = nl + 1) {
            errors += in.find("\"result\"", pos) > nl ? 1 : 0;
            ++got;
            if (sent < n) {
                send_one();
            }
        }
        in.erase(0, pos);
    }
    return errors;
}

// `qrtd run`, the binary, on a fresh state directory: its UNIX socket and
// its network listener on the server address; ended by pid.
class qrtd_process {
public:
    qrtd_process(const std::string& qrtd, const std::filesystem::path& dir, const std::string& munge_socket) {
        namespace fs = std::filesystem;
        fs::remove_all(dir);
        fs::create_directories(dir / "state");
        sock = (dir / "qrtd.sock").string();
        port = free_port();
        _log = (dir / "qrtd.log").string();
        std::ofstream cfg(dir / "qrtd.toml");
        cfg << "[agent]\nlog_level = \"warn\"\nwatchdog = false\nuser = \"root\"\n"
            << "[host]\napply_on_run = false\n[dispatch]\nmode = \"untuned\"\n"
            << "[timeline]\npolicy = \"fifo\"\nhorizon_ns = 3_600_000_000_000\n"
            << "default_lease_ns = 3_600_000_000_000\n"
            << "[rpc]\nsocket_path = \"" << sock << "\"\nmax_inflight = 64\n"
            << "listen = \"tcp://" << g_server_addr << ":" << port << "\"\n"
            << (munge_socket.empty() ? std::string() : "munge_socket = \"" + munge_socket + "\"\n")
            << "[roles]\nreader = []\nscheduler = [\"uid:" << ::geteuid()
            << "\"]\ncalibration = []\nadmin = []\n[probes]\nenabled = false\n"
            << "[tenants]\nmax_reservations = 1000000\nmax_requests_per_s = 0\n"
            << "[[qpu]]\nname = \"qpu0\"\nendpoint = \"file:///dev/null\"\ncalibration = \"periodic\"\n"
            << "period_ns = 1_000_000_000\nblackout_ns = 100_000_000\nfidelity_f0 = 0.99\n";
        cfg.close();
        const std::string cfg_path = (dir / "qrtd.toml").string();
        const std::string state = (dir / "state").string();
        std::fflush(nullptr);  // the child must not write our buffered output again
        _pid = ::fork();
        if (_pid == 0) {
            std::FILE* f = std::freopen(_log.c_str(), "w", stdout);
            (void)f;
            ::dup2(STDOUT_FILENO, STDERR_FILENO);
            ::execl(qrtd.c_str(), qrtd.c_str(), "run", "-c", cfg_path.c_str(), "--state-dir", state.c_str(),
                    static_cast<char*>(nullptr));
            ::_exit(127);
        }
        for (int i = 0; i < 400; ++i) {
            const int fd = connect_unix(sock);
            if (fd >= 0) {
                ::close(fd);
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        stop();
        throw std::runtime_error("qrtd did not come up; see " + _log);
    }
    ~qrtd_process() { stop(); }
    qrtd_process(const qrtd_process&) = delete;
    qrtd_process& operator=(const qrtd_process&) = delete;

    static int connect_unix(const std::string& path) {
        const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
        if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
            ::close(fd);
            return -1;
        }
        return fd;
    }

    std::string sock;
    std::uint16_t port = 0;

private:
    static std::uint16_t free_port() {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        (void)::inet_pton(AF_INET, g_server_addr.c_str(), &a.sin_addr);
        socklen_t len = sizeof a;
        if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
            throw std::runtime_error(std::string("bind for a free port: ") + std::strerror(errno));
        }
        ::close(fd);
        return ntohs(a.sin_port);
    }
    void stop() {
        if (_pid > 0) {
            ::kill(_pid, SIGTERM);
            ::waitpid(_pid, nullptr, 0);
            _pid = -1;
        }
    }
    pid_t _pid = -1;
    std::string _log;
};

// K connections (made by `open`) each pipelining n slots.reserve at once:
// acknowledged reservations per second of wall time, errors counted.
double reserve_rate(const std::function<int()>& open, const std::string& tag, int clients, int n,
                    std::int64_t base_ns, int& errors) {
    std::vector<int> fds;
    for (int i = 0; i < clients; ++i) {
        fds.push_back(open());
    }
    std::atomic<int> bad{0};
    const auto t0 = clk::now();
    {
        std::vector<std::thread> ts;
        for (int i = 0; i < clients; ++i) {
            ts.emplace_back([&, i] {
                try {
                    bad += pipelined_reserves(fds[static_cast<std::size_t>(i)], tag, i, n, 32, base_ns);
                } catch (const std::exception& ex) {
                    std::fprintf(stderr, "reserve client %d (%s): %s\n", i, tag.c_str(), ex.what());
                    bad += n;
                }
            });
        }
        for (auto& t : ts) {
            t.join();
        }
    }
    const double secs = static_cast<double>(ns_since(t0)) / 1e9;
    for (const int fd : fds) {
        ::close(fd);
    }
    errors += bad.load();
    return secs > 0 ? (static_cast<double>(clients) * n - bad.load()) / secs : 0.0;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"rpc-remote-vs-echo: the MUNGE-authenticated network listener against a TCP echo"};
    std::string munge_socket;
    int count = 5000;
    int connections = 200;
    std::size_t reservations = 1000;
    app.add_option("--munge-socket", munge_socket, "munged's socket (default libmunge's)");
    app.add_option("--rtt-count", count, "round trips per measurement");
    app.add_option("--connections", connections, "connections for the authentication cost");
    app.add_option("--reservations", reservations, "reservations in the ledger for slots.query");
    bool veth = false;
    int reserve_clients = 4;
    int reserves = 2000;
    int reserve_rounds = 3;
    std::string qrtd = QRT_QRTD_PATH;
    std::string base_dir = "/var/tmp";
    app.add_flag("--veth", veth, "across a veth pair between two network namespaces (root)");
    app.add_option("--reserve-clients", reserve_clients, "connections for the durable reserve rate")
        ->check(CLI::Range(1, 64));
    app.add_option("--reserves", reserves, "slots.reserve per connection and round")->check(CLI::Range(1, 1'000'000));
    app.add_option("--reserve-rounds", reserve_rounds, "alternating UNIX/TCP rounds of the durable reserve rate")
        ->check(CLI::Range(1, 20));
    app.add_option("--qrtd", qrtd, "the qrtd binary for the durable reserve rate");
    app.add_option("--dir", base_dir, "where qrtd's state directory goes (a real disk: fsync matters)");
    app.footer("EXAMPLES\n  rpc-remote-vs-echo --munge-socket /tmp/m/sock\n"
               "  rpc-remote-vs-echo --munge-socket /tmp/m/sock --veth --rtt-count 2000");
    CLI11_PARSE(app, argc, argv);
    double load[3] = {0, 0, 0};
    (void)::getloadavg(load, 3);
    std::printf("load average %.2f %.2f %.2f\n", load[0], load[1], load[2]);
    std::unique_ptr<veth_pair> pair;
    if (veth) {
        pair = std::make_unique<veth_pair>();
        g_server_addr = "10.78.0.1";
        pair->enter_server();
    }
    spdlog::set_level(spdlog::level::warn);

    const auto dir = std::filesystem::temp_directory_path() / ("qrt-remote-bench-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    qrt::testing::test_agent_options ao;
    ao.socket_path = (dir / "qrtd.sock").string();
    ao.roles.scheduler = {"uid:" + std::to_string(::geteuid())};
    ao.listen = "tcp://" + g_server_addr + ":0";
    ao.munge_socket = munge_socket;
    ao.max_connections = 4096;
    qrt::testing::test_agent agent(ao);
    const std::size_t placed = agent.prefill(reservations, 1'000'000, "qpu0");
    const std::uint16_t port = agent.tcp_port();
    std::thread loop_thread([&] { agent.loop().run(); });
    // The real daemon, for the durable reserve rate (started in the server's
    // namespace with --veth; its UNIX socket is a path, reachable from both).
    const auto daemon_dir =
        std::filesystem::path(base_dir) / ("qrt-remote-bench-qrtd-" + std::to_string(::getpid()));
    auto daemon = std::make_unique<qrtd_process>(qrtd, daemon_dir, munge_socket);

    echo_server echo;
    if (pair) {
        pair->enter_client();
    }
    const std::string hello = R"({"jsonrpc":"2.0","id":1,"method":"agent.hello"})"
                              "\n";
    const std::string query = R"({"jsonrpc":"2.0","id":2,"method":"slots.query","params":{"duration_ns":1000000,"qpus":["qpu0"]}})"
                              "\n";
    const int efd = connect_tcp(echo.port);
    const rtt e = measure(efd, hello, count);
    ::close(efd);
    auto remote = open_remote(port, munge_socket);
    const rtt h = measure(remote->fd(), hello, count);
    const rtt q = measure(remote->fd(), query, count);
    remote.reset();

    // Authentication per connection.
    std::vector<std::int64_t> auth_ns;
    std::vector<std::int64_t> bare_ns;
    std::vector<char> buf(4096);
    for (int i = 0; i < connections; ++i) {
        auto t0 = clk::now();
        auto c = open_remote(port, munge_socket);
        auth_ns.push_back(ns_since(t0));
        c.reset();
        t0 = clk::now();
        const int fd = connect_tcp(port);
        for (;;) {  // the challenge line
            const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
            if (n <= 0 || std::memchr(buf.data(), '\n', static_cast<std::size_t>(n)) != nullptr) {
                break;
            }
        }
        bare_ns.push_back(ns_since(t0));
        ::close(fd);
    }
    std::vector<std::int64_t> enc_ns;
    std::vector<std::int64_t> dec_ns;
    const std::string dialled = "tcp://" + g_server_addr + ":" + std::to_string(port);
    for (int i = 0; i < connections; ++i) {
        const std::string nonce = qrt::rpc::make_nonce();
        const std::string payload = qrt::rpc::auth_payload(nonce, dialled);
        munge_ctx_t ctx = munge_ctx_create();
        if (!munge_socket.empty()) {
            munge_ctx_set(ctx, MUNGE_OPT_SOCKET, munge_socket.c_str());
        }
        char* cred = nullptr;
        auto t0 = clk::now();
        const munge_err_t err = munge_encode(&cred, ctx, payload.data(), static_cast<int>(payload.size()));
        enc_ns.push_back(ns_since(t0));
        munge_ctx_destroy(ctx);
        if (err != EMUNGE_SUCCESS) {
            std::fprintf(stderr, "munge_encode: %s\n", munge_strerror(err));
            return 1;
        }
        t0 = clk::now();
        auto r = qrt::rpc::munge_check(munge_socket, cred);
        qrt::rpc::check_binding(r, nonce, {dialled});
        dec_ns.push_back(ns_since(t0));
        std::free(cred);
        if (!r.ok) {
            std::fprintf(stderr, "munge_check: %s\n", r.message.c_str());
            return 1;
        }
    }
    // Durable slots.reserve on the real daemon, K connections pipelining at
    // once, over the UNIX socket and over TCP in alternating rounds.
    std::vector<double> unix_rates;
    std::vector<double> tcp_rates;
    int reserve_errors = 0;
    const std::int64_t span_ns = static_cast<std::int64_t>(reserve_clients) * reserves * 2'000'000;
    // Past the near term (tenants.near_term_ns, 600 s), one span per side and round.
    const std::int64_t base_ns = rtcore::realtime_now_ns() + 900'000'000'000;
    const auto open_unix = [&] {
        const int fd = qrtd_process::connect_unix(daemon->sock);
        if (fd < 0) {
            throw std::runtime_error("connect " + daemon->sock + ": " + std::strerror(errno));
        }
        return fd;
    };
    const auto open_tcp = [&] {
        auto c = open_remote(daemon->port, munge_socket);
        return ::dup(c->fd());  // the authenticated socket outlives its client object
    };
    for (int r = 0; r < reserve_rounds; ++r) {
        const std::string tag = std::to_string(r);
        unix_rates.push_back(reserve_rate(open_unix, "u" + tag, reserve_clients, reserves,
                                          base_ns + (2 * r) * span_ns, reserve_errors));
        tcp_rates.push_back(reserve_rate(open_tcp, "t" + tag, reserve_clients, reserves,
                                         base_ns + (2 * r + 1) * span_ns, reserve_errors));
        std::printf("durable slots.reserve round %d: UNIX %.0f/s, TCP %.0f/s\n", r + 1, unix_rates.back(),
                    tcp_rates.back());
    }
    daemon.reset();
    std::filesystem::remove_all(daemon_dir);
    const double unix_rate = median(unix_rates);
    const double tcp_rate = median(tcp_rates);
    agent.loop().stop();
    loop_thread.join();
    std::filesystem::remove_all(dir);

    const double a50 = quantile(auth_ns, 0.5);
    const double b50 = quantile(bare_ns, 0.5);
    const std::string where = pair ? "veth 10.78.0.2 -> .1" : "127.0.0.1";
    std::printf("%-34s %12s %12s %8s\n", ("round trip (" + where + ")").c_str(), "p50 us", "p99 us", "x echo");
    std::printf("%-34s %12.1f %12.1f %8.2f\n", "TCP echo", e.p50 / 1e3, e.p99 / 1e3, 1.0);
    std::printf("%-34s %12.1f %12.1f %8.2f\n", "agent.hello (authenticated TCP)", h.p50 / 1e3, h.p99 / 1e3,
                h.p50 / e.p50);
    std::printf("%-34s %12.1f %12.1f %8.2f\n",
                ("slots.query (" + std::to_string(placed) + " reservations)").c_str(), q.p50 / 1e3,
                q.p99 / 1e3, q.p50 / e.p50);
    std::printf("\n%-34s %12s %12s\n", "per connection", "p50 us", "p99 us");
    std::printf("%-34s %12.1f %12.1f\n", "connect + MUNGE authentication", a50 / 1e3, quantile(auth_ns, 0.99) / 1e3);
    std::printf("%-34s %12.1f %12.1f\n", "connect + challenge only", b50 / 1e3, quantile(bare_ns, 0.99) / 1e3);
    std::printf("%-34s %12.1f %12.1f\n", "munge_encode (client)", quantile(enc_ns, 0.5) / 1e3,
                quantile(enc_ns, 0.99) / 1e3);
    std::printf("%-34s %12.1f %12.1f\n", "munge_decode + payload (server)", quantile(dec_ns, 0.5) / 1e3,
                quantile(dec_ns, 0.99) / 1e3);
    std::printf("\nqrtd run, %d clients x %d pipelined durable slots.reserve, median of %d rounds:\n",
                reserve_clients, reserves, reserve_rounds);
    std::printf("%-34s %12.0f\n", "UNIX socket, acknowledged/s", unix_rate);
    std::printf("%-34s %12.0f\n", "TCP (authenticated), acknowledged/s", tcp_rate);
    std::printf("%-34s %11.2fx\n", "TCP / UNIX", unix_rate > 0 ? tcp_rate / unix_rate : 0.0);
    const json out{{"bench", "rpc-remote-vs-echo"},
                   {"path", pair ? "veth" : "loopback"},
                   {"loadavg", {load[0], load[1], load[2]}},
                   {"durable_reserve_clients", reserve_clients},
                   {"durable_reserve_rounds", reserve_rounds},
                   {"durable_reserves_unix_per_s", unix_rate},
                   {"durable_reserves_tcp_per_s", tcp_rate},
                   {"durable_tcp_over_unix", unix_rate > 0 ? tcp_rate / unix_rate : 0.0},
                   {"durable_reserve_errors", reserve_errors},
                   {"rtt_count", count},
                   {"echo_p50_ns", e.p50},
                   {"hello_p50_ns", h.p50},
                   {"hello_p99_ns", h.p99},
                   {"query_p50_ns", q.p50},
                   {"query_p99_ns", q.p99},
                   {"hello_over_echo", h.p50 / e.p50},
                   {"query_over_echo", q.p50 / e.p50},
                   {"reservations", placed},
                   {"auth_connect_p50_ns", a50},
                   {"bare_connect_p50_ns", b50},
                   {"auth_cost_p50_ns", a50 - b50},
                   {"munge_encode_p50_ns", quantile(enc_ns, 0.5)},
                   {"munge_decode_p50_ns", quantile(dec_ns, 0.5)},
                   {"goal_p50_le_2x_echo", h.p50 <= 2 * e.p50 && q.p50 <= 2 * e.p50}};
    std::printf("%s\n", out.dump().c_str());
    return reserve_errors == 0 ? 0 : 1;
}
