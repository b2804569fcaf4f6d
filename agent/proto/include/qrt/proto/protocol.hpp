#pragma once
// Lookups over the protocol's one table (qrt/proto/table.hpp, generated from
// agent/proto/protocol.toml): a reason's JSON-RPC code and qrtctl exit
// status, a job outcome's row, a state's name and columns, the transitions
// between states, calibration block states, roles and methods.  Header-only and constexpr, so the
// agent, the clients and the tools use the same answers, and the checks
// below run at compile time.
//
// Every error object the server sends has this form:
//   {"code": -32005, "message": "<human text naming the field or method>",
//    "data": {"reason": "not_owner", ...optional details...}}
// Standard JSON-RPC 2.0 errors carry a reason too, so a client can always
// switch on data.reason alone.  A reason's spelling, code and exit status
// never change once released; new reasons are appended.

#include <cstddef>
#include <optional>
#include <string_view>

#include "qrt/proto/table.hpp"

namespace qrt::proto {

// The index of the row named `name` in `table`, or table.size().  By index,
// not pointer: gcc's -fsanitize=undefined instruments a pointer into a
// static table so that comparing it with nullptr is no longer a constant
// expression.
template <typename Table>
constexpr std::size_t index_in(const Table& table, std::string_view name) noexcept {
    for (std::size_t i = 0; i < table.size(); ++i) {
        if (table[i].name == name) {
            return i;
        }
    }
    return table.size();
}

template <typename Table>
constexpr const typename Table::value_type* find_in(const Table& table, std::string_view name) noexcept {
    const std::size_t i = index_in(table, name);
    return i < table.size() ? &table[i] : nullptr;
}

// ------------------------------------------------------------- reasons

// The row of a reason raised as an error, or nullptr.
constexpr const reason_row* find_reason(std::string_view name) noexcept {
    const std::size_t i = index_in(reasons, name);
    return i < reasons.size() && reasons[i].error ? &reasons[i] : nullptr;
}

// The row of a job outcome reason, or nullptr.
constexpr const reason_row* find_outcome(std::string_view name) noexcept {
    const std::size_t i = index_in(reasons, name);
    return i < reasons.size() && reasons[i].outcome != outcome_kind::none ? &reasons[i] : nullptr;
}

// The code for a reason; code_unlisted_reason when it is not raised as an
// error (a ledger reason the table does not know goes out verbatim with it).
// By index, not by pointer: comparing a pointer into the table with nullptr
// is not a constant expression under -fsanitize=address.
constexpr int code_for_reason(std::string_view name) noexcept {
    const std::size_t i = index_in(reasons, name);
    return i < reasons.size() && reasons[i].error ? reasons[i].code : code_unlisted_reason;
}

// qrtctl's exit status for any reason: the server's, then the client's own,
// else 1 (generic failure).
constexpr int exit_code_for_reason(std::string_view name) noexcept {
    const std::size_t s = index_in(reasons, name);
    if (s < reasons.size() && reasons[s].error) {
        return reasons[s].exit_code;
    }
    const std::size_t i = index_in(client_reasons, name);
    return i < client_reasons.size() ? client_reasons[i].exit_code : 1;
}

// The reason to assume when a (foreign) server omits data.reason: the first
// row with that code.
constexpr std::string_view default_reason_for_code(int code) noexcept {
    for (const auto& r : reasons) {
        if (r.error && r.code == code) {
            return r.name;
        }
    }
    return reason::internal_error;
}

// -------------------------------------------------------------- states

constexpr std::string_view to_string(state s) noexcept {
    return states[static_cast<std::size_t>(s)].name;
}

constexpr std::optional<state> state_from_string(std::string_view name) noexcept {
    const std::size_t i = index_in(states, name);
    if (i == states.size()) {
        return std::nullopt;
    }
    return static_cast<state>(i);
}

// held, committed and dispatched occupy QPU time.
constexpr bool is_active(state s) noexcept { return states[static_cast<std::size_t>(s)].active; }
constexpr bool is_terminal(state s) noexcept { return !is_active(s); }
// completed, failed, missed, sent: the job ended, job.finished goes out.
constexpr bool finishes_job(state s) noexcept { return states[static_cast<std::size_t>(s)].finishes_job; }
constexpr bool transition_allowed(state from, state to) noexcept {
    return (states[static_cast<std::size_t>(from)].next >> static_cast<unsigned>(to) & 1U) != 0;
}

// ---------------------------------------------- calibration blocks

constexpr std::string_view to_string(block_state s) noexcept {
    return block_states[static_cast<std::size_t>(s)].name;
}

constexpr std::optional<block_state> block_state_from_string(std::string_view name) noexcept {
    const std::size_t i = index_in(block_states, name);
    if (i == block_states.size()) {
        return std::nullopt;
    }
    return static_cast<block_state>(i);
}

// yielding, scheduled, started: a blackout in the timeline.
constexpr bool is_live(block_state s) noexcept { return block_states[static_cast<std::size_t>(s)].live; }

// --------------------------------------------------- roles and methods

constexpr std::string_view role_name(role r) noexcept {
    for (const auto& x : roles) {
        if (x.value == r) {
            return x.name;
        }
    }
    return "?";
}

constexpr std::optional<role> role_from_name(std::string_view name) noexcept {
    const std::size_t i = index_in(roles, name);
    if (i == roles.size()) {
        return std::nullopt;
    }
    return roles[i].value;
}

// The role a method requires, or nullopt for no such method.
constexpr std::optional<role> method_role(std::string_view name) noexcept {
    const std::size_t i = index_in(methods, name);
    if (i == methods.size()) {
        return std::nullopt;
    }
    return methods[i].required;
}

constexpr bool is_event(std::string_view name) noexcept { return index_in(events, name) < events.size(); }

// ----------------------------------------------- compile-time checks

namespace detail {
constexpr bool app_codes_are_unique_and_in_range() noexcept {
    for (std::size_t i = 0; i < reasons.size(); ++i) {
        if (!reasons[i].error) {
            continue;
        }
        const int c = reasons[i].code;
        if (c > code_app_last || c < code_app_first) {
            continue;
        }
        if (c == code_unlisted_reason) {
            return false;
        }
        for (std::size_t j = i + 1; j < reasons.size(); ++j) {
            if (reasons[j].error && reasons[j].code == c) {
                return false;
            }
        }
    }
    return true;
}
}  // namespace detail
static_assert(detail::app_codes_are_unique_and_in_range());
static_assert(code_for_reason(reason::no_fit) == -32003);
static_assert(transition_allowed(state::held, state::committed) &&
              !transition_allowed(state::completed, state::failed));
static_assert(is_live(block_state::yielding) && is_live(block_state::started) && !is_live(block_state::ended));
static_assert(finishes_job(state::sent), "a job on a write-only endpoint ends sent: job.finished goes out");

}  // namespace qrt::proto
