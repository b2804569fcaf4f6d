#include "connection.hpp"

#include <fcntl.h>
#include <munge.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <system_error>
#include <thread>

#include "qrt/proto/auth_binding.hpp"

namespace qrt::client {

namespace {

constexpr std::size_t read_chunk = 64U * 1024U;

std::string errno_text(int e) { return std::generic_category().message(e); }

call_error local(std::string_view reason, int err, std::string message) {
    call_error e;
    e.reason = std::string(reason);
    e.sys_errno = err;
    e.message = std::move(message);
    return e;
}

// Milliseconds left until deadline, clamped to poll()'s int; -1 = forever.
int poll_ms(std::optional<std::chrono::steady_clock::time_point> deadline) {
    if (!deadline) {
        return -1;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        *deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
        return 0;
    }
    return static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30));
}

std::string dump(const json& j) {
    // Never throws on invalid UTF-8 in caller-supplied strings: replaced.
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string default_socket_path() {
#ifdef QRT_DEFAULT_SOCKET_PATH
    return QRT_DEFAULT_SOCKET_PATH;
#else
    return "/run/qrtd/qrtd.sock";
#endif
}

std::string resolve_socket_path(std::string_view explicit_path) {
    if (!explicit_path.empty()) {
        return std::string(explicit_path);
    }
    if (const char* env = std::getenv("QRT_SOCKET"); env != nullptr && *env != '\0') {
        return env;
    }
    return default_socket_path();
}

reply reply_from_object(const json& obj) {
    if (!obj.is_object()) {
        return local(local_reason::protocol_error, EPROTO, "reply is not a JSON object");
    }
    if (const auto it = obj.find("result"); it != obj.end()) {
        return *it;
    }
    const auto it = obj.find("error");
    if (it == obj.end() || !it->is_object()) {
        return local(local_reason::protocol_error, EPROTO,
                     "reply has neither 'result' nor an 'error' object");
    }
    call_error e;
    const json& err = *it;
    if (const auto c = err.find("code"); c != err.end() && c->is_number_integer()) {
        e.code = c->get<int>();
    } else {
        e.code = proto::code_internal_error;
    }
    if (const auto m = err.find("message"); m != err.end() && m->is_string()) {
        e.message = m->get<std::string>();
    }
    if (const auto d = err.find("data"); d != err.end()) {
        e.data = *d;
        if (d->is_object()) {
            if (const auto r = d->find("reason"); r != d->end() && r->is_string()) {
                e.reason = r->get<std::string>();
            }
        }
    }
    if (e.reason.empty()) {
        // A foreign server that omits data.reason: the code's default.
        e.reason = std::string(proto::default_reason_for_code(e.code));
    }
    if (e.code == 0) {
        e.code = proto::code_internal_error;  // 0 is reserved for local failures
    }
    return e;
}

bool is_tcp_address(std::string_view path) noexcept { return path.substr(0, 6) == "tcp://"; }

namespace {

// tcp://HOST:PORT -> (HOST, PORT); HOST may be a bracketed IPv6 address.
std::optional<std::pair<std::string, std::string>> split_tcp(std::string_view p) {
    std::string_view rest = p.substr(6);
    if (!rest.empty() && rest.front() == '[') {
        const auto close = rest.find(']');
        if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
            return std::nullopt;
        }
        return std::make_pair(std::string(rest.substr(1, close - 1)), std::string(rest.substr(close + 2)));
    }
    const auto colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
        return std::nullopt;
    }
    return std::make_pair(std::string(rest.substr(0, colon)), std::string(rest.substr(colon + 1)));
}

