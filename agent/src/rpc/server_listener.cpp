// The network listener (rpc.listen): its listening socket (bound here, taken
// from systemd or prebound), accepting its peers and their MUNGE
// authentication, up to the point where an authenticated peer joins the
// connections of the UNIX socket (start_identity); and closing it.
#include "qrt/rpc/server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "qrt/log.hpp"
#include "qrt/proto/auth_binding.hpp"
#include "rtcore/clock.hpp"
#include "rtcore/unique_fd.hpp"
#include "server_internal.hpp"

namespace qrt::rpc {

namespace {

// Longest line a connection of the network listener may send before it has
// authenticated (a MUNGE credential is a few hundred bytes).
constexpr std::size_t auth_line_bytes = 4096;

// "tcp://ADDR:PORT": ADDR an IPv4 address or a bracketed IPv6 one.
rtcore::status parse_tcp_listen(std::string_view text, sockaddr_storage& ss, socklen_t& len) {
    const auto a = proto::parse_tcp_address(text);
    if (!a) {
        return rtcore::error::invalid(fmt::format(
            "rpc.listen '{}': {}; expected tcp://ADDR:PORT, e.g. tcp://10.0.0.5:7470 or tcp://[::]:7470",
            text, a.err().message));
    }
    ss = a->ss;
    len = a->len;
    return rtcore::ok();
}

// The peer's address as text (an IPv4-mapped IPv6 address as IPv4).
std::string host_of(const sockaddr_storage& ss) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (ss.ss_family == AF_INET) {
        ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
    } else if (ss.ss_family == AF_INET6) {
        const auto* a = &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) {
            ::inet_ntop(AF_INET, reinterpret_cast<const unsigned char*>(a) + 12, buf, sizeof buf);
        } else {
            ::inet_ntop(AF_INET6, a, buf, sizeof buf);
        }
    }
    return buf[0] != '\0' ? std::string(buf) : std::string("?");
}

std::uint16_t port_of(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) < 0) {
        return 0;
    }
    if (ss.ss_family == AF_INET) {
        return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
    }
    if (ss.ss_family == AF_INET6) {
        return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
    }
    return 0;
}

}  // namespace

using detail::reads_per_event;
using detail::send_nowait;
using detail::to_ns;

rtcore::result<prebound_socket> server::bind_tcp(const server_options& opts) {
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (auto st = parse_tcp_listen(opts.listen, ss, len); !st) {
        return std::move(st).err();
    }
    rtcore::unique_fd sock(::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock) {
        const int err = errno;
        return rtcore::error::from_errno(err, "socket AF_INET SOCK_STREAM");
    }
    const int one = 1;
    (void)::setsockopt(sock.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(sock.get(), reinterpret_cast<const sockaddr*>(&ss), len) < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "rpc.listen: bind " + opts.listen);
    }
    if (::listen(sock.get(), SOMAXCONN) < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "rpc.listen: listen " + opts.listen);
    }
    prebound_socket out;
    out.fd = sock.release();
    return out;
}

// A TCP socket systemd passed (start() found it among the passed fds).
rtcore::status server::take_passed_listener(int fd) {
    if (_opts.listen.empty()) {
        // Off unless configured: an address in a drop-in alone
        // does not open the network path.
        log::warn("rpc", "ignoring passed fd {}: a TCP socket, but rpc.listen is not set", fd);
        return rtcore::ok();
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, fmt::format("fcntl O_NONBLOCK fd {}", fd));
    }
    _tcp_fd.reset(fd);
    _tcp_source = "systemd";
    return rtcore::ok();
}

// The listening socket of rpc.listen, once start() has the UNIX one:
// systemd's (taken already), else the prebound one, else bound here.
rtcore::status server::open_listener() {
    if (!_tcp_fd && _prebound_tcp_fd) {
        _tcp_fd = std::move(_prebound_tcp_fd);
        _tcp_source = "bind";
    } else if (!_tcp_fd && !_opts.listen.empty()) {
        auto b = bind_tcp(_opts);
        if (!b) {
            return std::move(b).err();
        }
        _tcp_fd.reset(b->fd);
        _tcp_source = "bind";
    } else {
        _prebound_tcp_fd.reset();  // systemd's won
    }
    return rtcore::ok();
}

