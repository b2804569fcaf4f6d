#pragma once
// The renderings of one report.  Each is a pure function of the report.

#include <string>

#include <nlohmann/json.hpp>

#include "jitter_report/report.hpp"
#include "rtcore/error.hpp"

namespace qrt::jitter {

inline constexpr std::size_t text_columns = 80;  // every text line is shorter

struct text_options {
    std::size_t histogram_width = 40;  // bar columns
    std::size_t top_intrusions = 8;
    std::size_t top_outliers = 5;
    bool histograms = true;
};

// Human report: every line < 80 columns, ends with the SLO verdict.
std::string render_text(const report& r, const text_options& opt = {});

// The documented schema (qrt-jitter-report(1), JSON SCHEMA).
nlohmann::json to_json(const report& r);

// The inverse of to_json for what a baseline needs (run, series stats);
// every missing or mis-typed field is an error naming its JSON path.
rtcore::result<report> report_from_json(const nlohmann::json& j);

// A standalone SVG 1.1 document: one panel per primary series, bars per bin
// with log-scaled heights, axes and labels.
std::string render_svg(const report& r);

}  // namespace qrt::jitter
