#pragma once
// QPU endpoint addresses and sockets: unix:///path, tcp://host:port and
// file:///dev/... (see DESIGN.md, "QPU model").  Shared by the agent's
// endpoint_client and by qpu-sim (listen side).

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "rtcore/error.hpp"
#include "rtcore/unique_fd.hpp"

namespace qrt::dispatch {

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

// Starts a connection (socket kinds) or opens the device (file kind).  The
// fd is O_CLOEXEC and, for sockets, O_NONBLOCK.  in_progress is true when a
// TCP connect returned EINPROGRESS: wait for EPOLLOUT, then call
// finish_connect().
struct connect_attempt {
    unique_fd fd;
    bool in_progress = false;
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

}  // namespace qrt::dispatch
