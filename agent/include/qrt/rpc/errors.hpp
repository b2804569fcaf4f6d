#pragma once
// The one table of JSON-RPC error codes and their stable `data.reason`
// strings, shared by the server (agent/src/rpc/) and every client (qrtctl,
// libqrt-client, the Python client).  A reason's spelling, code and exit code
// never change once released; new reasons are appended.
//
// Every error object the server sends has this form:
//   {"code": -32005, "message": "<human text naming the field or method>",
//    "data": {"reason": "not_owner", ...optional details...}}
// Standard JSON-RPC 2.0 errors carry a reason too, so a client can always
// switch on data.reason alone.
//
// exit_code is what `qrtctl` returns for that reason, so scripts (Slurm
// prolog/epilog, Kubernetes probes) can branch on it without parsing JSON.
//
// Header-only and dependency-free, so C++ clients can include it as is.

#include <array>
#include <string_view>

namespace qrt::rpc {

// JSON-RPC 2.0 standard codes.
inline constexpr int code_parse_error = -32700;
inline constexpr int code_invalid_request = -32600;
inline constexpr int code_method_not_found = -32601;
inline constexpr int code_invalid_params = -32602;
inline constexpr int code_internal_error = -32603;
// Application errors live in [-32099, -32000].
inline constexpr int code_app_first = -32099;
inline constexpr int code_app_last = -32000;
// A reason that the ledger reports but this table does not know yet: it is
// passed through verbatim in data.reason with this code.
inline constexpr int code_unlisted_reason = -32099;

struct reason_entry {
    std::string_view reason;  // stable data.reason
    int code;                 // JSON-RPC error code
    int exit_code;            // qrtctl exit status for this reason
    std::string_view meaning;
};

// clang-format off
inline constexpr std::array<reason_entry, 32> reason_table{{
    // standard errors
    {"parse_error",          code_parse_error,      2, "the line is not valid JSON (or not valid UTF-8)"},
    {"invalid_request",      code_invalid_request,  2, "not a valid JSON-RPC 2.0 request object"},
    {"line_too_long",        code_invalid_request,  2, "a request line exceeds the per-line byte limit; the connection is closed"},
    {"too_deep",             code_invalid_request,  2, "the JSON nests deeper than the server accepts"},
    {"batch_too_large",      code_invalid_request,  2, "a batch holds more requests than the server accepts"},
    {"method_not_found",     code_method_not_found, 3, "no such method"},
    {"invalid_params",       code_invalid_params,   4, "a parameter is missing, of the wrong type, out of range or unknown"},
    {"internal_error",       code_internal_error,   5, "the server failed; see its log"},
    // application errors
    {"permission_denied",    -32000, 6,  "the caller's roles do not allow this method or object"},
    {"invalid_argument",     -32001, 4,  "a parameter is well-formed but not acceptable"},
    {"not_found",            -32002, 7,  "no such reservation, job or window"},
    {"no_fit",               -32003, 8,  "no slot satisfies the request's constraints"},
    {"lease_expired",        -32004, 9,  "the reservation's lease ran out before this call"},
    {"not_owner",            -32005, 6,  "the object belongs to another tenant"},
    {"calibration_changed",  -32006, 10, "the calibration window changed under the reservation"},
    {"unknown_qpu",          -32007, 7,  "no QPU with that id"},
    {"illegal_transition",   -32008, 11, "the object is not in a state that allows this call"},
    {"bad_fencing_token",    -32009, 12, "the fencing token is stale or does not match"},
    {"overloaded",           -32010, 13, "a server limit was reached (connections, requests in flight)"},
    {"unavailable",          -32011, 14, "the subsystem needed is not available"},
    {"duplicate",            -32012, 15, "the idempotency key was already used with different parameters"},
    {"deadline_passed",      -32013, 8,  "the request's deadline is already in the past"},
    {"missed",               -32014, 16, "the job's slot passed without it being sent"},
    {"idle_timeout",         -32015, 13, "the connection was idle too long and is being closed"},
    {"payload_too_large",    -32016, 4,  "the job payload exceeds the accepted size"},
    {"conflict",             -32017, 11, "the call conflicts with the current state (e.g. window overlap)"},
    {"not_ready",            -32018, 17, "the job has no result yet"},
    {"store_error",          -32019, 14, "the durable store failed; nothing was changed"},
    {"quota_exceeded",       -32020, 19, "a per-tenant quota or ceiling of [tenants] was reached (data.quota names it)"},
    // A job's end state, like missed: it went out on time to a write-only
    // endpoint, which gives no result back (no error is raised with it).
    {"sent",                 -32021, 20, "the job was written on time to a write-only endpoint; no result comes back"},
    {"endpoint_down",        -32022, 21, "the QPU's endpoint is not connected and the start is within timeline.endpoint_down_horizon_ns (data: since_ns, error, remedy)"},
    // The network listener (rpc.listen): the connection's MUNGE credential
    // was refused (data.cause: expired, rewound, replayed, invalid,
    // malformed, nonce_mismatch, address_mismatch, auth_required,
    // auth_timeout); it is closed.
    {"unauthenticated",      -32023, 22, "the connection did not authenticate (data.cause says why); nothing was served"},
}};
// clang-format on

// The reasons by name, for code that writes or checks one (the ledger's own
// live in qrt::timeline::reason and are tied to this table where the two
// layers meet, qrt/reasons.hpp).  Each has its row above.
namespace reason {
inline constexpr std::string_view parse_error = "parse_error";
inline constexpr std::string_view invalid_request = "invalid_request";
inline constexpr std::string_view line_too_long = "line_too_long";
inline constexpr std::string_view too_deep = "too_deep";
inline constexpr std::string_view batch_too_large = "batch_too_large";
inline constexpr std::string_view method_not_found = "method_not_found";
inline constexpr std::string_view invalid_params = "invalid_params";
inline constexpr std::string_view internal_error = "internal_error";
inline constexpr std::string_view permission_denied = "permission_denied";
inline constexpr std::string_view invalid_argument = "invalid_argument";
inline constexpr std::string_view not_found = "not_found";
inline constexpr std::string_view no_fit = "no_fit";
inline constexpr std::string_view lease_expired = "lease_expired";
inline constexpr std::string_view not_owner = "not_owner";
inline constexpr std::string_view calibration_changed = "calibration_changed";
inline constexpr std::string_view unknown_qpu = "unknown_qpu";
inline constexpr std::string_view illegal_transition = "illegal_transition";
inline constexpr std::string_view bad_fencing_token = "bad_fencing_token";
inline constexpr std::string_view overloaded = "overloaded";
inline constexpr std::string_view unavailable = "unavailable";
inline constexpr std::string_view duplicate = "duplicate";
inline constexpr std::string_view deadline_passed = "deadline_passed";
inline constexpr std::string_view missed = "missed";
inline constexpr std::string_view idle_timeout = "idle_timeout";
inline constexpr std::string_view payload_too_large = "payload_too_large";
inline constexpr std::string_view conflict = "conflict";
inline constexpr std::string_view not_ready = "not_ready";
inline constexpr std::string_view store_error = "store_error";
inline constexpr std::string_view quota_exceeded = "quota_exceeded";
inline constexpr std::string_view sent = "sent";
inline constexpr std::string_view endpoint_down = "endpoint_down";
inline constexpr std::string_view unauthenticated = "unauthenticated";

inline constexpr std::array<std::string_view, 32> all{
    parse_error, invalid_request, line_too_long, too_deep, batch_too_large, method_not_found,
    invalid_params, internal_error, permission_denied, invalid_argument, not_found, no_fit,
    lease_expired, not_owner, calibration_changed, unknown_qpu, illegal_transition,
    bad_fencing_token, overloaded, unavailable, duplicate, deadline_passed, missed, idle_timeout,
    payload_too_large, conflict, not_ready, store_error, quota_exceeded, sent, endpoint_down,
    unauthenticated};
}  // namespace reason

// A job's outcome reasons: the stable first word of the `reason` of a job
// that was never sent or failed (jobs.status, jobs.result, the job.finished
// and missed events), written by the job pump and the QPU link (their names
// are qrt::dispatch::outcome, tied to this table in qrt/reasons.hpp).  They
// are not raised as errors; `missed` and `calibration_changed` are also
// error reasons above.  Spellings never change; new ones are appended.
struct outcome_entry {
    std::string_view reason;
    std::string_view meaning;
};

// clang-format off
inline constexpr std::array<outcome_entry, 16> outcome_table{{
    // never sent
    {"missed",                   "the slot's start passed by more than the tolerance before it could be sent"},
    {"calibration_changed",      "the job's calibration window changed or ended before its start (calibration guard)"},
    {"dispatch_refused",         "the dispatcher refused the hand-over (no free slot, payload too large, slot outside its window)"},
    {"out_of_window",            "sent at the moment it would have been, the job would have ended after its window"},
    {"endpoint_down",            "no connected QPU endpoint at the job's start"},
    {"cancelled",                "withdrawn, or the dispatcher stopped, before the job's start"},
    // sent, then failed
    {"send_failed",              "the write of the frame failed or was short"},
    {"endpoint_disconnected",    "the endpoint closed the connection before the job's result"},
    {"endpoint_protocol_error",  "the endpoint sent a frame that breaks the wire format"},
    {"endpoint_stalled",         "the endpoint answered none of its last jobs; the connection was dropped"},
    {"endpoint_timeout",         "no RESULT within the result timeout after the job's end"},
    {"qpu_out_of_window",        "the QPU saw the job arrive outside its window (ERROR frame)"},
    {"qpu_calibration_mismatch", "the QPU's current calibration is not the job's (ERROR frame)"},
    {"qpu_busy",                 "the QPU was busy (ERROR frame)"},
    {"qpu_error",                "the QPU answered with another ERROR"},
    // unknown (state failed, sent_ns 0)
    {"dispatch_unknown",         "qrtd stopped without closing its ledger (a crash) and the job's start passed before it ran again: its dispatch thread may have sent it, so whether the QPU ran it is unknown"},
}};
// clang-format on

// The index of the row of `table` (reason_table, outcome_table) for a
// reason, or table.size().  The compile-time checks below go through
// indices, not pointers: gcc's -fsanitize=undefined (the ASan+UBSan build)
// instruments a pointer into a static table so that comparing it with
// nullptr is no longer a constant expression.
template <typename Table>
constexpr std::size_t index_in(const Table& table, std::string_view reason) noexcept {
    for (std::size_t i = 0; i < table.size(); ++i) {
        if (table[i].reason == reason) {
            return i;
        }
    }
    return table.size();
}

// The row of `table` for a reason, or nullptr.
template <typename Table>
constexpr const typename Table::value_type* find_in(const Table& table, std::string_view reason) noexcept {
    const std::size_t i = index_in(table, reason);
    return i < table.size() ? &table[i] : nullptr;
}

// The outcome entry for a reason, or nullptr.
constexpr const outcome_entry* find_outcome(std::string_view reason) noexcept {
    return find_in(outcome_table, reason);
}

// The table entry for a reason, or nullptr.
constexpr const reason_entry* find_reason(std::string_view reason) noexcept {
    return find_in(reason_table, reason);
}

// Code for a reason; code_unlisted_reason when the reason is not listed.
constexpr int code_for_reason(std::string_view reason) noexcept {
    const std::size_t i = index_in(reason_table, reason);
    return i < reason_table.size() ? reason_table[i].code : code_unlisted_reason;
}

// qrtctl exit status for a reason (1 when unlisted: generic failure).
constexpr int exit_code_for_reason(std::string_view reason) noexcept {
    const std::size_t i = index_in(reason_table, reason);
    return i < reason_table.size() ? reason_table[i].exit_code : 1;
}

// The default reason for a standard code (the reason a client should assume
// when a foreign server omits data.reason).
constexpr std::string_view default_reason_for_code(int code) noexcept {
    for (const auto& e : reason_table) {
        if (e.code == code) {
            return e.reason;
        }
    }
    return "internal_error";
}

// Application codes are unique per reason; standard codes are shared.
constexpr bool app_codes_are_unique_and_in_range() noexcept {
    for (std::size_t i = 0; i < reason_table.size(); ++i) {
        const int c = reason_table[i].code;
        if (c > code_app_last || c < code_app_first) {
            continue;
        }
        if (c == code_unlisted_reason) {
            return false;
        }
        for (std::size_t j = i + 1; j < reason_table.size(); ++j) {
            if (reason_table[j].code == c || reason_table[j].reason == reason_table[i].reason) {
                return false;
            }
        }
    }
    return true;
}
static_assert(app_codes_are_unique_and_in_range());
static_assert(code_for_reason("no_fit") == -32003);

// Whether every name has its row in `table`.
template <std::size_t N, typename Table>
constexpr bool all_in(const std::array<std::string_view, N>& names, const Table& table) noexcept {
    for (const auto n : names) {
        if (index_in(table, n) == table.size()) {
            return false;
        }
    }
    return true;
}
// Every name in `reason` has its row (a name that is not in the table would
// go out with code_unlisted_reason), and every row its name.
static_assert(reason::all.size() == reason_table.size() && all_in(reason::all, reason_table),
              "every row of reason_table has its name in qrt::rpc::reason, and every name its row");

constexpr bool outcomes_are_unique() noexcept {
    for (std::size_t i = 0; i < outcome_table.size(); ++i) {
        for (std::size_t j = i + 1; j < outcome_table.size(); ++j) {
            if (outcome_table[i].reason == outcome_table[j].reason) {
                return false;
            }
        }
    }
    return true;
}
static_assert(outcomes_are_unique());

}  // namespace qrt::rpc
