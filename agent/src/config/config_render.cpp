// The config reference renderer: the option table as text.  One place for
// what `qrtd config-reference` prints (== config/qrtd.toml), the OPTIONS of
// qrtd.toml(5) (`qrtd config-reference --roff`, spliced in by
// tools/dev/regen-config-docs.sh), render_config() of a loaded config, and the
// pieces the loader's messages and SIGHUP's diff share with them: a value in
// TOML (render_value, toml_quote) and an option's type and range in words.

#include <fmt/format.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "qrt/config.hpp"
#include "qrt/config_table.hpp"

namespace qrt {

namespace {

constexpr std::int64_t us = 1000;
constexpr std::int64_t ms = 1000 * us;
constexpr std::int64_t sec = 1000 * ms;
constexpr std::int64_t hour = 3600 * sec;

// 30000000000 -> "30_000_000_000"; short numbers stay as they are.
std::string group_digits(std::int64_t v) {
    std::string digits = std::to_string(v < 0 ? -v : v);
    if (digits.size() <= 4) {
        return v < 0 ? "-" + digits : digits;
    }
    std::string out;
    const std::size_t lead = digits.size() % 3 == 0 ? 3 : digits.size() % 3;
    out += digits.substr(0, lead);
    for (std::size_t i = lead; i < digits.size(); i += 3) {
        out += '_';
        out += digits.substr(i, 3);
    }
    return v < 0 ? "-" + out : out;
}

std::string duration_words(std::int64_t ns) {
    struct unit {
        std::int64_t ns;
        const char* name;
    };
    static constexpr unit units[] = {{24 * hour, "d"}, {hour, "h"}, {60 * sec, "min"},
                                     {sec, "s"},       {ms, "ms"},  {us, "us"}};
    if (ns <= 0) {
        return {};
    }
    for (const auto& u : units) {
        if (ns >= u.ns && ns % u.ns == 0) {
            return fmt::format("{} {}", ns / u.ns, u.name);
        }
    }
    return {};
}

}  // namespace

std::string_view to_string(option_kind kind) noexcept {
    switch (kind) {
        case option_kind::boolean: return "boolean";
        case option_kind::integer: return "integer";
        case option_kind::duration_ns: return "duration";
        case option_kind::real: return "float";
        case option_kind::string: return "string";
        case option_kind::enumeration: return "string";
        case option_kind::cpu_list: return "string";
        case option_kind::string_list: return "array of strings";
    }
    return "?";
}

std::string config_option::range_text() const {
    switch (kind) {
        case option_kind::integer:
        case option_kind::duration_ns:
            return fmt::format("{}..{}", min, max);
        case option_kind::real:
            return fmt::format("{}..{}", min_real, max_real);
        case option_kind::enumeration:
            return fmt::format("{}", fmt::join(allowed, ", "));
        case option_kind::cpu_list:
            return "\"auto\" or a CPU list such as \"2-3,6\"";
        default:
            return {};
    }
}

std::string config_option::type_text() const {
    switch (kind) {
        case option_kind::boolean: return "boolean";
        case option_kind::integer: return fmt::format("integer, {}", range_text());
        case option_kind::duration_ns: {
            std::string text = fmt::format("nanoseconds, {}", range_text());
            const std::string lo = duration_words(min);
            const std::string hi = duration_words(max);
            if (!hi.empty()) {
                text += fmt::format(" ({}..{})", lo.empty() ? std::to_string(min) : lo, hi);
            }
            return text;
        }
        case option_kind::real: return fmt::format("float, {}", range_text());
        case option_kind::string: return required ? "string, required" : "string";
        case option_kind::enumeration: return fmt::format("one of {}", range_text());
        case option_kind::cpu_list: return range_text();
        case option_kind::string_list: return "array of strings";
    }
    return {};
}

std::string render_value(const config_option& opt, const option_value& value) {
    return std::visit(
        [&opt](const auto& v) -> std::string {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, bool>) {
                return v ? "true" : "false";
            } else if constexpr (std::is_same_v<T, std::int64_t>) {
                return opt.kind == option_kind::duration_ns ? group_digits(v) : std::to_string(v);
            } else if constexpr (std::is_same_v<T, double>) {
                std::string s = fmt::format("{}", v);
                if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos &&
                    s.find("nan") == std::string::npos) {
                    s += ".0";
                }
                return s;
            } else if constexpr (std::is_same_v<T, std::string>) {
                return toml_quote(v);
            } else {
                std::vector<std::string> quoted;
                for (const auto& s : v) {
                    quoted.push_back(toml_quote(s));
                }
                return fmt::format("[{}]", fmt::join(quoted, ", "));
            }
        },
        value);
}

