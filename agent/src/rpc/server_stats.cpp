// The control socket's metrics, and their node_exporter textfile.
#include "qrt/rpc/server.hpp"

#include <string>

#include "qrt/log.hpp"
#include "server_internal.hpp"

namespace qrt::rpc {

void server::export_textfile() {
    if (!_metrics_source || _opts.metrics_textfile.empty()) {
        return;
    }
    auto text = _metrics_source();
    if (!text) {
        log::warn("rpc", "metrics textfile: {}", text.err().message);
        return;
    }
    if (auto st = telemetry::write_textfile_atomically(_opts.metrics_textfile, *text); !st) {
        log::warn("rpc", "metrics textfile: {}", st.err().message);
    }
}

telemetry::snapshot server::stats() const {
    telemetry::snapshot s;
    std::size_t live = 0;
    std::size_t unauthenticated = 0;
    std::size_t subscribers = 0;
    std::size_t buffered = 0;
    for (const auto& [id, c] : _conns) {
        if (c->st == connection::state::dead) {
            continue;
        }
        live += c->in_main_pool() ? 1U : 0U;
        unauthenticated += c->unauthenticated() ? 1U : 0U;
        subscribers += c->sess.subscribed ? 1U : 0U;
        buffered += c->out_pending() + c->in.buffered();
    }
    s.add_gauge("qrt_rpc_connections",
                "open control-socket connections (network ones once authenticated)", {},
                static_cast<double>(live));
    s.add_gauge("qrt_rpc_unauthenticated_connections",
                "network connections not yet authenticated (their own pool, rpc.max_unauthenticated)", {},
                static_cast<double>(unauthenticated));
    s.add_gauge("qrt_rpc_connections_max", "connection cap", {},
                static_cast<double>(_opts.max_connections));
    s.add_gauge("qrt_rpc_subscribers", "connections subscribed to events", {},
                static_cast<double>(subscribers));
    s.add_gauge("qrt_rpc_buffered_bytes", "bytes buffered for all connections", {},
                static_cast<double>(buffered));
    s.add_counter("qrt_rpc_connections_accepted_total", "connections accepted", {}, _accepted);
    s.add_counter("qrt_rpc_connections_rejected_total", "connections refused at the cap",
                  {{"cause", "cap"}}, _rejected_cap);
    s.add_counter("qrt_rpc_connections_rejected_total", "connections refused at the cap",
                  {{"cause", "per_uid"}}, _rejected_per_uid);
    s.add_counter("qrt_rpc_connections_rejected_total", "connections refused at the cap",
                  {{"cause", "reserved"}}, _rejected_reserved);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "line_too_long"}}, _closed_line_too_long);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "idle_timeout"}}, _closed_idle);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "slow_reader"}}, _closed_slow_reader);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "peercred"}}, _peercred_failures);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "nss_timeout"}}, _closed_nss_timeout);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "nss_queue_full"}}, _closed_nss_queue_full);
    s.add_counter("qrt_rpc_connections_closed_total", "connections closed by the server",
                  {{"cause", "nss_error"}}, _closed_nss_error);
    s.add_counter("qrt_rpc_nss_waits_total",
                  "connections that waited for a user lookup (NSS) off the event loop", {}, _nss_waits);
    s.add_gauge("qrt_rpc_nss_pending", "user lookups (NSS) queued or under way", {},
                static_cast<double>(_resolver ? _resolver->pending() : 0U));
    s.add_counter("qrt_rpc_connections_rejected_total", "connections refused at the cap",
                  {{"cause", "per_host"}}, _rejected_per_host);
    s.add_counter("qrt_rpc_connections_rejected_total", "connections refused at the cap",
                  {{"cause", "unauthenticated"}}, _rejected_unauthenticated);
    s.add_counter("qrt_rpc_connections_rejected_total", "connections refused at the cap",
                  {{"cause", "unauthenticated_per_host"}}, _rejected_unauthenticated_per_host);
    s.add_counter("qrt_rpc_remote_connections_accepted_total",
                  "connections accepted on the network listener (rpc.listen)", {}, _accepted_remote);
    s.add_counter("qrt_rpc_remote_authenticated_total",
                  "network connections whose MUNGE credential was accepted", {}, _authenticated);
    for (const auto cause : {auth_cause::expired, auth_cause::rewound, auth_cause::replayed,
                             auth_cause::invalid, auth_cause::malformed, auth_cause::nonce_mismatch,
                             auth_cause::auth_required, auth_cause::auth_timeout,
                             auth_cause::munge_unavailable}) {
        const auto it = _auth_refused.find(cause);
        s.add_counter("qrt_rpc_remote_auth_refused_total",
                      "network connections refused before being served, by data.cause",
                      {{"cause", std::string(cause)}}, it == _auth_refused.end() ? 0U : it->second);
    }
    s.add_counter("qrt_rpc_received_bytes_total", "bytes read from clients", {}, _bytes_in);
    s.add_counter("qrt_rpc_sent_bytes_total", "bytes written to clients", {}, _bytes_out);
    s.add_counter("qrt_rpc_backpressure_pauses_total",
                  "times reading a connection stopped for unsent replies or requests in flight",
                  {}, _backpressure_pauses);
    s.add_counter("qrt_rpc_replies_held_for_commit_total",
                  "reply lines held until the change they acknowledge was durable", {},
                  _held_replies);
    s.add_counter("qrt_rpc_commit_failed_replies_total",
                  "held reply lines answered with store_error because their commit failed", {},
                  _failed_commit_replies);
    return s;
}

}  // namespace qrt::rpc
