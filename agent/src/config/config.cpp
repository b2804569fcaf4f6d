// Loading qrtd.toml: toml++ parses, the option table validates and stores.
//
// The walk goes section by section over what the file holds (so unknown
// sections and keys are found), looks each key up in the table, checks type,
// range and syntax, and stores.  Cross-field checks run after every value is
// in, with the line of each option remembered for their messages.  All
// problems are collected and sorted by line, like a compiler.

#include "qrt/config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <toml++/toml.h>

#include "qrt/config_table.hpp"
#include "qrt/dispatch/dispatcher.hpp"

namespace qrt {
namespace {

unsigned line_of(const toml::source_region& src) {
    return static_cast<unsigned>(src.begin.line);
}

const char* type_name(const toml::node& n) {
    switch (n.type()) {
        case toml::node_type::string: return "a string";
        case toml::node_type::integer: return "an integer";
        case toml::node_type::floating_point: return "a float";
        case toml::node_type::boolean: return "a boolean";
        case toml::node_type::array: return "an array";
        case toml::node_type::table: return "a table";
        case toml::node_type::date:
        case toml::node_type::time:
        case toml::node_type::date_time: return "a date/time";
        case toml::node_type::none: return "nothing";
    }
    return "something else";
}

std::string expected_text(const config_option& opt) {
    switch (opt.kind) {
        case option_kind::boolean: return "a boolean (true or false)";
        case option_kind::integer:
        case option_kind::duration_ns: return fmt::format("an integer ({})", opt.range_text());
        case option_kind::real: return fmt::format("a number ({})", opt.range_text());
        case option_kind::string: return "a string";
        case option_kind::enumeration: return fmt::format("a string ({})", opt.range_text());
        case option_kind::cpu_list: return "a string (\"auto\" or a CPU list)";
        case option_kind::string_list: return "an array of strings";
    }
    return "?";
}

// The value as the file wrote it, for messages.
std::string show(const toml::node& n) {
    std::ostringstream os;
    if (const auto* arr = n.as_array()) {
        os << '[';
        bool first = true;
        for (const auto& el : *arr) {
            os << (first ? "" : ", ") << show(el);
            first = false;
        }
        os << ']';
        return os.str();
    }
    if (n.is_table()) {
        return "{...}";
    }
    if (const auto* s = n.as_string()) {
        return toml_quote(s->get());
    }
    if (const auto* i = n.as_integer()) {
        return std::to_string(i->get());
    }
    if (const auto* f = n.as_floating_point()) {
        return fmt::format("{}", f->get());
    }
    if (const auto* b = n.as_boolean()) {
        return b->get() ? "true" : "false";
    }
    n.visit([&os](const auto& v) { os << v; });
    return os.str();
}

// Levenshtein distance, for "did you mean" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::size_t> prev(b.size() + 1);
    std::vector<std::size_t> cur(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) {
        prev[j] = j;
    }
    for (std::size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
        }
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

std::string suggest_key(std::string_view section, std::string_view key) {
    std::string best;
    std::size_t best_d = 3;   // suggest only close matches
    for (const auto& opt : config_table()) {
        if (!section.empty() && opt.section != section) {
            continue;
        }
        const std::size_t d = section.empty() && opt.key == key ? 0 : edit_distance(opt.key, key);
        if (d < best_d) {
            best_d = d;
            best = opt.section == "qpu" ? fmt::format("[[qpu]] {}", opt.key) : opt.full_name();
        }
    }
    return best.empty() ? std::string() : fmt::format(" (did you mean {}?)", best);
}

std::string suggest_section(std::string_view name) {
    for (const auto s : section_order()) {
        if (edit_distance(s, name) <= 2) {
            return s == "qpu" ? std::string(" (did you mean [[qpu]]?)")
                              : fmt::format(" (did you mean [{}]?)", s);
        }
    }
    return {};
}

bool is_power_of_two(std::int64_t v) {
    return v > 0 && (v & (v - 1)) == 0;
}

class loader {
public:
    loader(std::string file, const config_load_options& opts) : _file(std::move(file)), _opts(opts) {}

