#pragma once
// The control socket: AF_UNIX stream, one JSON-RPC request (or batch) per
// line, served from the housekeeping event loop with non-blocking sockets and
// no thread per connection.
//
// Listening socket: the one systemd passes (sd_listen_fds, qrtd.socket), or,
// without socket activation, bound at socket_path: a stale socket file is
// unlinked only when nobody answers on it, then the socket is chmod'ed to
// socket_mode and chown'ed to socket_group.  `qrtd run` started as root binds
// it (server::bind_socket) before it drops to agent.user -- chown to a group
// the process is not in needs CAP_CHOWN -- and passes it in as prebound.
//
// Limits, per connection unless said otherwise:
//   max_connections   server-wide; an extra connection gets one
//                     `overloaded` error line and is closed
//   max_connections_per_uid
//                     connections of one uid (one tenant) at once; admins
//                     are exempt.  One more gets `overloaded` (data.cause
//                     "connections_per_uid") and is closed, once its
//                     identity is known
//   reserved_connections
//                     of max_connections, kept for admins and the
//                     calibration role: other peers get `overloaded`
//                     (data.cause "connections") once max_connections -
//                     reserved_connections are open
//   max_line_bytes    a longer line gets `line_too_long`, then the
//                     connection is closed (after its input is drained)
//   max_inflight      requests read but whose replies are not yet written
//                     to the socket; at the limit the server stops reading
//                     that connection (back-pressure, nothing is dropped)
//   output_soft_limit unsent reply bytes above which reading stops
//   output_hard_limit unsent bytes (replies + events) above which the
//                     connection is closed: a peer that never reads cannot
//                     grow the daemon's memory without bound
//   idle_timeout      no bytes received for this long: closed (a subscriber
//                     with no partial line pending is exempt)
//   nss_timeout       how long a new connection may wait for NSS (below)
//
// The network listener (listen = "tcp://ADDR:PORT", off when empty; or an
// AF_INET/AF_INET6 stream socket systemd passes beside the UNIX one):
// every connection gets one auth.challenge line and must answer with
// auth.munge and a MUNGE credential over auth_payload(nonce, address) --
// the address being the one the peer dialled, one of this server's names
// for the connection -- before any method, reads and agent.hello included
// (qrt/rpc/munge_auth.hpp, qrt/proto/auth_binding.hpp).  The
// credential's uid and gid then stand for SO_PEERCRED: NSS, roles, the
// per-uid cap and every other limit apply unchanged.  Until it has
// authenticated a connection is in a pool of its own, outside
// max_connections (and so never in the reserved slots): a flood of peers
// that never authenticate cannot keep a local user, root or an
// authenticated peer out.  Limits of its own:
//   max_unauthenticated
//                     connections not yet authenticated, from every host
//                     together (until closed, their refusal included); one
//                     more gets `overloaded` (data.cause
//                     "unauthenticated_connections") at accept
//   max_unauthenticated_per_host
//                     the same from one peer address; one more gets
//                     `overloaded` (data.cause "unauthenticated_per_host")
//   max_connections_per_host
//                     connections from one peer address at once,
//                     authenticated or not; one more gets `overloaded`
//                     (data.cause "connections_per_host")
//   auth_silent_timeout
//                     a connection that has sent nothing this long after
//                     its challenge gets `unauthenticated` (data.cause
//                     "auth_timeout")
//   auth_timeout      how long a connection may take to authenticate
//                     (send auth.munge and have it verified); then
//                     `unauthenticated` (data.cause "auth_timeout")
//   auth_line_bytes   (4096, fixed) longest line before authentication
// Once authenticated it joins max_connections (`overloaded`, "connection
// limit", when they are all taken) and the per-uid and reserved slots as a
// local connection does.
// Refusals: one error line, reason `unauthenticated` with data.cause
// expired, rewound, replayed, invalid, malformed, nonce_mismatch,
// auth_required (a request before auth.munge) or auth_timeout; `unavailable`
// (data.cause "munge_unavailable") when this host's munged cannot be asked.
// Then the connection is closed; nothing was served.
//
// Identity off the loop: the kernel gives uid, gid and (SO_PEERGROUPS) the
// groups at once; the user name (getpwuid_r, and getgrouplist on kernels
// without SO_PEERGROUPS) comes from NSS, which may be LDAP or sssd and block
// for seconds.  A uid fresh in the cache (nss_cache: 256 uids, 60 s) is
// served at once.  Otherwise the connection waits -- it is not read, its
// requests stay in the socket, every other connection is served -- while
// one resolver thread asks NSS (nss_resolver: one queue of at most
// nss_queue uids; connections of a uid already asked wait for the same
// answer).  When no answer came within nss_timeout the connection gets one
// `unavailable` error line (data.cause "nss_timeout", data.uid) and is
// closed: a tenant is never served under another name than its own; the
// client may retry.  A full queue gets `overloaded` the same way.  NSS
// failing (getpwuid_r returning an error: LDAP or sssd down) is not "no such
// user": the connection gets `unavailable` (data.cause "nss_error", data.uid,
// data.errno) and is closed, and nothing is cached; only "no entry" serves a
// peer as uid:N.
// Replies go out in request order.  A reply that acknowledges a change
// (method_info::acknowledged_when_durable) is held until the change is
// durable: the ledger's writer thread commits groups of changes and the
// daemon calls on_durable() on the loop thread; replies behind a held one on
// the same connection wait behind it (order), replies on other connections
// do not.  Held replies count as in flight (max_inflight back-pressure).

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qrt/event_loop.hpp"
#include "qrt/rpc/auth.hpp"
#include "qrt/rpc/engine.hpp"
#include "qrt/rpc/munge_auth.hpp"
#include "qrt/telemetry.hpp"
#include "rtcore/error.hpp"
#include "rtcore/unique_fd.hpp"

