#include "rtcore/secure_dir.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <thread>

namespace rtcore {

namespace {

std::string octal_mode(mode_t m) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777U));
    return buf;
}

bool plain_name(std::string_view name) {
    return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
           name.find('\0') == std::string_view::npos;
}

// The components of an absolute path; nullopt when it has empty, "." or
// ".." components (an alias of another path).
std::optional<std::vector<std::string>> components(const std::filesystem::path& p) {
    const std::string s = p.string();
    if (s.empty() || s.front() != '/') {
        return std::nullopt;
    }
    std::vector<std::string> out;
    std::size_t pos = 1;
    while (pos <= s.size()) {
        const auto slash = s.find('/', pos);
        const auto end = slash == std::string::npos ? s.size() : slash;
        const std::string part = s.substr(pos, end - pos);
        if (part == "." || part == ".." || (part.empty() && end != s.size())) {
            return std::nullopt;
        }
        if (!part.empty()) {
            out.push_back(part);
        }
        if (slash == std::string::npos) {
            break;
        }
        pos = slash + 1;
    }
    return out;
}

std::string join_upto(const std::vector<std::string>& parts, std::size_t n) {
    std::string out;
    for (std::size_t i = 0; i < n; ++i) {
        out += '/';
        out += parts[i];
    }
    return out.empty() ? std::string("/") : out;
}

bool writable_by_others(const struct stat& st) {
    return (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
}

// A parent of a trusted directory: owned by root or the euid, and nobody
// else can rename its entries (no group/other write, or sticky).
status check_parent(const std::string& path, const struct stat& st, const std::string& what,
                    const std::filesystem::path& target) {
    const uid_t euid = ::geteuid();
    if (st.st_uid != 0 && st.st_uid != euid) {
        return error{EPERM, what + " " + target.string() + ": its parent " + path + " is owned by " +
                                secure_dir::describe_owner(st.st_uid) +
                                ", who could rename it away and put another in its place; use a directory "
                                "whose parents are owned by root"};
    }
    if (writable_by_others(st) && (st.st_mode & S_ISVTX) == 0) {
        return error{EPERM, what + " " + target.string() + ": its parent " + path + " has mode " +
                                octal_mode(st.st_mode) +
                                " (writable by group or others, not sticky), so another user could rename it "
                                "away; fix: chmod go-w " +
                                path};
    }
    return ok();
}

std::string fix_for(const std::string& path, bool dir) {
    const uid_t euid = ::geteuid();
    return "fix: chown " + std::to_string(euid) + ":" + std::to_string(::getegid()) + " " + path + " && chmod " +
           (dir ? "0700 " : "0600 ") + path + " (after checking who put it there and what it holds)";
}

// Owner and mode of something a root helper trusts.
status check_private(const std::string& path, const struct stat& st, const std::string& what, bool dir) {
    const uid_t euid = ::geteuid();
    if (st.st_uid != euid) {
        return error{EPERM, what + " " + path + " is owned by " + secure_dir::describe_owner(st.st_uid) +
                                " with mode " + octal_mode(st.st_mode) +
                                "; what a root helper reads or replays must belong to " +
                                secure_dir::describe_owner(euid) + " and be writable by nobody else; " +
                                fix_for(path, dir)};
    }
    if (writable_by_others(st)) {
        return error{EPERM, what + " " + path + " has mode " + octal_mode(st.st_mode) + " (owner " +
                                secure_dir::describe_owner(st.st_uid) +
                                "): writable by group or others, so another user could change what a root "
                                "helper reads; " +
                                fix_for(path, dir)};
    }
    return ok();
}

}  // namespace

std::string secure_dir::describe_owner(uid_t uid) {
    std::string out = "uid " + std::to_string(uid);
    passwd pw{};
    passwd* found = nullptr;
    char buf[4096];
    if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found != nullptr) {
        out += " (" + std::string(found->pw_name) + ")";
    }
    return out;
}

