#pragma once
// Intrusions on isolated CPUs (probe 2) and outlier causes (probe 3), decoded
// from the BPF records into plain C++ values.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qrt_bpf {

enum class intrusion_kind : std::uint32_t {
    hardirq = 1,      // id: IRQ number, name: irqaction name ("virtio0-input.0")
    softirq = 2,      // id: softirq vector (name from softirq_name())
    task = 3,         // id: TID, name: comm
    local_timer = 4,  // id: vector (x86 "LOC")
};

std::string_view to_string(intrusion_kind kind) noexcept;
// Kernel softirq vector names, as in /proc/softirqs: HI TIMER NET_TX NET_RX
// BLOCK IRQ_POLL TASKLET SCHED HRTIMER RCU; "?" beyond.
std::string_view softirq_name(std::uint32_t vector) noexcept;
// "irq 24 (virtio0-input.0)", "softirq NET_RX", "task stress-ng-cpu/1234",
// "irq LOC (local timer)".
std::string describe_source(intrusion_kind kind, std::uint32_t id, std::string_view name);

struct intrusion {
    intrusion_kind kind = intrusion_kind::task;
    unsigned cpu = 0;
    std::uint32_t id = 0;
    std::string name;
    std::uint64_t count = 0;
    std::uint64_t total_ns = 0;
    std::uint64_t max_ns = 0;
    std::uint64_t last_ns = 0;  // CLOCK_MONOTONIC end of the latest one

    std::string source() const { return describe_source(kind, id, name); }
};

// Largest total_ns first (ties: larger count, then cpu, kind, id).
void sort_by_total(std::vector<intrusion>& list);

// Per-source totals merged over CPUs (cpu of the result: the first seen).
std::vector<intrusion> merge_cpus(const std::vector<intrusion>& list);

// The series a metric exporter shows, with bounded label cardinality: a task
// is keyed by its command name, not its TID (so every new thread does not add
// a series forever), and per CPU only the max_per_cpu largest sources keep
// their own row; the rest add up in one row whose label() is "other".
// Sums count and total_ns, keeps the largest max_ns; largest total first.
struct intrusion_series {
    unsigned cpu = 0;
    intrusion_kind kind = intrusion_kind::task;
    std::string source;  // "task kworker/1:7", "irq 36 (eth0)", "other"
    std::uint64_t count = 0;
    std::uint64_t total_ns = 0;
    std::uint64_t max_ns = 0;
};
std::vector<intrusion_series> aggregate_for_metrics(std::vector<intrusion> list,
                                                    std::size_t max_per_cpu);

}  // namespace qrt_bpf
