#include "rtcore/restore_journal.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>

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

// An fd closed on every path out of a scope.
struct unique_fd {
    int fd = -1;
    explicit unique_fd(int f) : fd(f) {}
    unique_fd(const unique_fd&) = delete;
    unique_fd& operator=(const unique_fd&) = delete;
    ~unique_fd() {
        if (fd >= 0) {
            ::close(fd);
        }
    }
    int release() {
        const int f = fd;
        fd = -1;
        return f;
    }
};

status fsync_dir(const std::filesystem::path& dir) {
    unique_fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (d.fd < 0) {
        return error::from_errno("open " + dir.string());
    }
    if (::fsync(d.fd) < 0) {
        return error::from_errno("fsync " + dir.string());
    }
    return ok();
}

status check_state_dir(const std::filesystem::path& state_dir, bool need_write) {
    struct stat st {};
    if (::stat(state_dir.c_str(), &st) < 0) {
        const int e = errno;
        return error{e, "state directory " + state_dir.string() + ": " +
                            std::generic_category().message(e) +
                            " (create it first; qrtd keeps its restore journal there)"};
    }
    if (!S_ISDIR(st.st_mode)) {
        return error{ENOTDIR, "state directory " + state_dir.string() + " is not a directory"};
    }
    if (need_write && ::access(state_dir.c_str(), W_OK | X_OK) < 0) {
        const int e = errno;
        return error{e, "state directory " + state_dir.string() + " is not writable: " +
                            std::generic_category().message(e)};
    }
    return ok();
}

result<std::string> read_fd_all(int fd, const std::string& what) {
    std::string out;
    char buf[8192];
    if (::lseek(fd, 0, SEEK_SET) < 0) {
        return error::from_errno("lseek " + what);
    }
    while (true) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return error::from_errno("read " + what);
        }
        if (n == 0) {
            break;
        }
        out.append(buf, static_cast<std::size_t>(n));
    }
    return out;
}

struct parsed_journal {
    std::vector<journal_record> records;
    std::size_t valid_bytes = 0;  // up to the end of the last good line
    std::vector<std::string> problems;
    bool torn_tail = false;
};

parsed_journal parse_all(std::string_view text) {
    parsed_journal out;
    std::size_t pos = 0;
    std::size_t line_no = 0;
    while (pos < text.size()) {
        ++line_no;
        const auto nl = text.find('\n', pos);
        if (nl == std::string_view::npos) {
            out.torn_tail = true;  // a crash mid-append: ignore it
            break;
        }
        const auto line = text.substr(pos, nl - pos);
        auto rec = journal_parse(line);
        const bool last = nl + 1 == text.size();
        if (!rec) {
            if (last) {
                out.torn_tail = true;
                break;
            }
            out.problems.push_back("journal line " + std::to_string(line_no) +
                                   " is corrupt (bad checksum or format); it was skipped");
        } else {
            out.records.push_back(std::move(*rec));
        }
        pos = nl + 1;
        out.valid_bytes = pos;
    }
    return out;
}

std::string current_boot_id(const host_fs& fs) {
    auto id = fs.read_line("/proc/sys/kernel/random/boot_id");
    return id && !id->empty() ? *id : std::string("unknown");
}

// The boot id of a journal's first line, or "unknown".
std::string journal_boot_id(const std::vector<journal_record>& recs) {
    if (!recs.empty() && recs.front().kind == "journal" && recs.front().fields.size() >= 2 &&
        !recs.front().fields[1].empty()) {
        return recs.front().fields[1];
    }
    return "unknown";
}

// A boot id fit for a file name: hex digits and '-' only.
std::string file_safe(std::string_view id) {
    std::string out;
    for (char c : id) {
        const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == '-';
        out += ok ? c : '_';
    }
    return out.empty() ? std::string("unknown") : out;
}

