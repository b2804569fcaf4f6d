#pragma once
// The transport-free request engine: framing decisions, JSON-RPC 2.0
// validation, batches, the method registry, role checks, events and request
// statistics.  The socket server (server.hpp) feeds it complete lines; the
// fuzz target and unit tests feed it bytes directly, without sockets.
//
// Single-threaded: every call happens on the event-loop thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qrt/log.hpp"
#include "qrt/rpc/auth.hpp"
#include "qrt/rpc/json_rpc.hpp"
#include "qrt/telemetry.hpp"
#include "rtcore/histogram.hpp"

namespace qrt::rpc {

// An event pushed to subscribers as a notification
//   {"jsonrpc":"2.0","method":"events.event",
//    "params":{"seq":N,"type":"job.finished","data":{...}}}
// seq counts 1, 2, 3 ... per subscription, so a client sees gaps never and
// order always.  Types: reservation.displaced, reservation.expired,
// calibration.changed, job.dispatched, job.finished (and any the daemon adds).
struct event {
    std::string type;
    std::string tenant;  // owner; empty = of interest to every subscriber
    json data;
};

// One connected peer.
struct session {
    std::uint64_t id = 0;
    peer_identity peer;
    role_set roles;
    std::string tenant;
    // Set on a call a delegate makes on_behalf_of another tenant
    // (tenants.delegates): the delegate's own tenant.
    std::string delegate;
    bool subscribed = false;
    // Subscribed with delegated: also the events of the tenants this
    // delegate books for (tenant/NAME).
    bool delegated_events = false;
    std::vector<std::string> topics;  // empty = every type
    std::uint64_t event_seq = 0;
    // Where this session's notifications go (the server appends to the
    // connection's output buffer).  Must not detach the session.
    std::function<void(std::string_view line)> push;
};

// What a handler sees of its caller.
struct call_context {
    session& caller;
    // Admins see everything; everyone else only their own tenant's objects.
    bool may_access(std::string_view owner_tenant) const {
        return caller.roles.holds(role::admin) || owner_tenant == caller.tenant;
    }
};

// A handler returns the result or throws rpc_failure (or invalid_params).
using handler = std::function<json(const json& params, call_context& ctx)>;
// A handler that appends its result, already serialised as one JSON value,
// to `out` (or throws as above, having appended nothing that matters: the
// engine drops a partial write).  For hot methods whose result is mostly a
// constant that can be serialised once (agent.hello).
using raw_handler = std::function<void(const json& params, call_context& ctx, std::string& out)>;

struct method_info {
    std::string name;
    role required = role::reader;
    std::string summary;  // one line, for agent.hello and qrtctl --help
    handler fn;
    // A reply to this method is sent only once what the call changed is
    // durable (set_commit_tracker); reads leave it false and never wait.
    bool acknowledged_when_durable = false;
};

// A reply the server must hold until the changes it acknowledges are
// durable: the sequence to wait for, the engine's number of the held line,
// and each of its requests that got a reply (in order), so that each can be
// answered on its own should its change fail to commit or be refused
// (engine::release_held).
struct pending_ack {
    std::uint64_t seq = 0;   // the highest sequence a request waits for (0: none)
    std::uint64_t line = 0;  // the engine's number of this held line (0: none)
    struct request {
        json id;
        // Its reply within the held text, from the line's first byte.
        std::size_t begin = 0;
        std::size_t end = 0;
        // The sequences it waits for, [first_seq, last_seq] (0: it waits
        // for nothing, as a read); claims: it made those changes.  A call
        // that changed nothing (an idempotent retry) waits for the latest
        // sequence given when it ran, without claiming it: that change is
        // another request's.
        std::uint64_t first_seq = 0;
        std::uint64_t last_seq = 0;
        bool claims = false;
    };
    std::vector<request> requests;
    bool batch = false;
};

class registry {
public:
    // Throws std::invalid_argument on an empty name, a missing handler or a
    // duplicate.
    void add(method_info m);
    // A method answered by a raw writer.  m.fn may be empty: it is then
    // derived from `raw` (parsing what it writes) for callers that want a
    // json result.
    void add(method_info m, raw_handler raw);
    const method_info* find(std::string_view name) const;
    // The raw writer of a method found here, or nullptr.
    const raw_handler* raw_of(const method_info& m) const noexcept;
    const std::vector<method_info>& methods() const noexcept { return _methods; }

private:
    std::vector<method_info> _methods;
    std::vector<raw_handler> _raw;  // parallel to _methods; empty = none
    std::map<std::string, std::size_t, std::less<>> _index;
};

struct engine_limits {
    std::size_t max_line_bytes = 1U << 20;  // 1 MiB, newline excluded
    std::size_t max_depth = 64;             // arrays/objects nested
    std::size_t max_batch = 256;            // requests in one batch line
    // What a line costs the admission hook: one request per started this
    // many bytes (tenants.request_bytes).
    std::size_t request_bytes = 16384;
};

struct line_reply {
    std::string text;            // reply line(s) with '\n'; empty = nothing to send
    std::size_t requests = 0;    // requests the line held (a batch: its size)
};

// How a line is read (agent/src/rpc/request_reader.hpp).
struct line_read;
struct request_view;

class engine {
public:
    explicit engine(engine_limits limits = {});
    ~engine();
    engine(const engine&) = delete;
    engine& operator=(const engine&) = delete;

