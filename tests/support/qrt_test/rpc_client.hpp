#pragma once
// A raw JSON-RPC client for the agent's UNIX socket: one request a line,
// blocking with a receive timeout so that a broken server fails the test
// instead of hanging it.  Notifications (events) that come before a reply
// are kept in notifications().  And a socket file that is bound (and
// listening, or not), for the tests of stale and silent sockets.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace qrt::testing {

class rpc_client {
public:
    using json = nlohmann::json;

    explicit rpc_client(const std::string& path,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));
    ~rpc_client();
    rpc_client(const rpc_client&) = delete;
    rpc_client& operator=(const rpc_client&) = delete;

    bool connected() const { return _fd >= 0; }
    int fd() const { return _fd; }
    int connect_errno() const { return _connect_errno; }

    void set_timeout(std::chrono::milliseconds t);

    // false when the peer is gone.
    bool send_raw(std::string_view bytes);

    // One line (without '\n'); nullopt on EOF, reset or timeout.
    std::optional<std::string> read_line();
    int last_errno() const { return _last_errno; }

    // One line as JSON; nullopt as read_line.
    std::optional<json> read_json();

    // A request with the next id; the reply to it (a reply of
    // data.reason "no_reply", and a test failure, when none came).
    json call(const std::string& method, json params = json::object());

    // The result of a call that must succeed (a test failure otherwise).
    json ok(const std::string& method, json params = json::object());

    std::vector<json>& notifications() { return _notifications; }

private:
    int _fd = -1;
    int _connect_errno = 0;
    int _last_errno = 0;
    std::string _buf;
    std::uint64_t _next_id = 0;
    std::vector<json> _notifications;
};

// error.data.reason of a reply, "" when it has none.
std::string reason_of(const nlohmann::json& reply);

// A UNIX stream socket bound at path: listening with `backlog` (a peer's
// connect succeeds, nobody answers: a hung agent), or with no backlog
// closed at once (the file stays, nobody listens: what a crashed daemon
// leaves).  Throws std::runtime_error naming the call.  The file is unlinked
// on destruction.
class unix_socket_file {
public:
    static constexpr int not_listening = -1;
    explicit unix_socket_file(std::string path, int backlog = not_listening);
    ~unix_socket_file();
    unix_socket_file(const unix_socket_file&) = delete;
    unix_socket_file& operator=(const unix_socket_file&) = delete;

    const std::string& path() const { return _path; }
    int fd() const { return _fd; }  // -1 when not listening

private:
    std::string _path;
    int _fd = -1;
};

}  // namespace qrt::testing
