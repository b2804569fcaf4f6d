#pragma once
// One comparison report of qrt-fleet-sim and its renderings: a text table
// (under 100 columns), one JSON document (printed as the last line), and
// SVG line plots.  Each rendering is a pure function of the report.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fleet.hpp"

namespace qrt::fleet {

struct report {
    std::string title;
    std::string machine;             // nproc, CPU model, kernel
    fleet_params base;               // the parameters every row shares (but load/regime/seed)
    std::vector<std::uint64_t> seeds;
    std::vector<fleet_metrics> rows;  // one per structure x regime x load x seed (x hosts)
    nlohmann::json extra = nlohmann::json::object();  // claims and verdicts
};

// Mean over seeds of every figure, keyed by structure, regime, load, hosts.
std::vector<fleet_metrics> mean_over_seeds(const std::vector<fleet_metrics>& rows);

std::string render_table(const std::vector<fleet_metrics>& rows);
nlohmann::json to_json(const report& r);
nlohmann::json to_json(const fleet_metrics& m);

// One line per structure: y(load), for one regime.  y is a member of
// fleet_metrics chosen by name ("miss_rate", "utilization").
std::string render_svg(const std::vector<fleet_metrics>& means, const std::string& regime,
                       const std::string& metric, const std::string& title);

}  // namespace qrt::fleet
