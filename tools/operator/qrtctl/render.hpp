#pragma once
// Human renderings of the agent's JSON replies: aligned tables and
// "key: value" listings, driven by column tables (one per reply type), so
// `--json` and the human form are two renderings of one reply.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace qrtctl {

using json = nlohmann::json;

// How a value is shown.
enum class shown_as : std::uint8_t {
    text,      // strings bare, other scalars as JSON, null as "-"
    time,      // ns since the epoch -> ISO 8601 UTC; null/0 -> "-"
    duration,  // ns -> "2ms"
    fixed3,    // number with 3 decimals
    yes_no,    // bool -> yes/no
    list,      // array of scalars -> "a,b,c"
};

struct column {
    std::string_view header;
    std::string_view key;  // member name; "a.b" descends into objects
    shown_as how = shown_as::text;
};

std::string show(const json& v, shown_as how);
// The member at a dotted path, or null.
const json& at_path(const json& obj, std::string_view dotted);

class table {
public:
    explicit table(std::vector<std::string> headers) : _headers(std::move(headers)) {}
    void add_row(std::vector<std::string> cells) { _rows.push_back(std::move(cells)); }
    std::size_t rows() const noexcept { return _rows.size(); }
    // Columns padded to their widest cell, two spaces apart; no trailing
    // spaces.
    std::string render() const;

private:
    std::vector<std::string> _headers;
    std::vector<std::vector<std::string>> _rows;
};

// One row per element of `items` (objects), one column per spec entry.
table make_table(const json& items, std::span<const column> cols);
// The same, with the columns taken from the union of the elements' scalar
// members, in first-seen order (for replies without a fixed shape).
table make_table_auto(const json& items);

// "label: value" lines for the spec'ed members that are present.
std::string render_fields(const json& obj, std::span<const column> fields);
// Every leaf as "a.b.c: value", arrays of scalars joined; arrays of objects
// as a.b[0].c (for replies without a fixed shape).
std::string render_flat(const json& obj);

}  // namespace qrtctl
