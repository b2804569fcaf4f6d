// qrtctl telemetry, metrics.

#include "commands.hpp"

#include <array>
#include <ostream>

namespace qrtctl {

namespace {


constexpr command_help telemetry_help{
    "histograms, counters and gauges (telemetry.snapshot)",
    "  qrtctl telemetry\n  qrtctl telemetry --prefix qrt_rpc_ --json\n"};

void telemetry_options(CLI::App& app, options& o, given& g) {
    g.add("--prefix",
          app.add_option("--prefix", o.prefix, "only metrics whose name starts so"));
}

int telemetry(context& ctx) {
    static constexpr std::array<column, 3> metric_cols{
        {{"NAME", "name"}, {"LABELS", "labels"}, {"VALUE", "value"}}};
    static constexpr std::array<column, 7> hist_cols{{{"NAME", "name"},
                                                      {"LABELS", "labels"},
                                                      {"COUNT", "count"},
                                                      {"P50", "p50_ns", shown_as::duration},
                                                      {"P99", "p99_ns", shown_as::duration},
                                                      {"P99.9", "p999_ns", shown_as::duration},
                                                      {"MAX", "max_ns", shown_as::duration}}};
    json p = json::object();
    if (ctx.has.has("--prefix")) {
        p["prefix"] = ctx.opt.prefix;
    }
    return ctx.call_and_show("telemetry.snapshot", p, [&](const json& r) {
        json metrics = json::array();
        for (const char* kind : {"counters", "gauges"}) {
            for (const auto& m : r.value(kind, json::array())) {
                metrics.push_back(m);
            }
        }
        ctx.out() << make_table(metrics, metric_cols).render();
        const json& h = r.value("histograms", json::array());
        if (!h.empty()) {
            ctx.out() << '\n' << make_table(h, hist_cols).render();
        }
    });
}

constexpr command_help metrics_help{
    "Prometheus text exposition",
    "  qrtctl metrics\n  qrtctl metrics | grep qrt_rpc_requests_total\n"};

int metrics(context& ctx) {
    return ctx.call_and_show("metrics", json::object(),
                             [&](const json& r) { ctx.out() << r.value("text", std::string()); });
}

}  // namespace

// clang-format off
constexpr std::array<command, 2> telemetry_commands{{
    {"",            "telemetry", telemetry_help,          telemetry_options,          telemetry},
    {"",            "metrics",   metrics_help,            no_options,                 metrics},
}};
// clang-format on

}  // namespace qrtctl
