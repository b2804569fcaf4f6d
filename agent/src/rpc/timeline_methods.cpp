#include "qrt/rpc/timeline_methods.hpp"
#include "rtcore/clock.hpp"

#include <time.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <variant>

#include <fmt/format.h>

#include "qrt/log.hpp"
#include "qrt/proto/envelope.hpp"

namespace qrt::rpc {

namespace tl = qrt::timeline;

namespace {

constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::size_t max_qpus_in_request = 64;
constexpr std::size_t max_windows_in_update = 10'000;

[[noreturn]] void fail(const tl::error& e) {
    if (e.next_start_ns > 0) {
        throw rpc_failure(e.reason, e.message, json{{"next_start_ns", e.next_start_ns}});
    }
    throw rpc_failure(e.reason, e.message);
}

template <typename T>
T take(tl::result<T> r) {
    if (!r) {
        fail(r.err());
    }
    return std::move(r).value();
}

// The request fields, shared by query, reserve and one-shot submit.
constexpr std::array<std::string_view, 6> request_fields = {
    "duration_ns", "not_before_ns", "deadline_ns", "priority", "min_fidelity", "qpus"};

tl::request read_request(const params_reader& p) {
    tl::request r;
    r.duration_ns = p.i64("duration_ns", 1, i64_max / 4);
    r.not_before_ns = p.opt_i64("not_before_ns", 0, i64_max / 2).value_or(0);
    r.deadline_ns = p.opt_i64("deadline_ns", 0, i64_max / 2).value_or(0);
    r.priority = static_cast<std::int32_t>(
        p.opt_i64("priority", std::numeric_limits<std::int32_t>::min(),
                  std::numeric_limits<std::int32_t>::max())
            .value_or(0));
    r.min_fidelity = p.opt_number("min_fidelity", 0.0, 1.0).value_or(0.0);
    if (p.has("qpus")) {
        r.qpus = p.str_array("qpus", max_qpus_in_request, 128);
    }
    return r;
}

// block_id (slots.reserve, a one-shot jobs.submit): a job of the calibration
// service, inside its own calibration block.  Only a caller holding the
// calibration role places one there (qrtd(8), CALIBRATION BLOCKS).
std::uint64_t read_block_id(const params_reader& p, const call_context& ctx) {
    if (!p.has("block_id")) {
        return 0;
    }
    const auto id = static_cast<std::uint64_t>(p.i64("block_id", 1, i64_max));
    if (!ctx.caller.roles.holds(role::calibration) && !ctx.caller.roles.holds(role::admin)) {
        throw rpc_failure("permission_denied",
                          "block_id: only the calibration role places jobs into a calibration block",
                          json{{"field", "block_id"}});
    }
    return id;
}

tl::blob decode_payload(const params_reader& p, std::size_t max_bytes) {
    const std::string text = p.str("payload", (max_bytes + 2) / 3 * 4 + 4);
    auto raw = base64_decode_strict(text);
    if (!raw) {
        throw invalid_params("payload", "parameter 'payload' is not canonical standard base64 "
                                        "(A-Z a-z 0-9 + /, '=' padding, no whitespace)");
    }
    if (raw->size() > max_bytes) {
        throw rpc_failure("payload_too_large",
                          fmt::format("payload is {} bytes, at most {} accepted", raw->size(),
                                      max_bytes),
                          json{{"field", "payload"}, {"limit_bytes", max_bytes}});
    }
    std::vector<std::uint8_t> bytes(raw->size());
    if (!raw->empty()) {
        std::memcpy(bytes.data(), raw->data(), raw->size());
    }
    return tl::blob(std::move(bytes));
}

json deadline_json(std::int64_t d) { return d == tl::k_no_deadline_ns ? json(nullptr) : json(d); }

json window_json(const tl::calibration_window& w) {
    return json{{"calibration_id", w.calibration_id},
                {"valid_from_ns", w.valid_from_ns},
                {"valid_until_ns", w.valid_until_ns},
                {"f0", w.f0},
                {"tau_ns", w.tau_ns}};
}

tl::calibration_window read_window(const json& j, std::size_t index) {
    const std::string field = fmt::format("windows[{}]", index);
    if (!j.is_object()) {
        throw invalid_params(field, fmt::format("{} must be an object", field));
    }
    try {
        params_reader w(j, {"calibration_id", "valid_from_ns", "valid_until_ns", "f0", "tau_ns"});
        tl::calibration_window out;
        out.calibration_id = static_cast<std::uint64_t>(w.i64("calibration_id", 0, i64_max));
        out.valid_from_ns = w.i64("valid_from_ns", 0, i64_max / 2);
        out.valid_until_ns = w.i64("valid_until_ns", 0, i64_max / 2);
        out.f0 = w.opt_number("f0", 0.0, 1.0).value_or(1.0);
        out.tau_ns = w.opt_i64("tau_ns", 0, i64_max / 2).value_or(0);
        return out;
    } catch (const rpc_failure& f) {
        // Prefix the element so the client knows which window is wrong.
        const std::string inner = f.details().value("field", std::string());
        throw invalid_params(field + "." + inner, field + ": " + f.message());
    }
}

// The ledger-backed methods: one named handler per method, over the ledger
// they serve and the options they were registered with.
class ledger_methods {
public:
    // max_depth: the engine's (engine_limits), which bounds a payload that
    // is JSON as it bounds a request line.
    ledger_methods(tl::ledger& ledger, timeline_options opts, std::size_t max_depth)
        : _ledger(ledger), _opts(std::move(opts)), _max_depth(max_depth) {}

