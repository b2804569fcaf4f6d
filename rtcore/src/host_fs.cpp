#include "rtcore/host_fs.hpp"

#include "rtcore/unique_fd.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

namespace rtcore {

host_fs::host_fs(std::filesystem::path root, mode m) : _root(std::move(root)), _mode(m) {}

namespace {

// The components of a host path; an error for "." or ".." (an alias).
result<std::vector<std::string>> split_host_path(std::string_view host_path) {
    std::vector<std::string> parts;
    std::size_t pos = 0;
    while (pos < host_path.size()) {
        const auto slash = host_path.find('/', pos);
        const auto part = host_path.substr(pos, slash == std::string_view::npos ? std::string_view::npos : slash - pos);
        if (part == "." || part == "..") {
            return error::invalid(std::string(host_path) + ": \".\" and \"..\" are not allowed in a host path");
        }
        if (!part.empty()) {
            parts.emplace_back(part);
        }
        if (slash == std::string_view::npos) {
            break;
        }
        pos = slash + 1;
    }
    if (parts.empty()) {
        return error::invalid("\"" + std::string(host_path) + "\" names no file");
    }
    return parts;
}

std::string prefix_of(const std::vector<std::string>& parts, std::size_t n) {
    std::string out;
    for (std::size_t i = 0; i < n; ++i) {
        out += "/" + parts[i];
    }
    return out;
}

// Why component `name` (host path `at`) under dirfd could not be opened as a
// directory: a symlink is named as such.
error component_error(int dirfd, const std::string& name, const std::string& at, const int err,
                      std::string_view whole) {
    struct stat st {};
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        return error{ELOOP, std::string(whole) + ": " + at + " is a symlink; refused (qrtd never writes through one)"};
    }
    return error::from_errno(err, "open " + std::string(whole));
}

}  // namespace

