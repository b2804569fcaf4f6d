#pragma once
// QPU endpoint addresses and sockets: unix:///path, tcp://host:port and
// file:///dev/... (README.md, "The QPU endpoint wire format").  Shared by
// the agent's endpoint_client and by qpu-sim (listen side).

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "rtcore/error.hpp"
#include "rtcore/unique_fd.hpp"

namespace qrt::proto {

// The one RAII fd type lives in rtcore.
using rtcore::unique_fd;

enum class endpoint_kind { unix_stream, tcp, file };

struct endpoint_address {
    endpoint_kind kind = endpoint_kind::unix_stream;
    std::string path;        // unix, file
    std::string host;        // tcp: IPv4 literal
    std::uint16_t port = 0;  // tcp
    std::string uri;         // as given
};

// Strict parse: "unix:///abs/path", "tcp://A.B.C.D:PORT", "file:///abs/path".
// Errors name the URI and what is wrong with it.
rtcore::result<endpoint_address> parse_endpoint(std::string_view uri);

// What a file:// endpoint may be.  A character device is a QPU driver: one
// that can be polled answers with HELLO and results, one that cannot (like
// /dev/null) is write-only.  A FIFO is always write-only (its reader is the
// QPU side; nothing comes back through it).  Anything else (a regular file,
// a directory, a socket, a block device, a missing path) is refused: a
// frame written there reaches no QPU.
enum class file_endpoint_type { char_device, fifo };
const char* to_string(file_endpoint_type t) noexcept;
// stat()s the path (following symlinks, as open() does): its type, or an
// error naming the endpoint, the path, what it is and what is accepted
// ("endpoint file:///tmp/x: /tmp/x is a regular file; a file:// endpoint
// must be a character device or a FIFO").  Code ENOENT for a missing path,
// EINVAL for a wrong type, else stat's errno.
rtcore::result<file_endpoint_type> check_file_endpoint(const std::string& uri, const std::string& path);

// Starts a connection (socket kinds) or opens the device (file kind; only a
// character device or a FIFO, see check_file_endpoint).  The
// fd is O_CLOEXEC and, for sockets, O_NONBLOCK.  in_progress is true when a
// TCP connect returned EINPROGRESS: wait for EPOLLOUT, then call
// finish_connect().
struct connect_attempt {
    unique_fd fd;
    bool in_progress = false;
    file_endpoint_type file_type = file_endpoint_type::char_device;  // file kind only
};
rtcore::result<connect_attempt> start_connect(const endpoint_address& addr);
// SO_ERROR of a connect in progress: ok or the connect error.
rtcore::status finish_connect(int fd, const endpoint_address& addr);

// Blocking connect, for tools and tests.
rtcore::result<unique_fd> connect_blocking(const endpoint_address& addr);

// Listening socket for qpu-sim: unix (removes a stale socket file first) or
// tcp bound to a loopback address only (anything else is refused).
rtcore::result<unique_fd> listen_endpoint(const endpoint_address& addr, int backlog = 8);

// Sets or clears O_NONBLOCK.
rtcore::status set_nonblocking(int fd, bool on);

}  // namespace qrt::proto
