#include "jitter_report/agent_source.hpp"

#include <time.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <map>
#include <tuple>
#include <variant>

#include <fmt/format.h>

#include "connection.hpp"
#include "jitter_report/slo.hpp"
#include "rtcore/clock.hpp"

namespace qrt::jitter {

using nlohmann::json;

namespace {

constexpr std::size_t max_reply_bytes = 64U << 20;

rtcore::error connect_error(const int e, const std::string& path) {
    switch (e) {
        case ENOENT:
            return rtcore::error{e, fmt::format("agent: no socket at {} (is qrtd running? "
                                                "--standalone measures without the agent)",
                                                path)};
        case ECONNREFUSED:
            return rtcore::error{e, fmt::format("agent: stale socket {}: nobody is listening "
                                                "(qrtd stopped or crashed)",
                                                path)};
        case EACCES:
        case EPERM:
            return rtcore::error{e, fmt::format("agent: connect {}: permission denied (join "
                                                "group qrt, or run as root)",
                                                path)};
        default:
            return rtcore::error::from_errno(e, "agent: connect " + path);
    }
}

// One histogram name of the agent and what this report calls it.
struct metric_entry {
    const char* name;
    const char* metric;
    bool primary;
};

// Wire version 2 (two-phase QPUs) adds the arm and start figures: ARM ->
// ARMED at the host, the endpoint's arm cost (label stage: "total" or the
// stage; series "arm_cost" and "arm_cost_<stage>"), and the start at the
// endpoint after T.  Their FIRE lateness is dispatch_lateness.
constexpr std::array<metric_entry, 7> metric_table{{
    {"qrt_dispatch_lateness_seconds", "dispatch_lateness", true},
    {"qrt_dispatch_wakeup_latency_seconds", "timer_wakeup", false},
    {"qrt_dispatch_arrival_lateness_seconds", "arrival_lateness", false},
    {"qrt_dispatch_arm_seconds", "arm_to_armed", false},
    {"qrt_dispatch_arm_cost_seconds", "arm_cost", false},
    {"qrt_dispatch_start_lateness_seconds", "start_lateness", false},
    {"qrt_probe_wakeup_latency_seconds", "probe_wakeup", false},
}};

// A label value, "" when absent or not a string.
std::string label(const json& m, const char* key) {
    const auto l = m.find("labels");
    if (l == m.end() || !l->is_object()) {
        return {};
    }
    const auto v = l->find(key);
    return v != l->end() && v->is_string() ? v->get<std::string>() : std::string();
}

rtcore::result<int> cpu_label(const json& m, const std::string& what) {
    const std::string c = label(m, "cpu");
    if (c.empty()) {
        return -1;
    }
    int v = 0;
    for (const char ch : c) {
        if (ch < '0' || ch > '9' || v > 100'000) {
            return rtcore::error::invalid(
                fmt::format("agent: {}: label cpu=\"{}\" is not a CPU number", what, c));
        }
        v = v * 10 + (ch - '0');
    }
    return v;
}

template <typename T>
T number_or(const json& m, const char* key, T fallback) {
    const auto it = m.find(key);
    if (it == m.end() || !it->is_number()) {
        return fallback;
    }
    return it->get<T>();
}

// The summary fields of one of the agent's histograms (or of one of its
// recent windows); a missing or non-numeric field reads as 0.
rtcore::histogram_summary summary_or_zero(const json& h) {
    rtcore::histogram_summary s;
    rtcore::for_each_summary_field(s, [&](const char* key, auto& v) {
        v = number_or<std::remove_reference_t<decltype(v)>>(h, key, 0);
    });
    return s;
}

// "1m" -> 60, "1h" -> 3600, "30s" -> 30, "1d" -> 86400; an unknown form
// sorts last.
double window_length_s(const std::string& w) {
    std::size_t i = 0;
    double n = 0.0;
    while (i < w.size() && w[i] >= '0' && w[i] <= '9') {
        n = n * 10.0 + (w[i] - '0');
        ++i;
    }
    if (i == 0 || i + 1 != w.size()) {
        return 1e300;
    }
    switch (w[i]) {
        case 's': return n;
        case 'm': return n * 60.0;
        case 'h': return n * 3600.0;
        case 'd': return n * 86400.0;
        default: return 1e300;
    }
}

rtcore::result<series> series_of(const json& h, const metric_entry& e) {
    series s;
    s.metric = e.metric;
    if (const std::string stage = label(h, "stage"); !stage.empty() && stage != "total") {
        s.metric += "_" + stage;
    }
    s.primary = e.primary;
    auto cpu = cpu_label(h, e.name);
    if (!cpu) {
        return std::move(cpu).err();
    }
    s.cpu = *cpu;
    const std::string qpu = label(h, "qpu");
    if (!qpu.empty()) {
        s.scope = "qpu";
        s.name = qpu;
    } else if (s.cpu >= 0) {
        s.scope = "cpu";
        s.name = fmt::format("cpu{}", s.cpu);
    } else {
        s.scope = "host";
        s.name = "all";
    }
    auto& st = s.stats;
    st = {summary_or_zero(h), number_or<std::uint64_t>(h, "negative_count", 0)};
    std::vector<bin> cumulative;
    if (const auto b = h.find("buckets"); b != h.end() && b->is_array()) {
        for (const auto& step : *b) {
            if (step.is_object()) {
                cumulative.push_back(
                    {number_or<std::int64_t>(step, "le_ns", 0), number_or<std::uint64_t>(step, "count", 0)});
            }
        }
    }
    s.bins = bins_from_cumulative(cumulative, st.count, st.max_ns);
    // The agent's recent windows ({"1m": {...}, "1h": {...}}), shortest first.
    if (const auto rec = h.find("recent"); rec != h.end() && rec->is_object()) {
        for (const auto& [window, w] : rec->items()) {
            if (!w.is_object()) {
                continue;
            }
            window_stats ws;
            ws.window = window;
            ws.span_ns = number_or<std::int64_t>(w, "span_ns", 0);
            ws.stats = {summary_or_zero(w), 0};
            s.recent.push_back(std::move(ws));
        }
        // By the window's length ("1m" before "1h"), not by span_ns: a young
        // agent's windows all span its uptime.
        std::stable_sort(s.recent.begin(), s.recent.end(), [](const window_stats& a, const window_stats& b) {
            return window_length_s(a.window) < window_length_s(b.window);
        });
    }
    return s;
}

// Intrusion counters and gauges keyed by (cpu, kind, source).
void collect_intrusions(const json& snapshot, report& r) {
    std::map<std::tuple<int, std::string, std::string>, intrusion_row> rows;
    const auto visit = [&](const json& list) {
        if (!list.is_array()) {
            return;
        }
        for (const auto& m : list) {
            if (!m.is_object() || !m.contains("name") || !m["name"].is_string()) {
                continue;
            }
            const std::string name = m["name"].get<std::string>();
            const bool count = name == "qrt_probe_intrusions_total";
            const bool total = name == "qrt_probe_intrusion_seconds_total";
            const bool max = name == "qrt_probe_intrusion_max_seconds";
            if (!count && !total && !max) {
                continue;
            }
            auto cpu = cpu_label(m, name);
            if (!cpu || *cpu < 0) {
                continue;
            }
            const std::string kind = label(m, "kind");
            const std::string source = label(m, "source");
            auto& row = rows[{*cpu, kind, source}];
            row.cpu = static_cast<unsigned>(*cpu);
            row.kind = kind;
            row.source = source;
            const double v = number_or<double>(m, "value", 0.0);
            if (count) {
                row.count = number_or<std::uint64_t>(m, "value", 0);
            } else if (total) {
                row.total_ns = static_cast<std::uint64_t>(v * 1e9);
            } else {
                row.max_ns = static_cast<std::uint64_t>(v * 1e9);
            }
        }
    };
    if (snapshot.contains("counters")) {
        visit(snapshot["counters"]);
    }
    if (snapshot.contains("gauges")) {
        visit(snapshot["gauges"]);
    }
    for (auto& [key, row] : rows) {
        r.intrusions.push_back(std::move(row));
    }
    std::stable_sort(r.intrusions.begin(), r.intrusions.end(), [](const auto& a, const auto& b) {
        return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.count > b.count;
    });
}

}  // namespace

void add_agent_outliers(const json& outliers, report& r) {
    if (!outliers.is_object()) {
        return;
    }
    const auto list = outliers.find("outliers");
    if (list == outliers.end() || !list->is_array()) {
        return;
    }
    for (const auto& o : *list) {
        if (!o.is_object()) {
            continue;
        }
        outlier_row row;
        row.cpu = number_or<unsigned>(o, "cpu", 0);
        row.tid = number_or<std::uint32_t>(o, "tid", 0);
        row.latency_ns = number_or<std::uint64_t>(o, "latency_ns", 0);
        row.at_ns = number_or<std::int64_t>(o, "at_ns", 0);
        if (const auto q = o.find("qpu"); q != o.end() && q->is_string()) {
            row.qpu = q->get<std::string>();
        }
        if (const auto c = o.find("cause"); c != o.end() && c->is_object()) {
            if (const auto src = c->find("source"); src != c->end() && src->is_string()) {
                row.main_cause = src->get<std::string>();
            }
        }
        if (const auto sm = o.find("summary"); sm != o.end() && sm->is_string()) {
            row.summary = sm->get<std::string>();
        }
        // The same switch twice (an agent before it ignored repeats) is one
        // outlier.
        const bool repeat = std::any_of(r.outliers.begin(), r.outliers.end(), [&](const outlier_row& x) {
            return x.cpu == row.cpu && x.tid == row.tid && x.at_ns == row.at_ns && x.latency_ns == row.latency_ns;
        });
        if (!repeat) {
            r.outliers.push_back(std::move(row));
        }
    }
    std::stable_sort(r.outliers.begin(), r.outliers.end(),
                     [](const outlier_row& a, const outlier_row& b) { return a.latency_ns > b.latency_ns; });
    const auto total = number_or<std::uint64_t>(outliers, "total", 0);
    const auto threshold = number_or<std::uint64_t>(outliers, "threshold_ns", 0);
    r.notes.push_back(fmt::format("outliers: {} over {} since the agent started; the last {} are shown "
                                  "by latency",
                                  total, format_ns(static_cast<double>(threshold)), list->size()));
}

rtcore::result<json> agent_call(const agent_options& opt, const std::string& method, const json& params) {
    // libqrt-client's C++ connection (the one qrtctl uses): connect bounded
    // by the timeout, notifications skipped, replies matched by id.
    client::connect_options copts;
    copts.connect_timeout = opt.timeout;
    copts.call_timeout = opt.timeout;
    copts.max_line_bytes = max_reply_bytes;
    auto opened = client::connection::open(opt.socket_path, copts);
    if (auto* e = std::get_if<client::call_error>(&opened)) {
        if (e->reason == client::local_reason::client_error) {
            return rtcore::error::invalid("agent: " + e->message);  // the path is unusable
        }
        return connect_error(e->sys_errno, opt.socket_path);
    }
    auto& conn = std::get<0>(opened);
    auto reply = conn->call(method, params);
    if (reply) {
        return std::move(reply).result();
    }
    const client::call_error& e = reply.error();
    if (!e.is_local()) {
        return rtcore::error::invalid(fmt::format("agent: {} failed: {} ({})", method, e.message, e.reason));
    }
    if (e.reason == client::local_reason::timeout) {
        return rtcore::error{ETIMEDOUT, fmt::format("agent: {} did not answer {} within {} ms "
                                                    "(agent hung or overloaded)",
                                                    opt.socket_path, method, opt.timeout.count())};
    }
    if (e.reason == client::local_reason::disconnected && e.sys_errno == ECONNRESET) {
        return rtcore::error{ECONNRESET, fmt::format("agent: {} closed the connection before "
                                                     "answering {}",
                                                     opt.socket_path, method)};
    }
    return rtcore::error{e.sys_errno, fmt::format("agent: {}: {}", method, e.message)};
}

rtcore::result<report> report_from_snapshot(const json& snapshot, const json& status,
                                            const agent_options& opt, std::int64_t now_ns) {
    if (!snapshot.is_object() || !snapshot.contains("taken_ns") || !snapshot["taken_ns"].is_number_integer()) {
        return rtcore::error::invalid("agent: telemetry.snapshot has no integer taken_ns");
    }
    const auto taken_ns = snapshot["taken_ns"].get<std::int64_t>();
    const std::int64_t max_age_ns = static_cast<std::int64_t>(opt.max_age.count()) * 1'000'000'000;
    if (now_ns - taken_ns > max_age_ns) {
        return rtcore::error::invalid(fmt::format(
            "agent: telemetry snapshot is stale: taken {:.0f} s ago (limit {} s; agent stuck?)",
            static_cast<double>(now_ns - taken_ns) / 1e9, opt.max_age.count()));
    }
    if (taken_ns - now_ns > max_age_ns) {
        return rtcore::error::invalid(fmt::format(
            "agent: telemetry snapshot is {:.0f} s in the future: the clocks disagree",
            static_cast<double>(taken_ns - now_ns) / 1e9));
    }
    report r;
    r.run.mode = "agent";
    r.run.taken_ns = taken_ns;
    r.run.socket = opt.socket_path;
    if (snapshot.contains("histograms") && snapshot["histograms"].is_array()) {
        for (const auto& h : snapshot["histograms"]) {
            if (!h.is_object() || !h.contains("name") || !h["name"].is_string()) {
                continue;
            }
            const std::string name = h["name"].get<std::string>();
            for (const auto& e : metric_table) {
                if (name != e.name) {
                    continue;
                }
                auto s = series_of(h, e);
                if (!s) {
                    return std::move(s).err();
                }
                r.series_list.push_back(std::move(*s));
            }
        }
    }
    collect_intrusions(snapshot, r);
    // --cpus filters; a CPU the agent does not report is an error.
    if (!opt.cpus.empty()) {
        rtcore::cpu_set known;
        for (const auto& s : r.series_list) {
            if (s.cpu >= 0) {
                known.set(static_cast<unsigned>(s.cpu));
            }
        }
        for (const auto c : opt.cpus.cpus()) {
            if (!known.test(c)) {
                return rtcore::error::invalid(fmt::format(
                    "--cpus: unknown CPU {}: the agent reports {}", c,
                    known.empty() ? std::string("no per-CPU series") : "CPUs " + known.to_list()));
            }
        }
        std::erase_if(r.series_list, [&](const series& s) { return s.cpu < 0 || !opt.cpus.test(static_cast<unsigned>(s.cpu)); });
        std::erase_if(r.intrusions, [&](const intrusion_row& i) { return !opt.cpus.test(i.cpu); });
    }
    if (r.series_list.empty()) {
        r.notes.push_back("the agent reports no dispatch or wakeup histograms yet (no QPU "
                          "configured, or no job dispatched)");
    }
    // agent.status: probes and version; its absence is only a note.
    if (status.is_object()) {
        if (const auto p = status.find("probes"); p != status.end()) {
            if (p->is_string()) {
                r.probes.status = p->get<std::string>();
            } else if (p->is_object() && p->contains("status") && (*p)["status"].is_string()) {
                r.probes.status = (*p)["status"].get<std::string>();
            }
            r.probes.available = r.probes.status.rfind("available", 0) == 0;
        }
        for (const char* key : {"agent_version", "version"}) {
            if (const auto v = status.find(key); v != status.end() && v->is_string()) {
                r.run.agent_version = v->get<std::string>();
                break;
            }
        }
        // The agent's host, as the agent sees it (the report may run elsewhere).
        if (const auto h = status.find("hostname"); h != status.end() && h->is_string()) {
            r.host.hostname = h->get<std::string>();
        }
        if (const auto k = status.find("kernel"); k != status.end() && k->is_object()) {
            if (const auto rel = k->find("release"); rel != k->end() && rel->is_string()) {
                r.host.kernel = rel->get<std::string>();
            }
            if (const auto pm = k->find("preempt_model"); pm != k->end() && pm->is_string()) {
                r.host.preempt_rt = pm->get<std::string>() == "PREEMPT_RT";
            }
        }
    }
    if (r.probes.status.empty()) {
        r.probes.status = "unknown (agent.status did not say)";
    }
    return r;
}

rtcore::result<report> read_agent(const agent_options& opt) {
    auto snap = agent_call(opt, "telemetry.snapshot");
    if (!snap) {
        return std::move(snap).err();
    }
    json status;
    std::string status_note;
    if (auto st = agent_call(opt, "agent.status")) {
        status = std::move(*st);
    } else {
        status_note = "agent.status: " + st.err().message;
    }
    const std::int64_t now_ns = rtcore::realtime_now_ns();
    auto r = report_from_snapshot(*snap, status, opt, now_ns);
    if (r && !status_note.empty()) {
        r->notes.push_back(status_note);
    }
    if (r) {
        // The recent outliers (probe 3), when the agent has them.
        if (auto o = agent_call(opt, "telemetry.outliers", json{{"limit", 64}})) {
            add_agent_outliers(*o, *r);
            if (!opt.cpus.empty()) {
                std::erase_if(r->outliers, [&](const outlier_row& x) { return !opt.cpus.test(x.cpu); });
            }
        } else {
            r->notes.push_back("outliers: " + o.err().message);
        }
    }
    return r;
}

}  // namespace qrt::jitter