    tl::ledger& ledger() noexcept { return _ledger; }
    const timeline_options& options() const noexcept { return _opts; }
    const tenant_limits* limits() const noexcept { return _opts.limits.get(); }

    json qpus_list(const json& params, call_context&);
    json calibration_get(const json& params, call_context&);
    json calibration_update(const json& params, call_context&);
    void slots_query(const json& params, call_context& ctx, std::string& out);
    json slots_reserve(const json& params, call_context& ctx);
    json slots_heartbeat(const json& params, call_context& ctx);
    json slots_release(const json& params, call_context& ctx);
    json jobs_submit(const json& params, call_context& ctx);
    json jobs_status(const json& params, call_context& ctx);
    json jobs_result(const json& params, call_context& ctx);
    json jobs_cancel(const json& params, call_context& ctx);

private:
    json submit_into_held(const params_reader& p, call_context& ctx);
    json submit_one_shot(const params_reader& p, call_context& ctx);
    // qpus.list's "device" of one QPU (null when it states none).
    json device_of(std::string_view qpu) const;

    std::int64_t now() const { return _opts.now_ns ? _opts.now_ns() : rtcore::realtime_now_ns(); }

    // take() for the booking calls: an endpoint_down refusal carries, in
    // data, since when the endpoint is down, its last error, the remedy and
    // the earliest start that would be accepted.
    template <typename T>
    T take_booking(tl::result<T> r) const {
        if (!r) {
            const tl::error& e = r.err();
            if (e.reason == tl::reason::endpoint_down) {
                if (const auto* st = _ledger.endpoint_down(e.qpu); st != nullptr) {
                    json data = endpoint_json(*st, e.qpu);
                    data["not_before_ns"] = now() + _ledger.options().endpoint_down_horizon_ns;
                    throw rpc_failure(e.reason, e.message, std::move(data));
                }
            }
            fail(e);
        }
        return std::move(r).value();
    }
    static json endpoint_json(const tl::ledger::endpoint_state& st, std::string_view qpu) {
        return json{{"qpu", qpu}, {"since_ns", st.since_ns}, {"error", st.error}, {"remedy", st.remedy}};
    }
    // An accepted booking on a QPU whose endpoint is down (its start is past
    // the horizon) says so in its reply.
    json booked(const tl::reservation& r) const {
        json out = to_json(r);
        if (const auto* st = _ledger.endpoint_down(r.qpu); st != nullptr) {
            out["endpoint_down"] = endpoint_json(*st, r.qpu);
        }
        return out;
    }

    void check_priority(const call_context& ctx, const tl::request& req) const {
        if (_opts.limits) {
            _opts.limits->check_priority(ctx.caller, req.priority);
        }
    }
    // A new booking of `count` reservations (0: a payload for a held one).
    void check_booking(const call_context& ctx, std::string_view key, std::size_t count,
                       std::int64_t duration_ns, std::uint64_t payload_bytes) const {
        if (!_opts.limits || _ledger.has_idempotency_key(ctx.caller.tenant, key)) {
            return;
        }
        if (!ctx.caller.delegate.empty() && count > 0) {
            _opts.limits->check_delegated_tenants(
                ctx.caller, _ledger.tenants_with_prefix(ctx.caller.delegate + "/"),
                _ledger.usage_of(ctx.caller.tenant).reservations > 0);
        }
        _opts.limits->check_booking(ctx.caller, _ledger.usage_of(ctx.caller.tenant), count,
                                    duration_ns, payload_bytes);
    }

    // A new booking that may start within the near term: the caller's
    // share of it ([tenants] near_term_ns, max_near_term_ns).
    void check_near_term(const call_context& ctx, std::string_view key, std::size_t count,
                         const tl::request& req) const {
        const std::int64_t t = now();
        if (!_opts.limits || !_opts.limits->near_term_applies(ctx.caller, req.not_before_ns, t) ||
            _ledger.has_idempotency_key(ctx.caller.tenant, key)) {
            return;
        }
        const std::int64_t until = t + _opts.limits->policy().near_term_ns;
        _opts.limits->check_near_term(ctx.caller, _ledger.booked_within(ctx.caller.tenant, t, until),
                                      count, req.duration_ns, t);
    }

    // Backpressure of group commit: past timeline.commit_queue_max changes
    // waiting for their commit, a client change is refused at once (before
    // anything changes) with `unavailable`, data.cause "commit_backlog"; the
    // client retries (with the same idempotency key).  Reads and
    // slots.heartbeat go on.
    void check_commit_backlog() const {
        if (!_ledger.stopped().empty()) {
            throw rpc_failure("store_error",
                              fmt::format("ledger: {}; qrtd stops, retry once it is back",
                                          _ledger.stopped()));
        }
        if (!_ledger.accepting_changes()) {
            throw rpc_failure("unavailable",
                              fmt::format("ledger: {} changes are waiting for their commit "
                                          "(timeline.commit_queue_max {}); retry shortly",
                                          _ledger.commit_backlog(),
                                          _ledger.options().commit_queue_max),
                              json{{"cause", "commit_backlog"},
                                   {"limit", _ledger.options().commit_queue_max}});
        }
    }

