#include "jitter_report/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

namespace qrt::jitter {

namespace {

// Closes the fd and removes the temporary file unless released.
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
    // Close now, reporting the error close gives.
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

}  // namespace

rtcore::status write_file_atomically(const std::string& path, std::string_view content) {
    if (path.empty()) {
        return rtcore::error::invalid("output file: empty path");
    }
    const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        return rtcore::error::from_errno(errno, "open " + tmp);
    }
    temp_file guard(fd, tmp);
    std::size_t done = 0;
    while (done < content.size()) {
        const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return rtcore::error::from_errno(errno, "write " + tmp);
        }
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0) {
        return rtcore::error::from_errno(errno, "fsync " + tmp);
    }
    if (guard.close_now() != 0) {
        return rtcore::error::from_errno(errno, "close " + tmp);
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        return rtcore::error::from_errno(errno, fmt::format("rename {} -> {}", tmp, path));
    }
    guard.keep();
    return rtcore::ok();
}

}  // namespace qrt::jitter