    config_load_result run(std::string_view text) {
        config_load_result res;
        try {
            const toml::table root = toml::parse(text, _file);
            load_defaults();
            walk(root);
            cross_checks();
        } catch (const toml::parse_error& e) {
            config_diagnostic d;
            d.file = _file;
            d.line = line_of(e.source());
            d.column = static_cast<unsigned>(e.source().begin.column);
            d.message = fmt::format("malformed TOML: {}", e.description());
            _errors.push_back(std::move(d));
        }
        std::stable_sort(_errors.begin(), _errors.end(),
                         [](const config_diagnostic& a, const config_diagnostic& b) {
                             return a.line < b.line;
                         });
        res.errors = std::move(_errors);
        res.cfg = std::move(_cfg);
        return res;
    }

private:
    void error(unsigned line, std::string option, std::string message) {
        _errors.push_back(config_diagnostic{_file, line, 0, std::move(option), std::move(message)});
    }

    void load_defaults() {
        qpu_config unused;
        for (const auto& opt : config_table()) {
            if (opt.section != "qpu") {
                opt.store(_cfg, unused, opt.default_value);
            }
        }
    }

    static qpu_config default_qpu() {
        qpu_config q;
        config unused;
        for (const auto& opt : config_table()) {
            if (opt.section == "qpu" && !opt.required) {
                opt.store(unused, q, opt.default_value);
            }
        }
        return q;
    }

    void walk(const toml::table& root) {
        for (const auto& [key, node] : root) {
            const std::string_view name = key.str();
            const unsigned line = line_of(key.source());
            const bool known = std::find(section_order().begin(), section_order().end(), name) !=
                               section_order().end();
            if (!known) {
                if (node.is_table() || node.is_array_of_tables()) {
                    error(line, std::string(name),
                          fmt::format("unknown section [{}]{}", name, suggest_section(name)));
                } else {
                    error(line, std::string(name),
                          fmt::format("unknown option {} outside any section{}", name,
                                      suggest_key({}, name)));
                }
                continue;
            }
            if (name == "qpu") {
                walk_qpus(node, line);
                continue;
            }
            const auto* tbl = node.as_table();
            if (tbl == nullptr) {
                error(line, std::string(name),
                      fmt::format("{} must be a table [{}], not {}", name, name, type_name(node)));
                continue;
            }
            qpu_config unused;
            walk_section(name, *tbl, std::string(name), unused);
        }
        if (_cfg.qpus.empty() && !_saw_qpu) {
            error(0, "qpu", "no [[qpu]] table: declare at least one QPU");
        }
    }

    void walk_qpus(const toml::node& node, unsigned line) {
        _saw_qpu = true;
        const auto* arr = node.as_array();
        if (arr == nullptr || !arr->is_array_of_tables()) {
            error(line, "qpu", "qpu must be an array of tables: write each QPU as [[qpu]]");
            return;
        }
        for (std::size_t i = 0; i < arr->size(); ++i) {
            const auto& tbl = *(*arr)[i].as_table();
            const std::string prefix = fmt::format("qpu[{}]", i);
            qpu_config q = default_qpu();
            const unsigned tbl_line = line_of(tbl.source());
            walk_section("qpu", tbl, prefix, q);
            for (const auto& opt : config_table()) {
                if (opt.section == "qpu" && opt.required && !tbl.contains(opt.key)) {
                    error(tbl_line, fmt::format("{}.{}", prefix, opt.key),
                          fmt::format("{}: missing required option {}", prefix, opt.key));
                }
            }
            _qpu_lines.push_back(tbl_line);
            _cfg.qpus.push_back(std::move(q));
        }
    }

    void walk_section(std::string_view section, const toml::table& tbl, const std::string& prefix,
                      qpu_config& qpu) {
        for (const auto& [key, node] : tbl) {
            const std::string name = fmt::format("{}.{}", prefix, key.str());
            const unsigned line = line_of(key.source());
            if (section == "qpu" && key.str() == "device") {
                walk_device(node, name, line, qpu);
                continue;
            }
            const config_option* opt = find_option(section, key.str());
            if (opt == nullptr) {
                error(line, name,
                      fmt::format("unknown option {}{}", name, suggest_key(section, key.str())));
                continue;
            }
            auto value = validate(*opt, node, name, line);
            if (value) {
                opt->store(_cfg, qpu, *value);
                _lines[name] = line;
            }
        }
    }

