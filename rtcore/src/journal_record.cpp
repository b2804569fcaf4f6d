// The restore journal's record format: escaping, checksum, and each kind's
// fields.  See journal_record.hpp.

#include "rtcore/journal_record.hpp"

#include <array>
#include <charconv>
#include <climits>
#include <utility>

namespace rtcore {

namespace {

constexpr std::array<std::uint32_t, 256> make_crc_table() {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) {
            c = (c & 1U) != 0 ? 0xEDB88320U ^ (c >> 1) : c >> 1;
        }
        t[i] = c;
    }
    return t;
}
constexpr auto crc_table = make_crc_table();

using fields = std::vector<std::string>;

error bad(std::string_view kind, const std::string& why) {
    return error::invalid(std::string(kind) + " record: " + why);
}

template <typename T>
bool to_number(std::string_view s, T& out) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return !s.empty() && ec == std::errc{} && p == s.data() + s.size();
}

// A field shown in an error: printable, short.
std::string shown(std::string_view s) {
    std::string e = journal_escape(s);
    if (e.size() > 80) {
        e = e.substr(0, 77) + "...";
    }
    return "\"" + e + "\"";
}

result<std::string> path_field(std::string_view kind, const char* name, const std::string& v) {
    if (!canonical_path(v)) {
        return bad(kind, std::string(name) + " " + shown(v) + " is not a canonical absolute path");
    }
    return v;
}

result<pid_t> tid_field(std::string_view kind, const std::string& v) {
    long long n = 0;
    if (!to_number(std::string_view(v), n) || n <= 0 || n > INT_MAX) {
        return bad(kind, "tid " + shown(v) + " is not a thread id");
    }
    return static_cast<pid_t>(n);
}

result<std::uint64_t> ticks_field(std::string_view kind, const std::string& v) {
    std::uint64_t n = 0;
    if (!to_number(std::string_view(v), n)) {
        return bad(kind, "start time " + shown(v) + " is not a number of clock ticks");
    }
    return n;
}

// A CPU list in the kernel's list form; empty only when allowed.
result<cpu_set> cpus_field(std::string_view kind, const char* name, const std::string& v, bool may_be_empty) {
    if (v.empty()) {
        if (may_be_empty) {
            return cpu_set{};
        }
        return bad(kind, std::string(name) + " is empty");
    }
    if (v.find_first_of(" \t\n") != std::string::npos) {
        return bad(kind, std::string(name) + " " + shown(v) + " is not a CPU list");
    }
    auto s = cpu_set::parse_list(v);
    if (!s) {
        return bad(kind, std::string(name) + ": " + s.err().message);
    }
    if (s->empty() && !may_be_empty) {
        return bad(kind, std::string(name) + " is empty");
    }
    return *s;
}

bool token_chars(std::string_view s, std::size_t max, bool (*ok)(char)) {
    if (s.empty() || s.size() > max) {
        return false;
    }
    for (char c : s) {
        if (!ok(c)) {
            return false;
        }
    }
    return true;
}

bool boot_id_char(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-';
}
bool controller_char(char c) { return (c >= 'a' && c <= 'z') || c == '_'; }

status want(std::string_view kind, const fields& f, std::size_t n) {
    if (f.size() != n) {
        return bad(kind, "has " + std::to_string(f.size()) + " fields, expected " + std::to_string(n));
    }
    return ok();
}

// ------------------------------------------------------------ each kind
// encode(): the fields after the kind.  decode(): the fields back, every
// one checked for form.

fields encode(const rec::header& r) {
    if (r.root.empty()) {  // version 1 had no root field
        return {std::to_string(r.version), r.boot_id};
    }
    return {std::to_string(r.version), r.boot_id, r.root};
}
result<rec::header> decode(std::in_place_type_t<rec::header>, const fields& f) {
    constexpr auto k = rec::header::kind;
    // Version 1 had no root; it decodes so the journal layer can name it.
    if (f.size() != 2 && f.size() != 3) {
        return bad(k, "has " + std::to_string(f.size()) + " fields, expected 3");
    }
    rec::header r;
    if (!to_number(std::string_view(f[0]), r.version)) {
        return bad(k, "version " + shown(f[0]) + " is not a number");
    }
    if (!token_chars(f[1], 64, boot_id_char)) {
        return bad(k, "boot id " + shown(f[1]) + " is not a boot id");
    }
    r.boot_id = f[1];
    if (f.size() == 2) {
        if (r.version != 1) {
            return bad(k, "version " + f[0] + " header has no root field");
        }
        r.root.clear();
        return r;
    }
    auto root = path_field(k, "root", f[2]);
    if (!root) {
        return root.err();
    }
    r.root = *root;
    return r;
}

