#pragma once
// Multi-agent placement (power-of-d, the structure qrt-fleet-sim found to
// win under limited sharing): ask d agents at once to hold a slot for one
// request under one idempotency key, keep the hold that starts first,
// release the others.  Shared by libqrt-client (qrt_place_best), and qrtctl
// (slots reserve with several --socket); tools/clients/python/src/qrt_client/__init__.py has the
// same algorithm in Python (place_best).
//
// Why hold-then-release rather than query-then-reserve: a held slot cannot
// be taken by another scheduler between the comparison and the reserve, so
// the winner is a slot the caller owns; the cost is that the losers' slots
// are held for one round trip (and, if a release is lost, until their lease
// runs out).
//
// Ties: the earlier start wins, then the earlier end, then the lower index
// (the order the caller listed the agents in), so the choice is
// deterministic.

#include <cstddef>
#include <optional>
#include <vector>

#include "connection.hpp"

namespace qrt::client {

inline constexpr std::size_t k_max_agents = 16;
// The reason of an agent whose answer to a retried key is a reservation in
// a state that holds nothing (released, expired, cancelled ...).
inline constexpr std::string_view not_held = "not_held";

struct placement {
    static constexpr std::size_t none = static_cast<std::size_t>(-1);
    std::size_t chosen = none;  // index into the agents
    json reservation;           // the chosen agent's slots.reserve result
    // Per agent: nullopt = it held a slot (the winner, or released), else
    // why it did not.
    std::vector<std::optional<call_error>> errors;
    // Per agent: a release that failed (its lease runs out by itself).
    std::vector<std::optional<call_error>> release_errors;
};

// reserve_params: the slots.reserve parameters, idempotency_key included.
// Requests are pipelined: every agent gets its request before any reply is
// awaited, so the call costs about one round trip to the slowest agent.
placement place_best(const std::vector<connection*>& agents, const json& reserve_params);

// The start and end of a slots.reserve result (a reservation, or a gang's
// first member), or nullopt when the reply has neither.
std::optional<std::pair<std::int64_t, std::int64_t>> slot_span(const json& reservation);

}  // namespace qrt::client