// A connected, non-blocking TCP socket to tcp://HOST:PORT within timeout.
std::variant<rtcore::unique_fd, call_error> connect_tcp(const std::string& p, std::chrono::milliseconds timeout) {
    const auto hp = split_tcp(p);
    if (!hp || hp->second.empty() || hp->second.find_first_not_of("0123456789") != std::string::npos) {
        return local(local_reason::client_error, EINVAL,
                     "'" + p + "' is not tcp://HOST:PORT (an IPv6 address goes in brackets: tcp://[::1]:7470)");
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (const int rc = ::getaddrinfo(hp->first.c_str(), hp->second.c_str(), &hints, &res); rc != 0) {
        return local(local_reason::unreachable, EHOSTUNREACH,
                     "cannot connect to " + p + ": cannot resolve '" + hp->first + "': " + ::gai_strerror(rc));
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int last = ECONNREFUSED;
    rtcore::unique_fd out;
    for (addrinfo* ai = res; ai != nullptr && !out; ai = ai->ai_next) {
        rtcore::unique_fd sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                                        ai->ai_protocol));
        if (!sock) {
            last = errno;
            continue;
        }
        int rc = ::connect(sock.get(), ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            pollfd pfd{sock.get(), POLLOUT, 0};
            int n = 0;
            do {
                n = ::poll(&pfd, 1, poll_ms(deadline));
            } while (n < 0 && errno == EINTR);
            if (n == 0) {
                last = ETIMEDOUT;
                continue;
            }
            int soerr = 0;
            socklen_t len = sizeof soerr;
            (void)::getsockopt(sock.get(), SOL_SOCKET, SO_ERROR, &soerr, &len);
            rc = soerr == 0 ? 0 : -1;
            errno = soerr;
        }
        if (rc != 0) {
            last = errno;
            continue;
        }
        const int one = 1;
        (void)::setsockopt(sock.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        out = std::move(sock);
    }
    ::freeaddrinfo(res);
    if (!out) {
        std::string hint = last == ECONNREFUSED ? " (is qrtd running there with rpc.listen set?)"
                           : last == ETIMEDOUT  ? " (no answer: a firewall, or the host is down)"
                                                : "";
        return local(local_reason::unreachable, last, "cannot connect to " + p + ": " + errno_text(last) + hint);
    }
    return out;
}

}  // namespace

