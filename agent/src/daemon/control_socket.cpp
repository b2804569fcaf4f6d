// The control socket: its settings from [rpc] (services.hpp), shared by
// `qrtd run`'s bind while still root (daemon.cpp, step 7) and
// services::start_server, which starts it last of the services: the
// engine with the agent's and the ledger's methods, the tenants' limits,
// the roles, the server.

#include "services.hpp"
#include "services_internal.hpp"

#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "qrt/log.hpp"
#include "qrt/rpc/auth.hpp"
#include "qrt/rpc/timeline_methods.hpp"
#include "rtcore/capabilities.hpp"

namespace qrt {

bool services_detail::group_exists(const std::string& name) {
    group gr{};
    group* found = nullptr;
    std::vector<char> buf(16384);
    return ::getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found) == 0 && found != nullptr;
}

namespace {

using json = nlohmann::json;
using services_detail::group_exists;

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

rtcore::status services::start_server() {
    _engine = std::make_unique<rpc::engine>(rpc::engine_limits{
        _cfg.rpc.max_line_bytes > 0 ? _cfg.rpc.max_line_bytes : (1U << 20), 64, 256,
        _cfg.tenants.request_bytes > 0 ? _cfg.tenants.request_bytes : 16384U});
    _hooks.status = [this] { return status_json(); };
    _hooks.telemetry = [this] { return telemetry_snapshot(); };
    _hooks.annotate = [this](telemetry::snapshot& s) {
        if (_recent) {
            _recent->annotate(s, _clock.now_monotonic_ns());
        }
    };
#ifdef QRT_HAVE_BPF
    if (_probes && _probes->outliers) {
        _hooks.outliers = [this](std::size_t limit) {
            std::uint64_t dropped = 0;
            if (auto* op = _probes->set.outliers()) {
                dropped = op->dropped().value_or(0);
            }
            return _probes->outliers->to_json(limit, dropped);
        };
    }
#endif
    rpc::register_agent_methods(*_engine, _hooks);
    rpc::timeline_options to;
    to.now_ns = [this] { return _clock.now_realtime_ns(); };
    to.qpu_details = [this](std::string_view name) {
        std::optional<qpu_device> device;
        for (const auto& qc : _cfg.qpus) {
            if (qc.name == name) {
                device = qc.device;
            }
        }
        for (const auto& q : _qpus) {
            if (q->name == name) {
                return json{{"device", device_to_json(device)},
                            {"endpoint", q->endpoint},
                            {"endpoint_up", q->link->endpoint_up()},
                            {"dispatch_cpu", q->dispatch_cpu},
                            {"calibration_id", _room ? _room->counts(q->index).calibration_id : 0},
                            {"min_lead_ns", _handover.min_lead_ns}};
            }
        }
        return json::object();
    };
    if (_cfg.dispatch.max_payload_bytes > 0) {
        to.max_payload_bytes = _cfg.dispatch.max_payload_bytes;
    }
    // [tenants]: priority ceilings and quotas, checked by the methods; the
    // request rate, checked before any handler runs.
    rpc::tenant_policy tp;
    tp.scheduler_max_priority = _cfg.tenants.scheduler_max_priority;
    tp.admin_max_priority = _cfg.tenants.admin_max_priority;
    for (const auto& c : _cfg.tenants.priority_ceilings) {
        tp.priority_ceilings.emplace_back(c.who.text, c.max_priority);
    }
    tp.max_reservations = _cfg.tenants.max_reservations;
    tp.max_booked_ns = _cfg.tenants.max_booked_ns;
    if (_cfg.tenants.near_term_ns > 0) {
        tp.near_term_ns = _cfg.tenants.near_term_ns;
        tp.max_near_term_ns = _cfg.tenants.max_near_term_ns;
    }
    tp.max_payload_bytes = static_cast<std::uint64_t>(_cfg.tenants.max_payload_bytes);
    tp.max_requests_per_s = _cfg.tenants.max_requests_per_s;
    tp.request_burst = _cfg.tenants.request_burst;
    tp.delegated_max_priority = _cfg.tenants.delegated_max_priority;
    for (const auto& d : _cfg.tenants.delegates) {
        tp.delegates.push_back(d.text);
    }
    tp.max_delegated_tenants = _cfg.tenants.max_delegated_tenants;
    tp.request_bytes = static_cast<std::uint32_t>(_engine->limits().request_bytes);
    auto limits = rpc::tenant_limits::compile(tp);
    if (!limits) {
        return rtcore::error{limits.err().code, limits.err().message};
    }
    auto shared_limits = std::make_shared<rpc::tenant_limits>(std::move(*limits));
    to.limits = shared_limits;
    _hooks.may_delegate = [shared_limits](const rpc::session& s) {
        return shared_limits->may_delegate(s);
    };
    // A calibration change re-reads the windows the links' guards follow.
    to.on_calibration = [this](std::string_view qpu) {
        if (_room) {
            _room->on_calibration(qpu);
        }
    };
    _engine->set_admission([shared_limits, this](rpc::session& s, std::uint64_t requests) {
        shared_limits->admit(s, _clock.now_monotonic_ns(), requests);
    });
    rpc::register_timeline_methods(*_engine, *_ledger, to);

    // A group that does not exist on this host grants nothing (a fresh host
    // has no `qrt` group until the package's sysusers.d runs): it is left
    // out with a warning instead of keeping the agent from starting.
    rpc::role_map rm;
    const auto copy = [](const char* role, const std::vector<principal>& from, std::vector<std::string>& out) {
        for (const auto& p : from) {
            if (p.type == principal::kind::group && !group_exists(p.name)) {
                log::warn("rpc", "roles.{}: group '{}' does not exist on this host: it grants nothing",
                          role, p.name);
                continue;
            }
            out.push_back(p.text);
        }
    };
    copy("reader", _cfg.roles.reader, rm.reader);
    copy("scheduler", _cfg.roles.scheduler, rm.scheduler);
    copy("calibration", _cfg.roles.calibration, rm.calibration);
    copy("admin", _cfg.roles.admin, rm.admin);
    auto auth = rpc::authorizer::compile(rm);
    if (!auth) {
        return rtcore::error{auth.err().code, "roles: " + auth.err().message};
    }
    _auth = std::make_unique<rpc::authorizer>(std::move(*auth));

    rpc::server_options so = control_socket_options(_cfg, _prebound.fd < 0);
    so.prebound = std::exchange(_prebound, rpc::prebound_socket{});
    if (so.prebound.fd < 0) {
        // The socket's directory (/run/qrtd under systemd's RuntimeDirectory=;
        // created here for `qrtd run` by hand).
        if (const auto dir = std::filesystem::path(so.socket_path).parent_path(); !dir.empty()) {
            std::error_code ec;
            if (std::filesystem::create_directories(dir, ec); ec) {
                return rtcore::error{ec.value(), fmt::format("rpc: create_directories {}: {}", dir.string(),
                                                             ec.message())};
            }
        }
    }
    _server = std::make_unique<rpc::server>(_loop, *_engine, *_auth, so);
    rpc::server* srv = _server.get();
    _hooks.transport = [srv] { return srv->stats(); };
    if (!so.metrics_textfile.empty()) {
        rpc::engine* eng = _engine.get();
        _server->set_metrics_source([eng, this] { return rpc::metrics_text(*eng, _hooks); });
    }
    if (auto st = _server->start(); !st) {
        return rtcore::error{st.err().code, "rpc: " + st.err().message};
    }
    log::info("rpc", "listening on {} ({})", so.socket_path, _server->listen_source());
    // Recovery's changes (missed, expired) reach subscribers from now on.
    publish_ledger_events();
    // The first checkpoint of the recent windows: they count from here.
    telemetry_tick();
    return rtcore::ok();
}

}  // namespace qrt
