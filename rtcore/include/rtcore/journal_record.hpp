#pragma once
// The records of the restore journal, typed, and their one text format.
//
// A journal is text, one record a line:
//     <crc32 of the rest, 8 hex> <kind> <field> <field> ...\n
// Fields are escaped: bytes outside '!'..'~' and the bytes '%' and '~' are
// written %XX, and an empty field is "~".  The CRC (zlib's CRC-32) finds
// torn and rotted lines; it is no defence against forgery -- the journal
// is trusted because it lives in a directory only root can write
// (restore_journal.hpp), and every path in it must also pass the restore
// allow-list (restore_allow.hpp) before anything is written.
//
// Kinds (version 2):
//   journal <version> <boot_id> <root>      first line; root is the host_fs
//                                           root its paths resolve under
//   apply <isolated> <housekeeping> <by>    the partition; by: host-apply|run
//   method <name>                           isolation method used
//   managed <irq>                           kernel-managed IRQ, never retried
//   file <path> <original bytes>            restore: write the bytes back
//   ctl <subtree_control path> <name>       restore: write "-name"
//   mkcg <dir> <parent>                     restore: move stragglers, rmdir
//   cg <tid> <start> <from dir> <affinity>  restore: attach to from, set affinity
//   aff <tid> <start> <original> <set>      restore: set original if still set
//   knob <path> <original> <set>            a runtime knob (knob_catalogue.hpp):
//                                           restore writes original back if
//                                           the file still reads set
//   nomove <tid> <start>                    a kernel thread whose affinity the
//                                           kernel fixes (per-CPU): never retried
//
// Everything is parsed into the structs below here and nowhere else: tids
// are pid_t, CPU sets rtcore::cpu_set, paths canonical absolute paths.
// Adding a kind: a struct with its `kind`, an encode/decode pair in
// journal_record.cpp, an undo in journal_undo.cpp and its rule in
// restore_allow.cpp; std::visit makes a missing piece a compile error.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/isolation_method.hpp"

namespace rtcore {

namespace rec {

enum class applier { host_apply, run };
constexpr const char* to_string(applier a) { return a == applier::run ? "run" : "host-apply"; }

struct header {
    static constexpr std::string_view kind = "journal";
    unsigned version = 2;
    std::string boot_id;
    std::string root = "/";  // empty in a version-1 header
    bool operator==(const header&) const = default;
};
struct apply {
    static constexpr std::string_view kind = "apply";
    cpu_set isolated;
    cpu_set housekeeping;
    applier by = applier::host_apply;
    bool operator==(const apply&) const = default;
};
struct method {
    static constexpr std::string_view kind = "method";
    isolation_method used = isolation_method::none;
    bool operator==(const method&) const = default;
};
struct managed {
    static constexpr std::string_view kind = "managed";
    unsigned irq = 0;
    bool operator==(const managed&) const = default;
};
struct file {
    static constexpr std::string_view kind = "file";
    std::string path;
    std::string original;
    bool operator==(const file&) const = default;
};
struct ctl {
    static constexpr std::string_view kind = "ctl";
    std::string path;        // a cgroup.subtree_control file
    std::string controller;  // enabled by qrtd: restore writes "-controller"
    bool operator==(const ctl&) const = default;
};
struct mkcg {
    static constexpr std::string_view kind = "mkcg";
    std::string dir;
    std::string parent;
    bool operator==(const mkcg&) const = default;
};
struct cg {
    static constexpr std::string_view kind = "cg";
    pid_t tid = 0;
    std::uint64_t start = 0;  // start time in clock ticks: tells a reused tid apart
    std::string from;         // the cgroup it was moved out of
    std::optional<cpu_set> affinity;
    bool operator==(const cg&) const = default;
};
struct aff {
    static constexpr std::string_view kind = "aff";
    pid_t tid = 0;
    std::uint64_t start = 0;
    cpu_set original;
    cpu_set set;  // what apply set; restore leaves a task that changed it since
    bool operator==(const aff&) const = default;
};

struct knob {
    static constexpr std::string_view kind = "knob";
    std::string path;      // one of the knob paths (knob_catalogue.hpp)
    std::string original;  // the bytes read before the first change
    std::string set;       // what qrtd wrote; restore leaves a file that changed since
    bool operator==(const knob&) const = default;
};
struct nomove {
    static constexpr std::string_view kind = "nomove";
    pid_t tid = 0;
    std::uint64_t start = 0;
    bool operator==(const nomove&) const = default;
};

}  // namespace rec

using journal_record = std::variant<rec::header, rec::apply, rec::method, rec::managed, rec::file, rec::ctl,
                                    rec::mkcg, rec::cg, rec::aff, rec::knob, rec::nomove>;

inline constexpr unsigned journal_version = 2;
// A longer line is never written (append refuses it) and never parsed.
inline constexpr std::size_t journal_max_line_bytes = 64 * 1024;
// A larger journal file is refused unread, and append never makes one: a
// batch that would take the file past it is refused whole, before the host
// is touched, so restore can always read what was written.
inline constexpr std::size_t journal_max_bytes = 64 * 1024 * 1024;
// A journal past this size drops the records of tasks that have exited at
// the next verify (restore_journal::compact).
inline constexpr std::size_t journal_compact_bytes = 1024 * 1024;

std::string_view kind_of(const journal_record& r);

// One line, newline included.
std::string journal_format(const journal_record& r);
// One line without its newline.  Error code EBADMSG: not a journal line
// (torn, bad checksum); EINVAL: the checksum holds but the record does not
// parse (unknown kind, wrong field count, a field out of form).
result<journal_record> journal_parse(std::string_view line);

// A whole journal's text, parsed.  Pure: no I/O (the fuzz target's entry).
struct journal_text {
    struct entry {
        std::size_t line = 0;  // 1-based
        journal_record record;
    };
    std::vector<entry> entries;
    // Lines that are not journal lines (bad checksum) and are not the last:
    // rot.  Skipped, and each named here.
    std::vector<std::string> corrupt;
    // The first line whose checksum holds but whose record does not parse:
    // nothing in such a journal may be replayed.
    std::optional<std::string> invalid;
    bool torn_tail = false;       // a last line cut short by a crash
    std::size_t valid_bytes = 0;  // up to the end of the last line kept
};
journal_text journal_parse_text(std::string_view text);

// "file /proc/irq/36/smp_affinity_list (4 bytes)": one short printable line
// naming a record, for errors and reports.
std::string describe(const journal_record& r);

// Absolute, no empty, "." or ".." components, no trailing '/', no NUL or
// newline, at most 4095 bytes.
bool canonical_path(std::string_view p);

// Field escaping and the checksum, exposed for tests.
std::string journal_escape(std::string_view bytes);
result<std::string> journal_unescape(std::string_view field);
std::uint32_t journal_crc32(std::string_view bytes);

}  // namespace rtcore
