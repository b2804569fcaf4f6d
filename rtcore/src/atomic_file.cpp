#include "rtcore/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <utility>

#include "rtcore/unique_fd.hpp"

namespace rtcore {

namespace {

// Removes the temporary file unless kept; the fd is closed first (the
// guard's unique_fd is declared after this in write_file_atomically).
class temp_file {
public:
    explicit temp_file(std::string path) : _path(std::move(path)) {}
    temp_file(const temp_file&) = delete;
    temp_file& operator=(const temp_file&) = delete;
    ~temp_file() {
        if (!_kept) {
            ::unlink(_path.c_str());
        }
    }
    void keep() noexcept { _kept = true; }

private:
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
    const unique_fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd) {
        const int e = errno;
        return error::from_errno(e, "open directory " + dir);
    }
    // EINVAL: the file system cannot sync a directory (nothing to wait for).
    const int rc = ::fsync(fd.get());
    const int e = errno;
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
    temp_file guard(tmp);
    unique_fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd) {
        const int e = errno;
        guard.keep();  // nothing was created
        return error::from_errno(e, "open " + tmp);
    }
    std::size_t done = 0;
    while (done < content.size()) {
        const ssize_t n = ::write(fd.get(), content.data() + done, content.size() - done);
        if (n < 0) {
            const int e = errno;
            if (e == EINTR) {
                continue;
            }
            return error::from_errno(e, "write " + tmp);
        }
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) != 0) {
        const int e = errno;
        return error::from_errno(e, "fsync " + tmp);
    }
    if (fd.close() != 0) {
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
