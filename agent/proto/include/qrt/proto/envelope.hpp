#pragma once
// The job envelope of qrtd(8), "JOB PAYLOADS": a JSON object
//   {"format": "qasm3", "shots": N, "circuits": [{"name", "qubits", "qasm"}]}
// that the agent checks at jobs.submit, the QDMI device library and the
// Qiskit backend write, and the endpoints (qpu-aer, the control-stack
// endpoints) read.  What can be checked without parsing OpenQASM: the
// envelope's shape, and that each program says it is OpenQASM 3.  The
// names and limits are the protocol table's (qrt::proto::envelope).
//
// Error messages name the field and what it must be; they never quote a
// value of the payload (it is the tenant's, and may be large or deep).

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json_fwd.hpp>

namespace qrt::proto {

// "OPENQASM 3" after blanks and // or /* */ comments.
bool says_openqasm3(std::string_view text) noexcept;

// What a well-formed envelope asks of a QPU.
struct envelope_needs {
    std::uint64_t qubits = 0;  // the widest circuit's
    std::uint64_t shots = 0;
    std::size_t circuits = 0;
};

struct envelope_error {
    std::string field;  // "payload.circuits[3].qasm"
    std::string why;    // "circuits[3].qasm is not OpenQASM 3: it must begin with \"OPENQASM 3\""
};

// The envelope's needs, or what is wrong with it.  `j` is a decoded JSON
// object that has a "format" member (anything else is an opaque payload,
// which the caller passes on unchecked).
std::variant<envelope_needs, envelope_error> check_envelope(const nlohmann::json& j);

// The JSON type of a value, in words ("an object", "a string"), for messages
// that must name what was given without quoting it.
std::string_view json_kind(const nlohmann::json& j) noexcept;

}  // namespace qrt::proto
