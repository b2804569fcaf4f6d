// qrtctl agent hello|status, qpus list.

#include "commands.hpp"

#include <array>
#include <cstdint>
#include <ostream>

namespace qrtctl {

namespace {

constexpr std::array<column, 4> method_columns{{
    {"METHOD", "name"},
    {"ROLE", "role"},
    {"ALLOWED", "allowed", shown_as::yes_no},
    {"SUMMARY", "summary"},
}};

constexpr std::array<column, 7> hello_fields{{
    {"agent", "agent"},
    {"agent_version", "agent_version"},
    {"api_version", "api_version"},
    {"tenant", "peer.tenant"},
    {"uid", "peer.uid"},
    {"roles", "peer.roles", shown_as::list},
    {"max_line_bytes", "limits.max_line_bytes"},
}};

constexpr command_help agent_hello_help{
    "API version, agent version, your roles and the methods",
    "  qrtctl agent hello\n  qrtctl agent hello --json | jq .allowed\n"};

int agent_hello(context& ctx) {
    return ctx.call_and_show("agent.hello", json{{"client", "qrtctl"}}, [&](const json& r) {
        ctx.out() << render_fields(r, hello_fields) << '\n';
        ctx.out() << make_table(r.value("methods", json::array()), method_columns).render();
    });
}

constexpr command_help agent_status_help{
    "partition, IRQs, kernel, probes, QPUs and health",
    "  qrtctl agent status\n  qrtctl agent status --json | jq .health\n"};

int agent_status(context& ctx) {
    return ctx.call_and_show("agent.status", json::object(),
                             [&](const json& r) { ctx.out() << render_flat(r); });
}

constexpr command_help qpus_list_help{
    "the QPUs of this host and the placement policy",
    "  qrtctl qpus list\n  qrtctl qpus list --json | jq -r '.qpus[].name'\n"};

// One row per QPU: its scalars, with the device facts and the window in
// force folded into a column each (--json keeps the objects).
json qpu_rows(const json& qpus) {
    json rows = json::array();
    for (const auto& q : qpus) {
        if (!q.is_object()) {
            continue;
        }
        json row = json::object();
        for (const auto& [k, v] : q.items()) {
            if (!v.is_object() && !v.is_array() && k != "window" && k != "device") {
                row[k] = v;
            }
        }
        const json& dev = q.contains("device") ? q.at("device") : json();
        row["qubits"] = dev.is_object() ? dev.value("qubits", json()) : json("-");
        const json& w = q.contains("window") ? q.at("window") : json();
        row["window"] = w.is_object() ? json("id " + std::to_string(w.value("calibration_id", std::uint64_t{0}))) : json("blackout");
        rows.push_back(std::move(row));
    }
    return rows;
}

int qpus_list(context& ctx) {
    return ctx.call_and_show("qpus.list", json::object(), [&](const json& r) {
        ctx.out() << make_table_auto(qpu_rows(r.value("qpus", json::array()))).render();
        ctx.out() << "policy: " << show(r.value("policy", json()), shown_as::text) << '\n';
    });
}

}  // namespace

// clang-format off
constexpr std::array<command, 3> agent_commands{{
    {"agent",       "hello",     agent_hello_help,        no_options,                 agent_hello},
    {"agent",       "status",    agent_status_help,       no_options,                 agent_status},
    {"qpus",        "list",      qpus_list_help,          no_options,                 qpus_list},
}};
// clang-format on

}  // namespace qrtctl
