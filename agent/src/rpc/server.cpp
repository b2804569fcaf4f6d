#include "qrt/rpc/server.hpp"

#include "qrt/rpc/framing.hpp"
#include "rtcore/clock.hpp"
#include "rtcore/unique_fd.hpp"

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
constexpr int reads_per_event = 16;  // fairness between connections
constexpr int accepts_per_event = 64;
constexpr std::size_t reply_buf_keep = 256U * 1024U;
// Longest line a connection of the network listener may send before it has
// authenticated (a MUNGE credential is a few hundred bytes).
constexpr std::size_t auth_line_bytes = 4096;

// "tcp://ADDR:PORT": ADDR an IPv4 address or a bracketed IPv6 one.
rtcore::status parse_tcp_listen(std::string_view text, sockaddr_storage& ss, socklen_t& len) {
    const auto bad = [&](std::string_view why) {
        return rtcore::error::invalid(fmt::format(
            "rpc.listen '{}': {}; expected tcp://ADDR:PORT, e.g. tcp://10.0.0.5:7470 or tcp://[::]:7470",
            text, why));
    };
    constexpr std::string_view scheme = "tcp://";
    if (text.substr(0, scheme.size()) != scheme) {
        return bad("it does not start with tcp://");
    }
    std::string_view rest = text.substr(scheme.size());
    std::string host;
    std::string_view port;
    if (!rest.empty() && rest.front() == '[') {
        const auto close = rest.find(']');
        if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
            return bad("an IPv6 address goes in brackets, followed by :PORT");
        }
        host = std::string(rest.substr(1, close - 1));
        port = rest.substr(close + 2);
    } else {
        const auto colon = rest.rfind(':');
        if (colon == std::string_view::npos) {
            return bad("no :PORT");
        }
        host = std::string(rest.substr(0, colon));
        port = rest.substr(colon + 1);
    }
    unsigned long p = 0;
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos ||
        (p = std::stoul(std::string(port))) > 65535) {
        return bad("PORT is not a number in 0..65535");
    }
    std::memset(&ss, 0, sizeof ss);
    auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
    if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(static_cast<std::uint16_t>(p));
        len = sizeof(sockaddr_in);
        return rtcore::ok();
    }
    if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(static_cast<std::uint16_t>(p));
        len = sizeof(sockaddr_in6);
        return rtcore::ok();
    }
    return bad(fmt::format("'{}' is not an IPv4 or IPv6 address (names are not resolved)", host));
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

std::int64_t to_ns(std::chrono::milliseconds d) noexcept {
    return static_cast<std::int64_t>(d.count()) * 1'000'000;
}

