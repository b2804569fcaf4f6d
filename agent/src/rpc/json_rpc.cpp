#include "qrt/rpc/json_rpc.hpp"

#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace qrt::rpc {

rpc_failure::rpc_failure(std::string reason, std::string message, json details)
    : _code(code_for_reason(reason)),
      _reason(std::move(reason)),
      _message(std::move(message)),
      _details(details.is_object() ? std::move(details) : json::object()) {}

rpc_failure::rpc_failure(int code, std::string reason, std::string message, json details)
    : _code(code),
      _reason(std::move(reason)),
      _message(std::move(message)),
      _details(details.is_object() ? std::move(details) : json::object()) {}

json rpc_failure::to_json() const {
    json data = _details;
    data["reason"] = _reason;
    return json{{"code", _code}, {"message", _message}, {"data", std::move(data)}};
}

rpc_failure invalid_params(std::string_view field, std::string message) {
    return rpc_failure("invalid_params", std::move(message), json{{"field", std::string(field)}});
}

json make_result_reply(const json& id, json result) {
    return json{{"jsonrpc", "2.0"}, {"result", std::move(result)}, {"id", id}};
}

json make_error_reply(const json& id, const rpc_failure& f) {
    return json{{"jsonrpc", "2.0"}, {"error", f.to_json()}, {"id", id}};
}

json make_notification(std::string_view method, json params) {
    return json{{"jsonrpc", "2.0"}, {"method", std::string(method)}, {"params", std::move(params)}};
}

std::string to_line(const json& j) {
    std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
    s.push_back('\n');
    return s;
}

namespace {

// nlohmann's own text for a string that needs no escaping and no UTF-8
// check: printable ASCII without '"' or '\\'.  Anything else goes to
// json::dump, which escapes and replaces invalid UTF-8.
bool plain_ascii(std::string_view s) noexcept {
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
            return false;
        }
    }
    return true;
}

template <typename Int>
void append_integer(std::string& out, Int v) {
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, static_cast<std::size_t>(r.ptr - buf));  // (pointer, size): no temporary string
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
    if (plain_ascii(s)) {
        out += '"';
        out += s;
        out += '"';
    } else {
        out += json(s).dump(-1, ' ', false, json::error_handler_t::replace);
    }
}

void append_json_int(std::string& out, std::int64_t v) {
    append_integer(out, v);
}

void append_json_uint(std::string& out, std::uint64_t v) {
    append_integer(out, v);
}

// nlohmann's number layout (its to_chars/format_buffer, with the exponent
// range of a double: -4 < n <= 15 is written without one) applied to the
// shortest digits std::to_chars gives in scientific form "d.ddde+XX".
void append_json_double(std::string& out, double v) {
    if (!std::isfinite(v)) {
        out += "null";
        return;
    }
    if (std::signbit(v)) {
        out += '-';
        v = -v;
    }
    if (v == 0.0) {
        out += "0.0";
        return;
    }
    char sci[32];
    const auto r = std::to_chars(sci, sci + sizeof sci, v, std::chars_format::scientific);
    // Digits without the point, and the exponent of the first one.
    char digits[20];
    int k = 0;
    const char* p = sci;
    for (; p < r.ptr && *p != 'e'; ++p) {
        if (*p != '.') {
            digits[k++] = *p;
        }
    }
    int exp10 = 0;
    std::from_chars(p + 1 + (p[1] == '+' ? 1 : 0), r.ptr, exp10);
    const int n = exp10 + 1;  // where the decimal point goes, from the first digit
    constexpr int min_exp = -4;
    constexpr int max_exp = std::numeric_limits<double>::digits10;
    if (k <= n && n <= max_exp) {  // digits[000].0
        out.append(digits, static_cast<std::size_t>(k));
        out.append(static_cast<std::size_t>(n - k), '0');
        out += ".0";
    } else if (0 < n && n <= max_exp) {  // dig.its
        out.append(digits, static_cast<std::size_t>(n));
        out += '.';
        out.append(digits + n, static_cast<std::size_t>(k - n));
    } else if (min_exp < n && n <= 0) {  // 0.[000]digits
        out += "0.";
        out.append(static_cast<std::size_t>(-n), '0');
        out.append(digits, static_cast<std::size_t>(k));
    } else {  // d[.igits]e+XX, at least two exponent digits
        out += digits[0];
        if (k > 1) {
            out += '.';
            out.append(digits + 1, static_cast<std::size_t>(k - 1));
        }
        const int e = n - 1;
        out += e < 0 ? "e-" : "e+";
        const int a = e < 0 ? -e : e;
        if (a < 10) {
            out += '0';
        }
        append_integer(out, a);
    }
}