result<secure_dir> secure_dir::open(const std::filesystem::path& given, dir_policy policy, const std::string& what,
                                    bool create) {
    // A relative path is taken from the working directory; every component
    // of the result is walked without following a symlink, so the lexical
    // form checked is the directory opened.
    std::filesystem::path path = given;
    if (path.is_relative()) {
        std::error_code ec;
        path = std::filesystem::absolute(path, ec).lexically_normal();
        if (ec) {
            return error{ec.value(), what + " " + given.string() + ": " + ec.message()};
        }
        while (path.string().size() > 1 && path.string().back() == '/') {
            path = path.parent_path();
        }
    }
    const auto parts = components(path);
    if (!parts || parts->empty()) {
        return error::invalid(what + " \"" + path.string() +
                              "\" must be an absolute path without \".\" or \"..\" components, and not /");
    }
    unique_fd cur(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!cur) {
        const int err = errno;
        return error::from_errno(err, "open /");
    }
    // Every parent: opened without following a symlink, then checked.
    for (std::size_t i = 0; i + 1 <= parts->size(); ++i) {
        const std::string here = join_upto(*parts, i);
        struct stat st {};
        if (::fstat(cur.get(), &st) < 0) {
            const int err = errno;
            return error::from_errno(err, "fstat " + here);
        }
        if (auto c = check_parent(here, st, what, path); !c) {
            return c.err();
        }
        const bool last = i + 1 == parts->size();
        if (last) {
            break;
        }
        unique_fd next(::openat(cur.get(), (*parts)[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!next) {
            const int err = errno;
            const std::string p = join_upto(*parts, i + 1);
            if (err == ENOTDIR || err == ELOOP) {
                return error{err, what + " " + path.string() + ": " + p +
                                      " is a symlink or not a directory; refused (a symlink in the path could "
                                      "point a root helper anywhere)"};
            }
            return error{err, what + " " + path.string() + ": open " + p + ": " +
                                  std::generic_category().message(err)};
        }
        cur = std::move(next);
    }
    const std::string& leaf = parts->back();
    const int open_flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    unique_fd fd(::openat(cur.get(), leaf.c_str(), open_flags));
    bool made = false;
    if (!fd && errno == ENOENT && create) {
        if (::mkdirat(cur.get(), leaf.c_str(), 0700) < 0 && errno != EEXIST) {
            const int err = errno;
            return error::from_errno(err, "mkdir " + path.string() + " (" + what + ")");
        }
        made = true;
        fd.reset(::openat(cur.get(), leaf.c_str(), open_flags));
    }
    if (!fd) {
        const int err = errno;
        if (err == ENOTDIR || err == ELOOP) {
            return error{err, what + " " + path.string() +
                                  " is a symlink or not a directory; refused (a root helper never follows a "
                                  "symlink there)"};
        }
        if (err == ENOENT) {
            return error{err, what + " " + path.string() + ": No such file or directory"};
        }
        return error{err, what + " " + path.string() + ": " + std::generic_category().message(err)};
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) < 0) {
        const int err = errno;
        return error::from_errno(err, "fstat " + path.string());
    }
    if (made && st.st_uid == ::geteuid()) {
        // mkdirat's mode went through the umask; say it exactly.
        if (::fchmod(fd.get(), 0700) < 0) {
            const int err = errno;
            return error::from_errno(err, "chmod 0700 " + path.string());
        }
        st.st_mode = (st.st_mode & ~07777U) | 0700U;
    }
    if (policy == dir_policy::private_to_euid) {
        if (auto c = check_private(path.string(), st, what, true); !c) {
            return c.err();
        }
    }
    secure_dir d;
    d._path = path;
    d._fd = std::move(fd);
    d._policy = policy;
    d._owner = st.st_uid;
    return d;
}

result<secure_dir> secure_dir::duplicate() const {
    const int fd = ::fcntl(_fd.get(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        const int err = errno;
        return error::from_errno(err, "dup " + _path.string());
    }
    secure_dir d;
    d._path = _path;
    d._fd = unique_fd(fd);
    d._policy = _policy;
    d._owner = _owner;
    return d;
}

result<unique_fd> secure_dir::open_file(std::string_view name, int flags, mode_t mode) const {
    const std::string full = (_path / std::string(name)).string();
    if (!plain_name(name)) {
        return error::invalid("\"" + std::string(name) + "\" is not a plain file name in " + _path.string());
    }
    if ((flags & O_TRUNC) != 0) {
        // Truncating before the checks below would change a file we refuse.
        return error::invalid("open " + full + ": O_TRUNC is not allowed before the file is checked");
    }
    unique_fd fd(::openat(_fd.get(), std::string(name).c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode));
    if (!fd) {
        const int err = errno;
        if (err == ELOOP) {
            return error{err, full + " is a symlink; refused (a root helper never follows a symlink in " +
                                  _path.string() + ")"};
        }
        return error::from_errno(err, "open " + full);
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) < 0) {
        const int err = errno;
        return error::from_errno(err, "fstat " + full);
    }
    if (!S_ISREG(st.st_mode)) {
        return error{EPERM, full + " is not a regular file (mode " + octal_mode(st.st_mode) + ", type " +
                                (S_ISFIFO(st.st_mode)  ? "FIFO"
                                 : S_ISDIR(st.st_mode) ? "directory"
                                 : S_ISSOCK(st.st_mode) ? "socket"
                                                        : "device") +
                                "); refused: remove it"};
    }
    if (st.st_nlink != 1) {
        return error{EPERM, full + " has " + std::to_string(st.st_nlink) +
                                " hard links; refused (a link to another file would make a root helper read or "
                                "write that file): remove it"};
    }
    if (_policy == dir_policy::private_to_euid) {
        if (auto c = check_private(full, st, "file", false); !c) {
            return c.err();
        }
    }
    const int fl = ::fcntl(fd.get(), F_GETFL);
    if (fl < 0 || ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK) < 0) {
        const int err = errno;
        return error::from_errno(err, "fcntl " + full);
    }
    return fd;
}

