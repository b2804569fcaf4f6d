#include "qrt/rpc/server.hpp"

#include "qrt/rpc/framing.hpp"
#include "rtcore/clock.hpp"
#include "rtcore/unique_fd.hpp"
#include "server_internal.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "qrt/log.hpp"

namespace qrt::rpc {

namespace {

constexpr std::size_t read_chunk = 64U * 1024U;
constexpr int accepts_per_event = 64;
constexpr std::size_t reply_buf_keep = 256U * 1024U;

}  // namespace

namespace detail {

void send_nowait(int fd, std::string_view text) noexcept {
    [[maybe_unused]] const auto n = ::send(fd, text.data(), text.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace detail

using detail::reads_per_event;
using detail::send_nowait;
using detail::to_ns;

server::server(event_loop& loop, engine& eng, const authorizer& auth, server_options opts)
    : _loop(loop),
      _engine(eng),
      _auth(auth),
      _opts(std::move(opts)),
      _names(_opts.nss_cache_opts),
      _prebound_fd(std::exchange(_opts.prebound.fd, -1)),
      _prebound_tcp_fd(std::exchange(_opts.prebound_tcp.fd, -1)) {}

server::~server() { stop(); }

void server::set_metrics_source(std::function<rtcore::result<std::string>()> src) {
    _metrics_source = std::move(src);
}

rtcore::result<prebound_socket> server::bind_socket(const server_options& opts) {
    const std::string& path = opts.socket_path;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.empty() || path.size() >= sizeof addr.sun_path) {
        return rtcore::error::invalid(fmt::format(
            "rpc: socket path '{}' must be 1..{} bytes long", path, sizeof addr.sun_path - 1));
    }
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const auto addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);

    // A socket file left by a previous run: remove it only if nobody answers.
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            return rtcore::error{EEXIST, fmt::format("rpc: {} exists and is not a socket; "
                                                     "refusing to remove it",
                                                     path)};
        }
        rtcore::unique_fd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (!probe) {
            const int err = errno;
            return rtcore::error::from_errno(err, "socket AF_UNIX (stale probe)");
        }
        const int rc = ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), addr_len);
        const int e = errno;
        probe.reset();
        if (rc == 0) {
            return rtcore::error{EADDRINUSE,
                                 fmt::format("rpc: another process is serving on {}", path)};
        }
        if (e != ECONNREFUSED && e != ENOENT) {
            return rtcore::error::from_errno(e, "connect " + path + " (stale probe)");
        }
        if (::unlink(path.c_str()) < 0 && errno != ENOENT) {
            const int err = errno;
            return rtcore::error::from_errno(err, "unlink stale socket " + path);
        }
        log::info("rpc", "removed stale socket {}", path);
    }

    rtcore::unique_fd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock) {
        const int err = errno;
        return rtcore::error::from_errno(err, "socket AF_UNIX SOCK_STREAM");
    }
    const int fd = sock.get();
    // The inode bind() creates takes the socket's mode minus the umask: set
    // the mode first and clear the umask for the bind, so the path is created
    // with exactly socket_mode and is never chmod'ed by name afterwards (a
    // name in a directory the daemon's user owns could be swapped for a
    // symlink between bind and chmod, and root would follow it).
    const auto mode = static_cast<mode_t>(opts.socket_mode & 07777U);
    if (::fchmod(fd, mode) < 0) {
        const int e = errno;
        return rtcore::error::from_errno(e, "fchmod socket");
    }
    const mode_t old_umask = ::umask(0);
    const int bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), addr_len);
    const int bind_err = errno;
    ::umask(old_umask);
    if (bound < 0) {
        return rtcore::error::from_errno(bind_err, "bind " + path);
    }
    auto fail = [&](const int e, const std::string& what) -> rtcore::result<prebound_socket> {
        sock.reset();
        ::unlink(path.c_str());
        return rtcore::error::from_errno(e, what);
    };
    if (!opts.socket_group.empty()) {
        group gr{};
        group* found = nullptr;
        std::vector<char> buf(16384);
        const int rc = ::getgrnam_r(opts.socket_group.c_str(), &gr, buf.data(), buf.size(), &found);
        if (rc != 0 || found == nullptr) {
            return fail(rc != 0 ? rc : ENOENT,
                        fmt::format("rpc: socket_group '{}' (getgrnam_r)", opts.socket_group));
        }
        // lchown: a symlink swapped in for the socket gets the group, not its target.
        if (::lchown(path.c_str(), static_cast<uid_t>(-1), gr.gr_gid) < 0) {
            const int err = errno;
            return fail(err, fmt::format("chown :{} {}", opts.socket_group, path));
        }
    }
    if (::listen(fd, SOMAXCONN) < 0) {
        const int err = errno;
        return fail(err, "listen " + path);
    }
    prebound_socket out;
    out.fd = sock.release();  // the caller's now (server::start, or the prebound socket's holder)
    if (::stat(path.c_str(), &st) == 0) {
        out.ino = st.st_ino;
    }
    return out;
}