// Where an earlier boot's journal goes: host-journal.<boot id>.stale, never
// over an older one.
std::filesystem::path stale_name(const std::filesystem::path& state_dir, std::string_view boot) {
    const std::string base = std::string(restore_journal::file_name) + "." + file_safe(boot);
    std::filesystem::path p = state_dir / (base + ".stale");
    for (int n = 1; n < 1000; ++n) {
        struct stat st {};
        if (::lstat(p.c_str(), &st) < 0 && errno == ENOENT) {
            break;
        }
        p = state_dir / (base + "." + std::to_string(n) + ".stale");
    }
    return p;
}

// For report details: short and on one line.
std::string show(std::string_view bytes) {
    std::string s(bytes);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) {
        s.pop_back();
    }
    for (auto& c : s) {
        if (c == '\n') {
            c = ' ';
        }
    }
    if (s.size() > 60) {
        s = s.substr(0, 57) + "...";
    }
    return s.empty() ? "(empty)" : s;
}

template <typename T>
bool to_number(std::string_view s, T& out) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return !s.empty() && ec == std::errc{} && p == s.data() + s.size();
}

bool has_token(std::string_view text, std::string_view token) {
    std::size_t pos = 0;
    while (pos < text.size()) {
        while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n')) {
            ++pos;
        }
        const auto end = text.find_first_of(" \n", pos);
        const auto tok = text.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
        if (tok == token) {
            return true;
        }
        if (end == std::string_view::npos) {
            break;
        }
        pos = end;
    }
    return false;
}

using outcome = restore_item::outcome;

restore_item undo_file(host_fs& fs, const std::string& path, const std::string& original) {
    restore_item it{outcome::restored, path, ""};
    auto cur = fs.read(path);
    if (!cur) {
        if (cur.err().code == ENOENT) {
            it.result = outcome::gone;
            it.detail = "no longer exists; nothing to restore";
        } else {
            it.result = outcome::failed;
            it.detail = cur.err().message;
        }
        return it;
    }
    if (*cur == original) {
        it.result = outcome::unchanged;
        it.detail = "already " + show(original);
        return it;
    }
    if (auto st = fs.write(path, original); !st) {
        it.result = outcome::failed;
        it.detail = st.err().message;
        return it;
    }
    it.detail = show(*cur) + " -> " + show(original);
    return it;
}

restore_item undo_ctl(host_fs& fs, const std::string& path, const std::string& name) {
    restore_item it{outcome::restored, path, ""};
    auto cur = fs.read(path);
    if (!cur) {
        it.result = cur.err().code == ENOENT ? outcome::gone : outcome::failed;
        it.detail = cur.err().message;
        return it;
    }
    if (!has_token(*cur, name)) {
        it.result = outcome::unchanged;
        it.detail = name + " already disabled";
        return it;
    }
    if (auto st = fs.write(path, "-" + name); !st) {
        it.result = outcome::failed;
        it.detail = st.err().message;
        return it;
    }
    it.detail = "disabled the " + name + " controller qrtd had enabled";
    return it;
}

restore_item undo_mkcg(host_fs& fs, task_ops& tasks, const std::string& dir, const std::string& parent) {
    restore_item it{outcome::restored, dir, ""};
    if (!fs.is_dir(dir)) {
        it.result = outcome::gone;
        it.detail = "already removed";
        return it;
    }
    std::size_t moved = 0;
    std::size_t stuck = 0;
    std::string stuck_reason;
    if (auto members = tasks.cgroup_tasks(fs, dir)) {
        for (pid_t tid : *members) {
            auto st = tasks.attach(fs, parent, tid);
            if (st) {
                ++moved;
            } else if (st.err().code != ESRCH) {
                ++stuck;
                stuck_reason = st.err().message;
            }
        }
    }
    if (auto st = tasks.remove_cgroup(fs, dir); !st) {
        it.result = outcome::failed;
        it.detail = st.err().message;
        if (stuck > 0) {
            it.detail += " (" + std::to_string(stuck) + " tasks could not be moved out: " + stuck_reason + ")";
        }
        return it;
    }
    it.detail = "removed";
    if (moved > 0) {
        it.detail += " after moving " + std::to_string(moved) + " remaining tasks to " + parent;
    }
    return it;
}