    // The tenant to act as: the caller's, or for an admin the owner's.
    std::string tenant_for(const call_context& ctx, std::uint64_t id) const {
        if (ctx.caller.roles.holds(role::admin)) {
            if (const tl::reservation* r = _ledger.find(id); r != nullptr) {
                return r->tenant;
            }
        }
        return ctx.caller.tenant;
    }

    tl::ledger& _ledger;
    timeline_options _opts;
    std::size_t _max_depth;
};

std::uint64_t read_id(const params_reader& p, std::string_view name) {
    return static_cast<std::uint64_t>(p.i64(name, 1, i64_max));
}

// The job envelope of qrtd(8), "Job payloads", checked by the protocol's
// room (qrt::proto::check_envelope): its shape, that each program says it is
// OpenQASM 3, and (envelope_misfit) that its qubits and shots fit a QPU's
// [qpu.device].  A payload that is not a JSON object with "format" is opaque
// and passes unchecked.  A refusal names the field and, for a value of the
// wrong kind, its JSON type: never the value, which is the client's and may
// be up to dispatch.max_payload_bytes of anything.
constexpr std::uint64_t max_wire_shots = 1'000'000;

using proto::envelope_needs;

[[noreturn]] void bad_envelope(const std::string& field, const std::string& why) {
    throw rpc_failure("invalid_argument", fmt::format("payload: {}", why), json{{"field", field}});
}

// The payload as JSON, parsed once for the envelope and the shot count:
// nullopt (opaque) when it does not begin with '{' or is not JSON.  JSON
// that nests arrays and objects deeper than max_depth is refused before
// anything reads it: the parser keeps its own stack on the heap, but what
// reads a value afterwards (a comparison, a dump) recurses once a level, and
// a payload of dispatch.max_payload_bytes can nest half a million levels.
// Past the limit the callback keeps nothing, so the tree built is at most
// max_depth deep whatever the payload holds.
std::optional<json> payload_json(const tl::blob& payload, std::size_t max_depth) {
    if (payload.empty() || payload.front() != '{') {
        return std::nullopt;
    }
    bool too_deep = false;
    // depth: the containers around the event (0 for the payload itself), so
    // a container that starts at depth d is the (d + 1)th level.
    const json::parser_callback_t keep = [&too_deep, max_depth](int depth, json::parse_event_t event,
                                                                 json&) {
        if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
            static_cast<std::size_t>(depth) >= max_depth) {
            too_deep = true;
            return false;
        }
        return true;
    };
    json j = json::parse(payload.begin(), payload.end(), keep, false);
    if (j.is_discarded()) {
        return std::nullopt;
    }
    if (too_deep) {
        throw rpc_failure(std::string(reason::invalid_params),
                          fmt::format("parameter 'payload' is JSON that nests deeper than {} levels of arrays "
                                      "and objects, more than qrtd reads",
                                      max_depth),
                          json{{"field", "payload"}, {"limit", max_depth}});
    }
    return j;
}

std::optional<envelope_needs> read_envelope(const std::optional<json>& doc) {
    if (!doc || !doc->is_object() || !doc->contains("format")) {
        return std::nullopt;
    }
    auto checked = proto::check_envelope(*doc);
    if (const auto* e = std::get_if<proto::envelope_error>(&checked)) {
        bad_envelope(e->field, e->why);
    }
    return std::get<envelope_needs>(checked);
}

// The shot count a jobs.submit states, read once here so that it travels
// in the request to the ledger and the hand-over (which never reads the
// payload): "shots" in the params; else the envelope's; else, as before
// there was an envelope, the "shots" of a payload that is an opaque JSON
// object; else 0 (not stated: the hand-over sends its default, 1000).
std::uint32_t shots_of_request(const params_reader& p, const std::optional<json>& doc,
                               const std::optional<envelope_needs>& needs) {
    if (p.has("shots")) {
        const auto v = static_cast<std::uint64_t>(p.i64("shots", 1, static_cast<std::int64_t>(max_wire_shots)));
        if (needs && needs->shots != v) {
            throw invalid_params("shots", fmt::format("shots = {} but the payload's envelope says shots = {}", v,
                                                      needs->shots));
        }
        return static_cast<std::uint32_t>(v);
    }
    if (needs) {
        return static_cast<std::uint32_t>(std::min(needs->shots, max_wire_shots));
    }
    if (doc && doc->is_object()) {
        const auto it = doc->find("shots");
        if (it != doc->end() && it->is_number_unsigned()) {
            return static_cast<std::uint32_t>(std::min(it->get<std::uint64_t>(), max_wire_shots));
        }
    }
    return 0;
}

// Why the envelope does not fit qpu's device (qpus.list's "device"), or "".
std::string envelope_misfit(const envelope_needs& n, std::string_view qpu, const json& device,
                            std::string& field) {
    std::uint64_t max_shots = max_wire_shots;
    if (device.is_object()) {
        const std::uint64_t qubits = device.value("qubits", std::uint64_t{0});
        if (n.qubits > qubits) {
            field = "payload.circuits";
            return fmt::format("a circuit needs {} qubits; {} has {}", n.qubits, qpu, qubits);
        }
        max_shots = device.value("max_shots", max_wire_shots);
    }
    if (n.shots > max_shots) {
        field = "payload.shots";
        return fmt::format("shots = {} is more than {} takes ({})", n.shots, qpu, max_shots);
    }
    return {};
}

}  // namespace