    // [qpu.device]: nested values the option kinds do not cover, checked
    // here with messages in the same form ("qpu[0].device.qubits = 0 is out
    // of range 1..1024").
    void walk_device(const toml::node& node, const std::string& name, unsigned line, qpu_config& qpu) {
        using L = device_limits;
        const auto* tbl = node.as_table();
        if (tbl == nullptr) {
            error(line, name, fmt::format("{} must be a table [qpu.device], not {}", name, type_name(node)));
            return;
        }
        qpu_device d;
        bool ok = true;
        bool have_qubits = false;
        auto fail = [&](unsigned l, const std::string& opt, std::string msg) {
            error(l, opt, std::move(msg));
            ok = false;
        };
        auto gate_name_ok = [](std::string_view g) {
            return !g.empty() && g.size() <= L::max_gate_name_chars &&
                   std::all_of(g.begin(), g.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
                   });
        };
        unsigned coupling_line = line;
        unsigned durations_line = line;
        for (const auto& [key, v] : *tbl) {
            const std::string k(key.str());
            const std::string opt = fmt::format("{}.{}", name, k);
            const unsigned l = line_of(key.source());
            const bool known = std::any_of(device_table().begin(), device_table().end(),
                                           [&](const device_option& o) { return o.key == k; });
            if (!known) {
                std::string keys;
                for (const auto& o : device_table()) {
                    keys += (keys.empty() ? "" : ", ") + std::string(o.key);
                }
                fail(l, opt, fmt::format("unknown option {} (known: {})", opt, keys));
                continue;
            }
            if (k == "qubits" || k == "max_shots") {
                const auto* i = v.as_integer();
                const std::int64_t hi = k == "qubits" ? L::max_qubits : L::max_shots_limit;
                if (i == nullptr) {
                    fail(l, opt, fmt::format("{} = {}: expected an integer (1..{}), got {}", opt, show(v), hi,
                                             type_name(v)));
                } else if (i->get() < 1 || i->get() > hi) {
                    fail(l, opt, fmt::format("{} = {} is out of range 1..{}", opt, show(v), hi));
                } else if (k == "qubits") {
                    d.qubits = static_cast<std::uint32_t>(i->get());
                    have_qubits = true;
                } else {
                    d.max_shots = static_cast<std::uint32_t>(i->get());
                }
            } else if (k == "technology") {
                const auto* t = v.as_string();
                if (t == nullptr) {
                    fail(l, opt, fmt::format("{} = {}: expected a string, got {}", opt, show(v), type_name(v)));
                } else if (t->get().size() > L::max_technology_chars) {
                    fail(l, opt, fmt::format("{} is {} characters, at most {}", opt, t->get().size(),
                                             L::max_technology_chars));
                } else {
                    d.technology = t->get();
                }
            } else if (k == "basis_gates") {
                const auto* arr = v.as_array();
                if (arr == nullptr) {
                    fail(l, opt, fmt::format("{} = {}: expected an array of gate names, got {}", opt, show(v),
                                             type_name(v)));
                    continue;
                }
                if (arr->size() > L::max_basis_gates) {
                    fail(l, opt, fmt::format("{} has {} gates, at most {}", opt, arr->size(), L::max_basis_gates));
                    continue;
                }
                for (std::size_t i = 0; i < arr->size(); ++i) {
                    const auto* g = (*arr)[i].as_string();
                    const std::string el = fmt::format("{}[{}]", opt, i);
                    if (g == nullptr || !gate_name_ok(g->get())) {
                        fail(l, opt, fmt::format("{} = {} is not a gate name (1..{} characters of [A-Za-z0-9_])",
                                                 el, show((*arr)[i]), L::max_gate_name_chars));
                    } else if (std::find(d.basis_gates.begin(), d.basis_gates.end(), g->get()) !=
                               d.basis_gates.end()) {
                        fail(l, opt, fmt::format("{} = {} is listed twice", el, show((*arr)[i])));
                    } else {
                        d.basis_gates.push_back(g->get());
                    }
                }
            } else if (k == "coupling_map") {
                coupling_line = l;
                const auto* arr = v.as_array();
                if (arr == nullptr) {
                    fail(l, opt, fmt::format("{} = {}: expected an array of [control, target] pairs, got {}", opt,
                                             show(v), type_name(v)));
                    continue;
                }
                if (arr->size() > L::max_coupling_pairs) {
                    fail(l, opt, fmt::format("{} has {} pairs, at most {}", opt, arr->size(), L::max_coupling_pairs));
                    continue;
                }
                for (std::size_t i = 0; i < arr->size(); ++i) {
                    const auto* pr = (*arr)[i].as_array();
                    const std::string el = fmt::format("{}[{}]", opt, i);
                    bool good = pr != nullptr && pr->size() == 2;
                    std::array<std::uint32_t, 2> pair{};
                    for (std::size_t j = 0; good && j < 2; ++j) {
                        const auto* q = (*pr)[j].as_integer();
                        good = q != nullptr && q->get() >= 0 && q->get() < L::max_qubits;
                        if (good) {
                            pair[j] = static_cast<std::uint32_t>(q->get());
                        }
                    }
                    if (!good) {
                        fail(l, opt, fmt::format("{} = {} is not a pair [control, target] of qubit indices", el,
                                                 show((*arr)[i])));
                    } else if (pair[0] == pair[1]) {
                        fail(l, opt, fmt::format("{} = {} couples a qubit to itself", el, show((*arr)[i])));
                    } else {
                        d.coupling_map.push_back(pair);
                    }
                }
            } else if (k == "gate_durations_ns") {
                durations_line = l;
                const auto* t = v.as_table();
                if (t == nullptr) {
                    fail(l, opt, fmt::format("{} = {}: expected a table of gate = nanoseconds, got {}", opt,
                                             show(v), type_name(v)));
                    continue;
                }
                for (const auto& [gk, gv] : *t) {
                    const std::string el = fmt::format("{}.{}", opt, gk.str());
                    const auto* ns = gv.as_integer();
                    if (!gate_name_ok(gk.str())) {
                        fail(l, opt, fmt::format("{} is not a gate name", el));
                    } else if (ns == nullptr || ns->get() < 0 || ns->get() > L::max_gate_duration_ns) {
                        fail(l, opt, fmt::format("{} = {} is not an integer of nanoseconds in 0..{}", el, show(gv),
                                                 L::max_gate_duration_ns));
                    } else {
                        d.gate_durations_ns.emplace_back(std::string(gk.str()), ns->get());
                    }
                }
            }
        }
        if (!have_qubits) {
            const bool reported = !ok && tbl->contains("qubits");
            if (!reported) {
                fail(line, name + ".qubits", fmt::format("{}: missing required option qubits", name));
            }
        }
        if (!ok) {
            return;
        }
        for (std::size_t i = 0; i < d.coupling_map.size(); ++i) {
            const auto& pr = d.coupling_map[i];
            if (pr[0] >= d.qubits || pr[1] >= d.qubits) {
                fail(coupling_line, name + ".coupling_map",
                     fmt::format("{}.coupling_map[{}] = [{}, {}] names a qubit not below {}.qubits = {}", name, i,
                                 pr[0], pr[1], name, d.qubits));
            }
        }
        for (const auto& [gate, ns] : d.gate_durations_ns) {
            if (!d.basis_gates.empty() &&
                std::find(d.basis_gates.begin(), d.basis_gates.end(), gate) == d.basis_gates.end()) {
                fail(durations_line, name + ".gate_durations_ns",
                     fmt::format("{}.gate_durations_ns.{} names a gate that is not in {}.basis_gates", name, gate,
                                 name));
            }
        }
        if (ok) {
            qpu.device = std::move(d);
        }
    }

