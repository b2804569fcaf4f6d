#pragma once
// How the engine reads a request line (engine.cpp's only): one request, the
// usual line, is read through nlohmann's SAX interface into a request_view
// -- "jsonrpc" compared where it lies, "method" kept as a string, only "id"
// and "params" built as documents -- instead of a document for the whole
// envelope that is built, walked member by member and freed for every
// request.  The nesting limit is counted while reading, without a scan of
// its own.  A batch (a line that is an array) is parsed as a document.
// Not installed; nothing outside this folder includes it.

#include <cstdint>
#include <string>
#include <string_view>

#include "qrt/rpc/json_rpc.hpp"

namespace qrt::rpc {

// One request as the engine checks it.  Points into the line_read (or the
// document) it came from.
struct request_view {
    enum class version : std::uint8_t { missing, not_string, other, v2 };
    bool is_object = false;
    const char* type_name = "";   // what a request that is not an object is
    const json* id = nullptr;     // nullptr: no "id" member (a notification)
    bool has_unknown = false;     // a member of another name ...
    std::string_view unknown;     // ... the first in name order
    version jsonrpc = version::missing;
    const std::string* method = nullptr;  // nullptr: missing, or not a string
    const json* params = nullptr;         // nullptr: no "params" member
};

// The view of a batch element's document.
request_view view_of(const json& request);

// One line read by SAX.  Reused from line to line (its strings and
// documents keep their storage).
struct line_read {
    enum class kind : std::uint8_t { request, batch, too_deep, parse_error };
    kind what = kind::request;
    std::string error;  // parse_error: nlohmann's message

    bool is_object = false;
    const char* type_name = "";
    bool has_id = false;
    json id;
    bool has_unknown = false;
    std::string unknown;
    request_view::version jsonrpc = request_view::version::missing;
    bool method_ok = false;
    std::string method;
    bool has_params = false;
    json params;

    request_view view() const;
};

// Reads `line` into `out`: a request, or kind::batch (then nothing else is
// filled: the caller parses the document), kind::too_deep when arrays and
// objects nest deeper than max_depth, kind::parse_error with nlohmann's
// message (numbers beyond a double included).
void read_line(std::string_view line, std::size_t max_depth, line_read& out);

}  // namespace qrt::rpc