std::optional<call_error> connection::authenticate(const connect_options& opts) {
    auto n = next_notification(opts.connect_timeout);
    const auto refused_early = [&]() -> std::optional<call_error> {
        // A refusal the agent sent instead of its challenge (a connection cap).
        for (const auto& [id, obj] : _replies) {
            reply r = reply_from_object(obj);
            if (!r) {
                call_error e = r.error();
                e.message = _path + ": " + e.message;
                return e;
            }
        }
        return std::nullopt;
    };
    if (auto* e = std::get_if<call_error>(&n)) {
        if (auto early = refused_early()) {
            return early;
        }
        call_error out = *e;
        out.message = _path + ": closed before its auth.challenge: " + e->message;
        return out;
    }
    const auto& note = std::get<0>(n);
    if (!note) {
        if (auto early = refused_early()) {
            return early;
        }
        return local(local_reason::timeout, ETIMEDOUT,
                     _path + ": no auth.challenge within " + std::to_string(opts.connect_timeout.count()) +
                         " ms (is this qrtd's network listener?)");
    }
    std::string nonce;
    std::string version;
    if (note->value("method", std::string()) == "auth.challenge" && note->contains("params") &&
        (*note)["params"].is_object()) {
        const json& p = (*note)["params"];
        if (p.value("mechanism", std::string()) == "munge") {
            nonce = p.value("nonce", std::string());
            version = p.value("payload_version", std::string());
        }
    }
    if (nonce.empty() || nonce.size() > 128 || nonce.find_first_not_of("0123456789abcdef") != std::string::npos) {
        return local(local_reason::protocol_error, EPROTO,
                     _path + ": the first line is not a MUNGE auth.challenge: " + dump(*note).substr(0, 160));
    }
    if (version != proto::auth::payload_version) {
        return local(local_reason::protocol_error, EPROTO,
                     _path + ": the agent's challenge asks for a credential of " +
                         (version.empty() ? std::string("qrtd-auth-v1, which binds no address") : version) +
                         ", not " + std::string(proto::auth::payload_version) + ": upgrade qrtd there");
    }
    // The credential names the listener this socket is connected to, so
    // that another qrtd refuses it should this one have relayed its
    // challenge (qrt/proto/auth_binding.hpp).
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    if (::getpeername(_fd.get(), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
        const int e = errno;
        return local(local_reason::disconnected, e, _path + ": getpeername: " + errno_text(e));
    }
    const std::string payload =
        proto::auth_payload(nonce, proto::tcp_address_text(reinterpret_cast<const sockaddr*>(&peer)));
    std::string sock = opts.munge_socket;
    if (sock.empty()) {
        if (const char* env = std::getenv("QRT_MUNGE_SOCKET"); env != nullptr && *env != '\0') {
            sock = env;
        }
    }
    munge_ctx_t ctx = ::munge_ctx_create();
    if (ctx == nullptr) {
        return local(local_reason::munge_error, ENOMEM, "munge_ctx_create: out of memory");
    }
    if (!sock.empty()) {
        (void)::munge_ctx_set(ctx, MUNGE_OPT_SOCKET, sock.c_str());
    }
    char* cred = nullptr;
    const munge_err_t me = ::munge_encode(&cred, ctx, payload.data(), static_cast<int>(payload.size()));
    const std::string why = ::munge_ctx_strerror(ctx) != nullptr ? ::munge_ctx_strerror(ctx) : ::munge_strerror(me);
    ::munge_ctx_destroy(ctx);
    if (me != EMUNGE_SUCCESS || cred == nullptr) {
        std::free(cred);
        const std::string where = sock.empty() ? "the default socket /run/munge/munge.socket.2" : sock;
        std::string hint = me == EMUNGE_SOCKET ? " (munged is not running here, or not at " + where +
                                                     ": start munge.service, or set QRT_MUNGE_SOCKET)"
                                               : "";
        return local(local_reason::munge_error, me == EMUNGE_SOCKET ? ECONNREFUSED : EPROTO,
                     "cannot get a MUNGE credential for " + _path + " from munged at " + where + ": " + why + hint);
    }
    const std::string credential(cred);
    std::free(cred);
    reply r = call("auth.munge", json{{"credential", credential}});
    if (!r) {
        call_error e = r.error();
        std::string cause;
        if (e.data.is_object()) {
            cause = e.data.value("cause", std::string());
        }
        std::string hint;
        if (cause == "expired" || cause == "rewound") {
            hint = " -- the clocks of this host and " + _path +
                   "'s host disagree: check that both keep time (chrony, ntpd, systemd-timesyncd)";
        } else if (cause == "invalid") {
            hint = " -- this host's munge key is not the agent's: install the cluster's /etc/munge/munge.key";
        } else if (e.reason == proto::reason::unavailable && cause == "munge_unavailable") {
            hint = " -- munged is not running on the agent's host";
        } else if (cause == "address_mismatch") {
            hint = " -- " + _path + " is not the qrtd that answered: dial qrtd's own address (rpc.listen), "
                   "or name the translated one in its rpc.listen_aliases";
        }
        e.message = _path + " refused the MUNGE credential: " + e.message + hint;
        return e;
    }
    _auth = std::move(r).result();
    return std::nullopt;
}

std::variant<std::unique_ptr<connection>, call_error> connection::open(std::string_view path,
                                                                       connect_options opts) {
    const std::string p(path);
    if (is_tcp_address(p)) {
        // A refusal for the agent's pool of connections not yet
        // authenticated (its cap per host, or in all) passes within
        // milliseconds: many clients of one node connecting at once meet
        // it.  Tried again, with a growing pause, until connect_timeout.
        const auto deadline = std::chrono::steady_clock::now() + opts.connect_timeout;
        std::minstd_rand jitter(static_cast<std::uint32_t>(
            static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
            static_cast<std::uint64_t>(::getpid())));
        std::chrono::milliseconds pause{2};
        for (;;) {
            connect_options attempt = opts;
            attempt.connect_timeout = std::max(std::chrono::milliseconds(1),
                                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                                   deadline - std::chrono::steady_clock::now()));
            auto fd = connect_tcp(p, attempt.connect_timeout);
            if (auto* e = std::get_if<call_error>(&fd)) {
                return *e;
            }
            std::unique_ptr<connection> c(new connection(std::move(std::get<0>(fd)), p, opts));
            auto err = c->authenticate(attempt);
            if (!err) {
                return c;
            }
            const std::string cause = err->data.is_object() ? err->data.value("cause", std::string()) : "";
            const bool passing = err->reason == proto::reason::overloaded &&
                                 (cause == "unauthenticated_per_host" || cause == "unauthenticated_connections");
            const auto spread = static_cast<std::uint64_t>(pause.count()) + 1U;
            const auto wait = pause + std::chrono::milliseconds(static_cast<std::int64_t>(jitter() % spread));
            if (!passing || std::chrono::steady_clock::now() + wait >= deadline) {
                return *err;
            }
            std::this_thread::sleep_for(wait);
            pause = std::min(pause * 2, std::chrono::milliseconds(100));
        }
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (p.empty() || p.size() >= sizeof(addr.sun_path)) {
        return local(local_reason::client_error, ENAMETOOLONG,
                     "socket path '" + p + "' is empty or longer than " +
                         std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
    }
    std::memcpy(addr.sun_path, p.data(), p.size());

    rtcore::unique_fd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const int fd = sock.get();
    if (!sock) {
        const int e = errno;
        return local(local_reason::unreachable, e, "socket(AF_UNIX): " + errno_text(e));
    }
    // A blocking connect bounded by SO_SNDTIMEO: for AF_UNIX the kernel
    // waits on a full backlog with the send timeout (a non-blocking connect
    // would fail at once with EAGAIN instead of waiting).
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(opts.connect_timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((opts.connect_timeout.count() % 1000) * 1000);
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int rc = 0;
    do {
        rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        int e = errno;
        sock.reset();
        if (e == EAGAIN || e == EINPROGRESS) {
            e = ETIMEDOUT;
        }
        std::string hint;
        if (e == ENOENT || e == ECONNREFUSED) {
            hint = " (is qrtd running?)";
        } else if (e == EACCES || e == EPERM) {
            hint = " (is this user in the socket's group?)";
        } else if (e == ETIMEDOUT) {
            hint = " (the agent is not accepting connections)";
        }
        return local(local_reason::unreachable, e,
                     "cannot connect to " + p + ": " + errno_text(e) + hint);
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
        const int e = errno;
        return local(local_reason::unreachable, e, "fcntl(O_NONBLOCK) on " + p + ": " + errno_text(e));
    }
    return std::unique_ptr<connection>(new connection(std::move(sock), p, opts));
}

connection::connection(rtcore::unique_fd fd, std::string path, connect_options opts)
    : _fd(std::move(fd)), _path(std::move(path)), _opts(opts) {}

connection::~connection() = default;

call_error connection::fail(call_error e) {
    if (!_broken) {
        _broken = e;
    }
    return e;
}

std::optional<call_error> connection::fill(std::optional<clock::time_point> deadline) {
    if (_in_off > 0 && _in_off == _in.size()) {
        _in.clear();
        _in_off = 0;
    } else if (_in_off > read_chunk && _in_off * 2 > _in.size()) {
        _in.erase(0, _in_off);
        _in_off = 0;
    }
    for (;;) {
        const std::size_t old = _in.size();
        _in.resize(old + read_chunk);
        const ssize_t n = ::recv(_fd.get(), _in.data() + old, read_chunk, 0);
        _in.resize(old + (n > 0 ? static_cast<std::size_t>(n) : 0U));
        if (n > 0) {
            if (_in.size() - _in_off > _opts.max_line_bytes &&
                _in.find('\n', _in_off) == std::string::npos) {
                return fail(local(local_reason::protocol_error, EMSGSIZE,
                                  "reply line from " + _path + " exceeds " +
                                      std::to_string(_opts.max_line_bytes) + " bytes"));
            }
            return std::nullopt;
        }
        if (n == 0) {
            return fail(local(local_reason::disconnected, ECONNRESET,
                              "the agent at " + _path + " closed the connection"));
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            const int e = errno;
            return fail(local(local_reason::disconnected, e,
                              "recv from " + _path + ": " + errno_text(e)));
        }
        pollfd pfd{_fd.get(), POLLIN, 0};
        const int rc = ::poll(&pfd, 1, poll_ms(deadline));
        if (rc == 0) {
            return local(local_reason::timeout, ETIMEDOUT,
                         "no reply from " + _path + " within " +
                             std::to_string(_opts.call_timeout.count()) + " ms");
        }
        if (rc < 0 && errno != EINTR) {
            const int e = errno;
            return fail(local(local_reason::disconnected, e, "poll " + _path + ": " + errno_text(e)));
        }
    }
}

std::optional<std::string> connection::take_line() {
    const std::size_t nl = _in.find('\n', _in_off);
    if (nl == std::string::npos) {
        return std::nullopt;
    }
    std::size_t end = nl;
    if (end > _in_off && _in[end - 1] == '\r') {
        --end;
    }
    std::string line = _in.substr(_in_off, end - _in_off);
    _in_off = nl + 1;
    return line;
}

std::optional<call_error> connection::route(const std::string& line) {
    json obj = json::parse(line, nullptr, false);
    if (obj.is_discarded()) {
        return fail(local(local_reason::protocol_error, EPROTO,
                          "reply from " + _path + " is not JSON: " + line.substr(0, 120)));
    }
    if (obj.is_array()) {
        // A batch reply (only raw callers send batches): route each element.
        for (auto& el : obj) {
            if (el.is_object() && el.contains("id") && el["id"].is_number_unsigned()) {
                _replies.emplace_back(el["id"].get<std::uint64_t>(), std::move(el));
            }
        }
        return std::nullopt;
    }
    if (!obj.is_object()) {
        return fail(local(local_reason::protocol_error, EPROTO,
                          "reply from " + _path + " is not a JSON object"));
    }
    const auto id = obj.find("id");
    if (id == obj.end()) {
        if (obj.contains("method")) {
            _notes.push_back(std::move(obj));
            return std::nullopt;
        }
        return fail(local(local_reason::protocol_error, EPROTO,
                          "reply from " + _path + " has no id: " + line.substr(0, 120)));
    }
    if (id->is_number_unsigned()) {
        const auto n = id->get<std::uint64_t>();
        _replies.emplace_back(n, std::move(obj));
        return std::nullopt;
    }
    if (id->is_null()) {
        // An error the server could not tie to a request (parse error,
        // line too long, overloaded): it answers the oldest request.
        _replies.emplace_back(0, std::move(obj));
        return std::nullopt;
    }
    return fail(local(local_reason::protocol_error, EPROTO,
                      "reply from " + _path + " has an unexpected id: " + id->dump()));
}

std::optional<call_error> connection::write_out(clock::time_point deadline) {
    while (_out_off < _out.size()) {
        const ssize_t n = ::send(_fd.get(), _out.data() + _out_off, _out.size() - _out_off,
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            _out_off += static_cast<std::size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            const int e = errno;
            return fail(local(local_reason::disconnected, e,
                              "send to " + _path + ": " + errno_text(e)));
        }
        // The socket is full: the server is applying back-pressure until
        // we read its replies.  Read while waiting, so neither side blocks.
        pollfd pfd{_fd.get(), POLLIN | POLLOUT, 0};
        const int rc = ::poll(&pfd, 1, poll_ms(deadline));
        if (rc == 0) {
            return local(local_reason::timeout, ETIMEDOUT,
                         "the agent at " + _path + " did not read the request within " +
                             std::to_string(_opts.call_timeout.count()) + " ms");
        }
        if (rc < 0) {
            if (errno == EINTR) {
                continue;
            }
            const int e = errno;
            return fail(local(local_reason::disconnected, e, "poll " + _path + ": " + errno_text(e)));
        }
        if ((pfd.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
            if (auto err = fill(deadline)) {
                return err;
            }
            while (auto line = take_line()) {
                if (auto err = route(*line)) {
                    return err;
                }
            }
        }
    }
    _out.clear();
    _out_off = 0;
    return std::nullopt;
}

std::uint64_t connection::send_request(std::string_view method, const json& params) {
    const std::uint64_t id = _next_id++;
    json req{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
    if (!params.is_null()) {
        req["params"] = params;
    }
    _out += dump(req);
    _out += '\n';
    return id;
}

std::optional<call_error> connection::flush() {
    if (_broken) {
        return _broken;
    }
    return write_out(clock::now() + _opts.call_timeout);
}

reply connection::wait_reply(std::uint64_t id) {
    if (_broken) {
        return *_broken;
    }
    const auto deadline = clock::now() + _opts.call_timeout;
    if (auto err = write_out(deadline)) {
        return *err;
    }
    for (;;) {
        for (auto it = _replies.begin(); it != _replies.end(); ++it) {
            // id 0: an error with "id": null answers the oldest pending one.
            if (it->first == id || it->first == 0) {
                json obj = std::move(it->second);
                _replies.erase(it);
                return reply_from_object(obj);
            }
        }
        while (auto line = take_line()) {
            if (auto err = route(*line)) {
                return *err;
            }
        }
        if (std::any_of(_replies.begin(), _replies.end(),
                        [id](const auto& r) { return r.first == id || r.first == 0; })) {
            continue;
        }
        if (auto err = fill(deadline)) {
            return *err;
        }
    }
}

reply connection::call(std::string_view method, const json& params) {
    if (_broken) {
        return *_broken;
    }
    return wait_reply(send_request(method, params));
}

std::variant<std::optional<json>, call_error> connection::next_notification(
    std::chrono::milliseconds timeout) {
    std::optional<clock::time_point> deadline;
    if (timeout.count() >= 0) {
        deadline = clock::now() + timeout;
    }
    for (;;) {
        if (!_notes.empty()) {
            json n = std::move(_notes.front());
            _notes.pop_front();
            if (n.value("method", std::string()) == "events.event" && n.contains("params")) {
                return std::optional<json>(std::move(n["params"]));
            }
            return std::optional<json>(std::move(n));
        }
        if (_broken) {
            return *_broken;
        }
        bool routed = false;
        while (auto line = take_line()) {
            routed = true;
            if (auto err = route(*line)) {
                return *err;
            }
        }
        if (routed) {
            continue;
        }
        if (auto err = fill(deadline)) {
            if (err->reason == local_reason::timeout) {
                return std::optional<json>();
            }
            return *err;
        }
    }
}

std::variant<std::string, call_error> connection::raw_line(std::string_view line) {
    if (_broken) {
        return *_broken;
    }
    const auto deadline = clock::now() + _opts.call_timeout;
    _out.append(line);
    _out += '\n';
    if (auto err = write_out(deadline)) {
        return *err;
    }
    for (;;) {
        while (auto l = take_line()) {
            json obj = json::parse(*l, nullptr, false);
            if (obj.is_object() && !obj.contains("id") && obj.contains("method")) {
                _notes.push_back(std::move(obj));
                continue;
            }
            return std::move(*l);
        }
        if (auto err = fill(deadline)) {
            return *err;
        }
    }
}

}  // namespace qrt::client