    // Type, range and syntax of one value; nullopt after reporting an error.
    std::optional<option_value> validate(const config_option& opt, const toml::node& node,
                                         const std::string& name, unsigned line) {
        auto wrong_type = [&]() -> std::optional<option_value> {
            error(line, name,
                  fmt::format("{} = {}: expected {}, got {}", name, show(node), expected_text(opt),
                              type_name(node)));
            return std::nullopt;
        };
        auto out_of_range = [&]() -> std::optional<option_value> {
            error(line, name,
                  fmt::format("{} = {} is out of range {}", name, show(node), opt.range_text()));
            return std::nullopt;
        };
        auto bad_text = [&](const std::string& why) -> std::optional<option_value> {
            error(line, name, fmt::format("{} = {} {}", name, show(node), why));
            return std::nullopt;
        };

        switch (opt.kind) {
            case option_kind::boolean:
                if (const auto* b = node.as_boolean()) {
                    return option_value{b->get()};
                }
                return wrong_type();
            case option_kind::integer:
            case option_kind::duration_ns: {
                const auto* i = node.as_integer();
                if (i == nullptr) {
                    return wrong_type();
                }
                const std::int64_t v = i->get();
                if (v < opt.min || v > opt.max) {
                    return out_of_range();
                }
                if (opt.section == "dispatch" && opt.key == "ring_capacity" && !is_power_of_two(v)) {
                    return bad_text("is not a power of two");
                }
                return option_value{v};
            }
            case option_kind::real: {
                double v = 0;
                if (const auto* f = node.as_floating_point()) {
                    v = f->get();
                } else if (const auto* i = node.as_integer()) {
                    v = static_cast<double>(i->get());
                } else {
                    return wrong_type();
                }
                if (!(v >= opt.min_real && v <= opt.max_real)) {   // NaN fails too
                    return out_of_range();
                }
                return option_value{v};
            }
            case option_kind::string:
            case option_kind::enumeration:
            case option_kind::cpu_list: {
                const auto* s = node.as_string();
                if (s == nullptr) {
                    return wrong_type();
                }
                const std::string& text = s->get();
                if (opt.kind == option_kind::enumeration &&
                    std::find(opt.allowed.begin(), opt.allowed.end(), text) == opt.allowed.end()) {
                    return bad_text(fmt::format("is not one of {}", opt.range_text()));
                }
                if (opt.kind == option_kind::cpu_list && text != "auto") {
                    auto set = rtcore::cpu_set::parse_list(text);
                    if (!set) {
                        return bad_text(fmt::format("is not \"auto\" or a CPU list: {}",
                                                    set.err().message));
                    }
                    if (set->empty()) {
                        return bad_text("names no CPU: write \"auto\" or a CPU list such as \"2-3\"");
                    }
                }
                if (opt.check != nullptr) {
                    if (auto why = opt.check(text)) {
                        return bad_text(*why);
                    }
                }
                return option_value{text};
            }
            case option_kind::string_list: {
                const auto* arr = node.as_array();
                if (arr == nullptr) {
                    return wrong_type();
                }
                std::vector<std::string> out;
                bool ok = true;
                for (std::size_t i = 0; i < arr->size(); ++i) {
                    const auto& el = (*arr)[i];
                    const std::string el_name = fmt::format("{}[{}]", name, i);
                    const auto* s = el.as_string();
                    if (s == nullptr) {
                        error(line, name,
                              fmt::format("{} = {}: expected a string, got {}", el_name, show(el),
                                          type_name(el)));
                        ok = false;
                        continue;
                    }
                    if (opt.check != nullptr) {
                        if (auto why = opt.check(s->get())) {
                            error(line, name, fmt::format("{} = {} {}", el_name, show(el), *why));
                            ok = false;
                            continue;
                        }
                    }
                    out.push_back(s->get());
                }
                if (!ok) {
                    return std::nullopt;
                }
                return option_value{std::move(out)};
            }
        }
        return wrong_type();
    }

