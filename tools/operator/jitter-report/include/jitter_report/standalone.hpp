#pragma once
// Standalone mode: a cyclictest-like measurement on the given CPUs.  One
// thread per CPU, pinned, SCHED_FIFO (SCHED_OTHER with a note when not
// permitted), memory locked, timer slack 1 ns, cpu_dma_latency held at 0:
//
//   next = now + interval
//   loop: clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, next)
//         lateness = clock_gettime(CLOCK_MONOTONIC) - next -> rtcore::histogram
//         next += interval (and again while next <= now: overruns)
//
// With the eBPF probes (when they load): the wakeup latency of each
// measuring thread (probe 1, one per CPU), intrusions on the measured CPUs
// (probe 2) and the causes of wakeups over the outlier threshold (probe 3).
// Otherwise the report says `probes: unavailable (<reason>)`.

#include <atomic>
#include <cstdint>

#include "jitter_report/report.hpp"
#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"

namespace qrt::jitter {

struct standalone_options {
    rtcore::cpu_set cpus{1};
    std::int64_t duration_ns = 10'000'000'000;
    std::int64_t interval_ns = 1'000'000;
    int priority = 80;
    bool probes = true;
    std::int64_t outlier_threshold_ns = 100'000;
    // Set from a signal handler to end the run early (a report is still made).
    const std::atomic<bool>* stop = nullptr;
};

// Range checks and CPUs against the host's online CPUs (through fs): an
// unknown CPU is an error naming it and the CPUs that exist.
rtcore::status validate(const standalone_options& opt, const rtcore::host_fs& fs);

// fs: /sys and /proc reads, /dev/cpu_dma_latency (held at 0 during the run).
rtcore::result<report> run_standalone(const standalone_options& opt, rtcore::host_fs& fs);

// Host facts for the report header (hostname, kernel, PREEMPT_RT).
host_info read_host_info(const rtcore::host_fs& fs);

}  // namespace qrt::jitter