std::string toml_quote(std::string_view s) {
    std::string out = "\"";
    for (const char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            case '\r': out += "\\r"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
                    out += fmt::format("\\u{:04X}", static_cast<unsigned>(static_cast<unsigned char>(c)));
                } else {
                    out += c;
                }
        }
    }
    out += '"';
    return out;
}

namespace {

// ---- rendering ------------------------------------------------------------

std::vector<std::string> wrap(std::string_view text, std::size_t width) {
    std::vector<std::string> lines;
    std::string cur;
    std::size_t pos = 0;
    while (pos < text.size()) {
        while (pos < text.size() && text[pos] == ' ') {
            ++pos;
        }
        if (pos >= text.size()) {
            break;
        }
        auto end = text.find(' ', pos);
        if (end == std::string_view::npos) {
            end = text.size();
        }
        const std::string_view word = text.substr(pos, end - pos);
        // Keep the two spaces after a sentence when the line goes on.
        const bool sentence_end = end + 1 < text.size() && text[end + 1] == ' ';
        if (!cur.empty() && cur.size() + 1 + word.size() > width) {
            while (!cur.empty() && cur.back() == ' ') {
                cur.pop_back();
            }
            lines.push_back(cur);
            cur.clear();
        }
        if (!cur.empty() && cur.back() != ' ') {
            cur += ' ';
        }
        cur += word;
        if (sentence_end) {
            cur += ' ';
        }
        pos = end;
    }
    while (!cur.empty() && cur.back() == ' ') {
        cur.pop_back();
    }
    if (!cur.empty()) {
        lines.push_back(cur);
    }
    return lines;
}

std::string default_text(const config_option& opt) {
    const std::string v = render_value(opt, opt.default_value);
    return opt.required ? fmt::format("required, for example {}", v) : fmt::format("default {}", v);
}

void render_option(std::string& out, const config_option& opt, const option_value& value,
                   bool commented) {
    for (const auto& l : wrap(opt.meaning, 76)) {
        out += fmt::format("# {}\n", l);
    }
    out += fmt::format("# ({}; {})\n", opt.type_text(), default_text(opt));
    out += fmt::format("{}{} = {}\n\n", commented ? "#" : "", opt.key, render_value(opt, value));
}

// [qpu.device]: the QPU's values, or (absent) a commented example.
void render_device(std::string& out, const std::optional<qpu_device>& device, bool commented) {
    const bool example = commented || !device;
    out += fmt::format("{}[qpu.device]\n", example ? "#" : "");
    for (const auto& l : wrap(device_section_meaning(), 76)) {
        out += fmt::format("# {}\n", l);
    }
    out += "\n";
    const nlohmann::json j = device_to_json(device);
    for (const auto& o : device_table()) {
        for (const auto& l : wrap(o.meaning, 76)) {
            out += fmt::format("# {}\n", l);
        }
        out += fmt::format("# ({}{})\n", o.type, o.required ? "; required" : "");
        std::string value(o.example);
        if (!example) {
            const std::string k(o.key);
            const auto& v = j.at(k);
            if (k == "gate_durations_ns") {
                if (v.empty()) {
                    continue;
                }
                value = "{ ";
                bool first = true;
                for (const auto& [g, ns] : v.items()) {
                    value += fmt::format("{}{} = {}", first ? "" : ", ", g, ns.get<std::int64_t>());
                    first = false;
                }
                value += " }";
            } else if (k == "technology") {
                value = toml_quote(v.get<std::string>());
            } else {
                value = v.dump();
            }
        }
        out += fmt::format("{}{} = {}\n\n", example ? "#" : "", o.key, value);
    }
}

std::string roff_escape(std::string_view text) {
    std::string out;
    for (const char c : text) {
        if (c == '\\') {
            out += "\\e";
        } else if (c == '-') {
            out += "\\-";
        } else {
            out += c;
        }
    }
    if (!out.empty() && (out.front() == '.' || out.front() == '\'')) {
        out.insert(0, "\\&");
    }
    return out;
}

}  // namespace