// The task named by a record, or nullopt when it exited (or the tid was reused).
std::optional<task_info> same_task(host_fs& fs, task_ops& tasks, pid_t tid, std::uint64_t start) {
    auto t = tasks.task(fs, tid);
    if (!t || t->start_ticks != start) {
        return std::nullopt;
    }
    return *t;
}

restore_item undo_cg(host_fs& fs, task_ops& tasks, const journal_record& rec) {
    restore_item it{outcome::restored, "task " + rec.fields[0], ""};
    pid_t tid = 0;
    std::uint64_t start = 0;
    if (!to_number(std::string_view(rec.fields[0]), tid) || !to_number(std::string_view(rec.fields[1]), start)) {
        it.result = outcome::failed;
        it.detail = "bad cg record";
        return it;
    }
    auto t = same_task(fs, tasks, tid, start);
    if (!t) {
        it.result = outcome::gone;
        it.detail = "exited; nothing to restore";
        return it;
    }
    it.what += " (" + t->comm + ")";
    bool moved = true;
    if (auto st = tasks.attach(fs, rec.fields[2], tid); !st) {
        if (st.err().code == ESRCH) {
            it.result = outcome::gone;
            it.detail = st.err().message;
            return it;
        }
        // A kernel thread that refused to move never left; anything else failed.
        auto members = tasks.cgroup_tasks(fs, rec.fields[2]);
        if (!members || std::find(members->begin(), members->end(), tid) == members->end()) {
            it.result = outcome::failed;
            it.detail = st.err().message;
            return it;
        }
        moved = false;
    }
    it.detail = moved ? "back in " + rec.fields[2] : "never left " + rec.fields[2];
    if (!rec.fields[3].empty()) {
        auto aff = cpu_set::parse_list(rec.fields[3]);
        if (!aff) {
            it.result = outcome::failed;
            it.detail = aff.err().message;
            return it;
        }
        auto cur = tasks.affinity(tid);
        if (cur && *cur == *aff) {
            if (!moved) {
                it.result = outcome::unchanged;
            }
            return it;
        }
        if (fs.dry_run()) {
            it.detail += ", would set affinity " + rec.fields[3];
            return it;
        }
        if (auto st = tasks.set_affinity(tid, *aff); !st) {
            it.result = st.err().code == ESRCH ? outcome::gone : outcome::failed;
            it.detail += "; " + st.err().message;
            return it;
        }
        it.detail += ", affinity " + rec.fields[3];
    }
    return it;
}

restore_item undo_aff(host_fs& fs, task_ops& tasks, const journal_record& rec) {
    restore_item it{outcome::restored, "task " + rec.fields[0], ""};
    pid_t tid = 0;
    std::uint64_t start = 0;
    auto orig = cpu_set::parse_list(rec.fields[2]);
    auto set = cpu_set::parse_list(rec.fields[3]);
    if (!to_number(std::string_view(rec.fields[0]), tid) || !to_number(std::string_view(rec.fields[1]), start) ||
        !orig || !set) {
        it.result = outcome::failed;
        it.detail = "bad aff record";
        return it;
    }
    auto t = same_task(fs, tasks, tid, start);
    if (!t) {
        it.result = outcome::gone;
        it.detail = "exited; nothing to restore";
        return it;
    }
    it.what += " (" + t->comm + ")";
    auto cur = tasks.affinity(tid);
    if (!cur) {
        it.result = cur.err().code == ESRCH ? outcome::gone : outcome::failed;
        it.detail = cur.err().message;
        return it;
    }
    if (*cur == *orig) {
        it.result = outcome::unchanged;
        it.detail = "affinity already " + orig->to_list();
        return it;
    }
    if (!(*cur == *set)) {
        it.result = outcome::skipped;
        it.detail = "affinity changed by someone else since (now " + cur->to_list() + "); left as is";
        return it;
    }
    if (fs.dry_run()) {
        it.detail = "would set affinity " + set->to_list() + " -> " + orig->to_list();
        return it;
    }
    if (auto st = tasks.set_affinity(tid, *orig); !st) {
        it.result = st.err().code == ESRCH ? outcome::gone : outcome::failed;
        it.detail = st.err().message;
        return it;
    }
    it.detail = "affinity " + set->to_list() + " -> " + orig->to_list();
    return it;
}

