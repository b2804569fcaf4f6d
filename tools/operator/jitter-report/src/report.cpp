#include "jitter_report/report.hpp"

#include <algorithm>
#include <array>
#include <utility>

namespace qrt::jitter {

std::string metric_title(const std::string& metric) {
    static constexpr std::array<std::pair<const char*, const char*>, 12> titles{{
        {"timer_lateness", "timer lateness"},
        {"dispatch_lateness", "dispatch lateness"},
        {"timer_wakeup", "dispatch timer wakeup"},
        {"arrival_lateness", "arrival lateness at the QPU"},
        {"arm_to_armed", "ARM -> ARMED"},
        {"arm_cost", "arm cost at the endpoint"},
        {"arm_cost_parse", "arm cost: parse"},
        {"arm_cost_compile", "arm cost: compile"},
        {"arm_cost_upload", "arm cost: upload"},
        {"arm_cost_arm", "arm cost: arm"},
        {"start_lateness", "start lateness at the endpoint (started - T)"},
        {"probe_wakeup", "wakeup latency (eBPF)"},
    }};
    for (const auto& [id, title] : titles) {
        if (metric == id) {
            return title;
        }
    }
    return metric;
}

const std::vector<std::int64_t>& bin_bounds_ns() {
    static const std::vector<std::int64_t> bounds = [] {
        // R10 preferred numbers, x100 so they stay integers.
        static constexpr std::array<std::int64_t, 10> steps{100, 125, 160, 200, 250,
                                                            320, 400, 500, 630, 800};
        std::vector<std::int64_t> b;
        for (std::int64_t decade = 100; decade <= 10'000'000'000; decade *= 10) {
            for (const auto step : steps) {
                const std::int64_t v = decade * step / 100;
                if (v > 10'000'000'000) {
                    break;
                }
                const auto snapped = rtcore::histogram::bucket_upper_at_or_above(v);
                if (b.empty() || snapped > b.back()) {
                    b.push_back(snapped);
                }
            }
        }
        return b;
    }();
    return bounds;
}

latency_stats stats_of(const rtcore::histogram& h) {
    return latency_stats{h.summary(), h.negative_count()};
}

std::vector<bin> bins_of(const rtcore::histogram& h) {
    std::vector<bin> cumulative;
    std::uint64_t prev = 0;
    for (const auto le : bin_bounds_ns()) {
        const auto c = h.count_at_or_below(le);
        if (c != prev) {
            cumulative.push_back({le, c});
            prev = c;
        }
        if (c == h.count()) {
            break;
        }
    }
    return bins_from_cumulative(cumulative, h.count(), h.max());
}

// Rows of the terminal histogram: the series' bins, with the empty bins of
// the standard bounds put back so the shape shows, merged pairwise until at
// most max_rows remain.
std::vector<bin> display_bins(const series& s, std::size_t max_rows) {
    std::vector<bin> rows;
    if (s.bins.empty()) {
        return rows;
    }
    const auto& bounds = bin_bounds_ns();
    const bool standard = std::all_of(s.bins.begin(), s.bins.end(), [&](const bin& b) {
        return std::binary_search(bounds.begin(), bounds.end(), b.le_ns);
    });
    if (standard) {
        auto first = std::lower_bound(bounds.begin(), bounds.end(), s.bins.front().le_ns);
        auto last = std::lower_bound(bounds.begin(), bounds.end(), s.bins.back().le_ns);
        std::size_t k = 0;
        for (auto it = first; it <= last; ++it) {
            bin b{*it, 0};
            if (k < s.bins.size() && s.bins[k].le_ns == *it) {
                b.count = s.bins[k].count;
                ++k;
            }
            rows.push_back(b);
        }
    } else {
        rows = s.bins;
    }
    while (rows.size() > max_rows) {
        std::vector<bin> merged;
        for (std::size_t i = 0; i < rows.size(); i += 2) {
            bin b = rows[i];
            if (i + 1 < rows.size()) {
                b.le_ns = rows[i + 1].le_ns;
                b.count += rows[i + 1].count;
            }
            merged.push_back(b);
        }
        rows = std::move(merged);
    }
    return rows;
}

std::vector<bin> bins_from_cumulative(const std::vector<bin>& cumulative, std::uint64_t total,
                                      std::int64_t max_ns) {
    std::vector<bin> out;
    std::uint64_t prev = 0;
    std::int64_t last_le = -1;
    for (const auto& step : cumulative) {
        if (step.le_ns <= last_le || step.count < prev) {
            continue;  // not monotonic: ignore the step rather than invent counts
        }
        if (step.count > prev) {
            out.push_back({step.le_ns, step.count - prev});
        }
        prev = step.count;
        last_le = step.le_ns;
    }
    if (total > prev) {
        const std::int64_t le = max_ns > last_le ? max_ns : last_le + 1;
        out.push_back({le, total - prev});
    }
    return out;
}

}  // namespace qrt::jitter
