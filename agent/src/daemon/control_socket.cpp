// The control socket's settings from [rpc] (services.hpp), shared by
// `qrtd run`'s bind while still root (daemon.cpp, step 7) and
// services::start_server.

#include "services.hpp"
#include "services_internal.hpp"

#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "qrt/log.hpp"
#include "rtcore/capabilities.hpp"

namespace qrt {

bool services_detail::group_exists(const std::string& name) {
    group gr{};
    group* found = nullptr;
    std::vector<char> buf(16384);
    return ::getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found) == 0 && found != nullptr;
}

namespace {

// The name of group gid, or its number.
std::string group_name(gid_t gid) {
    group gr{};
    group* found = nullptr;
    std::vector<char> buf(16384);
    if (::getgrgid_r(gid, &gr, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
        return gr.gr_name;
    }
    return std::to_string(gid);
}

// May this process give a file it owns to group gid?  With CAP_CHOWN, or
// when gid is its effective group or one of its supplementary groups
// (chown(2)).
bool may_give_to_group(gid_t gid) {
    if (rtcore::has_capability(CAP_CHOWN) || ::getegid() == gid) {
        return true;
    }
    const int n = ::getgroups(0, nullptr);
    if (n <= 0) {
        return false;
    }
    std::vector<gid_t> groups(static_cast<std::size_t>(n));
    const int got = ::getgroups(n, groups.data());
    return got > 0 && std::find(groups.begin(), groups.begin() + got, gid) != groups.begin() + got;
}

// The group the socket is given, or "" to leave it the daemon's:
// rpc.socket_group = "" says so; a group this host does not have, or one
// this process cannot give a file to (not root, not a member: `qrtd run` by
// an ordinary user with the shipped default "qrt"), is left alone too, with
// a warning (when warn) that names which it is.  Under systemd, or started
// as root, the socket is bound while the process holds CAP_CHOWN.
std::string socket_group_to_give(const std::string& wanted, bool warn) {
    if (wanted.empty()) {
        return {};
    }
    group gr{};
    group* found = nullptr;
    std::vector<char> buf(16384);
    if (::getgrnam_r(wanted.c_str(), &gr, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
        if (warn) {
            log::warn("rpc", "rpc.socket_group '{}' does not exist on this host: the socket keeps the daemon's "
                             "group ({})",
                      wanted, group_name(::getegid()));
        }
        return {};
    }
    if (!may_give_to_group(gr.gr_gid)) {
        if (warn) {
            log::warn("rpc", "rpc.socket_group '{}': this process (uid {}) is not a member of it and lacks "
                             "CAP_CHOWN, so it cannot give the socket to it; the socket keeps the group {}.  Set "
                             "rpc.socket_group = \"\" to leave the group alone, or start qrtd as root",
                      wanted, ::geteuid(), group_name(::getegid()));
        }
        return {};
    }
    return wanted;
}

}  // namespace

rpc::server_options control_socket_options(const config& cfg, bool warn) {
    rpc::server_options so;
    if (!cfg.rpc.socket_path.empty()) {
        so.socket_path = cfg.rpc.socket_path;
    }
    so.socket_group = socket_group_to_give(cfg.rpc.socket_group, warn);
    if (cfg.rpc.socket_mode != 0) {
        so.socket_mode = cfg.rpc.socket_mode;
    }
    if (cfg.rpc.max_connections > 0) {
        so.max_connections = cfg.rpc.max_connections;
    }
    if (cfg.rpc.max_connections_per_uid > 0) {
        so.max_connections_per_uid = cfg.rpc.max_connections_per_uid;
    }
    so.reserved_connections = cfg.rpc.reserved_connections;
    if (cfg.rpc.max_inflight > 0) {
        so.max_inflight = cfg.rpc.max_inflight;
    }
    so.idle_timeout = cfg.rpc.idle_timeout_s > 0
                          ? std::chrono::milliseconds(std::chrono::seconds(cfg.rpc.idle_timeout_s))
                          : std::chrono::milliseconds(std::chrono::hours(24 * 365));
    if (cfg.rpc.max_line_bytes > 0) {
        so.max_line_bytes = cfg.rpc.max_line_bytes;
    }
    if (cfg.rpc.nss_timeout_ms > 0) {
        so.nss_timeout = std::chrono::milliseconds(cfg.rpc.nss_timeout_ms);
    }
    so.metrics_textfile = cfg.rpc.metrics_textfile;
    so.listen = cfg.rpc.listen;
    so.listen_aliases = cfg.rpc.listen_aliases;
    if (cfg.rpc.max_connections_per_host > 0) {
        so.max_connections_per_host = cfg.rpc.max_connections_per_host;
    }
    if (cfg.rpc.max_unauthenticated > 0) {
        so.max_unauthenticated = cfg.rpc.max_unauthenticated;
    }
    if (cfg.rpc.max_unauthenticated_per_host > 0) {
        so.max_unauthenticated_per_host = cfg.rpc.max_unauthenticated_per_host;
    }
    if (cfg.rpc.auth_silent_timeout_ms > 0) {
        so.auth_silent_timeout = std::chrono::milliseconds(cfg.rpc.auth_silent_timeout_ms);
    }
    if (cfg.rpc.auth_timeout_ms > 0) {
        so.auth_timeout = std::chrono::milliseconds(cfg.rpc.auth_timeout_ms);
    }
    so.munge_socket = cfg.rpc.munge_socket;
    return so;
}

}  // namespace qrt
