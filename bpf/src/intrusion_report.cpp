#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <string>
#include <tuple>

#include "decode.hpp"
#include "qrt_bpf/intrusion.hpp"

namespace qrt_bpf {

static_assert(static_cast<std::uint32_t>(intrusion_kind::hardirq) == QRT_INTRUSION_HARDIRQ);
static_assert(static_cast<std::uint32_t>(intrusion_kind::softirq) == QRT_INTRUSION_SOFTIRQ);
static_assert(static_cast<std::uint32_t>(intrusion_kind::task) == QRT_INTRUSION_TASK);
static_assert(static_cast<std::uint32_t>(intrusion_kind::local_timer) ==
              QRT_INTRUSION_LOCAL_TIMER);
// Probe 2 and probe 3 share the kind numbering.
static_assert(static_cast<int>(QRT_OUTLIER_HARDIRQ) == static_cast<int>(QRT_INTRUSION_HARDIRQ));
static_assert(static_cast<int>(QRT_OUTLIER_SOFTIRQ) == static_cast<int>(QRT_INTRUSION_SOFTIRQ));
static_assert(static_cast<int>(QRT_OUTLIER_TASK) == static_cast<int>(QRT_INTRUSION_TASK));
static_assert(static_cast<int>(QRT_OUTLIER_LOCAL_TIMER) ==
              static_cast<int>(QRT_INTRUSION_LOCAL_TIMER));

std::string_view to_string(intrusion_kind kind) noexcept {
    switch (kind) {
    case intrusion_kind::hardirq: return "hardirq";
    case intrusion_kind::softirq: return "softirq";
    case intrusion_kind::task: return "task";
    case intrusion_kind::local_timer: return "local_timer";
    }
    return "?";
}

std::string_view softirq_name(std::uint32_t vector) noexcept {
    // include/linux/interrupt.h, enum { HI_SOFTIRQ = 0, ... }
    static constexpr std::array<std::string_view, 10> names = {
        "HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER",
        "RCU"};
    return vector < names.size() ? names[vector] : std::string_view("?");
}

std::string describe_source(intrusion_kind kind, std::uint32_t id, std::string_view name) {
    switch (kind) {
    case intrusion_kind::hardirq:
        return "irq " + std::to_string(id) + " (" + std::string(name) + ")";
    case intrusion_kind::softirq:
        return "softirq " + std::string(softirq_name(id));
    case intrusion_kind::task:
        // id 0 (never a foreign task: the idle task is not counted): the
        // threads of this command that exited and were pruned.
        if (id == 0) {
            return "task " + std::string(name) + " (exited)";
        }
        return "task " + std::string(name) + "/" + std::to_string(id);
    case intrusion_kind::local_timer:
        return "irq LOC (local timer)";
    }
    return "unknown " + std::to_string(id);
}

void sort_by_total(std::vector<intrusion>& list) {
    std::sort(list.begin(), list.end(), [](const intrusion& a, const intrusion& b) {
        return std::tuple(b.total_ns, b.count, a.cpu, a.kind, a.id) <
               std::tuple(a.total_ns, a.count, b.cpu, b.kind, b.id);
    });
}

std::vector<intrusion> merge_cpus(const std::vector<intrusion>& list) {
    std::map<std::tuple<intrusion_kind, std::uint32_t, std::string>, intrusion> merged;
    for (const intrusion& i : list) {
        auto [it, fresh] = merged.try_emplace(std::tuple(i.kind, i.id, i.name), i);
        if (!fresh) {
            intrusion& m = it->second;
            m.count += i.count;
            m.total_ns += i.total_ns;
            m.max_ns = std::max(m.max_ns, i.max_ns);
            m.last_ns = std::max(m.last_ns, i.last_ns);
        }
    }
    std::vector<intrusion> out;
    out.reserve(merged.size());
    for (auto& [key, value] : merged) {
        out.push_back(std::move(value));
    }
    sort_by_total(out);
    return out;
}

namespace detail {

intrusion decode_intrusion(const qrt_intrusion_key& key, const qrt_intrusion_value& value) {
    intrusion i;
    i.kind = static_cast<intrusion_kind>(key.kind);
    i.cpu = key.cpu;
    i.id = key.id;
    i.name = field_name(key.name, sizeof(key.name));
    i.count = value.count;
    i.total_ns = value.total_ns;
    i.max_ns = value.max_ns;
    i.last_ns = value.last_ns;
    return i;
}

}  // namespace detail
std::vector<intrusion_series> aggregate_for_metrics(std::vector<intrusion> list,
                                                    std::size_t max_per_cpu) {
    sort_by_total(list);
    std::map<std::tuple<unsigned, intrusion_kind, std::string>, intrusion_series> rows;
    std::map<unsigned, std::size_t> per_cpu;
    for (const intrusion& i : list) {
        auto key = std::tuple(i.cpu, i.kind,
                              i.kind == intrusion_kind::task ? "task " + i.name : i.source());
        if (rows.count(key) == 0 && per_cpu[i.cpu] >= max_per_cpu) {
            std::get<2>(key) = "other";
        }
        auto [it, fresh] = rows.try_emplace(key);
        if (fresh) {
            ++per_cpu[i.cpu];
            it->second.cpu = i.cpu;
            it->second.kind = i.kind;
            it->second.source = std::get<2>(key);
        }
        it->second.count += i.count;
        it->second.total_ns += i.total_ns;
        it->second.max_ns = std::max(it->second.max_ns, i.max_ns);
    }
    std::vector<intrusion_series> out;
    out.reserve(rows.size());
    for (auto& [key, row] : rows) {
        out.push_back(std::move(row));
    }
    std::sort(out.begin(), out.end(), [](const intrusion_series& a, const intrusion_series& b) {
        return std::tuple(b.total_ns, a.cpu, a.source) < std::tuple(a.total_ns, b.cpu, b.source);
    });
    return out;
}

}  // namespace qrt_bpf