    unsigned line(const std::string& name) const {
        auto it = _lines.find(name);
        return it == _lines.end() ? 0 : it->second;
    }
    // The line of whichever of two related options the file set (the later).
    unsigned line(const std::string& a, const std::string& b) const {
        return std::max(line(a), line(b));
    }

    void cross_checks() {
        const auto& d = _cfg.dispatch;
        if (d.lead_min_ns > d.lead_max_ns) {
            error(line("dispatch.lead_min_ns", "dispatch.lead_max_ns"), "dispatch.lead_min_ns",
                  fmt::format("dispatch.lead_min_ns = {} is greater than dispatch.lead_max_ns = {}",
                              d.lead_min_ns, d.lead_max_ns));
        }
        {
            // Each ring slot owns a frame buffer, mmap'ed, registered with
            // io_uring and locked in memory at start (per QPU).
            std::uint64_t slots = 1;
            while (slots < d.ring_capacity) {
                slots <<= 1;
            }
            const std::uint64_t pool = dispatch::dispatcher::frame_pool_bytes(slots, d.max_payload_bytes);
            constexpr std::uint64_t pool_limit = std::uint64_t{1} << 30;
            if (pool > pool_limit) {
                error(line("dispatch.ring_capacity", "dispatch.max_payload_bytes"), "dispatch.ring_capacity",
                      fmt::format("dispatch.ring_capacity = {} with dispatch.max_payload_bytes = {} needs {} MiB "
                                  "of locked frame buffers per QPU (limit {} MiB): lower one of them",
                                  d.ring_capacity, d.max_payload_bytes, pool >> 20, pool_limit >> 20));
            }
        }
        if (d.sqpoll_cpu >= 0 && _opts.online_cpus && !_opts.online_cpus->test(static_cast<unsigned>(d.sqpoll_cpu))) {
            error(line("dispatch.sqpoll_cpu"), "dispatch.sqpoll_cpu",
                  fmt::format("dispatch.sqpoll_cpu = {} is not an online CPU (online: {})", d.sqpoll_cpu,
                              _opts.online_cpus->to_list()));
        }
        const auto& r = _cfg.rpc;
        if (r.reserved_connections >= r.max_connections) {
            error(line("rpc.reserved_connections", "rpc.max_connections"), "rpc.reserved_connections",
                  fmt::format("rpc.reserved_connections = {} leaves no connection of "
                              "rpc.max_connections = {} to schedulers and readers: it must be "
                              "less",
                              r.reserved_connections, r.max_connections));
        }
        const auto& t = _cfg.timeline;
        if (t.default_lease_ns > t.horizon_ns) {
            error(line("timeline.default_lease_ns", "timeline.horizon_ns"),
                  "timeline.default_lease_ns",
                  fmt::format("timeline.default_lease_ns = {} is greater than timeline.horizon_ns = {}",
                              t.default_lease_ns, t.horizon_ns));
        }

        if (auto why = journal_dir_apart(_cfg.host.journal_dir, _cfg.agent.state_dir)) {
            error(line("host.journal_dir", "agent.state_dir"), "host.journal_dir", *why);
        }

        const auto& iso = _cfg.host.isolated_cpus;
        const unsigned iso_line = line("host.isolated_cpus");
        if (iso && _opts.online_cpus) {
            const rtcore::cpu_set& online = *_opts.online_cpus;
            const rtcore::cpu_set unknown = *iso - online;
            if (!unknown.empty()) {
                error(iso_line, "host.isolated_cpus",
                      fmt::format("host.isolated_cpus = \"{}\" names CPUs that are not online: {} "
                                  "(online: {})",
                                  iso->to_list(), unknown.to_list(), online.to_list()));
            } else if (online.is_subset_of(*iso)) {
                error(iso_line, "host.isolated_cpus",
                      fmt::format("host.isolated_cpus = \"{}\" covers every online CPU ({}): at "
                                  "least one core must stay for housekeeping",
                                  iso->to_list(), online.to_list()));
            }
        }

        std::map<std::string, std::size_t> names;
        std::map<int, std::size_t> cpus;
        for (std::size_t i = 0; i < _cfg.qpus.size(); ++i) {
            const auto& q = _cfg.qpus[i];
            const std::string p = fmt::format("qpu[{}]", i);
            if (q.blackout_ns >= q.period_ns) {
                error(line(p + ".blackout_ns", p + ".period_ns"), p + ".blackout_ns",
                      fmt::format("{0}.blackout_ns = {1} must be less than {0}.period_ns = {2}", p,
                                  q.blackout_ns, q.period_ns));
            }
            if (q.phase_ns >= q.period_ns) {
                error(line(p + ".phase_ns", p + ".period_ns"), p + ".phase_ns",
                      fmt::format("{0}.phase_ns = {1} must be less than {0}.period_ns = {2}", p,
                                  q.phase_ns, q.period_ns));
            }
            if (q.wire >= 2 && q.target.type == endpoint::kind::device_file) {
                error(line(p + ".wire", p + ".endpoint"), p + ".wire",
                      fmt::format("{0}.wire = 2 needs two connections to the endpoint; {0}.endpoint = \"{1}\" "
                                  "is a file: give a unix:// or tcp:// endpoint, or wire = 1",
                                  p, q.target.uri));
            }
            if (q.wire < 2 && q.arm_lead_ns != 0) {
                error(line(p + ".arm_lead_ns", p + ".wire"), p + ".arm_lead_ns",
                      fmt::format("{0}.arm_lead_ns = {1} is for wire = 2 ({0}.wire = {2}): a version-1 job "
                                  "is never armed", p, q.arm_lead_ns, q.wire));
            }
            if (!q.name.empty()) {
                auto [it, fresh] = names.emplace(q.name, i);
                if (!fresh) {
                    error(line(p + ".name"), p + ".name",
                          fmt::format("{}.name = \"{}\" is already the name of qpu[{}] (line {})", p,
                                      q.name, it->second, _qpu_lines[it->second]));
                }
            }
            if (q.dispatch_cpu >= 0) {
                const auto cpu = static_cast<unsigned>(q.dispatch_cpu);
                const unsigned l = line(p + ".dispatch_cpu");
                auto [it, fresh] = cpus.emplace(q.dispatch_cpu, i);
                if (!fresh) {
                    error(l, p + ".dispatch_cpu",
                          fmt::format("{}.dispatch_cpu = {} is already the dispatch CPU of qpu[{}]",
                                      p, q.dispatch_cpu, it->second));
                } else if (_opts.online_cpus && !_opts.online_cpus->test(cpu)) {
                    error(l, p + ".dispatch_cpu",
                          fmt::format("{}.dispatch_cpu = {} is not an online CPU (online: {})", p,
                                      q.dispatch_cpu, _opts.online_cpus->to_list()));
                } else if (iso && !iso->test(cpu)) {
                    error(l, p + ".dispatch_cpu",
                          fmt::format("{}.dispatch_cpu = {} is not in host.isolated_cpus ({})", p,
                                      q.dispatch_cpu, iso->to_list()));
                }
            }
        }
    }

