#pragma once
// JSON-RPC 2.0 building blocks shared by the request engine and the method
// handlers: the failure type, reply builders, the nesting pre-scan, and a
// strict reader for named params.
//
// Params policy (documented for clients): params must be an object (by-name);
// a member the method does not know is REJECTED with -32602 invalid_params
// naming the member, so a typo ("deadline" for "deadline_ns") is never
// silently ignored.  Integers must be JSON integers within the stated range:
// 1e3, 1.5, 1e400 and integers beyond int64 are rejected, naming the field.

#include <cstdint>
#include <exception>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "qrt/rpc/errors.hpp"
#include "rtcore/base64.hpp"

namespace qrt::rpc {

using json = nlohmann::json;

// Thrown by param readers and method handlers (the control plane may throw;
// the engine catches it and answers with an error object).
class rpc_failure : public std::exception {
public:
    // code is taken from the reason table (code_unlisted_reason if unlisted).
    rpc_failure(std::string reason, std::string message, json details = json::object());
    rpc_failure(int code, std::string reason, std::string message,
                json details = json::object());

    int code() const noexcept { return _code; }
    const std::string& reason() const noexcept { return _reason; }
    const std::string& message() const noexcept { return _message; }
    const json& details() const noexcept { return _details; }
    const char* what() const noexcept override { return _message.c_str(); }

    // {"code":..,"message":..,"data":{"reason":..,<details>}}
    json to_json() const;

private:
    int _code;
    std::string _reason;
    std::string _message;
    json _details;
};

// -32602 invalid_params with data.field = field.
rpc_failure invalid_params(std::string_view field, std::string message);

json make_result_reply(const json& id, json result);
json make_error_reply(const json& id, const rpc_failure& f);
json make_notification(std::string_view method, json params);

// Serialise one reply or notification as a line ("...\n").  Strings the
// server received were validated as UTF-8 by the parser; any invalid byte
// that still slips in is replaced (U+FFFD), never thrown.
std::string to_line(const json& j);

// The same serialisation (compact, invalid UTF-8 replaced), appended to
// `out` without an intermediate string.
void dump_to(std::string& out, const json& j);

// One scalar written straight into `out`, as dump_to writes it, for replies
// built without a json tree.  Strings: printable ASCII is copied, anything
// else is nlohmann's escaping (invalid UTF-8 replaced).  Integers: their
// decimal digits.  Doubles: nlohmann's layout ("1.0", "0.25", "1e-05",
// "1.5e+300"; NaN and infinities as null) around the shortest digits that
// read back as the same double (std::to_chars).  nlohmann's Grisu2 finds
// the same digits but for rare values where it gives one digit more or
// another digit string of the same length; both parse to the same double.
void append_json_string(std::string& out, std::string_view s);
void append_json_double(std::string& out, double v);
void append_json_int(std::string& out, std::int64_t v);
void append_json_uint(std::string& out, std::uint64_t v);

// The writer for a scalar's C++ type: bool, integers, floating point, or
// anything a string_view is made from.
template <typename T>
void append_json_value(std::string& out, const T& v) {
    if constexpr (std::is_same_v<T, bool>) {
        out += v ? "true" : "false";
    } else if constexpr (std::is_floating_point_v<T>) {
        append_json_double(out, static_cast<double>(v));
    } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
        append_json_int(out, static_cast<std::int64_t>(v));
    } else if constexpr (std::is_integral_v<T>) {
        append_json_uint(out, static_cast<std::uint64_t>(v));
    } else {
        append_json_string(out, std::string_view(v));
    }
}

// Reply objects written straight into `out` (no '\n'), byte for byte what
// dump_to(make_result_reply(id, result)) / make_error_reply would give
// (members in nlohmann's sorted order), without building the reply tree.
// `result_text` must already be one serialised JSON value.
void append_result_reply(std::string& out, const json& id, const json& result);
void append_result_reply_text(std::string& out, const json& id, std::string_view result_text);
void append_error_reply(std::string& out, const json& id, const rpc_failure& f);

// True when `text` nests arrays/objects deeper than max_depth (strings and
// escapes are skipped).  Run before parsing so a line of a million '[' costs
// one linear scan and no allocation.
bool nesting_exceeds(std::string_view text, std::size_t max_depth) noexcept;

// A strict reader of one request's named params.
class params_reader {
public:
    // params may be null/absent (treated as {}); anything but an object, or
    // any member outside `allowed`, throws invalid_params.
    params_reader(const json& params, std::initializer_list<std::string_view> allowed);

    bool has(std::string_view name) const;

    std::int64_t i64(std::string_view name, std::int64_t min, std::int64_t max) const;
    std::optional<std::int64_t> opt_i64(std::string_view name, std::int64_t min,
                                        std::int64_t max) const;
    double number(std::string_view name, double min, double max) const;
    std::optional<double> opt_number(std::string_view name, double min, double max) const;
    std::string str(std::string_view name, std::size_t max_len = 256) const;
    std::optional<std::string> opt_str(std::string_view name, std::size_t max_len = 256) const;
    bool boolean(std::string_view name) const;
    std::optional<bool> opt_bool(std::string_view name) const;
    std::vector<std::string> str_array(std::string_view name, std::size_t max_items,
                                       std::size_t max_len = 256) const;
    // The raw member (throws invalid_params when missing).
    const json& raw(std::string_view name) const;
    const json& object() const noexcept { return _p; }

private:
    const json* find(std::string_view name) const;
    const json& require(std::string_view name) const;

    const json& _p;
};

// The standard base64 alphabet with '=' padding, strictly: no whitespace, no
// URL-safe characters, length a multiple of 4, padding only at the end, and
// zero unused bits.  Returns nullopt on any deviation.
// (rtcore's, shared with libqrt-client.)
inline std::optional<std::string> base64_decode_strict(std::string_view in) {
    return rtcore::base64_decode(in);
}
using rtcore::base64_encode;

}  // namespace qrt::rpc