rtcore::status server::start() {
    if (_listen_fd) {
        return rtcore::error::invalid("rpc: server already started");
    }
    rtcore::unique_fd fd;
    if (_prebound_fd) {
        fd = std::move(_prebound_fd);
        _bound_here = true;
        _bound_ino = _opts.prebound.ino;
        _listen_source = "bind";
    } else if (_opts.socket_activation) {
        const int n = ::sd_listen_fds(1);
        if (n < 0) {
            return rtcore::error::from_errno(-n, "sd_listen_fds");
        }
        for (int i = 0; i < n; ++i) {
            const int cand = SD_LISTEN_FDS_START + i;
            if (!fd && ::sd_is_socket_unix(cand, SOCK_STREAM, 1, nullptr, 0) > 0) {
                fd.reset(cand);
            } else if (!_tcp_fd && ::sd_is_socket_inet(cand, AF_UNSPEC, SOCK_STREAM, 1, 0) > 0) {
                if (auto st = take_passed_listener(cand); !st) {
                    return st;
                }
            } else {
                log::warn("rpc", "ignoring passed fd {} (not a listening AF_UNIX stream socket)", cand);
            }
        }
        if (n > 0 && !fd) {
            return rtcore::error::invalid(
                fmt::format("rpc: systemd passed {} fds but none is a listening AF_UNIX stream", n));
        }
        if (fd) {
            const int flags = ::fcntl(fd.get(), F_GETFL);
            if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) < 0) {
                const int err = errno;
                return rtcore::error::from_errno(err, fmt::format("fcntl O_NONBLOCK fd {}", fd.get()));
            }
            _listen_source = "systemd";
        }
    }
    if (!fd) {
        auto b = bind_socket(_opts);
        if (!b) {
            return std::move(b).err();
        }
        fd.reset(b->fd);
        _bound_here = true;
        _bound_ino = b->ino;
        _listen_source = "bind";
    }
    _listen_fd = std::move(fd);
    if (auto st = open_listener(); !st) {
        return st;
    }
    _spare_fd.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    nss_resolver::options ro;
    ro.queue_capacity = _opts.nss_queue;
    _resolver = std::make_unique<nss_resolver>(
        ro, _opts.nss_lookup_fn,
        [this, alive = std::weak_ptr<bool>(_alive)](const nss_query& q, nss_answer a) {
            // Resolver thread: hand the answer to the loop.
            _loop.post([this, alive, q, a = std::move(a)] {
                if (alive.lock()) {
                    on_nss_answer(q, a);
                }
            });
        });
    if (auto st = _loop.add_fd(_listen_fd.get(), EPOLLIN, [this](std::uint32_t) { on_accept(); }); !st) {
        return st;
    }
    if (_tcp_fd) {
        if (auto st = start_listener(); !st) {
            return st;
        }
    }
    auto every = _opts.idle_timeout / 4;
    if (_tcp_fd) {  // the listener's timeouts are swept as often
        every = std::min({every, _opts.auth_silent_timeout / 4, _opts.auth_timeout / 4});
    }
    const auto tick = std::clamp(every, std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
    auto t = _loop.add_timer(tick, tick, [this] { sweep(); });
    if (!t) {
        return std::move(t).err();
    }
    _sweep_timer = *t;
    if (!_opts.metrics_textfile.empty()) {
        auto tt = _loop.add_timer(_opts.metrics_textfile_interval, _opts.metrics_textfile_interval,
                                  [this] { export_textfile(); });
        if (!tt) {
            return std::move(tt).err();
        }
        _textfile_timer = *tt;
    }
    log::info("rpc", "serving on {} ({}), max {} connections, {} in flight each, idle {} ms",
                 _listen_source == "bind" ? _opts.socket_path : "systemd socket", _listen_source,
                 _opts.max_connections, _opts.max_inflight, _opts.idle_timeout.count());
    return rtcore::ok();
}

