#include "jitter_report/baseline.hpp"

#include <cerrno>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jitter_report/render.hpp"
#include "jitter_report/slo.hpp"

namespace qrt::jitter {

rtcore::result<report> load_baseline(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        const int err = errno;
        return rtcore::error::from_errno(err, "--baseline: open " + path);
    }
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) {
        const int err = errno;
        return rtcore::error::from_errno(err, "--baseline: read " + path);
    }
    const std::string body = text.str();
    if (body.empty()) {
        return rtcore::error::invalid(fmt::format("--baseline {}: the file is empty", path));
    }
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(body);
    } catch (const nlohmann::json::parse_error& e) {
        return rtcore::error::invalid(fmt::format(
            "--baseline {}: not valid JSON at byte {} (corrupted or truncated?): {}", path, e.byte,
            e.what()));
    }
    auto r = report_from_json(j);
    if (!r) {
        return rtcore::error::invalid(
            fmt::format("--baseline {}: not a qrt-jitter-report --json file: {}", path, r.err().message));
    }
    return r;
}

comparison compare(const report& current, const report& baseline, const std::string& file) {
    comparison c;
    c.file = file;
    c.baseline_mode = baseline.run.mode;
    c.baseline_taken_ns = baseline.run.taken_ns;
    static constexpr const char* stats[] = {"p50", "p95", "p99", "p99.9", "max", "stddev"};
    const auto same = [](const series& a, const series& b) {
        return a.scope == b.scope && a.name == b.name && a.metric == b.metric;
    };
    const auto label = [](const series& s) { return fmt::format("{} {} {}", s.scope, s.name, s.metric); };
    for (const auto& now : current.series_list) {
        const series* before = nullptr;
        for (const auto& b : baseline.series_list) {
            if (same(now, b)) {
                before = &b;
                break;
            }
        }
        if (before == nullptr) {
            c.only_in_current.push_back(label(now));
            continue;
        }
        for (const char* stat : stats) {
            comparison_row row;
            row.scope = now.scope;
            row.name = now.name;
            row.metric = now.metric;
            row.stat = stat;
            row.baseline_ns = stat_value(before->stats, stat);
            row.current_ns = stat_value(now.stats, stat);
            if (row.baseline_ns > 0.0) {
                row.ratio = row.current_ns / row.baseline_ns;
            }
            c.rows.push_back(std::move(row));
        }
    }
    for (const auto& b : baseline.series_list) {
        bool found = false;
        for (const auto& now : current.series_list) {
            found = found || same(now, b);
        }
        if (!found) {
            c.only_in_baseline.push_back(label(b));
        }
    }
    return c;
}

}  // namespace qrt::jitter
