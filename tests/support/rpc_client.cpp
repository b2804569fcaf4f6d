#include "qrt_test/rpc_client.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace qrt::testing {

namespace {

sockaddr_un address_of(const std::string& path) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    return a;
}

}  // namespace

rpc_client::rpc_client(const std::string& path, std::chrono::milliseconds timeout) {
    _fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const sockaddr_un a = address_of(path);
    if (::connect(_fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
        _connect_errno = errno;
        ::close(_fd);
        _fd = -1;
        return;
    }
    set_timeout(timeout);
}

rpc_client::~rpc_client() {
    if (_fd >= 0) {
        ::close(_fd);
    }
}

void rpc_client::set_timeout(std::chrono::milliseconds t) {
    timeval tv{static_cast<time_t>(t.count() / 1000), static_cast<suseconds_t>((t.count() % 1000) * 1000)};
    ::setsockopt(_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

bool rpc_client::send_raw(std::string_view bytes) {
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::send(_fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return false;
        }
        done += static_cast<std::size_t>(n);
    }
    return true;
}

std::optional<std::string> rpc_client::read_line() {
    while (true) {
        const auto nl = _buf.find('\n');
        if (nl != std::string::npos) {
            std::string line = _buf.substr(0, nl);
            _buf.erase(0, nl + 1);
            return line;
        }
        char tmp[65536];
        const ssize_t n = ::recv(_fd, tmp, sizeof tmp, 0);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) {
                continue;
            }
            _last_errno = n == 0 ? 0 : errno;
            return std::nullopt;
        }
        _buf.append(tmp, static_cast<std::size_t>(n));
    }
}

std::optional<rpc_client::json> rpc_client::read_json() {
    auto l = read_line();
    if (!l) {
        return std::nullopt;
    }
    return json::parse(*l);
}

rpc_client::json rpc_client::call(const std::string& method, json params) {
    const std::uint64_t id = ++_next_id;
    json req{{"jsonrpc", "2.0"}, {"method", method}, {"id", id}};
    if (!params.is_null()) {
        req["params"] = std::move(params);
    }
    EXPECT_TRUE(send_raw(req.dump() + "\n")) << method;
    // Skip notifications that arrive before the reply.
    while (true) {
        auto r = read_json();
        if (!r) {
            ADD_FAILURE() << method << ": no reply (errno " << _last_errno << ")";
            return json{{"error", {{"data", {{"reason", "no_reply"}}}}}};
        }
        if (r->contains("method")) {
            _notifications.push_back(*r);
            continue;
        }
        EXPECT_EQ(r->at("id"), id) << r->dump();
        return *r;
    }
}

rpc_client::json rpc_client::ok(const std::string& method, json params) {
    json r = call(method, std::move(params));
    EXPECT_TRUE(r.contains("result")) << method << " -> " << r.dump();
    return r.contains("result") ? r.at("result") : json();
}

std::string reason_of(const nlohmann::json& reply) {
    const auto e = reply.find("error");
    if (e == reply.end()) {
        return "";
    }
    const auto d = e->find("data");
    if (d == e->end()) {
        return "";
    }
    const auto r = d->find("reason");
    return r != d->end() && r->is_string() ? r->get<std::string>() : std::string();
}

unix_socket_file::unix_socket_file(std::string path, int backlog) : _path(std::move(path)) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        throw std::runtime_error("socket(AF_UNIX): " + std::string(std::strerror(errno)));
    }
    const sockaddr_un a = address_of(_path);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
        const int err = errno;
        ::close(fd);
        throw std::runtime_error("bind " + _path + ": " + std::strerror(err));
    }
    if (backlog == not_listening) {
        ::close(fd);  // the file stays, nobody listens
        return;
    }
    if (::listen(fd, backlog) != 0) {
        const int err = errno;
        ::close(fd);
        throw std::runtime_error("listen " + _path + ": " + std::strerror(err));
    }
    _fd = fd;
}

unix_socket_file::~unix_socket_file() {
    if (_fd >= 0) {
        ::close(_fd);
    }
    ::unlink(_path.c_str());
}

}  // namespace qrt::testing