void server::stop() noexcept {
    _resolver.reset();  // no answer is posted from here on
    _verifier.reset();
    for (auto& [id, c] : _conns) {
        if (c->st != connection::state::dead) {
            kill(*c, "server stopping");
        }
    }
    for (auto& [id, c] : _conns) {
        _engine.detach(c->sess);
    }
    _conns.clear();
    if (_sweep_timer != 0) {
        _loop.cancel_timer(_sweep_timer);
        _sweep_timer = 0;
    }
    if (_textfile_timer != 0) {
        _loop.cancel_timer(_textfile_timer);
        _textfile_timer = 0;
    }
    if (_listen_fd) {
        _loop.remove_fd(_listen_fd.get());
        _listen_fd.reset();
    }
    stop_listener();
    _spare_fd.reset();
    _prebound_fd.reset();  // handed in, never started
    if (_bound_here) {
        struct stat st {};
        // Unlink only our own inode, not a successor's socket.
        if (::stat(_opts.socket_path.c_str(), &st) == 0 && st.st_ino == _bound_ino) {
            ::unlink(_opts.socket_path.c_str());
        }
        _bound_here = false;
    }
}

// Takes what the listening socket holds, up to accepts_per_event a wakeup,
// handing each descriptor (and its peer address) to `take`.  Out of
// descriptors, it frees the spare, accepts and drops one peer so the
// listening socket does not stay readable forever.
void server::accept_pending(int listen_fd, std::string_view what,
                            const std::function<void(rtcore::unique_fd, const sockaddr_storage&)>& take) {
    for (int i = 0; i < accepts_per_event; ++i) {
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        rtcore::unique_fd fd(::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len,
                                       SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (fd) {
            take(std::move(fd), ss);
            continue;
        }
        const int e = errno;
        if (e == EINTR || e == ECONNABORTED) {
            continue;
        }
        if (e == EMFILE || e == ENFILE) {
            ++_rejected_cap;
            if (_spare_fd) {
                _spare_fd.reset();
                // Accepted only to be closed at once.
                const rtcore::unique_fd victim(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
                _spare_fd.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
            }
            log::warn("rpc", "accept4 ({}): {}; dropped a connection", what, std::strerror(e));
            return;
        }
        if (e != EAGAIN && e != EWOULDBLOCK) {
            log::warn("rpc", "accept4 on fd {} ({}): {}", listen_fd, what, std::strerror(e));
        }
        return;
    }
}

void server::on_accept() {
    accept_pending(_listen_fd.get(), "UNIX socket",
                   [this](rtcore::unique_fd fd, const sockaddr_storage&) { accept_one(std::move(fd)); });
}

void server::accept_one(rtcore::unique_fd fd) {
    std::size_t live = 0;  // network peers not yet authenticated have a pool of their own
    for (const auto& [id, c] : _conns) {
        live += c->in_main_pool() ? 1U : 0U;
    }
    if (live >= _opts.max_connections) {
        ++_rejected_cap;
        send_nowait(fd.get(), engine::overloaded_reply(fmt::format(
                                  "connection limit of {} reached; try again later", _opts.max_connections)));
        return;
    }
    // The kernel's word only (SO_PEERCRED, SO_PEERGROUPS): never blocks.
    auto peer = peer_credentials_of(fd.get());
    if (!peer) {
        ++_peercred_failures;
        log::warn("rpc", "closing a connection: {}", peer.err().message);
        return;
    }
    const int raw = fd.get();
    auto c = std::make_unique<connection>(_opts.max_line_bytes);
    c->id = _next_id++;
    c->fd = std::move(fd);
    c->last_rx_ns = rtcore::monotonic_now_ns();
    c->sess.id = c->id;
    c->sess.peer = std::move(*peer);
    c->st = connection::state::resolving;
    const std::uint64_t id = c->id;
    // Registered with no interest while resolving: epoll still reports a
    // hang-up, nothing is read.
    c->interest = 0;
    if (auto st = _loop.add_fd(raw, 0, [this, id](std::uint32_t ev) { on_event(id, ev); }); !st) {
        log::warn("rpc", "{}", st.err().message);
        return;  // c closes it
    }
    ++_accepted;
    connection& conn = *c;
    _conns.emplace(id, std::move(c));
    start_identity(conn);
}

void server::start_identity(connection& conn) {
    const std::uint64_t id = conn.id;
    const int fd = conn.fd.get();
    const nss_query q{conn.sess.peer.uid, conn.sess.peer.gid, conn.sess.peer.groups_source.empty()};
    if (const nss_answer* a = _names.find(q.uid, rtcore::monotonic_now_ns(), q.want_groups)) {
        apply_nss_answer(conn.sess.peer, *a);
        finish_identity(conn);
        return;
    }
    if (_resolver->submit(q) == nss_resolver::submitted::full) {
        ++_closed_nss_queue_full;
        send_nowait(fd, engine::overloaded_reply(fmt::format(
                            "rpc: {} user lookups (NSS) are already waiting; try again later",
                            _opts.nss_queue)));
        kill(conn, "nss queue full");
        return;
    }
    ++_nss_waits;
    auto t = _loop.add_timer(_opts.nss_timeout, std::chrono::nanoseconds(0),
                             [this, id] { nss_timed_out(id); });
    if (!t) {
        log::warn("rpc", "{}", t.err().message);
        kill(conn, "timer for the NSS wait");
        return;
    }
    conn.nss_timer = *t;
}

void server::on_nss_answer(const nss_query& q, const nss_answer& a) {
    if (a.error == 0) {
        _names.store(q.uid, a, rtcore::monotonic_now_ns());  // an error is not remembered
    }
    for (auto& [id, cp] : _conns) {
        connection& c = *cp;
        if (c.st != connection::state::resolving || c.sess.peer.uid != q.uid) {
            continue;
        }
        if (a.error != 0) {
            nss_failed(c, a.error);
            continue;
        }
        if (c.sess.peer.groups_source.empty() && !q.want_groups && a.user_name) {
            // This answer lacks the groups this connection needs: ask again.
            if (_resolver->submit(nss_query{c.sess.peer.uid, c.sess.peer.gid, true}) ==
                nss_resolver::submitted::full) {
                ++_closed_nss_queue_full;
                send_nowait(c.fd.get(), engine::overloaded_reply("rpc: too many user lookups (NSS) waiting"));
                kill(c, "nss queue full");
            }
            continue;
        }
        apply_nss_answer(c.sess.peer, a);
        finish_identity(c);
    }
}

void server::nss_failed(connection& c, int err) {
    ++_closed_nss_error;
    log::warn_rl(_refused_log, "rpc", "closing a connection of uid {} pid {}: NSS (getpwuid_r) failed: {}",
                 c.sess.peer.uid, c.sess.peer.pid, std::strerror(err));
    const rpc_failure f("unavailable",
                        fmt::format("rpc: the user lookup for uid {} (NSS: getpwuid_r) failed: {}; "
                                    "try again later",
                                    c.sess.peer.uid, std::strerror(err)),
                        json{{"cause", "nss_error"}, {"uid", c.sess.peer.uid}, {"errno", err}});
    send_nowait(c.fd.get(), to_line(make_error_reply(nullptr, f)));
    kill(c, "nss error");
}

void server::nss_timed_out(std::uint64_t id) {
    auto it = _conns.find(id);
    if (it == _conns.end() || it->second->st != connection::state::resolving) {
        return;
    }
    connection& c = *it->second;
    c.nss_timer = 0;  // a one-shot timer that has fired
    ++_closed_nss_timeout;
    log::warn("rpc", "closing a connection of uid {} pid {}: NSS (getpwuid_r) gave no answer within {} ms",
                 c.sess.peer.uid, c.sess.peer.pid, _opts.nss_timeout.count());
    const rpc_failure f("unavailable",
                        fmt::format("rpc: the user lookup for uid {} (NSS: getpwuid_r) gave no answer "
                                    "within {} ms (rpc.nss_timeout_ms); try again later",
                                    c.sess.peer.uid, _opts.nss_timeout.count()),
                        json{{"cause", "nss_timeout"},
                             {"uid", c.sess.peer.uid},
                             {"timeout_ms", _opts.nss_timeout.count()}});
    send_nowait(c.fd.get(), to_line(make_error_reply(nullptr, f)));
    kill(c, "nss timeout");
}

bool server::admit_identity(connection& c) {
    const bool admin = c.sess.roles.holds(role::admin);
    c.privileged = admin || c.sess.roles.holds(role::calibration);
    std::size_t same_uid = 0;
    std::size_t unreserved = 0;  // connections in the slots open to everyone
    for (const auto& [id, o] : _conns) {
        // A network peer not yet authenticated has no uid and is not in
        // these slots (its own pool, max_unauthenticated).
        if (o.get() == &c || !o->in_main_pool()) {
            continue;
        }
        same_uid += o->sess.peer.uid == c.sess.peer.uid ? 1U : 0U;
        // One still resolving may turn out unprivileged: it counts.
        unreserved += o->st == connection::state::resolving || !o->privileged ? 1U : 0U;
    }
    const std::size_t open_slots =
        _opts.max_connections > _opts.reserved_connections
            ? _opts.max_connections - _opts.reserved_connections
            : 0U;
    std::optional<rpc_failure> refusal;
    if (!admin && same_uid >= _opts.max_connections_per_uid) {
        ++_rejected_per_uid;
        refusal.emplace("overloaded",
                        fmt::format("uid {} ({}) already has {} connections, the limit per uid "
                                    "(rpc.max_connections_per_uid); close one or try again later",
                                    c.sess.peer.uid, c.sess.tenant, same_uid),
                        json{{"cause", "connections_per_uid"},
                             {"limit", _opts.max_connections_per_uid}});
    } else if (!c.privileged && unreserved >= open_slots) {
        ++_rejected_reserved;
        refusal.emplace("overloaded",
                        fmt::format("all {} connections open to every peer are in use (the other "
                                    "{} of rpc.max_connections {} are kept for admins and "
                                    "calibration: rpc.reserved_connections); try again later",
                                    open_slots, _opts.reserved_connections, _opts.max_connections),
                        json{{"cause", "connections"}, {"limit", open_slots}});
    }
    if (!refusal) {
        return true;
    }
    log::warn_rl(_refused_log, "rpc", "refused a connection of uid {} ({}) pid {}: {}", c.sess.peer.uid,
                 c.sess.tenant, c.sess.peer.pid, refusal->message());
    send_nowait(c.fd.get(), to_line(make_error_reply(nullptr, *refusal)));
    kill(c, "connection limit");
    return false;
}

void server::finish_identity(connection& c) {
    if (c.nss_timer != 0) {
        _loop.cancel_timer(std::exchange(c.nss_timer, 0));
    }
    c.sess.roles = _auth.roles_of(c.sess.peer);
    c.sess.tenant = c.sess.peer.tenant();
    if (!admit_identity(c)) {
        return;
    }
    c.st = connection::state::open;
    const std::uint64_t id = c.id;
    c.sess.push = [this, id](std::string_view line) {
        auto it = _conns.find(id);
        if (it == _conns.end() || it->second->st == connection::state::dead) {
            return;
        }
        connection& conn = *it->second;
        append(conn, line, 0);
        flush(conn);
        update_interest(conn);
    };
    _engine.attach(c.sess);
    if (c.remote) {
        // The answer to auth.munge: who the credential says the peer is.
        const json result{{"uid", c.sess.peer.uid},
                          {"gid", c.sess.peer.gid},
                          {"tenant", c.sess.tenant},
                          {"roles", c.sess.roles.names()}};
        append(c, to_line(make_result_reply(c.auth_id, result)), 0);
        flush(c);
        if (c.st == connection::state::dead) {
            return;
        }
        if (c.in.has_complete_line()) {
            process_input(c);  // requests sent behind auth.munge
            if (c.st == connection::state::dead) {
                return;
            }
        }
    }
    // The requests the peer sent while it waited are in the socket: reading
    // starts now (level-triggered, so epoll reports them at once).
    update_interest(c);
}

bool server::may_read(const connection& c) const {
    return c.st == connection::state::open && !c.peer_eof && c.inflight < _opts.max_inflight &&
           c.out_pending() < _opts.output_soft_limit;
}

void server::on_event(std::uint64_t id, std::uint32_t events) {
    auto it = _conns.find(id);
    if (it == _conns.end() || it->second->st == connection::state::dead) {
        return;
    }
    connection& c = *it->second;
    if ((events & EPOLLERR) != 0) {
        kill(c, "socket error");
        return;
    }
    if (c.st == connection::state::resolving || c.st == connection::state::verifying) {
        if ((events & EPOLLHUP) != 0) {
            kill(c, "peer hung up while its identity was resolved");
        }
        return;
    }
    if (c.st == connection::state::authenticating) {
        if ((events & EPOLLOUT) != 0) {
            flush(c);
        }
        if (c.st == connection::state::authenticating && (events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) != 0) {
            read_auth(c);
        }
        update_interest(c);
        return;
    }
    if ((events & EPOLLOUT) != 0) {
        flush(c);
        // Writing may have lifted back-pressure: serve lines already read.
        process_input(c);
    }
    if (c.st != connection::state::dead && (events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) != 0) {
        read_some(c);
    }
    if (c.st != connection::state::dead && (events & EPOLLHUP) != 0 && c.out_pending() > 0) {
        kill(c, "peer hung up");  // nobody will read what is left
    }
    update_interest(c);
}

void server::read_some(connection& c) {
    for (int i = 0; i < reads_per_event; ++i) {
        if (c.st == connection::state::closing) {
            // Draining: read and drop whatever the peer still sends, so it
            // can finish writing and read our last line.
            char sink[16384];
            const ssize_t n = ::recv(c.fd.get(), sink, sizeof sink, MSG_DONTWAIT);
            if (n > 0) {
                continue;
            }
            if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                kill(c, "closed after error");
            }
            return;
        }
        if (!may_read(c)) {
            return;
        }
        const ssize_t n = receive(c, read_chunk);
        if (n > 0) {
            process_input(c);
            if (c.st == connection::state::dead) {
                return;
            }
            continue;
        }
        if (n == 0) {
            // The peer finished sending (maybe only shutdown(SHUT_WR)): it
            // still gets the replies to every complete line it sent.
            c.peer_eof = true;
            process_input(c);
            if (c.st != connection::state::dead && c.out_pending() == 0 && c.held.empty() &&
                !c.in.has_complete_line()) {
                kill(c, "peer closed");
            }
            return;
        }
        return;  // nothing to read now, or c was killed
    }
}

ssize_t server::receive(connection& c, std::size_t max) {
    for (;;) {
        char* dst = c.in.prepare(max);
        const ssize_t n = ::recv(c.fd.get(), dst, max, MSG_DONTWAIT);
        c.in.commit(n > 0 ? static_cast<std::size_t>(n) : 0U);
        if (n > 0) {
            _bytes_in += static_cast<std::uint64_t>(n);
            c.last_rx_ns = rtcore::monotonic_now_ns();
            return n;
        }
        if (n == 0) {
            return 0;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            kill(c, "recv failed");
        }
        return -1;
    }
}

void server::process_input(connection& c) {
    // Lines already buffered must be served even when the socket has no more
    // input (epoll will not wake us for them): after a flush lifts the
    // back-pressure, go round again.
    while (c.st == connection::state::open) {
        std::size_t handled = 0;
        while (c.st == connection::state::open && c.inflight < _opts.max_inflight &&
               c.out_pending() < _opts.output_soft_limit) {
            const line_framer::item it = c.in.next();
            if (it.st == line_framer::status::need_more) {
                break;
            }
            if (it.st == line_framer::status::too_long) {
                ++_closed_line_too_long;
                begin_close(c, _engine.line_too_long_reply(it.seen_bytes));
                break;
            }
            // One reused buffer for the reply text: no string allocated
            // per request (the engine never writes to a connection itself,
            // so events pushed later cannot interleave with it).
            _reply_buf.clear();
            const std::size_t requests = _engine.handle_line(it.line, c.sess, _reply_buf);
            ++handled;
            pending_ack ack = _engine.take_pending_ack();
            if (!_reply_buf.empty()) {
                if (ack.seq != 0 || !c.held.empty()) {
                    // Acknowledged once durable (on_durable), in order.
                    c.held.push_back({std::move(ack), _reply_buf, requests});
                    c.inflight += requests;
                    ++_held_replies;
                } else {
                    append(c, _reply_buf, requests);
                }
            }
            if (_reply_buf.capacity() > reply_buf_keep) {
                _reply_buf = std::string();  // do not keep a huge reply's buffer
            }
            // Events caused by this request follow its reply.
            _engine.drain_event_sources();
        }
        if (c.st == connection::state::dead) {
            return;
        }
        const bool paused =
            c.inflight >= _opts.max_inflight || c.out_pending() >= _opts.output_soft_limit;
        flush(c);
        if (c.st == connection::state::dead) {
            return;
        }
        if (paused) {
            ++_backpressure_pauses;
        }
        const bool still_paused =
            c.inflight >= _opts.max_inflight || c.out_pending() >= _opts.output_soft_limit;
        if (handled == 0 || still_paused) {
            break;  // need more input, or wait for EPOLLOUT
        }
    }
    if (c.st != connection::state::dead) {
        c.in.compact();
    }
}

void server::on_durable(std::uint64_t durable_seq, std::uint64_t failed_from,
                        std::uint64_t failed_to, std::string_view why) {
    std::vector<std::uint64_t> ids;
    for (const auto& [id, c] : _conns) {
        if (!c->held.empty()) {
            ids.push_back(id);
        }
    }
    for (const std::uint64_t id : ids) {
        const auto it = _conns.find(id);
        if (it == _conns.end()) {
            continue;
        }
        connection& c = *it->second;
        bool released = false;
        while (c.st != connection::state::dead && !c.held.empty() &&
               c.held.front().ack.seq <= durable_seq) {
            connection::held_reply h = std::move(c.held.front());
            c.held.pop_front();
            c.inflight -= h.requests;
            released = true;
            // Each request as it was, or store_error (its change failed),
            // or its refusal (commit_late).
            if (_engine.release_held(h.ack, h.text, failed_from, failed_to, why) != 0) {
                ++_failed_commit_replies;
            }
            append(c, h.text, h.requests);
        }
        if (!released || c.st == connection::state::dead) {
            continue;
        }
        flush(c);
        if (c.st != connection::state::dead) {
            process_input(c);  // the held replies may have paused reading
        }
        if (c.st != connection::state::dead) {
            update_interest(c);
        }
    }
}

void server::append(connection& c, std::string_view text, std::size_t requests) {
    if (c.st == connection::state::dead) {
        return;
    }
    c.out.append(text);
    c.appended += text.size();
    if (requests > 0) {
        c.replies.emplace_back(c.appended, requests);
        c.inflight += requests;
    }
    if (c.out_pending() > _opts.output_hard_limit) {
        ++_closed_slow_reader;
        log::warn("rpc", "closing connection of uid {} ({}): {} unread bytes exceed the limit of {}",
                     c.sess.peer.uid, c.sess.tenant, c.out_pending(), _opts.output_hard_limit);
        kill(c, "slow reader");
    }
}

void server::flush(connection& c) {
    while (c.st != connection::state::dead && c.out_pending() > 0) {
        const ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out_pending(),
                                 MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            c.out_off += static_cast<std::size_t>(n);
            c.written += static_cast<std::uint64_t>(n);
            _bytes_out += static_cast<std::uint64_t>(n);
            while (!c.replies.empty() && c.replies.front().first <= c.written) {
                c.inflight -= c.replies.front().second;
                c.replies.pop_front();
            }
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        }
        kill(c, "send failed");
        return;
    }
    if (c.st == connection::state::dead) {
        return;
    }
    if (c.out_off == c.out.size()) {
        c.out.clear();
        c.out_off = 0;
    } else if (c.out_off >= read_chunk && c.out_off * 2 >= c.out.size()) {
        c.out.erase(0, c.out_off);
        c.out_off = 0;
    }
    if (c.out_pending() == 0) {
        if (c.st == connection::state::closing && !c.shut_wr) {
            ::shutdown(c.fd.get(), SHUT_WR);  // the peer reads our last line, then EOF
            c.shut_wr = true;
        }
        if (c.peer_eof && c.held.empty() && !c.in.has_complete_line()) {
            kill(c, "peer closed, replies sent");
        }
    }
}

