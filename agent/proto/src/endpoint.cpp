#include "qrt/proto/endpoint.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace qrt::proto {

namespace {

constexpr std::string_view unix_prefix = "unix://";
constexpr std::string_view tcp_prefix = "tcp://";
constexpr std::string_view file_prefix = "file://";

rtcore::error bad_uri(std::string_view uri, const std::string& why) {
    return rtcore::error::invalid("endpoint \"" + std::string(uri) + "\": " + why);
}

rtcore::result<sockaddr_un> unix_sockaddr(const endpoint_address& addr) {
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    if (addr.path.size() >= sizeof(sa.sun_path)) {
        return rtcore::error::invalid("endpoint " + addr.uri + ": path longer than " +
                                      std::to_string(sizeof(sa.sun_path) - 1) + " bytes");
    }
    std::memcpy(sa.sun_path, addr.path.c_str(), addr.path.size() + 1);
    return sa;
}

sockaddr_in tcp_sockaddr(const endpoint_address& addr) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(addr.port);
    ::inet_pton(AF_INET, addr.host.c_str(), &sa.sin_addr);  // validated by parse_endpoint
    return sa;
}

// What st_mode is, in words, for the refusal.
const char* file_kind_name(mode_t mode) noexcept {
    if (S_ISREG(mode)) {
        return "a regular file";
    }
    if (S_ISDIR(mode)) {
        return "a directory";
    }
    if (S_ISSOCK(mode)) {
        return "a socket";
    }
    if (S_ISBLK(mode)) {
        return "a block device";
    }
    if (S_ISLNK(mode)) {
        return "a symbolic link";
    }
    return "of an unknown file type";
}

constexpr const char* file_accepts = "a file:// endpoint must be a character device (the QPU's driver) or a FIFO";

rtcore::result<file_endpoint_type> file_type_of(const std::string& uri, const std::string& path, mode_t mode) {
    if (S_ISCHR(mode)) {
        return file_endpoint_type::char_device;
    }
    if (S_ISFIFO(mode)) {
        return file_endpoint_type::fifo;
    }
    std::string msg = "endpoint " + uri + ": " + path + " is " + file_kind_name(mode) + "; " + file_accepts;
    if (S_ISSOCK(mode)) {
        msg += " (for a socket write unix://" + path + ")";
    } else if (S_ISREG(mode)) {
        msg += " (a frame written to a file reaches no QPU)";
    }
    return rtcore::error{EINVAL, msg};
}

}  // namespace

const char* to_string(file_endpoint_type t) noexcept {
    return t == file_endpoint_type::fifo ? "FIFO" : "character device";
}

rtcore::result<file_endpoint_type> check_file_endpoint(const std::string& uri, const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        const int err = errno;
        if (err == ENOENT) {
            return rtcore::error{ENOENT, "endpoint " + uri + ": " + path + " does not exist; " + file_accepts};
        }
        return rtcore::error::from_errno(err, "endpoint " + uri + ": stat " + path);
    }
    return file_type_of(uri, path, st.st_mode);
}

rtcore::result<endpoint_address> parse_endpoint(std::string_view uri) {
    endpoint_address a;
    a.uri = std::string(uri);
    auto abs_path = [&](std::string_view rest) -> rtcore::status {
        if (rest.empty() || rest.front() != '/') {
            return bad_uri(uri, "path must be absolute (three slashes: scheme:///path)");
        }
        if (rest.find('\0') != std::string_view::npos) {
            return bad_uri(uri, "path contains a NUL byte");
        }
        a.path = std::string(rest);
        return rtcore::ok();
    };
    if (uri.starts_with(unix_prefix)) {
        a.kind = endpoint_kind::unix_stream;
        if (auto st = abs_path(uri.substr(unix_prefix.size())); !st) {
            return st.err();
        }
        if (a.path.size() >= sizeof(sockaddr_un::sun_path)) {
            return bad_uri(uri, "unix socket path longer than 107 bytes");
        }
        return a;
    }
    if (uri.starts_with(file_prefix)) {
        a.kind = endpoint_kind::file;
        if (auto st = abs_path(uri.substr(file_prefix.size())); !st) {
            return st.err();
        }
        return a;
    }
    if (uri.starts_with(tcp_prefix)) {
        a.kind = endpoint_kind::tcp;
        const std::string_view rest = uri.substr(tcp_prefix.size());
        const auto colon = rest.rfind(':');
        if (colon == std::string_view::npos) {
            return bad_uri(uri, "expected tcp://A.B.C.D:PORT");
        }
        a.host = std::string(rest.substr(0, colon));
        in_addr ia{};
        if (::inet_pton(AF_INET, a.host.c_str(), &ia) != 1) {
            return bad_uri(uri, "host \"" + a.host + "\" is not an IPv4 address literal");
        }
        const std::string_view port_text = rest.substr(colon + 1);
        unsigned port = 0;
        const auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
        if (ec != std::errc{} || ptr != port_text.data() + port_text.size() || port == 0 || port > 65535) {
            return bad_uri(uri, "port \"" + std::string(port_text) + "\" is not in 1..65535");
        }
        a.port = static_cast<std::uint16_t>(port);
        return a;
    }
    return bad_uri(uri, "scheme must be unix://, tcp:// or file://");
}

