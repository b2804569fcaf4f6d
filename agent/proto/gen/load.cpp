// Reads agent/proto/protocol.toml into the model and checks it.  Every
// problem names the table, the entry and the field, so a wrong edit is found
// before a language is written.

#include <algorithm>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "model.hpp"

namespace qrt::protogen {
namespace {

struct bad_table : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::string where(const toml::node& n) {
    const auto& s = n.source();
    return fmt::format("line {}", s.begin.line);
}

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
    throw bad_table(fmt::format(f, std::forward<Args>(args)...));
}

const toml::table& table_at(const toml::table& t, std::string_view key) {
    const auto* n = t.get(key);
    if (n == nullptr || !n->is_table()) {
        fail("[{}] is missing or not a table", key);
    }
    return *n->as_table();
}

const toml::array& array_at(const toml::table& t, std::string_view ctx, std::string_view key) {
    const auto* n = t.get(key);
    if (n == nullptr || !n->is_array()) {
        fail("{}.{} is missing or not an array", ctx, key);
    }
    return *n->as_array();
}

std::string str(const toml::table& t, std::string_view ctx, std::string_view key, bool required = true) {
    const auto* n = t.get(key);
    if (n == nullptr) {
        if (required) {
            fail("{}: {} is missing", ctx, key);
        }
        return {};
    }
    if (!n->is_string()) {
        fail("{}: {} must be a string ({})", ctx, key, where(*n));
    }
    return std::string(n->as_string()->get());
}

std::int64_t integer(const toml::table& t, std::string_view ctx, std::string_view key) {
    const auto* n = t.get(key);
    if (n == nullptr || !n->is_integer()) {
        fail("{}: {} is missing or not an integer", ctx, key);
    }
    return n->as_integer()->get();
}

std::optional<std::int64_t> opt_integer(const toml::table& t, std::string_view ctx, std::string_view key) {
    const auto* n = t.get(key);
    if (n == nullptr) {
        return std::nullopt;
    }
    if (!n->is_integer()) {
        fail("{}: {} must be an integer ({})", ctx, key, where(*n));
    }
    return n->as_integer()->get();
}

bool boolean(const toml::table& t, std::string_view ctx, std::string_view key) {
    const auto* n = t.get(key);
    if (n == nullptr) {
        return false;
    }
    if (!n->is_boolean()) {
        fail("{}: {} must be true or false ({})", ctx, key, where(*n));
    }
    return n->as_boolean()->get();
}

// Every key of an entry is one the table knows: a misspelt column would
// otherwise be dropped without a word.
void only_keys(const toml::table& t, std::string_view ctx, std::initializer_list<std::string_view> keys) {
    for (const auto& [k, v] : t) {
        if (std::find(keys.begin(), keys.end(), k.str()) == keys.end()) {
            fail("{}: unknown key {} ({})", ctx, k.str(), where(v));
        }
    }
}

const toml::table& entry(const toml::node& n, std::string_view list, std::size_t i) {
    if (!n.is_table()) {
        fail("{}[{}] is not an inline table ({})", list, i, where(n));
    }
    return *n.as_table();
}

// A name every language can spell as an identifier (after '.' -> '_').
void check_name(std::string_view ctx, const std::string& name) {
    if (name.empty()) {
        fail("{}: empty name", ctx);
    }
    for (const char c : name) {
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.')) {
            fail("{}: name \"{}\" may hold only a-z, 0-9, '_' and '.'", ctx, name);
        }
    }
}

template <typename T>
void unique(const std::vector<T>& v, std::string_view list) {
    std::set<std::string> seen;
    for (const auto& e : v) {
        if (!seen.insert(e.name).second) {
            fail("{}: \"{}\" appears twice", list, e.name);
        }
    }
}

std::vector<named_value> named_values(const toml::table& t, std::string_view ctx, std::string_view key,
                                      std::string_view value_key, bool with_outcome) {
    std::vector<named_value> out;
    const auto& a = array_at(t, ctx, key);
    for (std::size_t i = 0; i < a.size(); ++i) {
        const auto c = fmt::format("{}.{}[{}]", ctx, key, i);
        const auto& e = entry(a[i], c, i);
        if (with_outcome) {
            only_keys(e, c, {"name", value_key, "doc", "outcome"});
        } else {
            only_keys(e, c, {"name", value_key, "doc", "since"});
        }
        named_value v;
        v.name = str(e, c, "name");
        check_name(c, v.name);
        v.value = integer(e, c, value_key);
        v.doc = str(e, c, "doc", false);
        if (with_outcome) {
            v.outcome = str(e, c, "outcome", false);
        }
        if (const auto since = opt_integer(e, c, "since")) {
            v.since = static_cast<int>(*since);
        }
        out.push_back(std::move(v));
    }
    unique(out, fmt::format("{}.{}", ctx, key));
    return out;
}

