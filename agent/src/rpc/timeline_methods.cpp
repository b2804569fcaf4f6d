#include "qrt/rpc/timeline_methods.hpp"

#include <time.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "qrt/log.hpp"

namespace qrt::rpc {

namespace tl = qrt::timeline;

namespace {

constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::size_t max_qpus_in_request = 64;
constexpr std::size_t max_windows_in_update = 10'000;

std::int64_t realtime_ns() noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

[[noreturn]] void fail(const tl::error& e) { throw rpc_failure(e.reason, e.message); }

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

struct binding {
    tl::ledger* ledger;
    timeline_options opts;

    std::int64_t now() const { return opts.now_ns ? opts.now_ns() : realtime_ns(); }

    void check_priority(const call_context& ctx, const tl::request& req) const {
        if (opts.limits) {
            opts.limits->check_priority(ctx.caller, req.priority);
        }
    }
    // A new booking of `count` reservations (0: a payload for a held one).
    void check_booking(const call_context& ctx, std::string_view key, std::size_t count,
                       std::int64_t duration_ns, std::uint64_t payload_bytes) const {
        if (!opts.limits || ledger->has_idempotency_key(ctx.caller.tenant, key)) {
            return;
        }
        opts.limits->check_booking(ctx.caller, ledger->usage_of(ctx.caller.tenant), count,
                                   duration_ns, payload_bytes);
    }

    // The tenant to act as: the caller's, or for an admin the owner's.
    std::string tenant_for(const call_context& ctx, std::uint64_t id) const {
        if (ctx.caller.roles.holds(role::admin)) {
            if (const tl::reservation* r = ledger->find(id); r != nullptr) {
                return r->tenant;
            }
        }
        return ctx.caller.tenant;
    }
};

std::uint64_t read_id(const params_reader& p, std::string_view name) {
    return static_cast<std::uint64_t>(p.i64(name, 1, i64_max));
}

}  // namespace

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
                {"idempotency_key", r.idempotency_key},
                {"lease_ns", r.lease_ns},
                {"lease_expires_ns", r.lease_expires_ns},
                {"fencing_token", r.fencing_token},
                {"gang_id", r.gang_id},
                {"payload_bytes", r.payload.size()},
                {"has_result", !r.result.empty()},
                {"sent_ns", r.sent_ns},
                {"created_ns", r.created_ns},
                {"updated_ns", r.updated_ns}};
}

std::vector<event> to_rpc_events(const std::vector<tl::event>& evs) {
    std::vector<event> out;
    out.reserve(evs.size());
    for (const auto& e : evs) {
        event r;
        if (e.type == tl::event_type::calibration) {
            r.type = "calibration.changed";
        } else if (e.type == tl::event_type::dispatched) {
            r.type = "job.dispatched";
            r.tenant = e.tenant;
        } else if (e.type == tl::event_type::completed || e.type == tl::event_type::failed ||
                   e.type == tl::event_type::missed || e.type == tl::event_type::sent) {
            r.type = "job.finished";
            r.tenant = e.tenant;
        } else {
            r.type = "reservation." + e.type;
            r.tenant = e.tenant;
        }
        r.data = json{{"qpu", e.qpu},
                      {"state", std::string(tl::to_string(e.state))},
                      {"reason", e.reason},
                      {"time_ns", e.time_ns},
                      {"ledger_event", e.type}};
        if (e.reservation_id != 0) {
            r.data["reservation_id"] = e.reservation_id;
            r.data["job_id"] = e.reservation_id;
            r.data["start_ns"] = e.start_ns;
        }
        out.push_back(std::move(r));
    }
    return out;
}

void ledger_housekeeping(engine& e, tl::ledger& l, std::int64_t now_ns,
                         std::int64_t missed_tolerance_ns) {
    if (auto r = l.expire_leases(now_ns); !r) {
        log::warn("rpc", "expire_leases: {} ({})", r.err().message, r.err().reason);
    }
    if (auto r = l.mark_missed(now_ns, missed_tolerance_ns); !r) {
        log::warn("rpc", "mark_missed: {} ({})", r.err().message, r.err().reason);
    }
    e.drain_event_sources();
}

rtcore::result<event_loop::timer_id> install_housekeeping(event_loop& loop, engine& e,
                                                          tl::ledger& l,
                                                          std::chrono::milliseconds period,
                                                          std::function<std::int64_t()> now_ns) {
    return loop.add_timer(period, period, [&e, &l, clock = std::move(now_ns)] {
        ledger_housekeeping(e, l, clock ? clock() : realtime_ns());
    });
}

