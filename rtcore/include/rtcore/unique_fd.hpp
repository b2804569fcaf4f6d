#pragma once
// RAII for one file descriptor: the one owner type for every fd in qrtd
// (sockets, ring fds, journal files, cgroup files).  Closing is the only
// side effect; it never throws and never allocates.

#include <unistd.h>

#include <utility>

namespace rtcore {

class unique_fd {
public:
    unique_fd() noexcept = default;
    explicit unique_fd(int fd) noexcept : _fd(fd) {}
    unique_fd(unique_fd&& o) noexcept : _fd(std::exchange(o._fd, -1)) {}
    unique_fd& operator=(unique_fd&& o) noexcept {
        if (this != &o) {
            reset(std::exchange(o._fd, -1));
        }
        return *this;
    }
    unique_fd(const unique_fd&) = delete;
    unique_fd& operator=(const unique_fd&) = delete;
    ~unique_fd() { reset(); }

    int get() const noexcept { return _fd; }
    bool valid() const noexcept { return _fd >= 0; }
    explicit operator bool() const noexcept { return valid(); }
    // Gives up ownership without closing.
    int release() noexcept { return std::exchange(_fd, -1); }
    // Closes now and returns close(2)'s result (0, or -1 with errno set), for
    // a caller that must see its error: the last error of a write to a file
    // may only come back from close.  Invalid afterwards.
    int close() noexcept { return ::close(release()); }
    // Closes the current fd (if any) and owns fd instead.
    void reset(int fd = -1) noexcept {
        if (_fd >= 0) {
            ::close(_fd);
        }
        _fd = fd;
    }

private:
    int _fd = -1;
};

}  // namespace rtcore