    std::string _file;
    const config_load_options& _opts;
    config _cfg;
    bool _saw_qpu = false;
    std::vector<unsigned> _qpu_lines;
    std::map<std::string, unsigned> _lines;
    std::vector<config_diagnostic> _errors;
};

}  // namespace

std::uint64_t frame_pool_bytes(const config& cfg) {
    const dispatch::dispatcher_config defaults;
    std::uint64_t slots = 1;
    const std::uint64_t want = cfg.dispatch.ring_capacity > 0 ? cfg.dispatch.ring_capacity : defaults.slots;
    while (slots < want) {
        slots <<= 1;
    }
    const std::uint64_t payload =
        cfg.dispatch.max_payload_bytes > 0 ? cfg.dispatch.max_payload_bytes : defaults.max_payload_bytes;
    // The largest pool a QPU needs: a wire = 2 QPU's holds FIRE headers only.
    const bool any_v1 = cfg.qpus.empty() || std::any_of(cfg.qpus.begin(), cfg.qpus.end(),
                                                         [](const qpu_config& q) { return q.wire < 2; });
    return dispatch::dispatcher::frame_pool_bytes(slots, payload, any_v1 ? 1U : 2U);
}

std::optional<std::string> journal_dir_apart(const std::string& journal_dir, const std::string& state_dir) {
    if (journal_dir.empty() || state_dir.empty()) {
        return std::nullopt;
    }
    const auto norm = [](const std::string& p) {
        std::string s = std::filesystem::path(p).lexically_normal().string();
        while (s.size() > 1 && s.back() == '/') {
            s.pop_back();
        }
        return s;
    };
    const std::string j = norm(journal_dir);
    const std::string st = norm(state_dir);
    if (j == st || (j.size() > st.size() && j.compare(0, st.size(), st) == 0 && j[st.size()] == '/')) {
        return fmt::format("host.journal_dir = \"{}\" is {} agent.state_dir = \"{}\", which the daemon's user "
                           "owns: it could rename the journal away and plant another for root to replay; use a "
                           "root-owned directory of its own (default {})",
                           journal_dir, j == st ? "the same directory as" : "inside", state_dir,
                           QRT_DEFAULT_JOURNAL_DIR);
    }
    return std::nullopt;
}