json ledger_methods::device_of(std::string_view qpu) const {
    if (!_opts.qpu_details) {
        return nullptr;
    }
    json d = _opts.qpu_details(qpu);
    return d.is_object() && d.contains("device") ? d["device"] : json(nullptr);
}

json ledger_methods::qpus_list(const json& params, call_context&) {
    params_reader p(params, {});
    json out = json::array();
    const std::int64_t t = now();
    for (const auto& name : _ledger.qpu_names()) {
        json q{{"name", name}};
        // The window in force now and its predicted fidelity; null inside a
        // blackout (or before any window), which is how an SDK tells that the
        // QPU is calibrating.
        json current = nullptr;
        json fidelity = nullptr;
        if (auto windows = _ledger.calibration(name, t, t + 1)) {
            for (const auto& w : *windows) {
                if (w.contains(t)) {
                    current = window_json(w);
                    fidelity = w.predicted_fidelity(t);
                    break;
                }
            }
        }
        q["window"] = std::move(current);
        q["predicted_fidelity"] = std::move(fidelity);
        q["device"] = nullptr;
        // Its queue: committed jobs waiting for their start (QDMI's queue
        // length).
        q["queued_jobs"] = _ledger.queued_jobs(name);
        // The live calibration block in force, else the next (null: none),
        // and whether now lies in one (QDMI's CALIBRATION, the DRA taint).
        const auto block = _ledger.next_block(name, t);
        q["calibration_block"] = block ? to_json(*block) : json(nullptr);
        q["calibrating"] = block && block->start_ns <= t && t < block->end_ns();
        if (_opts.qpu_details) {
            json extra = _opts.qpu_details(name);
            if (extra.is_object()) {
                q.update(extra);
            }
        }
        out.push_back(std::move(q));
    }
    return json{{"qpus", std::move(out)},
                {"policy", std::string(_ledger.policy().name())}};
}

json ledger_methods::calibration_get(const json& params, call_context&) {
    params_reader p(params, {"qpu", "until_ns"});
    const std::string qpu = p.str("qpu", 128);
    // until_ns: only the windows starting before it, and the first starting
    // at or after it (what a caller looking up one time needs).
    auto windows = take(_ledger.calibration(qpu, now(), p.opt_i64("until_ns", 0, i64_max).value_or(i64_max)));
    json out = json::array();
    for (const auto& w : windows) {
        out.push_back(window_json(w));
    }
    return json{{"qpu", qpu}, {"windows", std::move(out)}};
}

json ledger_methods::calibration_update(const json& params, call_context& ctx) {
    check_commit_backlog();
    params_reader p(params, {"qpu", "windows", "block_id"});
    const std::string qpu = p.str("qpu", 128);
    const auto block_id = static_cast<std::uint64_t>(p.opt_i64("block_id", 1, i64_max).value_or(0));
    const json& jw = p.raw("windows");
    if (!jw.is_array()) {
        throw invalid_params("windows", "parameter 'windows' must be an array");
    }
    if (jw.size() > max_windows_in_update) {
        throw invalid_params("windows", fmt::format("at most {} windows per update",
                                                    max_windows_in_update));
    }
    std::vector<tl::calibration_window> windows;
    windows.reserve(jw.size());
    for (std::size_t i = 0; i < jw.size(); ++i) {
        windows.push_back(read_window(jw[i], i));
    }
    std::string tenant = ctx.caller.tenant;
    if (block_id != 0 && ctx.caller.roles.holds(role::admin)) {
        if (const tl::calibration_block* b = _ledger.find_block(block_id); b != nullptr) {
            tenant = b->tenant;
        }
    }
    auto report = take(_ledger.update_calibration(qpu, std::move(windows), now(), block_id, tenant));
    json out{{"qpu", qpu},
             {"windows", report.windows},
             {"replaced", report.replaced},
             {"displaced", report.displaced}};
    if (block_id != 0) {
        if (const tl::calibration_block* b = _ledger.find_block(block_id); b != nullptr) {
            out["block"] = to_json(*b);
        }
    }
    return out;
}

