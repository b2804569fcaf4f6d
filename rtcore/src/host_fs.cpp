#include "rtcore/host_fs.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

namespace rtcore {

host_fs::host_fs(std::filesystem::path root, mode m) : _root(std::move(root)), _mode(m) {}

std::filesystem::path host_fs::resolve(std::string_view host_path) const {
    std::string_view rel = host_path;
    while (!rel.empty() && rel.front() == '/') {
        rel.remove_prefix(1);
    }
    return _root / std::filesystem::path(rel);
}

result<std::string> host_fs::read(std::string_view host_path) const {
    const auto p = resolve(host_path);
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return error::from_errno("open " + std::string(host_path));
    }
    std::string out;
    char buf[4096];
    while (true) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            const int e = errno;
            ::close(fd);
            return error::from_errno(e, "read " + std::string(host_path));
        }
        if (n == 0) {
            break;
        }
        out.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
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
        return error::from_errno(f->second, "write " + std::string(host_path));
    }
    if (_mode == mode::dry_run) {
        _planned.push_back({std::string(host_path), std::string(data)});
        return ok();
    }
    const auto p = resolve(host_path);
    // O_TRUNC matters for fake trees (regular files); procfs and sysfs ignore it.
    const int fd = ::open(p.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) {
        return error::from_errno("open " + std::string(host_path));
    }
    const ssize_t n = ::write(fd, data.data(), data.size());
    const int e = errno;
    if (n < 0) {
        ::close(fd);
        return error::from_errno(e, "write " + std::string(host_path));
    }
    if (::close(fd) < 0) {
        return error::from_errno("close " + std::string(host_path));
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
    if (::mkdir(resolve(host_path).c_str(), 0755) < 0 && errno != EEXIST) {
        return error::from_errno("mkdir " + std::string(host_path));
    }
    return ok();
}

status host_fs::remove_dir(std::string_view host_path) {
    if (_mode == mode::dry_run) {
        _planned.push_back({std::string(host_path), "<rmdir>"});
        return ok();
    }
    if (::rmdir(resolve(host_path).c_str()) < 0 && errno != ENOENT) {
        return error::from_errno("rmdir " + std::string(host_path));
    }
    return ok();
}

void host_fs::inject_write_error(std::string host_path, int errnum) {
    _write_faults[std::move(host_path)] = errnum;
}

}  // namespace rtcore