// Through nlohmann's public API only (not its detail::serializer, which a
// new nlohmann release may change without notice).
// json::dump returns a new string, so the values whose text is fixed by the
// JSON grammar alone (integers, booleans, null, plain ASCII strings, and
// doubles in nlohmann's layout around std::to_chars' shortest digits) and
// the structure of arrays and objects are written straight into `out`;
// strings that need escaping are nlohmann's dump.  Byte for byte
// json::dump(-1, ' ', false, replace) but for the rare doubles where Grisu2
// does not give the shortest digits (see append_json_double): json_rpc_test
// checks both, and bench_json_dump measured it against the detail serializer.
void dump_to(std::string& out, const json& j) {
    switch (j.type()) {
        case json::value_t::null:
            out += "null";
            return;
        case json::value_t::boolean:
            out += j.get<bool>() ? "true" : "false";
            return;
        case json::value_t::number_integer:
            append_integer(out, j.get<std::int64_t>());
            return;
        case json::value_t::number_unsigned:
            append_integer(out, j.get<std::uint64_t>());
            return;
        case json::value_t::string:
            append_json_string(out, j.get_ref<const std::string&>());
            return;
        case json::value_t::object: {
            out += '{';
            bool first = true;
            for (auto it = j.begin(); it != j.end(); ++it) {
                if (!first) {
                    out += ',';
                }
                first = false;
                append_json_string(out, it.key());
                out += ':';
                dump_to(out, it.value());
            }
            out += '}';
            return;
        }
        case json::value_t::array: {
            out += '[';
            bool first = true;
            for (const auto& v : j) {
                if (!first) {
                    out += ',';
                }
                first = false;
                dump_to(out, v);
            }
            out += ']';
            return;
        }
        case json::value_t::number_float:
            append_json_double(out, j.get<double>());
            return;
        default:  // binary, discarded: nlohmann's own text
            out += j.dump(-1, ' ', false, json::error_handler_t::replace);
            return;
    }
}

// nlohmann objects keep their members sorted: "id" < "jsonrpc" < "result",
// and "error" < "id" < "jsonrpc".
void append_result_reply(std::string& out, const json& id, const json& result) {
    out += R"({"id":)";
    dump_to(out, id);
    out += R"(,"jsonrpc":"2.0","result":)";
    dump_to(out, result);
    out += '}';
}

void append_result_reply_text(std::string& out, const json& id, std::string_view result_text) {
    out += R"({"id":)";
    dump_to(out, id);
    out += R"(,"jsonrpc":"2.0","result":)";
    out += result_text;
    out += '}';
}

void append_error_reply(std::string& out, const json& id, const rpc_failure& f) {
    out += R"({"error":)";
    dump_to(out, f.to_json());
    out += R"(,"id":)";
    dump_to(out, id);
    out += R"(,"jsonrpc":"2.0"})";
}

bool nesting_exceeds(std::string_view text, std::size_t max_depth) noexcept {
    std::size_t depth = 0;
    bool in_string = false;
    bool escaped = false;
    for (const char c : text) {
        if (in_string) {
            if (escaped) {
                escaped = false;
            } else if (c == '\\') {
                escaped = true;
            } else if (c == '"') {
                in_string = false;
            }
            continue;
        }
        switch (c) {
            case '"':
                in_string = true;
                break;
            case '[':
            case '{':
                if (++depth > max_depth) {
                    return true;
                }
                break;
            case ']':
            case '}':
                if (depth > 0) {
                    --depth;
                }
                break;
            default:
                break;
        }
    }
    return false;
}

// ---- params_reader -------------------------------------------------------

namespace {
const json& empty_object() {
    static const json e = json::object();
    return e;
}

std::string type_name(const json& v) {
    if (v.is_number_integer()) {
        return "integer";
    }
    if (v.is_number_float()) {
        return "number";
    }
    return v.type_name();
}
}  // namespace

params_reader::params_reader(const json& params, std::initializer_list<std::string_view> allowed)
    : _p(params.is_null() ? empty_object() : params) {
    if (!_p.is_object()) {
        throw invalid_params("params", fmt::format("params must be an object of named parameters, "
                                                   "got {}",
                                                   type_name(_p)));
    }
    for (const auto& [key, value] : _p.items()) {
        bool known = false;
        for (const auto a : allowed) {
            if (a == key) {
                known = true;
                break;
            }
        }
        if (!known) {
            std::string list;
            for (const auto a : allowed) {
                list += list.empty() ? "" : ", ";
                list += a;
            }
            throw invalid_params(key, fmt::format("unknown parameter '{}' (accepted: {})", key,
                                                  list.empty() ? "none" : list));
        }
    }
}