void server::update_interest(connection& c) {
    if (c.st == connection::state::dead) {
        return;
    }
    std::uint32_t want = 0;
    if ((c.st == connection::state::closing && !c.peer_eof) || may_read(c) ||
        c.st == connection::state::authenticating) {
        want |= EPOLLIN;
    }
    if (c.out_pending() > 0) {
        want |= EPOLLOUT;
    }
    if (want == c.interest) {
        return;
    }
    if (auto st = _loop.modify_fd(c.fd.get(), want); !st) {
        kill(c, "epoll_ctl MOD failed");
        return;
    }
    c.interest = want;
}

void server::begin_close(connection& c, std::string_view last_line) {
    if (c.st != connection::state::open) {
        return;
    }
    close_with(c, last_line);
}

void server::close_with(connection& c, std::string_view last_line) {
    append(c, last_line, 0);
    if (c.st == connection::state::dead) {
        return;
    }
    c.st = connection::state::closing;
    c.closing_since_ns = rtcore::monotonic_now_ns();
    c.in.clear();
    flush(c);
    update_interest(c);
}

void server::kill(connection& c, const char* why) {
    if (c.st == connection::state::dead) {
        return;
    }
    log::debug("rpc", "closing connection {} (uid {}): {}", c.id, c.sess.peer.uid, why);
    c.st = connection::state::dead;
    if (c.nss_timer != 0) {
        _loop.cancel_timer(std::exchange(c.nss_timer, 0));
    }
    _loop.remove_fd(c.fd.get());
    c.fd.reset();
    // sess.push stays: kill() may run inside that very closure (a push whose
    // flush fails), and destroying it there is undefined.  The closure sees
    // the dead state and does nothing; reap() detaches the session.
    c.in = line_framer(0);
    c.out = std::string();
    c.replies.clear();
    for (const auto& h : c.held) {
        _engine.forget_held(h.ack);
    }
    c.held.clear();
    if (!_reap_posted) {
        _reap_posted = true;
        // The connection may be on the caller's stack (and the engine may be
        // iterating sessions): free it later, from the loop.
        _loop.post([alive = std::weak_ptr<bool>(_alive), this] {
            if (alive.lock()) {
                reap();
            }
        });
    }
}

