// Parsers for the config values that have a syntax of their own: QPU
// endpoints and role principals.  Pure functions, no host access.

#include <arpa/inet.h>

#include <charconv>
#include <string>

#include "qrt/config.hpp"

namespace qrt {
namespace {

bool parse_u64(std::string_view text, std::uint64_t& out) {
    if (text.empty()) {
        return false;
    }
    const char* end = text.data() + text.size();
    auto [p, ec] = std::from_chars(text.data(), end, out, 10);
    return ec == std::errc{} && p == end;
}

bool valid_account_name(std::string_view name) {
    // The portable set useradd accepts: [a-z_][a-z0-9_-]*[$]?, at most 32.
    if (name.empty() || name.size() > 32) {
        return false;
    }
    for (std::size_t i = 0; i < name.size(); ++i) {
        const char c = name[i];
        const bool lower = c >= 'a' && c <= 'z';
        const bool digit = c >= '0' && c <= '9';
        if (i == 0 && !(lower || c == '_')) {
            return false;
        }
        if (i + 1 == name.size() && c == '$') {
            continue;
        }
        if (!(lower || digit || c == '_' || c == '-' || c == '.')) {
            return false;
        }
    }
    return true;
}

}  // namespace

rtcore::result<endpoint> parse_endpoint(std::string_view uri) {
    endpoint ep;
    ep.uri = std::string(uri);
    constexpr std::string_view unix_scheme = "unix://";
    constexpr std::string_view tcp_scheme = "tcp://";
    constexpr std::string_view file_scheme = "file://";
    if (uri.substr(0, unix_scheme.size()) == unix_scheme) {
        ep.type = endpoint::kind::unix_socket;
        ep.path = std::string(uri.substr(unix_scheme.size()));
        if (ep.path.empty() || ep.path.front() != '/') {
            return rtcore::error::invalid("unix:// needs an absolute path (unix:///run/qpu0.sock)");
        }
        if (ep.path.size() >= 108) {
            return rtcore::error::invalid("unix socket path is " + std::to_string(ep.path.size()) +
                                          " bytes, longer than the 107 that fit in sun_path");
        }
        return ep;
    }
    if (uri.substr(0, file_scheme.size()) == file_scheme) {
        ep.type = endpoint::kind::device_file;
        ep.path = std::string(uri.substr(file_scheme.size()));
        if (ep.path.size() <= 5 || ep.path.substr(0, 5) != "/dev/") {
            return rtcore::error::invalid("file:// must name a device under /dev (file:///dev/qpu0)");
        }
        if (ep.path.find("/../") != std::string::npos || ep.path.ends_with("/..")) {
            return rtcore::error::invalid("file:// path must not contain \"..\"");
        }
        return ep;
    }
    if (uri.substr(0, tcp_scheme.size()) == tcp_scheme) {
        ep.type = endpoint::kind::tcp;
        std::string_view rest = uri.substr(tcp_scheme.size());
        std::string_view host;
        std::string_view port;
        bool v6 = false;
        if (!rest.empty() && rest.front() == '[') {
            const auto close = rest.find(']');
            if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
                return rtcore::error::invalid("tcp:// IPv6 address must be written [addr]:port");
            }
            host = rest.substr(1, close - 1);
            port = rest.substr(close + 2);
            v6 = true;
        } else {
            const auto colon = rest.rfind(':');
            if (colon == std::string_view::npos) {
                return rtcore::error::invalid("tcp:// needs address:port (tcp://127.0.0.1:9000)");
            }
            host = rest.substr(0, colon);
            port = rest.substr(colon + 1);
        }
        unsigned char buf[16];
        const std::string host_str(host);
        if (inet_pton(v6 ? AF_INET6 : AF_INET, host_str.c_str(), buf) != 1) {
            return rtcore::error::invalid("tcp:// address \"" + host_str +
                                          "\" is not an IP address literal (host names are not "
                                          "resolved: the dispatch path does no DNS)");
        }
        std::uint64_t port_num = 0;
        if (!parse_u64(port, port_num) || port_num < 1 || port_num > 65535) {
            return rtcore::error::invalid("tcp:// port \"" + std::string(port) +
                                          "\" is not in 1..65535");
        }
        ep.host = host_str;
        ep.port = static_cast<std::uint16_t>(port_num);
        return ep;
    }
    return rtcore::error::invalid("scheme must be unix://, tcp:// or file://");
}

rtcore::result<principal> parse_principal(std::string_view text) {
    principal p;
    p.text = std::string(text);
    const auto colon = text.find(':');
    if (colon == std::string_view::npos) {
        return rtcore::error::invalid("must be user:NAME, group:NAME, uid:N or gid:N");
    }
    const std::string_view kind = text.substr(0, colon);
    const std::string_view rest = text.substr(colon + 1);
    if (kind == "user" || kind == "group") {
        if (!valid_account_name(rest)) {
            return rtcore::error::invalid("\"" + std::string(rest) + "\" is not a valid " +
                                          std::string(kind) + " name");
        }
        p.type = kind == "user" ? principal::kind::user : principal::kind::group;
        p.name = std::string(rest);
        return p;
    }
    if (kind == "uid" || kind == "gid") {
        std::uint64_t id = 0;
        if (!parse_u64(rest, id) || id >= 0xffffffffULL) {
            return rtcore::error::invalid("\"" + std::string(rest) + "\" is not a numeric " +
                                          std::string(kind));
        }
        p.type = kind == "uid" ? principal::kind::uid : principal::kind::gid;
        p.id = static_cast<std::uint32_t>(id);
        return p;
    }
    return rtcore::error::invalid("must be user:NAME, group:NAME, uid:N or gid:N");
}

}  // namespace qrt

namespace qrt {

rtcore::result<priority_ceiling> parse_priority_ceiling(std::string_view text) {
    const auto eq = text.rfind('=');
    if (eq == std::string_view::npos) {
        return rtcore::error::invalid("must be PRINCIPAL=N, e.g. \"user:alice=50\"");
    }
    auto who = parse_principal(text.substr(0, eq));
    if (!who) {
        return rtcore::error::invalid(who.err().message);
    }
    const std::string_view num = text.substr(eq + 1);
    std::int32_t n = 0;
    const auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), n);
    if (num.empty() || ec != std::errc{} || ptr != num.data() + num.size()) {
        return rtcore::error::invalid("\"" + std::string(num) +
                                      "\" is not a priority (a decimal 32-bit integer)");
    }
    priority_ceiling c;
    c.who = std::move(*who);
    c.max_priority = n;
    c.text = std::string(text);
    return c;
}

}  // namespace qrt