// slots.query is the hot read: its result is written straight out (no
// json tree built, then freed), members in nlohmann's sorted order and
// every scalar through dump_to, so the bytes are those the
// json tree {"candidates":[{qpu,start_ns,end_ns,calibration_id,
// calibration_age_ns,predicted_fidelity,window_until_ns,score}..],
// "next_window":window_json()+qpu, "why_none"} serialised to.
void ledger_methods::slots_query(const json& params, call_context& ctx, std::string& out) {
    const params_reader all(params, {"duration_ns", "not_before_ns", "deadline_ns",
                                     "priority", "min_fidelity", "qpus",
                                     "max_candidates", "gang_size"});
    tl::request req = read_request(all);
    check_priority(ctx, req);
    req.max_candidates =
        static_cast<std::size_t>(all.opt_i64("max_candidates", 1, 64).value_or(4));
    req.gang_size = static_cast<std::size_t>(all.opt_i64("gang_size", 1, 64).value_or(1));
    const auto q = take(_ledger.query(req, now()));
    const auto put = [&](const auto& v) { append_json_value(out, v); };
    out += R"({"candidates":[)";
    bool first = true;
    for (const auto& c : q.candidates) {
        out += first ? R"({"calibration_age_ns":)" : R"(,{"calibration_age_ns":)";
        first = false;
        put(c.calibration_age_ns);
        out += R"(,"calibration_id":)";
        put(c.calibration_id);
        out += R"(,"end_ns":)";
        put(c.end_ns);
        out += R"(,"predicted_fidelity":)";
        put(c.predicted_fidelity);
        out += R"(,"qpu":)";
        put(c.qpu);
        out += R"(,"score":)";
        put(c.score);
        out += R"(,"start_ns":)";
        put(c.start_ns);
        out += R"(,"window_until_ns":)";
        put(c.window_until_ns);
        out += '}';
    }
    out += ']';
    if (q.next) {
        const auto& w = q.next->window;
        out += R"(,"next_window":{"calibration_id":)";
        put(w.calibration_id);
        out += R"(,"f0":)";
        put(w.f0);
        out += R"(,"qpu":)";
        put(q.next->qpu);
        out += R"(,"tau_ns":)";
        put(w.tau_ns);
        out += R"(,"valid_from_ns":)";
        put(w.valid_from_ns);
        out += R"(,"valid_until_ns":)";
        put(w.valid_until_ns);
        out += '}';
    }
    if (!q.why_none.empty()) {
        out += R"(,"why_none":)";
        put(q.why_none);
    }
    out += '}';
}

json ledger_methods::slots_reserve(const json& params, call_context& ctx) {
    check_commit_backlog();
    const params_reader p(params, {"duration_ns", "not_before_ns", "deadline_ns",
                                   "priority", "min_fidelity", "qpus",
                                   "idempotency_key", "lease_ns", "gang_size", "block_id"});
    tl::request req = read_request(p);
    req.block_id = read_block_id(p, ctx);
    const std::string key = p.str("idempotency_key", 128);
    if (key.empty()) {
        throw invalid_params("idempotency_key", "idempotency_key must not be empty");
    }
    const std::int64_t lease = p.opt_i64("lease_ns", 0, i64_max / 4).value_or(0);
    const auto gang = p.opt_i64("gang_size", 1, 64).value_or(1);
    check_priority(ctx, req);
    check_booking(ctx, key, static_cast<std::size_t>(gang), req.duration_ns, 0);
    check_near_term(ctx, key, static_cast<std::size_t>(gang), req);
    if (gang > 1) {
        auto members = take_booking(_ledger.reserve_gang(ctx.caller.tenant, req,
                                                       static_cast<std::size_t>(gang), key,
                                                       lease, now()));
        json out = json::array();
        for (const auto& member : members) {
            out.push_back(booked(member));
        }
        return json{{"gang", std::move(out)}};
    }
    return booked(take_booking(_ledger.reserve(ctx.caller.tenant, req, key, lease, now())));
}

json ledger_methods::slots_heartbeat(const json& params, call_context& ctx) {
    // Not refused under a commit backlog: housekeeping keeps expiring
    // leases meanwhile, so a refused heartbeat would lose a reservation the
    // client holds.  A renewal is one small change per held reservation,
    // bounded by the reservations quota, and takes effect in memory at once.
    const params_reader p(params, {"reservation_id", "fencing_token"});
    const auto id = read_id(p, "reservation_id");
    const auto token = static_cast<std::uint64_t>(p.i64("fencing_token", 0, i64_max));
    return to_json(
        take(_ledger.heartbeat(tenant_for(ctx, id), id, token, now())));
}

json ledger_methods::slots_release(const json& params, call_context& ctx) {
    check_commit_backlog();
    const params_reader p(params, {"reservation_id", "fencing_token"});
    const auto id = read_id(p, "reservation_id");
    const auto token = static_cast<std::uint64_t>(p.i64("fencing_token", 0, i64_max));
    return to_json(
        take(_ledger.release(tenant_for(ctx, id), id, token, now())));
}

json ledger_methods::jobs_submit(const json& params, call_context& ctx) {
    check_commit_backlog();
    const params_reader p(params, {"reservation_id", "fencing_token", "payload",
                                   "duration_ns", "not_before_ns", "deadline_ns",
                                   "priority", "min_fidelity", "qpus",
                                   "idempotency_key", "shots", "block_id"});
    return p.has("reservation_id") ? submit_into_held(p, ctx) : submit_one_shot(p, ctx);
}

