// The syntax checks of the option table's rows.  See config_checks.hpp.

#include "config_checks.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "qrt/config.hpp"
#include "rtcore/knob_catalogue.hpp"

namespace qrt::config_checks {

std::optional<std::string> check_absolute_path(std::string_view text) {
    if (text.empty() || text.front() != '/') {
        return std::string("must be an absolute path");
    }
    return std::nullopt;
}

std::optional<std::string> check_optional_absolute_path(std::string_view text) {
    if (text.empty()) {
        return std::nullopt;
    }
    return check_absolute_path(text);
}

std::optional<std::string> check_socket_path(std::string_view text) {
    if (auto bad = check_absolute_path(text)) {
        return bad;
    }
    if (text.size() >= 108) {
        return fmt::format("is {} bytes, longer than the 107 that fit in sun_path", text.size());
    }
    return std::nullopt;
}

// rpc.listen: "" or tcp://ADDR:PORT with a literal IPv4 or [IPv6] address.
std::optional<std::string> check_tcp_listen(std::string_view text) {
    if (text.empty()) {
        return std::nullopt;
    }
    constexpr std::string_view scheme = "tcp://";
    const std::string_view usage = "; expected tcp://ADDR:PORT, e.g. tcp://10.0.0.5:7470 or tcp://[::]:7470";
    if (text.substr(0, scheme.size()) != scheme) {
        return fmt::format("does not start with tcp://{}", usage);
    }
    std::string_view rest = text.substr(scheme.size());
    std::string host;
    std::string_view port;
    int family = AF_INET;
    if (!rest.empty() && rest.front() == '[') {
        const auto close = rest.find(']');
        if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
            return fmt::format("has an IPv6 address without its brackets and :PORT{}", usage);
        }
        host = std::string(rest.substr(1, close - 1));
        port = rest.substr(close + 2);
        family = AF_INET6;
    } else {
        const auto colon = rest.rfind(':');
        if (colon == std::string_view::npos) {
            return fmt::format("has no :PORT{}", usage);
        }
        host = std::string(rest.substr(0, colon));
        port = rest.substr(colon + 1);
    }
    in6_addr buf{};
    if (::inet_pton(family, host.c_str(), &buf) != 1) {
        return fmt::format("'{}' is not an {} address (names are not resolved){}", host,
                           family == AF_INET ? "IPv4" : "IPv6", usage);
    }
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos ||
        std::stoul(std::string(port)) == 0 || std::stoul(std::string(port)) > 65535) {
        return fmt::format("PORT '{}' is not a number in 1..65535{}", port, usage);
    }
    return std::nullopt;
}

std::optional<std::string> check_tcp_alias(std::string_view text) {
    if (text.empty()) {
        return std::string("is empty; expected tcp://ADDR:PORT, e.g. tcp://192.0.2.7:30470");
    }
    return check_tcp_listen(text);
}

std::optional<std::string> check_group_name(std::string_view text) {
    if (!parse_principal(fmt::format("group:{}", text))) {
        return std::string("is not a valid group name");
    }
    return std::nullopt;
}

std::optional<std::string> check_optional_group_name(std::string_view text) {
    if (text.empty()) {
        return std::nullopt;
    }
    return check_group_name(text);
}

std::optional<std::string> check_user_name(std::string_view text) {
    if (!parse_principal(fmt::format("user:{}", text))) {
        return std::string("is not a valid user name");
    }
    return std::nullopt;
}

std::optional<std::string> check_octal_mode(std::string_view text) {
    if (text.size() < 3 || text.size() > 4 ||
        !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '7'; })) {
        return std::string("must be an octal permission mode such as \"0660\"");
    }
    if (std::stoul(std::string(text), nullptr, 8) > 0777) {
        return std::string("must not set setuid, setgid or sticky bits (at most 0777)");
    }
    return std::nullopt;
}

std::optional<std::string> check_principal(std::string_view text) {
    if (!parse_principal(text)) {
        return std::string("is not user:NAME, group:NAME, uid:N or gid:N");
    }
    return std::nullopt;
}

std::optional<std::string> check_priority_ceiling(std::string_view text) {
    if (auto c = parse_priority_ceiling(text); !c) {
        return c.err().message;
    }
    return std::nullopt;
}

std::optional<std::string> check_endpoint(std::string_view text) {
    auto ep = parse_endpoint(text);
    if (!ep) {
        return "is not a valid endpoint: " + ep.err().message;
    }
    return std::nullopt;
}

// "0000:3b:00.0" or "3b:00.0": [domain:]bus:device.function in hex.
bool looks_like_pci_id(std::string_view text) {
    auto hex = [](std::string_view s, std::size_t n) {
        return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) {
                   return std::isxdigit(static_cast<unsigned char>(c)) != 0;
               });
    };
    if (text.size() == 12) {
        if (text[4] != ':' || !hex(text.substr(0, 4), 4)) {
            return false;
        }
        text = text.substr(5);
    }
    return text.size() == 7 && text[2] == ':' && text[5] == '.' && hex(text.substr(0, 2), 2) &&
           hex(text.substr(3, 2), 2) && hex(text.substr(6, 1), 1);
}

std::optional<std::string> check_device_name(std::string_view text) {
    if (text.empty() || looks_like_pci_id(text)) {
        return std::nullopt;
    }
    // A network interface name: IFNAMSIZ-1 bytes, no '/', no white space.
    const bool ok = text.size() < 16 && std::none_of(text.begin(), text.end(), [](char c) {
        return c == '/' || c == ':' || std::isspace(static_cast<unsigned char>(c)) != 0;
    });
    if (!ok) {
        return std::string("must be a PCI bus id (0000:3b:00.0) or a network interface name");
    }
    return std::nullopt;
}

std::optional<std::string> check_runtime_knob(std::string_view text) {
    rtcore::knob_options o;
    if (rtcore::enable_knob(o, text)) {
        return std::nullopt;
    }
    std::string names;
    for (auto n : rtcore::knob_names) {
        names += (names.empty() ? "" : ", ") + std::string(n);
    }
    return "must be one of " + names;
}

std::optional<std::string> check_qpu_name(std::string_view text) {
    const bool ok = !text.empty() && text.size() <= 32 &&
                    std::all_of(text.begin(), text.end(), [](char c) {
                        return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' ||
                               c == '-' || c == '.';
                    });
    if (!ok) {
        return std::string("must be 1..32 characters of [A-Za-z0-9_.-]");
    }
    return std::nullopt;
}

}  // namespace qrt::config_checks