result<std::string> secure_dir::read_file(std::string_view name, std::size_t limit) const {
    auto fd = open_file(name, O_RDONLY);
    if (!fd) {
        return fd.err();
    }
    const std::string full = (_path / std::string(name)).string();
    std::string out;
    char buf[16384];
    while (true) {
        const ssize_t n = ::read(fd->get(), buf, sizeof buf);
        if (n < 0) {
            const int err = errno;
            if (err == EINTR) {
                continue;
            }
            return error::from_errno(err, "read " + full);
        }
        if (n == 0) {
            break;
        }
        out.append(buf, static_cast<std::size_t>(n));
        if (out.size() > limit) {
            return error{EFBIG, full + " is larger than " + std::to_string(limit) + " bytes, the limit; refused"};
        }
    }
    return out;
}

status secure_dir::replace_file(std::string_view name, std::string_view bytes, mode_t mode) const {
    if (!plain_name(name)) {
        return error::invalid("\"" + std::string(name) + "\" is not a plain file name in " + _path.string());
    }
    const std::string full = (_path / std::string(name)).string();
    const std::string tmp = "." + std::string(name) + ".tmp." + std::to_string(::getpid());
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    unique_fd fd(::openat(_fd.get(), tmp.c_str(), flags, mode));
    if (!fd && errno == EEXIST) {
        // Left by a process with our pid that died: never write into it.
        (void)::unlinkat(_fd.get(), tmp.c_str(), 0);
        fd.reset(::openat(_fd.get(), tmp.c_str(), flags, mode));
    }
    if (!fd) {
        const int err = errno;
        return error::from_errno(err, "create " + (_path / tmp).string());
    }
    auto fail = [&](const int err, const std::string& what) -> status {
        (void)::unlinkat(_fd.get(), tmp.c_str(), 0);
        return error::from_errno(err, what);
    };
    if (::fchmod(fd.get(), mode) < 0) {
        const int err = errno;
        return fail(err, "chmod " + (_path / tmp).string());
    }
    std::size_t off = 0;
    while (off < bytes.size()) {
        const ssize_t n = ::write(fd.get(), bytes.data() + off, bytes.size() - off);
        if (n < 0) {
            const int err = errno;
            if (err == EINTR) {
                continue;
            }
            return fail(err, "write " + (_path / tmp).string());
        }
        off += static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) < 0) {
        const int err = errno;
        return fail(err, "fsync " + (_path / tmp).string());
    }
    fd.reset();
    if (::renameat(_fd.get(), tmp.c_str(), _fd.get(), std::string(name).c_str()) < 0) {
        const int err = errno;
        return fail(err, "rename " + (_path / tmp).string() + " to " + full);
    }
    return fsync();
}

status secure_dir::remove_file(std::string_view name) const {
    if (!plain_name(name)) {
        return error::invalid("\"" + std::string(name) + "\" is not a plain file name in " + _path.string());
    }
    if (::unlinkat(_fd.get(), std::string(name).c_str(), 0) < 0) {
        const int err = errno;
        if (err == ENOENT) {
            return ok();
        }
        return error::from_errno(err, "unlink " + (_path / std::string(name)).string());
    }
    return fsync();
}

status secure_dir::rename(std::string_view from, std::string_view to) const {
    if (!plain_name(from) || !plain_name(to)) {
        return error::invalid("rename in " + _path.string() + ": not plain file names");
    }
    if (::renameat(_fd.get(), std::string(from).c_str(), _fd.get(), std::string(to).c_str()) < 0) {
        const int err = errno;
        return error::from_errno(err, "rename " + (_path / std::string(from)).string() + " to " +
                                          (_path / std::string(to)).string());
    }
    return ok();
}