// jobs.submit {reservation_id, fencing_token, payload}: held -> committed.
json ledger_methods::submit_into_held(const params_reader& p, call_context& ctx) {
    for (const auto f : request_fields) {
        if (p.has(f)) {
            throw invalid_params(
                f, fmt::format("'{}' is not accepted with reservation_id (the "
                               "reservation fixes the slot)",
                               f));
        }
    }
    if (p.has("idempotency_key")) {
        throw invalid_params("idempotency_key",
                             "'idempotency_key' is not accepted with "
                             "reservation_id (the fencing token guards retries)");
    }
    if (p.has("block_id")) {
        throw invalid_params("block_id", "'block_id' is not accepted with reservation_id (the "
                                         "reservation fixes the slot)");
    }
    const auto id = read_id(p, "reservation_id");
    const auto token =
        static_cast<std::uint64_t>(p.i64("fencing_token", 0, i64_max));
    tl::blob payload = decode_payload(p, _opts.max_payload_bytes);
    const std::optional<json> doc = payload_json(payload, _max_depth);
    const auto needs = read_envelope(doc);
    const std::uint32_t shots = shots_of_request(p, doc, needs);
    if (needs) {
        const tl::reservation r = take(_ledger.status(tenant_for(ctx, id), id));
        std::string field;
        const std::string why = envelope_misfit(*needs, r.qpu, device_of(r.qpu), field);
        if (!why.empty()) {
            bad_envelope(field, why);
        }
    }
    check_booking(ctx, {}, 0, 0, payload.size());
    return booked(take_booking(_ledger.commit(tenant_for(ctx, id), id, token,
                                              std::move(payload), now(), shots)));
}

// jobs.submit with request fields + idempotency_key + payload: place and
// commit in one step.
json ledger_methods::submit_one_shot(const params_reader& p, call_context& ctx) {
    if (p.has("fencing_token")) {
        throw invalid_params("fencing_token",
                             "'fencing_token' needs 'reservation_id'");
    }
    tl::request req = read_request(p);
    req.block_id = read_block_id(p, ctx);
    const std::string key = p.str("idempotency_key", 128);
    if (key.empty()) {
        throw invalid_params("idempotency_key", "idempotency_key must not be empty");
    }
    tl::blob payload = decode_payload(p, _opts.max_payload_bytes);
    const std::optional<json> doc = payload_json(payload, _max_depth);
    const auto needs = read_envelope(doc);
    req.shots = shots_of_request(p, doc, needs);
    if (needs) {
        // Place only onto the QPUs the envelope fits; none: refuse, naming
        // the first candidate's misfit.
        std::vector<std::string> fit;
        std::string why;
        std::string field;
        for (const auto& q : req.qpus.empty() ? _ledger.qpu_names() : req.qpus) {
            std::string f;
            const std::string w = envelope_misfit(*needs, q, device_of(q), f);
            if (w.empty()) {
                fit.push_back(q);
            } else if (why.empty()) {
                why = w;
                field = f;
            }
        }
        if (fit.empty() && !why.empty()) {
            bad_envelope(field, why);
        }
        if (!fit.empty()) {
            req.qpus = std::move(fit);
        }
    }
    check_priority(ctx, req);
    check_booking(ctx, key, 1, req.duration_ns, payload.size());
    check_near_term(ctx, key, 1, req);
    return booked(take_booking(
        _ledger.submit(ctx.caller.tenant, req, key, std::move(payload), now())));
}

json ledger_methods::jobs_status(const json& params, call_context& ctx) {
    const params_reader p(params, {"job_id"});
    const auto id = read_id(p, "job_id");
    return to_json(take(_ledger.status(tenant_for(ctx, id), id)));
}

json ledger_methods::jobs_result(const json& params, call_context& ctx) {
    const params_reader p(params, {"job_id"});
    const auto id = read_id(p, "job_id");
    auto finished = take(_ledger.job_result_of(tenant_for(ctx, id), id));
    const std::string_view bytes(reinterpret_cast<const char*>(finished.result.data()),
                                 finished.result.size());
    return json{{"job_id", finished.id},
                {"state", std::string(tl::to_string(finished.state))},
                {"result", base64_encode(bytes)},
                {"result_bytes", finished.result.size()},
                {"reason", finished.reason},
                {"sent_ns", finished.sent_ns},
                {"updated_ns", finished.updated_ns}};
}

// jobs.cancel {job_id[, fencing_token]}: with the token, one that is not the
// job's is refused (bad_fencing_token), the caller's admin role included:
// spank_qrt cancels with it, so it never cancels a job it did not reserve.
json ledger_methods::jobs_cancel(const json& params, call_context& ctx) {
    check_commit_backlog();
    const params_reader p(params, {"job_id", "fencing_token"});
    const auto id = read_id(p, "job_id");
    std::optional<std::uint64_t> token;
    if (p.has("fencing_token")) {
        token = static_cast<std::uint64_t>(p.i64("fencing_token", 0, i64_max));
    }
    return to_json(take(_ledger.cancel(tenant_for(ctx, id), id, now(), token)));
}

rpc_failure late_commit_refusal(const tl::late_job& j) {
    return rpc_failure("unavailable", "ledger: " + j.message,
                       json{{"cause", "commit_late"},
                            {"job_id", j.id},
                            {"start_ns", j.start_ns},
                            {"next_start_ns", j.next_start_ns}});
}