// nullopt for informational records.
std::optional<restore_item> undo(host_fs& fs, task_ops& tasks, const journal_record& rec) {
    const auto& k = rec.kind;
    const auto n = rec.fields.size();
    if (k == "file" && n == 2) {
        return undo_file(fs, rec.fields[0], rec.fields[1]);
    }
    if (k == "ctl" && n == 2) {
        return undo_ctl(fs, rec.fields[0], rec.fields[1]);
    }
    if (k == "mkcg" && n == 2) {
        return undo_mkcg(fs, tasks, rec.fields[0], rec.fields[1]);
    }
    if (k == "cg" && n == 4) {
        return undo_cg(fs, tasks, rec);
    }
    if (k == "aff" && n == 4) {
        return undo_aff(fs, tasks, rec);
    }
    if (k == "journal" || k == "apply" || k == "method" || k == "managed") {
        return std::nullopt;
    }
    return restore_item{outcome::failed, "journal record \"" + k + "\"", "unknown kind or field count"};
}

restore_outcome undo_range(host_fs& fs, task_ops& tasks, const std::vector<journal_record>& recs,
                           std::size_t from) {
    restore_outcome out;
    for (std::size_t i = recs.size(); i-- > from;) {
        auto item = undo(fs, tasks, recs[i]);
        if (!item) {
            continue;
        }
        if (item->result == outcome::failed) {
            out.complete = false;
        }
        out.items.push_back(std::move(*item));
    }
    return out;
}

}  // namespace

// ---------------------------------------------------------------- format

std::string restore_item::line() const {
    static constexpr const char* names[] = {"restored", "unchanged", "gone", "skipped", "FAILED"};
    return std::string(names[static_cast<int>(result)]) + " " + what + ": " + detail;
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
    for (std::size_t i = 0; i < field.size(); ++i) {
        const char ch = field[i];
        if (ch != '%') {
            out += ch;
            continue;
        }
        unsigned v = 0;
        if (i + 2 >= field.size()) {
            return error::invalid("journal field \"" + std::string(field) + "\": truncated escape");
        }
        auto [p, ec] = std::from_chars(field.data() + i + 1, field.data() + i + 3, v, 16);
        if (ec != std::errc{} || p != field.data() + i + 3) {
            return error::invalid("journal field \"" + std::string(field) + "\": bad escape");
        }
        out += static_cast<char>(v);
        i += 2;
    }
    return out;
}

std::string journal_format(const journal_record& rec) {
    std::string body = rec.kind;
    for (const auto& f : rec.fields) {
        body += ' ';
        body += journal_escape(f);
    }
    char crc[9];
    static constexpr char hex[] = "0123456789abcdef";
    const std::uint32_t c = journal_crc32(body);
    for (int k = 0; k < 8; ++k) {
        crc[k] = hex[(c >> (28 - 4 * k)) & 0xFU];
    }
    crc[8] = '\0';
    return std::string(crc) + " " + body + "\n";
}

