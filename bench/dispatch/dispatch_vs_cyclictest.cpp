// dispatch-vs-cyclictest: in one run, on the same CPU, priority and interval:
//   1. cyclictest (rt-tests) for N loops, its histogram parsed;
//   2. the dispatcher in tuned mode (SCHED_FIFO, pinned, sleep + spin,
//      io_uring) sending N jobs to qpu-sim;
//   3. the dispatcher in untuned mode (SCHED_OTHER, no pinning, plain sleep).
// Prints p50/p95/p99/max/stddev of each, the ratios against the references
// measured in this run, the CPU time spent spinning per dispatch, and ends
// with ONE JSON line.
//
//   build/bench/dispatch/dispatch-vs-cyclictest --cpu 1 --loops 2000 --interval-us 1000

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "qrt/dispatch/qpu_link.hpp"
#include "qrt/event_loop.hpp"
#include "rtcore/histogram.hpp"

namespace fs = std::filesystem;
using namespace qrt::dispatch;

namespace {

struct figures {
    bool ok = false;
    std::string note;
    std::uint64_t count = 0;
    double p50_us = 0, p95_us = 0, p99_us = 0, max_us = 0, stddev_us = 0, mean_us = 0;
    double spin_us_per_dispatch = 0;
    std::uint64_t missed = 0, failed = 0, completed = 0;
    double arrival_p50_us = 0, arrival_p99_us = 0;
    std::uint64_t sim_out_of_window = 0;
    double lead_us = 0;
    std::uint64_t lead_capped = 0;

    nlohmann::json json() const {
        nlohmann::json j = {{"ok", ok},           {"count", count},         {"p50_us", p50_us},
                            {"p95_us", p95_us},   {"p99_us", p99_us},       {"max_us", max_us},
                            {"stddev_us", stddev_us}, {"mean_us", mean_us}};
        if (!note.empty()) {
            j["note"] = note;
        }
        return j;
    }
};

figures from_summary(const rtcore::histogram_summary& s) {
    figures f;
    f.ok = s.count > 0;
    f.count = s.count;
    f.p50_us = static_cast<double>(s.p50_ns) / 1e3;
    f.p95_us = static_cast<double>(s.p95_ns) / 1e3;
    f.p99_us = static_cast<double>(s.p99_ns) / 1e3;
    f.max_us = static_cast<double>(s.max_ns) / 1e3;
    f.stddev_us = s.stddev_ns / 1e3;
    f.mean_us = s.mean_ns / 1e3;
    return f;
}

// cyclictest -m -q -a CPU -p PRIO -i US -l N -h MAXUS: parse the histogram
// ("<us> <count>" lines) and "# Max Latencies:".
figures run_cyclictest(int cpu, int prio, int interval_us, int loops, int hist_max_us) {
    figures f;
    // rt-tests 2.x: clock_nanosleep is the default (-n was removed).
    const std::string cmd = "cyclictest -m -q -a " + std::to_string(cpu) + " -p " + std::to_string(prio) +
                            " -i " + std::to_string(interval_us) + " -l " + std::to_string(loops) + " -h " +
                            std::to_string(hist_max_us) + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) {
        f.note = "popen cyclictest failed";
        return f;
    }
    std::string out;
    char buf[4096];
    while (std::fgets(buf, sizeof(buf), p) != nullptr) {
        out += buf;
    }
    const int status = ::pclose(p);
    if (status != 0) {
        f.note = "cyclictest exited with status " + std::to_string(status) + ": " + out.substr(0, 200);
        return f;
    }
    rtcore::histogram h;
    std::int64_t max_us = -1;
    std::uint64_t overflows = 0;
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) {
            continue;
        }
        if (line[0] == '#') {
            if (line.rfind("# Max Latencies:", 0) == 0) {
                max_us = std::stoll(line.substr(16));
            } else if (line.rfind("# Histogram Overflows:", 0) == 0) {
                overflows = std::stoull(line.substr(22));
            }
            continue;
        }
        long long us = 0;
        unsigned long long count = 0;
        if (std::sscanf(line.c_str(), "%lld %llu", &us, &count) == 2 && count > 0) {
            h.record_n(us * 1000, count);
        }
    }
    if (overflows > 0 && max_us > 0) {
        h.record_n(max_us * 1000, overflows);
    }
    if (h.empty()) {
        f.note = "no histogram lines in cyclictest output: " + out.substr(0, 200);
        return f;
    }
    f = from_summary(h.summary());
    if (max_us >= 0) {
        f.max_us = static_cast<double>(max_us);
    }
    f.note = "cyclictest reports whole microseconds";
    return f;
}

