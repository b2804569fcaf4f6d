// two-phase-vs-one-phase: start lateness at the endpoint (when the program
// started there, minus T) for 1 MiB programs, wire version 2 (ARM ahead,
// FIRE at T) against version 1 (the whole JOB at T), in one run, to the same
// qpu-sim whose prepare costs --prepare-ms plus 1 ms per 64 KiB.  Goal:
// two-phase p99 <= 0.25 x one-phase p99.  Also the dispatch thread's frame
// pool (the memory it registers with io_uring and locks) in each version,
// and, tuned (as root), what the thread locked in all.  Ends with ONE JSON
// line.
//
//   build/bench/dispatch/two-phase-vs-one-phase [--jobs 20] [--prepare-ms 200] [--tuned]

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "qrt/dispatch/qpu_link.hpp"
#include "qrt/event_loop.hpp"

using namespace qrt::dispatch;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t ms = 1'000'000;

struct options {
    std::size_t jobs = 20;
    double prepare_ms = 200;
    bool tuned = false;
    int cpu = 1;
};

struct mode_result {
    nlohmann::json sim;            // qpu-sim's summary
    std::size_t completed = 0;
    std::uint64_t pool_bytes = 0;  // the dispatcher's frame pool
    std::uint64_t locked_bytes = 0;  // tuned: all the dispatch thread locked
};

