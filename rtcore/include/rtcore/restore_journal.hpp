#pragma once
// The restore journal file: every change qrtd makes to the host is preceded
// by a durable record of what was there before, so `restore` can put the
// host back byte for byte, also after the applying process died by SIGKILL.
//
// Where it lives: <journal dir>/host-journal, in a directory only root
// (the euid) may write: host.journal_dir, /var/lib/qrtd-host, root:root
// 0700.  Never in the daemon's state directory, which user qrtd owns: what
// a root helper replays must not be writable by the daemon's user.
// journal_dir::open checks the path (no symlink anywhere, safe parents,
// owner and mode: secure_dir.hpp) and takes host.lock in it, the one lock
// that keeps one qrtd at a time changing the host.  Every function here
// that reads or writes the journal takes a journal_dir: the proof that the
// directory was checked (and, except for dry runs, locked).  The same
// directory holds the journals of earlier boots (set aside) and the report
// of the last restore (who restored what, for the next command to print).
//
// Format and record kinds: journal_record.hpp.  Every append is one write(2)
// followed by fsync(2), before the caller touches the host.  A torn last
// line (no newline or a bad checksum) is what a crash mid-append leaves; it
// is ignored and cut off before the next append.  A bad line that is not the
// last is rot: it is reported and makes restore incomplete.  A line whose
// checksum holds but whose record does not parse, a record outside the
// restore allow-list (restore_allow.hpp), a version-1 journal, or a journal
// written for another host_fs root refuses the whole journal: nothing in it
// is written back, and the error names the file and the record.
//
// Only the first original per path (and per thread) is kept, so re-applying
// after a crash never records qrtd's own values as originals.  A thread is
// its tid and start time: a new thread on a reused tid gets its own record.
//
// Size: the file never grows past journal_max_bytes, the size load reads
// (append refuses a batch that would pass it, and nothing is written).  On a
// fence host every verify journals the new threads it fences, most of them
// short-lived; compact() drops the records of threads that have exited
// (their tid is gone or names a thread with another start time), which
// restore would only report as gone, by rewriting the file (a new file
// renamed over it, fsynced).  verify calls it before each sweep, so the
// journal stays the size of the threads still running.
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

#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/journal_record.hpp"
#include "rtcore/restore_allow.hpp"
#include "rtcore/secure_dir.hpp"
#include "rtcore/task_ops.hpp"
#include "rtcore/unique_fd.hpp"

namespace rtcore {

class journal_dir {
public:
    static constexpr const char* lock_name = "host.lock";
    static constexpr const char* report_name = "last-restore";
    static constexpr std::size_t report_max_bytes = 256 * 1024;

    struct options {
        bool create = true;  // make the directory (0700) when it is missing
        bool lock = true;    // take host.lock; a dry run reads without it
        lock_wait wait;      // how long to wait for another holder
        std::string holder;  // written into host.lock: "pid 812: qrtd host apply"
    };
    static result<journal_dir> open(const std::filesystem::path& path, const options& opts);

    const std::filesystem::path& path() const { return _dir.path(); }
    const secure_dir& dir() const { return _dir; }
    bool locked() const { return _lock.has_value(); }
    const dir_lock* lock() const { return _lock ? &*_lock : nullptr; }
    // Closes this process's lock fd (a forked helper keeps holding it).
    void release_lock() { _lock.reset(); }

    // The report of the last restore (root-owned, replaced atomically), for
    // the next command to say what was restored and by whom.  Read back only
    // to be printed.
    status write_report(std::string_view text) const;
    result<std::optional<std::string>> read_report() const;
    // host-journal.<boot id>.stale files, full paths, sorted.
    std::vector<std::filesystem::path> stale_journals() const;

private:
    explicit journal_dir(secure_dir d) : _dir(std::move(d)) {}
    secure_dir _dir;
    std::optional<dir_lock> _lock;
};

// A journal as read (restore, verify).
struct loaded_journal {
    bool found = false;
    std::vector<journal_record> records;  // in file order, header first
    std::vector<std::size_t> lines;       // line number of each record
    std::vector<std::string> problems;    // rotted lines, skipped
    bool torn_tail = false;
    std::size_t valid_bytes = 0;
};

class restore_journal {
public:
    static constexpr const char* file_name = "host-journal";

    // Opens the journal in dir (which must be locked) for appending,
    // creating it if needed and loading what is already there; checks as
    // said above.  A journal of another boot is set aside first.
    static result<restore_journal> open(const host_fs& fs, const journal_dir& dir, const restore_allow_list& allow);
    // The same, for a dry run: nothing is written to disk; records are kept
    // in memory.  dir may be null (no journal directory yet); a journal of
    // another boot is ignored (and would be set aside).
    static result<restore_journal> open_dry_run(const host_fs& fs, const journal_dir* dir,
                                                const restore_allow_list& allow);

