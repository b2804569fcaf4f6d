// Micro benchmarks of the primitives on the dispatch thread's hot path:
// histogram record, SPSC push/pop, clock reads.  Pure micro benches: each
// figure is per operation; compare them within one run (the VM is shared).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "rtcore/clock.hpp"
#include "rtcore/histogram.hpp"
#include "rtcore/spsc_ring.hpp"

namespace {

std::vector<std::int64_t> lateness_samples(std::size_t n) {
    std::mt19937_64 g(1);
    std::lognormal_distribution<double> d(std::log(3000.0), 0.9);
    std::vector<std::int64_t> v(n);
    for (auto& x : v) {
        x = static_cast<std::int64_t>(d(g));
    }
    return v;
}

void bm_histogram_record(benchmark::State& state) {
    const auto samples = lateness_samples(4096);
    rtcore::histogram h;
    std::size_t i = 0;
    for (auto _ : state) {
        h.record(samples[i++ & 4095]);
    }
    benchmark::DoNotOptimize(h.count());
    state.SetItemsProcessed(state.iterations());
}
BENCHMARK(bm_histogram_record);

void bm_histogram_quantile_p999(benchmark::State& state) {
    rtcore::histogram h;
    for (auto v : lateness_samples(100'000)) {
        h.record(v);
    }
    for (auto _ : state) {
        benchmark::DoNotOptimize(h.quantile(0.999));
    }
}
BENCHMARK(bm_histogram_quantile_p999);

void bm_histogram_merge(benchmark::State& state) {
    rtcore::histogram a;
    rtcore::histogram b;
    for (auto v : lateness_samples(10'000)) {
        b.record(v);
    }
    for (auto _ : state) {
        benchmark::DoNotOptimize(&b);
        a.merge(b);
        benchmark::DoNotOptimize(&a);
        benchmark::ClobberMemory();
    }
}
BENCHMARK(bm_histogram_merge);

struct job_descriptor {
    std::uint64_t job_id;
    std::int64_t scheduled_ns;
    std::uint64_t calibration_id;
    std::uint32_t payload_slot;
    std::uint32_t payload_len;
};

void bm_spsc_push_pop_one_thread(benchmark::State& state) {
    rtcore::spsc_ring<job_descriptor> ring(1024);
    job_descriptor d{1, 2, 3, 4, 5};
    for (auto _ : state) {
        ring.try_push(d);
        auto out = ring.try_pop();
        benchmark::DoNotOptimize(out);
        ++d.job_id;
    }
    state.SetItemsProcessed(state.iterations());
}
BENCHMARK(bm_spsc_push_pop_one_thread);

// Thread 0 produces, thread 1 consumes: cross-core transfer cost.  Both run
// the same number of iterations, so the ring drains at the end of each run.

void bm_spsc_transfer_two_threads(benchmark::State& state) {
    static rtcore::spsc_ring<job_descriptor> ring(1024);  // thread-safe init
    std::uint64_t n = 0;
    for (auto _ : state) {
        if (state.thread_index() == 0) {
            while (!ring.try_push(job_descriptor{n, 0, 0, 0, 0})) {
            }
        } else {
            std::optional<job_descriptor> d;
            while (!(d = ring.try_pop())) {
            }
            benchmark::DoNotOptimize(d);
        }
        ++n;
    }
    state.SetItemsProcessed(state.iterations());
}
BENCHMARK(bm_spsc_transfer_two_threads)->Threads(2)->UseRealTime();

void bm_clock_monotonic_direct(benchmark::State& state) {
    for (auto _ : state) {
        benchmark::DoNotOptimize(rtcore::monotonic_now_ns());
    }
}
BENCHMARK(bm_clock_monotonic_direct);

void bm_clock_monotonic_through_seam(benchmark::State& state) {
    rtcore::real_clock real;
    const rtcore::clock_source& clk = real;
    for (auto _ : state) {
        benchmark::DoNotOptimize(clk.now_monotonic_ns());
    }
}
BENCHMARK(bm_clock_monotonic_through_seam);

void bm_clock_realtime_through_seam(benchmark::State& state) {
    rtcore::real_clock real;
    const rtcore::clock_source& clk = real;
    for (auto _ : state) {
        benchmark::DoNotOptimize(clk.now_realtime_ns());
    }
}
BENCHMARK(bm_clock_realtime_through_seam);

void bm_time_base_sample(benchmark::State& state) {
    rtcore::real_clock clk;
    for (auto _ : state) {
        benchmark::DoNotOptimize(rtcore::time_base::sample(clk));
    }
}
BENCHMARK(bm_time_base_sample);

}  // namespace

BENCHMARK_MAIN();