std::optional<journal_record> journal_parse(std::string_view line) {
    if (line.size() < 10 || line[8] != ' ') {
        return std::nullopt;
    }
    std::uint32_t want = 0;
    auto [p, ec] = std::from_chars(line.data(), line.data() + 8, want, 16);
    if (ec != std::errc{} || p != line.data() + 8) {
        return std::nullopt;
    }
    const auto body = line.substr(9);
    if (journal_crc32(body) != want) {
        return std::nullopt;
    }
    journal_record rec;
    std::size_t pos = 0;
    bool first = true;
    while (pos <= body.size()) {
        const auto sp = body.find(' ', pos);
        const auto tok = body.substr(pos, sp == std::string_view::npos ? std::string_view::npos : sp - pos);
        if (tok.empty()) {
            return std::nullopt;
        }
        if (first) {
            rec.kind = std::string(tok);
            first = false;
        } else {
            auto f = journal_unescape(tok);
            if (!f) {
                return std::nullopt;
            }
            rec.fields.push_back(std::move(*f));
        }
        if (sp == std::string_view::npos) {
            break;
        }
        pos = sp + 1;
    }
    return rec;
}

// ---------------------------------------------------------------- journal

restore_journal::restore_journal(restore_journal&& o) noexcept
    : _path(std::move(o._path)),
      _fd(std::exchange(o._fd, -1)),
      _dry_run(o._dry_run),
      _existed(o._existed),
      _records(std::move(o._records)),
      _files(std::move(o._files)),
      _tids(std::move(o._tids)),
      _created_dirs(std::move(o._created_dirs)),
      _set_aside_path(std::move(o._set_aside_path)),
      _set_aside_reason(std::move(o._set_aside_reason)) {}

restore_journal& restore_journal::operator=(restore_journal&& o) noexcept {
    if (this != &o) {
        if (_fd >= 0) {
            ::close(_fd);
        }
        _path = std::move(o._path);
        _fd = std::exchange(o._fd, -1);
        _dry_run = o._dry_run;
        _existed = o._existed;
        _records = std::move(o._records);
        _files = std::move(o._files);
        _tids = std::move(o._tids);
        _created_dirs = std::move(o._created_dirs);
        _set_aside_path = std::move(o._set_aside_path);
        _set_aside_reason = std::move(o._set_aside_reason);
    }
    return *this;
}

restore_journal::~restore_journal() {
    if (_fd >= 0) {
        ::close(_fd);
    }
}

void restore_journal::index(const journal_record& rec) {
    if (rec.kind == "file" && !rec.fields.empty()) {
        _files.insert(rec.fields[0]);
    } else if (rec.kind == "mkcg" && !rec.fields.empty()) {
        _created_dirs.push_back(rec.fields[0]);
    } else if ((rec.kind == "cg" || rec.kind == "aff") && !rec.fields.empty()) {
        pid_t tid = 0;
        if (to_number(std::string_view(rec.fields[0]), tid)) {
            _tids.insert(tid);
        }
    }
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

result<std::vector<journal_record>> restore_journal::load(const std::filesystem::path& state_dir,
                                                          std::vector<std::string>* problems) {
    if (auto st = check_state_dir(state_dir, false); !st) {
        return st.err();
    }
    const auto path = state_dir / file_name;
    unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.fd < 0) {
        if (errno == ENOENT) {
            return std::vector<journal_record>{};
        }
        return error::from_errno("open " + path.string());
    }
    auto text = read_fd_all(fd.fd, path.string());
    if (!text) {
        return text.err();
    }
    auto parsed = parse_all(*text);
    if (problems != nullptr) {
        *problems = parsed.problems;
    }
    return std::move(parsed.records);
}

std::optional<std::string> journal_other_boot(const host_fs& fs, const std::vector<journal_record>& recs) {
    const std::string then_boot = journal_boot_id(recs);
    const std::string now_boot = current_boot_id(fs);
    if (then_boot != "unknown" && now_boot != "unknown" && then_boot != now_boot) {
        return then_boot;
    }
    return std::nullopt;
}

