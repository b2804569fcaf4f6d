#include "test_agent.hpp"
#include "rtcore/clock.hpp"

#include <time.h>

#include <stdexcept>

#include <fmt/format.h>

namespace qrt::testing {

namespace {

}  // namespace

test_agent::test_agent(test_agent_options opts) : _opts(std::move(opts)) {
    std::vector<timeline::qpu_spec> qpus;
    for (const auto& name : _opts.periodic_qpus) {
        timeline::periodic_calibration pc;
        pc.period_ns = 1'000'000'000;
        pc.blackout_ns = 10'000'000;
        pc.f0 = 0.99;
        pc.tau_ns = 3'600'000'000'000;
        qpus.push_back({name, pc});
    }
    for (const auto& name : _opts.pushed_qpus) {
        qpus.push_back({name, timeline::pushed_calibration{}});
    }
    timeline::ledger_options lo;
    lo.policy = _opts.policy;
    // A week of periodic windows would be 600k windows: an hour is plenty.
    lo.horizon_ns = 3'600'000'000'000;
    auto l = timeline::ledger::open(std::move(qpus), lo, _opts.store_path, rtcore::realtime_now_ns());
    if (!l) {
        throw std::runtime_error("ledger::open: " + l.err().message);
    }
    _ledger = std::move(*l);

    _engine = std::make_unique<rpc::engine>();
    const std::string health = _opts.health;
    const std::vector<std::string> reasons = _opts.health_reasons;
    timeline::ledger* ledger = _ledger.get();
    _hooks.status = [health, reasons, ledger] {
        rpc::json names = rpc::json::array();
        for (const auto& q : ledger->qpu_names()) {
            names.push_back(q);
        }
        const auto st = ledger->stats();
        return rpc::json{{"health", {{"status", health}, {"reasons", reasons}}},
                         {"qpus", names},
                         {"partition", {{"applied", false}, {"why", "test agent: no partition"}}},
                         {"ledger", {{"reservations", st.reservations}, {"active", st.active}}}};
    };
    rpc::register_agent_methods(*_engine, _hooks);
    rpc::timeline_options to;
    if (_opts.tenants) {
        auto t = rpc::tenant_limits::compile(*_opts.tenants);
        if (!t) {
            throw std::runtime_error("tenant_limits::compile: " + t.err().message);
        }
        auto limits = std::make_shared<rpc::tenant_limits>(std::move(*t));
        to.limits = limits;
        // As services.cpp does: every line charged on the monotonic clock.
        _engine->set_admission([limits](rpc::session& s, std::uint64_t requests) {
            limits->admit(s, rtcore::monotonic_now_ns(), requests);
        });
    }
    rpc::register_timeline_methods(*_engine, *_ledger, to);

    auto auth = rpc::authorizer::compile(_opts.roles);
    if (!auth) {
        throw std::runtime_error("authorizer::compile: " + auth.err().message);
    }
    _auth = std::make_unique<rpc::authorizer>(std::move(*auth));

    rpc::server_options so;
    so.socket_path = _opts.socket_path;
    so.socket_activation = false;
    so.socket_mode = _opts.socket_mode;
    so.max_connections = _opts.max_connections;
    so.listen = _opts.listen;
    so.munge_socket = _opts.munge_socket;
    _server = std::make_unique<rpc::server>(_loop, *_engine, *_auth, so);
    rpc::server* srv = _server.get();
    _hooks.transport = [srv] { return srv->stats(); };
    if (auto st = _server->start(); !st) {
        throw std::runtime_error("server::start on " + _opts.socket_path + ": " + st.err().message);
    }
    auto hk = rpc::install_housekeeping(_loop, *_engine, *_ledger, std::chrono::milliseconds(200));
    if (!hk) {
        throw std::runtime_error("install_housekeeping: " + hk.err().message);
    }
}

test_agent::~test_agent() {
    if (_server) {
        _server->stop();
    }
}

std::size_t test_agent::prefill(std::size_t n, std::int64_t duration_ns, const std::string& qpu) {
    timeline::request req;
    req.duration_ns = duration_ns;
    req.qpus = {qpu};
    std::size_t placed = 0;
    const std::int64_t now = rtcore::realtime_now_ns();
    for (std::size_t i = 0; i < n; ++i) {
        auto r = _ledger->reserve("prefill", req, fmt::format("prefill-{}", i),
                                  3'000'000'000'000, now);
        if (!r) {
            break;
        }
        ++placed;
    }
    (void)_ledger->drain_events();
    return placed;
}

}  // namespace qrt::testing
