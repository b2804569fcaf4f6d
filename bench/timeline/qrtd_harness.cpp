// The real daemon, started and driven through its socket (qrtd_harness.hpp).
#include "qrtd_harness.hpp"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

namespace qrt::bench {

namespace fs = std::filesystem;

namespace {

int connect_to(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

bool send_all(int fd, const std::string& s) {
    std::size_t off = 0;
    while (off < s.size()) {
        const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
        if (n <= 0) {
            return false;
        }
        off += static_cast<std::size_t>(n);
    }
    return true;
}

}  // namespace

qrtd_process start_qrtd(const std::string& qrtd, const fs::path& dir, const qrtd_config& c) {
    fs::remove_all(dir);
    fs::create_directories(dir / "state");
    qrtd_process d;
    d.sock = (dir / "qrtd.sock").string();
    std::ofstream cfg(dir / "qrtd.toml");
    cfg << "[agent]\nlog_level = \"warn\"\nwatchdog = false\nuser = \"root\"\n"
        << "[host]\napply_on_run = false\n[dispatch]\nmode = \"untuned\"\n"
        << "[timeline]\npolicy = \"" << c.policy << "\"\nhorizon_ns = " << c.horizon_ns << "\n"
        << "default_lease_ns = 600_000_000_000\ncommit_group_max = " << c.group_max << "\n"
        << c.timeline << "[rpc]\nsocket_path = \"" << d.sock << "\"\nmax_inflight = " << c.max_inflight
        << "\n[roles]\nreader = [\"uid:" << ::getuid() << "\"]\nscheduler = [\"uid:" << ::getuid()
        << "\"]\ncalibration = []\nadmin = []\n[probes]\nenabled = false\n"
        << "[tenants]\nmax_reservations = 1000000\nmax_requests_per_s = 0\n" << c.tenants
        << "[[qpu]]\nname = \"qpu0\"\nendpoint = \"file:///dev/null\"\ncalibration = \"periodic\"\n"
        << "period_ns = 1_000_000_000\nblackout_ns = 100_000_000\nfidelity_f0 = 0.99\n";
    cfg.close();
    const std::string cfg_path = (dir / "qrtd.toml").string();
    const std::string state = (dir / "state").string();
    const std::string log = (dir / "qrtd.log").string();
    std::fflush(nullptr);  // the child must not write our buffered output again
    d.pid = ::fork();
    if (d.pid == 0) {
        std::FILE* f = std::freopen(log.c_str(), "w", stdout);
        (void)f;
        ::dup2(STDOUT_FILENO, STDERR_FILENO);
        ::execl(qrtd.c_str(), qrtd.c_str(), "run", "-c", cfg_path.c_str(), "--state-dir",
                state.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
    }
    for (int i = 0; i < 300; ++i) {
        const int fd = connect_to(d.sock);
        if (fd >= 0) {
            ::close(fd);
            return d;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::fprintf(stderr, "qrtd did not come up; see %s\n", log.c_str());
    ::kill(d.pid, SIGKILL);
    ::waitpid(d.pid, nullptr, 0);
    d.pid = -1;
    return d;
}

void stop_qrtd(qrtd_process& d) {
    if (d.pid > 0) {
        ::kill(d.pid, SIGTERM);
        ::waitpid(d.pid, nullptr, 0);
        d.pid = -1;
    }
}

long reserve_pipelined(const std::string& sock, int k, std::size_t count, std::size_t window,
                       const std::string& key, const std::string& extra) {
    const int fd = connect_to(sock);
    if (fd < 0) {
        return -1;
    }
    std::size_t sent = 0;
    std::size_t got = 0;
    long errors = 0;
    std::string in;
    char buf[65536];
    std::string batch;
    const std::string more = extra.empty() ? std::string() : "," + extra;
    while (got < count) {
        batch.clear();
        while (sent < count && sent - got < window) {
            batch += R"({"jsonrpc":"2.0","id":)" + std::to_string(sent) +
                     R"(,"method":"slots.reserve","params":{"duration_ns":1000000,"idempotency_key":")" +
                     key + "-" + std::to_string(k) + "-" + std::to_string(sent) + "\"" + more + "}}\n";
            ++sent;
        }
        if (!batch.empty() && !send_all(fd, batch)) {
            ::close(fd);
            return -1;
        }
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
            ::close(fd);
            return -1;
        }
        in.append(buf, static_cast<std::size_t>(n));
        std::size_t pos = 0;
        for (std::size_t nl; (nl = in.find('\n', pos)) != std::string::npos; pos = nl + 1) {
            if (in.find("\"result\"", pos) > nl) {
                if (errors == 0) {
                    std::fprintf(stderr, "first error reply: %.*s\n", static_cast<int>(std::min<std::size_t>(nl - pos, 400)),
                                 in.c_str() + pos);
                }
                ++errors;
            }
            ++got;
        }
        in.erase(0, pos);
    }
    ::close(fd);
    return errors;
}

double reserve_rate(const std::string& sock, int clients, std::size_t count, std::size_t window,
                    const std::string& key, std::size_t& errors, const std::string& extra) {
    std::vector<long> errs(static_cast<std::size_t>(clients), 0);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int k = 0; k < clients; ++k) {
        ts.emplace_back([&, k] {
            errs[static_cast<std::size_t>(k)] = reserve_pipelined(sock, k, count, window, key, extra);
        });
    }
    for (auto& t : ts) {
        t.join();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::size_t failed = 0;
    for (const long e : errs) {
        failed += e < 0 ? count : static_cast<std::size_t>(e);
    }
    errors += failed;
    const double acked = static_cast<double>(static_cast<std::size_t>(clients) * count - failed);
    return secs > 0 ? acked / secs : 0;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace qrt::bench
