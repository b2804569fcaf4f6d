#include "qrt/rpc/engine.hpp"
#include "rtcore/clock.hpp"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "qrt/log.hpp"
#include "request_reader.hpp"
#include "rtcore/text.hpp"

namespace qrt::rpc {

namespace {


bool valid_id(const json& id) {
    if (id.is_string() || id.is_null() || id.is_number_integer()) {
        return true;
    }
    return id.is_number_float() && std::isfinite(id.get<double>());
}

}  // namespace

void registry::add(method_info m) { add(std::move(m), raw_handler{}); }

void registry::add(method_info m, raw_handler raw) {
    if (!m.fn && raw) {
        m.fn = [r = raw](const json& params, call_context& ctx) {
            std::string text;
            r(params, ctx, text);
            return json::parse(text);
        };
    }
    if (m.name.empty() || !m.fn) {
        throw std::invalid_argument("rpc registry: a method needs a name and a handler");
    }
    if (_index.count(m.name) != 0) {
        throw std::invalid_argument("rpc registry: method '" + m.name + "' registered twice");
    }
    _index.emplace(m.name, _methods.size());
    _methods.push_back(std::move(m));
    _raw.push_back(std::move(raw));
}

const method_info* registry::find(std::string_view name) const {
    auto it = _index.find(name);
    return it == _index.end() ? nullptr : &_methods[it->second];
}

const raw_handler* registry::raw_of(const method_info& m) const noexcept {
    const auto i = static_cast<std::size_t>(&m - _methods.data());
    return i < _raw.size() && _raw[i] ? &_raw[i] : nullptr;
}

engine::engine(engine_limits limits) : _limits(limits), _read(std::make_unique<line_read>()) {}

engine::~engine() = default;

void engine::count_error(std::string_view reason) {
    auto it = _errors_by_reason.find(reason);
    if (it == _errors_by_reason.end()) {
        _errors_by_reason.emplace(std::string(reason), 1);
    } else {
        ++it->second;
    }
}

void engine::count_failure(const rpc_failure& f) {
    count_error(f.reason());
    if (f.reason() == "quota_exceeded") {
        const auto q = f.details().find("quota");
        if (q != f.details().end() && q->is_string()) {
            ++_quota_refusals[q->get<std::string>()];
        }
    }
}

std::uint64_t engine::line_cost(std::size_t bytes) const noexcept {
    const std::size_t per = std::max<std::size_t>(1, _limits.request_bytes);
    return std::max<std::uint64_t>(1, (bytes + per - 1) / per);
}

std::optional<rpc_failure> engine::admit_line(session& s, std::uint64_t requests) {
    if (!_admit) {
        return std::nullopt;
    }
    try {
        _admit(s, requests);
        _line_charged += requests;
        return std::nullopt;
    } catch (const rpc_failure& f) {
        count_failure(f);
        return f;
    }
}

void engine::write_refusal(std::string_view line, const rpc_failure& f, std::string& out) {
    // Parsing a refused line only to find its id is bounded: one request's
    // worth of bytes at most.
    if (line.size() <= _limits.request_bytes && !nesting_exceeds(line, _limits.max_depth)) {
        json parsed;
        try {
            parsed = json::parse(line.begin(), line.end());
        } catch (const json::exception&) {
            parsed = nullptr;
        }
        if (parsed.is_object()) {
            const auto id = parsed.find("id");
            if (id == parsed.end()) {
                return;  // a notification gets no reply
            }
            write_error(out, valid_id(*id) ? *id : json(nullptr), f);
            return;
        }
    }
    write_error(out, nullptr, f);
}

void engine::log_denied(const session& s, std::string_view method, role needed) {
    log::warn_rl(_denied_log, "rpc", "denied {} to uid {} ({}) pid {}: needs role {}, has [{}]", method,
                 s.peer.uid, s.tenant, s.peer.pid, role_name(needed), fmt::join(s.roles.names(), ","));
}

std::string engine::line_too_long_reply(std::size_t seen_bytes) {
    count_error("line_too_long");
    const rpc_failure f("line_too_long",
                        fmt::format("request line exceeds {} bytes (read {} without a newline); "
                                    "closing the connection",
                                    _limits.max_line_bytes, seen_bytes),
                        json{{"limit_bytes", _limits.max_line_bytes}});
    return to_line(make_error_reply(nullptr, f));
}

std::string engine::overloaded_reply(std::string_view what) {
    const rpc_failure f("overloaded", std::string(what));
    return to_line(make_error_reply(nullptr, f));
}

line_reply engine::handle_line(std::string_view raw, session& s) {
    line_reply out;
    out.requests = handle_line(raw, s, out.text);
    return out;
}

void engine::write_error(std::string& out, const json& id, const rpc_failure& f) {
    append_error_reply(out, id, f);
}

void engine::set_commit_tracker(std::function<std::uint64_t()> latest,
                                std::function<std::uint64_t()> durable) {
    _latest = std::move(latest);
    _durable = std::move(durable);
}

bool engine::refuse_change(std::uint64_t seq, rpc_failure f) {
    const auto it = _claims.lower_bound(seq);
    if (it == _claims.end() || it->second.first_seq > seq) {
        return false;
    }
    auto& refused = _refusals[it->second.line];
    for (auto& [index, answer] : refused) {
        if (index == it->second.index) {
            answer = std::move(f);
            return true;
        }
    }
    refused.emplace_back(it->second.index, std::move(f));
    return true;
}

void engine::forget_held(const pending_ack& ack) noexcept {
    if (ack.line == 0) {
        return;
    }
    for (const auto& r : ack.requests) {
        if (r.claims) {
            _claims.erase(r.last_seq);
        }
    }
    _refusals.erase(ack.line);
}

std::size_t engine::release_held(const pending_ack& ack, std::string& text, std::uint64_t failed_from,
                                 std::uint64_t failed_to, std::string_view why) {
    if (ack.line == 0) {
        return 0;  // held only behind another line: nothing of its own to wait for
    }
    std::vector<std::pair<std::size_t, rpc_failure>> refused;
    if (const auto r = _refusals.find(ack.line); r != _refusals.end()) {
        refused = std::move(r->second);
    }
    forget_held(ack);
    std::vector<const rpc_failure*> answer(ack.requests.size(), nullptr);
    std::optional<rpc_failure> store_error;
    std::size_t failed = 0;
    for (std::size_t i = 0; failed_to != 0 && i < ack.requests.size(); ++i) {
        const pending_ack::request& r = ack.requests[i];
        if (r.last_seq != 0 && r.first_seq <= failed_to && r.last_seq >= failed_from) {
            if (!store_error) {
                store_error.emplace("store_error",
                                    fmt::format("ledger: the change was not committed ({}); it did "
                                                "not happen, retry",
                                                why));
            }
            answer[i] = &*store_error;
            ++failed;
        }
    }
    bool any = failed != 0;
    for (const auto& [index, f] : refused) {
        if (index < answer.size() && answer[index] == nullptr) {
            answer[index] = &f;
            any = true;
        }
    }
    if (!any) {
        return 0;
    }
    std::string out;
    out.reserve(text.size());
    if (ack.batch) {
        out.push_back('[');
    }
    for (std::size_t i = 0; i < ack.requests.size(); ++i) {
        const pending_ack::request& r = ack.requests[i];
        if (i != 0) {
            out.push_back(',');
        }
        if (answer[i] != nullptr) {
            count_error(answer[i]->reason());
            write_error(out, r.id, *answer[i]);
        } else if (r.end <= text.size() && r.begin <= r.end) {
            out.append(text, r.begin, r.end - r.begin);
        }
    }
    if (ack.batch) {
        out.push_back(']');
    }
    out.push_back('\n');
    text = std::move(out);
    return failed;
}

std::size_t engine::handle_line(std::string_view raw, session& s, std::string& out) {
    _line_ack = pending_ack{};
    _line_requests.clear();
    const std::string_view line = rtcore::trim(raw);
    if (line.empty()) {
        return 0;  // blank lines are keep-alives
    }
    ++_lines;
    const std::int64_t t0 = rtcore::monotonic_now_ns();
    // Charged before anything else: what a line costs the daemon (reading,
    // parsing, an error reply) is paid whatever the line turns out to be.
    _line_charged = 0;
    if (const auto refused = admit_line(s, line_cost(line.size()))) {
        const std::size_t before = out.size();
        write_refusal(line, *refused, out);
        _handle_ns.record(rtcore::monotonic_now_ns() - t0);
        if (out.size() != before) {
            out.push_back('\n');
        }
        return 1;
    }
    if (line.size() > _limits.max_line_bytes) {
        out += line_too_long_reply(line.size());
        return 1;
    }
    const std::size_t mark = out.size();
    std::size_t requests = 1;
    const auto too_deep = [&] {
        count_error("too_deep");
        write_error(out, nullptr,
                    rpc_failure("too_deep",
                                fmt::format("JSON nests deeper than {} levels", _limits.max_depth),
                                json{{"limit", _limits.max_depth}}));
    };
    const auto parse_failed = [&](const std::string& why) {
        count_error("parse_error");
        // nlohmann's message names the byte offset and what it expected.
        write_error(out, nullptr, rpc_failure("parse_error", "parse error: " + why));
    };
    // One request (the usual line) is read without a document for its
    // envelope (request_reader.hpp); a batch is parsed as a document.
    read_line(line, _limits.max_depth, *_read);
    json batch;  // holds the ids _line_requests point at, for a batch
    bool is_batch = false;
    if (_read->what == line_read::kind::too_deep) {
        too_deep();
    } else if (_read->what == line_read::kind::parse_error) {
        // parse_error, and out_of_range for numbers beyond double (1e400).
        parse_failed(_read->error);
    } else if (_read->what == line_read::kind::request) {
        write_recorded(_read->view(), s, out);
    } else if (nesting_exceeds(line, _limits.max_depth)) {
        too_deep();
    } else {
        std::string why;
        try {
            batch = json::parse(line.begin(), line.end());
            is_batch = true;
        } catch (const json::exception& e) {
            why = e.what();
        }
        if (is_batch) {
            requests = write_batch(batch, s, out);
        } else {
            parse_failed(why);
        }
    }
    if (_line_ack.seq != 0) {
        // The reply waits for a commit: keep each request's place, id
        // and changes, to answer it on its own should its change fail
        // or be refused (release_held).
        _line_ack.batch = is_batch;
        _line_ack.line = ++_held_lines;
        _line_ack.requests.reserve(_line_requests.size());
        for (std::size_t i = 0; i < _line_requests.size(); ++i) {
            const request_mark& r = _line_requests[i];
            _line_ack.requests.push_back(
                {*r.id, r.begin - mark, r.end - mark, r.first_seq, r.last_seq, r.claims});
            if (r.claims) {
                _claims.insert_or_assign(r.last_seq, claim{r.first_seq, _line_ack.line, i});
            }
        }
    }
    _handle_ns.record(rtcore::monotonic_now_ns() - t0);
    if (out.size() != mark) {
        out.push_back('\n');
    }
    return requests;
}

std::size_t engine::write_batch(const json& batch, session& s, std::string& out) {
    const std::size_t requests = std::max<std::size_t>(batch.size(), 1);
    if (batch.empty()) {
        count_error("invalid_request");
        write_error(out, nullptr, rpc_failure("invalid_request", "empty batch"));
        return requests;
    }
    if (batch.size() > _limits.max_batch) {
        count_error("batch_too_large");
        write_error(out, nullptr,
                    rpc_failure("batch_too_large",
                                fmt::format("batch of {} requests exceeds the limit of {}",
                                            batch.size(), _limits.max_batch),
                                json{{"limit", _limits.max_batch}}));
        return requests;
    }
    // Every request of a batch counts: the line paid for its bytes, the
    // requests past that are charged now.
    if (batch.size() > _line_charged) {
        if (const auto refused = admit_line(s, batch.size() - _line_charged)) {
            write_error(out, nullptr, *refused);
            return requests;
        }
    }
    const std::size_t mark = out.size();
    out.push_back('[');
    bool any = false;
    for (const auto& req : batch) {
        if (any) {
            out.push_back(',');
        }
        const bool wrote = write_recorded(view_of(req), s, out);
        if (any && !wrote) {
            out.pop_back();  // the ',' before a notification
        }
        any = any || wrote;
    }
    if (!any) {
        out.resize(mark);  // all notifications: nothing at all is sent
        return requests;
    }
    out.push_back(']');
    return requests;
}

json engine::handle_request(const json& req, session& s) {
    std::string text;
    _line_requests.clear();
    if (!write_request(view_of(req), s, text)) {
        return nullptr;
    }
    return json::parse(text);
}

bool engine::write_recorded(const request_view& req, session& s, std::string& out) {
    static const json null_id = nullptr;
    _request = request_mark{};
    _request.id = &null_id;
    _request.begin = out.size();
    if (!write_request(req, s, out)) {
        return false;
    }
    _request.end = out.size();
    _line_requests.push_back(_request);
    return true;
}

bool engine::write_request(const request_view& req, session& s, std::string& out) {
    const auto invalid = [&](const json& id, std::string message) {
        count_error("invalid_request");
        write_error(out, id, rpc_failure("invalid_request", std::move(message)));
        return true;
    };
    if (!req.is_object) {
        return invalid(nullptr, fmt::format("a request must be an object, got {}", req.type_name));
    }
    static const json null_id = nullptr;
    const bool is_notification = req.id == nullptr;
    if (!is_notification && !valid_id(*req.id)) {
        return invalid(nullptr, fmt::format("'id' must be a string, a number or null, got {}",
                                            req.id->type_name()));
    }
    const json& id = is_notification ? null_id : *req.id;
    _request.id = &id;
    if (req.has_unknown) {
        return invalid(id, fmt::format("unknown request member '{}'", req.unknown));
    }
    if (req.jsonrpc != request_view::version::v2) {
        return invalid(id, "'jsonrpc' must be exactly \"2.0\"");
    }
    if (req.method == nullptr) {
        return invalid(id, "'method' must be a string");
    }
    const std::string& name = *req.method;
    static const json no_params = nullptr;
    const json& params = req.params == nullptr ? no_params : *req.params;
    if (!params.is_null() && !params.is_object() && !params.is_array()) {
        return invalid(id, "'params' must be an object or an array");
    }

    const method_info* m = _registry.find(name);
    const std::string_view counted_name = m != nullptr ? std::string_view(m->name) : "unknown";
    if (auto it = _requests_by_method.find(counted_name); it != _requests_by_method.end()) {
        ++it->second;
    } else {
        _requests_by_method.emplace(std::string(counted_name), 1);
    }
    if (m == nullptr) {
        count_error("method_not_found");
        if (is_notification) {
            return false;
        }
        write_error(out, id,
                    rpc_failure("method_not_found",
                                fmt::format("no method '{}'",
                                            name.size() > 128 ? name.substr(0, 128) + "..." : name),
                                json{{"method", name.size() > 128 ? name.substr(0, 128) : name}}));
        return true;
    }
    if (!s.roles.allows(m->required)) {
        ++_denied_total;
        count_error("permission_denied");
        log_denied(s, m->name, m->required);
        if (is_notification) {
            return false;
        }
        write_error(out, id,
                    rpc_failure("permission_denied",
                                fmt::format("{} needs role '{}'; uid {} ({}) holds [{}]", m->name,
                                            role_name(m->required), s.peer.uid, s.tenant,
                                            fmt::join(s.roles.names(), ", ")),
                                json{{"method", m->name},
                                     {"required_role", role_name(m->required)},
                                     {"roles", s.roles.names()}}));
        return true;
    }
    call_context ctx{s};
    const std::size_t mark = out.size();
    try {
        if (const raw_handler* raw = _registry.raw_of(*m); raw != nullptr) {
            if (is_notification) {
                // The call still happens (for its checks and effects); its
                // result is dropped.
                std::string sink;
                (*raw)(params, ctx, sink);
                return false;
            }
            static constexpr std::string_view head = R"({"id":)";
            out += head;
            dump_to(out, id);
            out += R"(,"jsonrpc":"2.0","result":)";
            (*raw)(params, ctx, out);
            out.push_back('}');
            return true;
        }
        const bool acknowledged = m->acknowledged_when_durable && _latest;
        const std::uint64_t before = acknowledged ? _latest() : 0;
        json result = m->fn(params, ctx);
        if (acknowledged) {
            if (const std::uint64_t seq = _latest(); seq > _durable()) {
                // What it changed, or (a retry that changed nothing) what
                // is in flight before it: waited for, claimed only if made here.
                _request.claims = seq > before;
                _request.first_seq = _request.claims ? before + 1 : seq;
                _request.last_seq = seq;
                _line_ack.seq = std::max(_line_ack.seq, seq);
            }
        }
        if (is_notification) {
            return false;
        }
        append_result_reply(out, id, result);
        return true;
    } catch (const rpc_failure& f) {
        out.resize(mark);
        count_failure(f);
        if (is_notification) {
            return false;
        }
        write_error(out, id, f);
        return true;
    } catch (const std::exception& e) {
        out.resize(mark);
        count_error("internal_error");
        log::error("rpc", "{} from uid {} failed: {}", m->name, s.peer.uid, e.what());
        if (is_notification) {
            return false;
        }
        write_error(out, id,
                    rpc_failure("internal_error",
                                fmt::format("{} failed inside the agent", m->name)));
        return true;
    }
}

void engine::attach(session& s) { _sessions[s.id] = &s; }

void engine::detach(session& s) noexcept { _sessions.erase(s.id); }

void engine::publish(const event& e) {
    for (auto& [id, s] : _sessions) {
        if (!s->subscribed || !s->push) {
            continue;
        }
        if (!e.tenant.empty() && !s->roles.holds(role::admin) && e.tenant != s->tenant &&
            !(s->delegated_events && e.tenant.size() > s->tenant.size() + 1 &&
              e.tenant.starts_with(s->tenant) && e.tenant[s->tenant.size()] == '/')) {
            continue;  // another tenant's object (not one this delegate books for)
        }
        if (!s->topics.empty() &&
            std::find(s->topics.begin(), s->topics.end(), e.type) == s->topics.end()) {
            continue;
        }
        ++s->event_seq;
        ++_notifications_sent;
        json params{{"seq", s->event_seq}, {"type", e.type}, {"data", e.data}};
        if (!e.tenant.empty()) {
            params["tenant"] = e.tenant;
        }
        s->push(to_line(make_notification("events.event", std::move(params))));
    }
}

void engine::add_event_source(std::function<std::vector<event>()> drain) {
    _sources.push_back(std::move(drain));
}

void engine::drain_event_sources() {
    for (auto& src : _sources) {
        for (const auto& e : src()) {
            publish(e);
        }
    }
}

telemetry::snapshot engine::stats() const {
    telemetry::snapshot snap;
    snap.taken_ns = rtcore::realtime_now_ns();
    for (const auto& [method, n] : _requests_by_method) {
        snap.add_counter("qrt_rpc_requests_total", "JSON-RPC requests received, by method",
                         {{"method", method}}, n);
    }
    for (const auto& [reason, n] : _errors_by_reason) {
        snap.add_counter("qrt_rpc_errors_total", "JSON-RPC error replies, by data.reason",
                         {{"reason", reason}}, n);
    }
    for (const auto& [quota, n] : _quota_refusals) {
        snap.add_counter("qrt_rpc_quota_exceeded_total",
                         "requests refused by a per-tenant quota or ceiling ([tenants]), by quota",
                         {{"quota", quota}}, n);
    }
    snap.add_counter("qrt_rpc_lines_total", "request lines handled (a batch is one line)", {},
                     _lines);
    snap.add_counter("qrt_rpc_denied_total", "calls refused for lack of a role", {},
                     _denied_total);
    snap.add_counter("qrt_rpc_notifications_total", "event notifications pushed to subscribers",
                     {}, _notifications_sent);
    snap.add_gauge("qrt_rpc_sessions", "connected sessions", {},
                   static_cast<double>(_sessions.size()));
    snap.add_histogram("qrt_rpc_line_handling_seconds",
                       "time to parse, authorise and answer one request line", {}, _handle_ns);
    return snap;
}

}  // namespace qrt::rpc
