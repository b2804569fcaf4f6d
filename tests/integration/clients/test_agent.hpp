#pragma once
// The agent's socket side assembled from the real parts (event loop, rpc
// engine and server, agent and timeline methods, ledger with a SQLite
// store), without the host partitioning and dispatchers of `qrtd run`, so
// client tests and bench/rpc can run it unprivileged, in a temp dir, in a
// second or two.  Used by qrt-test-server (a process for qrtctl, the C
// example and the Python client) and in-process by bench/rpc.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qrt/event_loop.hpp"
#include "qrt/rpc/auth.hpp"
#include "qrt/rpc/engine.hpp"
#include "qrt/rpc/methods.hpp"
#include "qrt/rpc/server.hpp"
#include "qrt/rpc/tenant_limits.hpp"
#include "qrt/rpc/timeline_methods.hpp"
#include "qrt/timeline/ledger.hpp"

namespace qrt::testing {

struct test_agent_options {
    std::string socket_path;
    std::string store_path;  // empty: in-memory ledger
    // qpu0 (and every name but the pushed ones) gets periodic calibration:
    // a 1 s cycle with a 10 ms blackout.  Pushed QPUs start with no window.
    std::vector<std::string> periodic_qpus{"qpu0"};
    std::vector<std::string> pushed_qpus{"qpu1"};
    std::string policy = "edf-backfill";
    // [roles] principals ("uid:0", "user:nobody", "group:qrt", ...).
    rpc::role_map roles;
    // agent.status's health member ("ok", "degraded", ...).
    std::string health = "ok";
    std::vector<std::string> health_reasons;
    unsigned socket_mode = 0666;
    std::size_t max_connections = 256;
    // The network listener ("tcp://127.0.0.1:0": an ephemeral port; empty:
    // none) and the munged that checks its credentials.
    std::string listen;
    std::string munge_socket;
    // [tenants]: quotas and the request rate charged for every line, as
    // `qrtd run` installs them (nullopt: none, everything admitted).
    std::optional<rpc::tenant_policy> tenants;
};

class test_agent {
public:
    // Builds everything and binds the socket; throws std::runtime_error
    // naming the failing step.
    explicit test_agent(test_agent_options opts);
    ~test_agent();
    test_agent(const test_agent&) = delete;
    test_agent& operator=(const test_agent&) = delete;

    event_loop& loop() noexcept { return _loop; }
    rpc::engine& engine() noexcept { return *_engine; }
    timeline::ledger& ledger() noexcept { return *_ledger; }
    const test_agent_options& options() const noexcept { return _opts; }
    // The network listener's port (0: none).
    std::uint16_t tcp_port() const noexcept { return _server ? _server->tcp_port() : 0; }

    // Reserve n slots of duration_ns on qpu (tenant "prefill"), for benches
    // at a realistic ledger size.  Returns how many were placed.
    std::size_t prefill(std::size_t n, std::int64_t duration_ns, const std::string& qpu);

private:
    test_agent_options _opts;
    event_loop _loop;
    std::unique_ptr<timeline::ledger> _ledger;
    std::unique_ptr<rpc::engine> _engine;
    rpc::agent_hooks _hooks;
    std::unique_ptr<rpc::authorizer> _auth;
    std::unique_ptr<rpc::server> _server;
};

}  // namespace qrt::testing