namespace qrt::rpc {

// A socket bound at socket_path by server::bind_socket, handed over as a
// plain value (server_options stays copyable): its holder closes it until a
// server is made with it, which owns it from its constructor on (closes it,
// and unlinks the path if it is still this inode).
struct prebound_socket {
    int fd = -1;
    std::uint64_t ino = 0;
};

struct server_options {
#ifdef QRT_DEFAULT_SOCKET_PATH
    std::string socket_path = QRT_DEFAULT_SOCKET_PATH;
#else
    std::string socket_path = "/run/qrtd/qrtd.sock";
#endif
    std::string socket_group;      // empty: keep the daemon's group
    unsigned socket_mode = 0660;
    bool socket_activation = true;  // take a systemd socket when passed one
    prebound_socket prebound;       // fd >= 0: listen on it (bound before a privilege drop)
    std::size_t max_connections = 256;
    std::size_t max_connections_per_uid = 16;
    std::size_t reserved_connections = 8;
    std::size_t max_inflight = 128;
    std::chrono::milliseconds idle_timeout{std::chrono::seconds(300)};
    std::chrono::milliseconds nss_timeout{2000};
    std::size_t nss_queue = 64;
    // The NSS lookup the resolver thread makes (empty: getpwuid_r and
    // getgrouplist).  A seam for tests (a slow NSS).
    nss_lookup nss_lookup_fn;
    nss_cache_options nss_cache_opts;
    std::size_t max_line_bytes = 1U << 20;
    std::size_t max_batch = 256;
    std::size_t max_depth = 64;
    std::size_t output_soft_limit = 1U << 20;
    std::size_t output_hard_limit = 16U << 20;
    // How long a connection being closed may take to drain its input and
    // read its last error line.
    std::chrono::milliseconds close_linger{2000};
    // The network listener: "tcp://ADDR:PORT" (ADDR an IPv4 address, or an
    // IPv6 one in brackets); empty: none (unless systemd passes one).
    std::string listen;
    prebound_socket prebound_tcp;  // fd >= 0: the bound listen socket
    // Addresses ("tcp://ADDR:PORT", literal) that reach the listener
    // through a translation (NAT, a port forward) and that clients may
    // dial: a credential made for one is accepted as well as one made for
    // the address the connection came in on.
    std::vector<std::string> listen_aliases;
    std::size_t max_connections_per_host = 32;
    std::size_t max_unauthenticated = 32;
    std::size_t max_unauthenticated_per_host = 8;
    std::chrono::milliseconds auth_silent_timeout{1000};
    std::chrono::milliseconds auth_timeout{5000};
    std::size_t auth_queue = 64;  // credentials waiting for munged
    std::string munge_socket;     // empty: libmunge's default (/run/munge/munge.socket.2)
    // How a credential is checked (empty: munge_check on munge_socket).
    credential_decoder decode_fn;
    // node_exporter textfile (empty: off), rewritten every interval.
    std::string metrics_textfile;
    std::chrono::milliseconds metrics_textfile_interval{std::chrono::seconds(15)};
};

class server {
public:
    // The loop, engine and authorizer outlive the server.
    server(event_loop& loop, engine& eng, const authorizer& auth, server_options opts);
    ~server();
    server(const server&) = delete;
    server& operator=(const server&) = delete;

