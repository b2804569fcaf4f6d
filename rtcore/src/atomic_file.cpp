#include "rtcore/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <utility>

namespace rtcore {

namespace {

// Closes the fd and removes the temporary file unless kept.
class temp_file {
public:
    temp_file(int fd, std::string path) : _fd(fd), _path(std::move(path)) {}
    temp_file(const temp_file&) = delete;
    temp_file& operator=(const temp_file&) = delete;
    ~temp_file() {
        if (_fd >= 0) {
            ::close(_fd);
        }
        if (!_kept) {
            ::unlink(_path.c_str());
        }
    }
    int fd() const noexcept { return _fd; }
    // Close now, returning what close returned.
    int close_now() noexcept {
        const int rc = ::close(_fd);
        _fd = -1;
        return rc;
    }
    void keep() noexcept { _kept = true; }

private:
    int _fd;
    std::string _path;
    bool _kept = false;
};

// The directory holding path: "." for a bare name, "/" for "/name".
std::string directory_of(const std::string& path) {
    const auto slash = path.find_last_of('/');
    if (slash == std::string::npos) {
        return ".";
    }
    if (slash == 0) {
        return "/";
    }
    return path.substr(0, slash);
}

status fsync_directory(const std::string& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        const int e = errno;
        return error::from_errno(e, "open directory " + dir);
    }
    // EINVAL: the file system cannot sync a directory (nothing to wait for).
    const int rc = ::fsync(fd);
    const int e = errno;
    ::close(fd);
    if (rc != 0 && e != EINVAL) {
        return error::from_errno(e, "fsync directory " + dir);
    }
    return ok();
}

}  // namespace

status write_file_atomically(const std::string& path, std::string_view content) {
    if (path.empty()) {
        return error::invalid("output file: empty path");
    }
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        const int e = errno;
        return error::from_errno(e, "open " + tmp);
    }
    temp_file guard(fd, tmp);
    std::size_t done = 0;
    while (done < content.size()) {
        const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
        if (n < 0) {
            const int e = errno;
            if (e == EINTR) {
                continue;
            }
            return error::from_errno(e, "write " + tmp);
        }
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0) {
        const int e = errno;
        return error::from_errno(e, "fsync " + tmp);
    }
    if (guard.close_now() != 0) {
        const int e = errno;
        return error::from_errno(e, "close " + tmp);
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        return error::from_errno(e, "rename " + tmp + " -> " + path);
    }
    guard.keep();
    return fsync_directory(directory_of(path));
}

}  // namespace rtcore