fields encode(const rec::apply& r) { return {r.isolated.to_list(), r.housekeeping.to_list(), rec::to_string(r.by)}; }
result<rec::apply> decode(std::in_place_type_t<rec::apply>, const fields& f) {
    constexpr auto k = rec::apply::kind;
    if (auto st = want(k, f, 3); !st) {
        return st.err();
    }
    auto iso = cpus_field(k, "isolated set", f[0], false);
    if (!iso) {
        return iso.err();
    }
    auto hk = cpus_field(k, "housekeeping set", f[1], false);
    if (!hk) {
        return hk.err();
    }
    rec::apply r{*iso, *hk, rec::applier::host_apply};
    if (f[2] == rec::to_string(rec::applier::run)) {
        r.by = rec::applier::run;
    } else if (f[2] != rec::to_string(rec::applier::host_apply)) {
        return bad(k, "applier " + shown(f[2]) + " is not host-apply or run");
    }
    return r;
}

fields encode(const rec::method& r) { return {to_string(r.used)}; }
result<rec::method> decode(std::in_place_type_t<rec::method>, const fields& f) {
    constexpr auto k = rec::method::kind;
    if (auto st = want(k, f, 1); !st) {
        return st.err();
    }
    auto m = parse_isolation_method(f[0]);
    if (!m) {
        return bad(k, shown(f[0]) + " is not an isolation method");
    }
    return rec::method{*m};
}

fields encode(const rec::managed& r) { return {std::to_string(r.irq)}; }
result<rec::managed> decode(std::in_place_type_t<rec::managed>, const fields& f) {
    constexpr auto k = rec::managed::kind;
    if (auto st = want(k, f, 1); !st) {
        return st.err();
    }
    rec::managed r;
    if (!to_number(std::string_view(f[0]), r.irq)) {
        return bad(k, "IRQ " + shown(f[0]) + " is not a number");
    }
    return r;
}

fields encode(const rec::file& r) { return {r.path, r.original}; }
result<rec::file> decode(std::in_place_type_t<rec::file>, const fields& f) {
    constexpr auto k = rec::file::kind;
    if (auto st = want(k, f, 2); !st) {
        return st.err();
    }
    auto p = path_field(k, "path", f[0]);
    if (!p) {
        return p.err();
    }
    return rec::file{*p, f[1]};
}

fields encode(const rec::ctl& r) { return {r.path, r.controller}; }
result<rec::ctl> decode(std::in_place_type_t<rec::ctl>, const fields& f) {
    constexpr auto k = rec::ctl::kind;
    if (auto st = want(k, f, 2); !st) {
        return st.err();
    }
    auto p = path_field(k, "path", f[0]);
    if (!p) {
        return p.err();
    }
    if (!token_chars(f[1], 32, controller_char)) {
        return bad(k, "controller " + shown(f[1]) + " is not a controller name");
    }
    return rec::ctl{*p, f[1]};
}

fields encode(const rec::mkcg& r) { return {r.dir, r.parent}; }
result<rec::mkcg> decode(std::in_place_type_t<rec::mkcg>, const fields& f) {
    constexpr auto k = rec::mkcg::kind;
    if (auto st = want(k, f, 2); !st) {
        return st.err();
    }
    auto d = path_field(k, "directory", f[0]);
    if (!d) {
        return d.err();
    }
    auto p = path_field(k, "parent", f[1]);
    if (!p) {
        return p.err();
    }
    return rec::mkcg{*d, *p};
}

fields encode(const rec::cg& r) {
    return {std::to_string(r.tid), std::to_string(r.start), r.from, r.affinity ? r.affinity->to_list() : ""};
}
result<rec::cg> decode(std::in_place_type_t<rec::cg>, const fields& f) {
    constexpr auto k = rec::cg::kind;
    if (auto st = want(k, f, 4); !st) {
        return st.err();
    }
    auto tid = tid_field(k, f[0]);
    if (!tid) {
        return tid.err();
    }
    auto start = ticks_field(k, f[1]);
    if (!start) {
        return start.err();
    }
    auto from = path_field(k, "cgroup", f[2]);
    if (!from) {
        return from.err();
    }
    rec::cg r{*tid, *start, *from, std::nullopt};
    if (!f[3].empty()) {
        auto a = cpus_field(k, "affinity", f[3], false);
        if (!a) {
            return a.err();
        }
        r.affinity = *a;
    }
    return r;
}

