#pragma once
// The restore journal: every change qrtd makes to the host is preceded by a
// durable record of what was there before, so `restore` can put the host
// back byte for byte, also after the applying process died by SIGKILL.
//
// File: <state_dir>/host-journal, one record a line:
//     <crc32 of the rest, 8 hex> <kind> <field> <field> ...\n
// Fields are escaped: bytes outside '!'..'~' and the bytes '%' and '~' are
// written %XX, and an empty field is "~".  Every append is one write(2)
// followed by fsync(2) of the file (and of the directory when the file was
// created), before the caller touches the host.  A torn last line (no newline
// or a bad checksum) is what a crash mid-append leaves; it is ignored and cut
// off before the next append.  A bad line that is not the last is corruption:
// it is reported and makes restore incomplete.
//
// Kinds:
//   journal <version> <boot_id>           first line
//   apply <isolated> <housekeeping>       informational
//   method <name>                         informational (isolation used)
//   managed <irq>                         informational (kernel-managed IRQ)
//   file <path> <original bytes>          restore: write the bytes back
//   ctl <subtree_control path> <name>     restore: write "-name" (v2 controller we enabled)
//   mkcg <dir> <parent>                   restore: move stragglers to parent, rmdir
//   cg <tid> <start> <from dir> <affinity> restore: attach to from dir, set affinity
//   aff <tid> <start> <original> <set>    restore: set original if still <set>
//
// Only the first original per path (and per thread) is kept, so re-applying
// after a crash never records qrtd's own values as originals.
//
// A journal written in another boot (its boot_id differs from
// /proc/sys/kernel/random/boot_id) is never continued: the reboot reset every
// value it recorded, and continuing it would keep this boot's originals out.
// open() renames it to host-journal.<its boot id>.stale (kept for the admin,
// the directory fsynced) and starts a fresh journal; set_aside_reason() says so.

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/task_ops.hpp"

namespace rtcore {

struct journal_record {
    std::string kind;
    std::vector<std::string> fields;
};

// One line of a restore report.
struct restore_item {
    enum class outcome { restored, unchanged, gone, skipped, failed };
    outcome result = outcome::restored;
    std::string what;    // "/proc/irq/36/smp_affinity_list", "task 812 (sshd)", ...
    std::string detail;  // "0 -> 0-1", or the reason it could not be restored
    std::string line() const;
};

struct restore_outcome {
    std::vector<restore_item> items;
    std::vector<std::string> problems;  // corrupt lines, a journal that cannot be removed
    bool complete = true;               // every record restored (or nothing to do)
    bool journal_removed = false;
    bool journal_found = false;
    bool other_boot = false;            // written before the last reboot: nothing to undo
};

class restore_journal {
public:
    static constexpr const char* file_name = "host-journal";
    static constexpr const char* version = "1";

    // Opens the journal in state_dir for appending, creating it if needed and
    // loading what is already there.  A journal from another boot is set
    // aside first (see above).  A missing or unwritable state_dir is an
    // error.  fs is only read (boot_id).  In dry-run mode nothing is written
    // to disk; records are kept in memory (an other-boot journal is ignored).
    static result<restore_journal> open(const host_fs& fs, const std::filesystem::path& state_dir,
                                        bool dry_run = false);

    // Reads the journal in state_dir without opening it for writing.
    // An absent journal gives an empty record list.
    static result<std::vector<journal_record>> load(const std::filesystem::path& state_dir,
                                                    std::vector<std::string>* problems = nullptr);

    restore_journal(restore_journal&& other) noexcept;
    restore_journal& operator=(restore_journal&& other) noexcept;
    restore_journal(const restore_journal&) = delete;
    restore_journal& operator=(const restore_journal&) = delete;
    ~restore_journal();

    const std::filesystem::path& path() const { return _path; }
    const std::vector<journal_record>& records() const { return _records; }
    std::size_t size() const { return _records.size(); }
    bool existed() const { return _existed; }
    // Non-empty when open() set aside (dry run: would set aside) a journal
    // from another boot: where it went, and one line of words saying why.
    const std::filesystem::path& set_aside_path() const { return _set_aside_path; }
    const std::string& set_aside_reason() const { return _set_aside_reason; }

    // Informational and structural records (durable before returning).
    status append(const journal_record& rec);
    status append(const std::vector<journal_record>& recs);  // one write, one fsync

    // Saves the current bytes of each path that has no original yet (paths
    // under a directory qrtd created are skipped: rmdir undoes them).  One
    // fsync for the batch.  A path that cannot be read is an error.
    status save_files(const host_fs& fs, const std::vector<std::string>& paths);
    status save_file(const host_fs& fs, const std::string& path) { return save_files(fs, {path}); }
    bool has_file(std::string_view path) const { return _files.count(std::string(path)) != 0; }
    bool has_task(pid_t tid) const { return _tids.count(tid) != 0; }
    bool created(std::string_view dir) const;  // path is under a directory qrtd created
    bool made_dir(std::string_view dir) const;  // dir itself has a mkcg record

private:
    restore_journal() = default;
    status write_lines(const std::vector<journal_record>& recs);
    void index(const journal_record& rec);
    void note_set_aside(const host_fs& fs, const std::string& then_boot);

    std::filesystem::path _path;
    int _fd = -1;
    bool _dry_run = false;
    bool _existed = false;
    std::vector<journal_record> _records;
    std::set<std::string> _files;
    std::set<pid_t> _tids;
    std::vector<std::string> _created_dirs;
    std::filesystem::path _set_aside_path;
    std::string _set_aside_reason;
};

// The boot id a journal's records were written in, when that is known and is
// not the current boot (/proc/sys/kernel/random/boot_id); nullopt otherwise.
std::optional<std::string> journal_other_boot(const host_fs& fs, const std::vector<journal_record>& recs);

// Puts back everything recorded in state_dir's journal, newest first, and
// removes the journal when every record was restored.  Idempotent; a missing
// journal is "nothing to restore".  A missing state_dir is an error.
result<restore_outcome> restore_from_journal(host_fs& fs, task_ops& tasks,
                                             const std::filesystem::path& state_dir);

// Undoes records [from, end) of an open journal (newest first) without
// removing anything from the journal: used to unwind one failed step.
restore_outcome unwind_since(host_fs& fs, task_ops& tasks, const restore_journal& journal,
                             std::size_t from);

// Line format helpers, exposed for tests.
std::string journal_escape(std::string_view bytes);
result<std::string> journal_unescape(std::string_view field);
std::uint32_t journal_crc32(std::string_view bytes);
std::string journal_format(const journal_record& rec);
// nullopt for a torn or corrupt line.
std::optional<journal_record> journal_parse(std::string_view line);

}  // namespace rtcore