std::size_t size_of(std::string_view ctx, const std::string& type) {
    if (type == "u8") return 1;
    if (type == "u16") return 2;
    if (type == "u32") return 4;
    if (type == "u64" || type == "i64") return 8;
    fail("{}: type \"{}\" is not one of u8 u16 u32 u64 i64", ctx, type);
}

void read_wire(const toml::table& top, model& m) {
    const auto& w = table_at(top, "wire");
    only_keys(w, "wire", {"doc", "magic", "magic_doc", "max_payload", "max_payload_doc", "versions", "types", "flags",
                          "errors", "stages", "capabilities", "header"});
    m.wire_doc = str(w, "wire", "doc");
    m.magic = static_cast<std::uint32_t>(integer(w, "wire", "magic"));
    m.magic_doc = str(w, "wire", "magic_doc");
    m.max_payload = static_cast<std::uint32_t>(integer(w, "wire", "max_payload"));
    m.max_payload_doc = str(w, "wire", "max_payload_doc");
    const auto& vs = array_at(w, "wire", "versions");
    for (std::size_t i = 0; i < vs.size(); ++i) {
        const auto c = fmt::format("wire.versions[{}]", i);
        const auto& e = entry(vs[i], c, i);
        only_keys(e, c, {"version", "header_len", "max_hello_payload", "doc"});
        wire_version v;
        v.version = static_cast<int>(integer(e, c, "version"));
        v.header_len = static_cast<std::uint32_t>(integer(e, c, "header_len"));
        v.max_hello_payload = static_cast<std::uint32_t>(integer(e, c, "max_hello_payload"));
        v.doc = str(e, c, "doc");
        if (v.version != static_cast<int>(i) + 1) {
            fail("{}: version {}; versions are 1, 2, ... in order", c, v.version);
        }
        if (!m.versions.empty() && v.header_len < m.versions.back().header_len) {
            fail("{}: header_len {} is shorter than version {}'s: a version only adds fields", c, v.header_len,
                 m.versions.back().version);
        }
        m.versions.push_back(std::move(v));
    }
    if (m.versions.empty()) {
        fail("wire.versions is empty");
    }
    const int newest = m.versions.back().version;
    const auto known_version = [&](std::string_view ctx, int since) {
        if (since < 1 || since > newest) {
            fail("{}: since = {} is no version of wire.versions", ctx, since);
        }
    };
    m.types = named_values(w, "wire", "types", "value", false);
    for (const auto& t : m.types) {
        known_version(fmt::format("wire.types ({})", t.name), t.since);
    }
    m.flags = named_values(w, "wire", "flags", "bit", false);
    m.errors = named_values(w, "wire", "errors", "value", true);
    m.stages = named_values(w, "wire", "stages", "value", false);
    for (const auto& f : m.flags) {
        if (f.value < 0 || f.value > 7) {
            fail("wire.flags: {} has bit {}; flags is one byte (bits 0-7)", f.name, f.value);
        }
    }
    for (const auto& list : {&m.types, &m.errors, &m.stages}) {
        for (std::size_t i = 0; i < list->size(); ++i) {
            for (std::size_t j = i + 1; j < list->size(); ++j) {
                if ((*list)[i].value == (*list)[j].value) {
                    fail("wire: {} and {} have the same value {}", (*list)[i].name, (*list)[j].name,
                         (*list)[i].value);
                }
            }
        }
    }
    const auto& caps = array_at(w, "wire", "capabilities");
    for (std::size_t i = 0; i < caps.size(); ++i) {
        const auto c = fmt::format("wire.capabilities[{}]", i);
        const auto& e = entry(caps[i], c, i);
        only_keys(e, c, {"name", "type", "doc"});
        capability x;
        x.name = str(e, c, "name");
        check_name(c, x.name);
        x.type = str(e, c, "type");
        x.doc = str(e, c, "doc");
        if (x.type != "string" && x.type != "bool" && x.type != "u32" && x.type != "i64") {
            fail("{} ({}): type \"{}\" is not string, bool, u32 or i64", c, x.name, x.type);
        }
        m.capabilities.push_back(std::move(x));
    }
    unique(m.capabilities, "wire.capabilities");
    const auto& h = array_at(w, "wire", "header");
    std::size_t offset = 0;
    int last_since = 1;
    for (std::size_t i = 0; i < h.size(); ++i) {
        const auto c = fmt::format("wire.header[{}]", i);
        const auto& e = entry(h[i], c, i);
        only_keys(e, c, {"name", "type", "doc", "since"});
        header_field f;
        f.name = str(e, c, "name");
        check_name(c, f.name);
        f.type = str(e, c, "type");
        f.doc = str(e, c, "doc", false);
        f.since = static_cast<int>(integer(e, c, "since"));
        known_version(c, f.since);
        if (f.since < last_since) {
            fail("{}: {} (since {}) comes after a field of version {}: a version only appends fields", c, f.name,
                 f.since, last_since);
        }
        if (f.since > last_since) {
            // The previous version's header ends here.
            if (offset != m.versions[static_cast<std::size_t>(last_since) - 1].header_len) {
                fail("wire.header: version {}'s fields add up to {} bytes, but its header_len is {}", last_since,
                     offset, m.versions[static_cast<std::size_t>(last_since) - 1].header_len);
            }
            last_since = f.since;
        }
        f.size = size_of(c, f.type);
        if (offset % f.size != 0) {
            fail("{}: {} ({}) would sit at offset {}, not a multiple of its size: C would pad it", c,
                 f.name, f.type, offset);
        }
        f.offset = offset;
        offset += f.size;
        m.header.push_back(std::move(f));
    }
    unique(m.header, "wire.header");
    if (last_since != newest) {
        fail("wire.header: no field of version {}; each version adds at least one", newest);
    }
    if (offset != m.versions.back().header_len) {
        fail("wire.header: the fields add up to {} bytes, but version {}'s header_len is {}", offset, newest,
             m.versions.back().header_len);
    }
    for (const auto* required : {"magic", "version", "type", "flags", "header_len", "status", "payload_len"}) {
        if (std::none_of(m.header.begin(), m.header.end(), [&](const auto& f) { return f.name == required; })) {
            fail("wire.header: no field {}: every frame carries it", required);
        }
    }
}