std::string config_diagnostic::to_string() const {
    if (line == 0) {
        return fmt::format("{}: {}", file, message);
    }
    if (column == 0) {
        return fmt::format("{}:{}: {}", file, line, message);
    }
    return fmt::format("{}:{}:{}: {}", file, line, column, message);
}

std::string config_load_result::error_text() const {
    std::string out;
    for (const auto& e : errors) {
        out += e.to_string();
        out += '\n';
    }
    return out;
}

config_load_result parse_config(std::string_view toml_text, std::string source_name,
                                const config_load_options& opts) {
    loader l(std::move(source_name), opts);
    return l.run(toml_text);
}

config_load_result load_config_file(const std::filesystem::path& path,
                                    const config_load_options& opts) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        config_load_result res;
        const int err = errno;
        res.errors.push_back(config_diagnostic{
            path.string(), 0, 0, "",
            fmt::format("cannot read: {}", std::generic_category().message(err))});
        return res;
    }
    std::ostringstream text;
    text << in.rdbuf();
    return parse_config(text.str(), path.string(), opts);
}

const config& default_config() {
    static const config cfg = [] {
        config c;
        qpu_config q;
        for (const auto& opt : config_table()) {
            opt.store(c, q, opt.default_value);
        }
        c.qpus.push_back(q);
        return c;
    }();
    return cfg;
}