json to_json(const tl::reservation& r) {
    return json{{"reservation_id", r.id},
                {"job_id", r.id},
                {"tenant", r.tenant},
                {"qpu", r.qpu},
                {"state", std::string(tl::to_string(r.state))},
                {"reason", r.reason},
                {"start_ns", r.start_ns},
                {"end_ns", r.end_ns()},
                {"duration_ns", r.duration_ns},
                {"not_before_ns", r.not_before_ns},
                {"deadline_ns", deadline_json(r.deadline_ns)},
                {"priority", r.priority},
                {"min_fidelity", r.min_fidelity},
                {"calibration_id", r.calibration_id},
                {"shots", r.shots},  // as the request stated it; 0: not stated (1000 are sent)
                {"idempotency_key", r.idempotency_key},
                {"lease_ns", r.lease_ns},
                {"lease_expires_ns", r.lease_expires_ns},
                {"fencing_token", r.fencing_token},
                {"gang_id", r.gang_id},
                {"payload_bytes", r.payload.size()},
                {"has_result", !r.result.empty()},
                {"sent_ns", r.sent_ns},
                {"created_ns", r.created_ns},
                {"updated_ns", r.updated_ns},
                {"block_id", r.block_id}};  // the calibration block it runs in (0: none)
}

std::vector<event> to_rpc_events(const std::vector<tl::event>& evs) {
    std::vector<event> out;
    out.reserve(evs.size());
    for (const auto& ev : evs) {
        event pushed;
        if (ev.block && ev.type != tl::event_type::yield_requested) {
            // A calibration block placed, cleared, started or ended: every
            // subscriber, as calibration.changed.
            pushed.type = ev.type == tl::event_type::calibration_scheduled ? proto::event::calibration_scheduled
                          : ev.type == tl::event_type::calibration_started ? proto::event::calibration_started
                                                                            : proto::event::calibration_ended;
            pushed.data = json{{"qpu", ev.qpu},
                               {"state", std::string(tl::to_string(ev.block->state))},
                               {"reason", ev.reason},
                               {"time_ns", ev.time_ns},
                               {"ledger_event", ev.type},
                               {"block", to_json(*ev.block)}};
            out.push_back(std::move(pushed));
            continue;
        }
        if (ev.type == tl::event_type::yield_requested) {
            pushed.type = proto::event::reservation_yield_requested;
            pushed.tenant = ev.tenant;
            pushed.data = json{{"qpu", ev.qpu},
                               {"state", std::string(tl::to_string(ev.state))},
                               {"reason", ev.reason},
                               {"time_ns", ev.time_ns},
                               {"ledger_event", ev.type},
                               {"reservation_id", ev.reservation_id},
                               {"job_id", ev.reservation_id},
                               {"start_ns", ev.start_ns},
                               {"block", ev.block ? to_json(*ev.block) : json(nullptr)},
                               {"deadline_ns", ev.deadline_ns},
                               {"free_start_ns", ev.free_start_ns},
                               {"at_deadline", ev.at_deadline}};
            out.push_back(std::move(pushed));
            continue;
        }
        if (ev.type == tl::event_type::calibration) {
            pushed.type = "calibration.changed";
        } else if (ev.type == tl::event_type::endpoint_down || ev.type == tl::event_type::endpoint_up) {
            pushed.type = "qpu." + ev.type;  // every subscriber: like calibration, no tenant
        } else if (ev.type == tl::event_type::dispatched) {
            pushed.type = "job.dispatched";
            pushed.tenant = ev.tenant;
        } else if (ev.type == tl::event_type::completed || ev.type == tl::event_type::failed ||
                   ev.type == tl::event_type::missed || ev.type == tl::event_type::sent) {
            pushed.type = "job.finished";
            pushed.tenant = ev.tenant;
        } else {
            pushed.type = "reservation." + ev.type;
            pushed.tenant = ev.tenant;
        }
        pushed.data = json{{"qpu", ev.qpu},
                      {"state", std::string(tl::to_string(ev.state))},
                      {"reason", ev.reason},
                      {"time_ns", ev.time_ns},
                      {"ledger_event", ev.type}};
        if (ev.reservation_id != 0) {
            pushed.data["reservation_id"] = ev.reservation_id;
            pushed.data["job_id"] = ev.reservation_id;
            pushed.data["start_ns"] = ev.start_ns;
        }
        out.push_back(std::move(pushed));
    }
    return out;
}

void ledger_housekeeping(engine& rpc, tl::ledger& ledger, std::int64_t now_ns,
                         std::int64_t missed_tolerance_ns) {
    if (auto expired = ledger.expire_leases(now_ns); !expired) {
        log::warn("rpc", "expire_leases: {} ({})", expired.err().message, expired.err().reason);
    }
    if (auto missed = ledger.mark_missed(now_ns, missed_tolerance_ns); !missed) {
        log::warn("rpc", "mark_missed: {} ({})", missed.err().message, missed.err().reason);
    }
    if (auto settled = ledger.settle_blocks(now_ns); !settled) {
        log::warn("rpc", "settle_blocks: {} ({})", settled.err().message, settled.err().reason);
    }
    rpc.drain_event_sources();
}

rtcore::result<event_loop::timer_id> install_housekeeping(event_loop& loop, engine& rpc,
                                                          tl::ledger& ledger,
                                                          std::chrono::milliseconds period,
                                                          std::function<std::int64_t()> now_ns) {
    return loop.add_timer(period, period, [&rpc, &ledger, clock = std::move(now_ns)] {
        ledger_housekeeping(rpc, ledger, clock ? clock() : rtcore::realtime_now_ns());
    });
}