class sim_process {
public:
    sim_process(const fs::path& dir, int cpu, int prio, bool busy_poll) {
        _sock = (dir / "qpu.sock").string();
        _summary = (dir / "sim.json").string();
        std::vector<std::string> args = {QPU_SIM_PATH, "--listen", "unix://" + _sock, "--summary-file", _summary,
                                         "--json", "--duration-s", "120"};
        if (busy_poll) {
            args.push_back("--busy-poll");
        }
        if (prio > 0) {
            args.push_back("--fifo");
            args.push_back(std::to_string(prio));
        }
        if (cpu >= 0) {
            args.push_back("--cpu");
            args.push_back(std::to_string(cpu));
        }
        _pid = ::fork();
        if (_pid == 0) {
            std::vector<char*> argv;
            for (auto& a : args) {
                argv.push_back(a.data());
            }
            argv.push_back(nullptr);
            const int devnull = ::open("/dev/null", O_WRONLY);
            ::dup2(devnull, 1);
            ::dup2(devnull, 2);
            ::execv(argv[0], argv.data());
            ::_exit(127);
        }
        for (int i = 0; i < 500 && !fs::exists(_sock); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }
    ~sim_process() { stop(); }
    sim_process(const sim_process&) = delete;
    sim_process& operator=(const sim_process&) = delete;
    std::string endpoint() const { return "unix://" + _sock; }
    nlohmann::json stop() {
        if (_pid > 0) {
            ::kill(_pid, SIGTERM);
            int st = 0;
            ::waitpid(_pid, &st, 0);
            _pid = -1;
        }
        nlohmann::json j;
        std::ifstream in(_summary);
        if (in) {
            in >> j;
        }
        return j;
    }

private:
    std::string _sock, _summary;
    pid_t _pid = -1;
};

figures run_dispatcher(dispatch_mode mode, int cpu, int prio, int interval_us, int loops, int sim_cpu,
                       int sim_prio, bool sim_busy_poll, const fs::path& dir) {
    figures f;
    sim_process sim(dir, sim_cpu, sim_prio, sim_busy_poll);
    qrt::event_loop loop;
    rtcore::real_clock clock;
    qpu_link_config cfg;
    cfg.endpoint = sim.endpoint();
    cfg.dispatch.mode = mode;
    cfg.dispatch.dispatch_cpu = cpu;
    cfg.dispatch.rt_priority = prio;
    cfg.dispatch.require_rt = mode == dispatch_mode::tuned;
    cfg.dispatch.slots = 4096;
    cfg.dispatch.max_payload_bytes = 256;
    cfg.dispatch.frame_flags = QRT_WIRE_FLAG_NO_RESULT_DATA;
    std::size_t done = 0;
    qpu_link_callbacks cb;
    cb.on_outcome = [&](const dispatch_outcome&) { ++done; };
    qpu_link link(loop, clock, cfg, cb);
    if (auto st = link.start(); !st) {
        f.note = st.err().message;
        return f;
    }
    for (int i = 0; i < 400 && !link.endpoint_up(); ++i) {
        loop.run_once(std::chrono::milliseconds(5));
    }
    if (!link.endpoint_up()) {
        f.note = "qpu-sim endpoint did not come up: " + link.last_endpoint_error();
        return f;
    }
    const std::int64_t interval_ns = static_cast<std::int64_t>(interval_us) * 1000;
    const std::int64_t first = clock.now_realtime_ns() + 100'000'000;
    const std::int64_t last = first + interval_ns * loops;
    const std::uint8_t payload[] = "bench";
    std::int64_t next = 0;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30 + loops * interval_us / 1'000'000);
    while (done < static_cast<std::size_t>(loops) && std::chrono::steady_clock::now() < give_up) {
        // Keep the ring fed a little ahead, as the daemon's due_jobs() would.
        while (next < loops && link.dispatch().queued() < 1024) {
            dispatch_job j;
            j.job_id = static_cast<std::uint64_t>(next + 1);
            j.scheduled_ns = first + next * interval_ns;
            j.window_start_ns = first - 1;
            j.window_end_ns = last + 1'000'000'000;
            j.duration_ns = 10'000;
            j.tolerance_ns = 10'000'000;  // measure late sends too, do not drop them as missed
            j.shots = 1;
            if (!link.submit(j, payload)) {
                break;
            }
            ++next;
        }
        loop.run_once(std::chrono::milliseconds(2));
    }
    const dispatch_telemetry t = link.telemetry();
    link.stop();
    const nlohmann::json s = sim.stop();
    f = from_summary(t.dispatch_lateness);
    f.spin_us_per_dispatch = t.spin_ns_per_dispatch / 1e3;
    f.missed = t.counters.missed;
    f.failed = t.counters.failed;
    f.completed = t.counters.completed;
    f.arrival_p50_us = static_cast<double>(t.arrival_lateness.p50_ns) / 1e3;
    f.arrival_p99_us = static_cast<double>(t.arrival_lateness.p99_ns) / 1e3;
    f.lead_us = static_cast<double>(t.lead_ns) / 1e3;
    f.lead_capped = t.lead_capped;
    if (s.contains("out_of_window")) {
        f.sim_out_of_window = s["out_of_window"].get<std::uint64_t>();
    }
    return f;
}

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