    // Reads dir's journal without opening it for writing, with the same
    // checks.  found = false when there is none.
    static result<loaded_journal> load(const host_fs& fs, const journal_dir& dir, const restore_allow_list& allow);

    restore_journal(restore_journal&& other) noexcept = default;
    restore_journal& operator=(restore_journal&& other) noexcept = default;
    restore_journal(const restore_journal&) = delete;
    restore_journal& operator=(const restore_journal&) = delete;
    ~restore_journal() = default;

    const std::filesystem::path& path() const { return _path; }
    const std::vector<journal_record>& records() const { return _records; }
    std::size_t size() const { return _records.size(); }
    bool existed() const { return _existed; }
    const restore_allow_list& allow() const { return _allow; }
    // The partition this journal records (its first apply record), or null.
    const rec::apply* partition() const;
    // The isolation method recorded, if any.
    std::optional<isolation_method> method() const;
    // Non-empty when open() set aside (dry run: would set aside) a journal
    // from another boot: where it went, and one line of words saying why.
    const std::filesystem::path& set_aside_path() const { return _set_aside_path; }
    const std::string& set_aside_reason() const { return _set_aside_reason; }

    // Appends records (one write, one fsync; durable before returning).
    // Each must pass the allow-list and fit journal_max_line_bytes, and the
    // file must stay within its size limit (journal_max_bytes), else
    // nothing is appended (EFBIG for the sizes).
    status append(const journal_record& rec);
    status append(const std::vector<journal_record>& recs);

    // Bytes of the journal file (what a dry run would have written).
    std::size_t bytes() const { return _bytes; }
    // When the file has grown past its compaction size (journal_compact_bytes,
    // then twice what the last compaction left), drops the records of threads
    // that have exited (cg, aff, nomove) and rewrites the file; a journal
    // below that size is left as it is.  A thread whose state cannot be read
    // (other than being gone) keeps its record.  The records' indices change:
    // never call it between taking a mark for unwind_since and the unwind.
    status compact(const host_fs& fs, task_ops& tasks);
    // Lower limits than journal_max_bytes and journal_compact_bytes, for
    // tests; max_bytes is never raised past journal_max_bytes.
    void set_limits(std::size_t max_bytes, std::size_t compact_bytes);

    // Saves the current bytes of each path that has no original yet (paths
    // under a directory qrtd created are skipped: rmdir undoes them).  One
    // fsync for the batch.  A path that cannot be read is an error.
    status save_files(const host_fs& fs, const std::vector<std::string>& paths);
    status save_file(const host_fs& fs, const std::string& path) { return save_files(fs, {path}); }
    bool has_file(std::string_view path) const { return _files.count(std::string(path)) != 0; }
    bool has_task(pid_t tid) const { return _tids.count(tid) != 0; }
    // A record of this very thread (tid and start time).
    bool has_task(pid_t tid, std::uint64_t start) const { return _task_keys.count({tid, start}) != 0; }
    bool created(std::string_view dir) const;   // path is under a directory qrtd created
    bool made_dir(std::string_view dir) const;  // dir itself has a mkcg record

private:
    restore_journal() = default;
    void index(const journal_record& rec);
    void reindex();
    void take(loaded_journal&& loaded);
    void note_set_aside(const host_fs& fs, const std::filesystem::path& dir, const std::string& then_boot);

    std::filesystem::path _path;
    std::optional<secure_dir> _dir;  // null for a dry run
    unique_fd _fd;
    bool _dry_run = false;
    std::size_t _bytes = 0;
    std::size_t _max_bytes = journal_max_bytes;
    std::size_t _compact_bytes = journal_compact_bytes;
    std::size_t _compact_at = journal_compact_bytes;
    bool _existed = false;
    restore_allow_list _allow;
    std::vector<journal_record> _records;
    std::set<std::string> _files;
    std::set<pid_t> _tids;
    std::set<std::pair<pid_t, std::uint64_t>> _task_keys;
    std::vector<std::string> _created_dirs;
    std::filesystem::path _set_aside_path;
    std::string _set_aside_reason;
};

// This boot's id (/proc/sys/kernel/random/boot_id), or "unknown".
std::string current_boot_id(const host_fs& fs);
// The boot id a journal's records were written in, when that is known and is
// not the current boot; nullopt otherwise.
std::optional<std::string> journal_other_boot(const host_fs& fs, const std::vector<journal_record>& recs);

}  // namespace rtcore