void restore_journal::note_set_aside(const host_fs& fs, const std::string& then_boot) {
    _set_aside_path = stale_name(_path.parent_path(), then_boot);
    _set_aside_reason = _path.string() + " was written in boot " + then_boot + ", this is boot " +
                        current_boot_id(fs) + ": the reboot already reset every value it recorded, so it " +
                        (_dry_run ? "would be set aside as " : "was set aside as ") + _set_aside_path.string() +
                        " and this boot's originals start a fresh journal";
}

result<restore_journal> restore_journal::open(const host_fs& fs, const std::filesystem::path& state_dir,
                                              bool dry_run) {
    if (auto st = check_state_dir(state_dir, !dry_run); !st) {
        return st.err();
    }
    restore_journal j;
    j._path = state_dir / file_name;
    j._dry_run = dry_run;
    if (dry_run) {
        std::vector<std::string> problems;
        auto recs = load(state_dir, &problems);
        if (!recs) {
            return recs.err();
        }
        if (auto then_boot = journal_other_boot(fs, *recs)) {
            // Its originals belong to a boot that is over: plan as on a fresh journal.
            j.note_set_aside(fs, *then_boot);
            recs->clear();
        }
        j._existed = !recs->empty();
        for (auto& r : *recs) {
            j.index(r);
            j._records.push_back(std::move(r));
        }
        return j;
    }
    bool created = false;
    int raw = ::open(j._path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600);
    if (raw >= 0) {
        created = true;
    } else if (errno == EEXIST) {
        raw = ::open(j._path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
    }
    if (raw < 0) {
        return error::from_errno("open " + j._path.string());
    }
    unique_fd fd(raw);
    if (::flock(fd.fd, LOCK_EX | LOCK_NB) < 0) {
        const int e = errno;
        return error{e, "flock " + j._path.string() + ": " + std::generic_category().message(e) +
                            " (another qrtd is applying or restoring)"};
    }
    auto text = read_fd_all(fd.fd, j._path.string());
    if (!text) {
        return text.err();
    }
    auto parsed = parse_all(*text);
    if (auto then_boot = journal_other_boot(fs, parsed.records)) {
        // A journal from before the last reboot: the reboot reset every value
        // it recorded, and continuing it would keep this boot's originals out
        // of it (only the first original per path is kept).  Keep it for the
        // admin under another name (still holding its lock) and start afresh.
        j.note_set_aside(fs, *then_boot);
        if (::rename(j._path.c_str(), j._set_aside_path.c_str()) < 0) {
            return error::from_errno("rename " + j._path.string() + " to " + j._set_aside_path.string() +
                                     " (setting aside the journal of boot " + *then_boot + ")");
        }
        if (auto st = fsync_dir(state_dir); !st) {
            return st.err();
        }
        unique_fd fresh(::open(j._path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600));
        if (fresh.fd < 0) {
            const int e = errno;
            return error{e, "open " + j._path.string() + ": " + std::generic_category().message(e) +
                                (e == EEXIST ? " (another qrtd started a journal at the same time)" : "")};
        }
        if (::flock(fresh.fd, LOCK_EX | LOCK_NB) < 0) {
            const int e = errno;
            return error{e, "flock " + j._path.string() + ": " + std::generic_category().message(e) +
                                " (another qrtd is applying or restoring)"};
        }
        ::close(fd.release());
        fd.fd = fresh.release();
        created = true;
        parsed = parsed_journal{};
    }
    if (!parsed.problems.empty()) {
        return error::invalid(j._path.string() + ": " + parsed.problems.front() +
                              "; run `qrtd host restore` and check its report before applying again");
    }
    if (parsed.torn_tail) {
        // What a crash mid-append leaves: cut it off so the next record starts a clean line.
        if (::ftruncate(fd.fd, static_cast<off_t>(parsed.valid_bytes)) < 0) {
            return error::from_errno("ftruncate " + j._path.string());
        }
        if (::fsync(fd.fd) < 0) {
            return error::from_errno("fsync " + j._path.string());
        }
    }
    j._fd = fd.release();
    j._existed = !parsed.records.empty();
    for (auto& r : parsed.records) {
        j.index(r);
        j._records.push_back(std::move(r));
    }
    if (created) {
        if (auto st = fsync_dir(state_dir); !st) {
            return st.err();
        }
    }
    if (j._records.empty()) {
        if (auto st = j.append(journal_record{"journal", {version, current_boot_id(fs)}}); !st) {
            return st.err();
        }
    }
    return j;
}

status restore_journal::write_lines(const std::vector<journal_record>& recs) {
    if (recs.empty()) {
        return ok();
    }
    if (!_dry_run) {
        std::string data;
        for (const auto& r : recs) {
            data += journal_format(r);
        }
        std::size_t off = 0;
        while (off < data.size()) {
            const ssize_t n = ::write(_fd, data.data() + off, data.size() - off);
            if (n < 0) {
                if (errno == EINTR) {
                    continue;
                }
                return error::from_errno("write " + _path.string());
            }
            off += static_cast<std::size_t>(n);
        }
        if (::fsync(_fd) < 0) {
            return error::from_errno("fsync " + _path.string());
        }
    }
    for (const auto& r : recs) {
        index(r);
        _records.push_back(r);
    }
    return ok();
}

status restore_journal::append(const journal_record& rec) {
    return write_lines({rec});
}

status restore_journal::append(const std::vector<journal_record>& recs) {
    return write_lines(recs);
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
        recs.push_back(journal_record{"file", {p, std::move(*cur)}});
    }
    return write_lines(recs);
}