// tenants.delegates: a call with on_behalf_of=NAME from a delegate runs as
// tenant "DELEGATE/NAME", without admin (tenant_limits::delegated); the
// method sees its params without on_behalf_of.
template <class Call>
auto on_behalf_of(const ledger_methods& m, const json& params, call_context& ctx, Call&& call) {
    const auto it = params.is_object() ? params.find("on_behalf_of") : params.end();
    if (!params.is_object() || it == params.end()) {
        return call(params, ctx);
    }
    if (!it->is_string()) {
        throw invalid_params("on_behalf_of", "parameter 'on_behalf_of' must be a string");
    }
    if (m.limits() == nullptr) {
        throw rpc_failure("permission_denied", "on_behalf_of: this daemon has no tenants.delegates",
                          json{{"field", "on_behalf_of"}});
    }
    session acting = m.limits()->delegated(ctx.caller, it->get_ref<const std::string&>());
    json rest = params;
    rest.erase("on_behalf_of");
    call_context inner{acting};
    return call(rest, inner);
}

// The method table: name, role, summary, handler.
void register_timeline_methods(engine& rpc, tl::ledger& ledger, timeline_options opts) {
    auto on_calibration = opts.on_calibration;
    auto methods = std::make_shared<ledger_methods>(ledger, std::move(opts), rpc.limits().max_depth);
    using json_method = json (ledger_methods::*)(const json&, call_context&);
    using raw_method = void (ledger_methods::*)(const json&, call_context&, std::string&);
    const auto bind = [methods](json_method fn) -> handler {
        return [methods, fn](const json& params, call_context& ctx) {
            return ((*methods).*fn)(params, ctx);
        };
    };
    const auto raw = [methods](raw_method fn) -> raw_handler {
        return [methods, fn](const json& params, call_context& ctx, std::string& out) {
            ((*methods).*fn)(params, ctx, out);
        };
    };
    // The methods a delegate may call on_behalf_of a tenant.
    const auto delegable = [methods](json_method fn) -> handler {
        return [methods, fn](const json& params, call_context& ctx) {
            return on_behalf_of(*methods, params, ctx, [&](const json& p, call_context& c) {
                return ((*methods).*fn)(p, c);
            });
        };
    };
    const auto delegable_raw = [methods](raw_method fn) -> raw_handler {
        return [methods, fn](const json& params, call_context& ctx, std::string& out) {
            on_behalf_of(*methods, params, ctx, [&](const json& p, call_context& c) {
                ((*methods).*fn)(p, c, out);
            });
        };
    };
    auto& reg = rpc.methods();
    // Changes are acknowledged once durable (group commit, ledger.hpp); the
    // reads are answered from memory at once.
    constexpr bool acknowledged_when_durable = true;
    rpc.set_commit_tracker([&ledger] { return ledger.latest_seq(); },
                           [&ledger] { return ledger.durable_seq(); });

    rpc.add_event_source([methods, on_calibration = std::move(on_calibration)] {
        auto evs = methods->ledger().drain_events();
        if (on_calibration) {
            for (const auto& ev : evs) {
                if (ev.type == tl::event_type::calibration) {
                    on_calibration(ev.qpu);
                }
            }
        }
        return to_rpc_events(evs);
    });

    reg.add({"qpus.list", role::reader,
             "the QPUs of this host",
             bind(&ledger_methods::qpus_list)});
    reg.add({"calibration.get", role::reader,
             "the calibration windows of a QPU from now on",
             bind(&ledger_methods::calibration_get)});
    reg.add({"calibration.update", role::calibration,
             "replace a pushed QPU's windows from now on (reservations are re-placed or displaced)",
             bind(&ledger_methods::calibration_update), acknowledged_when_durable});
    register_calibration_methods(rpc, ledger, methods->options());
    reg.add({"slots.query", role::reader,
             "candidate slots for a request, or the next window when none fits", {}},
            delegable_raw(&ledger_methods::slots_query));
    reg.add({"slots.reserve", role::scheduler,
             "hold a slot under a lease (idempotency key, fencing token)",
             delegable(&ledger_methods::slots_reserve), acknowledged_when_durable});
    reg.add({"slots.heartbeat", role::scheduler,
             "extend a held reservation's lease",
             delegable(&ledger_methods::slots_heartbeat), acknowledged_when_durable});
    reg.add({"slots.release", role::scheduler,
             "give a held reservation back",
             delegable(&ledger_methods::slots_release), acknowledged_when_durable});
    reg.add({"jobs.submit", role::scheduler,
             "commit a payload into a held reservation, or place and commit in one step",
             delegable(&ledger_methods::jobs_submit), acknowledged_when_durable});
    // A read: a reader may see its own tenant's jobs (tenant_for: only an
    // admin sees another's).
    reg.add({"jobs.status", role::reader,
             "a job's (reservation's) state",
             delegable(&ledger_methods::jobs_status)});
    reg.add({"jobs.result", role::scheduler,
             "a finished job's result (base64)",
             delegable(&ledger_methods::jobs_result)});
    reg.add({"jobs.cancel", role::scheduler,
             "cancel a committed job before dispatch",
             delegable(&ledger_methods::jobs_cancel), acknowledged_when_durable});
}

}  // namespace qrt::rpc
