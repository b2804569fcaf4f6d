// qrt-durable-reserve: durable slots.reserve per second, pipelined from 4
// clients through the real socket to the real daemon (#15 §3: >= 20,000/s
// with an fsync behind every acknowledgement).
//
// One run starts `qrtd run` (the binary, untuned, host untouched, a
// write-only file:///dev/null endpoint) on a fresh state directory on disk
// twice per round, alternating:
//   reference  timeline.commit_group_max = 1: every change is committed on
//              the event loop before its reply (the path before group commit)
//   group      timeline.commit_group_max = --group-max: the writer thread
//              commits what queued in one transaction, one fsync per group
// Each side: --clients connections, each keeping --window slots.reserve in
// flight (unique idempotency keys) until --count replies came back; every
// reply must be a result.  Rates are acknowledged reservations per second
// of wall time; medians of --rounds rounds, and the ratio group/reference.
// Prints a table and ends with ONE JSON line.
//
//   build/bench/timeline/qrt-durable-reserve [--qrtd build/agent/qrtd]
//       [--clients 4] [--window 64] [--count 5000] [--rounds 3]
//       [--group-max 256] [--dir /var/tmp]

#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

struct side_result {
    double per_s = 0;
    std::size_t errors = 0;
};

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

// One client: keep `window` reserves in flight until `count` replies came.
// Returns the number of error replies (-1: the connection broke).
long run_client(const std::string& sock, int k, std::size_t count, std::size_t window,
                const std::string& tag) {
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
    while (got < count) {
        batch.clear();
        while (sent < count && sent - got < window) {
            batch += R"({"jsonrpc":"2.0","id":)" + std::to_string(sent) +
                     R"(,"method":"slots.reserve","params":{"duration_ns":1000000,"idempotency_key":")" +
                     tag + "-" + std::to_string(k) + "-" + std::to_string(sent) + "\"}}\n";
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
            if (in.compare(pos, nl - pos, "") != 0 &&
                in.find("\"result\"", pos) > nl) {
                ++errors;
            }
            ++got;
        }
        in.erase(0, pos);
    }
    ::close(fd);
    return errors;
}

struct daemon_proc {
    pid_t pid = -1;
    std::string sock;
};

daemon_proc start_qrtd(const std::string& qrtd, const fs::path& dir, std::size_t group_max,
                       std::size_t window) {
    fs::remove_all(dir);
    fs::create_directories(dir / "state");
    daemon_proc d;
    d.sock = (dir / "qrtd.sock").string();
    std::ofstream cfg(dir / "qrtd.toml");
    cfg << "[agent]\nlog_level = \"warn\"\nwatchdog = false\nuser = \"root\"\n"
        << "[host]\napply_on_run = false\n[dispatch]\nmode = \"untuned\"\n"
        << "[timeline]\npolicy = \"fifo\"\nhorizon_ns = 600_000_000_000\n"
        << "default_lease_ns = 600_000_000_000\ncommit_group_max = " << group_max << "\n"
        << "[rpc]\nsocket_path = \"" << d.sock << "\"\nmax_inflight = " << window << "\n"
        << "[roles]\nreader = [\"uid:" << ::getuid() << "\"]\nscheduler = [\"uid:" << ::getuid()
        << "\"]\ncalibration = []\nadmin = []\n[probes]\nenabled = false\n"
        << "[tenants]\nmax_reservations = 1000000\nmax_requests_per_s = 0\n"
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
    std::fprintf(stderr, "qrt-durable-reserve: qrtd did not come up; see %s\n", log.c_str());
    ::kill(d.pid, SIGKILL);
    ::waitpid(d.pid, nullptr, 0);
    d.pid = -1;
    return d;
}

void stop_qrtd(daemon_proc& d) {
    if (d.pid > 0) {
        ::kill(d.pid, SIGTERM);
        ::waitpid(d.pid, nullptr, 0);
        d.pid = -1;
    }
}

