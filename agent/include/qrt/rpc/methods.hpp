#pragma once
// The agent-level methods that need no ledger:
//
//   agent.hello         (no role)   api_version, agent_version, capabilities
//                                   (every method), allowed (the caller's),
//                                   the caller's identity and roles, limits
//   agent.status        reader      the daemon's status provider (partition,
//                                   IRQs, kernel, probes, QPUs, health)
//   telemetry.snapshot  reader      histograms/counters/gauges as JSON
//   metrics             reader      the same snapshot, Prometheus text
//   telemetry.outliers  reader      the last outliers of probe 3 with their
//                                   causes; params {limit?}
//   events.subscribe    reader      start pushing events.event notifications
//                                   on this connection; params {topics?}
//   events.unsubscribe  reader      stop them
//
// The hooks are read at call time, so the daemon may install them after
// registering; the hooks object must outlive the engine.

#include <cstddef>
#include <functional>
#include <string_view>
#include <vector>

#include "qrt/rpc/engine.hpp"
#include "qrt/telemetry.hpp"

namespace qrt::rpc {

struct agent_hooks {
    // agent.status body; unset: agent.status fails with `unavailable`.
    std::function<json()> status;
    // Daemon-side metrics (dispatcher, probes, ledger), merged into
    // telemetry.snapshot and metrics.
    std::function<telemetry::snapshot()> telemetry;
    // Transport metrics (server::stats).
    std::function<telemetry::snapshot()> transport;
    // Adds the recent windows to every histogram of the full snapshot
    // (telemetry::recent_windows::annotate); unset: lifetime only.
    std::function<void(telemetry::snapshot&)> annotate;
    // telemetry.outliers body for at most `limit` outliers; unset: the
    // method fails with `unavailable` (no outlier probe).
    std::function<json(std::size_t limit)> outliers;
    // Whether the peer is in tenants.delegates (events.subscribe's
    // delegated); unset: nobody is.
    std::function<bool(const session&)> may_delegate;
};

// The event types events.subscribe accepts in `topics`.
const std::vector<std::string_view>& event_types();

void register_agent_methods(engine& e, const agent_hooks& hooks);

// The engine's, the transport's and the daemon's metrics in one snapshot.
telemetry::snapshot full_snapshot(const engine& e, const agent_hooks& hooks);
// ... rendered as Prometheus text (also used for the textfile export).
rtcore::result<std::string> metrics_text(const engine& e, const agent_hooks& hooks);

}  // namespace qrt::rpc
