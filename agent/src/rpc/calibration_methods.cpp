// The calibration blocks' methods (qrtd(8), CALIBRATION BLOCKS): a
// calibration service asks for time before its parameters go stale
// (calibration.request), gives it back (calibration.cancel), and anyone may
// list what is held (calibration.blocks).  Each handler makes one ledger
// call; a change is answered once durable.
#include <algorithm>
#include <limits>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "qrt/rpc/timeline_methods.hpp"
#include "rtcore/clock.hpp"

namespace qrt::rpc {

namespace tl = qrt::timeline;

namespace {

constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();

json fidelity_json(const std::optional<double>& f) { return f ? json(*f) : json(nullptr); }

class calibration_methods {
public:
    calibration_methods(tl::ledger& ledger, const timeline_options& opts)
        : _ledger(ledger), _now(opts.now_ns) {}

    json request(const json& params, call_context& ctx);
    json cancel(const json& params, call_context& ctx);
    json blocks(const json& params, call_context& ctx);

private:
    std::int64_t now() const { return _now ? _now() : rtcore::realtime_now_ns(); }

    // What calibration.request answers: the block, the held reservations
    // asked to yield, and the calibration in force at its start and at
    // needed_by.
    json answer(const tl::calibration_block& b) const {
        json out = to_json(b);
        out["predicted_fidelity_at_start"] = fidelity_json(_ledger.predicted_fidelity(b.qpu, b.start_ns));
        out["predicted_fidelity_at_needed_by"] = fidelity_json(_ledger.predicted_fidelity(b.qpu, b.needed_by_ns));
        return out;
    }

    void check_commit_backlog() const {
        if (!_ledger.stopped().empty()) {
            throw rpc_failure("store_error",
                              fmt::format("ledger: {}; qrtd stops, retry once it is back", _ledger.stopped()));
        }
        if (!_ledger.accepting_changes()) {
            throw rpc_failure("unavailable",
                              fmt::format("ledger: {} changes are waiting for their commit "
                                          "(timeline.commit_queue_max {}); retry shortly",
                                          _ledger.commit_backlog(), _ledger.options().commit_queue_max),
                              json{{"cause", "commit_backlog"}, {"limit", _ledger.options().commit_queue_max}});
        }
    }