std::string render_config(const config& cfg) {
    std::string out;
    out += "# qrtd.toml: configuration of qrtd(8), the real-time host agent.\n"
           "#\n"
           "# Every option is listed with its meaning, its type and range, and its\n"
           "# default; see qrtd.toml(5).  `qrtd check-config` validates a file and\n"
           "# `qrtd config-reference` prints this reference.  Durations are integer\n"
           "# nanoseconds; TOML allows 1_000_000 for readability.  Unknown sections and\n"
           "# options are errors.\n\n";
    static const qpu_config no_qpu;
    for (const auto section : section_order()) {
        if (section == "qpu") {
            continue;
        }
        out += fmt::format("[{}]\n", section);
        for (const auto& l : wrap(section_meaning(section), 76)) {
            out += fmt::format("# {}\n", l);
        }
        out += "\n";
        for (const auto& opt : config_table()) {
            if (opt.section == section) {
                render_option(out, opt, opt.load(cfg, no_qpu), false);
            }
        }
    }
    // [[qpu]]: one block per QPU, or a commented example when there is none.
    const bool example = cfg.qpus.empty();
    const std::vector<qpu_config> qpus = example ? default_config().qpus : cfg.qpus;
    for (const auto& q : qpus) {
        out += fmt::format("{}[[qpu]]\n", example ? "#" : "");
        for (const auto& l : wrap(section_meaning("qpu"), 76)) {
            out += fmt::format("# {}\n", l);
        }
        out += "\n";
        for (const auto& opt : config_table()) {
            if (opt.section == "qpu") {
                render_option(out, opt, opt.load(cfg, q), example);
            }
        }
        render_device(out, q.device, example);
    }
    while (out.size() >= 2 && out[out.size() - 1] == '\n' && out[out.size() - 2] == '\n') {
        out.pop_back();
    }
    return out;
}

std::string reference_toml() {
    return render_config(default_config());
}

std::string reference_roff() {
    std::string out;
    for (const auto section : section_order()) {
        out += section == "qpu" ? std::string(".SS \"[[qpu]]\"\n")
                                : fmt::format(".SS \"[{}]\"\n", section);
        out += roff_escape(section_meaning(section)) + "\n";
        for (const auto& opt : config_table()) {
            if (opt.section != section) {
                continue;
            }
            out += fmt::format(".TP\n.B {}\n", roff_escape(opt.key));
            out += fmt::format("({}; {})\n", roff_escape(opt.type_text()),
                               roff_escape(default_text(opt)));
            out += ".br\n";
            out += roff_escape(opt.meaning) + "\n";
        }
        if (section == "qpu") {
            out += ".SS \"[qpu.device]\"\n";
            out += roff_escape(device_section_meaning()) + "\n";
            for (const auto& o : device_table()) {
                out += fmt::format(".TP\n.B {}\n", roff_escape(o.key));
                out += fmt::format("({}; {}, for example {})\n", roff_escape(o.type),
                                   o.required ? "required" : "optional", roff_escape(o.example));
                out += ".br\n";
                out += roff_escape(o.meaning) + "\n";
            }
        }
    }
    return out;
}

}  // namespace qrt