    registry& methods() noexcept { return _registry; }
    const registry& methods() const noexcept { return _registry; }
    const engine_limits& limits() const noexcept { return _limits; }

    // One complete line without its '\n' (a trailing '\r' is ignored).
    // The caller sends the reply, THEN calls drain_event_sources(), so a
    // caller sees its reply before the events its call caused.
    line_reply handle_line(std::string_view line, session& s);
    // The same, appending the reply line (if any) to `out` instead of
    // returning it; returns the number of requests the line held.
    std::size_t handle_line(std::string_view line, session& s, std::string& out);

    // The error line sent before closing a connection whose line exceeded
    // max_line_bytes.
    std::string line_too_long_reply(std::size_t seen_bytes);
    // The error line sent before closing an extra connection.
    static std::string overloaded_reply(std::string_view what);

    // Sessions that may receive events.
    void attach(session& s);
    void detach(session& s) noexcept;
    std::size_t sessions() const noexcept { return _sessions.size(); }

    // Deliver one event to every matching subscriber, in call order.
    void publish(const event& e);
    // A source drained after every handled line (the ledger's
    // drain_events(), adapted by the method layer).
    void add_event_source(std::function<std::vector<event>()> drain);
    void drain_event_sources();

    // The tenant request rate.  Called for every non-blank line before
    // anything else is done with it -- so unknown methods, calls the roles
    // deny and lines that do not parse are charged like any request -- with
    // what the line costs: one request per started limits().request_bytes
    // bytes (at least one); and, for a batch holding more requests than
    // that, once more after parsing for the rest.  Throwing rpc_failure
    // refuses the whole line with that error, before it is run (with the
    // request's id when the line is one request of at most request_bytes,
    // else with id null).
    // Unset: everything is admitted.
    using admission = std::function<void(session& s, std::uint64_t requests)>;
    void set_admission(admission a) { _admit = std::move(a); }
    // What a line of `bytes` costs the admission hook.
    std::uint64_t line_cost(std::size_t bytes) const noexcept;

    // Deferred acknowledgement (group commit): latest() is the last change
    // sequence given, durable() the last one on disk.  A successful call of
    // an acknowledged_when_durable method that leaves latest() > durable()
    // makes its line's reply wait (take_pending_ack after handle_line).
    // Unset: every reply goes out at once.
    void set_commit_tracker(std::function<std::uint64_t()> latest,
                            std::function<std::uint64_t()> durable);
    std::uint64_t durable_seq() const { return _durable ? _durable() : UINT64_MAX; }
    // What the last handle_line must wait for (seq 0: nothing).
    pending_ack take_pending_ack() { return std::exchange(_line_ack, pending_ack{}); }
    // A held request that must not acknowledge after all, although its
    // change is durable (a job that became durable too late to be
    // dispatched, ledger::withdraw_late): the request of a held line that
    // made change seq is answered with f when its line is released.
    // False: no held request made that change (a notification's, or one
    // whose line is gone).
    bool refuse_change(std::uint64_t seq, rpc_failure f);
    // The held line is resolved (what it waits for is durable, or failed):
    // text, its reply line as written, becomes what is to be sent -- each
    // request whose changes are in [failed_from, failed_to] (both 0: none
    // failed) answered store_error (why), each refused one answered with its
    // refusal, every other request's reply as it was.  Forgets the line;
    // returns how many requests were answered store_error.
    std::size_t release_held(const pending_ack& ack, std::string& text, std::uint64_t failed_from = 0,
                             std::uint64_t failed_to = 0, std::string_view why = {});
    // A held line that will never be sent (its connection closed).
    void forget_held(const pending_ack& ack) noexcept;
    // Held lines the engine keeps track of (claims or refusals), for tests.
    std::size_t held_tracked() const noexcept { return _claims.size() + _refusals.size(); }

