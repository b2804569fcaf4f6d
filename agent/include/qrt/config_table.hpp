#pragma once
// THE table of qrtd's configuration options (after linuxptp's config_tab).
//
// One row per option: section, key, type, default, range or allowed values,
// and meaning.  The same rows drive
//   - parsing and validation (qrt::parse_config),
//   - `qrtd check-config` (errors name file, line, option, value, range),
//   - the commented reference `qrtd config-reference` == config/qrtd.toml,
//   - the option list of the qrtd.toml(5) man page.
// Adding an option means adding a row here (config_table.cpp) and a field to
// qrt::config; tests check the reference file and the man page follow.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "qrt/config.hpp"

namespace qrt {

enum class option_kind {
    boolean,       // true | false
    integer,       // with min..max
    duration_ns,   // integer nanoseconds, with min..max
    real,          // float (an integer is accepted), with min..max
    string,        // free text, or checked by `check`
    enumeration,   // one of `allowed`
    cpu_list,      // "auto" or a kernel CPU list "2-3,6"
    string_list,   // array of strings, each checked by `check`
};
std::string_view to_string(option_kind kind) noexcept;

// A value as TOML gives it, before it is stored into the struct.
using option_value = std::variant<bool, std::int64_t, double, std::string, std::vector<std::string>>;

struct config_option {
    std::string_view section{};   // "agent", ..., "probes", or "qpu" for [[qpu]] keys
    std::string_view key{};
    option_kind kind = option_kind::string;
    option_value default_value{};   // for required qpu keys: the reference's example
    bool required = false;        // only [[qpu]] name and endpoint
    std::int64_t min = 0;         // integer, duration_ns
    std::int64_t max = 0;
    double min_real = 0;          // real
    double max_real = 0;
    std::vector<std::string_view> allowed{};   // enumeration
    std::string_view meaning{};     // prose, one or more sentences
    // Extra syntax check of one string (string and string_list kinds):
    // returns why the text is not acceptable, or nullopt.
    std::optional<std::string> (*check)(std::string_view text) = nullptr;
    // Store a validated value / read the current value.  qpu is the [[qpu]]
    // entry for section "qpu" and unused otherwise.
    void (*store)(config& cfg, qpu_config& qpu, const option_value& value) = nullptr;
    option_value (*load)(const config& cfg, const qpu_config& qpu) = nullptr;

    // "dispatch.priority"; "qpu.period_ns" for [[qpu]] keys.
    std::string full_name() const;
    // "1..99", "auto, cgroup2, ...", "\"auto\" or a CPU list", "" when free.
    std::string range_text() const;
    // "integer, 1..99" etc., as the reference and the man page show it.
    std::string type_text() const;
};

// Every option, in reference order (sections in section_order(), keys in
// the order the reference lists them).
const std::vector<config_option>& config_table();
// "agent", "host", "dispatch", "timeline", "rpc", "roles", "tenants", "probes",
// "qpu".
const std::vector<std::string_view>& section_order();
// One sentence or two about a section, for the reference and the man page.
std::string_view section_meaning(std::string_view section);
// nullptr when there is no such option.
const config_option* find_option(std::string_view section, std::string_view key);

// The keys of the optional [qpu.device] sub-table of a [[qpu]] (its values
// are nested: arrays of pairs, a table of durations, so they have a parser
// of their own in config.cpp; this table documents them for the reference,
// the man page and the loader's messages).
struct device_option {
    std::string_view key{};
    std::string_view type{};      // "integer, 1..1024", as the reference shows it
    std::string_view example{};   // TOML, for the commented example
    bool required = false;
    std::string_view meaning{};
};
const std::vector<device_option>& device_table();
std::string_view device_section_meaning();

// TOML rendering of a value ("80", "\"auto\"", "[\"group:qrt\"]",
// "30_000_000_000" for long durations).
std::string render_value(const config_option& opt, const option_value& value);
// A TOML basic string: "text" with \" \\ and control characters escaped.
std::string toml_quote(std::string_view text);

}  // namespace qrt
