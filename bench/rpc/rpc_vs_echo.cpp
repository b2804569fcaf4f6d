// rpc-vs-echo: what the control socket costs over the floor, in one run.
//
//   1. the floor: a raw AF_UNIX echo server and client (one line out, the
//      same line back);
//   2. qrtd's socket side (the real rpc server, engine and methods, in this
//      process on its own event-loop thread) answering agent.hello;
//   3. the same answering slots.query with 10k reservations in the ledger,
//      the query landing in the busy region.
// The client is a tenant (reader), every line charged to its request rate
// as `qrtd run` charges it (a rate it never reaches).
// For each: round-trip p50/p99 (one request at a time) and pipelined
// throughput (a window of requests in flight on one connection), each in
// --rounds interleaved rounds (medians reported), and the ratios to the
// echo floor.  The client is the same raw line client for all three (it
// never parses replies), so the ratios are the server's cost.
//
//   4. dispatch lateness p99 while the socket is idle vs under pipelined
//      slots.query load: a real dispatcher (SCHED_FIFO, io_uring) in this
//      process sends a job every --dispatch-interval-us to a socketpair.
//      As in the daemon, the rpc loop and the load client run on the
//      housekeeping CPU and the dispatcher on the last CPU.
//
// Goals: p50 <= 2x echo; >= 100,000 agent.hello/s and >= 50,000
// slots.query/s pipelined; dispatch p99 under load <= 1.2x idle.
// Prints a table and ends with ONE JSON line.
//
//   build/bench/rpc/rpc-vs-echo [--rounds 3] [--rtt-count 5000]
//       [--pipelined-count 50000] [--window 64] [--reservations 10000]
//       [--skip-dispatch] [--only hello|query]

#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "qrt/dispatch/dispatcher.hpp"
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

double median(std::vector<double> v) {
    if (v.empty()) {
        return 0.0;
    }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

void pin_thread(int cpu) {
    if (cpu < 0) {
        return;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<unsigned>(cpu), &set);
    (void)::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set);
}

int connect_unix(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        throw std::runtime_error("connect " + path + ": " + std::strerror(errno));
    }
    return fd;
}

// ------------------------------------------------------------ the echo floor

class echo_server {
public:
    explicit echo_server(const std::string& path) : _path(path) {
        _listen = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
        ::unlink(path.c_str());
        if (_listen < 0 || ::bind(_listen, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
            ::listen(_listen, 16) != 0) {
            throw std::runtime_error("echo bind " + path + ": " + std::strerror(errno));
        }
        _thread = std::thread([this] { serve(); });
    }
    ~echo_server() {
        ::shutdown(_listen, SHUT_RDWR);
        ::close(_listen);
        _thread.join();
        ::unlink(_path.c_str());
    }
    void pin(int cpu) { _cpu = cpu; }

private:
    // One connection at a time, bytes back as they come (lines intact).
    void serve() {
        pin_thread(_cpu);
        for (;;) {
            const int c = ::accept4(_listen, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) {
                return;
            }
            std::vector<char> buf(64 * 1024);
            for (;;) {
                const ssize_t n = ::recv(c, buf.data(), buf.size(), 0);
                if (n <= 0) {
                    break;
                }
                ssize_t off = 0;
                while (off < n) {
                    const ssize_t w = ::send(c, buf.data() + off, static_cast<std::size_t>(n - off),
                                             MSG_NOSIGNAL);
                    if (w <= 0) {
                        break;
                    }
                    off += w;
                }
            }
            ::close(c);
        }
    }

    std::string _path;
    int _listen = -1;
    int _cpu = -1;
    std::thread _thread;
};

// ---------------------------------------------------- the raw line client

// Sends request lines and counts reply lines; never parses (the same cost
// for the echo floor and the agent).  Checks one reply in 1024 looks like
// the expected answer.
class line_client {
public:
    explicit line_client(const std::string& path) : _fd(connect_unix(path)) { _buf.resize(1 << 20); }
    ~line_client() { ::close(_fd); }

