// qrtctl health.

#include "commands.hpp"

#include <array>
#include <utility>
#include <vector>

namespace qrtctl {

namespace {

// The agent's health verdict from agent.status: (healthy, reasons).
std::pair<bool, std::vector<std::string>> judge_health(const json& status) {
    std::vector<std::string> reasons;
    const auto collect = [&](const json& list) {
        if (!list.is_array()) {
            return;
        }
        for (const auto& r : list) {
            if (r.is_string()) {
                reasons.push_back(r.get<std::string>());
            } else if (r.is_object() && r.contains("message")) {
                reasons.push_back(show(r["message"], shown_as::text));
            } else {
                reasons.push_back(r.dump());
            }
        }
    };
    const auto healthy_word = [](const std::string& s) {
        return s == "ok" || s == "healthy" || s == "ready";
    };
    if (!status.is_object() || !status.contains("health")) {
        return {false, {"agent.status carries no 'health' member"}};
    }
    const json& h = status["health"];
    if (h.is_string()) {
        const auto s = h.get<std::string>();
        if (!healthy_word(s)) {
            reasons.push_back("health is '" + s + "'");
        }
        return {healthy_word(s), reasons};
    }
    if (h.is_boolean()) {
        return {h.get<bool>(), h.get<bool>() ? reasons : std::vector<std::string>{"health is false"}};
    }
    if (h.is_object()) {
        bool ok = false;
        if (h.contains("ok") && h["ok"].is_boolean()) {
            ok = h["ok"].get<bool>();
        } else {
            const json& s = h.contains("status") ? h["status"] : h.contains("state") ? h["state"] : json();
            ok = s.is_string() && healthy_word(s.get<std::string>());
            if (!ok) {
                reasons.push_back("health is '" + show(s, shown_as::text) + "'");
            }
        }
        for (const char* key : {"reasons", "problems", "degraded", "errors"}) {
            if (h.contains(key)) {
                collect(h[key]);
            }
        }
        return {ok, reasons};
    }
    return {false, {"agent.status 'health' has an unexpected form: " + h.dump()}};
}

constexpr command_help health_help{
    "exit 0 when the agent answers and reports itself healthy; otherwise print why and "
    "exit non-zero (Slurm HealthCheckProgram, Kubernetes probes)",
    "  qrtctl health                 readiness: agent.status must report health ok\n"
    "  qrtctl health --liveness      liveness: the agent answers agent.hello\n"
    "  qrtctl health --timeout 1s --socket /run/qrtd/qrtd.sock\n"};

void health_options(CLI::App& app, options& o, given&) {
    app.add_flag("--liveness", o.liveness, "only check that the agent answers (not its health)");
}

int health(context& ctx) {
    int rc = exit_ok;
    auto hello = ctx.call("agent.hello", json{{"client", "qrtctl health"}}, rc);
    if (!hello) {
        return rc;
    }
    json verdict{{"healthy", true},
                 {"agent_version", hello->value("agent_version", json())},
                 {"reasons", json::array()}};
    if (!ctx.opt.liveness) {
        auto st = ctx.call("agent.status", json::object(), rc);
        if (!st) {
            return rc;
        }
        auto [ok, reasons] = judge_health(*st);
        verdict["healthy"] = ok;
        verdict["reasons"] = reasons;
        if (st->contains("health")) {
            verdict["health"] = (*st)["health"];
        }
    }
    const bool ok = verdict["healthy"].get<bool>();
    if (ctx.opt.json) {
        ctx.print_json(verdict);
    } else if (ok) {
        ctx.out() << "ok: qrtd " << show(verdict["agent_version"], shown_as::text)
                  << (ctx.opt.liveness ? " answers" : " is healthy") << '\n';
    } else {
        std::string why;
        for (const auto& r : verdict["reasons"]) {
            why += (why.empty() ? "" : "; ") + r.get<std::string>();
        }
        ctx.out() << "degraded: " << why << '\n';
        ctx.err() << "qrtctl: health: degraded: " << why << '\n';
    }
    return ok ? exit_ok : qrt::client::exit_code_for(qrt::client::local_reason::degraded);
}

}  // namespace

// clang-format off
constexpr std::array<command, 1> health_commands{{
    {"",            "health",    health_help,             health_options,             health},
}};
// clang-format on

}  // namespace qrtctl
