// qrt-near-term-reserve: slots.reserve per second, as a scheduler, through
// the real daemon's UNIX socket, against how much the tenant has already
// booked in the near term ([tenants] near_term_ns).  Every such booking is
// checked against the tenant's near-term share; that check must not walk
// what is booked, so the rate with 16,000 near-term bookings held stays
// within 0.8x of the rate with none.
//
// Each round starts `qrtd run` (untuned, group commit, policy edf-backfill,
// state on disk) on a fresh state directory, warms it up with --warmup
// reserves placed past the near term (they count nowhere), then books
// --levels blocks of --block reserves, each placed as early as it fits (all
// of them in the near term: 1 ms each on a 1 s period).  The rate of a block
// is the rate at the level booked before it: 0, block, 2 x block, ...
// A block is booked as --samples equal parts, each timed on its own, and
// the block's rate is their median: a block lasts well under a second at
// these rates, so one stall of the machine (a hypervisor's steal, the WAL's
// checkpoint, the heap growing) would otherwise decide a level.  Medians
// over --rounds rounds; the ratio last level / level 0.  Prints a table and
// ends with ONE JSON line.
//
//   build/bench/timeline/qrt-near-term-reserve [--qrtd build/agent/qrtd]
//       [--clients 4] [--window 64] [--block 4000] [--levels 5] [--rounds 5]
//       [--samples 4] [--warmup 2000] [--dir /var/tmp]

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "qrtd_harness.hpp"

int main(int argc, char** argv) {
    namespace fs = std::filesystem;
    using namespace qrt::bench;
    CLI::App app{"slots.reserve per second as a scheduler, against the reservations the tenant "
                 "already holds in the near term"};
    std::string qrtd = QRT_QRTD_PATH;
    int clients = 4;
    std::size_t window = 64;
    std::size_t block = 4000;
    int levels = 5;
    int rounds = 5;
    int samples = 4;
    std::size_t warmup = 2000;
    std::string base = "/var/tmp";
    app.add_option("--qrtd", qrtd, "the qrtd binary");
    app.add_option("--clients", clients, "pipelining connections")->check(CLI::Range(1, 64));
    app.add_option("--window", window, "requests in flight per connection")->check(CLI::Range(1, 1024));
    app.add_option("--block", block, "reserves per level (split over the clients)")->check(CLI::Range(64, 1'000'000));
    app.add_option("--levels", levels, "levels measured: 0, block, 2 x block, ...")->check(CLI::Range(2, 50));
    app.add_option("--rounds", rounds, "rounds, each on a fresh daemon (medians reported)")->check(CLI::Range(1, 20));
    app.add_option("--samples", samples, "parts of a block timed on their own (the block's rate is their median)")
        ->check(CLI::Range(1, 16));
    app.add_option("--warmup", warmup, "reserves past the near term before measuring")->check(CLI::Range(0, 1'000'000));
    app.add_option("--dir", base, "where the state directories go (a real disk: fsync matters)");
    CLI11_PARSE(app, argc, argv);

    // 600 s of near term (the default); each booking is 1 ms, 900 of them
    // fit a second, so every level here lies well inside it.
    constexpr long long near_term_s = 600;
    const fs::path dir = fs::path(base) / ("qrt-near-term-reserve-" + std::to_string(::getpid()));
    const auto parts = static_cast<std::size_t>(samples);
    const std::size_t per_part = std::max<std::size_t>(block / static_cast<std::size_t>(clients) / parts, 1);
    const std::size_t per_level = per_part * parts * static_cast<std::size_t>(clients);
    std::vector<std::vector<double>> rates(static_cast<std::size_t>(levels));
    std::size_t errors = 0;
    for (int r = 0; r < rounds; ++r) {
        qrtd_config cfg;
        cfg.policy = "edf-backfill";
        cfg.horizon_ns = "1_200_000_000_000";
        cfg.max_inflight = window;
        cfg.tenants = "near_term_ns = " + std::to_string(near_term_s) + "_000_000_000\n" +
                      "max_near_term_ns = 600_000_000_000\n";
        qrtd_process d = start_qrtd(qrtd, dir, cfg);
        if (d.pid < 0) {
            return 1;
        }
        const std::string tag = "r" + std::to_string(r);
        if (warmup > 0) {
            const auto past = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count() +
                              (near_term_s + 60) * 1'000'000'000LL;
            (void)reserve_rate(d.sock, clients, std::max<std::size_t>(warmup / static_cast<std::size_t>(clients), 1),
                               window, tag + "w", errors, "\"not_before_ns\":" + std::to_string(past));
        }
        std::printf("round %d:", r + 1);
        for (int l = 0; l < levels; ++l) {
            std::vector<double> part_rates;
            for (std::size_t p = 0; p < parts; ++p) {
                part_rates.push_back(reserve_rate(d.sock, clients, per_part, window,
                                                  tag + "l" + std::to_string(l) + "p" + std::to_string(p), errors));
            }
            const double rate = median(part_rates);
            rates[static_cast<std::size_t>(l)].push_back(rate);
            std::printf(" %zu: %.0f/s", static_cast<std::size_t>(l) * per_level, rate);
            std::fflush(stdout);
        }
        std::printf("\n");
        stop_qrtd(d);
    }
    fs::remove_all(dir);

    std::printf("\n%-46s %12s\n", "near-term reservations held before the block", "reserves/s");
    std::vector<double> med;
    for (int l = 0; l < levels; ++l) {
        med.push_back(median(rates[static_cast<std::size_t>(l)]));
        std::printf("%-46zu %12.0f\n", static_cast<std::size_t>(l) * per_level, med.back());
    }
    const double ratio = med.front() > 0 ? med.back() / med.front() : 0;
    const std::size_t last = static_cast<std::size_t>(levels - 1) * per_level;
    std::printf("%-46s %11.2fx\n", ("rate at " + std::to_string(last) + " / rate at 0").c_str(), ratio);
    std::printf("goal >= 0.8x: %s\n", ratio >= 0.8 ? "PASS" : "FAIL");
    std::printf("{\"bench\":\"near_term_reserve\",\"clients\":%d,\"window\":%zu,\"block\":%zu,\"levels\":%d,"
                "\"rounds\":%d,\"samples\":%d,\"rates_per_s\":[",
                clients, window, per_level, levels, rounds, samples);
    for (std::size_t l = 0; l < med.size(); ++l) {
        std::printf("%s%.0f", l == 0 ? "" : ",", med[l]);
    }
    std::printf("],\"held_at_last\":%zu,\"ratio\":%.2f,\"errors\":%zu,\"goal_ratio\":0.8,\"pass\":%s}\n", last,
                ratio, errors, (ratio >= 0.8 && errors == 0) ? "true" : "false");
    return errors == 0 ? 0 : 1;
}