void server::stop_listener() noexcept {
    if (_tcp_fd) {
        _loop.remove_fd(_tcp_fd.get());
        _tcp_fd.reset();
    }
    _prebound_tcp_fd.reset();  // handed in, never started
}

rtcore::status server::start_listener() {
    _tcp_port = port_of(_tcp_fd.get());
    credential_decoder decode = _opts.decode_fn;
    if (!decode) {
        decode = [sock = _opts.munge_socket](std::string_view cred) { return munge_check(sock, cred); };
    }
    _listen_names.clear();
    for (const auto& alias : _opts.listen_aliases) {
        const auto name = canonical_tcp_address(alias);
        if (!name) {
            return rtcore::error::invalid(fmt::format(
                "rpc.listen_aliases: '{}' is not tcp://ADDR:PORT with a literal IPv4 or [IPv6] address", alias));
        }
        _listen_names.push_back(*name);
    }
    credential_verifier::options vo;
    vo.queue_capacity = _opts.auth_queue;
    _verifier = std::make_unique<credential_verifier>(
        vo, std::move(decode),
        [this, alive = std::weak_ptr<bool>(_alive)](std::uint64_t id, credential_check r) {
            _loop.post([this, alive, id, r = std::move(r)] {
                if (alive.lock()) {
                    on_credential(id, r);
                }
            });
        });
    if (auto st = _loop.add_fd(_tcp_fd.get(), EPOLLIN, [this](std::uint32_t) { on_accept_tcp(); }); !st) {
        return st;
    }
    const std::string msock = _opts.munge_socket.empty() ? "/run/munge/munge.socket.2" : _opts.munge_socket;
    if (struct stat ms {}; !_opts.decode_fn && ::stat(msock.c_str(), &ms) != 0) {
        log::warn("rpc", "munged's socket {} does not exist ({}): every network connection is refused "
                         "(unavailable, data.cause munge_unavailable) until munged runs (systemctl start munge)",
                  msock, std::strerror(errno));
    }
    log::info("rpc", "serving the network listener on {} port {} ({}), MUNGE-authenticated (munged at {}), "
                     "max {} connections per host; before authentication at most {} connections ({} per "
                     "host), {} ms to send anything, {} ms to authenticate",
              _opts.listen.empty() ? std::string("systemd socket") : _opts.listen, _tcp_port, _tcp_source,
              _opts.munge_socket.empty() ? std::string("the default socket") : _opts.munge_socket,
              _opts.max_connections_per_host, _opts.max_unauthenticated, _opts.max_unauthenticated_per_host,
              std::min(_opts.auth_silent_timeout, _opts.auth_timeout).count(), _opts.auth_timeout.count());
    return rtcore::ok();
}

void server::on_accept_tcp() {
    accept_pending(_tcp_fd.get(), "network listener", [this](rtcore::unique_fd fd, const sockaddr_storage& ss) {
        accept_remote(std::move(fd), host_of(ss));
    });
}

void server::refuse_at_accept(rtcore::unique_fd fd, const std::string& host, std::string_view cause,
                              std::size_t limit, const std::string& message) {
    log::warn_rl(_refused_log, "rpc", "refused a connection from {}: {}", host, message);
    const rpc_failure f("overloaded", message, json{{"cause", cause}, {"limit", limit}});
    send_nowait(fd.get(), to_line(make_error_reply(nullptr, f)));
}

