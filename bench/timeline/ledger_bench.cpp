// slots.query and slots.reserve against a ledger already holding 1k, 10k and
// 100k reservations at the same density (the horizon grows with N).  The
// goal is O(log n): cost at 100k within 3x of the cost at 1k.  Ends with one
// JSON line of the figures and ratios.
//
// BM_reserve_release_durable does the same with the SQLite store on disk
// and the daemon's group-commit writer: each iteration is a reserve and a
// release AND the wait until both are durable (one transaction, one fsync),
// in wall time (the fsync is not this thread's CPU).  Its 100k/1k ratio is
// the goal "100k vs 1k including the SQLite commit" (bench/README.md).
#include <benchmark/benchmark.h>

#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <unistd.h>
#include <vector>
#include <memory>
#include <random>
#include <string>

#include "qrt/timeline/ledger.hpp"

namespace {

using namespace qrt::timeline;

constexpr std::int64_t s_ns = 1'000'000'000;
constexpr std::int64_t t0_ns = 1'000'000 * s_ns;
constexpr std::int64_t period_ns = 100 * s_ns;
constexpr std::int64_t mean_spacing_ns = 12 * s_ns;  // per reservation, over 2 QPUs

struct populated {
    std::unique_ptr<ledger> l;
    std::int64_t span_ns = 0;
};

// What the daemon's event loop does for the writer: runs what it posts, on
// the benchmark's thread.
struct loop_stub {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::function<void()>> posted;
    qrt::timeline::commit_writer::post_fn poster() {
        return [this](std::function<void()> fn) {
            const std::lock_guard<std::mutex> lk(mu);
            posted.push_back(std::move(fn));
            cv.notify_all();
        };
    }
    // Run the writer's outcomes until every change of l is durable.
    void settle(const ledger& l) {
        while (l.durable_seq() < l.latest_seq()) {
            std::vector<std::function<void()>> batch;
            {
                std::unique_lock<std::mutex> lk(mu);
                cv.wait(lk, [this] { return !posted.empty(); });
                batch.swap(posted);
            }
            for (auto& fn : batch) {
                fn();
            }
        }
    }
};

loop_stub& stub() {
    static loop_stub s;
    return s;
}

std::string store_dir() {
    static const std::string d = [] {
        const auto p = std::filesystem::path("/var/tmp") /
                       ("qrt-ledger-bench-" + std::to_string(::getpid()));
        std::filesystem::create_directories(p);
        return p.string();
    }();
    return d;
}

// One ledger per size (and per in-memory / durable), built once and reused
// by every benchmark.
populated& ledger_with(std::int64_t n, bool durable = false) {
    static std::map<std::pair<std::int64_t, bool>, populated> cache;
    auto it = cache.find({n, durable});
    if (it != cache.end()) {
        return it->second;
    }
    populated p;
    p.span_ns = n * mean_spacing_ns;
    ledger_options o;
    o.policy = "edf-backfill";
    o.horizon_ns = p.span_ns + 10 * period_ns;
    o.max_lease_ns = 3'600 * s_ns;
    auto opened = ledger::open(
        {qpu_spec{"q0", periodic_calibration{period_ns, 10 * s_ns, 0, 0.99, 1000 * s_ns}},
         qpu_spec{"q1", periodic_calibration{period_ns, 10 * s_ns, 0, 0.99, 1000 * s_ns}}},
        o, durable ? store_dir() + "/ledger-" + std::to_string(n) + ".db" : std::string(), t0_ns);
    if (!opened) {
        std::fprintf(stderr, "ledger::open: %s\n", opened.err().message.c_str());
        std::abort();
    }
    p.l = std::move(*opened);
    if (durable) {
        p.l->start_writer(stub().poster());
    }
    std::mt19937_64 rng(42);
    std::int64_t placed = 0;
    while (placed < n) {
        request r;
        r.duration_ns = std::uniform_int_distribution<std::int64_t>(1, 20)(rng) * s_ns;
        r.not_before_ns =
            t0_ns + std::uniform_int_distribution<std::int64_t>(0, p.span_ns)(rng);
        if (p.l->reserve("bench", r, "", 3'600 * s_ns, t0_ns)) {
            ++placed;
        }
    }
    if (durable) {
        stub().settle(*p.l);
        (void)p.l->drain_events();
    }
    return cache.emplace(std::make_pair(n, durable), std::move(p)).first->second;
}

request random_request(std::mt19937_64& rng, std::int64_t span_ns) {
    request r;
    r.duration_ns = std::uniform_int_distribution<std::int64_t>(1, 20)(rng) * s_ns;
    r.not_before_ns = t0_ns + std::uniform_int_distribution<std::int64_t>(0, span_ns)(rng);
    r.max_candidates = 4;
    return r;
}

void BM_query(benchmark::State& state) {
    populated& p = ledger_with(state.range(0));
    std::mt19937_64 rng(7);
    for (auto _ : state) {
        auto q = p.l->query(random_request(rng, p.span_ns), t0_ns);
        benchmark::DoNotOptimize(q);
    }
    state.counters["gaps"] = static_cast<double>(p.l->stats().gaps);
}

// reserve followed by release, so N stays constant across iterations.
void BM_reserve_release(benchmark::State& state) {
    populated& p = ledger_with(state.range(0));
    std::mt19937_64 rng(9);
    for (auto _ : state) {
        auto r = p.l->reserve("bench2", random_request(rng, p.span_ns), "", 0, t0_ns);
        if (r) {
            auto rel = p.l->release("bench2", r->id, r->fencing_token, t0_ns);
            benchmark::DoNotOptimize(rel);
        }
    }
    // Outside the timed loop: drop the released records so N stays N.
    (void)p.l->forget_terminal(t0_ns + p.span_ns + 20 * period_ns);
    p.l->drain_events();
}

// The same, with the SQLite store and group-commit writer: a reserve and a
// release, then the wait until both are on disk.
void BM_reserve_release_durable(benchmark::State& state) {
    populated& p = ledger_with(state.range(0), true);
    std::mt19937_64 rng(9);
    for (auto _ : state) {
        auto r = p.l->reserve("bench2", random_request(rng, p.span_ns), "", 0, t0_ns);
        if (r) {
            auto rel = p.l->release("bench2", r->id, r->fencing_token, t0_ns);
            benchmark::DoNotOptimize(rel);
        }
        stub().settle(*p.l);
    }
    (void)p.l->forget_terminal(t0_ns + p.span_ns + 20 * period_ns);
    stub().settle(*p.l);
    p.l->drain_events();
}

BENCHMARK(BM_query)->Arg(1'000)->Arg(10'000)->Arg(100'000)->MinTime(0.3);
BENCHMARK(BM_reserve_release_durable)->Arg(1'000)->Arg(100'000)->MinTime(0.5)->UseRealTime();
BENCHMARK(BM_reserve_release)->Arg(1'000)->Arg(10'000)->Arg(100'000)->MinTime(0.3);

class capture final : public benchmark::ConsoleReporter {
public:
    void ReportRuns(const std::vector<Run>& runs) override {
        ConsoleReporter::ReportRuns(runs);
        for (const Run& r : runs) {
            if (r.run_type == Run::RT_Iteration && r.iterations > 0) {
                // CPU time: the machine is shared, wall time includes other
                // people's builds.
                ns[r.benchmark_name()] =
                    r.cpu_accumulated_time * 1e9 / static_cast<double>(r.iterations);
                wall_ns[r.benchmark_name()] =
                    r.real_accumulated_time * 1e9 / static_cast<double>(r.iterations);
            }
        }
    }
    std::map<std::string, double> ns;
    std::map<std::string, double> wall_ns;
};

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
        return 1;
    }
    capture rep;
    benchmark::RunSpecifiedBenchmarks(&rep);
    benchmark::Shutdown();
    auto get = [&](const std::string& k) {
        const auto it = rep.ns.find(k);
        return it == rep.ns.end() ? 0.0 : it->second;
    };
    const double q1k = get("BM_query/1000/min_time:0.300");
    const double q100k = get("BM_query/100000/min_time:0.300");
    const double r1k = get("BM_reserve_release/1000/min_time:0.300");
    const double r100k = get("BM_reserve_release/100000/min_time:0.300");
    const double q_ratio = q1k > 0 ? q100k / q1k : 0.0;
    const double r_ratio = r1k > 0 ? r100k / r1k : 0.0;
    std::printf("\nquery   100k/1k cost ratio: %.2fx (goal <= 3x) %s\n", q_ratio,
                q_ratio <= 3.0 ? "PASS" : "FAIL");
    std::printf("reserve 100k/1k cost ratio: %.2fx (goal <= 3x) %s\n", r_ratio,
                r_ratio <= 3.0 ? "PASS" : "FAIL");
    const auto wall = [&](const std::string& k) {
        const auto it = rep.wall_ns.find(k);
        return it == rep.wall_ns.end() ? 0.0 : it->second;
    };
    const double d1k = wall("BM_reserve_release_durable/1000/min_time:0.500/real_time");
    const double d100k = wall("BM_reserve_release_durable/100000/min_time:0.500/real_time");
    const double d_ratio = d1k > 0 ? d100k / d1k : 0.0;
    std::printf("reserve+release+commit 100k/1k ratio: %.2fx (goal <= 3x, wall time, fsync "
                "included) %s\n",
                d_ratio, d_ratio <= 3.0 ? "PASS" : "FAIL");
    std::filesystem::remove_all(store_dir());
    std::printf("{\"bench\":\"timeline_ledger\",\"durable_reserve_release_wall_ns\":{\"1k\":%.0f,"
                "\"100k\":%.0f},\"durable_ratio_100k_1k\":%.3f,",
                d1k, d100k, d_ratio);
    std::printf("\"query_cpu_ns\":{\"1k\":%.0f,\"10k\":%.0f,\"100k\":%.0f},"
                "\"reserve_release_cpu_ns\":{\"1k\":%.0f,\"10k\":%.0f,\"100k\":%.0f},"
                "\"query_ratio_100k_1k\":%.3f,\"reserve_ratio_100k_1k\":%.3f,\"goal_ratio\":3.0,"
                "\"pass\":%s}\n",
                q1k, get("BM_query/10000/min_time:0.300"), q100k, r1k,
                get("BM_reserve_release/10000/min_time:0.300"), r100k, q_ratio, r_ratio,
                (q_ratio <= 3.0 && r_ratio <= 3.0 && d_ratio <= 3.0) ? "true" : "false");
    return 0;
}