nlohmann::json device_to_json(const std::optional<qpu_device>& device) {
    if (!device) {
        return nullptr;
    }
    nlohmann::json durations = nlohmann::json::object();
    for (const auto& [g, ns] : device->gate_durations_ns) {
        durations[g] = ns;
    }
    nlohmann::json coupling = nlohmann::json::array();
    for (const auto& pr : device->coupling_map) {
        coupling.push_back({pr[0], pr[1]});
    }
    return nlohmann::json{{"qubits", device->qubits},
                          {"technology", device->technology},
                          {"basis_gates", device->basis_gates},
                          {"coupling_map", std::move(coupling)},
                          {"gate_durations_ns", std::move(durations)},
                          {"max_shots", device->max_shots}};
}

nlohmann::json config_to_json(const config& cfg) {
    auto to_json = [](const option_value& v) {
        return std::visit([](const auto& x) { return nlohmann::json(x); }, v);
    };
    nlohmann::json j = nlohmann::json::object();
    static const qpu_config no_qpu;
    for (const auto& opt : config_table()) {
        if (opt.section != "qpu") {
            j[std::string(opt.section)][std::string(opt.key)] = to_json(opt.load(cfg, no_qpu));
        }
    }
    j["qpu"] = nlohmann::json::array();
    for (const auto& q : cfg.qpus) {
        nlohmann::json jq = nlohmann::json::object();
        for (const auto& opt : config_table()) {
            if (opt.section == "qpu") {
                jq[std::string(opt.key)] = to_json(opt.load(cfg, q));
            }
        }
        jq["device"] = device_to_json(q.device);
        j["qpu"].push_back(std::move(jq));
    }
    return j;
}

}  // namespace qrt
