// qrtctl calibration get|update.

#include "commands.hpp"

#include <array>
#include <exception>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "units.hpp"

namespace qrtctl {

namespace {

// A window "ID,FROM,UNTIL[,F0[,TAU]]" (times in the time syntax, TAU a
// duration).
std::optional<json> parse_window(const std::string& text, std::string& problem) {
    std::vector<std::string> parts;
    std::stringstream ss(text);
    std::string part;
    while (std::getline(ss, part, ',')) {
        parts.push_back(part);
    }
    if (parts.size() < 3 || parts.size() > 5) {
        problem = "--window '" + text + "' is not ID,FROM,UNTIL[,F0[,TAU]]";
        return std::nullopt;
    }
    json w = json::object();
    auto id = parse_duration_ns(parts[0]);  // a bare integer parses as ns
    if (!id.value || parts[0].find_first_not_of("0123456789") != std::string::npos) {
        problem = "--window '" + text + "': calibration id '" + parts[0] + "' is not an integer";
        return std::nullopt;
    }
    w["calibration_id"] = *id.value;
    const std::int64_t now = realtime_now_ns();
    auto from = parse_time_ns(parts[1], now);
    auto until = parse_time_ns(parts[2], now);
    if (!from.value || !until.value) {
        problem = "--window '" + text + "': " + (from.value ? until.error : from.error);
        return std::nullopt;
    }
    w["valid_from_ns"] = *from.value;
    w["valid_until_ns"] = *until.value;
    if (parts.size() >= 4) {
        try {
            std::size_t used = 0;
            const double f0 = std::stod(parts[3], &used);
            if (used != parts[3].size()) {
                throw std::invalid_argument("trailing");
            }
            w["f0"] = f0;
        } catch (const std::exception&) {
            problem = "--window '" + text + "': f0 '" + parts[3] + "' is not a number";
            return std::nullopt;
        }
    }
    if (parts.size() == 5) {
        auto tau = parse_duration_ns(parts[4]);
        if (!tau.value) {
            problem = "--window '" + text + "': tau " + tau.error;
            return std::nullopt;
        }
        w["tau_ns"] = *tau.value;
    }
    return w;
}

constexpr command_help calibration_get_help{"a QPU's calibration windows from now on",
                                            "  qrtctl calibration get --qpu qpu0\n"};

void calibration_get_options(CLI::App& app, options& o, given&) {
    app.add_option("--qpu", o.qpu, "QPU name")->required();
}

int calibration_get(context& ctx) {
    return ctx.call_and_show("calibration.get", json{{"qpu", ctx.opt.qpu}}, [&](const json& r) {
        ctx.out() << make_table(r.value("windows", json::array()), window_columns).render();
    });
}

constexpr command_help calibration_update_help{
    "replace a QPU's pushed windows from now on (role calibration)",
    "  qrtctl calibration update --qpu qpu0 --window 7,+1s,+10m,0.99,1h\n"
    "  qrtctl calibration update --qpu qpu0 --windows-file windows.json\n"
    "    (windows.json: [{\"calibration_id\":7,\"valid_from_ns\":...,\"valid_until_ns\":...}])\n"};

void calibration_update_options(CLI::App& app, options& o, given& g) {
    app.add_option("--qpu", o.qpu, "QPU name")->required();
    g.add("--window", app.add_option(
        "--window", o.windows,
        "ID,FROM,UNTIL[,F0[,TAU]]: FROM/UNTIL as --not-before, TAU a duration (repeatable)"));
    g.add("--windows-file", app.add_option(
        "--windows-file", o.windows_file, "a JSON array of window objects ('-': stdin)"));
}

int calibration_update(context& ctx) {
    json windows = json::array();
    std::string problem;
    if (ctx.has.has("--windows-file") == ctx.has.has("--window")) {
        return ctx.usage("give either --window (repeatable) or --windows-file");
    }
    if (ctx.has.has("--windows-file")) {
        auto text = read_file(ctx.opt.windows_file, problem);
        if (!text) {
            return ctx.usage(problem);
        }
        windows = json::parse(*text, nullptr, false);
        if (windows.is_discarded() || !windows.is_array()) {
            return ctx.usage(ctx.opt.windows_file + " does not hold a JSON array");
        }
    } else {
        for (const auto& w : ctx.opt.windows) {
            auto parsed = parse_window(w, problem);
            if (!parsed) {
                return ctx.usage(problem);
            }
            windows.push_back(std::move(*parsed));
        }
    }
    return ctx.call_and_show("calibration.update", json{{"qpu", ctx.opt.qpu}, {"windows", windows}},
                             [&](const json& r) { ctx.out() << render_flat(r); });
}

}  // namespace

// clang-format off
constexpr std::array<command, 2> calibration_commands{{
    {"calibration", "get",       calibration_get_help,    calibration_get_options,    calibration_get},
    {"calibration", "update",    calibration_update_help, calibration_update_options, calibration_update},
}};
// clang-format on

}  // namespace qrtctl
