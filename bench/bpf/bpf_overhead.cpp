// overhead: what the probes cost the thread they watch.  One periodic wakeup
// loop (cyclictest style: clock_nanosleep TIMER_ABSTIME, lateness measured by
// clock_gettime) runs in alternating phases with the probes off and on, in
// one run, on the same CPU; the figures are the lateness p50/p99 of each
// state and their ratios.  With the probes on, all three are loaded, the loop
// thread is a registered dispatch TID and its CPU the "isolated" CPU, so its
// own wakeup path runs the sched_wakeup, sched_switch, timer and IRQ programs.
// BPF run-time stats (bpf_enable_stats) give the programs' own cost.
//
//   sudo build/bench/bpf/bpf_overhead [--cpu 1] [--loops 2000] [--rounds 2]
//        [--period-us 1000] [--fifo 80] [--threshold-us 100]
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "qrt_bpf/probe_set.hpp"

namespace {

struct bpf_cost {
    std::uint64_t run_ns = 0;
    std::uint64_t runs = 0;
    unsigned programs = 0;
};

// Run-time stats of the tp_btf_/raw_tp_ programs loaded since boot_ns.
bpf_cost read_bpf_cost(std::uint64_t loaded_after_boot_ns) {
    bpf_cost c;
    __u32 id = 0;
    while (bpf_prog_get_next_id(id, &id) == 0) {
        const int fd = bpf_prog_get_fd_by_id(id);
        if (fd < 0) {
            continue;
        }
        bpf_prog_info info{};
        __u32 len = sizeof(info);
        if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0 && info.load_time >= loaded_after_boot_ns &&
            (std::strncmp(info.name, "tp_btf_", 7) == 0 || std::strncmp(info.name, "raw_tp_", 7) == 0)) {
            c.run_ns += info.run_time_ns;
            c.runs += info.run_cnt;
            c.programs++;
        }
        ::close(fd);
    }
    return c;
}

struct phase_result {
    std::vector<double> lateness_ns;
    bpf_cost cost;
    double seconds = 0;
};

}  // namespace