const json* params_reader::find(std::string_view name) const {
    auto it = _p.find(name);
    return it == _p.end() ? nullptr : &*it;
}

bool params_reader::has(std::string_view name) const { return find(name) != nullptr; }

const json& params_reader::require(std::string_view name) const {
    const json* v = find(name);
    if (v == nullptr) {
        throw invalid_params(name, fmt::format("missing required parameter '{}'", name));
    }
    return *v;
}

const json& params_reader::raw(std::string_view name) const { return require(name); }

std::int64_t params_reader::i64(std::string_view name, std::int64_t min, std::int64_t max) const {
    const json& v = require(name);
    if (!v.is_number_integer()) {
        throw invalid_params(name, fmt::format("parameter '{}' must be an integer, got {}", name,
                                               type_name(v)));
    }
    bool in_range = false;
    std::int64_t out = 0;
    if (v.is_number_unsigned()) {
        const auto u = v.get<std::uint64_t>();
        if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
            out = static_cast<std::int64_t>(u);
            in_range = out >= min && out <= max;
        }
    } else {
        out = v.get<std::int64_t>();
        in_range = out >= min && out <= max;
    }
    if (!in_range) {
        throw invalid_params(name, fmt::format("parameter '{}' = {} is out of range [{}, {}]", name,
                                               v.dump(), min, max));
    }
    return out;
}

std::optional<std::int64_t> params_reader::opt_i64(std::string_view name, std::int64_t min,
                                                   std::int64_t max) const {
    const json* v = find(name);
    if (v == nullptr || v->is_null()) {
        return std::nullopt;
    }
    return i64(name, min, max);
}

double params_reader::number(std::string_view name, double min, double max) const {
    const json& v = require(name);
    if (!v.is_number()) {
        throw invalid_params(name, fmt::format("parameter '{}' must be a number, got {}", name,
                                               type_name(v)));
    }
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < min || d > max) {
        throw invalid_params(name, fmt::format("parameter '{}' = {} is out of range [{}, {}]", name,
                                               v.dump(), min, max));
    }
    return d;
}

std::optional<double> params_reader::opt_number(std::string_view name, double min,
                                                double max) const {
    const json* v = find(name);
    if (v == nullptr || v->is_null()) {
        return std::nullopt;
    }
    return number(name, min, max);
}

std::string params_reader::str(std::string_view name, std::size_t max_len) const {
    const json& v = require(name);
    if (!v.is_string()) {
        throw invalid_params(name, fmt::format("parameter '{}' must be a string, got {}", name,
                                               type_name(v)));
    }
    const auto& s = v.get_ref<const std::string&>();
    if (s.size() > max_len) {
        throw invalid_params(name, fmt::format("parameter '{}' is {} bytes long, at most {} allowed",
                                               name, s.size(), max_len));
    }
    return s;
}

std::optional<std::string> params_reader::opt_str(std::string_view name,
                                                  std::size_t max_len) const {
    const json* v = find(name);
    if (v == nullptr || v->is_null()) {
        return std::nullopt;
    }
    return str(name, max_len);
}

bool params_reader::boolean(std::string_view name) const {
    const json& v = require(name);
    if (!v.is_boolean()) {
        throw invalid_params(name, fmt::format("parameter '{}' must be a boolean, got {}", name,
                                               type_name(v)));
    }
    return v.get<bool>();
}

std::optional<bool> params_reader::opt_bool(std::string_view name) const {
    const json* v = find(name);
    if (v == nullptr || v->is_null()) {
        return std::nullopt;
    }
    return boolean(name);
}

std::vector<std::string> params_reader::str_array(std::string_view name, std::size_t max_items,
                                                  std::size_t max_len) const {
    const json& v = require(name);
    if (!v.is_array()) {
        throw invalid_params(name, fmt::format("parameter '{}' must be an array of strings, got {}",
                                               name, type_name(v)));
    }
    if (v.size() > max_items) {
        throw invalid_params(name, fmt::format("parameter '{}' has {} items, at most {} allowed",
                                               name, v.size(), max_items));
    }
    std::vector<std::string> out;
    out.reserve(v.size());
    for (const auto& item : v) {
        if (!item.is_string() || item.get_ref<const std::string&>().size() > max_len) {
            throw invalid_params(name, fmt::format("parameter '{}' must hold strings of at most {} "
                                                   "bytes",
                                                   name, max_len));
        }
        out.push_back(item.get<std::string>());
    }
    return out;
}

}  // namespace qrt::rpc