    tl::ledger& _ledger;
    std::function<std::int64_t()> _now;
};

json calibration_methods::request(const json& params, call_context& ctx) {
    check_commit_backlog();
    const params_reader p(params, {"qpu", "step", "duration_ns", "needed_by_ns", "urgency", "idempotency_key"});
    tl::block_request req;
    req.qpu = p.str("qpu", 128);
    req.step = p.str("step", 64);
    req.duration_ns = p.i64("duration_ns", 1, i64_max / 4);
    req.needed_by_ns = p.i64("needed_by_ns", 1, i64_max / 2);
    req.urgency = static_cast<std::int32_t>(p.opt_i64("urgency", std::numeric_limits<std::int32_t>::min(),
                                                      std::numeric_limits<std::int32_t>::max())
                                                .value_or(0));
    const std::string key = p.str("idempotency_key", 128);
    if (key.empty()) {
        throw invalid_params("idempotency_key", "idempotency_key must not be empty");
    }
    const std::int64_t t = now();
    auto placed = _ledger.request_block(ctx.caller.tenant, req, key, t);
    if (!placed) {
        const tl::error& e = placed.err();
        if (e.reason == tl::reason::no_fit) {
            // What the service needs to decide: the earliest block there is,
            // and how far the calibration in force will have drifted by
            // needed_by.
            json earliest = nullptr;
            if (const auto c = _ledger.earliest_block(req.qpu, req.duration_ns, t)) {
                earliest = json{{"qpu", c->qpu},
                                {"start_ns", c->start_ns},
                                {"end_ns", c->end_ns},
                                {"calibration_id", c->calibration_id},
                                {"predicted_fidelity_at_start", c->predicted_fidelity}};
            }
            throw rpc_failure(e.reason, e.message,
                              json{{"cause", "needed_by"},
                                   {"qpu", req.qpu},
                                   {"needed_by_ns", req.needed_by_ns},
                                   {"earliest", std::move(earliest)},
                                   {"predicted_fidelity_at_needed_by",
                                    fidelity_json(_ledger.predicted_fidelity(req.qpu, req.needed_by_ns))}});
        }
        if (e.reason == tl::reason::overloaded) {
            throw rpc_failure(e.reason, e.message,
                              json{{"limit", _ledger.options().max_calibration_blocks},
                                   {"option", "timeline.max_calibration_blocks"}});
        }
        throw rpc_failure(e.reason, e.message);
    }
    json out = answer(*placed);
    json yielding = json::array();
    if (placed->state == tl::block_state::yielding) {
        for (const std::uint64_t id : _ledger.yielders(placed->id)) {
            yielding.push_back(id);
        }
    }
    out["yielding"] = std::move(yielding);
    return out;
}

json calibration_methods::cancel(const json& params, call_context& ctx) {
    check_commit_backlog();
    const params_reader p(params, {"block_id"});
    const auto id = static_cast<std::uint64_t>(p.i64("block_id", 1, i64_max));
    std::string tenant = ctx.caller.tenant;
    if (ctx.caller.roles.holds(role::admin)) {
        if (const tl::calibration_block* b = _ledger.find_block(id); b != nullptr) {
            tenant = b->tenant;
        }
    }
    auto b = _ledger.cancel_block(tenant, id, now());
    if (!b) {
        throw rpc_failure(b.err().reason, b.err().message);
    }
    return to_json(*b);
}

json calibration_methods::blocks(const json& params, call_context&) {
    const params_reader p(params, {"qpu"});
    const std::string qpu = p.opt_str("qpu", 128).value_or("");
    if (!qpu.empty()) {
        const auto names = _ledger.qpu_names();
        if (std::find(names.begin(), names.end(), qpu) == names.end()) {
            throw rpc_failure("unknown_qpu", fmt::format("qpu \"{}\" is not a QPU of this host", qpu));
        }
    }
    json out = json::array();
    for (const auto& b : _ledger.blocks(qpu)) {
        out.push_back(to_json(b));
    }
    return json{{"blocks", std::move(out)}};
}

}  // namespace

json to_json(const tl::calibration_block& b) {
    return json{{"block_id", b.id},
                {"qpu", b.qpu},
                {"tenant", b.tenant},
                {"step", b.step},
                {"state", std::string(tl::to_string(b.state))},
                {"reason", b.reason},
                {"start_ns", b.start_ns},
                {"end_ns", b.end_ns()},
                {"duration_ns", b.duration_ns},
                {"needed_by_ns", b.needed_by_ns},
                {"urgency", b.urgency},
                {"calibration_id", b.calibration_id},
                {"yield_deadline_ns", b.yield_deadline_ns},
                {"idempotency_key", b.idempotency_key},
                {"created_ns", b.created_ns},
                {"updated_ns", b.updated_ns}};
}

void register_calibration_methods(engine& rpc, tl::ledger& ledger, const timeline_options& opts) {
    auto methods = std::make_shared<calibration_methods>(ledger, opts);
    using json_method = json (calibration_methods::*)(const json&, call_context&);
    const auto bind = [methods](json_method fn) -> handler {
        return [methods, fn](const json& params, call_context& ctx) { return ((*methods).*fn)(params, ctx); };
    };
    constexpr bool acknowledged_when_durable = true;
    auto& reg = rpc.methods();
    reg.add({"calibration.request", role::calibration,
             "ask for a calibration block ending by needed_by_ns (placed around every committed job)",
             bind(&calibration_methods::request), acknowledged_when_durable});
    reg.add({"calibration.cancel", role::calibration, "give a live calibration block back",
             bind(&calibration_methods::cancel), acknowledged_when_durable});
    reg.add({"calibration.blocks", role::reader, "the calibration blocks held, by start",
             bind(&calibration_methods::blocks)});
}

}  // namespace qrt::rpc
