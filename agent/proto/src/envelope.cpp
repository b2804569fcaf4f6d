#include "qrt/proto/envelope.hpp"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qrt/proto/table.hpp"

namespace qrt::proto {

using json = nlohmann::json;

bool says_openqasm3(std::string_view text) noexcept {
    std::size_t i = 0;
    while (i < text.size()) {
        if (std::isspace(static_cast<unsigned char>(text[i])) != 0) {
            ++i;
        } else if (text.substr(i, 2) == "//") {
            const auto nl = text.find('\n', i);
            i = nl == std::string_view::npos ? text.size() : nl + 1;
        } else if (text.substr(i, 2) == "/*") {
            const auto end = text.find("*/", i + 2);
            i = end == std::string_view::npos ? text.size() : end + 2;
        } else {
            break;
        }
    }
    constexpr std::string_view word = "OPENQASM";
    if (text.substr(i, word.size()) != word) {
        return false;
    }
    i += word.size();
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) {
        ++i;
    }
    return i < text.size() && text[i] == '3';
}

std::string_view json_kind(const json& j) noexcept {
    switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number with a fraction";
    case json::value_t::binary: return "binary data";
    case json::value_t::discarded: return "nothing";
    }
    return "a value";
}

std::variant<envelope_needs, envelope_error> check_envelope(const json& j) {
    const auto bad = [](std::string field, std::string why) { return envelope_error{std::move(field), std::move(why)}; };
    const json& format = j.at("format");
    if (!format.is_string()) {
        return bad("payload.format", fmt::format("format is {}; the one format qrtd knows is the string \"{}\"",
                                                 json_kind(format), envelope::format));
    }
    if (format.get_ref<const std::string&>() != envelope::format) {
        return bad("payload.format", fmt::format("format is not one qrtd knows (\"{}\")", envelope::format));
    }
    envelope_needs out;
    const auto shots = j.find("shots");
    if (shots == j.end() || !shots->is_number_integer()) {
        return bad("payload.shots", "shots must be an integer of 1 or more");
    }
    if (shots->is_number_unsigned()) {
        out.shots = shots->get<std::uint64_t>();
    }
    if (out.shots == 0) {
        return bad("payload.shots", "shots must be 1 or more");
    }
    const auto circuits = j.find("circuits");
    if (circuits == j.end() || !circuits->is_array() || circuits->empty()) {
        return bad("payload.circuits", "circuits must be a non-empty array of {name, qubits, qasm}");
    }
    if (circuits->size() > envelope::max_circuits) {
        return bad("payload.circuits",
                   fmt::format("{} circuits, at most {} per job", circuits->size(), envelope::max_circuits));
    }
    out.circuits = circuits->size();
    std::size_t i = 0;
    for (const json& c : *circuits) {
        const std::string at = fmt::format("payload.circuits[{}]", i);
        if (!c.is_object()) {
            return bad(at, fmt::format("circuits[{}] is {}, not an object", i, json_kind(c)));
        }
        const auto q = c.find("qubits");
        if (q == c.end() || !q->is_number_unsigned() || q->get<std::uint64_t>() == 0) {
            return bad(at + ".qubits", fmt::format("circuits[{}].qubits must be an integer of 1 or more", i));
        }
        out.qubits = std::max(out.qubits, q->get<std::uint64_t>());
        const auto qasm = c.find("qasm");
        if (qasm == c.end() || !qasm->is_string()) {
            return bad(at + ".qasm", fmt::format("circuits[{}].qasm must be a string of OpenQASM 3", i));
        }
        if (!says_openqasm3(qasm->get_ref<const std::string&>())) {
            return bad(at + ".qasm", fmt::format("circuits[{}].qasm is not OpenQASM 3: it must begin with \"{}\"", i,
                                                 envelope::qasm_header));
        }
        ++i;
    }
    return out;
}

}  // namespace qrt::proto
