#pragma once
// What server.cpp (the UNIX socket, identities, reading and replying),
// server_listener.cpp (the network listener and its authentication) and
// server_stats.cpp (metrics) share inside qrt_rpc: one connection's state.
// Not installed; nothing outside this folder includes it.

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <utility>

#include "qrt/rpc/framing.hpp"
#include "qrt/rpc/server.hpp"
#include "rtcore/unique_fd.hpp"

namespace qrt::rpc {

struct server::connection {
    // resolving: waiting for NSS (not read, no session attached yet).
    // authenticating: a network peer that has not sent auth.munge yet (only
    // that line is read); verifying: its credential is with munged (not read).
    enum class state : std::uint8_t { authenticating, verifying, resolving, open, closing, dead };

    std::uint64_t id = 0;
    rtcore::unique_fd fd;  // closed by kill()
    state st = state::open;
    session sess;
    line_framer in;
    std::string out;
    std::size_t out_off = 0;
    // (end of a reply in the stream of appended bytes, requests it answers)
    std::deque<std::pair<std::uint64_t, std::size_t>> replies;
    std::uint64_t appended = 0;
    std::uint64_t written = 0;
    std::size_t inflight = 0;
    // Replies waiting for their commit (group commit), in request order; a
    // reply behind one of them waits too, so replies keep request order.
    struct held_reply {
        pending_ack ack;
        std::string text;
        std::size_t requests = 0;
    };
    std::deque<held_reply> held;
    std::int64_t last_rx_ns = 0;
    std::int64_t closing_since_ns = 0;
    bool privileged = false;  // admin or calibration: may use the reserved slots
    bool peer_eof = false;
    bool shut_wr = false;
    std::uint32_t interest = 0;
    event_loop::timer_id nss_timer = 0;  // while resolving
    // The network listener's connections.
    bool remote = false;
    bool authenticated = false;  // its credential was accepted
    bool sent_any = false;   // a byte came before authentication
    std::string peer_host;   // the peer's address
    std::string local_name;  // tcp_address_text of the address it came in on
    std::string nonce;       // of its auth.challenge
    json auth_id;            // id of its auth.munge request
    std::int64_t accepted_ns = 0;

    explicit connection(std::size_t max_line_bytes) : in(max_line_bytes) {}
    std::size_t out_pending() const noexcept { return out.size() - out_off; }
    std::size_t in_pending() const noexcept { return in.buffered(); }
    bool live() const noexcept { return st != state::dead; }
    // A network peer that has not authenticated (waiting for its
    // credential, having it verified, or being closed after a refusal): in
    // the pool of its own (max_unauthenticated), not in max_connections.
    bool unauthenticated() const noexcept { return remote && !authenticated && live(); }
    // In max_connections: every live local connection, and a network one
    // once authenticated.
    bool in_main_pool() const noexcept { return live() && !(remote && !authenticated); }
};

namespace detail {

inline constexpr int reads_per_event = 16;  // fairness between connections

inline std::int64_t to_ns(std::chrono::milliseconds d) noexcept {
    return static_cast<std::int64_t>(d.count()) * 1'000'000;
}

// Best effort, never blocks: used for the one line an extra or idle
// connection gets before it is closed.
void send_nowait(int fd, std::string_view text) noexcept;

}  // namespace detail

}  // namespace qrt::rpc