void register_timeline_methods(engine& e, tl::ledger& l, timeline_options opts) {
    auto b = std::make_shared<binding>(binding{&l, std::move(opts)});
    auto& reg = e.methods();

    e.add_event_source([b] { return to_rpc_events(b->ledger->drain_events()); });

    reg.add({"qpus.list", role::reader, "the QPUs of this host",
             [b](const json& params, call_context&) {
                 params_reader p(params, {});
                 json out = json::array();
                 for (const auto& name : b->ledger->qpu_names()) {
                     json q{{"name", name}};
                     if (b->opts.qpu_details) {
                         json extra = b->opts.qpu_details(name);
                         if (extra.is_object()) {
                             q.update(extra);
                         }
                     }
                     out.push_back(std::move(q));
                 }
                 return json{{"qpus", std::move(out)},
                             {"policy", std::string(b->ledger->policy().name())}};
             }});

    reg.add({"calibration.get", role::reader, "the calibration windows of a QPU from now on",
             [b](const json& params, call_context&) {
                 params_reader p(params, {"qpu"});
                 const std::string qpu = p.str("qpu", 128);
                 auto windows = take(b->ledger->calibration(qpu, b->now()));
                 json out = json::array();
                 for (const auto& w : windows) {
                     out.push_back(window_json(w));
                 }
                 return json{{"qpu", qpu}, {"windows", std::move(out)}};
             }});

    reg.add({"calibration.update", role::calibration,
             "replace a pushed QPU's windows from now on (reservations are re-placed or displaced)",
             [b](const json& params, call_context&) {
                 params_reader p(params, {"qpu", "windows"});
                 const std::string qpu = p.str("qpu", 128);
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
                 auto rep = take(b->ledger->update_calibration(qpu, std::move(windows), b->now()));
                 return json{{"qpu", qpu},
                             {"windows", rep.windows},
                             {"replaced", rep.replaced},
                             {"displaced", rep.displaced}};
             }});

    // slots.query is the hot read: its result is written straight out (no
    // json tree built, then freed), members in nlohmann's sorted order and
    // every scalar through nlohmann's serializer, so the bytes are those the
    // json tree {"candidates":[{qpu,start_ns,end_ns,calibration_id,
    // calibration_age_ns,predicted_fidelity,window_until_ns,score}..],
    // "next_window":window_json()+qpu, "why_none"} serialised to.
    reg.add({"slots.query", role::reader,
             "candidate slots for a request, or the next window when none fits", {}},
            [b](const json& params, call_context& ctx, std::string& out) {
                const params_reader all(params, {"duration_ns", "not_before_ns", "deadline_ns",
                                                 "priority", "min_fidelity", "qpus",
                                                 "max_candidates", "gang_size"});
                tl::request req = read_request(all);
                b->check_priority(ctx, req);
                req.max_candidates =
                    static_cast<std::size_t>(all.opt_i64("max_candidates", 1, 64).value_or(4));
                req.gang_size = static_cast<std::size_t>(all.opt_i64("gang_size", 1, 64).value_or(1));
                const auto q = take(b->ledger->query(req, b->now()));
                nlohmann::detail::serializer<json> ser(
                    nlohmann::detail::output_adapter<char, std::string>(out), ' ',
                    json::error_handler_t::replace);
                const auto put = [&](const json& v) { ser.dump(v, false, false, 0); };
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
            });

    reg.add({"slots.reserve", role::scheduler,
             "hold a slot under a lease (idempotency key, fencing token)",
             [b](const json& params, call_context& ctx) {
                 const params_reader p(params, {"duration_ns", "not_before_ns", "deadline_ns",
                                                "priority", "min_fidelity", "qpus",
                                                "idempotency_key", "lease_ns", "gang_size"});
                 const tl::request req = read_request(p);
                 const std::string key = p.str("idempotency_key", 128);
                 if (key.empty()) {
                     throw invalid_params("idempotency_key", "idempotency_key must not be empty");
                 }
                 const std::int64_t lease = p.opt_i64("lease_ns", 0, i64_max / 4).value_or(0);
                 const auto gang = p.opt_i64("gang_size", 1, 64).value_or(1);
                 b->check_priority(ctx, req);
                 b->check_booking(ctx, key, static_cast<std::size_t>(gang), req.duration_ns, 0);
                 if (gang > 1) {
                     auto rs = take(b->ledger->reserve_gang(ctx.caller.tenant, req,
                                                            static_cast<std::size_t>(gang), key,
                                                            lease, b->now()));
                     json out = json::array();
                     for (const auto& r : rs) {
                         out.push_back(to_json(r));
                     }
                     return json{{"gang", std::move(out)}};
                 }
                 return to_json(take(b->ledger->reserve(ctx.caller.tenant, req, key, lease, b->now())));
             }});

    reg.add({"slots.heartbeat", role::scheduler, "extend a held reservation's lease",
             [b](const json& params, call_context& ctx) {
                 const params_reader p(params, {"reservation_id", "fencing_token"});
                 const auto id = read_id(p, "reservation_id");
                 const auto token = static_cast<std::uint64_t>(p.i64("fencing_token", 0, i64_max));
                 return to_json(
                     take(b->ledger->heartbeat(b->tenant_for(ctx, id), id, token, b->now())));
             }});

    reg.add({"slots.release", role::scheduler, "give a held reservation back",
             [b](const json& params, call_context& ctx) {
                 const params_reader p(params, {"reservation_id", "fencing_token"});
                 const auto id = read_id(p, "reservation_id");
                 const auto token = static_cast<std::uint64_t>(p.i64("fencing_token", 0, i64_max));
                 return to_json(
                     take(b->ledger->release(b->tenant_for(ctx, id), id, token, b->now())));
             }});

    reg.add({"jobs.submit", role::scheduler,
             "commit a payload into a held reservation, or place and commit in one step",
             [b](const json& params, call_context& ctx) {
                 const params_reader p(params, {"reservation_id", "fencing_token", "payload",
                                                "duration_ns", "not_before_ns", "deadline_ns",
                                                "priority", "min_fidelity", "qpus",
                                                "idempotency_key"});
                 if (p.has("reservation_id")) {
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
                     const auto id = read_id(p, "reservation_id");
                     const auto token =
                         static_cast<std::uint64_t>(p.i64("fencing_token", 0, i64_max));
                     tl::blob payload = decode_payload(p, b->opts.max_payload_bytes);
                     b->check_booking(ctx, {}, 0, 0, payload.size());
                     return to_json(take(b->ledger->commit(b->tenant_for(ctx, id), id, token,
                                                           std::move(payload), b->now())));
                 }
                 if (p.has("fencing_token")) {
                     throw invalid_params("fencing_token",
                                          "'fencing_token' needs 'reservation_id'");
                 }
                 const tl::request req = read_request(p);
                 const std::string key = p.str("idempotency_key", 128);
                 if (key.empty()) {
                     throw invalid_params("idempotency_key", "idempotency_key must not be empty");
                 }
                 tl::blob payload = decode_payload(p, b->opts.max_payload_bytes);
                 b->check_priority(ctx, req);
                 b->check_booking(ctx, key, 1, req.duration_ns, payload.size());
                 return to_json(take(
                     b->ledger->submit(ctx.caller.tenant, req, key, std::move(payload), b->now())));
             }});

    reg.add({"jobs.status", role::scheduler, "a job's (reservation's) state",
             [b](const json& params, call_context& ctx) {
                 const params_reader p(params, {"job_id"});
                 const auto id = read_id(p, "job_id");
                 return to_json(take(b->ledger->status(b->tenant_for(ctx, id), id)));
             }});

    reg.add({"jobs.result", role::scheduler, "a finished job's result (base64)",
             [b](const json& params, call_context& ctx) {
                 const params_reader p(params, {"job_id"});
                 const auto id = read_id(p, "job_id");
                 auto r = take(b->ledger->job_result_of(b->tenant_for(ctx, id), id));
                 const std::string_view bytes(reinterpret_cast<const char*>(r.result.data()),
                                              r.result.size());
                 return json{{"job_id", r.id},
                             {"state", std::string(tl::to_string(r.state))},
                             {"result", base64_encode(bytes)},
                             {"result_bytes", r.result.size()},
                             {"reason", r.reason},
                             {"sent_ns", r.sent_ns},
                             {"updated_ns", r.updated_ns}};
             }});

    reg.add({"jobs.cancel", role::scheduler, "cancel a committed job before dispatch",
             [b](const json& params, call_context& ctx) {
                 const params_reader p(params, {"job_id"});
                 const auto id = read_id(p, "job_id");
                 return to_json(take(b->ledger->cancel(b->tenant_for(ctx, id), id, b->now())));
             }});
}

}  // namespace qrt::rpc