    void send_all(const std::string& s) {
        std::size_t off = 0;
        while (off < s.size()) {
            const ssize_t w = ::send(_fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
            if (w <= 0) {
                throw std::runtime_error(std::string("send: ") + std::strerror(errno));
            }
            off += static_cast<std::size_t>(w);
        }
    }
    // Read until at least one more newline; returns how many arrived.
    std::size_t read_some() {
        const ssize_t n = ::recv(_fd, _buf.data(), _buf.size(), 0);
        if (n <= 0) {
            throw std::runtime_error("recv: the server closed the connection");
        }
        std::size_t lines = 0;
        for (ssize_t i = 0; i < n; ++i) {
            if (_buf[static_cast<std::size_t>(i)] == '\n') {
                ++lines;
            }
        }
        if (_check.size() < 4096 && (_sampled++ % 1024) == 0) {
            _check.assign(_buf.data(), static_cast<std::size_t>(std::min<ssize_t>(n, 4096)));
        }
        return lines;
    }
    void read_lines(std::size_t want) {
        std::size_t got = _pending;
        while (got < want) {
            got += read_some();
        }
        _pending = got - want;
    }
    const std::string& sample() const { return _check; }

private:
    int _fd;
    std::vector<char> _buf;
    std::size_t _pending = 0;
    std::string _check;
    std::uint64_t _sampled = 0;
};

// A request line with its id: line(id).
using line_maker = std::function<std::string(std::uint64_t)>;

struct figures {
    std::vector<double> p50_ns, p99_ns, per_s;
    std::string sample;
    json to_json() const {
        return json{{"rtt_p50_ns", median(p50_ns)},
                    {"rtt_p99_ns", median(p99_ns)},
                    {"pipelined_per_s", median(per_s)},
                    {"rounds", p50_ns.size()}};
    }
};

void measure_round(const std::string& path, const line_maker& make, std::size_t rtt_count,
                   std::size_t pipelined_count, std::size_t window, figures& f) {
    line_client c(path);
    // Warm up (connection set-up, caches, the server's first allocations).
    for (std::uint64_t i = 0; i < 200; ++i) {
        c.send_all(make(i));
        c.read_lines(1);
    }
    std::vector<std::int64_t> rtt;
    rtt.reserve(rtt_count);
    std::uint64_t id = 1000;
    for (std::size_t i = 0; i < rtt_count; ++i) {
        const std::string line = make(id++);
        const std::int64_t t0 = rtcore::monotonic_now_ns();
        c.send_all(line);
        c.read_lines(1);
        rtt.push_back(rtcore::monotonic_now_ns() - t0);
    }
    f.p50_ns.push_back(quantile(rtt, 0.50));
    f.p99_ns.push_back(quantile(rtt, 0.99));

    // Pipelined: keep `window` requests in flight.
    std::string burst;
    for (std::size_t i = 0; i < window; ++i) {
        burst += make(id++);
    }
    const auto t0 = clk::now();
    c.send_all(burst);
    std::size_t sent = window;
    std::size_t done = 0;
    while (done < pipelined_count) {
        const std::size_t got = c.read_some();
        done += got;
        std::string more;
        for (std::size_t k = 0; k < got && sent < pipelined_count; ++k, ++sent) {
            more += make(id++);
        }
        if (!more.empty()) {
            c.send_all(more);
        }
    }
    const double secs = std::chrono::duration<double>(clk::now() - t0).count();
    f.per_s.push_back(static_cast<double>(done) / secs);
    f.sample = c.sample();
}

// ----------------------------------------------------- dispatch lateness

struct lateness {
    bool measured = false;
    std::string note;
    std::vector<std::int64_t> idle_ns, load_ns;
    std::uint64_t not_sent = 0;
    bool rt = false;
    int cpu = -1;
    double load_queries_per_s = 0;
};

// Sends `jobs` jobs every interval_ns through d; returns the lateness of
// each sent one (monotonic, after submission minus T).
std::vector<std::int64_t> run_dispatch(qrt::dispatch::dispatcher& d, rtcore::clock_source& clock,
                                       std::size_t jobs, std::int64_t interval_ns,
                                       std::uint64_t& next_id, std::uint64_t& not_sent) {
    std::vector<std::int64_t> out;
    out.reserve(jobs);
    std::vector<std::uint8_t> payload(64, 0xA5);
    const std::int64_t start = clock.now_realtime_ns() + 20'000'000;
    std::size_t submitted = 0;
    std::size_t received = 0;
    const auto give_up = clk::now() + std::chrono::nanoseconds(interval_ns) *
                                          static_cast<std::int64_t>(jobs + 2000);
    while (received < jobs && clk::now() < give_up) {
        // Keep at most 64 queued, submitted ahead of time.
        while (submitted < jobs && d.queued() < 64) {
            qrt::dispatch::dispatch_job j;
            j.job_id = next_id++;
            j.scheduled_ns = start + static_cast<std::int64_t>(submitted) * interval_ns;
            j.window_start_ns = j.scheduled_ns - 1'000'000'000;
            j.window_end_ns = j.scheduled_ns + 1'000'000'000;
            j.duration_ns = 10'000;
            j.calibration_id = 1;
            j.tolerance_ns = 500'000'000;
            if (auto st = d.submit(j, payload); !st) {
                throw std::runtime_error("dispatcher submit: " + st.err().message);
            }
            ++submitted;
        }
        received += d.drain_records([&](const qrt::dispatch::dispatch_record& r) {
            if (r.status == qrt::dispatch::dispatch_status::sent) {
                out.push_back(r.lateness_ns);
            } else {
                ++not_sent;
            }
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    int rounds = 3;
    std::size_t rtt_count = 5000;
    std::size_t pipelined_count = 50'000;
    std::size_t window = 64;
    std::size_t reservations = 10'000;
    std::size_t dispatch_jobs = 1500;
    std::int64_t dispatch_interval_us = 1000;
    bool skip_dispatch = false;
    CLI::App app{"rpc-vs-echo: the control socket against a raw AF_UNIX echo floor"};
    app.add_option("--rounds", rounds, "interleaved rounds per measurement (medians reported)")
        ->check(CLI::Range(1, 20));
    app.add_option("--rtt-count", rtt_count, "round trips per round");
    app.add_option("--pipelined-count", pipelined_count, "pipelined requests per round");
    app.add_option("--window", window, "requests in flight when pipelined (server cap: 128)")
        ->check(CLI::Range(1, 128));
    app.add_option("--reservations", reservations, "reservations in the ledger for slots.query");
    app.add_option("--dispatch-jobs", dispatch_jobs, "jobs per dispatch phase (idle, load)");
    app.add_option("--dispatch-interval-us", dispatch_interval_us, "job spacing");
    app.add_flag("--skip-dispatch", skip_dispatch, "do not measure dispatch lateness");
    std::string only;
    app.add_option("--only", only,
                   "measure agent.hello or slots.query alone (instruction counts per request: "
                   "bench/rpc/callgrind_per_request.py)")
        ->check(CLI::IsMember({"hello", "query"}));
    CLI11_PARSE(app, argc, argv);
    spdlog::set_level(spdlog::level::warn);

    const long ncpu = ::sysconf(_SC_NPROCESSORS_ONLN);
    const int hk_cpu = ncpu >= 2 ? 0 : -1;
    const int rt_cpu = ncpu >= 2 ? static_cast<int>(ncpu - 1) : -1;

    const auto dir = std::filesystem::temp_directory_path() /
                     ("qrt-rpc-bench-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string echo_path = (dir / "echo.sock").string();
    const std::string agent_path = (dir / "qrtd.sock").string();

    echo_server echo(echo_path);
    echo.pin(hk_cpu);

    qrt::testing::test_agent_options o;
    o.socket_path = agent_path;
    o.roles.reader = {"uid:" + std::to_string(::getuid())};
    // The daemon's per-line charge, with a rate this client never reaches
    // (the default, 2,000/s a tenant, would refuse the pipelined phases).
    o.tenants.emplace();
    o.tenants->max_requests_per_s = 1'000'000'000;
    o.tenants->request_burst = 1'000'000'000;
    qrt::testing::test_agent agent(o);
    // The reservations sit a minute ahead, so they stay in the future for
    // the whole run; the query asks for the first slot from there.
    const std::int64_t busy_from = rtcore::realtime_now_ns() + 60'000'000'000;
    std::size_t placed = 0;
    {
        qrt::timeline::request req;
        req.duration_ns = 100'000;
        req.not_before_ns = busy_from;
        req.qpus = {"qpu0"};
        for (std::size_t i = 0; i < reservations; ++i) {
            auto r = agent.ledger().reserve("prefill", req, "prefill-" + std::to_string(i),
                                            3'000'000'000'000, rtcore::realtime_now_ns());
            if (!r) {
                std::fprintf(stderr, "prefill stopped at %zu: %s\n", i, r.err().message.c_str());
                break;
            }
            ++placed;
        }
        (void)agent.ledger().drain_events();
    }
    std::thread loop_thread([&] {
        pin_thread(hk_cpu);
        agent.loop().run();
    });

    const line_maker echo_line = [](std::uint64_t id) {
        // The size of an agent.hello request, so the bytes moved match.
        return R"({"jsonrpc":"2.0","id":)" + std::to_string(id) + R"(,"method":"agent.hello"})" "\n";
    };
    const line_maker hello_line = echo_line;
    const std::string query_tail =
        R"(,"method":"slots.query","params":{"duration_ns":2000000,"qpus":["qpu0"],"not_before_ns":)" +
        std::to_string(busy_from) + "}}\n";
    const line_maker query_line = [&](std::uint64_t id) {
        return R"({"jsonrpc":"2.0","id":)" + std::to_string(id) + query_tail;
    };

    figures f_echo, f_hello, f_query;
    cpu_set_t all_cpus;
    CPU_ZERO(&all_cpus);
    (void)::pthread_getaffinity_np(::pthread_self(), sizeof(all_cpus), &all_cpus);
    pin_thread(hk_cpu);  // the client shares the housekeeping CPU, as in the daemon
    for (int r = 0; r < rounds; ++r) {
        measure_round(echo_path, echo_line, rtt_count, pipelined_count, window, f_echo);
        if (only != "query") {
            measure_round(agent_path, hello_line, rtt_count, pipelined_count, window, f_hello);
        }
        if (only != "hello") {
            measure_round(agent_path, query_line, rtt_count, pipelined_count, window, f_query);
        }
    }
    const bool hello_ok = only == "query" || (f_hello.sample.find("\"result\"") != std::string::npos &&
                                              f_hello.sample.find("\"agent\":\"qrtd\"") != std::string::npos);
    const bool query_ok = only == "hello" || f_query.sample.find("\"candidates\":[{") != std::string::npos;

    // ---- dispatch lateness, idle socket vs loaded socket
    lateness lat;
    if (skip_dispatch) {
        lat.note = "skipped (--skip-dispatch)";
    } else {
        try {
            rtcore::real_clock clock;
            qrt::dispatch::dispatcher_config cfg;
            cfg.mode = qrt::dispatch::dispatch_mode::tuned;
            cfg.dispatch_cpu = rt_cpu;
            cfg.slots = 128;
            cfg.max_payload_bytes = 256;
            // Tuned first, requiring SCHED_FIFO so the reason is known when
            // it cannot be had; then the same without the requirement.
            cfg.require_rt = true;
            std::string rt_error;
            // The dispatch thread inherits this thread's affinity: widen it
            // back so it may move to the dispatch CPU; pinned again below.
            (void)::pthread_setaffinity_np(::pthread_self(), sizeof(all_cpus), &all_cpus);
            {
                qrt::dispatch::dispatcher probe(cfg, clock);
                if (auto st = probe.start(); !st) {
                    rt_error = st.err().message;
                }
                probe.stop();
            }
            cfg.require_rt = false;
            qrt::dispatch::dispatcher d(cfg, clock);
            int sp[2];
            if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) {
                throw std::runtime_error(std::string("socketpair: ") + std::strerror(errno));
            }
            std::atomic<bool> stop_reader{false};
            std::thread reader([&] {
                pin_thread(hk_cpu);
                std::vector<char> buf(65536);
                while (!stop_reader.load()) {
                    if (::recv(sp[1], buf.data(), buf.size(), 0) <= 0) {
                        break;
                    }
                }
            });
            if (auto st = d.set_endpoint_fd(sp[0]); !st) {
                throw std::runtime_error("set_endpoint_fd: " + st.err().message);
            }
            if (auto st = d.start(); !st) {
                throw std::runtime_error("dispatcher start: " + st.err().message);
            }
            pin_thread(hk_cpu);  // the feeder is housekeeping work
            lat.rt = d.thread_stats().rt_applied;
            lat.cpu = rt_cpu;
            std::uint64_t id = 1;
            const std::int64_t interval_ns = dispatch_interval_us * 1000;
            // Warm-up: the lead controller adapts.
            (void)run_dispatch(d, clock, 300, interval_ns, id, lat.not_sent);
            lat.not_sent = 0;
            lat.idle_ns = run_dispatch(d, clock, dispatch_jobs, interval_ns, id, lat.not_sent);

            std::atomic<bool> stop_load{false};
            std::atomic<std::uint64_t> load_done{0};
            std::thread load([&] {
                pin_thread(hk_cpu);
                line_client c(agent_path);
                std::uint64_t qid = 1;
                std::string burst;
                for (std::size_t i = 0; i < window; ++i) {
                    burst += query_line(qid++);
                }
                c.send_all(burst);
                while (!stop_load.load(std::memory_order_relaxed)) {
                    const std::size_t got = c.read_some();
                    load_done.fetch_add(got, std::memory_order_relaxed);
                    std::string more;
                    for (std::size_t k = 0; k < got; ++k) {
                        more += query_line(qid++);
                    }
                    c.send_all(more);
                }
            });
            const auto l0 = clk::now();
            lat.load_ns = run_dispatch(d, clock, dispatch_jobs, interval_ns, id, lat.not_sent);
            const double secs = std::chrono::duration<double>(clk::now() - l0).count();
            lat.load_queries_per_s = static_cast<double>(load_done.load()) / secs;
            stop_load.store(true);
            load.join();
            d.stop();
            stop_reader.store(true);
            ::shutdown(sp[1], SHUT_RDWR);
            reader.join();
            ::close(sp[0]);
            ::close(sp[1]);
            lat.measured = !lat.idle_ns.empty() && !lat.load_ns.empty();
            if (!lat.rt) {
                lat.note = "dispatcher ran without SCHED_FIFO (" +
                           (rt_error.empty() ? std::string("unknown reason") : rt_error) +
                           "): lateness is that of a normal thread";
            }
        } catch (const std::exception& e) {
            lat.note = std::string("not measured: ") + e.what();
        }
    }

    agent.loop().stop();
    loop_thread.join();
    std::filesystem::remove_all(dir);

    // ---- report
    const double echo_p50 = median(f_echo.p50_ns);
    const double echo_tp = median(f_echo.per_s);
    const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    std::printf("rpc-vs-echo: %d rounds x (%zu round trips, %zu pipelined, window %zu); "
                "%zu reservations in the ledger; CPUs: loop+clients %d, dispatcher %d\n\n",
                rounds, rtt_count, pipelined_count, window, placed, hk_cpu, rt_cpu);
    std::printf("%-14s %12s %12s %12s %14s %12s\n", "", "p50 rtt", "p99 rtt", "p50/echo",
                "pipelined/s", "tput/echo");
    const auto row = [&](const char* name, const figures& f) {
        std::printf("%-14s %10.1fus %10.1fus %11.2fx %14.0f %11.3fx\n", name,
                    median(f.p50_ns) / 1000.0, median(f.p99_ns) / 1000.0,
                    ratio(median(f.p50_ns), echo_p50), median(f.per_s),
                    ratio(median(f.per_s), echo_tp));
    };
    row("raw echo", f_echo);
    row("agent.hello", f_hello);
    row("slots.query", f_query);

    const double hello_p50_ratio = ratio(median(f_hello.p50_ns), echo_p50);
    const double query_p50_ratio = ratio(median(f_query.p50_ns), echo_p50);
    json goals{{"hello_p50_le_2x_echo", hello_p50_ratio <= 2.0},
               {"query_p50_le_2x_echo", query_p50_ratio <= 2.0},
               {"hello_ge_100k_per_s", median(f_hello.per_s) >= 100'000.0},
               {"query_ge_50k_per_s", median(f_query.per_s) >= 50'000.0}};
    std::printf("\ngoals: hello p50 <= 2x echo: %s (%.2fx); query p50 <= 2x echo: %s (%.2fx)\n"
                "       agent.hello >= 100,000/s: %s (%.0f/s); slots.query >= 50,000/s: %s "
                "(%.0f/s)\n",
                goals["hello_p50_le_2x_echo"].get<bool>() ? "PASS" : "FAIL", hello_p50_ratio,
                goals["query_p50_le_2x_echo"].get<bool>() ? "PASS" : "FAIL", query_p50_ratio,
                goals["hello_ge_100k_per_s"].get<bool>() ? "PASS" : "FAIL", median(f_hello.per_s),
                goals["query_ge_50k_per_s"].get<bool>() ? "PASS" : "FAIL", median(f_query.per_s));
    if (!hello_ok || !query_ok) {
        std::printf("WARNING: a sampled reply was not the expected answer (hello %s, query %s)\n",
                    hello_ok ? "ok" : "bad", query_ok ? "ok" : "bad");
    }

    json dispatch{{"measured", lat.measured}};
    if (lat.measured) {
        const double idle99 = quantile(lat.idle_ns, 0.99);
        const double load99 = quantile(lat.load_ns, 0.99);
        const double r = ratio(load99, idle99);
        dispatch.update({{"rt", lat.rt},
                         {"cpu", lat.cpu},
                         {"jobs_per_phase", dispatch_jobs},
                         {"interval_us", dispatch_interval_us},
                         {"idle_p50_ns", quantile(lat.idle_ns, 0.5)},
                         {"idle_p99_ns", idle99},
                         {"load_p50_ns", quantile(lat.load_ns, 0.5)},
                         {"load_p99_ns", load99},
                         {"load_queries_per_s", lat.load_queries_per_s},
                         {"not_sent", lat.not_sent},
                         {"p99_ratio_load_idle", r},
                         {"pass", r <= 1.2}});
        goals["dispatch_p99_load_le_1_2x_idle"] = r <= 1.2;
        std::printf("\ndispatch lateness (%s, CPU %d, %zu jobs every %lld us per phase):\n"
                    "  idle socket   p50 %8.1fus  p99 %8.1fus\n"
                    "  loaded socket p50 %8.1fus  p99 %8.1fus  (%.0f slots.query/s meanwhile)\n"
                    "  p99 load/idle %.2fx: %s (goal <= 1.2x)%s\n",
                    lat.rt ? "SCHED_FIFO" : "untuned", lat.cpu, dispatch_jobs,
                    static_cast<long long>(dispatch_interval_us), quantile(lat.idle_ns, 0.5) / 1000.0,
                    idle99 / 1000.0, quantile(lat.load_ns, 0.5) / 1000.0, load99 / 1000.0,
                    lat.load_queries_per_s, r, r <= 1.2 ? "PASS" : "FAIL",
                    lat.not_sent != 0 ? " (some jobs were not sent)" : "");
    } else {
        dispatch["note"] = lat.note.empty() ? "not measured" : lat.note;
        std::printf("\ndispatch lateness: %s\n", dispatch["note"].get<std::string>().c_str());
    }
    if (!lat.note.empty() && lat.measured) {
        dispatch["note"] = lat.note;
        std::printf("  note: %s\n", lat.note.c_str());
    }

    json hello = f_hello.to_json();
    hello["p50_ratio_to_echo"] = hello_p50_ratio;
    hello["throughput_ratio_to_echo"] = ratio(median(f_hello.per_s), echo_tp);
    json query = f_query.to_json();
    query["p50_ratio_to_echo"] = query_p50_ratio;
    query["throughput_ratio_to_echo"] = ratio(median(f_query.per_s), echo_tp);
    query["reservations"] = placed;
    const json out{{"bench", "rpc_vs_echo"},
                   {"window", window},
                   {"echo", f_echo.to_json()},
                   {"agent_hello", hello},
                   {"slots_query", query},
                   {"replies_checked", hello_ok && query_ok},
                   {"dispatch", dispatch},
                   {"goals", goals}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
}