void print_row(const char* name, const figures& f) {
    if (!f.ok) {
        std::printf("%-12s  unavailable: %s\n", name, f.note.c_str());
        return;
    }
    std::printf("%-12s %7llu %9.2f %9.2f %9.2f %9.2f %9.2f\n", name, static_cast<unsigned long long>(f.count),
                f.p50_us, f.p95_us, f.p99_us, f.max_us, f.stddev_us);
}

}  // namespace

int main(int argc, char** argv) {
    int cpu = 1;
    int prio = 80;
    int loops = 2000;
    int interval_us = 1000;
    int sim_cpu = 0;
    int sim_prio = 70;
    bool sim_busy_poll = false;
    int hist_max_us = 10000;
    bool skip_cyclictest = false;
    CLI::App app{"dispatch-vs-cyclictest: cyclictest vs the tuned and untuned dispatcher, same CPU/priority/interval"};
    app.footer("Example:\n  build/bench/dispatch/dispatch-vs-cyclictest --cpu 1 --loops 2000 --interval-us 1000");
    app.add_option("--cpu", cpu, "CPU for cyclictest and the tuned dispatch thread");
    app.add_option("--prio", prio, "SCHED_FIFO priority")->check(CLI::Range(1, 99));
    app.add_option("--loops", loops, "cyclictest loops = dispatches per mode")->check(CLI::Range(10, 1000000));
    app.add_option("--interval-us", interval_us, "interval between wakeups/dispatches")->check(CLI::Range(100, 1000000));
    app.add_option("--sim-cpu", sim_cpu, "CPU for qpu-sim (-1: any)");
    app.add_flag("--sim-busy-poll", sim_busy_poll, "qpu-sim spins on its socket (no cross-CPU wakeup per frame)");
    app.add_option("--sim-prio", sim_prio, "qpu-sim SCHED_FIFO priority (0: SCHED_OTHER)")->check(CLI::Range(0, 99));
    app.add_option("--hist-max-us", hist_max_us, "cyclictest -h bound");
    app.add_flag("--skip-cyclictest", skip_cyclictest, "do not run cyclictest");
    CLI11_PARSE(app, argc, argv);
    ::signal(SIGPIPE, SIG_IGN);
    spdlog::set_level(spdlog::level::warn);

    char tmpl[] = "/tmp/qrt-bench-dispatch-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
        std::perror("mkdtemp");
        return 1;
    }
    const fs::path dir = tmpl;

    std::printf("dispatch-vs-cyclictest: cpu %d, SCHED_FIFO %d, interval %d us, %d loops each\n", cpu, prio,
                interval_us, loops);
    std::fflush(stdout);
    figures cyc;
    if (skip_cyclictest) {
        cyc.note = "skipped (--skip-cyclictest)";
    } else {
        cyc = run_cyclictest(cpu, prio, interval_us, loops, hist_max_us);
    }
    const figures tuned = run_dispatcher(dispatch_mode::tuned, cpu, prio, interval_us, loops, sim_cpu, sim_prio, sim_busy_poll, dir);
    const figures untuned = run_dispatcher(dispatch_mode::untuned, cpu, prio, interval_us, loops, sim_cpu, sim_prio, sim_busy_poll, dir);
    std::error_code ec;
    fs::remove_all(dir, ec);

    std::printf("\nlateness (us)   count       p50       p95       p99       max    stddev\n");
    print_row("cyclictest", cyc);
    print_row("tuned", tuned);
    print_row("untuned", untuned);
    const double r_p99_cyc = ratio(tuned.p99_us, cyc.p99_us);
    const double r_p95_untuned = ratio(tuned.p95_us, untuned.p95_us);
    const double r_stddev_untuned = ratio(tuned.stddev_us, untuned.stddev_us);
    std::printf("\nratios (goal):  tuned p99 / cyclictest p99 = %.3f (<= 0.1)\n", r_p99_cyc);
    std::printf("                tuned p95 / untuned p95    = %.3f (<= 0.2)\n", r_p95_untuned);
    std::printf("                tuned stddev / untuned     = %.3f (<= 0.5)\n", r_stddev_untuned);
    std::printf("spin: %.2f us CPU per dispatch (final lead %.1f us, capped by the spin budget %llu times); "
                "missed tuned %llu untuned %llu; qpu-sim out-of-window tuned %llu untuned %llu\n",
                tuned.spin_us_per_dispatch, tuned.lead_us, static_cast<unsigned long long>(tuned.lead_capped),
                static_cast<unsigned long long>(tuned.missed),
                static_cast<unsigned long long>(untuned.missed),
                static_cast<unsigned long long>(tuned.sim_out_of_window),
                static_cast<unsigned long long>(untuned.sim_out_of_window));
    std::printf("arrival lateness at qpu-sim (us): tuned p50 %.1f p99 %.1f; untuned p50 %.1f p99 %.1f\n",
                tuned.arrival_p50_us, tuned.arrival_p99_us, untuned.arrival_p50_us, untuned.arrival_p99_us);
    std::printf("note: 2-vCPU VM, not PREEMPT_RT, hypervisor steal time applies; compare ratios, not absolutes.\n");

    nlohmann::json j = {
        {"bench", "dispatch-vs-cyclictest"},
        {"cpu", cpu},
        {"prio", prio},
        {"interval_us", interval_us},
        {"loops", loops},
        {"cyclictest", cyc.json()},
        {"tuned", tuned.json()},
        {"untuned", untuned.json()},
        {"spin_us_per_dispatch", tuned.spin_us_per_dispatch},
        {"tuned_lead_us", tuned.lead_us},
        {"tuned_lead_capped", tuned.lead_capped},
        {"missed", {{"tuned", tuned.missed}, {"untuned", untuned.missed}}},
        {"qpu_sim_out_of_window", {{"tuned", tuned.sim_out_of_window}, {"untuned", untuned.sim_out_of_window}}},
        {"arrival_p99_us", {{"tuned", tuned.arrival_p99_us}, {"untuned", untuned.arrival_p99_us}}},
        {"ratios",
         {{"tuned_p99_over_cyclictest_p99", r_p99_cyc},
          {"tuned_p95_over_untuned_p95", r_p95_untuned},
          {"tuned_stddev_over_untuned_stddev", r_stddev_untuned}}},
        {"goals_met",
         {{"p99_vs_cyclictest", cyc.ok && tuned.ok && r_p99_cyc <= 0.1},
          {"p95_vs_untuned", tuned.ok && untuned.ok && r_p95_untuned <= 0.2},
          {"stddev_vs_untuned", tuned.ok && untuned.ok && r_stddev_untuned <= 0.5}}},
    };
    std::printf("%s\n", j.dump().c_str());
    return tuned.ok && untuned.ok ? 0 : 1;
}