// Best effort, never blocks: used for the one line an extra or idle
// connection gets before it is closed.
void send_nowait(int fd, std::string_view text) noexcept {
    [[maybe_unused]] const auto n = ::send(fd, text.data(), text.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace

struct server::connection {
    // resolving: waiting for NSS (not read, no session attached yet).
    // authenticating: a network peer that has not sent auth.munge yet (only
    // that line is read); verifying: its credential is with munged (not read).
    enum class state : std::uint8_t { authenticating, verifying, resolving, open, closing, dead };

    std::uint64_t id = 0;
    int fd = -1;
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
    std::string peer_host;   // the peer's address
    std::string nonce;       // of its auth.challenge
    json auth_id;            // id of its auth.munge request
    std::int64_t accepted_ns = 0;

    explicit connection(std::size_t max_line_bytes) : in(max_line_bytes) {}
    std::size_t out_pending() const noexcept { return out.size() - out_off; }
    std::size_t in_pending() const noexcept { return in.buffered(); }
};

server::server(event_loop& loop, engine& eng, const authorizer& auth, server_options opts)
    : _loop(loop), _engine(eng), _auth(auth), _opts(std::move(opts)), _names(_opts.nss_cache_opts) {}

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

rtcore::status server::start() {
    if (_listen_fd >= 0) {
        return rtcore::error::invalid("rpc: server already started");
    }
    int fd = -1;
    if (_opts.prebound.fd >= 0) {
        fd = std::exchange(_opts.prebound.fd, -1);
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
            if (fd < 0 && ::sd_is_socket_unix(cand, SOCK_STREAM, 1, nullptr, 0) > 0) {
                fd = cand;
            } else if (_tcp_fd < 0 && ::sd_is_socket_inet(cand, AF_UNSPEC, SOCK_STREAM, 1, 0) > 0) {
                if (_opts.listen.empty()) {
                    // Off unless configured: an address in a drop-in alone
                    // does not open the network path.
                    log::warn("rpc", "ignoring passed fd {}: a TCP socket, but rpc.listen is not set", cand);
                    continue;
                }
                const int flags = ::fcntl(cand, F_GETFL);
                if (flags < 0 || ::fcntl(cand, F_SETFL, flags | O_NONBLOCK) < 0) {
                    const int err = errno;
                    return rtcore::error::from_errno(err, fmt::format("fcntl O_NONBLOCK fd {}", cand));
                }
                _tcp_fd = cand;
                _tcp_source = "systemd";
            } else {
                log::warn("rpc", "ignoring passed fd {} (not a listening AF_UNIX stream socket)", cand);
            }
        }
        if (n > 0 && fd < 0) {
            return rtcore::error::invalid(
                fmt::format("rpc: systemd passed {} fds but none is a listening AF_UNIX stream", n));
        }
        if (fd >= 0) {
            const int flags = ::fcntl(fd, F_GETFL);
            if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
                const int err = errno;
                return rtcore::error::from_errno(err, fmt::format("fcntl O_NONBLOCK fd {}", fd));
            }
            _listen_source = "systemd";
        }
    }
    if (fd < 0) {
        auto b = bind_socket(_opts);
        if (!b) {
            return std::move(b).err();
        }
        fd = b->fd;
        _bound_here = true;
        _bound_ino = b->ino;
        _listen_source = "bind";
    }
    _listen_fd = fd;
    if (_tcp_fd < 0 && _opts.prebound_tcp.fd >= 0) {
        _tcp_fd = std::exchange(_opts.prebound_tcp.fd, -1);
        _tcp_source = "bind";
    } else if (_tcp_fd < 0 && !_opts.listen.empty()) {
        auto b = bind_tcp(_opts);
        if (!b) {
            return std::move(b).err();
        }
        _tcp_fd = b->fd;
        _tcp_source = "bind";
    } else if (_opts.prebound_tcp.fd >= 0) {  // systemd's won
        ::close(std::exchange(_opts.prebound_tcp.fd, -1));
    }
    _spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
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
    if (auto st = _loop.add_fd(_listen_fd, EPOLLIN, [this](std::uint32_t) { on_accept(); }); !st) {
        return st;
    }
    if (_tcp_fd >= 0) {
        _tcp_port = port_of(_tcp_fd);
        credential_decoder decode = _opts.decode_fn;
        if (!decode) {
            decode = [sock = _opts.munge_socket](std::string_view cred, std::string_view payload) {
                return munge_check(sock, cred, payload);
            };
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
        if (auto st = _loop.add_fd(_tcp_fd, EPOLLIN, [this](std::uint32_t) { on_accept_tcp(); }); !st) {
            return st;
        }
        const std::string msock = _opts.munge_socket.empty() ? "/run/munge/munge.socket.2" : _opts.munge_socket;
        if (struct stat ms {}; !_opts.decode_fn && ::stat(msock.c_str(), &ms) != 0) {
            log::warn("rpc", "munged's socket {} does not exist ({}): every network connection is refused "
                             "(unavailable, data.cause munge_unavailable) until munged runs (systemctl start munge)",
                      msock, std::strerror(errno));
        }
        log::info("rpc", "serving the network listener on {} port {} ({}), MUNGE-authenticated (munged at {}), "
                         "max {} connections per host, {} ms to authenticate",
                  _opts.listen.empty() ? std::string("systemd socket") : _opts.listen, _tcp_port, _tcp_source,
                  _opts.munge_socket.empty() ? std::string("the default socket") : _opts.munge_socket,
                  _opts.max_connections_per_host, _opts.auth_timeout.count());
    }
    const auto tick = std::clamp(_opts.idle_timeout / 4, std::chrono::milliseconds(20),
                                 std::chrono::milliseconds(1000));
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
    if (_listen_fd >= 0) {
        _loop.remove_fd(_listen_fd);
        ::close(_listen_fd);
        _listen_fd = -1;
    }
    if (_tcp_fd >= 0) {
        _loop.remove_fd(_tcp_fd);
        ::close(_tcp_fd);
        _tcp_fd = -1;
    }
    if (_spare_fd >= 0) {
        ::close(_spare_fd);
        _spare_fd = -1;
    }
    if (_opts.prebound.fd >= 0) {  // handed in, never started
        ::close(std::exchange(_opts.prebound.fd, -1));
    }
    if (_opts.prebound_tcp.fd >= 0) {
        ::close(std::exchange(_opts.prebound_tcp.fd, -1));
    }
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
                            const std::function<void(int, const sockaddr_storage&)>& take) {
    for (int i = 0; i < accepts_per_event; ++i) {
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len,
                                 SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            take(fd, ss);
            continue;
        }
        const int e = errno;
        if (e == EINTR || e == ECONNABORTED) {
            continue;
        }
        if (e == EMFILE || e == ENFILE) {
            ++_rejected_cap;
            if (_spare_fd >= 0) {
                ::close(_spare_fd);
                const int victim = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
                if (victim >= 0) {
                    ::close(victim);
                }
                _spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
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
    accept_pending(_listen_fd, "UNIX socket", [this](int fd, const sockaddr_storage&) { accept_one(fd); });
}

void server::accept_one(int fd) {
    std::size_t live = 0;
    for (const auto& [id, c] : _conns) {
        live += c->st == connection::state::dead ? 0U : 1U;
    }
    if (live >= _opts.max_connections) {
        ++_rejected_cap;
        send_nowait(fd, engine::overloaded_reply(fmt::format(
                            "connection limit of {} reached; try again later", _opts.max_connections)));
        ::close(fd);
        return;
    }
    // The kernel's word only (SO_PEERCRED, SO_PEERGROUPS): never blocks.
    auto peer = peer_credentials_of(fd);
    if (!peer) {
        ++_peercred_failures;
        log::warn("rpc", "closing a connection: {}", peer.err().message);
        ::close(fd);
        return;
    }
    auto c = std::make_unique<connection>(_opts.max_line_bytes);
    c->id = _next_id++;
    c->fd = fd;
    c->last_rx_ns = rtcore::monotonic_now_ns();
    c->sess.id = c->id;
    c->sess.peer = std::move(*peer);
    c->st = connection::state::resolving;
    const std::uint64_t id = c->id;
    // Registered with no interest while resolving: epoll still reports a
    // hang-up, nothing is read.
    c->interest = 0;
    if (auto st = _loop.add_fd(fd, 0, [this, id](std::uint32_t ev) { on_event(id, ev); }); !st) {
        log::warn("rpc", "{}", st.err().message);
        ::close(fd);
        return;
    }
    ++_accepted;
    connection& conn = *c;
    _conns.emplace(id, std::move(c));
    start_identity(conn);
}

void server::start_identity(connection& conn) {
    const std::uint64_t id = conn.id;
    const int fd = conn.fd;
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

void server::on_accept_tcp() {
    accept_pending(_tcp_fd, "network listener",
                   [this](int fd, const sockaddr_storage& ss) { accept_remote(fd, host_of(ss)); });
}

void server::accept_remote(int fd, const std::string& host) {
    std::size_t live = 0;
    std::size_t same_host = 0;
    for (const auto& [id, c] : _conns) {
        if (c->st == connection::state::dead) {
            continue;
        }
        ++live;
        same_host += c->remote && c->peer_host == host ? 1U : 0U;
    }
    if (live >= _opts.max_connections) {
        ++_rejected_cap;
        send_nowait(fd, engine::overloaded_reply(fmt::format(
                            "connection limit of {} reached; try again later", _opts.max_connections)));
        ::close(fd);
        return;
    }
    if (same_host >= _opts.max_connections_per_host) {
        ++_rejected_per_host;
        log::warn_rl(_refused_log, "rpc", "refused a connection from {}: it already has {} (rpc.max_connections_per_host)",
                     host, same_host);
        const rpc_failure f("overloaded",
                            fmt::format("host {} already has {} connections, the limit per host "
                                        "(rpc.max_connections_per_host); close one or try again later",
                                        host, same_host),
                            json{{"cause", "connections_per_host"}, {"limit", _opts.max_connections_per_host}});
        send_nowait(fd, to_line(make_error_reply(nullptr, f)));
        ::close(fd);
        return;
    }
    const int one = 1;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<connection>(_opts.max_line_bytes);
    c->id = _next_id++;
    c->fd = fd;
    c->remote = true;
    c->peer_host = host;
    c->accepted_ns = c->last_rx_ns = rtcore::monotonic_now_ns();
    c->sess.id = c->id;
    c->sess.peer.pid = 0;  // a remote process: no pid here
    c->st = connection::state::authenticating;
    c->nonce = make_nonce();
    const std::uint64_t id = c->id;
    c->interest = EPOLLIN;
    if (auto st = _loop.add_fd(fd, EPOLLIN, [this, id](std::uint32_t ev) { on_event(id, ev); }); !st) {
        log::warn("rpc", "{}", st.err().message);
        ::close(fd);
        return;
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
                           {"payload", auth_payload(conn.nonce)}}}};
    append(conn, to_line(challenge), 0);
    flush(conn);
    update_interest(conn);
}

void server::refuse_auth(connection& c, std::string_view cause, const std::string& message) {
    ++_auth_refused[std::string(cause)];
    const bool unavailable = cause == auth_cause::munge_unavailable;
    log::warn_rl(_refused_log, "rpc", "refused a network connection from {}: {} ({})", c.peer_host, message,
                 cause);
    const rpc_failure f(unavailable ? "unavailable" : "unauthenticated", message,
                        json{{"cause", cause}});
    const json& id = c.auth_id;
    append(c, to_line(make_error_reply(id, f)), 0);
    if (c.st == connection::state::dead) {
        return;
    }
    // Closing like begin_close: the last line is read, then EOF.
    c.st = connection::state::closing;
    c.closing_since_ns = rtcore::monotonic_now_ns();
    c.in.clear();
    flush(c);
    update_interest(c);
}

void server::read_auth(connection& c) {
    for (int i = 0; i < reads_per_event && c.st == connection::state::authenticating; ++i) {
        if (c.in.buffered() > auth_line_bytes) {
            refuse_auth(c, auth_cause::malformed,
                        fmt::format("the first line is longer than {} bytes; send auth.munge first",
                                    auth_line_bytes));
            return;
        }
        char* dst = c.in.prepare(auth_line_bytes);
        const ssize_t n = ::recv(c.fd, dst, auth_line_bytes, MSG_DONTWAIT);
        c.in.commit(n > 0 ? static_cast<std::size_t>(n) : 0U);
        if (n > 0) {
            _bytes_in += static_cast<std::uint64_t>(n);
            c.last_rx_ns = rtcore::monotonic_now_ns();
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
            return;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            kill(c, "recv failed");
        }
        return;
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
    if (!_verifier->submit(c.id, cred->get<std::string>(), auth_payload(c.nonce))) {
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
    if (!r.ok) {
        refuse_auth(c, r.cause, r.message);
        return;
    }
    ++_authenticated;
    c.sess.peer.uid = r.uid;
    c.sess.peer.gid = r.gid;
    c.sess.peer.groups.clear();
    c.sess.peer.groups_source.clear();  // NSS gives them (getgrouplist), as without SO_PEERGROUPS
    log::debug("rpc", "connection {} from {} authenticated by MUNGE as uid {} gid {}", c.id, c.peer_host,
               r.uid, r.gid);
    c.st = connection::state::resolving;
    start_identity(c);
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
                send_nowait(c.fd, engine::overloaded_reply("rpc: too many user lookups (NSS) waiting"));
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
    send_nowait(c.fd, to_line(make_error_reply(nullptr, f)));
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
    send_nowait(c.fd, to_line(make_error_reply(nullptr, f)));
    kill(c, "nss timeout");
}

bool server::admit_identity(connection& c) {
    const bool admin = c.sess.roles.holds(role::admin);
    c.privileged = admin || c.sess.roles.holds(role::calibration);
    std::size_t same_uid = 0;
    std::size_t unreserved = 0;  // connections in the slots open to everyone
    for (const auto& [id, o] : _conns) {
        if (o.get() == &c || o->st == connection::state::dead) {
            continue;
        }
        const bool uid_known =
            o->st != connection::state::authenticating && o->st != connection::state::verifying;
        same_uid += uid_known && o->sess.peer.uid == c.sess.peer.uid ? 1U : 0U;
        // One still resolving (or authenticating) may turn out unprivileged: it counts.
        unreserved += o->st == connection::state::resolving || !uid_known || !o->privileged ? 1U : 0U;
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
    send_nowait(c.fd, to_line(make_error_reply(nullptr, *refusal)));
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
            const ssize_t n = ::recv(c.fd, sink, sizeof sink, MSG_DONTWAIT);
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
        char* dst = c.in.prepare(read_chunk);
        const ssize_t n = ::recv(c.fd, dst, read_chunk, MSG_DONTWAIT);
        c.in.commit(n > 0 ? static_cast<std::size_t>(n) : 0U);
        if (n > 0) {
            _bytes_in += static_cast<std::uint64_t>(n);
            c.last_rx_ns = rtcore::monotonic_now_ns();
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
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            kill(c, "recv failed");
        }
        return;
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
        const ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out_pending(),
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
            ::shutdown(c.fd, SHUT_WR);  // the peer reads our last line, then EOF
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
    if (auto st = _loop.modify_fd(c.fd, want); !st) {
        kill(c, "epoll_ctl MOD failed");
        return;
    }
    c.interest = want;
}

void server::begin_close(connection& c, std::string_view last_line) {
    if (c.st != connection::state::open) {
        return;
    }
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
    _loop.remove_fd(c.fd);
    ::close(c.fd);
    c.fd = -1;
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
        if ((c.st == connection::state::authenticating || c.st == connection::state::verifying) &&
            now - c.accepted_ns > to_ns(_opts.auth_timeout)) {
            refuse_auth(c, auth_cause::auth_timeout,
                        fmt::format("not authenticated within {} ms (rpc.auth_timeout_ms); closing",
                                    _opts.auth_timeout.count()));
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
            send_nowait(c.fd, to_line(make_error_reply(nullptr, f)));
        }
        kill(c, "idle timeout");
    }
}

void server::export_textfile() {
    if (!_metrics_source || _opts.metrics_textfile.empty()) {
        return;
    }
    auto text = _metrics_source();
    if (!text) {
        log::warn("rpc", "metrics textfile: {}", text.err().message);
        return;
    }
    if (auto st = telemetry::write_textfile_atomically(_opts.metrics_textfile, *text); !st) {
        log::warn("rpc", "metrics textfile: {}", st.err().message);
    }
}

telemetry::snapshot server::stats() const {
    telemetry::snapshot s;
    std::size_t live = 0;
    std::size_t subscribers = 0;
    std::size_t buffered = 0;
    for (const auto& [id, c] : _conns) {
        if (c->st == connection::state::dead) {
            continue;
        }
        ++live;
        subscribers += c->sess.subscribed ? 1U : 0U;
        buffered += c->out_pending() + c->in.buffered();
    }
    s.add_gauge("qrt_rpc_connections", "open control-socket connections", {},
                static_cast<double>(live));
    s.add_gauge("qrt_rpc_connections_max", "connection cap", {},
                static_cast<double>(_opts.max_connections));
    s.add_gauge("qrt_rpc_subscribers", "connections subscribed to events", {},
                static_cast<double>(subscribers));
    s.add_gauge("qrt_rpc_buffered_bytes", "bytes buffered for all connections", {},
                static_cast<double>(buffered));
    s.add_counter("qrt_rpc_connections_accepted_total", "connections accepted", {}, _accepted);
    s.add_counter("qrt_rpc_connections_rejected_total", "connections refused at the cap",
                  {{"cause", "cap"}}, _rejected_cap);
    s.add_counter("qrt_rpc_connections_rejected_total", "connections refused at the cap",
                  {{"cause", "per_uid"}}, _rejected_per_uid);
    s.add_counter("qrt_rpc_connections_rejected_total", "connections refused at the cap",
                  {{"cause", "reserved"}}, _rejected_reserved);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "line_too_long"}}, _closed_line_too_long);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "idle_timeout"}}, _closed_idle);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "slow_reader"}}, _closed_slow_reader);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "peercred"}}, _peercred_failures);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "nss_timeout"}}, _closed_nss_timeout);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "nss_queue_full"}}, _closed_nss_queue_full);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "nss_error"}}, _closed_nss_error);
    s.add_counter("qrt_rpc_nss_waits_total",
                  "connections that waited for a user lookup (NSS) off the event loop", {}, _nss_waits);
    s.add_gauge("qrt_rpc_nss_pending", "user lookups (NSS) queued or under way", {},
                static_cast<double>(_resolver ? _resolver->pending() : 0U));
    s.add_counter("qrt_rpc_connections_rejected_total", "connections refused at the cap",
                  {{"cause", "per_host"}}, _rejected_per_host);
    s.add_counter("qrt_rpc_remote_connections_accepted_total",
                  "connections accepted on the network listener (rpc.listen)", {}, _accepted_remote);
    s.add_counter("qrt_rpc_remote_authenticated_total",
                  "network connections whose MUNGE credential was accepted", {}, _authenticated);
    for (const auto cause : {auth_cause::expired, auth_cause::rewound, auth_cause::replayed,
                             auth_cause::invalid, auth_cause::malformed, auth_cause::nonce_mismatch,
                             auth_cause::auth_required, auth_cause::auth_timeout,
                             auth_cause::munge_unavailable}) {
        const auto it = _auth_refused.find(cause);
        s.add_counter("qrt_rpc_remote_auth_refused_total",
                      "network connections refused before being served, by data.cause",
                      {{"cause", std::string(cause)}}, it == _auth_refused.end() ? 0U : it->second);
    }
    s.add_counter("qrt_rpc_received_bytes_total", "bytes read from clients", {}, _bytes_in);
    s.add_counter("qrt_rpc_sent_bytes_total", "bytes written to clients", {}, _bytes_out);
    s.add_counter("qrt_rpc_backpressure_pauses_total",
                  "times reading a connection stopped for unsent replies or requests in flight",
                  {}, _backpressure_pauses);
    s.add_counter("qrt_rpc_replies_held_for_commit_total",
                  "reply lines held until the change they acknowledge was durable", {},
                  _held_replies);
    s.add_counter("qrt_rpc_commit_failed_replies_total",
                  "held reply lines answered with store_error because their commit failed", {},
                  _failed_commit_replies);
    return s;
}

}  // namespace qrt::rpc