result<std::vector<std::string>> secure_dir::list() const {
    unique_fd dup(::openat(_fd.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dup) {
        const int err = errno;
        return error::from_errno(err, "open " + _path.string());
    }
    DIR* d = ::fdopendir(dup.get());
    if (d == nullptr) {
        const int err = errno;
        return error::from_errno(err, "fdopendir " + _path.string());
    }
    (void)dup.release();  // the DIR owns it now: closedir closes it
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") {
            names.push_back(n);
        }
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

status secure_dir::fsync() const {
    if (::fsync(_fd.get()) < 0) {
        const int err = errno;
        return error::from_errno(err, "fsync " + _path.string());
    }
    return ok();
}

// ---------------------------------------------------------------- dir_lock

result<dir_lock> dir_lock::acquire(const secure_dir& dir, std::string_view name, const lock_wait& wait,
                                   std::string_view holder) {
    dir_lock l;
    l._path = dir.path() / std::string(name);
    l._writable = dir.policy() == dir_policy::private_to_euid;
    auto fd = dir.open_file(name, l._writable ? (O_RDWR | O_CREAT) : (O_RDONLY | O_CREAT),
                            l._writable ? 0600 : 0644);
    if (!fd) {
        return fd.err();
    }
    l._fd = std::move(*fd);
    const auto start = std::chrono::steady_clock::now();
    auto next_report = start + std::chrono::seconds(2);
    while (true) {
        if (::flock(l._fd.get(), LOCK_EX | LOCK_NB) == 0) {
            break;
        }
        const int err = errno;
        if (err == EINTR) {
            continue;
        }
        if (err != EWOULDBLOCK) {
            return error::from_errno(err, "flock " + l._path.string());
        }
        const std::string who = l.holder();
        const std::string held_by = who.empty() ? std::string("another process") : who;
        const auto now = std::chrono::steady_clock::now();
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - start);
        if (waited >= wait.max) {
            std::string msg = l._path.string() + " is held by " + held_by;
            if (wait.max.count() > 0) {
                msg += " after waiting " + std::to_string(waited.count() / 1000) + " s";
            }
            return error{EWOULDBLOCK, msg};
        }
        l._waited_for = held_by;
        if (now >= next_report && wait.progress) {
            wait.progress("waiting for " + l._path.string() + ", held by " + held_by + " (" +
                          std::to_string(waited.count() / 1000) + " s of at most " +
                          std::to_string(wait.max.count() / 1000) + " s)");
            next_report = now + std::chrono::seconds(2);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    l._waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    if (l._waited_for.empty()) {
        l._waited = std::chrono::milliseconds(0);
    }
    l.set_holder(holder);
    return l;
}

void dir_lock::set_holder(std::string_view holder) const {
    if (!_writable || !_fd) {
        return;
    }
    const std::string line = std::string(holder) + "\n";
    if (::pwrite(_fd.get(), line.data(), line.size(), 0) == static_cast<ssize_t>(line.size())) {
        (void)::ftruncate(_fd.get(), static_cast<off_t>(line.size()));
    }
}

std::string dir_lock::holder() const {
    char buf[512];
    const ssize_t n = ::pread(_fd.get(), buf, sizeof buf - 1, 0);
    if (n <= 0) {
        return "";
    }
    std::string s(buf, static_cast<std::size_t>(n));
    const auto nl = s.find('\n');
    if (nl != std::string::npos) {
        s.resize(nl);
    }
    // Shown to an operator: printable characters only.
    for (auto& c : s) {
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
            c = '?';
        }
    }
    return s;
}

// ---------------------------------------------------------------- both

result<locked_dir> open_locked_dir(const std::filesystem::path& path, const locked_dir_options& opts) {
    const auto with = [](const error& e, const std::string& remedy) {
        return remedy.empty() ? e : error{e.code, e.message + remedy};
    };
    auto dir = secure_dir::open(path, opts.policy, opts.what, opts.create);
    if (!dir) {
        return with(dir.err(), dir.err().code == ENOENT ? opts.if_missing : std::string());
    }
    if (opts.must_write && ::faccessat(dir->fd(), ".", W_OK, AT_EACCESS) != 0) {
        const int err = errno;
        struct stat st {};
        const bool known = ::fstat(dir->fd(), &st) == 0;
        const std::string owner_mode =
            known ? " (owner " + secure_dir::describe_owner(st.st_uid) + ", mode " + octal_mode(st.st_mode) + ")"
                  : std::string();
        return with(error{err, opts.what + " " + dir->path().string() + owner_mode + ": " +
                                   secure_dir::describe_owner(::geteuid()) + " cannot write in it (" +
                                   std::generic_category().message(err) + ")"},
                    opts.if_not_writable);
    }
    auto lock = dir_lock::acquire(*dir, opts.lock_name, opts.wait, opts.holder);
    if (!lock) {
        return with(lock.err(), lock.err().code == EWOULDBLOCK ? opts.if_held : std::string());
    }
    return locked_dir{std::move(*dir), std::move(*lock)};
}

}  // namespace rtcore