int main(int argc, char** argv) {
    unsigned cpu = 1;
    int loops = 2000;
    int rounds = 2;
    int period_us = 1000;
    int fifo = 80;
    int threshold_us = 100;
    CLI::App app{"Probe overhead: periodic wakeup lateness with probes off vs on"};
    app.add_option("--cpu", cpu, "CPU of the loop (the 'isolated' CPU)")->check(CLI::Range(0, 1023));
    app.add_option("--loops", loops, "wakeups per phase")->check(CLI::Range(100, 1000000));
    app.add_option("--rounds", rounds, "off/on pairs")->check(CLI::Range(1, 100));
    app.add_option("--period-us", period_us, "wakeup period")->check(CLI::Range(50, 1000000));
    app.add_option("--fifo", fifo, "SCHED_FIFO priority of the loop, 0: SCHED_OTHER")
        ->check(CLI::Range(0, 99));
    app.add_option("--threshold-us", threshold_us, "outlier threshold of probe 3")
        ->check(CLI::Range(1, 1000000));
    CLI11_PARSE(app, argc, argv);

    const auto pre = qrt_bpf::preflight(rtcore::host_fs::system());
    if (!pre.available()) {
        std::cerr << "overhead: probes " << pre.to_string() << "\n";
        return 2;
    }
    // Run-time stats add two clock reads to every program run, so they are
    // only enabled for one extra "on" phase after the off/on rounds; that
    // phase gives the programs' own cost and is left out of the lateness.
    int stats_fd = -1;
    qrt_bench::steal_meter steal;
    std::vector<double> off_ns, on_ns;
    bpf_cost cost_total;
    double on_seconds = 0;
    unsigned long long outliers = 0;
    std::string flavour;

    for (int r = 0; r <= rounds; ++r) {
        const bool stats_phase = r == rounds;
        if (stats_phase) {
            stats_fd = bpf_enable_stats(BPF_STATS_RUN_TIME);
            if (stats_fd < 0) {
                std::fprintf(stderr, "overhead: bpf_enable_stats: %s (no per-run cost)\n",
                             std::strerror(errno));
                break;
            }
        }
        for (bool on : {false, true}) {
            if (stats_phase && !on) {
                continue;
            }
            std::optional<qrt_bpf::probe_set> probes;
            const auto boot_ns = static_cast<std::uint64_t>(rtcore::clock_now_ns(CLOCK_BOOTTIME));
            if (on) {
                qrt_bpf::probe_config cfg;
                cfg.isolated_cpus = {cpu};
                cfg.outlier_threshold_ns = static_cast<std::uint64_t>(threshold_us) * 1000;
                probes.emplace(qrt_bpf::probe_set::start(cfg));
                if (!probes->availability().available()) {
                    std::cerr << "overhead: " << probes->describe() << "\n";
                    return 2;
                }
                flavour = probes->wakeup()->flavour();
            }
            std::vector<double> late;
            int thread_err = 0;
            const auto t0 = rtcore::monotonic_now_ns();
            std::thread loop([&] {
                if (!qrt_bench::pin_to(cpu) || (fifo > 0 && !qrt_bench::set_fifo(fifo))) {
                    thread_err = errno;
                    return;
                }
                if (probes) {
                    (void)probes->add_tid(static_cast<pid_t>(::syscall(SYS_gettid)));
                }
                late = qrt_bench::periodic_loop(loops, static_cast<std::int64_t>(period_us) * 1000);
            });
            // Housekeeping side drains the outlier ring while the loop runs.
            while (probes && late.empty() && thread_err == 0) {
                auto ev = probes->outliers()->poll(100);
                if (ev) {
                    outliers += ev->size();
                }
                if (rtcore::monotonic_now_ns() - t0 > static_cast<std::int64_t>(loops) * period_us * 1000 + 5'000'000'000) {
                    break;
                }
            }
            loop.join();
            if (thread_err != 0) {
                std::cerr << "overhead: pinning or SCHED_FIFO failed: " << std::strerror(thread_err) << "\n";
                return 2;
            }
            const double secs = static_cast<double>(rtcore::monotonic_now_ns() - t0) / 1e9;
            if (stats_phase) {
                const bpf_cost c = read_bpf_cost(boot_ns);
                cost_total.run_ns += c.run_ns;
                cost_total.runs += c.runs;
                cost_total.programs = c.programs;
                on_seconds += secs;
            } else if (on) {
                on_ns.insert(on_ns.end(), late.begin(), late.end());
            } else {
                off_ns.insert(off_ns.end(), late.begin(), late.end());
            }
            std::printf("round %d probes %-9s: p50 %8.0f ns  p99 %9.0f ns  max %9.0f ns\n", r,
                        stats_phase ? "on+stats" : (on ? "on" : "off"), qrt_bench::percentile(late, 0.5),
                        qrt_bench::percentile(late, 0.99), qrt_bench::percentile(late, 1.0));
        }
    }
    if (stats_fd >= 0) {
        ::close(stats_fd);
    }
    const double off50 = qrt_bench::percentile(off_ns, 0.5), on50 = qrt_bench::percentile(on_ns, 0.5);
    const double off99 = qrt_bench::percentile(off_ns, 0.99), on99 = qrt_bench::percentile(on_ns, 0.99);
    const double avg_prog_ns =
        cost_total.runs ? static_cast<double>(cost_total.run_ns) / static_cast<double>(cost_total.runs) : 0;
    const double bpf_cpu_pct = on_seconds > 0 ? 100.0 * static_cast<double>(cost_total.run_ns) /
                                                    (on_seconds * 1e9 * std::thread::hardware_concurrency())
                                              : 0;
    const double steal_pct = steal.percent();
    std::printf("lateness off: p50 %.0f ns  p99 %.0f ns  (%zu samples)\n", off50, off99, off_ns.size());
    std::printf("lateness on : p50 %.0f ns  p99 %.0f ns  (%zu samples, %s)\n", on50, on99, on_ns.size(),
                flavour.c_str());
    std::printf("ratio on/off: p50 %.3f  p99 %.3f  (p50 %+.0f ns)\n", off50 > 0 ? on50 / off50 : 0,
                off99 > 0 ? on99 / off99 : 0, on50 - off50);
    std::printf("bpf programs (stats phase): %u, %llu runs, %.0f ns per run, %.4f%% of all CPUs;"
                " %llu outlier events (> %d us)\n",
                cost_total.programs, static_cast<unsigned long long>(cost_total.runs), avg_prog_ns,
                bpf_cpu_pct, outliers, threshold_us);
    std::printf("note: this is a VM with hypervisor steal (%.2f%% during the run); figures are noisy\n",
                steal_pct);
    qrt_bench::json_line j;
    j.str("bench", "bpf-overhead")
        .num("cpu", cpu)
        .num("fifo_prio", fifo)
        .num("period_us", period_us)
        .num("samples_per_state", static_cast<double>(off_ns.size()))
        .str("flavour", flavour)
        .num("off_p50_ns", off50)
        .num("off_p99_ns", off99)
        .num("on_p50_ns", on50)
        .num("on_p99_ns", on99)
        .num("ratio_p50", off50 > 0 ? on50 / off50 : 0)
        .num("ratio_p99", off99 > 0 ? on99 / off99 : 0)
        .num("p50_added_ns", on50 - off50)
        .num("bpf_ns_per_run", avg_prog_ns)
        .num("bpf_runs_per_s", on_seconds > 0 ? static_cast<double>(cost_total.runs) / on_seconds : 0)
        .num("bpf_cpu_pct", bpf_cpu_pct)
        .num("outlier_events", static_cast<double>(outliers))
        .num("steal_pct", steal_pct);
    std::printf("%s\n", j.render().c_str());
    return 0;
}