rtcore::status set_nonblocking(int fd, bool on) {
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "fcntl(F_GETFL) fd " + std::to_string(fd));
    }
    const int want = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    if (want != fl && ::fcntl(fd, F_SETFL, want) < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "fcntl(F_SETFL) fd " + std::to_string(fd));
    }
    return rtcore::ok();
}

rtcore::result<connect_attempt> start_connect(const endpoint_address& addr) {
    connect_attempt out;
    if (addr.kind == endpoint_kind::file) {
        // Refused before open: a regular file or a directory is never opened
        // for writing.  A FIFO opened O_RDWR does not wait for its reader.
        if (auto t = check_file_endpoint(addr.uri, addr.path); !t) {
            return t.err();
        }
        const int fd = ::open(addr.path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) {
            const int err = errno;
            return rtcore::error::from_errno(err, "endpoint " + addr.uri + ": open " + addr.path);
        }
        out.fd.reset(fd);
        // What was opened, not what stat saw (the path may have changed).
        struct stat st {};
        if (::fstat(fd, &st) != 0) {
            const int err = errno;
            return rtcore::error::from_errno(err, "endpoint " + addr.uri + ": fstat " + addr.path);
        }
        auto t = file_type_of(addr.uri, addr.path, st.st_mode);
        if (!t) {
            return t.err();
        }
        out.file_type = *t;
        return out;
    }
    const int domain = addr.kind == endpoint_kind::unix_stream ? AF_UNIX : AF_INET;
    const int fd = ::socket(domain, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "socket for " + addr.uri);
    }
    out.fd.reset(fd);
    int rc = 0;
    if (addr.kind == endpoint_kind::unix_stream) {
        auto sa = unix_sockaddr(addr);
        if (!sa) {
            return sa.err();
        }
        rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&*sa), sizeof(sockaddr_un));
    } else {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        const sockaddr_in sa = tcp_sockaddr(addr);
        rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa));
    }
    if (rc < 0) {
        const int err = errno;
        if (err == EINPROGRESS) {
            out.in_progress = true;
            return out;
        }
        return rtcore::error::from_errno(err, "connect " + addr.uri);
    }
    return out;
}

rtcore::status finish_connect(int fd, const endpoint_address& addr) {
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "getsockopt(SO_ERROR) " + addr.uri);
    }
    if (so_error != 0) {
        const int err = so_error;
        return rtcore::error::from_errno(err, "connect " + addr.uri);
    }
    return rtcore::ok();
}

rtcore::result<unique_fd> connect_blocking(const endpoint_address& addr) {
    auto att = start_connect(addr);
    if (!att) {
        return att.err();
    }
    const int fd = att->fd.get();
    if (addr.kind != endpoint_kind::file) {
        if (auto st = set_nonblocking(fd, false); !st) {
            return st.err();
        }
        if (att->in_progress) {
            if (auto st = finish_connect(fd, addr); !st) {
                return st.err();
            }
        }
    }
    return std::move(att->fd);
}

rtcore::result<unique_fd> listen_endpoint(const endpoint_address& addr, int backlog) {
    if (addr.kind == endpoint_kind::file) {
        return rtcore::error::invalid("listen " + addr.uri + ": file endpoints cannot listen");
    }
    const int domain = addr.kind == endpoint_kind::unix_stream ? AF_UNIX : AF_INET;
    unique_fd fd(::socket(domain, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) {
        const int err = errno;
        return rtcore::error::from_errno(err, "socket for " + addr.uri);
    }
    if (addr.kind == endpoint_kind::unix_stream) {
        auto sa = unix_sockaddr(addr);
        if (!sa) {
            return sa.err();
        }
        struct stat st {};
        if (::lstat(addr.path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
            ::unlink(addr.path.c_str());  // stale socket from an earlier run
        }
        if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*sa), sizeof(sockaddr_un)) < 0) {
            const int err = errno;
            return rtcore::error::from_errno(err, "bind " + addr.path);
        }
    } else {
        const sockaddr_in sa = tcp_sockaddr(addr);
        if ((ntohl(sa.sin_addr.s_addr) >> 24) != 127) {
            return rtcore::error::invalid("listen " + addr.uri + ": only loopback (127.0.0.0/8) addresses");
        }
        const int one = 1;
        ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) < 0) {
            const int err = errno;
            return rtcore::error::from_errno(err, "bind " + addr.uri);
        }
    }
    if (::listen(fd.get(), backlog) < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "listen " + addr.uri);
    }
    return fd;
}

}  // namespace qrt::proto
