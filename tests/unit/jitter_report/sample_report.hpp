#pragma once
// A report with every part filled, for the rendering and baseline tests.

#include <cstdint>
#include <string>

#include "jitter_report/report.hpp"

namespace jitter_test {

inline qrt::jitter::series sample_series(const std::string& name, int cpu, std::int64_t base_ns,
                                         bool primary = true,
                                         const std::string& metric = "timer_lateness") {
    rtcore::histogram h;
    for (int i = 0; i < 5000; ++i) {
        h.record(base_ns + (i % 97) * 37);
    }
    for (int i = 0; i < 40; ++i) {
        h.record(base_ns * 10 + i * 1000);
    }
    h.record(base_ns * 400);
    qrt::jitter::series s;
    s.scope = "cpu";
    s.name = name;
    s.cpu = cpu;
    s.metric = metric;
    s.primary = primary;
    s.stats = qrt::jitter::stats_of(h);
    s.bins = qrt::jitter::bins_of(h);
    return s;
}

inline qrt::jitter::report sample_report() {
    qrt::jitter::report r;
    r.tool_version = "0.1.0";
    r.run.mode = "standalone";
    r.run.taken_ns = 1'790'000'000'000'000'000;
    r.run.duration_ns = 10'000'000'000;
    r.run.cpus = "1,3";
    r.run.interval_ns = 1'000'000;
    r.run.priority = 80;
    r.run.policy = "SCHED_FIFO";
    r.host = {"a-rather-long-hostname.lab.example.org", "6.18.44-fc-v669", false, 3.25};
    r.probes = {true, "available (tp_btf)"};
    r.series_list.push_back(sample_series("cpu1", 1, 4'000));
    r.series_list.push_back(sample_series("cpu3", 3, 9'000));
    r.series_list.push_back(sample_series("cpu1", 1, 2'000, false, "probe_wakeup"));
    r.intrusions.push_back({1, "hardirq", "irq 24 (virtio0-input.0-with-a-very-long-irq-name)", 120,
                            3'400'000, 52'000});
    r.intrusions.push_back({1, "local_timer", "irq LOC (local timer)", 2637, 24'000'000, 25'200});
    r.intrusions.push_back({3, "task", "task kworker/3:1-events_power_efficient/123456", 9, 800, 200});
    r.outliers.push_back({1, 4242, 2'370'000, "task cc1plus/30541 2.37ms",
                          "tid 4242 (qrt-jitter) on cpu 1: 2370 us after wakeup", 0, ""});
    r.notes.push_back(
        "hypervisor steal was 3.2 % during the run: the latencies include time the hypervisor "
        "took the vCPUs away, and this note is long enough to need wrapping twice over at least");
    return r;
}

}  // namespace jitter_test
