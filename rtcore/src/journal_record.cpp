// The restore journal's record format: escaping, checksum, and each kind's
// fields.  See journal_record.hpp.

#include "rtcore/journal_record.hpp"

#include <array>
#include <charconv>
#include <climits>
#include <utility>

#include "rtcore/text.hpp"

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

// A field shown in an error: printable, short.
std::string shown(std::string_view s) {
    std::string e = journal_escape(s);
    if (e.size() > 80) {
        e = e.substr(0, 77) + "...";
    }
    return "\"" + e + "\"";
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

// Reads one record's fields in order, each checked for form.  The first
// field out of form (or a wrong field count) is the record's error; once
// there is one, the later reads return empty values and check nothing, so a
// decode is one braced list of reads (evaluated left to right) and finish().
class field_reader {
public:
    // The kind has `most` fields, or from `least` to `most`.
    field_reader(std::string_view kind, const fields& f, std::size_t most, std::size_t least = 0)
        : _kind(kind), _f(f) {
        if (f.size() > most || f.size() < (least == 0 ? most : least)) {
            fail("has " + std::to_string(f.size()) + " fields, expected " + std::to_string(most));
        }
    }

    std::size_t count() const { return _f.size(); }
    bool failed() const { return _err.has_value(); }
    void fail(const std::string& why) {
        if (!_err) {
            _err = bad(_kind, why);
        }
    }
    // The next field as it is (any bytes).
    std::string text() { return next().value_or(std::string()); }
    // Whether the next field is empty, without reading it.
    bool next_empty() const { return _at < _f.size() && _f[_at].empty(); }
    void skip() { ++_at; }

    std::string path(const char* name) {
        return check(
            next(), [](const std::string& v) { return canonical_path(v); },
            [&](const std::string& v) {
                return std::string(name) + " " + shown(v) + " is not a canonical absolute path";
            });
    }
    pid_t tid() {
        const auto v = next();
        if (!v) {
            return 0;
        }
        const auto n = parse_decimal<long long>(*v);
        if (!n || *n <= 0 || *n > INT_MAX) {
            fail("tid " + shown(*v) + " is not a thread id");
            return 0;
        }
        return static_cast<pid_t>(*n);
    }
    std::uint64_t ticks() {
        return number<std::uint64_t>(
            [](const std::string& v) { return "start time " + shown(v) + " is not a number of clock ticks"; });
    }
    template <typename T, typename Why>
    T number(Why why) {
        const auto v = next();
        if (!v) {
            return T{};
        }
        const auto n = parse_decimal<T>(*v);
        if (!n) {
            fail(why(*v));
            return T{};
        }
        return *n;
    }
    // A CPU list in the kernel's list form, never empty.
    cpu_set cpus(const char* name) {
        const auto v = next();
        if (!v) {
            return cpu_set{};
        }
        if (v->empty()) {
            fail(std::string(name) + " is empty");
            return cpu_set{};
        }
        if (v->find_first_of(" \t\n") != std::string::npos) {
            fail(std::string(name) + " " + shown(*v) + " is not a CPU list");
            return cpu_set{};
        }
        auto s = cpu_set::parse_list(*v);
        if (!s) {
            fail(std::string(name) + ": " + s.err().message);
            return cpu_set{};
        }
        if (s->empty()) {
            fail(std::string(name) + " is empty");
        }
        return *s;
    }
    // A word of at most max characters, each accepted by ok: "<name> "x"
    // is not a <noun>" otherwise.
    std::string token(std::size_t max, bool (*ok)(char), const char* name, const char* noun) {
        return check(
            next(), [&](const std::string& v) { return token_chars(v, max, ok); },
            [&](const std::string& v) { return std::string(name) + " " + shown(v) + " is not a " + noun; });
    }

    // The record read, or the first field's error.
    template <typename R>
    result<R> finish(R r) {
        if (_err) {
            return *_err;
        }
        return r;
    }

private:
    // The next field, or nullopt once a field (or the count) failed.
    std::optional<std::string> next() {
        if (_err || _at >= _f.size()) {
            return std::nullopt;
        }
        return _f[_at++];
    }
    template <typename Ok, typename Why>
    std::string check(std::optional<std::string> v, Ok ok, Why why) {
        if (!v) {
            return std::string();
        }
        if (!ok(*v)) {
            fail(why(*v));
            return std::string();
        }
        return std::move(*v);
    }

    std::string_view _kind;
    const fields& _f;
    std::size_t _at = 0;
    std::optional<error> _err;
};

// ------------------------------------------------------------ each kind
// encode(): the fields after the kind.  decode(): the fields back, every
// one checked for form (field_reader).

fields encode(const rec::header& r) {
    if (r.root.empty()) {  // version 1 had no root field
        return {std::to_string(r.version), r.boot_id};
    }
    return {std::to_string(r.version), r.boot_id, r.root};
}
result<rec::header> decode(std::in_place_type_t<rec::header>, const fields& f) {
    // Version 1 had no root; it decodes so the journal layer can name it.
    field_reader in(rec::header::kind, f, 3, 2);
    const bool has_root = in.count() == 3;
    rec::header r{in.number<unsigned>([](const std::string& v) { return "version " + shown(v) + " is not a number"; }),
                  in.token(64, boot_id_char, "boot id", "boot id"), std::string()};
    if (has_root) {
        r.root = in.path("root");
    } else if (!in.failed() && r.version != 1) {
        in.fail("version " + f[0] + " header has no root field");
    }
    return in.finish(std::move(r));
}

fields encode(const rec::apply& r) { return {r.isolated.to_list(), r.housekeeping.to_list(), rec::to_string(r.by)}; }
result<rec::apply> decode(std::in_place_type_t<rec::apply>, const fields& f) {
    field_reader in(rec::apply::kind, f, 3);
    rec::apply r{in.cpus("isolated set"), in.cpus("housekeeping set"), rec::applier::host_apply};
    const std::string by = in.text();
    if (by == rec::to_string(rec::applier::run)) {
        r.by = rec::applier::run;
    } else if (!in.failed() && by != rec::to_string(rec::applier::host_apply)) {
        in.fail("applier " + shown(by) + " is not host-apply or run");
    }
    return in.finish(std::move(r));
}

fields encode(const rec::method& r) { return {to_string(r.used)}; }
result<rec::method> decode(std::in_place_type_t<rec::method>, const fields& f) {
    field_reader in(rec::method::kind, f, 1);
    const std::string name = in.text();
    const auto m = parse_isolation_method(name);
    if (!in.failed() && !m) {
        in.fail(shown(name) + " is not an isolation method");
    }
    return in.finish(rec::method{m.value_or(isolation_method::none)});
}

fields encode(const rec::managed& r) { return {std::to_string(r.irq)}; }
result<rec::managed> decode(std::in_place_type_t<rec::managed>, const fields& f) {
    field_reader in(rec::managed::kind, f, 1);
    rec::managed r{in.number<unsigned>([](const std::string& v) { return "IRQ " + shown(v) + " is not a number"; })};
    return in.finish(r);
}

fields encode(const rec::file& r) { return {r.path, r.original}; }
result<rec::file> decode(std::in_place_type_t<rec::file>, const fields& f) {
    field_reader in(rec::file::kind, f, 2);
    rec::file r{in.path("path"), in.text()};
    return in.finish(std::move(r));
}

fields encode(const rec::ctl& r) { return {r.path, r.controller}; }
result<rec::ctl> decode(std::in_place_type_t<rec::ctl>, const fields& f) {
    field_reader in(rec::ctl::kind, f, 2);
    rec::ctl r{in.path("path"), in.token(32, controller_char, "controller", "controller name")};
    return in.finish(std::move(r));
}

fields encode(const rec::mkcg& r) { return {r.dir, r.parent}; }
result<rec::mkcg> decode(std::in_place_type_t<rec::mkcg>, const fields& f) {
    field_reader in(rec::mkcg::kind, f, 2);
    rec::mkcg r{in.path("directory"), in.path("parent")};
    return in.finish(std::move(r));
}

fields encode(const rec::cg& r) {
    return {std::to_string(r.tid), std::to_string(r.start), r.from, r.affinity ? r.affinity->to_list() : ""};
}
result<rec::cg> decode(std::in_place_type_t<rec::cg>, const fields& f) {
    field_reader in(rec::cg::kind, f, 4);
    rec::cg r{in.tid(), in.ticks(), in.path("cgroup"), std::nullopt};
    if (in.next_empty()) {
        in.skip();  // no affinity recorded
    } else if (auto a = in.cpus("affinity"); !in.failed()) {
        r.affinity = a;
    }
    return in.finish(std::move(r));
}

fields encode(const rec::aff& r) {
    return {std::to_string(r.tid), std::to_string(r.start), r.original.to_list(), r.set.to_list()};
}
result<rec::aff> decode(std::in_place_type_t<rec::aff>, const fields& f) {
    field_reader in(rec::aff::kind, f, 4);
    rec::aff r{in.tid(), in.ticks(), in.cpus("original affinity"), in.cpus("affinity set")};
    return in.finish(std::move(r));
}

fields encode(const rec::knob& r) { return {r.path, r.original, r.set}; }
result<rec::knob> decode(std::in_place_type_t<rec::knob>, const fields& f) {
    field_reader in(rec::knob::kind, f, 3);
    rec::knob r{in.path("path"), in.text(), in.text()};
    // What qrtd writes is one short value: a number or a CPU mask or list.
    const bool one_value = !r.set.empty() && r.set.size() <= 1024 && r.set.find_first_of(" \t\n") == std::string::npos;
    if (!in.failed() && !one_value) {
        in.fail("value set " + shown(r.set) + " is not a knob value");
    }
    return in.finish(std::move(r));
}

fields encode(const rec::nomove& r) { return {std::to_string(r.tid), std::to_string(r.start)}; }
result<rec::nomove> decode(std::in_place_type_t<rec::nomove>, const fields& f) {
    field_reader in(rec::nomove::kind, f, 2);
    rec::nomove r{in.tid(), in.ticks()};
    return in.finish(r);
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