fields encode(const rec::aff& r) {
    return {std::to_string(r.tid), std::to_string(r.start), r.original.to_list(), r.set.to_list()};
}
result<rec::aff> decode(std::in_place_type_t<rec::aff>, const fields& f) {
    constexpr auto k = rec::aff::kind;
    if (auto st = want(k, f, 4); !st) {
        return st.err();
    }
    auto tid = tid_field(k, f[0]);
    if (!tid) {
        return tid.err();
    }
    auto start = ticks_field(k, f[1]);
    if (!start) {
        return start.err();
    }
    auto orig = cpus_field(k, "original affinity", f[2], false);
    if (!orig) {
        return orig.err();
    }
    auto set = cpus_field(k, "affinity set", f[3], false);
    if (!set) {
        return set.err();
    }
    return rec::aff{*tid, *start, *orig, *set};
}

fields encode(const rec::knob& r) { return {r.path, r.original, r.set}; }
result<rec::knob> decode(std::in_place_type_t<rec::knob>, const fields& f) {
    constexpr auto k = rec::knob::kind;
    if (auto st = want(k, f, 3); !st) {
        return st.err();
    }
    auto p = path_field(k, "path", f[0]);
    if (!p) {
        return p.err();
    }
    // What qrtd writes is one short value: a number or a CPU mask or list.
    if (f[2].empty() || f[2].size() > 1024 || f[2].find_first_of(" \t\n") != std::string::npos) {
        return bad(k, "value set " + shown(f[2]) + " is not a knob value");
    }
    return rec::knob{*p, f[1], f[2]};
}

fields encode(const rec::nomove& r) { return {std::to_string(r.tid), std::to_string(r.start)}; }
result<rec::nomove> decode(std::in_place_type_t<rec::nomove>, const fields& f) {
    constexpr auto k = rec::nomove::kind;
    if (auto st = want(k, f, 2); !st) {
        return st.err();
    }
    auto tid = tid_field(k, f[0]);
    if (!tid) {
        return tid.err();
    }
    auto start = ticks_field(k, f[1]);
    if (!start) {
        return start.err();
    }
    return rec::nomove{*tid, *start};
}

// ------------------------------------------------------------ dispatch

// Decodes fields as the kind named, trying each alternative of the variant.
template <std::size_t I = 0>
result<journal_record> decode_kind(std::string_view kind, const fields& f) {
    if constexpr (I == std::variant_size_v<journal_record>) {
        std::string k = journal_escape(kind);
        if (k.size() > 40) {
            k = k.substr(0, 37) + "...";
        }
        return error::invalid("unknown record kind \"" + k + "\"");
    } else {
        using T = std::variant_alternative_t<I, journal_record>;
        if (kind == T::kind) {
            auto r = decode(std::in_place_type<T>, f);
            if (!r) {
                return r.err();
            }
            return journal_record(std::in_place_type<T>, std::move(*r));
        }
        return decode_kind<I + 1>(kind, f);
    }
}

void append_hex32(std::string& out, std::uint32_t c) {
    static constexpr char hex[] = "0123456789abcdef";
    for (int k = 0; k < 8; ++k) {
        out += hex[(c >> (28 - 4 * k)) & 0xFU];
    }
}

}  // namespace

std::string_view kind_of(const journal_record& r) {
    return std::visit([](const auto& x) { return std::decay_t<decltype(x)>::kind; }, r);
}

bool canonical_path(std::string_view p) {
    if (p.empty() || p.front() != '/' || p.size() > 4095) {
        return false;
    }
    if (p == "/") {
        return true;
    }
    if (p.back() == '/' || p.find('\0') != std::string_view::npos || p.find('\n') != std::string_view::npos) {
        return false;
    }
    std::size_t pos = 1;
    while (pos <= p.size()) {
        const auto slash = p.find('/', pos);
        const auto part = p.substr(pos, slash == std::string_view::npos ? std::string_view::npos : slash - pos);
        if (part.empty() || part == "." || part == "..") {
            return false;
        }
        if (slash == std::string_view::npos) {
            break;
        }
        pos = slash + 1;
    }
    return true;
}

std::uint32_t journal_crc32(std::string_view bytes) {
    std::uint32_t c = 0xFFFFFFFFU;
    for (char ch : bytes) {
        c = crc_table[(c ^ static_cast<unsigned char>(ch)) & 0xFFU] ^ (c >> 8);
    }
    return c ^ 0xFFFFFFFFU;
}

std::string journal_escape(std::string_view bytes) {
    if (bytes.empty()) {
        return "~";
    }
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(bytes.size());
    for (char ch : bytes) {
        const auto u = static_cast<unsigned char>(ch);
        if (u < 0x21 || u > 0x7e || ch == '%' || ch == '~') {
            out += '%';
            out += hex[u >> 4];
            out += hex[u & 0xFU];
        } else {
            out += ch;
        }
    }
    return out;
}

