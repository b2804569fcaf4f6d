// The restore journal file: the journal directory, loading with every
// check, appending, and setting aside a journal of an earlier boot.  See
// restore_journal.hpp; the record format is journal_record.cpp and the undo
// logic journal_undo.cpp.

#include "rtcore/restore_journal.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace rtcore {

namespace {

// A boot id fit for a file name: hex digits and '-' only.
std::string file_safe(std::string_view id) {
    std::string out;
    for (char c : id) {
        const bool good = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == '-';
        out += good ? c : '_';
    }
    return out.empty() ? std::string("unknown") : out;
}

bool exists_in(const secure_dir& dir, const std::string& name) {
    struct stat st {};
    return ::fstatat(dir.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT;
}

// Where an earlier boot's journal goes: host-journal.<boot id>.stale, never
// over an older one.
std::string stale_name(const secure_dir& dir, std::string_view boot) {
    const std::string base = std::string(restore_journal::file_name) + "." + file_safe(boot);
    std::string name = base + ".stale";
    for (int n = 1; n < 1000 && exists_in(dir, name); ++n) {
        name = base + "." + std::to_string(n) + ".stale";
    }
    return name;
}

// The host_fs root as a journal header records it: absolute, normal form.
std::string normal_root(const std::filesystem::path& p) {
    std::error_code ec;
    auto abs = std::filesystem::absolute(p, ec);
    std::string s = (ec ? p : abs).lexically_normal().string();
    while (s.size() > 1 && s.back() == '/') {
        s.pop_back();
    }
    return s;
}

// The thread a task record names (tid, start time), or nullopt.
std::optional<std::pair<pid_t, std::uint64_t>> task_of(const journal_record& r) {
    if (const auto* c = std::get_if<rec::cg>(&r)) {
        return std::make_pair(c->tid, c->start);
    }
    if (const auto* a = std::get_if<rec::aff>(&r)) {
        return std::make_pair(a->tid, a->start);
    }
    if (const auto* n = std::get_if<rec::nomove>(&r)) {
        return std::make_pair(n->tid, n->start);
    }
    return std::nullopt;
}

const rec::header* header_of(const std::vector<journal_record>& recs) {
    return recs.empty() ? nullptr : std::get_if<rec::header>(&recs.front());
}

// The checks every journal passes before a record of it is used.  An
// other-boot journal is only set aside, never replayed: its records are not
// checked against this host.
status check_loaded(const host_fs& fs, const std::string& path, const loaded_journal& j,
                    const restore_allow_list& allow) {
    if (j.records.empty()) {
        return ok();
    }
    const auto* h = header_of(j.records);
    if (h == nullptr) {
        return error::invalid(path + " line " + std::to_string(j.lines.front()) + ": the first record is \"" +
                              std::string(kind_of(j.records.front())) +
                              "\", not a journal header; refused, nothing in it is written back");
    }
    if (h->version != journal_version) {
        return error::invalid(
            path + " is a version-" + std::to_string(h->version) + " journal; this qrtd reads version " +
            std::to_string(journal_version) +
            " only.  Version-1 journals lived where the daemon's user could write them and are never replayed "
            "as root: check the host by hand (or reboot, which resets every value a journal records), then "
            "remove the file");
    }
    if (journal_other_boot(fs, j.records)) {
        return ok();
    }
    if (normal_root(h->root) != normal_root(fs.root())) {
        return error::invalid(path + " was written for the tree at " + h->root + ", not " + fs.root().string() +
                              "; refused, nothing in it is written back");
    }
    for (std::size_t i = 0; i < j.records.size(); ++i) {
        if (auto st = allow.check(j.records[i]); !st) {
            return error{st.err().code, path + " line " + std::to_string(j.lines[i]) + ": record `" +
                                            describe(j.records[i]) + "`: " + st.err().message +
                                            "; the whole journal is refused and nothing was written"};
        }
    }
    return ok();
}

}  // namespace

// ---------------------------------------------------------------- the directory

result<journal_dir> journal_dir::open(const std::filesystem::path& path, const options& opts) {
    constexpr const char* what = "journal directory";
    if (!opts.lock) {  // a dry run reads without the lock
        auto d = secure_dir::open(path, dir_policy::private_to_euid, what, opts.create);
        if (!d) {
            return d.err();
        }
        return journal_dir(std::move(*d));
    }
    locked_dir_options lo;
    lo.what = what;
    lo.policy = dir_policy::private_to_euid;  // owned by the euid: no write check needed
    lo.create = opts.create;
    lo.lock_name = lock_name;
    lo.wait = opts.wait;
    lo.holder = opts.holder;
    auto d = open_locked_dir(path, lo);
    if (!d) {
        return d.err();
    }
    journal_dir jd(std::move(d->dir));
    jd._lock.emplace(std::move(d->lock));
    return jd;
}

status journal_dir::write_report(std::string_view text) const { return _dir.replace_file(report_name, text, 0600); }

result<std::optional<std::string>> journal_dir::read_report() const {
    auto text = _dir.read_file(report_name, report_max_bytes);
    if (!text) {
        if (text.err().code == ENOENT) {
            return std::optional<std::string>();
        }
        return text.err();
    }
    return std::optional<std::string>(std::move(*text));
}

std::vector<std::filesystem::path> journal_dir::stale_journals() const {
    std::vector<std::filesystem::path> out;
    auto names = _dir.list();
    if (!names) {
        return out;
    }
    const std::string prefix = std::string(restore_journal::file_name) + ".";
    for (const auto& n : *names) {
        if (n.size() > prefix.size() + 6 && n.compare(0, prefix.size(), prefix) == 0 &&
            n.compare(n.size() - 6, 6, ".stale") == 0) {
            out.push_back(path() / n);
        }
    }
    return out;
}

// ---------------------------------------------------------------- boot ids

std::string current_boot_id(const host_fs& fs) {
    auto id = fs.read_line("/proc/sys/kernel/random/boot_id");
    if (!id || id->empty() || id->size() > 64) {
        return "unknown";
    }
    for (char c : *id) {
        const bool good = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-';
        if (!good) {
            return "unknown";
        }
    }
    return *id;
}

std::optional<std::string> journal_other_boot(const host_fs& fs, const std::vector<journal_record>& recs) {
    const auto* h = header_of(recs);
    if (h == nullptr || h->boot_id.empty() || h->boot_id == "unknown") {
        return std::nullopt;
    }
    const std::string now = current_boot_id(fs);
    if (now != "unknown" && now != h->boot_id) {
        return h->boot_id;
    }
    return std::nullopt;
}

// ---------------------------------------------------------------- loading

result<loaded_journal> restore_journal::load(const host_fs& fs, const journal_dir& dir,
                                             const restore_allow_list& allow) {
    loaded_journal out;
    const std::string path = (dir.path() / file_name).string();
    auto text = dir.dir().read_file(file_name, journal_max_bytes);
    if (!text) {
        if (text.err().code == ENOENT) {
            return out;
        }
        return text.err();
    }
    out.found = true;
    auto parsed = journal_parse_text(*text);
    if (parsed.invalid) {
        return error::invalid(path + " " + *parsed.invalid +
                              "; the whole journal is refused and nothing in it is written back");
    }
    for (auto& e : parsed.entries) {
        out.lines.push_back(e.line);
        out.records.push_back(std::move(e.record));
    }
    for (auto& c : parsed.corrupt) {
        out.problems.push_back("journal " + c);
    }
    out.torn_tail = parsed.torn_tail;
    out.valid_bytes = parsed.valid_bytes;
    if (auto st = check_loaded(fs, path, out, allow); !st) {
        return st.err();
    }
    return out;
}

void restore_journal::take(loaded_journal&& loaded) {
    _existed = !loaded.records.empty();
    _bytes = loaded.valid_bytes;
    for (auto& r : loaded.records) {
        index(r);
        _records.push_back(std::move(r));
    }
}

void restore_journal::note_set_aside(const host_fs& fs, const std::filesystem::path& stale,
                                     const std::string& then_boot) {
    _set_aside_path = stale;
    _set_aside_reason = _path.string() + " was written in boot " + then_boot + ", this is boot " +
                        current_boot_id(fs) + ": the reboot already reset every value it recorded, so it " +
                        (_dry_run ? "would be set aside as " : "was set aside as ") + _set_aside_path.string() +
                        " and this boot's originals start a fresh journal";
}

result<restore_journal> restore_journal::open_dry_run(const host_fs& fs, const journal_dir* dir,
                                                      const restore_allow_list& allow) {
    restore_journal j;
    j._dry_run = true;
    j._allow = allow;
    j._path = dir != nullptr ? dir->path() / file_name : std::filesystem::path(file_name);
    if (dir == nullptr) {
        return j;
    }
    auto loaded = load(fs, *dir, allow);
    if (!loaded) {
        return loaded.err();
    }
    if (auto then_boot = journal_other_boot(fs, loaded->records)) {
        // Its originals belong to a boot that is over: plan as on a fresh journal.
        j.note_set_aside(fs, dir->path() / stale_name(dir->dir(), *then_boot), *then_boot);
        return j;
    }
    j.take(std::move(*loaded));
    return j;
}

result<restore_journal> restore_journal::open(const host_fs& fs, const journal_dir& dir,
                                              const restore_allow_list& allow) {
    if (!dir.locked()) {
        return error::invalid("open " + (dir.path() / file_name).string() + " for writing: " +
                              journal_dir::lock_name + " is not held");
    }
    restore_journal j;
    j._allow = allow;
    j._path = dir.path() / file_name;
    auto loaded = load(fs, dir, allow);
    if (!loaded) {
        return loaded.err();
    }
    if (auto then_boot = journal_other_boot(fs, loaded->records)) {
        // A journal from before the last reboot: the reboot reset every value
        // it recorded, and continuing it would keep this boot's originals out
        // of it (only the first original per path is kept).  Keep it for the
        // admin under another name and start afresh.
        const std::string stale = stale_name(dir.dir(), *then_boot);
        j.note_set_aside(fs, dir.path() / stale, *then_boot);
        if (auto st = dir.dir().rename(file_name, stale); !st) {
            return error{st.err().code, st.err().message + " (setting aside the journal of boot " + *then_boot + ")"};
        }
        if (auto st = dir.dir().fsync(); !st) {
            return st.err();
        }
        loaded = loaded_journal{};
    }
    if (!loaded->problems.empty()) {
        return error::invalid(j._path.string() + ": " + loaded->problems.front() +
                              "; restore from it and check the report before applying again");
    }
    bool created = false;
    auto fd = dir.dir().open_file(file_name, O_RDWR | O_CREAT | O_EXCL | O_APPEND, 0600);
    if (fd) {
        created = true;
    } else if (fd.err().code == EEXIST) {
        fd = dir.dir().open_file(file_name, O_RDWR | O_APPEND);
    }
    if (!fd) {
        return fd.err();
    }
    j._fd = std::move(*fd);
    auto kept_dir = dir.dir().duplicate();
    if (!kept_dir) {
        return kept_dir.err();
    }
    j._dir.emplace(std::move(*kept_dir));
    if (!created && loaded->torn_tail) {
        // What a crash mid-append leaves: cut it off so the next record starts a clean line.
        if (::ftruncate(j._fd.get(), static_cast<off_t>(loaded->valid_bytes)) < 0) {
            const int err = errno;
            return error::from_errno(err, "ftruncate " + j._path.string());
        }
        if (::fsync(j._fd.get()) < 0) {
            const int err = errno;
            return error::from_errno(err, "fsync " + j._path.string());
        }
    }
    if (created) {
        if (auto st = dir.dir().fsync(); !st) {
            return st.err();
        }
    }
    j.take(std::move(*loaded));
    if (j._records.empty()) {
        if (auto st = j.append(rec::header{journal_version, current_boot_id(fs), normal_root(fs.root())}); !st) {
            return st.err();
        }
    }
    return j;
}

// ---------------------------------------------------------------- appending

void restore_journal::index(const journal_record& r) {
    if (auto t = task_of(r)) {
        _task_keys.insert(*t);
    }
    if (const auto* f = std::get_if<rec::file>(&r)) {
        _files.insert(f->path);
    } else if (const auto* m = std::get_if<rec::mkcg>(&r)) {
        _created_dirs.push_back(m->dir);
    } else if (const auto* c = std::get_if<rec::cg>(&r)) {
        _tids.insert(c->tid);
    } else if (const auto* a = std::get_if<rec::aff>(&r)) {
        _tids.insert(a->tid);
    }
}

void restore_journal::reindex() {
    _files.clear();
    _tids.clear();
    _task_keys.clear();
    _created_dirs.clear();
    for (const auto& r : _records) {
        index(r);
    }
}

const rec::apply* restore_journal::partition() const {
    for (const auto& r : _records) {
        if (const auto* a = std::get_if<rec::apply>(&r)) {
            return a;
        }
    }
    return nullptr;
}

std::optional<isolation_method> restore_journal::method() const {
    std::optional<isolation_method> m;
    for (const auto& r : _records) {
        if (const auto* x = std::get_if<rec::method>(&r)) {
            m = x->used;
        }
    }
    return m;
}

bool restore_journal::created(std::string_view path) const {
    for (const auto& d : _created_dirs) {
        if (path.size() > d.size() && path.substr(0, d.size()) == d && path[d.size()] == '/') {
            return true;
        }
    }
    return false;
}

bool restore_journal::made_dir(std::string_view dir) const {
    return std::find(_created_dirs.begin(), _created_dirs.end(), dir) != _created_dirs.end();
}

status restore_journal::append(const journal_record& rec) { return append(std::vector<journal_record>{rec}); }

status restore_journal::append(const std::vector<journal_record>& recs) {
    if (recs.empty()) {
        return ok();
    }
    std::string data;
    for (const auto& r : recs) {
        // What restore would refuse must never be written: apply fails now,
        // while it can still unwind, instead of leaving an unrestorable host.
        if (auto st = _allow.check(r); !st) {
            return error{st.err().code, "journal " + _path.string() + ": record `" + describe(r) +
                                            "` would not be restorable: " + st.err().message};
        }
        const std::string line = journal_format(r);
        if (line.size() >= journal_max_line_bytes) {
            return error{EFBIG, "journal " + _path.string() + ": record `" + describe(r) + "` is " +
                                    std::to_string(line.size()) + " bytes, more than the " +
                                    std::to_string(journal_max_line_bytes) + "-byte line limit"};
        }
        data += line;
    }
    if (data.size() > _max_bytes || _bytes > _max_bytes - data.size()) {
        return error{EFBIG, "journal " + _path.string() + ": " + std::to_string(recs.size()) + " records (" +
                                std::to_string(data.size()) + " bytes) would take it past its " +
                                std::to_string(_max_bytes) + "-byte limit (it holds " + std::to_string(_bytes) +
                                " bytes, the most restore reads); nothing was appended and nothing changed.  "
                                "The records are of threads still running (those of threads that exited are "
                                "dropped at each verify): restore the host partition, then apply it again"};
    }
    if (!_dry_run && !_fd) {
        return error{EBADF, "journal " + _path.string() +
                                " is closed after a failed rewrite; open it again (the next command does)"};
    }
    if (!_dry_run) {
        std::size_t off = 0;
        while (off < data.size()) {
            const ssize_t n = ::write(_fd.get(), data.data() + off, data.size() - off);
            if (n < 0) {
                const int err = errno;
                if (err == EINTR) {
                    continue;
                }
                return error::from_errno(err, "write " + _path.string());
            }
            off += static_cast<std::size_t>(n);
        }
        if (::fsync(_fd.get()) < 0) {
            const int err = errno;
            return error::from_errno(err, "fsync " + _path.string());
        }
    }
    for (const auto& r : recs) {
        index(r);
        _records.push_back(r);
    }
    _bytes += data.size();
    return ok();
}

void restore_journal::set_limits(std::size_t max_bytes, std::size_t compact_bytes) {
    _max_bytes = std::min(max_bytes, journal_max_bytes);
    _compact_bytes = compact_bytes;
    _compact_at = compact_bytes;
}

status restore_journal::compact(const host_fs& fs, task_ops& tasks) {
    if (_bytes <= _compact_at) {
        return ok();
    }
    std::vector<bool> keep(_records.size(), true);
    std::size_t dropped = 0;
    for (std::size_t i = 0; i < _records.size(); ++i) {
        const auto t = task_of(_records[i]);
        if (!t) {
            continue;
        }
        auto now = tasks.task(fs, t->first);
        const bool gone = now ? now->start_ticks != t->second : now.err().code == ESRCH;
        if (gone) {
            keep[i] = false;
            ++dropped;
        }
    }
    // The next compaction once the file has doubled again: the rewrites
    // cost a bounded share of what is appended.
    if (dropped == 0) {
        _compact_at = std::max(_compact_bytes, 2 * _bytes);
        return ok();
    }
    std::string text;
    std::vector<journal_record> kept;
    kept.reserve(_records.size() - dropped);
    for (std::size_t i = 0; i < _records.size(); ++i) {
        if (keep[i]) {
            text += journal_format(_records[i]);
            kept.push_back(std::move(_records[i]));
        }
    }
    if (!_dry_run) {
        // Until the new file is open nothing may be appended: the old fd
        // names the file the rename replaces.
        _fd.reset();
        auto restore_old = [&] {
            for (std::size_t i = 0, k = 0; i < _records.size(); ++i) {
                if (keep[i]) {
                    _records[i] = std::move(kept[k++]);
                }
            }
        };
        if (auto st = _dir->replace_file(file_name, text, 0600); !st) {
            restore_old();
            return error{st.err().code, "compacting journal " + _path.string() + ": " + st.err().message};
        }
        auto fd = _dir->open_file(file_name, O_RDWR | O_APPEND);
        if (!fd) {
            restore_old();
            return error{fd.err().code, "compacting journal " + _path.string() + ": " + fd.err().message};
        }
        _fd = std::move(*fd);
    }
    _records = std::move(kept);
    reindex();
    _bytes = text.size();
    _compact_at = std::max(_compact_bytes, 2 * _bytes);
    return ok();
}

status restore_journal::save_files(const host_fs& fs, const std::vector<std::string>& paths) {
    std::vector<journal_record> recs;
    std::set<std::string> seen;
    for (const auto& p : paths) {
        if (has_file(p) || created(p) || !seen.insert(p).second) {
            continue;
        }
        auto cur = fs.read(p);
        if (!cur) {
            return cur.err();
        }
        recs.emplace_back(rec::file{p, std::move(*cur)});
    }
    return append(recs);
}

}  // namespace rtcore