void server::reap() {
    _reap_posted = false;
    for (auto it = _conns.begin(); it != _conns.end();) {
        if (it->second->st == connection::state::dead) {
            _engine.detach(it->second->sess);
            it = _conns.erase(it);
        } else {
            ++it;
        }
    }
}

void server::sweep() {
    const std::int64_t now = rtcore::monotonic_now_ns();
    const std::int64_t idle_ns = to_ns(_opts.idle_timeout);
    const std::int64_t linger_ns = to_ns(_opts.close_linger);
    for (auto& [id, cp] : _conns) {
        connection& c = *cp;
        if (c.st == connection::state::closing && now - c.closing_since_ns > linger_ns) {
            kill(c, "close linger expired");
            continue;
        }
        if (c.st == connection::state::authenticating || c.st == connection::state::verifying) {
            const std::int64_t age = now - c.accepted_ns;
            const auto silent = std::min(_opts.auth_silent_timeout, _opts.auth_timeout);
            if (!c.sent_any && age > to_ns(silent)) {
                refuse_auth(c, auth_cause::auth_timeout,
                            fmt::format("nothing sent within {} ms of the auth.challenge "
                                        "(rpc.auth_silent_timeout_ms); closing",
                                        silent.count()));
            } else if (age > to_ns(_opts.auth_timeout)) {
                refuse_auth(c, auth_cause::auth_timeout,
                            fmt::format("not authenticated within {} ms (rpc.auth_timeout_ms); closing",
                                        _opts.auth_timeout.count()));
            }
            continue;
        }
        if (c.st != connection::state::open || now - c.last_rx_ns <= idle_ns) {
            continue;
        }
        const bool quiet_subscriber = c.sess.subscribed && c.in_pending() == 0 && c.out_pending() == 0;
        if (quiet_subscriber) {
            continue;
        }
        ++_closed_idle;
        if (c.out_pending() == 0) {
            const rpc_failure f("idle_timeout",
                                fmt::format("no complete request for {} ms; closing",
                                            _opts.idle_timeout.count()));
            send_nowait(c.fd.get(), to_line(make_error_reply(nullptr, f)));
        }
        kill(c, "idle timeout");
    }
}

}  // namespace qrt::rpc
