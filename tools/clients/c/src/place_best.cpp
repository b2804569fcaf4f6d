#include "place_best.hpp"

#include <cerrno>

#include "qrt/proto/protocol.hpp"

namespace qrt::client {

namespace {

const json& first_member(const json& r) {
    if (r.is_object() && r.contains("gang") && r["gang"].is_array() && !r["gang"].empty()) {
        return r["gang"][0];
    }
    return r;
}

}  // namespace

std::optional<std::pair<std::int64_t, std::int64_t>> slot_span(const json& reservation) {
    const json& m = first_member(reservation);
    if (!m.is_object() || !m.contains("start_ns") || !m.contains("end_ns") ||
        !m["start_ns"].is_number_integer() || !m["end_ns"].is_number_integer()) {
        return std::nullopt;
    }
    return std::make_pair(m["start_ns"].get<std::int64_t>(), m["end_ns"].get<std::int64_t>());
}

placement place_best(const std::vector<connection*>& agents, const json& reserve_params) {
    placement out;
    out.errors.resize(agents.size());
    out.release_errors.resize(agents.size());
    std::vector<std::uint64_t> ids(agents.size(), 0);
    std::vector<json> held(agents.size());
    // Every request out first, then the replies.
    for (std::size_t i = 0; i < agents.size(); ++i) {
        if (agents[i] == nullptr) {
            out.errors[i] = call_error{0, EINVAL, std::string(local_reason::client_error),
                                       "agent " + std::to_string(i) + " is NULL", nullptr};
            continue;
        }
        ids[i] = agents[i]->send_request("slots.reserve", reserve_params);
        if (auto e = agents[i]->flush()) {
            out.errors[i] = std::move(*e);
        }
    }
    for (std::size_t i = 0; i < agents.size(); ++i) {
        if (out.errors[i]) {
            continue;
        }
        reply r = agents[i]->wait_reply(ids[i]);
        if (!r) {
            out.errors[i] = r.error();
            continue;
        }
        if (!slot_span(r.result())) {
            out.errors[i] = call_error{0, EPROTO, std::string(local_reason::protocol_error),
                                       "slots.reserve reply has no start_ns/end_ns", nullptr};
            continue;
        }
        // A retry with the same key returns what the key got the first time,
        // in its current state: a hold released (the loser of that try) or
        // expired holds nothing.
        const std::string state_name = first_member(r.result()).value("state", std::string());
        using proto::state;
        const auto st = proto::state_from_string(state_name);
        if (!st || (*st != state::held && *st != state::committed && *st != state::dispatched &&
                    *st != state::sent && *st != state::completed)) {
            out.errors[i] = call_error{0, ESTALE, std::string(not_held),
                                       "this idempotency key's reservation is " + state_name, nullptr};
            continue;
        }
        held[i] = std::move(r).result();
    }
    for (std::size_t i = 0; i < agents.size(); ++i) {
        if (out.errors[i]) {
            continue;
        }
        if (out.chosen == placement::none || *slot_span(held[i]) < *slot_span(held[out.chosen])) {
            out.chosen = i;
        }
    }
    // Release the losers (pipelined too).
    std::vector<std::uint64_t> rel(agents.size(), 0);
    for (std::size_t i = 0; i < agents.size(); ++i) {
        if (out.errors[i] || i == out.chosen) {
            continue;
        }
        const json& m = first_member(held[i]);
        rel[i] = agents[i]->send_request(
            "slots.release", json{{"reservation_id", m.value("reservation_id", std::uint64_t{0})},
                                  {"fencing_token", m.value("fencing_token", std::uint64_t{0})}});
        if (auto e = agents[i]->flush()) {
            out.release_errors[i] = std::move(*e);
            rel[i] = 0;
        }
    }
    for (std::size_t i = 0; i < agents.size(); ++i) {
        if (rel[i] == 0) {
            continue;
        }
        reply r = agents[i]->wait_reply(rel[i]);
        if (!r) {
            out.release_errors[i] = r.error();
        }
    }
    if (out.chosen != placement::none) {
        out.reservation = std::move(held[out.chosen]);
    }
    return out;
}

}  // namespace qrt::client
