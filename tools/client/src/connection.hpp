#pragma once
// The client side of the qrtd control socket, in C++: one AF_UNIX stream
// connection speaking JSON-RPC 2.0, one object per line.  Shared by
// libqrt-client (behind its C ABI), qrtctl and the rpc-vs-echo bench; it
// pulls nothing of the daemon (the error table is header-only).
//
// Not thread-safe: one connection per thread.  Every wait is bounded by the
// connection's timeout (connect, each write, each reply), except
// next_notification() with a negative timeout (events --follow).
//
// Notifications (events.event) that arrive while a reply is awaited are
// queued, in order, for next_notification().  Pipelining: send_request() many
// times, then wait_reply() for each id; writes never deadlock against a
// server applying back-pressure, because a blocked write keeps reading.

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "qrt/proto/protocol.hpp"
#include "rtcore/unique_fd.hpp"

namespace qrt::client {

using json = nlohmann::json;

// Reasons for failures that happen on this side of the socket, with their
// exit statuses: the protocol table's client reasons (qrt/proto/protocol.hpp).
// Server errors carry the server's data.reason.
namespace local_reason = proto::client_reason;

// The exit status for any reason: the server's table, the client's, else 1.
inline int exit_code_for(std::string_view reason) noexcept { return proto::exit_code_for_reason(reason); }

struct call_error {
    int code = 0;          // JSON-RPC error code; 0 for a local failure
    int sys_errno = 0;     // errno of a local failure (ECONNREFUSED, ETIMEDOUT, EPROTO...)
    std::string reason;    // data.reason, or one of local_reason
    std::string message;   // human text
    json data;             // the error's data object (server errors), or null

    bool is_local() const noexcept { return code == 0; }
};

// A reply: the result, or the error.
class reply {
public:
    reply(json result) : _v(std::in_place_index<0>, std::move(result)) {}     // NOLINT implicit
    reply(call_error err) : _v(std::in_place_index<1>, std::move(err)) {}    // NOLINT implicit
    bool ok() const noexcept { return _v.index() == 0; }
    explicit operator bool() const noexcept { return ok(); }
    const json& result() const& { return std::get<0>(_v); }
    json&& result() && { return std::get<0>(std::move(_v)); }
    const call_error& error() const& { return std::get<1>(_v); }

private:
    std::variant<json, call_error> _v;
};

struct connect_options {
    std::chrono::milliseconds connect_timeout{2000};
    std::chrono::milliseconds call_timeout{5000};
    // Largest reply line accepted (metrics of a big host are a few 100 KiB).
    std::size_t max_line_bytes = 64U << 20;
    // tcp:// agents: the local munged's socket (empty: $QRT_MUNGE_SOCKET,
    // else libmunge's default, /run/munge/munge.socket.2).
    std::string munge_socket;
};

// A socket path that names a network agent ("tcp://HOST:PORT").
bool is_tcp_address(std::string_view path) noexcept;

// The socket path to use: explicit, else $QRT_SOCKET, else the default.
std::string default_socket_path();
std::string resolve_socket_path(std::string_view explicit_path);

class connection {
public:
    // Connects, or fails with reason "unreachable" and a message such as
    //   "cannot connect to /run/qrtd/qrtd.sock: No such file or directory
    //    (is qrtd running?)"
    // "tcp://HOST:PORT" (HOST a name, an IPv4 address or a bracketed IPv6
    // one) connects over TCP and authenticates before returning: it reads
    // the agent's auth.challenge, has the local munged encode a credential
    // over its payload, and sends auth.munge.  Fails with reason
    // "munge_error" when munged cannot be reached here, or with the
    // agent's refusal (reason "unauthenticated", data.cause: expired and
    // rewound mean the two hosts' clocks disagree).
    static std::variant<std::unique_ptr<connection>, call_error> open(std::string_view path,
                                                                       connect_options opts = {});
    ~connection();
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    // One request, its reply.  params: an object, or null for none.
    reply call(std::string_view method, const json& params = json::object());

    // Pipelining: queue a request (written before the next wait), returning
    // its id; wait_reply() answers ids in any order (replies to other ids
    // are kept until asked for).
    std::uint64_t send_request(std::string_view method, const json& params = json::object());
    // Write every queued request.  Fails like call().
    std::optional<call_error> flush();
    reply wait_reply(std::uint64_t id);

    // The next events.event notification's params (or any other
    // notification's whole object), waiting at most timeout (negative:
    // forever).  nullopt on timeout; a call_error when the connection broke.
    std::variant<std::optional<json>, call_error> next_notification(
        std::chrono::milliseconds timeout);

    // Send one raw line (a '\n' is appended) and return the next line that
    // is not a notification, unparsed.  For `qrtctl raw` and tests of
    // malformed input.
    std::variant<std::string, call_error> raw_line(std::string_view line);

    void set_call_timeout(std::chrono::milliseconds t) noexcept { _opts.call_timeout = t; }
    std::chrono::milliseconds call_timeout() const noexcept { return _opts.call_timeout; }
    const std::string& path() const noexcept { return _path; }
    // tcp://: what auth.munge answered ({uid, gid, tenant, roles}); null otherwise.
    const json& authenticated_as() const noexcept { return _auth; }
    int fd() const noexcept { return _fd.get(); }
    bool broken() const noexcept { return _broken.has_value(); }

private:
    connection(rtcore::unique_fd fd, std::string path, connect_options opts);

    using clock = std::chrono::steady_clock;
    // Reads whatever is available (waiting until deadline for the first
    // byte).  Returns an error when the peer closed or the deadline passed.
    std::optional<call_error> fill(std::optional<clock::time_point> deadline);
    // The next complete line in the input buffer, without its '\n'.
    std::optional<std::string> take_line();
    // Parse one line and route it: a reply into _replies, a notification
    // into _notes.  Fails on a line that is not JSON-RPC.
    std::optional<call_error> route(const std::string& line);
    std::optional<call_error> write_out(clock::time_point deadline);
    call_error fail(call_error e);
    std::optional<call_error> authenticate(const connect_options& opts);

    rtcore::unique_fd _fd;
    std::string _path;
    connect_options _opts;
    std::uint64_t _next_id = 1;
    std::string _in;
    std::size_t _in_off = 0;
    std::string _out;
    std::size_t _out_off = 0;
    std::deque<std::pair<std::uint64_t, json>> _replies;  // id -> reply object
    std::deque<json> _notes;
    std::optional<call_error> _broken;  // sticky: the connection is unusable
    json _auth;
};

// The reply object {"jsonrpc","id","result"|"error"} as a reply.
reply reply_from_object(const json& obj);

}  // namespace qrt::client
