// qrt-durable-reserve: durable slots.reserve per second, pipelined from 4
// clients through the real socket to the real daemon (the goal: >= 20,000/s
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

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "qrtd_harness.hpp"

namespace {

namespace fs = std::filesystem;
using namespace qrt::bench;

struct side_result {
    double per_s = 0;
    std::size_t errors = 0;
};

side_result run_side(const std::string& qrtd, const fs::path& dir, std::size_t group_max,
                     int clients, std::size_t window, std::size_t count, const std::string& tag) {
    side_result out;
    qrtd_config cfg;
    cfg.group_max = group_max;
    cfg.max_inflight = window;
    qrtd_process d = start_qrtd(qrtd, dir, cfg);
    if (d.pid < 0) {
        out.errors = static_cast<std::size_t>(clients) * count;
        return out;
    }
    out.per_s = reserve_rate(d.sock, clients, count, window, tag, out.errors);
    stop_qrtd(d);
    return out;
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