// ---------------------------------------------------------------- restore

restore_outcome unwind_since(host_fs& fs, task_ops& tasks, const restore_journal& journal, std::size_t from) {
    return undo_range(fs, tasks, journal.records(), from);
}

result<restore_outcome> restore_from_journal(host_fs& fs, task_ops& tasks,
                                             const std::filesystem::path& state_dir) {
    if (auto st = check_state_dir(state_dir, !fs.dry_run()); !st) {
        return st.err();
    }
    const auto path = state_dir / restore_journal::file_name;
    unique_fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (fd.fd < 0) {
        if (errno == ENOENT) {
            return restore_outcome{};  // nothing applied: nothing to restore
        }
        return error::from_errno("open " + path.string());
    }
    if (::flock(fd.fd, LOCK_EX | LOCK_NB) < 0) {
        const int e = errno;
        return error{e, "flock " + path.string() + ": " + std::generic_category().message(e) +
                            " (another qrtd is applying or restoring)"};
    }
    auto text = read_fd_all(fd.fd, path.string());
    if (!text) {
        return text.err();
    }
    auto parsed = parse_all(*text);
    restore_outcome out;
    out.journal_found = true;
    if (auto then_boot = journal_other_boot(fs, parsed.records)) {
        out.other_boot = true;
        out.problems.push_back("journal was written in boot " + *then_boot + ", this is boot " +
                               current_boot_id(fs) + ": the reboot already reset every runtime value; nothing restored");
    }
    if (!out.other_boot) {
        auto undone = undo_range(fs, tasks, parsed.records, 0);
        out.items = std::move(undone.items);
        out.complete = undone.complete;
    }
    out.problems.insert(out.problems.end(), parsed.problems.begin(), parsed.problems.end());
    if (!parsed.problems.empty()) {
        out.complete = false;
    }
    if (out.complete && !fs.dry_run()) {
        if (::unlink(path.c_str()) < 0) {
            out.problems.push_back(error::from_errno("unlink " + path.string()).message);
        } else if (auto st = fsync_dir(state_dir); !st) {
            out.problems.push_back(st.err().message);
            out.journal_removed = true;
        } else {
            out.journal_removed = true;
        }
    }
    return out;
}

}  // namespace rtcore