void server::accept_remote(rtcore::unique_fd fd, const std::string& host) {
    std::size_t same_host = 0;
    std::size_t waiting = 0;       // not yet authenticated, every host
    std::size_t waiting_here = 0;  // the same from this host
    for (const auto& [id, c] : _conns) {
        if (!c->live() || !c->remote) {
            continue;
        }
        const bool here = c->peer_host == host;
        same_host += here ? 1U : 0U;
        if (c->unauthenticated()) {
            ++waiting;
            waiting_here += here ? 1U : 0U;
        }
    }
    // Not counted in max_connections before it authenticates: a pool of
    // its own, so that peers who never do cannot keep anyone else out.
    if (waiting_here >= _opts.max_unauthenticated_per_host) {
        ++_rejected_unauthenticated_per_host;
        refuse_at_accept(std::move(fd), host, "unauthenticated_per_host", _opts.max_unauthenticated_per_host,
                         fmt::format("host {} already has {} connections that have not authenticated, the "
                                     "limit per host (rpc.max_unauthenticated_per_host); try again later",
                                     host, waiting_here));
        return;
    }
    if (waiting >= _opts.max_unauthenticated) {
        ++_rejected_unauthenticated;
        refuse_at_accept(std::move(fd), host, "unauthenticated_connections", _opts.max_unauthenticated,
                         fmt::format("{} network connections have not authenticated yet, the limit "
                                     "(rpc.max_unauthenticated); try again later",
                                     waiting));
        return;
    }
    if (same_host >= _opts.max_connections_per_host) {
        ++_rejected_per_host;
        refuse_at_accept(std::move(fd), host, "connections_per_host", _opts.max_connections_per_host,
                         fmt::format("host {} already has {} connections, the limit per host "
                                     "(rpc.max_connections_per_host); close one or try again later",
                                     host, same_host));
        return;
    }
    const int raw = fd.get();
    const int one = 1;
    (void)::setsockopt(raw, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<connection>(_opts.max_line_bytes);
    c->id = _next_id++;
    c->fd = std::move(fd);
    c->remote = true;
    c->peer_host = host;
    c->accepted_ns = c->last_rx_ns = rtcore::monotonic_now_ns();
    c->sess.id = c->id;
    c->sess.peer.pid = 0;  // a remote process: no pid here
    // The address the peer dialled, as this host names it: what its
    // credential must be made for (check_binding).
    sockaddr_storage local{};
    socklen_t local_len = sizeof local;
    if (::getsockname(raw, reinterpret_cast<sockaddr*>(&local), &local_len) == 0) {
        c->local_name = tcp_address_text(reinterpret_cast<const sockaddr*>(&local));
    }
    c->st = connection::state::authenticating;
    c->nonce = make_nonce();
    const std::uint64_t id = c->id;
    c->interest = EPOLLIN;
    if (auto st = _loop.add_fd(raw, EPOLLIN, [this, id](std::uint32_t ev) { on_event(id, ev); }); !st) {
        log::warn("rpc", "{}", st.err().message);
        return;  // c closes it
    }
    ++_accepted;
    ++_accepted_remote;
    connection& conn = *c;
    _conns.emplace(id, std::move(c));
    const json challenge{{"jsonrpc", "2.0"},
                         {"method", "auth.challenge"},
                         {"params",
                          {{"mechanism", "munge"},
                           {"nonce", conn.nonce},
                           {"payload_version", auth_payload_version}}}};
    append(conn, to_line(challenge), 0);
    flush(conn);
    update_interest(conn);
}

void server::refuse_auth(connection& c, std::string_view cause, const std::string& message) {
    ++_auth_refused[std::string(cause)];
    const bool unavailable = cause == auth_cause::munge_unavailable;
    log::warn_rl(_refused_log, "rpc", "refused a network connection from {}: {} ({})", c.peer_host, message,
                 cause);
    close_unserved(c, rpc_failure(unavailable ? "unavailable" : "unauthenticated", message,
                                  json{{"cause", cause}}));
}

void server::close_unserved(connection& c, const rpc_failure& f) {
    // Closing like begin_close: the last line is read, then EOF.
    close_with(c, to_line(make_error_reply(c.auth_id, f)));
}

void server::read_auth(connection& c) {
    for (int i = 0; i < reads_per_event && c.st == connection::state::authenticating; ++i) {
        if (c.in.buffered() > auth_line_bytes) {
            refuse_auth(c, auth_cause::malformed,
                        fmt::format("the first line is longer than {} bytes; send auth.munge first",
                                    auth_line_bytes));
            return;
        }
        const ssize_t n = receive(c, auth_line_bytes);
        if (n > 0) {
            c.sent_any = true;
            const line_framer::item it = c.in.next();
            if (it.st == line_framer::status::line) {
                // The view is valid until the framer is touched again.
                const std::string line(it.line);
                handle_auth_line(c, line);
                return;
            }
            continue;
        }
        if (n == 0) {
            kill(c, "peer closed before it authenticated");
        }
        return;  // on EOF, or nothing to read now, or c was killed
    }
}

void server::handle_auth_line(connection& c, std::string_view line) {
    json req = json::parse(line, nullptr, false);
    if (req.is_object()) {
        if (const auto id = req.find("id"); id != req.end() && (id->is_number_integer() || id->is_string())) {
            c.auth_id = *id;
        }
    }
    const auto method = req.is_object() ? req.find("method") : req.end();
    if (req.is_discarded() || !req.is_object() || method == req.end() || !method->is_string()) {
        refuse_auth(c, auth_cause::auth_required,
                    "this is qrtd's network listener: the first line must be an auth.munge request "
                    "with a MUNGE credential over the auth.challenge payload");
        return;
    }
    if (method->get<std::string>() != "auth.munge") {
        refuse_auth(c, auth_cause::auth_required,
                    fmt::format("{} before authentication: the first request on the network "
                                "listener must be auth.munge; nothing is served before it",
                                method->get<std::string>()));
        return;
    }
    const auto params = req.find("params");
    const json* cred = nullptr;
    if (params != req.end() && params->is_object()) {
        if (const auto it = params->find("credential"); it != params->end() && it->is_string()) {
            cred = &*it;
        }
    }
    if (cred == nullptr) {
        refuse_auth(c, auth_cause::malformed, "auth.munge needs params.credential, a MUNGE credential string");
        return;
    }
    c.st = connection::state::verifying;
    update_interest(c);  // not read while munged is asked
    if (!_verifier->submit(c.id, cred->get<std::string>())) {
        ++_rejected_cap;
        c.st = connection::state::open;  // for begin_close
        begin_close(c, engine::overloaded_reply(fmt::format(
                           "rpc: {} credentials are already waiting for munged; try again later",
                           _opts.auth_queue)));
    }
}

void server::on_credential(std::uint64_t id, const credential_check& r) {
    const auto it = _conns.find(id);
    if (it == _conns.end() || it->second->st != connection::state::verifying) {
        return;  // closed meanwhile (hung up, timed out)
    }
    connection& c = *it->second;
    credential_check bound = r;
    std::vector<std::string> names{c.local_name};
    names.insert(names.end(), _listen_names.begin(), _listen_names.end());
    check_binding(bound, c.nonce, names);
    if (!bound.ok) {
        refuse_auth(c, bound.cause, bound.message);
        return;
    }
    // Authenticated: it leaves the pool of unauthenticated connections for
    // max_connections, where a local connection would have been counted
    // from accept.
    std::size_t live = 0;
    for (const auto& [other, o] : _conns) {
        live += o->in_main_pool() ? 1U : 0U;
    }
    if (live >= _opts.max_connections) {
        ++_rejected_cap;
        log::warn_rl(_refused_log, "rpc", "refused a network connection from {} (uid {}): connection limit of {} "
                     "reached", c.peer_host, r.uid, _opts.max_connections);
        close_unserved(c, rpc_failure("overloaded",
                                      fmt::format("connection limit of {} reached (rpc.max_connections); "
                                                  "try again later",
                                                  _opts.max_connections),
                                      json{{"cause", "connections"}, {"limit", _opts.max_connections}}));
        return;
    }
    ++_authenticated;
    c.authenticated = true;
    c.sess.peer.uid = r.uid;
    c.sess.peer.gid = r.gid;
    c.sess.peer.groups.clear();
    c.sess.peer.groups_source.clear();  // NSS gives them (getgrouplist), as without SO_PEERGROUPS
    log::debug("rpc", "connection {} from {} authenticated by MUNGE as uid {} gid {}", c.id, c.peer_host,
               r.uid, r.gid);
    c.st = connection::state::resolving;
    start_identity(c);
}

}  // namespace qrt::rpc