result<std::string> journal_unescape(std::string_view field) {
    if (field == "~") {
        return std::string();
    }
    std::string out;
    out.reserve(field.size());
    for (std::size_t i = 0; i < field.size(); ++i) {
        const char ch = field[i];
        if (ch == '~') {
            return error::invalid("journal field: \"~\" inside a field");
        }
        if (ch != '%') {
            out += ch;
            continue;
        }
        unsigned v = 0;
        if (i + 2 >= field.size()) {
            return error::invalid("journal field: truncated escape");
        }
        auto [p, ec] = std::from_chars(field.data() + i + 1, field.data() + i + 3, v, 16);
        if (ec != std::errc{} || p != field.data() + i + 3) {
            return error::invalid("journal field: bad escape");
        }
        out += static_cast<char>(v);
        i += 2;
    }
    return out;
}

std::string journal_format(const journal_record& r) {
    std::string body(kind_of(r));
    const fields f = std::visit([](const auto& x) { return encode(x); }, r);
    for (const auto& v : f) {
        body += ' ';
        body += journal_escape(v);
    }
    std::string line;
    line.reserve(body.size() + 10);
    append_hex32(line, journal_crc32(body));
    line += ' ';
    line += body;
    line += '\n';
    return line;
}

result<journal_record> journal_parse(std::string_view line) {
    if (line.size() < 10 || line.size() >= journal_max_line_bytes || line[8] != ' ') {
        return error{EBADMSG, "not a journal line"};
    }
    std::uint32_t want_crc = 0;
    auto [p, ec] = std::from_chars(line.data(), line.data() + 8, want_crc, 16);
    if (ec != std::errc{} || p != line.data() + 8) {
        return error{EBADMSG, "not a journal line (no checksum)"};
    }
    const auto body = line.substr(9);
    if (journal_crc32(body) != want_crc) {
        return error{EBADMSG, "bad checksum"};
    }
    // From here the line is as qrtd wrote it: anything out of form is not rot.
    std::string_view kind;
    fields f;
    std::size_t pos = 0;
    bool first = true;
    while (true) {
        const auto sp = body.find(' ', pos);
        const auto tok = body.substr(pos, sp == std::string_view::npos ? std::string_view::npos : sp - pos);
        if (tok.empty()) {
            return error::invalid("empty field");
        }
        if (first) {
            kind = tok;
            first = false;
        } else {
            auto v = journal_unescape(tok);
            if (!v) {
                return v.err();
            }
            f.push_back(std::move(*v));
        }
        if (sp == std::string_view::npos) {
            break;
        }
        pos = sp + 1;
    }
    return decode_kind(kind, f);
}

journal_text journal_parse_text(std::string_view text) {
    journal_text out;
    std::size_t pos = 0;
    std::size_t line_no = 0;
    while (pos < text.size()) {
        ++line_no;
        const auto nl = text.find('\n', pos);
        if (nl == std::string_view::npos) {
            out.torn_tail = true;  // a crash mid-append
            break;
        }
        const auto line = text.substr(pos, nl - pos);
        const bool last = nl + 1 == text.size();
        auto r = journal_parse(line);
        if (!r) {
            if (r.err().code == EBADMSG) {
                if (last) {
                    out.torn_tail = true;
                    break;
                }
                out.corrupt.push_back("line " + std::to_string(line_no) + " is corrupt (" + r.err().message +
                                      "); it was skipped");
            } else if (!out.invalid) {
                out.invalid = "line " + std::to_string(line_no) + ": " + r.err().message;
            }
        } else {
            out.entries.push_back(journal_text::entry{line_no, std::move(*r)});
        }
        pos = nl + 1;
        out.valid_bytes = pos;
    }
    return out;
}

std::string describe(const journal_record& r) {
    std::string out(kind_of(r));
    const fields f = std::visit([](const auto& x) { return encode(x); }, r);
    const bool is_file = std::holds_alternative<rec::file>(r) || std::holds_alternative<rec::knob>(r);
    for (std::size_t i = 0; i < f.size(); ++i) {
        if (is_file && i == 1) {
            out += " (" + std::to_string(f[i].size()) + " bytes)";
            continue;
        }
        std::string e = journal_escape(f[i]);
        if (e.size() > 100) {
            e = e.substr(0, 97) + "...";
        }
        out += ' ';
        out += e;
    }
    return out;
}

}  // namespace rtcore