result<std::pair<int, std::string>> host_fs::open_parent(std::string_view host_path) const {
    auto parts = split_host_path(host_path);
    if (!parts) {
        return parts.err();
    }
    unique_fd cur(::open(_root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!cur) {
        const int err = errno;
        return error::from_errno(err, "open " + _root.string());
    }
    for (std::size_t i = 0; i + 1 < parts->size(); ++i) {
        unique_fd next(::openat(cur.get(), (*parts)[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!next) {
            const int err = errno;
            return component_error(cur.get(), (*parts)[i], prefix_of(*parts, i + 1), err, host_path);
        }
        cur = std::move(next);
    }
    return std::pair<int, std::string>(cur.release(), parts->back());
}

status host_fs::check_no_symlinks(std::string_view host_path) const {
    auto parts = split_host_path(host_path);
    if (!parts) {
        return parts.err();
    }
    unique_fd cur(::open(_root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!cur) {
        const int err = errno;
        return error::from_errno(err, "open " + _root.string());
    }
    for (std::size_t i = 0; i < parts->size(); ++i) {
        struct stat st {};
        if (::fstatat(cur.get(), (*parts)[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
            return ok();  // missing: nothing there to follow
        }
        if (S_ISLNK(st.st_mode)) {
            return error{ELOOP, std::string(host_path) + ": " + prefix_of(*parts, i + 1) +
                                    " is a symlink; refused (qrtd never writes through one)"};
        }
        if (!S_ISDIR(st.st_mode) || i + 1 == parts->size()) {
            return ok();
        }
        unique_fd next(::openat(cur.get(), (*parts)[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!next) {
            return ok();
        }
        cur = std::move(next);
    }
    return ok();
}

std::filesystem::path host_fs::resolve(std::string_view host_path) const {
    std::string_view rel = host_path;
    while (!rel.empty() && rel.front() == '/') {
        rel.remove_prefix(1);
    }
    return _root / std::filesystem::path(rel);
}

result<std::string> host_fs::read(std::string_view host_path) const {
    const auto p = resolve(host_path);
    const unique_fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) {
        const int err = errno;
        return error::from_errno(err, "open " + std::string(host_path));
    }
    std::string out;
    char buf[4096];
    while (true) {
        const ssize_t n = ::read(fd.get(), buf, sizeof buf);
        if (n < 0) {
            const int e = errno;
            if (e == EINTR) {
                continue;
            }
            return error::from_errno(e, "read " + std::string(host_path));
        }
        if (n == 0) {
            break;
        }
        out.append(buf, static_cast<std::size_t>(n));
    }
    return out;
}

result<std::string> host_fs::read_line(std::string_view host_path) const {
    auto r = read(host_path);
    if (!r) {
        return r;
    }
    std::string s = std::move(r).value();
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t' || s.back() == '\0')) {
        s.pop_back();
    }
    return s;
}

bool host_fs::exists(std::string_view host_path) const {
    struct stat st {};
    return ::stat(resolve(host_path).c_str(), &st) == 0;
}

bool host_fs::is_dir(std::string_view host_path) const {
    struct stat st {};
    return ::stat(resolve(host_path).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

result<std::vector<std::string>> host_fs::list(std::string_view host_path) const {
    std::error_code ec;
    std::vector<std::string> names;
    std::filesystem::directory_iterator it(resolve(host_path), ec);
    if (ec) {
        return error::from_errno(ec.value(), "opendir " + std::string(host_path));
    }
    for (const auto& ent : it) {
        names.push_back(ent.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
}

status host_fs::write(std::string_view host_path, std::string_view data) {
    if (auto f = _write_faults.find(host_path); f != _write_faults.end()) {
        const int err = f->second;  // an injected fault
        return error::from_errno(err, "write " + std::string(host_path));
    }
    if (_mode == mode::dry_run) {
        _planned.push_back({std::string(host_path), std::string(data)});
        return ok();
    }
    auto parent = open_parent(host_path);
    if (!parent) {
        return parent.err();
    }
    const unique_fd dir(parent->first);
    // O_TRUNC matters for fake trees (regular files); procfs and sysfs ignore it.
    unique_fd fd(::openat(dir.get(), parent->second.c_str(), O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) {
        const int err = errno;
        if (err == ELOOP) {
            return error{ELOOP, "open " + std::string(host_path) + ": a symlink; refused (qrtd never writes through one)"};
        }
        return error::from_errno(err, "open " + std::string(host_path));
    }
    const ssize_t n = ::write(fd.get(), data.data(), data.size());
    if (n < 0) {
        const int err = errno;
        return error::from_errno(err, "write " + std::string(host_path));
    }
    if (fd.close() < 0) {
        const int err = errno;
        return error::from_errno(err, "close " + std::string(host_path));
    }
    if (static_cast<std::size_t>(n) != data.size()) {
        return error{EIO, "write " + std::string(host_path) + ": short write"};
    }
    return ok();
}

status host_fs::make_dir(std::string_view host_path) {
    if (_mode == mode::dry_run) {
        _planned.push_back({std::string(host_path), "<mkdir>"});
        return ok();
    }
    auto parent = open_parent(host_path);
    if (!parent) {
        return parent.err();
    }
    const unique_fd dir(parent->first);
    if (::mkdirat(dir.get(), parent->second.c_str(), 0755) < 0 && errno != EEXIST) {
        const int err = errno;
        return error::from_errno(err, "mkdir " + std::string(host_path));
    }
    return ok();
}

status host_fs::remove_dir(std::string_view host_path) {
    if (_mode == mode::dry_run) {
        _planned.push_back({std::string(host_path), "<rmdir>"});
        return ok();
    }
    auto parent = open_parent(host_path);
    if (!parent) {
        if (parent.err().code == ENOENT) {
            return ok();
        }
        return parent.err();
    }
    const unique_fd dir(parent->first);
    if (::unlinkat(dir.get(), parent->second.c_str(), AT_REMOVEDIR) < 0 && errno != ENOENT) {
        const int err = errno;
        return error::from_errno(err, "rmdir " + std::string(host_path));
    }
    return ok();
}

void host_fs::inject_write_error(std::string host_path, int errnum) {
    _write_faults[std::move(host_path)] = errnum;
}

}  // namespace rtcore
