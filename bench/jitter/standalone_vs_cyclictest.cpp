// standalone-vs-cyclictest: does qrt-jitter-report's standalone loop measure
// what cyclictest measures?  Both run in this one invocation, one after the
// other (alternating, several rounds), on the same CPU with the same
// SCHED_FIFO priority, interval and number of loops:
//
//   cyclictest -m -n -q -a CPU -p PRIO -i US -l N -h MAXUS
//     (rt-tests 2.x has no -n, clock_nanosleep being its only mode: the
//      harness then drops it and says so)
//   qrt-jitter-report --standalone --cpus CPU --priority PRIO
//                     --interval US us --duration N*US us --json --no-probes
//   qrt-jitter-report ... the same with the eBPF probes attached
//
// The goal is checked on the --no-probes run (the measurement method alone);
// the run with probes gives their overhead on the measured thread.
// cyclictest's histogram (1 us bins, value floor(lateness/1us)) is read from
// its output; a bin k stands for [k, k+1) us and is reported at k + 0.5.
// Goal: p50 within 25 %, p99 of the same order (ratio within 10^+-0.5).
// The VM's hypervisor steal is measured over the run and printed with the
// figures, because it moves both tools' tails.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace {

struct captured {
    int code = -1;
    std::string out;
};

captured run(const std::string& cmd) {
    captured c;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) {
        return c;
    }
    char buf[65536];
    std::size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) {
        c.out.append(buf, n);
    }
    const int status = ::pclose(p);
    c.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return c;
}

std::pair<std::uint64_t, std::uint64_t> read_steal() {
    std::ifstream in("/proc/stat");
    std::string cpu;
    in >> cpu;
    std::uint64_t v = 0;
    std::uint64_t total = 0;
    std::uint64_t steal = 0;
    for (int i = 0; i < 8 && (in >> v); ++i) {
        total += v;
        if (i == 7) {
            steal = v;
        }
    }
    return {steal, total};
}

struct cyclic_result {
    std::map<std::uint64_t, std::uint64_t> bins;  // us -> count
    std::uint64_t overflows = 0;
    std::uint64_t total = 0;
    double max_us = 0;
};

// "000012 000345" lines, then "# Histogram Overflows: 00000 ...".
bool parse_cyclictest(const std::string& text, std::uint64_t hist_max_us, cyclic_result& r, std::string& why) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) {
            continue;
        }
        if (line[0] == '#') {
            unsigned long long v = 0;
            if (std::sscanf(line.c_str(), "# Histogram Overflows: %llu", &v) == 1) {
                r.overflows = v;
            } else if (std::sscanf(line.c_str(), "# Max Latencies: %llu", &v) == 1) {
                r.max_us = static_cast<double>(v);
            }
            continue;
        }
        unsigned long long us = 0;
        unsigned long long count = 0;
        if (std::sscanf(line.c_str(), "%llu %llu", &us, &count) == 2 && us < hist_max_us) {
            if (count > 0) {
                r.bins[us] += count;
                r.total += count;
            }
        }
    }
    r.total += r.overflows;
    if (r.total == 0) {
        why = "no histogram in cyclictest's output";
        return false;
    }
    return true;
}

// Nearest-rank quantile in us (bin midpoint); +inf when in the overflow.
double cyclic_quantile(const cyclic_result& r, double q) {
    const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(r.total)));
    std::uint64_t seen = 0;
    for (const auto& [us, count] : r.bins) {
        seen += count;
        if (seen >= std::max<std::uint64_t>(rank, 1)) {
            return static_cast<double>(us) + 0.5;
        }
    }
    return HUGE_VAL;
}

}  // namespace