    // Request counters and the handling-time histogram.
    telemetry::snapshot stats() const;
    std::uint64_t denied_total() const noexcept { return _denied_total; }

    // The dispatch of one parsed request (for tests): the reply object, or
    // null for a notification.
    json handle_request(const json& request, session& s);

private:
    // Append the reply to one request (false, nothing appended: it was a
    // notification).
    bool write_request(const request_view& request, session& s, std::string& out);
    // write_request, recording the reply's place and what it waits for in
    // _line_requests.
    bool write_recorded(const request_view& request, session& s, std::string& out);
    // Append the reply to a batch; returns the requests it counts for.
    std::size_t write_batch(const json& batch, session& s, std::string& out);
    void write_error(std::string& out, const json& id, const rpc_failure& f);
    void count_error(std::string_view reason);
    // count_error, and the refusals by quota.
    void count_failure(const rpc_failure& f);
    // _admit(s, requests): the refusal, if refused.
    std::optional<rpc_failure> admit_line(session& s, std::uint64_t requests);
    // The error reply to a line refused before it was run: with the
    // request's id when the line is one request of at most request_bytes
    // (nothing for a notification), else with id null.
    void write_refusal(std::string_view line, const rpc_failure& f, std::string& out);
    void log_denied(const session& s, std::string_view method, role needed);

    engine_limits _limits;
    registry _registry;
    std::map<std::uint64_t, session*> _sessions;
    std::vector<std::function<std::vector<event>()>> _sources;

    std::map<std::string, std::uint64_t, std::less<>> _requests_by_method;
    std::map<std::string, std::uint64_t, std::less<>> _errors_by_reason;
    // quota_exceeded refusals by data.quota (a fixed set of names).
    std::map<std::string, std::uint64_t, std::less<>> _quota_refusals;
    admission _admit;
    std::function<std::uint64_t()> _latest;
    std::function<std::uint64_t()> _durable;
    pending_ack _line_ack;
    std::uint64_t _line_charged = 0;  // what admit_line took for the line being handled
    std::unique_ptr<line_read> _read;  // the line being handled, read by SAX (request_reader.hpp)
    // The requests of the line being handled that got a reply (their id,
    // which lives in the parsed line, only copied when the line is held).
    struct request_mark {
        const json* id = nullptr;
        std::size_t begin = 0;
        std::size_t end = 0;
        std::uint64_t first_seq = 0;
        std::uint64_t last_seq = 0;
        bool claims = false;
    };
    request_mark _request;                   // the request being written
    std::vector<request_mark> _line_requests;
    std::uint64_t _held_lines = 0;           // numbers given to held lines
    // The changes held requests made: last seq -> [first seq, line, index
    // of the request in its line].  Disjoint ranges: each sequence is
    // given to one change, made by at most one request.
    struct claim {
        std::uint64_t first_seq = 0;
        std::uint64_t line = 0;
        std::size_t index = 0;
    };
    std::map<std::uint64_t, claim> _claims;
    // Held lines' refused requests: line -> (index, its answer).
    std::map<std::uint64_t, std::vector<std::pair<std::size_t, rpc_failure>>> _refusals;
    std::uint64_t _lines = 0;
    std::uint64_t _notifications_sent = 0;
    std::uint64_t _denied_total = 0;
    rtcore::histogram _handle_ns;

    // Denied-call logging: at most 10 lines per second; the next one says
    // how many were suppressed.
    log::rate_limiter _denied_log{std::chrono::seconds(1), 10};
};

}  // namespace qrt::rpc
