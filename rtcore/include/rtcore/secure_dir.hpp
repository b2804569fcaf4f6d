#pragma once
// Directories and files a root helper may trust, and the one helper that
// checks a directory and takes its lock.
//
//   auto dir = rtcore::secure_dir::open("/var/lib/qrtd-host", rtcore::dir_policy::private_to_euid,
//                                       "journal directory", /*create=*/true);
//   auto lock = rtcore::dir_lock::acquire(*dir, "host.lock", {std::chrono::seconds(30), progress});
//   auto fd = dir->open_file("host-journal", O_RDWR | O_APPEND);   // checked before use
//
// secure_dir::open walks the path from "/" one component at a time with
// openat(O_DIRECTORY | O_NOFOLLOW), so no symlink anywhere in it is
// followed, and checks every directory on the way:
//   - each parent is owned by root or by this process's euid and is not
//     group- or other-writable unless it is sticky (/tmp): no other user can
//     rename the path away and put another directory in its place;
//   - the directory itself, under dir_policy::private_to_euid (what a root
//     helper reads or replays): owned by the euid and writable by nobody
//     else.  Under dir_policy::any_owner (the daemon's own state directory)
//     its owner and mode are not checked: nothing in it is ever replayed.
// A directory that fails is refused with an error naming it, its owner and
// mode, and the fix.  Every later file operation is an *at() call on the
// returned fd, so what was checked is what is used.
//
// secure_dir::open_file opens a file with openat(O_NOFOLLOW | O_NONBLOCK)
// (a symlink is refused, a planted FIFO cannot block the open) and checks,
// before anything is read: a regular file with one link, and under
// private_to_euid owned by the euid and writable by nobody else.
//
// dir_lock takes an exclusive flock(2) on a file in a secure_dir, waiting
// up to a bound and reporting progress, and tells the waiter who holds it
// (the holder writes one line of words into the lock file).

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtcore/error.hpp"
#include "rtcore/unique_fd.hpp"

namespace rtcore {

enum class dir_policy {
    private_to_euid,  // owned by the euid, no group/other write; files too
    any_owner,        // only the path is checked (no symlinks, safe parents)
};

class secure_dir {
public:
    // what: the words for the directory in errors ("journal directory").
    // create: make the last component (mode 0700) when it is missing.
    static result<secure_dir> open(const std::filesystem::path& path, dir_policy policy, const std::string& what,
                                   bool create = false);

    const std::filesystem::path& path() const { return _path; }
    int fd() const { return _fd.get(); }
    dir_policy policy() const { return _policy; }
    // Owner of the directory (fstat at open).
    uid_t owner() const { return _owner; }
    // The same checked directory on a dup(2) of its fd, for an object that
    // outlives the caller's (the restore journal rewriting itself).
    result<secure_dir> duplicate() const;

    // openat(fd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode),
    // then fstat: regular file, nlink == 1, and under private_to_euid owned
    // by the euid with no group/other write.  O_NONBLOCK is cleared again
    // after the checks.  ENOENT comes back as an error with code ENOENT.
    result<unique_fd> open_file(std::string_view name, int flags, mode_t mode = 0600) const;

    // The whole file, checked as open_file does; limit bounds the bytes read
    // (a longer file is an error naming the limit).
    result<std::string> read_file(std::string_view name, std::size_t limit) const;

    // Replaces name with a new file holding bytes (mode, owned by the euid):
    // written to a fresh temporary name (O_CREAT | O_EXCL | O_NOFOLLOW),
    // fsynced, renamed over name, and the directory fsynced.  A symlink or
    // anything else planted at name is replaced, never written through.
    status replace_file(std::string_view name, std::string_view bytes, mode_t mode) const;

    // unlinkat(name); a missing name is not an error.
    status remove_file(std::string_view name) const;
    // renameat(from, to) inside the directory.
    status rename(std::string_view from, std::string_view to) const;
    // Names of the entries, sorted, without "." and "..".
    result<std::vector<std::string>> list() const;
    status fsync() const;

    // "uid 0 (root)", or "uid 998" when the name is unknown.
    static std::string describe_owner(uid_t uid);

private:
    secure_dir() = default;
    std::filesystem::path _path;
    unique_fd _fd;
    dir_policy _policy = dir_policy::private_to_euid;
    uid_t _owner = 0;
};

struct lock_wait {
    // How long to wait for a lock another process holds; 0: fail at once.
    std::chrono::milliseconds max{0};
    // Called about every 2 s while waiting, with one line of words.
    std::function<void(const std::string&)> progress;
};

class dir_lock {
public:
    // Opens (creating, mode 0600 under private_to_euid, else 0644) name in
    // dir, checked as secure_dir::open_file does, and takes an exclusive
    // flock, waiting as told.  Under private_to_euid the lock file is opened
    // read-write and holder (one line: "pid 812: qrtd host apply") is
    // written into it for waiters to name; otherwise it is opened read-only
    // (the file may belong to another user) and holder is not written.
    static result<dir_lock> acquire(const secure_dir& dir, std::string_view name, const lock_wait& wait,
                                    std::string_view holder);

    // Rewrites the holder line (for a process that inherits the lock).
    void set_holder(std::string_view holder) const;
    // The holder line in the file now ("" when none or unreadable).
    std::string holder() const;
    // Who held the lock while acquire() waited ("" when it did not wait).
    const std::string& waited_for() const { return _waited_for; }
    std::chrono::milliseconds waited() const { return _waited; }
    const std::filesystem::path& path() const { return _path; }
    int fd() const { return _fd.get(); }
    // Closes this process's fd: the lock goes when no other process (a
    // forked child) still holds the same open file.
    void release() { _fd.reset(); }

private:
    dir_lock() = default;
    unique_fd _fd;
    std::filesystem::path _path;
    std::string _waited_for;
    std::chrono::milliseconds _waited{0};
    bool _writable = false;
};

// The one "check a directory and take its lock": secure_dir::open, then,
// when the directory must be writable, a check that this process can write
// it, then dir_lock::acquire.  Every error names the directory's path and
// what is wrong with it (its owner and mode when those are the problem),
// followed by the caller's remedy for that case: rtcore knows what is wrong,
// the caller knows how its users fix it.
struct locked_dir_options {
    std::string what;                               // "state directory", in errors
    dir_policy policy = dir_policy::private_to_euid;
    bool create = false;                            // make it (0700) when missing
    bool must_write = false;                        // this process writes in it
    std::string lock_name;                          // "qrtd.lock"
    lock_wait wait;
    std::string holder;                             // see dir_lock::acquire
    // Appended to the error: when the directory is missing, when this
    // process cannot write it, when another process holds the lock.
    std::string if_missing;
    std::string if_not_writable;
    std::string if_held;
};
struct locked_dir {
    secure_dir dir;
    dir_lock lock;
};
result<locked_dir> open_locked_dir(const std::filesystem::path& path, const locked_dir_options& opts);

}  // namespace rtcore