int main(int argc, char** argv) {
    unsigned cpu = 1;
    int priority = 80;
    unsigned interval_us = 1000;
    unsigned loops = 10000;
    unsigned rounds = 2;
    unsigned hist_max_us = 10000;
    bool probes = true;
    std::string cyclictest = "cyclictest";
    CLI::App app{"qrt-jitter-report --standalone vs cyclictest on the same CPU, priority, interval"};
    app.add_option("--cpu", cpu, "CPU to measure")->capture_default_str();
    app.add_option("--priority", priority, "SCHED_FIFO priority")->capture_default_str();
    app.add_option("--interval-us", interval_us, "timer period (us)")->capture_default_str();
    app.add_option("--loops", loops, "periods per run")->capture_default_str();
    app.add_option("--rounds", rounds, "alternating rounds of both tools")->capture_default_str();
    app.add_option("--hist-max-us", hist_max_us, "cyclictest -h")->capture_default_str();
    app.add_option("--cyclictest", cyclictest, "cyclictest binary")->capture_default_str();
    app.add_flag("!--no-probes", probes, "skip the extra qrt-jitter-report run with the probes attached");
    CLI11_PARSE(app, argc, argv);

    std::vector<double> c50, c99, q50, q99;
    std::uint64_t q_loops = 0;
    std::uint64_t c_loops = 0;
    std::string probe_status;
    bool use_n = true;
    std::string note;
    const auto steal_start = read_steal();
    // qrt-jitter-report once with --no-probes (the measurement method alone,
    // the like-for-like check) and once with the probes attached (what an
    // operator runs; the difference is the probes' overhead).
    std::vector<double> p50_probes, p99_probes;
    const auto run_qrt = [&](unsigned round, bool with_probes, std::vector<double>& v50,
                             std::vector<double>& v99) -> bool {
        const auto q = run(fmt::format(
            "{} --standalone --cpus {} --priority {} --interval {}us --duration {}us {} --json",
            QRT_JITTER_REPORT_BIN, cpu, priority, interval_us,
            static_cast<unsigned long long>(interval_us) * loops, with_probes ? "" : "--no-probes"));
        if (q.code != 0) {
            std::fprintf(stderr, "qrt-jitter-report failed (exit %d)\n", q.code);
            return false;
        }
        const auto j = nlohmann::json::parse(q.out, nullptr, false);
        if (j.is_discarded() || !j.contains("series") || j["series"].empty()) {
            std::fprintf(stderr, "qrt-jitter-report: unreadable JSON\n");
            return false;
        }
        const auto& s = j["series"][0];
        v50.push_back(s["p50_ns"].get<double>() / 1e3);
        v99.push_back(s["p99_ns"].get<double>() / 1e3);
        q_loops += with_probes ? 0 : s["count"].get<std::uint64_t>();
        const std::string status = j["probes"]["status"].get<std::string>();
        if (with_probes) {
            probe_status = status;
        }
        std::printf("round %u qrt-jitter-report%s: p50 %8.1f us  p99 %8.1f us  max %8.0f us  (%s)\n", round,
                    with_probes ? " +probes" : "        ", v50.back(), v99.back(),
                    s["max_ns"].get<double>() / 1e3, j["run"]["policy"].get<std::string>().c_str());
        return true;
    };
    for (unsigned round = 0; round < rounds; ++round) {
        // Rotate who goes first so a drift in the host's load does not
        // always favour the same tool.
        for (unsigned k = 0; k < 3; ++k) {
            const unsigned turn = (k + round) % 3;
            if (turn == 1) {
                if (!run_qrt(round, false, q50, q99)) {
                    return 2;
                }
                continue;
            }
            if (turn == 2) {
                if (probes && !run_qrt(round, true, p50_probes, p99_probes)) {
                    return 2;
                }
                continue;
            }
                const auto cmd = [&] {
                    return fmt::format("{} -m {}-q -a {} -p {} -i {} -l {} -h {} 2>&1", cyclictest,
                                       use_n ? "-n " : "", cpu, priority, interval_us, loops, hist_max_us);
                };
                auto c = run(cmd());
                if (use_n && c.out.find("invalid option -- 'n'") != std::string::npos) {
                    // rt-tests >= 2.x dropped -n: clock_nanosleep is its only mode.
                    use_n = false;
                    note = "this cyclictest has no -n (clock_nanosleep is its default); ran without it";
                    std::printf("note: %s\n", note.c_str());
                    c = run(cmd());
                }
                cyclic_result r;
                std::string why;
                if (c.code != 0 || !parse_cyclictest(c.out, hist_max_us, r, why)) {
                    std::fprintf(stderr, "cyclictest failed (exit %d): %s\n%s\n", c.code, why.c_str(),
                                 c.out.substr(0, 2000).c_str());
                    return 2;
                }
                c50.push_back(cyclic_quantile(r, 0.50));
                c99.push_back(cyclic_quantile(r, 0.99));
                c_loops += r.total;
                std::printf("round %u cyclictest       : p50 %8.1f us  p99 %8.1f us  max %8.0f us  (%llu samples, %llu overflows)\n",
                            round, c50.back(), c99.back(), r.max_us,
                            static_cast<unsigned long long>(r.total),
                            static_cast<unsigned long long>(r.overflows));
        }
    }
    const auto steal_end = read_steal();
    const double steal_pct =
        steal_end.second > steal_start.second
            ? 100.0 * static_cast<double>(steal_end.first - steal_start.first) /
                  static_cast<double>(steal_end.second - steal_start.second)
            : 0.0;
    const auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        const std::size_t n = v.size();
        return n == 0 ? 0.0 : (n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
    };
    const double cp50 = median(c50);
    const double cp99 = median(c99);
    const double qp50 = median(q50);
    const double qp99 = median(q99);
    const double r50 = cp50 > 0 ? qp50 / cp50 : 0.0;
    const double r99 = cp99 > 0 && std::isfinite(cp99) ? qp99 / cp99 : 0.0;
    const bool p50_ok = r50 >= 0.75 && r50 <= 1.25;
    const bool p99_ok = r99 > 0 && std::fabs(std::log10(r99)) <= 0.5;
    std::printf("\ncpu %u, SCHED_FIFO %d, interval %u us, %u loops x %u rounds, steal %.1f %%\n", cpu,
                priority, interval_us, loops, rounds, steal_pct);
    std::printf("%-22s %12s %16s %10s\n", "median of rounds", "cyclictest", "qrt (no probes)", "ratio");
    std::printf("%-22s %9.1f us %13.1f us %9.2fx  %s\n", "p50", cp50, qp50, r50,
                p50_ok ? "within 25%" : "NOT within 25%");
    std::printf("%-22s %9.1f us %13.1f us %9.2fx  %s\n", "p99", cp99, qp99, r99,
                p99_ok ? "same order" : "NOT same order");
    nlohmann::json line{{"note", note},
                        {"harness", "standalone-vs-cyclictest"},
                        {"cpu", cpu},
                        {"priority", priority},
                        {"interval_us", interval_us},
                        {"loops", loops},
                        {"rounds", rounds},
                        {"probes", probe_status},
                        {"steal_percent", std::round(steal_pct * 100) / 100},
                        {"cyclictest_p50_us", cp50},
                        {"qrt_p50_us", qp50},
                        {"p50_ratio", std::round(r50 * 1000) / 1000},
                        {"cyclictest_p99_us", std::isfinite(cp99) ? nlohmann::json(cp99) : nlohmann::json()},
                        {"qrt_p99_us", qp99},
                        {"p99_ratio", std::round(r99 * 1000) / 1000},
                        {"cyclictest_samples", c_loops},
                        {"qrt_samples", q_loops},
                        {"p50_within_25pct", p50_ok},
                        {"p99_same_order", p99_ok},
                        {"cyclictest_n_flag", use_n}};
    if (!p50_probes.empty()) {
        const double pp50 = median(p50_probes);
        const double pp99 = median(p99_probes);
        std::printf("%-22s %9.1f us %13.1f us %9.2fx  (probes: %s)\n", "p50 with probes", qp50, pp50,
                    qp50 > 0 ? pp50 / qp50 : 0.0, probe_status.c_str());
        std::printf("%-22s %9.1f us %13.1f us %9.2fx\n", "p99 with probes", qp99, pp99, qp99 > 0 ? pp99 / qp99 : 0.0);
        line["qrt_probes_p50_us"] = pp50;
        line["qrt_probes_p99_us"] = pp99;
        line["probes_p50_ratio"] = qp50 > 0 ? std::round(pp50 / qp50 * 1000) / 1000 : 0.0;
        line["probes_p99_ratio"] = qp99 > 0 ? std::round(pp99 / qp99 * 1000) / 1000 : 0.0;
    }
    std::printf("%s\n", line.dump().c_str());
    return 0;
}
