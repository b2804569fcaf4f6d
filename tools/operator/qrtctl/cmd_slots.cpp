// qrtctl slots query|reserve|heartbeat|release.

#include "commands.hpp"

#include <array>
#include <ostream>

namespace qrtctl {

namespace {

constexpr std::array<column, 7> candidate_columns{{
    {"QPU", "qpu"},
    {"START", "start_ns", shown_as::time},
    {"END", "end_ns", shown_as::time},
    {"CALIBRATION", "calibration_id"},
    {"CAL_AGE", "calibration_age_ns", shown_as::duration},
    {"FIDELITY", "predicted_fidelity", shown_as::fixed3},
    {"SCORE", "score", shown_as::fixed3},
}};

// The request fields of slots query and reserve: request_params, and
// --gang-size when given.
std::optional<json> slot_request(context& ctx, int& rc) {
    auto p = request_params(ctx, rc);
    if (p && ctx.has.has("--gang-size")) {
        (*p)["gang_size"] = ctx.opt.gang_size;
    }
    return p;
}

constexpr command_help slots_query_help{
    "candidate slots for a request (or the next window when none fits)",
    "  qrtctl slots query --duration 2ms --qpu qpu0\n"
    "  qrtctl slots query --duration 500us --not-before +1s --deadline +10s --max-candidates 8\n"
    "  qrtctl slots query --duration 2ms --min-fidelity 0.98 --json\n"
    "  qrtctl slots query --duration 1ms --gang-size 2   (one start on 2 QPUs)\n"};

void slots_query_options(CLI::App& app, options& o, given& g) {
    request_options(app, o, g);
    g.add("--max-candidates",
          app.add_option("--max-candidates", o.max_candidates, "how many candidates (1..64)")
              ->check(CLI::Range(1, 64)));
    gang_size_option(app, o, g, "the gang a reserve of this size would take now");
}

int slots_query(context& ctx) {
    int rc = exit_ok;
    auto p = slot_request(ctx, rc);
    if (!p) {
        return rc;
    }
    if (ctx.has.has("--max-candidates")) {
        (*p)["max_candidates"] = ctx.opt.max_candidates;
    }
    return ctx.call_and_show("slots.query", *p, [&](const json& r) {
        const json& cands = r.value("candidates", json::array());
        if (!cands.empty()) {
            ctx.out() << make_table(cands, candidate_columns).render();
            return;
        }
        ctx.out() << "no slot fits: " << show(r.value("why_none", json()), shown_as::text) << '\n';
        if (r.contains("next_window")) {
            ctx.out() << "next window:\n"
                      << make_table(json::array({r["next_window"]}), window_columns).render();
        }
    });
}

constexpr command_help slots_reserve_help{
    "hold a slot under a lease; prints the id and fencing token",
    "  qrtctl slots reserve --duration 2ms --qpu qpu0 --idempotency-key slurm-$SLURM_JOB_ID\n"
    "  qrtctl slots reserve --duration 1ms --lease 60s --deadline +5m --json\n"
    "  qrtctl slots reserve --duration 1ms --gang-size 2   (one start on 2 QPUs)\n"
    "  qrtctl -s /run/qrtd/a.sock -s /run/qrtd/b.sock slots reserve --duration 1ms -k job-7\n"
    "      (the best of several agents: held on each, earliest start kept, others released)\n"};

void slots_reserve_options(CLI::App& app, options& o, given& g) {
    request_options(app, o, g);
    idempotency_key_option(app, o, g,
                           "retry-safe key (default: generated; pass the scheduler's job id)");
    g.add("--lease",
          app.add_option("--lease", o.lease, "lease length, e.g. 30s (default: the agent's)"));
    gang_size_option(app, o, g, "reserve one start on this many QPUs");
}

int slots_reserve(context& ctx) {
    int rc = exit_ok;
    auto p = slot_request(ctx, rc);
    if (!p) {
        return rc;
    }
    (*p)["idempotency_key"] = idempotency_key(ctx);
    std::string problem;
    if (ctx.has.has("--lease") &&
        !put_duration(ctx, *p, "lease_ns", "--lease", ctx.opt.lease, problem)) {
        return ctx.usage(problem);
    }
    if (ctx.opt.sockets.size() > 1) {
        ctx.show_reserved = [&](const json& r) { show_reservation(ctx, r); };
        return ctx.place_best(*p);
    }
    return ctx.call_and_show("slots.reserve", *p, [&](const json& r) { show_reservation(ctx, r); });
}

constexpr command_help slots_heartbeat_help{
    "extend a held reservation's lease",
    "  qrtctl slots heartbeat --reservation 42 --fencing-token 7\n"};

int slots_heartbeat(context& ctx) { return call_on_reservation(ctx, "slots.heartbeat"); }

constexpr command_help slots_release_help{
    "give a held reservation back", "  qrtctl slots release --reservation 42 --fencing-token 7\n"};

int slots_release(context& ctx) { return call_on_reservation(ctx, "slots.release"); }

}  // namespace

// clang-format off
constexpr std::array<command, 4> slots_commands{{
    {"slots",       "query",     slots_query_help,        slots_query_options,        slots_query},
    {"slots",       "reserve",   slots_reserve_help,      slots_reserve_options,      slots_reserve},
    {"slots",       "heartbeat", slots_heartbeat_help,    held_reservation_options,   slots_heartbeat},
    {"slots",       "release",   slots_release_help,      held_reservation_options,   slots_release},
}};
// clang-format on

}  // namespace qrtctl
