// The JSON payloads of the wire's version 2 (qrt/proto/wire_v2.hpp).
#include "qrt/proto/wire_v2.hpp"

#include <nlohmann/json.hpp>

#include <limits>
#include <sstream>

#include "qrt/proto/table.hpp"

namespace qrt::wire {

namespace {

using nlohmann::json;
namespace cap = qrt::proto::capability;

constexpr std::size_t max_session = 128;

rtcore::error bad(std::string what) { return rtcore::error::invalid("endpoint HELLO: " + std::move(what)); }

bool is_int(const json& v) { return v.is_number_integer() || v.is_number_unsigned(); }

}  // namespace

rtcore::result<capabilities> parse_capabilities(std::string_view text) {
    const json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
        return bad("the capabilities are not a JSON object");
    }
    capabilities c;
    auto str = [&](std::string_view key, std::string& out) -> bool {
        auto it = j.find(std::string(key));
        if (it == j.end()) {
            return true;
        }
        if (!it->is_string()) {
            return false;
        }
        out = it->get<std::string>();
        return true;
    };
    auto i64 = [&](std::string_view key, std::int64_t& out, std::int64_t hi) -> bool {
        auto it = j.find(std::string(key));
        if (it == j.end()) {
            return true;
        }
        if (!is_int(*it) || (it->is_number_integer() && it->get<std::int64_t>() < 0) ||
            (it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(hi))) {
            return false;
        }
        out = it->get<std::int64_t>();
        return out <= hi;
    };
    for (const auto key : {cap::identity, cap::session, cap::start}) {
        std::string dummy;
        if (!str(key, dummy)) {
            return bad(std::string(key) + " is not a string");
        }
    }
    str(cap::identity, c.identity);
    str(cap::session, c.session);
    std::string start = "on_fire";
    str(cap::start, start);
    if (start != "on_fire" && start != "own_clock") {
        return bad("start is \"" + start.substr(0, 32) + "\"; give on_fire or own_clock");
    }
    c.own_clock = start == "own_clock";
    auto tp = j.find(std::string(cap::two_phase));
    if (tp == j.end() || !tp->is_boolean()) {
        return bad("two_phase is missing or not a bool");
    }
    c.two_phase = tp->get<bool>();
    std::int64_t max_armed = 0;
    if (!i64(cap::max_armed, max_armed, std::numeric_limits<std::uint32_t>::max())) {
        return bad("max_armed is not a u32");
    }
    c.max_armed = static_cast<std::uint32_t>(max_armed);
    if (!i64(cap::horizon_ns, c.horizon_ns, std::numeric_limits<std::int64_t>::max())) {
        return bad("horizon_ns is not a non-negative i64");
    }
    if (!i64(cap::min_lead_ns, c.min_lead_ns, std::numeric_limits<std::int64_t>::max())) {
        return bad("min_lead_ns is not a non-negative i64");
    }
    if (c.session.empty() || c.session.size() > max_session) {
        return bad("session is missing, empty or longer than 128 bytes");
    }
    return c;
}

std::string capabilities_json(const capabilities& c) {
    json j = json::object();
    j[std::string(cap::identity)] = c.identity;
    j[std::string(cap::two_phase)] = c.two_phase;
    j[std::string(cap::max_armed)] = c.max_armed;
    j[std::string(cap::horizon_ns)] = c.horizon_ns;
    j[std::string(cap::min_lead_ns)] = c.min_lead_ns;
    j[std::string(cap::start)] = c.own_clock ? "own_clock" : "on_fire";
    j[std::string(cap::session)] = c.session;
    return j.dump();
}

std::string fire_hello_json(std::string_view session) {
    json j = json::object();
    j[std::string(cap::channel)] = "fire";
    j[std::string(cap::session)] = std::string(session);
    return j.dump();
}

rtcore::result<std::string> parse_fire_hello(std::string_view text) {
    const json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
        return rtcore::error::invalid("fire HELLO: not a JSON object");
    }
    auto ch = j.find(std::string(cap::channel));
    auto se = j.find(std::string(cap::session));
    if (ch == j.end() || !ch->is_string() || ch->get<std::string>() != "fire" || se == j.end() ||
        !se->is_string()) {
        return rtcore::error::invalid(R"(fire HELLO: must be {"channel": "fire", "session": ...})");
    }
    return se->get<std::string>();
}

std::string agent_identity(std::string_view version, unsigned qpu, bool offer_v2) {
    std::string s = "qrtd " + std::string(version) + " qpu=" + std::to_string(qpu);
    if (offer_v2) {
        s += " wire=2";
    }
    return s;
}

bool offers_v2(std::string_view identity) {
    std::istringstream in{std::string(identity)};
    std::string tok;
    while (in >> tok) {
        if (tok == "wire=2") {
            return true;
        }
    }
    return false;
}

rtcore::result<armed_cost> parse_armed(std::string_view text) {
    armed_cost c;
    if (text.empty()) {
        return c;  // no cost said: the agent measures ARM -> ARMED itself
    }
    const json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
        return rtcore::error::invalid("ARMED: the payload is not a JSON object");
    }
    if (auto d = j.find("program_duration_ns"); d != j.end()) {
        if (!is_int(*d) || (d->is_number_integer() && d->get<std::int64_t>() < 0)) {
            return rtcore::error::invalid("ARMED: program_duration_ns is not a non-negative integer");
        }
        c.program_duration_ns = d->get<std::int64_t>();
    }
    auto st = j.find("stages");
    if (st == j.end()) {
        return c;
    }
    if (!st->is_array() || st->size() > 64) {
        return rtcore::error::invalid("ARMED: stages is not an array of at most 64 entries");
    }
    for (const auto& e : *st) {
        if (!e.is_object()) {
            return rtcore::error::invalid("ARMED: a stage is not an object");
        }
        auto n = e.find("name");
        auto ns = e.find("ns");
        if (n == e.end() || !n->is_string() || ns == e.end() || !is_int(*ns) ||
            (ns->is_number_integer() && ns->get<std::int64_t>() < 0) ||
            (ns->is_number_unsigned() && ns->get<std::uint64_t>() > (std::uint64_t{1} << 62))) {
            return rtcore::error::invalid("ARMED: a stage needs a string name and a non-negative integer ns");
        }
        const auto name = n->get<std::string>();
        const auto v = ns->get<std::int64_t>();
        std::size_t k = 0;
        while (k < qrt::proto::wire_stages.size() && qrt::proto::wire_stages[k] != name) {
            ++k;
        }
        std::int64_t& slot = k < c.by_stage.size() ? c.by_stage[k] : c.other_ns;
        if (slot > (std::int64_t{1} << 62) - v) {
            return rtcore::error::invalid("ARMED: the stages add up past 2^62 ns");
        }
        slot += v;
    }
    return c;
}

std::string armed_json(const armed_cost& c) {
    json stages = json::array();
    for (std::size_t k = 1; k < c.by_stage.size(); ++k) {
        if (c.by_stage[k] != 0) {
            stages.push_back({{"name", std::string(qrt::proto::wire_stages[k])}, {"ns", c.by_stage[k]}});
        }
    }
    return json{{"stages", stages}, {"program_duration_ns", c.program_duration_ns}}.dump();
}

}  // namespace qrt::wire