    // Obtain the listening socket and register it with the loop.  Call on
    // the loop thread (or before the loop runs).
    rtcore::status start();
    // Binds socket_path as start() would without socket activation, chmod
    // socket_mode, chown :socket_group.  For binding before a privilege drop.
    static rtcore::result<prebound_socket> bind_socket(const server_options& opts);
    // Binds and listens on opts.listen ("tcp://ADDR:PORT").
    static rtcore::result<prebound_socket> bind_tcp(const server_options& opts);
    // The port of the network listener (0: none).
    std::uint16_t tcp_port() const noexcept { return _tcp_port; }
    // Close every connection and the listening socket; unlink the socket
    // file if this server bound it.  Loop thread only.
    void stop() noexcept;

    // Deliver an event to subscribers (loop thread; other threads go
    // through event_loop::post).
    void publish(const event& e) { _engine.publish(e); }

    // Group commit: every change <= durable_seq is resolved; those in
    // [failed_from, failed_to] (both 0: none) did not happen, and the held
    // replies that acknowledge them become store_error replies.  Loop thread.
    void on_durable(std::uint64_t durable_seq, std::uint64_t failed_from = 0,
                    std::uint64_t failed_to = 0, std::string_view why = {});

    // Source of the textfile export (the full metrics text).
    void set_metrics_source(std::function<rtcore::result<std::string>()> src);

    std::size_t connections() const noexcept { return _conns.size(); }
    // "systemd" or "bind".
    const std::string& listen_source() const noexcept { return _listen_source; }
    const server_options& options() const noexcept { return _opts; }
    telemetry::snapshot stats() const;

private:
    struct connection;
    void accept_pending(int listen_fd, std::string_view what,
                        const std::function<void(rtcore::unique_fd, const sockaddr_storage&)>& take);
    void on_accept();
    void accept_one(rtcore::unique_fd fd);
    // The network listener's half of start() and stop()
    // (server_listener.cpp): a TCP socket systemd passed; the listening
    // socket otherwise (prebound or bound); the verifier and the listening
    // fd in the loop; closing it.
    rtcore::status take_passed_listener(int fd);
    rtcore::status open_listener();
    rtcore::status start_listener();
    void stop_listener() noexcept;
    void on_accept_tcp();
    void accept_remote(rtcore::unique_fd fd, const std::string& host);
    // Ask NSS (or the cache) for c's name, then finish_identity.
    void start_identity(connection& c);
    void read_auth(connection& c);
    void handle_auth_line(connection& c, std::string_view line);
    void on_credential(std::uint64_t id, const credential_check& r);
    // An unauthenticated connection refused: one error line, closed.
    void refuse_auth(connection& c, std::string_view cause, const std::string& message);
    // A network connection refused at accept, before it is registered: one
    // `overloaded` line naming the limit (data.cause, data.limit), closed.
    void refuse_at_accept(rtcore::unique_fd fd, const std::string& host, std::string_view cause, std::size_t limit,
                          const std::string& message);
    // The last line (the reply to auth.munge), then closed as refuse_auth does.
    void close_unserved(connection& c, const rpc_failure& f);
    void on_nss_answer(const nss_query& q, const nss_answer& a);
    void finish_identity(connection& c);
    // The per-uid cap and the reserved slots, once c's roles are known:
    // false when c was refused (and is being closed).
    bool admit_identity(connection& c);
    // An NSS lookup failed: the connections waiting for it are told so.
    void nss_failed(connection& c, int err);
    void nss_timed_out(std::uint64_t id);
    void on_event(std::uint64_t id, std::uint32_t events);
    void read_some(connection& c);
    // One recv(2) of at most max bytes into c's framer (again on EINTR),
    // counted, and c's last input stamped: the bytes read (> 0), 0 at the
    // peer's EOF, or -1 when nothing is to be read now (EAGAIN) or recv
    // failed (c is killed).
    ssize_t receive(connection& c, std::size_t max);
    void process_input(connection& c);
    void flush(connection& c);
    void append(connection& c, std::string_view text, std::size_t requests);
    void update_interest(connection& c);
    bool may_read(const connection& c) const;
    // Open connections only: close_with.
    void begin_close(connection& c, std::string_view last_line);
    // The last line appended, then closing: c's input is read and dropped
    // until the peer has read the line and closes (or close_linger ends).
    void close_with(connection& c, std::string_view last_line);
    void kill(connection& c, const char* why);
    void reap();
    void sweep();
    void export_textfile();