side_result run_side(const std::string& qrtd, const fs::path& dir, std::size_t group_max,
                     int clients, std::size_t window, std::size_t count, const std::string& tag) {
    side_result out;
    daemon_proc d = start_qrtd(qrtd, dir, group_max, window);
    if (d.pid < 0) {
        out.errors = static_cast<std::size_t>(clients) * count;
        return out;
    }
    std::vector<long> errs(static_cast<std::size_t>(clients), 0);
    const auto t0 = clk::now();
    std::vector<std::thread> ts;
    for (int k = 0; k < clients; ++k) {
        ts.emplace_back([&, k] {
            errs[static_cast<std::size_t>(k)] = run_client(d.sock, k, count, window, tag);
        });
    }
    for (auto& t : ts) {
        t.join();
    }
    const double secs = std::chrono::duration<double>(clk::now() - t0).count();
    stop_qrtd(d);
    for (const long e : errs) {
        out.errors += e < 0 ? count : static_cast<std::size_t>(e);
    }
    const double acked = static_cast<double>(static_cast<std::size_t>(clients) * count) -
                         static_cast<double>(out.errors);
    out.per_s = secs > 0 ? acked / secs : 0;
    return out;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"durable slots.reserve per second through the real daemon: group commit vs "
                 "one commit per change"};
    std::string qrtd = QRT_QRTD_PATH;
    int clients = 4;
    std::size_t window = 64;
    std::size_t count = 5000;
    int rounds = 3;
    std::size_t group_max = 256;
    std::string base = "/var/tmp";
    app.add_option("--qrtd", qrtd, "the qrtd binary");
    app.add_option("--clients", clients, "pipelining connections")->check(CLI::Range(1, 64));
    app.add_option("--window", window, "requests in flight per connection")->check(CLI::Range(1, 1024));
    app.add_option("--count", count, "reservations per connection per side")->check(CLI::Range(1, 1'000'000));
    app.add_option("--rounds", rounds, "interleaved rounds (medians reported)")->check(CLI::Range(1, 20));
    app.add_option("--group-max", group_max, "timeline.commit_group_max of the group side")
        ->check(CLI::Range(2, 65536));
    app.add_option("--dir", base, "where the state directories go (a real disk: fsync matters)");
    CLI11_PARSE(app, argc, argv);

    const fs::path dir = fs::path(base) / ("qrt-durable-reserve-" + std::to_string(::getpid()));
    std::vector<double> ref_rates;
    std::vector<double> grp_rates;
    std::size_t errors = 0;
    // The reference runs a fifth of the count: at one fsync per change it is
    // slow, and its rate does not depend on how long it runs.
    const std::size_t ref_count = std::max<std::size_t>(count / 5, 1);
    for (int r = 0; r < rounds; ++r) {
        const auto ref = run_side(qrtd, dir, 1, clients, window, ref_count, "r" + std::to_string(r));
        const auto grp = run_side(qrtd, dir, group_max, clients, window, count, "g" + std::to_string(r));
        ref_rates.push_back(ref.per_s);
        grp_rates.push_back(grp.per_s);
        errors += ref.errors + grp.errors;
        std::printf("round %d: reference %.0f/s, group commit %.0f/s (errors %zu)\n", r + 1,
                    ref.per_s, grp.per_s, ref.errors + grp.errors);
    }
    fs::remove_all(dir);
    const double ref = median(ref_rates);
    const double grp = median(grp_rates);
    const double ratio = ref > 0 ? grp / ref : 0;
    std::printf("\n%-44s %12s\n", "durable slots.reserve, pipelined", "per second");
    std::printf("%-44s %12.0f\n", "one commit per change (commit_group_max 1)", ref);
    std::printf("%-44s %12.0f\n",
                ("group commit (commit_group_max " + std::to_string(group_max) + ")").c_str(), grp);
    std::printf("%-44s %11.1fx\n", "ratio", ratio);
    std::printf("goal >= 20,000/s: %s\n", grp >= 20'000 ? "PASS" : "FAIL");
    std::printf("{\"bench\":\"durable_reserve\",\"clients\":%d,\"window\":%zu,\"count\":%zu,"
                "\"rounds\":%d,\"group_max\":%zu,\"reference_per_s\":%.0f,\"group_per_s\":%.0f,"
                "\"ratio\":%.2f,\"errors\":%zu,\"goal_per_s\":20000,\"pass\":%s}\n",
                clients, window, count, rounds, group_max, ref, grp, ratio, errors,
                (grp >= 20'000 && errors == 0) ? "true" : "false");
    return errors == 0 ? 0 : 1;
}