mode_result run(const options& o, unsigned wire_version, const fs::path& dir) {
    const fs::path sock = dir / ("q" + std::to_string(wire_version) + ".sock");
    const std::string summary = (dir / ("summary" + std::to_string(wire_version) + ".json")).string();
    std::vector<std::string> args = {QPU_SIM_PATH, "--listen", "unix://" + sock.string(), "--summary-file", summary,
                                     "--json", "--duration-s", "600", "--prepare-ms", std::to_string(o.prepare_ms),
                                     "--prepare-ns-per-byte", "15.2587890625", "--max-armed", "4", "--cpu", "0"};
    const pid_t pid = ::fork();
    if (pid == 0) {
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
    for (int i = 0; i < 1000 && !fs::exists(sock); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    mode_result r;
    {
        qrt::event_loop loop;
        rtcore::real_clock clock;
        qpu_link_config cfg;
        cfg.endpoint = "unix://" + sock.string();
        cfg.wire_version = wire_version;
        cfg.dispatch.mode = o.tuned ? dispatch_mode::tuned : dispatch_mode::untuned;
        cfg.dispatch.dispatch_cpu = o.tuned ? o.cpu : -1;
        cfg.dispatch.slots = 64;
        cfg.dispatch.max_payload_bytes = 1024 * 1024;
        cfg.result_timeout_ns = 10'000 * ms;
        std::size_t done = 0;
        qpu_link_callbacks cb;
        cb.on_outcome = [&](const dispatch_outcome& out) {
            ++done;
            r.completed += out.state == job_state::completed ? 1 : 0;
        };
        qpu_link link(loop, clock, cfg, cb);
        if (!link.start()) {
            std::fprintf(stderr, "two-phase-vs-one-phase: the link did not start\n");
        }
        for (int i = 0; i < 2000 && !link.endpoint_up(); ++i) {
            loop.run_once(std::chrono::milliseconds(5));
        }
        // One prepare (and the run) apart, so version 1 is not late by a
        // queue of uploads, only by its own.
        const std::int64_t spacing = static_cast<std::int64_t>(o.prepare_ms * 1e6) + 16 * ms + 60 * ms;
        const std::int64_t t0 = clock.now_realtime_ns() + 4 * spacing;
        std::vector<std::uint8_t> program(1024 * 1024, ' ');
        const std::string head = "OPENQASM 3; qubit[2] q; h q[0]; cx q[0], q[1];\n";
        std::copy(head.begin(), head.end(), program.begin());
        for (std::size_t i = 0; i < o.jobs; ++i) {
            dispatch_job j;
            j.job_id = 1 + i;
            j.scheduled_ns = t0 + static_cast<std::int64_t>(i) * spacing;
            j.window_start_ns = j.scheduled_ns - 60'000 * ms;
            j.window_end_ns = j.scheduled_ns + 60'000 * ms;
            j.duration_ns = 1 * ms;
            j.calibration_id = 1;
            j.tolerance_ns = 50 * ms;
            j.shots = 10;
            (void)link.submit(j, program);
        }
        const auto give_up = std::chrono::steady_clock::now() +
                             std::chrono::nanoseconds(4 * spacing * static_cast<std::int64_t>(o.jobs + 4));
        while (done < o.jobs && std::chrono::steady_clock::now() < give_up) {
            loop.run_once(std::chrono::milliseconds(2));
        }
        r.pool_bytes = dispatcher::frame_pool_bytes(cfg.dispatch.slots, cfg.dispatch.max_payload_bytes, wire_version);
        r.locked_bytes = link.dispatch().thread_stats().locked_bytes;
        link.stop();
    }
    ::kill(pid, SIGTERM);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (std::ifstream in(summary); in) {
        in >> r.sim;
    }
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    options o;
    CLI::App app{"two-phase-vs-one-phase: start lateness at the endpoint, wire version 2 against 1 (bench/README.md)"};
    app.add_option("--jobs", o.jobs, "jobs per version (1 MiB programs)")->check(CLI::Range(2, 1000));
    app.add_option("--prepare-ms", o.prepare_ms, "qpu-sim's prepare cost, plus 1 ms per 64 KiB")
        ->check(CLI::Range(0.0, 10'000.0));
    app.add_flag("--tuned", o.tuned, "tuned dispatch thread (SCHED_FIFO, locked memory; needs root)");
    app.add_option("--cpu", o.cpu, "the dispatch CPU when tuned");
    CLI11_PARSE(app, argc, argv);

    char tmpl[] = "/tmp/qrt-two-phase-bench-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
        std::perror("mkdtemp");
        return 1;
    }
    const fs::path dir = tmpl;
    const mode_result two = run(o, 2, dir);
    const mode_result one = run(o, 1, dir);
    std::error_code ec;
    fs::remove_all(dir, ec);

    auto p = [](const mode_result& r, const char* q) {
        return r.sim.contains("start_lateness_ns") ? r.sim["start_lateness_ns"][q].get<double>() : -1.0;
    };
    const double two_p50 = p(two, "p50"), two_p99 = p(two, "p99"), one_p50 = p(one, "p50"), one_p99 = p(one, "p99");
    const double ratio = one_p99 > 0 ? two_p99 / one_p99 : -1;
    const bool ok = two.completed == o.jobs && one.completed == o.jobs && ratio >= 0 && ratio <= 0.25 &&
                    two.sim.value("two_phase", nlohmann::json::object()).value("fired_unarmed", 1) == 0;
    std::printf("start lateness at the endpoint, %zu jobs of 1 MiB, prepare %.0f ms + 1 ms / 64 KiB:\n", o.jobs,
                o.prepare_ms);
    std::printf("  two-phase (wire 2): p50 %10.1f us  p99 %10.1f us  (%zu completed)\n", two_p50 / 1e3, two_p99 / 1e3,
                two.completed);
    std::printf("  one-phase (wire 1): p50 %10.1f us  p99 %10.1f us  (%zu completed)\n", one_p50 / 1e3, one_p99 / 1e3,
                one.completed);
    std::printf("  ratio p99 two/one: %.5f (goal <= 0.25): %s\n", ratio, ok ? "PASS" : "FAIL");
    std::printf("  dispatch frame pool (registered, locked): wire 1 %.1f MiB, wire 2 %.1f KiB (%.0fx less)\n",
                static_cast<double>(one.pool_bytes) / 1048576.0, static_cast<double>(two.pool_bytes) / 1024.0,
                two.pool_bytes != 0 ? static_cast<double>(one.pool_bytes) / static_cast<double>(two.pool_bytes) : 0.0);
    if (o.tuned) {
        std::printf("  the dispatch thread locked in all: wire 1 %.1f MiB, wire 2 %.1f MiB\n",
                    static_cast<double>(one.locked_bytes) / 1048576.0, static_cast<double>(two.locked_bytes) / 1048576.0);
    }
    const nlohmann::json j = {
        {"bench", "two_phase_vs_one_phase"},
        {"jobs", o.jobs},
        {"prepare_ms", o.prepare_ms},
        {"start_lateness_us",
         {{"two_phase", {{"p50", two_p50 / 1e3}, {"p99", two_p99 / 1e3}}},
          {"one_phase", {{"p50", one_p50 / 1e3}, {"p99", one_p99 / 1e3}}}}},
        {"ratio_p99", ratio},
        {"frame_pool_bytes", {{"one_phase", one.pool_bytes}, {"two_phase", two.pool_bytes}}},
        {"locked_bytes", {{"one_phase", one.locked_bytes}, {"two_phase", two.locked_bytes}}},
        {"completed", {{"one_phase", one.completed}, {"two_phase", two.completed}}},
        {"pass", ok},
    };
    std::printf("%s\n", j.dump().c_str());
    return ok ? 0 : 1;
}
