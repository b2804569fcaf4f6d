#include "qrt/rpc/methods.hpp"

#include <algorithm>
#include <array>
#include <memory>

#include <fmt/format.h>

#include "qrt/proto/protocol.hpp"
#include "qrt/version.hpp"

namespace qrt::rpc {

// The event types a subscriber may name: the protocol's table, in its order.
const std::vector<std::string_view>& event_types() {
    static const std::vector<std::string_view> types = [] {
        std::vector<std::string_view> out;
        out.reserve(proto::events.size());
        for (const auto& e : proto::events) {
            out.push_back(e.name);
        }
        return out;
    }();
    return types;
}

telemetry::snapshot full_snapshot(const engine& e, const agent_hooks& hooks) {
    telemetry::snapshot s = e.stats();
    if (hooks.transport) {
        s.merge(hooks.transport());
    }
    if (hooks.telemetry) {
        s.merge(hooks.telemetry());
    }
    if (hooks.annotate) {
        hooks.annotate(s);
    }
    return s;
}

rtcore::result<std::string> metrics_text(const engine& e, const agent_hooks& hooks) {
    return telemetry::to_prometheus(full_snapshot(e, hooks));
}

void register_agent_methods(engine& e, const agent_hooks& hooks) {
    engine* eng = &e;
    const agent_hooks* h = &hooks;

    // agent.hello's result is constant but for the caller's roles and
    // identity: serialise everything but "peer" once per role set (and again
    // only when methods are added), then append the caller's peer object.
    // nlohmann sorts members and "peer" sorts last, so the bytes are exactly
    // those of serialising the whole result.
    struct hello_cache {
        std::size_t methods_seen = 0;
        std::array<std::string, 256> head_by_roles;  // by role_set::bits()
    };
    auto cache = std::make_shared<hello_cache>();
    const auto hello_head = [eng, cache](const role_set roles) -> const std::string& {
        const auto& all = eng->methods().methods();
        if (cache->methods_seen != all.size()) {
            for (auto& slot : cache->head_by_roles) {
                slot.clear();
            }
            cache->methods_seen = all.size();
        }
        std::string& head = cache->head_by_roles[roles.bits()];
        if (!head.empty()) {
            return head;
        }
        json caps = json::array();
        json allowed = json::array();
        json methods = json::array();
        for (const auto& m : all) {
            caps.push_back(m.name);
            const bool ok = roles.allows(m.required);
            if (ok) {
                allowed.push_back(m.name);
            }
            methods.push_back({{"name", m.name},
                               {"role", role_name(m.required)},
                               {"allowed", ok},
                               {"summary", m.summary}});
        }
        const auto& lim = eng->limits();
        const json body{
            {"api_version", qrt::api_version},
            {"agent", "qrtd"},
            {"agent_version", std::string(qrt::version())},
            {"capabilities", std::move(caps)},
            {"allowed", std::move(allowed)},
            {"methods", std::move(methods)},
            {"limits",
             {{"max_line_bytes", lim.max_line_bytes},
              {"max_batch", lim.max_batch},
              {"max_depth", lim.max_depth}}},
            {"event_types", event_types()},
        };
        dump_to(head, body);
        head.pop_back();  // the closing '}': the peer member follows
        head += R"(,"peer":)";
        return head;
    };

    e.methods().add({"agent.hello", role::none,
                     "api version, agent version, the methods and the caller's roles", {}},
                    [hello_head](const json& params, call_context& ctx, std::string& out) {
                        params_reader p(params, {"client", "api_version"});
                        (void)p.opt_str("client");
                        (void)p.opt_i64("api_version", 0, 1'000'000);
                        out += hello_head(ctx.caller.roles);
                        // The peer object, members in nlohmann's sorted order.
                        const auto& peer = ctx.caller.peer;
                        out += R"({"gid":)";
                        append_json_value(out, peer.gid);
                        out += R"(,"pid":)";
                        append_json_value(out, peer.pid);
                        out += R"(,"roles":[)";
                        bool first = true;
                        for (const auto& name : ctx.caller.roles.names()) {
                            if (!first) {
                                out += ',';
                            }
                            first = false;
                            append_json_string(out, name);
                        }
                        out += R"(],"tenant":)";
                        append_json_string(out, ctx.caller.tenant);
                        out += R"(,"uid":)";
                        append_json_value(out, peer.uid);
                        out += "}}";
                    });

    e.methods().add({"agent.status", role::reader,
                     "partition, IRQs, kernel, probes, QPUs and health",
                     [h](const json& params, call_context&) {
                         params_reader p(params, {});
                         if (!h->status) {
                             throw rpc_failure("unavailable",
                                               "agent.status: no status provider is installed");
                         }
                         return h->status();
                     }});

    e.methods().add({"telemetry.snapshot", role::reader,
                     "histograms, counters and gauges as JSON",
                     [eng, h](const json& params, call_context&) {
                         params_reader p(params, {"prefix"});
                         const auto prefix = p.opt_str("prefix");
                         telemetry::snapshot s = full_snapshot(*eng, *h);
                         if (prefix) {
                             const auto keep = [&](const auto& m) {
                                 return m.name.rfind(*prefix, 0) == 0;
                             };
                             std::erase_if(s.counters, [&](const auto& m) { return !keep(m); });
                             std::erase_if(s.gauges, [&](const auto& m) { return !keep(m); });
                             std::erase_if(s.histograms, [&](const auto& m) { return !keep(m); });
                         }
                         return telemetry::to_json(s);
                     }});

    e.methods().add({"metrics", role::reader, "Prometheus text exposition (format 0.0.4)",
                     [eng, h](const json& params, call_context&) {
                         params_reader p(params, {});
                         auto text = metrics_text(*eng, *h);
                         if (!text) {
                             throw rpc_failure("internal_error",
                                               "metrics: " + text.err().message);
                         }
                         return json{{"content_type", "text/plain; version=0.0.4; charset=utf-8"},
                                     {"text", std::move(*text)}};
                     }});

    e.methods().add({"telemetry.outliers", role::reader,
                     "the last dispatch wakeups over the outlier threshold, with their causes",
                     [h](const json& params, call_context&) {
                         params_reader p(params, {"limit"});
                         const auto limit = p.opt_i64("limit", 1, 10'000).value_or(64);
                         if (!h->outliers) {
                             throw rpc_failure("unavailable",
                                               "telemetry.outliers: the outlier probe is not loaded "
                                               "(see agent.status probes)");
                         }
                         return h->outliers(static_cast<std::size_t>(limit));
                     }});

    e.methods().add({"events.subscribe", role::reader,
                     "push events.event notifications on this connection",
                     [h](const json& params, call_context& ctx) {
                         params_reader p(params, {"topics", "delegated"});
                         // A delegate (tenants.delegates) may also take the
                         // events of the tenants it books for, DELEGATE/NAME:
                         // the DRA driver relays a claim's job.finished.
                         const bool delegated = p.opt_bool("delegated").value_or(false);
                         if (delegated && !(h->may_delegate && h->may_delegate(ctx.caller))) {
                             throw rpc_failure(
                                 "permission_denied",
                                 fmt::format("delegated events need the caller in tenants.delegates; "
                                             "uid {} ({}) is not",
                                             ctx.caller.peer.uid, ctx.caller.tenant),
                                 json{{"field", "delegated"}});
                         }
                         std::vector<std::string> topics;
                         if (p.has("topics")) {
                             topics = p.str_array("topics", event_types().size(), 64);
                             for (const auto& t : topics) {
                                 const auto& known = event_types();
                                 if (std::find(known.begin(), known.end(), t) == known.end()) {
                                     throw invalid_params(
                                         "topics", fmt::format("unknown event type '{}' (known: {})",
                                                               t, fmt::join(known, ", ")));
                                 }
                             }
                         }
                         ctx.caller.subscribed = true;
                         ctx.caller.delegated_events = delegated;
                         ctx.caller.topics = topics;
                         json shown = json::array();
                         if (topics.empty()) {
                             for (const auto t : event_types()) {
                                 shown.push_back(t);
                             }
                         } else {
                             shown = topics;
                         }
                         return json{{"subscribed", true},
                                     {"topics", std::move(shown)},
                                     {"next_seq", ctx.caller.event_seq + 1},
                                     {"scope", ctx.caller.roles.holds(role::admin) ? "all tenants"
                                               : delegated ? "own tenant and its delegated tenants"
                                                           : "own tenant"}};
                     }});

    e.methods().add({"events.unsubscribe", role::reader, "stop event notifications",
                     [](const json& params, call_context& ctx) {
                         params_reader p(params, {});
                         const bool was = ctx.caller.subscribed;
                         ctx.caller.subscribed = false;
                         ctx.caller.delegated_events = false;
                         ctx.caller.topics.clear();
                         return json{{"subscribed", false}, {"was_subscribed", was}};
                     }});
}

}  // namespace qrt::rpc