void read_rpc(const toml::table& top, model& m) {
    const auto& r = table_at(top, "rpc");
    for (const auto& [k, v] : r) {
        if (k.str().starts_with("code_")) {
            if (!v.is_integer()) {
                fail("rpc.{} must be an integer", k.str());
            }
            m.codes.emplace_back(std::string(k.str()), static_cast<int>(v.as_integer()->get()));
        }
    }
    // toml++ keeps keys sorted; the constants read better in their own
    // order (standard, then the application range), which sorting by value
    // from the largest gives.
    std::stable_sort(m.codes.begin(), m.codes.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    const auto code_of = [&](std::string_view name) {
        for (const auto& [k, v] : m.codes) {
            if (k == name) {
                return v;
            }
        }
        fail("rpc.{} is missing", name);
    };
    const int app_first = code_of("code_app_first");
    const int app_last = code_of("code_app_last");
    const int unlisted = code_of("code_unlisted_reason");

    const auto& reasons = array_at(r, "rpc", "reasons");
    for (std::size_t i = 0; i < reasons.size(); ++i) {
        const auto c = fmt::format("rpc.reasons[{}]", i);
        const auto& e = entry(reasons[i], c, i);
        only_keys(e, c, {"name", "code", "exit", "meaning", "outcome", "outcome_meaning"});
        reason x;
        x.name = str(e, c, "name");
        check_name(c, x.name);
        if (const auto code = opt_integer(e, c, "code")) {
            x.code = static_cast<int>(*code);
            x.meaning = str(e, c, "meaning");
        } else if (e.contains("meaning")) {
            fail("{} ({}): a meaning without a code: a reason raised as an error needs its code", c, x.name);
        }
        if (const auto ex = opt_integer(e, c, "exit")) {
            x.exit_code = static_cast<int>(*ex);
        }
        x.outcome = str(e, c, "outcome", false);
        if (!x.outcome.empty()) {
            if (x.outcome != "never_sent" && x.outcome != "failed" && x.outcome != "unknown") {
                fail("{} ({}): outcome \"{}\" is not never_sent, failed or unknown", c, x.name, x.outcome);
            }
            x.outcome_meaning = str(e, c, "outcome_meaning");
        } else if (e.contains("outcome_meaning")) {
            fail("{} ({}): outcome_meaning without an outcome", c, x.name);
        }
        if (!x.code && x.outcome.empty()) {
            fail("{} ({}): neither a code (an error) nor an outcome: what is it?", c, x.name);
        }
        if (x.code && *x.code >= app_first && *x.code <= app_last) {
            if (*x.code == unlisted) {
                fail("{} ({}): code {} is kept for unlisted reasons", c, x.name, *x.code);
            }
            for (const auto& y : m.reasons) {
                if (y.code && *y.code == *x.code) {
                    fail("{} ({}): code {} is already {}'s; application codes are one per reason", c, x.name,
                         *x.code, y.name);
                }
            }
        } else if (x.code && !(*x.code <= -32600 && *x.code >= -32700)) {
            fail("{} ({}): code {} is neither a JSON-RPC standard code nor in [{}, {}]", c, x.name, *x.code,
                 app_first, app_last);
        }
        if (x.exit_code < 1 || x.exit_code > 125) {
            fail("{} ({}): exit status {} is outside 1-125", c, x.name, x.exit_code);
        }
        m.reasons.push_back(std::move(x));
    }
    unique(m.reasons, "rpc.reasons");

    const auto& cr = array_at(r, "rpc", "client_reasons");
    for (std::size_t i = 0; i < cr.size(); ++i) {
        const auto c = fmt::format("rpc.client_reasons[{}]", i);
        const auto& e = entry(cr[i], c, i);
        only_keys(e, c, {"name", "exit", "meaning"});
        client_reason x;
        x.name = str(e, c, "name");
        check_name(c, x.name);
        x.exit_code = static_cast<int>(integer(e, c, "exit"));
        x.meaning = str(e, c, "meaning");
        if (std::any_of(m.reasons.begin(), m.reasons.end(), [&](const auto& y) { return y.name == x.name; })) {
            fail("{} ({}): also a server reason; a client reason must not shadow one", c, x.name);
        }
        m.client_reasons.push_back(std::move(x));
    }
    unique(m.client_reasons, "rpc.client_reasons");

    const auto& states = array_at(r, "rpc", "states");
    for (std::size_t i = 0; i < states.size(); ++i) {
        const auto c = fmt::format("rpc.states[{}]", i);
        const auto& e = entry(states[i], c, i);
        only_keys(e, c, {"name", "active", "finishes_job", "next", "meaning"});
        state s;
        s.name = str(e, c, "name");
        check_name(c, s.name);
        s.active = boolean(e, c, "active");
        s.finishes_job = boolean(e, c, "finishes_job");
        s.meaning = str(e, c, "meaning");
        if (const auto* n = e.get("next")) {
            if (!n->is_array()) {
                fail("{} ({}): next must be an array of state names", c, s.name);
            }
            for (const auto& x : *n->as_array()) {
                if (!x.is_string()) {
                    fail("{} ({}): next must hold state names", c, s.name);
                }
                s.next.emplace_back(x.as_string()->get());
            }
        }
        if (s.active && s.finishes_job) {
            fail("{} ({}): an active state cannot end the job", c, s.name);
        }
        if (!s.active && !s.next.empty()) {
            fail("{} ({}): a terminal state has no next state", c, s.name);
        }
        if (s.active && s.next.empty()) {
            fail("{} ({}): an active state must lead somewhere (next)", c, s.name);
        }
        m.states.push_back(std::move(s));
    }
    unique(m.states, "rpc.states");
    if (m.states.size() > 32) {
        fail("rpc.states: {} states; the transition masks hold 32", m.states.size());
    }
    for (const auto& s : m.states) {
        for (const auto& n : s.next) {
            if (std::none_of(m.states.begin(), m.states.end(), [&](const auto& t) { return t.name == n; })) {
                fail("rpc.states ({}): next names \"{}\", which is no state", s.name, n);
            }
        }
    }

    const auto& bstates = array_at(r, "rpc", "block_states");
    for (std::size_t i = 0; i < bstates.size(); ++i) {
        const auto c = fmt::format("rpc.block_states[{}]", i);
        const auto& e = entry(bstates[i], c, i);
        only_keys(e, c, {"name", "live", "meaning"});
        block_state b;
        b.name = str(e, c, "name");
        check_name(c, b.name);
        b.live = boolean(e, c, "live");
        b.meaning = str(e, c, "meaning");
        m.block_states.push_back(std::move(b));
    }
    unique(m.block_states, "rpc.block_states");
    if (std::none_of(m.block_states.begin(), m.block_states.end(), [](const auto& b) { return b.live; })) {
        fail("rpc.block_states: no live state; a block must start live");
    }

    const auto& roles = array_at(r, "rpc", "roles");
    for (std::size_t i = 0; i < roles.size(); ++i) {
        const auto c = fmt::format("rpc.roles[{}]", i);
        const auto& e = entry(roles[i], c, i);
        only_keys(e, c, {"name", "bit", "meaning"});
        role x;
        x.name = str(e, c, "name");
        check_name(c, x.name);
        x.bit = static_cast<int>(integer(e, c, "bit"));
        x.meaning = str(e, c, "meaning");
        if (x.bit < -1 || x.bit > 7) {
            fail("{} ({}): bit {} is outside -1 (none) .. 7", c, x.name, x.bit);
        }
        m.roles.push_back(std::move(x));
    }
    unique(m.roles, "rpc.roles");

    const auto& methods = array_at(r, "rpc", "methods");
    for (std::size_t i = 0; i < methods.size(); ++i) {
        const auto c = fmt::format("rpc.methods[{}]", i);
        const auto& e = entry(methods[i], c, i);
        only_keys(e, c, {"name", "role"});
        method x;
        x.name = str(e, c, "name");
        check_name(c, x.name);
        x.role = str(e, c, "role");
        if (std::none_of(m.roles.begin(), m.roles.end(), [&](const auto& y) { return y.name == x.role; })) {
            fail("{} ({}): role \"{}\" is no role of rpc.roles", c, x.name, x.role);
        }
        m.methods.push_back(std::move(x));
    }
    unique(m.methods, "rpc.methods");

    m.event_method = str(r, "rpc", "event_method");
    const auto& events = array_at(r, "rpc", "events");
    for (std::size_t i = 0; i < events.size(); ++i) {
        const auto c = fmt::format("rpc.events[{}]", i);
        const auto& e = entry(events[i], c, i);
        only_keys(e, c, {"name", "tenant"});
        event x;
        x.name = str(e, c, "name");
        check_name(c, x.name);
        x.tenant = boolean(e, c, "tenant");
        m.events.push_back(std::move(x));
    }
    unique(m.events, "rpc.events");

    // A wire error's outcome is a job outcome reason.
    for (const auto& we : m.errors) {
        if (we.outcome.empty()) {
            continue;
        }
        const auto it = std::find_if(m.reasons.begin(), m.reasons.end(),
                                     [&](const auto& x) { return x.name == we.outcome; });
        if (it == m.reasons.end() || it->outcome.empty()) {
            fail("wire.errors ({}): outcome \"{}\" is no outcome reason of rpc.reasons", we.name, we.outcome);
        }
    }
}

void read_envelope(const toml::table& top, model& m) {
    const auto& e = table_at(top, "envelope");
    only_keys(e, "envelope", {"doc", "format", "result_format", "max_circuits", "qasm_header"});
    m.envelope_doc = str(e, "envelope", "doc");
    m.envelope_format = str(e, "envelope", "format");
    m.envelope_result_format = str(e, "envelope", "result_format");
    m.envelope_max_circuits = static_cast<int>(integer(e, "envelope", "max_circuits"));
    m.qasm_header = str(e, "envelope", "qasm_header");
}

void read_auth(const toml::table& top, model& m) {
    const auto& a = table_at(top, "auth");
    only_keys(a, "auth", {"doc", "payload_version"});
    m.auth_doc = str(a, "auth", "doc");
    m.auth_payload_version = str(a, "auth", "payload_version");
    if (m.auth_payload_version.empty() ||
        m.auth_payload_version.find_first_of(" \t\n") != std::string::npos) {
        fail("auth.payload_version \"{}\" must be one word: it is the payload's first", m.auth_payload_version);
    }
}

}  // namespace

load_result load(const std::string& path) {
    load_result out;
    try {
        const toml::table top = toml::parse_file(path);
        only_keys(top, path, {"format", "wire", "rpc", "envelope", "auth"});
        if (integer(top, path, "format") != 1) {
            fail("{}: format {} is not 1, the one this qrt-protogen reads", path, integer(top, path, "format"));
        }
        model m;
        read_wire(top, m);
        read_rpc(top, m);
        read_envelope(top, m);
        read_auth(top, m);
        out.m = std::move(m);
    } catch (const toml::parse_error& e) {
        out.error = fmt::format("{}: line {}: {}", path, e.source().begin.line, e.description());
    } catch (const bad_table& e) {
        out.error = fmt::format("{}: {}", path, e.what());
    }
    return out;
}

}  // namespace qrt::protogen