    event_loop& _loop;
    engine& _engine;
    const authorizer& _auth;
    server_options _opts;
    nss_cache _names;  // uid -> user name (and groups) for the accept path
    std::unique_ptr<nss_resolver> _resolver;  // made by start()

    // The prebound sockets of _opts, owned from the constructor until
    // start() takes them (or stop() closes them, never started).
    rtcore::unique_fd _prebound_fd;
    rtcore::unique_fd _prebound_tcp_fd;
    rtcore::unique_fd _listen_fd;
    rtcore::unique_fd _tcp_fd;
    std::uint16_t _tcp_port = 0;
    std::string _tcp_source;
    std::unique_ptr<credential_verifier> _verifier;  // made by start() with a listener
    std::vector<std::string> _listen_names;  // listen_aliases, canonical
    rtcore::unique_fd _spare_fd;  // held to shed connections when out of fds (EMFILE)
    bool _bound_here = false;
    std::uint64_t _bound_ino = 0;
    std::string _listen_source;
    std::string _reply_buf;  // reused for every reply line (event-loop thread only)
    std::map<std::uint64_t, std::unique_ptr<connection>> _conns;
    std::uint64_t _next_id = 1;
    bool _reap_posted = false;
    event_loop::timer_id _sweep_timer = 0;
    event_loop::timer_id _textfile_timer = 0;
    std::function<rtcore::result<std::string>()> _metrics_source;
    // shared so posted callbacks can tell the server has gone
    std::shared_ptr<bool> _alive = std::make_shared<bool>(true);

    std::uint64_t _accepted = 0;
    log::rate_limiter _refused_log{std::chrono::seconds(1), 10};
    std::uint64_t _rejected_cap = 0;
    std::uint64_t _rejected_per_uid = 0;
    std::uint64_t _rejected_reserved = 0;
    std::uint64_t _closed_nss_error = 0;
    std::uint64_t _closed_line_too_long = 0;
    std::uint64_t _closed_idle = 0;
    std::uint64_t _closed_slow_reader = 0;
    std::uint64_t _peercred_failures = 0;
    std::uint64_t _nss_waits = 0;
    std::uint64_t _closed_nss_timeout = 0;
    std::uint64_t _closed_nss_queue_full = 0;
    std::uint64_t _bytes_in = 0;
    std::uint64_t _bytes_out = 0;
    std::uint64_t _backpressure_pauses = 0;
    std::uint64_t _held_replies = 0;
    std::uint64_t _failed_commit_replies = 0;
    std::uint64_t _accepted_remote = 0;
    std::uint64_t _rejected_per_host = 0;
    std::uint64_t _rejected_unauthenticated = 0;
    std::uint64_t _rejected_unauthenticated_per_host = 0;
    std::uint64_t _authenticated = 0;
    std::map<std::string, std::uint64_t, std::less<>> _auth_refused;  // by data.cause
};

}  // namespace qrt::rpc
