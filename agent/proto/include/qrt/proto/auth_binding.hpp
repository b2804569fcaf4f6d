#pragma once
// What a MUNGE credential of the network listener signs (qrtd(8), NETWORK
// LISTENER), header-only so that the server and libqrt-client share it:
//
//     <auth::payload_version> <nonce> <address>     (protocol.toml [auth])
//
// <nonce> is the one of the server's auth.challenge; <address> is the
// listener the client's socket is connected to, as the client sees it
// (getpeername), written by tcp_address_text: "tcp://10.0.0.5:7470",
// "tcp://[fd00::5]:7470" (an IPv4-mapped IPv6 address as IPv4).  The server
// accepts it only when <address> is one of its own names for the
// connection: the local address the connection came in on (getsockname),
// or an rpc.listen_aliases entry.  So a credential made for a listener the
// client was steered to (a relay, a squatted port, a wrong QRT_SOCKET)
// opens no other qrtd of the realm, although the relay passes it the real
// qrtd's challenge.  The Python client (tools/clients/python/src/qrt_client/__init__.py) writes
// the same text.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "qrt/proto/table.hpp"
#include "rtcore/error.hpp"

namespace qrt::proto {

// "tcp://ADDR:PORT" of an AF_INET or AF_INET6 address; "" for another family.
inline std::string tcp_address_text(const sockaddr* sa) {
    char buf[INET6_ADDRSTRLEN] = {};
    std::uint16_t port = 0;
    bool v6 = false;
    if (sa->sa_family == AF_INET) {
        sockaddr_in in{};
        std::memcpy(&in, sa, sizeof in);
        ::inet_ntop(AF_INET, &in.sin_addr, buf, sizeof buf);
        port = ntohs(in.sin_port);
    } else if (sa->sa_family == AF_INET6) {
        sockaddr_in6 in6{};
        std::memcpy(&in6, sa, sizeof in6);
        port = ntohs(in6.sin6_port);
        if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
            ::inet_ntop(AF_INET, reinterpret_cast<const unsigned char*>(&in6.sin6_addr) + 12, buf, sizeof buf);
        } else {
            ::inet_ntop(AF_INET6, &in6.sin6_addr, buf, sizeof buf);
            v6 = true;
        }
    } else {
        return {};
    }
    std::string out = "tcp://";
    out += v6 ? "[" : "";
    out += buf;
    out += v6 ? "]:" : ":";
    out += std::to_string(port);
    return out;
}

// A literal "tcp://ADDR:PORT" (ADDR an IPv4 address or a bracketed IPv6
// one, PORT 0..65535; names are not resolved) as a socket address, or why it
// is not one: the network listener's rpc.listen and the addresses a
// credential is compared with.
struct tcp_sockaddr {
    sockaddr_storage ss{};
    socklen_t len = 0;
};
inline rtcore::result<tcp_sockaddr> parse_tcp_address(std::string_view text) {
    constexpr std::string_view scheme = "tcp://";
    if (text.substr(0, scheme.size()) != scheme) {
        return rtcore::error::invalid("it does not start with tcp://");
    }
    std::string_view rest = text.substr(scheme.size());
    std::string host;
    std::string_view port;
    if (!rest.empty() && rest.front() == '[') {
        const auto close = rest.find(']');
        if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
            return rtcore::error::invalid("an IPv6 address goes in brackets, followed by :PORT");
        }
        host = std::string(rest.substr(1, close - 1));
        port = rest.substr(close + 2);
    } else {
        const auto colon = rest.rfind(':');
        if (colon == std::string_view::npos) {
            return rtcore::error::invalid("no :PORT");
        }
        host = std::string(rest.substr(0, colon));
        port = rest.substr(colon + 1);
    }
    unsigned long p = 0;
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos ||
        (p = std::stoul(std::string(port))) > 65535) {
        return rtcore::error::invalid("PORT is not a number in 0..65535");
    }
    tcp_sockaddr out;
    auto* v4 = reinterpret_cast<sockaddr_in*>(&out.ss);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&out.ss);
    if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(static_cast<std::uint16_t>(p));
        out.len = sizeof(sockaddr_in);
        return out;
    }
    if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(static_cast<std::uint16_t>(p));
        out.len = sizeof(sockaddr_in6);
        return out;
    }
    return rtcore::error::invalid("'" + host + "' is not an IPv4 or IPv6 address (names are not resolved)");
}

// The tcp_address_text of "tcp://ADDR:PORT" with a literal ADDR (nullopt
// when it is not one): how a configured or signed address is compared.
inline std::optional<std::string> canonical_tcp_address(std::string_view text) {
    const auto a = parse_tcp_address(text);
    if (!a) {
        return std::nullopt;
    }
    return tcp_address_text(reinterpret_cast<const sockaddr*>(&a->ss));
}

// The payload a client signs for the challenge `nonce` on a connection to
// `address` (tcp_address_text of its peer).
inline std::string auth_payload(std::string_view nonce, std::string_view address) {
    std::string p(auth::payload_version);
    p += ' ';
    p.append(nonce);
    p += ' ';
    p.append(address);
    return p;
}

}  // namespace qrt::proto
