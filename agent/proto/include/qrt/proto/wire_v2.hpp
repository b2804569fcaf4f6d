#pragma once
// The JSON payloads of the wire's version 2 (agent/proto/protocol.toml,
// [wire]): the endpoint's HELLO capabilities, the fire connection's HELLO,
// ARMED's cost by stage, and the agent's version-1 HELLO identity that offers
// version 2.  Housekeeping side (they allocate); the keys are the table's
// (qrt/proto/table.hpp, capability::*; wire_stages).
//
// A malformed payload is an error naming the key and what was wrong, never
// an exception: the link answers it by dropping the connection with
// endpoint_protocol_error.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "qrt/proto/wire.h"
#include "rtcore/error.hpp"

namespace qrt::wire {

// What a version-2 endpoint said of itself in its HELLO.
struct capabilities {
    std::string identity;
    bool two_phase = false;
    std::uint32_t max_armed = 0;    // 0: not said (the agent then holds one armed job at a time)
    std::int64_t horizon_ns = 0;    // 0: not said (no limit but the agent's own plan horizon)
    std::int64_t min_lead_ns = 0;   // the least ARM-to-fire_at it needs, as it states it
    bool own_clock = false;         // start = "own_clock": it starts at fire_at on its own time base
    std::string session;            // names the control connection
};

// The HELLO payload of a version-2 control connection.  Required: two_phase
// and session (a non-empty string of at most 128 bytes); the rest optional,
// each of the table's type; unknown keys are ignored (a later version may
// add some).
rtcore::result<capabilities> parse_capabilities(std::string_view json);
// The inverse (qpu-sim, tests): the payload, at most QRT_WIRE_V2_MAX_HELLO_PAYLOAD.
std::string capabilities_json(const capabilities& c);

// The agent's HELLO on the fire connection: {"channel": "fire", "session": S}.
std::string fire_hello_json(std::string_view session);
// Parses it (qpu-sim): the session, or an error.
rtcore::result<std::string> parse_fire_hello(std::string_view json);

// The agent's version-1 HELLO identity: "qrtd <version> qpu=<n>", plus
// " wire=2" when it offers version 2.
std::string agent_identity(std::string_view version, unsigned qpu, bool offer_v2);
// Whether an identity offers version 2 (its whitespace-separated "wire=2").
bool offers_v2(std::string_view identity);

// ARMED's payload: the endpoint's own cost by stage (ns; by the table's
// stage values, unknown stage names counted in `other_ns`) and the compiled
// program's duration (0 when not said).
struct armed_cost {
    std::array<std::int64_t, QRT_WIRE_STAGE_LAST + 1> by_stage{};
    std::int64_t other_ns = 0;
    std::int64_t program_duration_ns = 0;
    std::int64_t total_ns() const noexcept {
        std::int64_t t = other_ns;
        for (const auto v : by_stage) {
            t += v;
        }
        return t;
    }
};
rtcore::result<armed_cost> parse_armed(std::string_view json);
std::string armed_json(const armed_cost& c);

}  // namespace qrt::wire
