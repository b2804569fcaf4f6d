// libFuzzer target for the restore journal parser, which root reads: the
// bytes are a journal file's text.  Pure: no file I/O per input.  Checked on
// every input:
//   - parsing never crashes, and the counts it reports are consistent
//     (valid bytes within the input, line numbers increasing);
//   - every record it accepts has canonical paths, formats back to one line
//     that parses to an equal record (the one parser reads what the one
//     formatter writes), and is described on one printable line;
//   - the restore allow-list decides every record without crashing, and
//     admits no file outside /proc/irq, the qrt cgroups and the workqueue
//     masks, and no knob outside /proc/sys and /sys.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>

#include "rtcore/journal_record.hpp"
#include "rtcore/restore_allow.hpp"

namespace {

[[noreturn]] void fail(const char* what, std::string_view detail) {
    std::fprintf(stderr, "fuzz_journal: %s: %.*s\n", what, static_cast<int>(detail.size()), detail.data());
    std::abort();
}

const rtcore::restore_allow_list& allow() {
    static const rtcore::restore_allow_list a{{"/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/unified"}, "qrt", true};
    return a;
}

bool printable(std::string_view s) {
    for (char c : s) {
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
            return false;
        }
    }
    return true;
}

void check_paths(const rtcore::journal_record& r) {
    std::visit(
        [](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, rtcore::rec::file> || std::is_same_v<T, rtcore::rec::ctl>) {
                if (!rtcore::canonical_path(x.path)) {
                    fail("accepted a non-canonical path", x.path);
                }
            } else if constexpr (std::is_same_v<T, rtcore::rec::mkcg>) {
                if (!rtcore::canonical_path(x.dir) || !rtcore::canonical_path(x.parent)) {
                    fail("accepted a non-canonical cgroup", x.dir);
                }
            } else if constexpr (std::is_same_v<T, rtcore::rec::knob>) {
                if (!rtcore::canonical_path(x.path) || x.set.empty()) {
                    fail("accepted a bad knob record", x.path);
                }
            } else if constexpr (std::is_same_v<T, rtcore::rec::nomove>) {
                if (x.tid <= 0) {
                    fail("accepted a bad nomove record", "");
                }
            } else if constexpr (std::is_same_v<T, rtcore::rec::cg>) {
                if (!rtcore::canonical_path(x.from) || x.tid <= 0) {
                    fail("accepted a bad cg record", x.from);
                }
            }
        },
        r);
}

void check_allowed_file(const rtcore::journal_record& r) {
    if (const auto* k = std::get_if<rtcore::rec::knob>(&r); k != nullptr && allow().check(r)) {
        const std::string_view p = k->path;
        if (p.substr(0, 10) != "/proc/sys/" && p.substr(0, 5) != "/sys/") {
            fail("the allow-list admitted the knob", p);
        }
        return;
    }
    const auto* f = std::get_if<rtcore::rec::file>(&r);
    if (f == nullptr || !allow().check(r)) {
        return;
    }
    const std::string_view p = f->path;
    const bool irq = p.substr(0, 10) == "/proc/irq/";
    const bool cgroup = p.substr(0, 15) == "/sys/fs/cgroup/";
    const bool workqueue = p.substr(0, 31) == "/sys/devices/virtual/workqueue/";
    if (!irq && !cgroup && !workqueue) {
        fail("the allow-list admitted", p);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const auto parsed = rtcore::journal_parse_text(text);
    if (parsed.valid_bytes > size) {
        fail("valid_bytes beyond the input", "");
    }
    std::size_t last_line = 0;
    for (const auto& e : parsed.entries) {
        if (e.line <= last_line) {
            fail("line numbers not increasing", "");
        }
        last_line = e.line;
        check_paths(e.record);
        (void)allow().check(e.record);
        check_allowed_file(e.record);
        const std::string d = rtcore::describe(e.record);
        if (!printable(d) || d.size() > 2048) {
            fail("describe() is not one short printable line", d);
        }
        const std::string line = rtcore::journal_format(e.record);
        if (line.empty() || line.back() != '\n' || line.find('\n') != line.size() - 1) {
            fail("format is not one line", line);
        }
        if (line.size() >= rtcore::journal_max_line_bytes) {
            continue;  // raw bytes in a field re-escape 3:1; append would refuse it
        }
        auto back = rtcore::journal_parse(std::string_view(line).substr(0, line.size() - 1));
        if (!back) {
            fail("a formatted record does not parse back", back.err().message);
        }
        if (!(*back == e.record)) {
            fail("a record changed across format and parse", line);
        }
    }
    return 0;
}
