// libqrtd-qdmi.so: a job's programs (qrtd_qdmi.hpp says which file holds
// what): what is checked before anything is sent, the job envelope of
// qrtd(8) they go out in, and the histograms that come back.  Whether a
// text is OpenQASM 3 and what an envelope must be are qrt_proto's
// (qrt/proto/envelope.hpp), the agent's own test at jobs.submit.

#include "qrtd_qdmi.hpp"

#include <variant>

#include "qrt/proto/envelope.hpp"
#include "qrt/proto/table.hpp"

namespace qrtd_qdmi {

namespace {

// Skip whitespace and comments of an OpenQASM text from pos.
std::size_t skip_blank(std::string_view t, std::size_t pos) {
    while (pos < t.size()) {
        if (t[pos] == ' ' || t[pos] == '\t' || t[pos] == '\r' || t[pos] == '\n') {
            ++pos;
        } else if (t.substr(pos, 2) == "//") {
            const std::size_t eol = t.find('\n', pos);
            pos = eol == std::string_view::npos ? t.size() : eol + 1;
        } else if (t.substr(pos, 2) == "/*") {
            const std::size_t end = t.find("*/", pos + 2);
            pos = end == std::string_view::npos ? t.size() : end + 2;
        } else {
            break;
        }
    }
    return pos;
}

bool read_counts(const json& counts, counts_t& out) {
    if (!counts.is_object()) {
        return false;
    }
    for (const auto& [k, v] : counts.items()) {
        if (!v.is_number_unsigned()) {
            return false;
        }
        out.emplace_back(k, v.get<std::size_t>());
    }
    return true;
}

}  // namespace

// What the program asks of the QPU before anything is sent: an OpenQASM 3
// header (as the agent tests it at jobs.submit, qrt::proto::says_openqasm3),
// and no more qubits than the QPU has (declared qubit registers, physical
// $k).  An empty string when it is acceptable, else why not.  qubits 0: the
// QPU states no qubit count.  *used: the qubits the program declares
// (registers, or the highest physical $k + 1; at least 1).
std::string check_program(std::string_view text, std::size_t qubits, std::size_t* used) {
    *used = 1;
    if (!qrt::proto::says_openqasm3(text)) {
        return "the program is not OpenQASM 3 (it must begin with '" +
               std::string(qrt::proto::envelope::qasm_header) + "')";
    }
    std::size_t declared = 0;
    std::size_t physical = 0;
    std::size_t line_no = 1;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\n') {
            ++line_no;
            continue;
        }
        const bool word_start = i == 0 || !(std::isalnum(static_cast<unsigned char>(text[i - 1])) ||
                                            text[i - 1] == '_');
        if (text[i] == '$') {
            std::size_t j = i + 1;
            while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) {
                ++j;
            }
            if (const auto k = number_of<std::size_t>(text.substr(i + 1, j - i - 1))) {
                physical = std::max(physical, *k + 1);
                if (qubits != 0 && *k >= qubits) {
                    return "line " + std::to_string(line_no) + ": physical qubit $" + std::to_string(*k) +
                           " does not exist (the QPU has " + std::to_string(qubits) + " qubits)";
                }
            }
        } else if (word_start && text.substr(i, 5) == "qubit") {
            std::size_t j = skip_blank(text, i + 5);
            std::size_t size = 1;
            if (j < text.size() && text[j] == '[') {
                const std::size_t close = text.find(']', j);
                const auto n = close == std::string_view::npos
                                   ? std::nullopt
                                   : number_of<std::size_t>(text.substr(j + 1, close - j - 1));
                if (!n) {
                    continue;  // a size the device cannot read here: the endpoint judges it
                }
                size = *n;
            } else if (j < text.size() && !std::isalpha(static_cast<unsigned char>(text[j])) &&
                       text[j] != '_') {
                continue;  // not a declaration
            }
            declared += size;
            if (qubits != 0 && declared > qubits) {
                return "line " + std::to_string(line_no) + ": the program declares " +
                       std::to_string(declared) + " qubits, the QPU has " + std::to_string(qubits);
            }
        }
    }
    *used = std::max<std::size_t>({*used, declared, physical});
    return {};
}

// The payload qrtd hands to the endpoint: the job envelope of qrtd(8)
// ("Job payloads"), {"format": "qasm3", "shots": N, "circuits": [{"name",
// "qubits", "qasm"}...]}, one circuit per program in input order, checked as
// the agent checks it at jobs.submit (qrt::proto::check_envelope): empty,
// with why, when it would be refused.
std::string make_payload(const std::vector<std::string>& programs, std::size_t shots, std::string* why) {
    json circuits = json::array();
    for (std::size_t i = 0; i < programs.size(); ++i) {
        std::size_t used = 1;
        (void)check_program(programs[i], 0, &used);
        circuits.push_back({{"name", "qdmi-" + std::to_string(i)}, {"qubits", used}, {"qasm", programs[i]}});
    }
    const json envelope{{"format", qrt::proto::envelope::format}, {"shots", shots}, {"circuits", std::move(circuits)}};
    const auto checked = qrt::proto::check_envelope(envelope);
    if (const auto* e = std::get_if<qrt::proto::envelope_error>(&checked)) {
        *why = e->why;
        return {};
    }
    return envelope.dump();
}

// The histograms of a result, one per program: the envelope's answer
// {"format": "qasm3-counts", "results": [{"name", "shots", "counts"}...]}
// (qpu-aer), or lines "bits count" (qpu-sim: one histogram).
bool parse_results(std::string_view bytes, std::vector<counts_t>& out) {
    const json j = json::parse(bytes.begin(), bytes.end(), nullptr, false);
    if (!j.is_discarded() && j.is_object()) {
        if (j.contains("results") && j["results"].is_array()) {
            for (const auto& r : j["results"]) {
                counts_t c;
                if (!r.is_object() || !r.contains("counts") || !read_counts(r["counts"], c)) {
                    return false;
                }
                out.push_back(std::move(c));
            }
            return !out.empty();
        }
        counts_t c;
        if (!j.contains("counts") || !read_counts(j["counts"], c)) {
            return false;
        }
        out.push_back(std::move(c));
        return true;
    }
    counts_t c;
    std::size_t pos = 0;
    while (pos < bytes.size()) {
        std::size_t eol = bytes.find('\n', pos);
        if (eol == std::string_view::npos) {
            eol = bytes.size();
        }
        const std::string_view line = bytes.substr(pos, eol - pos);
        pos = eol + 1;
        if (line.empty()) {
            continue;
        }
        const std::size_t sp = line.find(' ');
        if (sp == std::string_view::npos || sp == 0) {
            return false;
        }
        const auto n = number_of<std::size_t>(line.substr(sp + 1));
        const std::string_view key = line.substr(0, sp);
        if (!n || key.find_first_not_of("01") != std::string_view::npos) {
            return false;
        }
        c.emplace_back(std::string(key), *n);
    }
    out.push_back(std::move(c));
    return true;
}

}  // namespace qrtd_qdmi
