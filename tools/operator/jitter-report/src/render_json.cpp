#include <fmt/format.h>

#include <optional>
#include <type_traits>

#include "jitter_report/render.hpp"

namespace qrt::jitter {

using nlohmann::json;

namespace {

// The summary fields of a series and of each of its recent windows.
json summary_json(const rtcore::histogram_summary& st) {
    json out = json::object();
    rtcore::for_each_summary_field(st, [&](const char* key, const auto& v) { out[key] = v; });
    return out;
}

json recent_json(const series& s) {
    json out = json::array();
    for (const auto& w : s.recent) {
        json one = summary_json(w.stats);
        one["window"] = w.window;
        one["span_ns"] = w.span_ns;
        out.push_back(std::move(one));
    }
    return out;
}

json stats_json(const series& s) {
    const auto& st = s.stats;
    json bins = json::array();
    for (const auto& b : s.bins) {
        bins.push_back({{"le_ns", b.le_ns}, {"count", b.count}});
    }
    json out = summary_json(st);
    out["scope"] = s.scope;
    out["name"] = s.name;
    out["cpu"] = s.cpu;
    out["metric"] = s.metric;
    out["primary"] = s.primary;
    out["negative_count"] = st.negative_count;
    out["bins"] = std::move(bins);
    out["recent"] = recent_json(s);
    return out;
}

// Typed field access that fails naming the JSON path.
class reader {
public:
    reader(const json& j, std::string path) : _j(j), _path(std::move(path)) {}

    rtcore::result<const json*> field(const char* key, json::value_t type) const {
        if (!_j.is_object()) {
            return rtcore::error::invalid(fmt::format("{}: expected an object", _path));
        }
        const auto it = _j.find(key);
        if (it == _j.end()) {
            return rtcore::error::invalid(fmt::format("{}.{}: missing", _path, key));
        }
        const bool number = type == json::value_t::number_integer ||
                            type == json::value_t::number_float ||
                            type == json::value_t::number_unsigned;
        const bool ok = number ? it->is_number()
                               : (type == json::value_t::boolean ? it->is_boolean()
                                  : type == json::value_t::string ? it->is_string()
                                  : type == json::value_t::array  ? it->is_array()
                                                                  : it->is_object());
        if (!ok || (type == json::value_t::number_integer && !it->is_number_integer()) ||
            (type == json::value_t::number_unsigned && !it->is_number_unsigned() &&
             !(it->is_number_integer() && it->get<std::int64_t>() >= 0))) {
            return rtcore::error::invalid(
                fmt::format("{}.{}: expected {}, found {}", _path, key, name_of(type), it->type_name()));
        }
        return &*it;
    }
    rtcore::result<std::string> str(const char* key) const {
        auto f = field(key, json::value_t::string);
        if (!f) {
            return std::move(f).err();
        }
        return (*f)->get<std::string>();
    }
    rtcore::result<std::int64_t> i64(const char* key) const {
        auto f = field(key, json::value_t::number_integer);
        if (!f) {
            return std::move(f).err();
        }
        return (*f)->get<std::int64_t>();
    }
    rtcore::result<std::uint64_t> u64(const char* key) const {
        auto f = field(key, json::value_t::number_unsigned);
        if (!f) {
            return std::move(f).err();
        }
        return (*f)->get<std::uint64_t>();
    }
    rtcore::result<double> num(const char* key) const {
        auto f = field(key, json::value_t::number_float);
        if (!f) {
            return std::move(f).err();
        }
        return (*f)->get<double>();
    }
    rtcore::result<bool> boolean(const char* key) const {
        auto f = field(key, json::value_t::boolean);
        if (!f) {
            return std::move(f).err();
        }
        return (*f)->get<bool>();
    }
    // u64, i64 or num, by the type wanted.
    template <typename T>
    rtcore::result<T> number(const char* key) const {
        if constexpr (std::is_same_v<T, std::uint64_t>) {
            return u64(key);
        } else if constexpr (std::is_same_v<T, std::int64_t>) {
            return i64(key);
        } else {
            static_assert(std::is_same_v<T, double>);
            return num(key);
        }
    }
    const std::string& path() const { return _path; }

private:
    static const char* name_of(json::value_t t) {
        switch (t) {
            case json::value_t::string: return "a string";
            case json::value_t::boolean: return "a boolean";
            case json::value_t::array: return "an array";
            case json::value_t::object: return "an object";
            case json::value_t::number_integer: return "an integer";
            case json::value_t::number_unsigned: return "a non-negative integer";
            default: return "a number";
        }
    }
    const json& _j;
    std::string _path;
};

#define QRT_TRY(var, expr)                 \
    auto var##_r = (expr);                 \
    if (!var##_r) {                        \
        return std::move(var##_r).err();   \
    }                                      \
    auto var = std::move(*var##_r)

// The summary fields every series and recent window carries, in their one
// order (the first one missing or mistyped is named).
rtcore::result<rtcore::histogram_summary> summary_from_json(const reader& rd) {
    rtcore::histogram_summary s;
    std::optional<rtcore::error> bad;
    rtcore::for_each_summary_field(s, [&](const char* key, auto& v) {
        if (bad) {
            return;
        }
        auto r = rd.number<std::remove_reference_t<decltype(v)>>(key);
        if (!r) {
            bad = std::move(r).err();
            return;
        }
        v = *r;
    });
    if (bad) {
        return std::move(*bad);
    }
    return s;
}

rtcore::result<series> series_from_json(const json& j, const std::string& path) {
    reader rd(j, path);
    series s;
    QRT_TRY(scope, rd.str("scope"));
    QRT_TRY(name, rd.str("name"));
    QRT_TRY(cpu, rd.i64("cpu"));
    QRT_TRY(metric, rd.str("metric"));
    QRT_TRY(primary, rd.boolean("primary"));
    QRT_TRY(summary, summary_from_json(rd));
    QRT_TRY(bins, rd.field("bins", json::value_t::array));
    s.scope = scope;
    s.name = name;
    s.cpu = static_cast<int>(cpu);
    s.metric = metric;
    s.primary = primary;
    s.stats = {summary, 0};
    if (auto neg = rd.u64("negative_count")) {
        s.stats.negative_count = *neg;
    }
    std::size_t i = 0;
    for (const auto& b : *bins) {
        reader br(b, fmt::format("{}.bins[{}]", path, i++));
        QRT_TRY(le, br.i64("le_ns"));
        QRT_TRY(c, br.u64("count"));
        s.bins.push_back({le, c});
    }
    // Optional (added without a schema bump): the agent's recent windows.
    if (const auto rec = j.find("recent"); rec != j.end() && rec->is_array()) {
        std::size_t k = 0;
        for (const auto& w : *rec) {
            reader wr(w, fmt::format("{}.recent[{}]", path, k++));
            QRT_TRY(window, wr.str("window"));
            QRT_TRY(span, wr.i64("span_ns"));
            QRT_TRY(wsummary, summary_from_json(wr));
            s.recent.push_back({window, span, {wsummary, 0}});
        }
    }
    return s;
}

}  // namespace

json to_json(const report& r) {
    json out;
    out["schema"] = schema_name;
    out["schema_version"] = schema_version;
    out["tool_version"] = r.tool_version;
    const auto& run = r.run;
    json jrun{{"mode", run.mode}, {"taken_ns", run.taken_ns}, {"duration_ns", run.duration_ns}};
    if (run.mode == "standalone") {
        jrun["cpus"] = run.cpus;
        jrun["interval_ns"] = run.interval_ns;
        jrun["priority"] = run.priority;
        jrun["policy"] = run.policy;
        jrun["overruns"] = run.overruns;
    } else {
        jrun["socket"] = run.socket;
        jrun["agent_version"] = run.agent_version;
    }
    out["run"] = std::move(jrun);
    out["host"] = {{"hostname", r.host.hostname},
                   {"kernel", r.host.kernel},
                   {"preempt_rt", r.host.preempt_rt},
                   {"steal_percent", r.host.steal_percent >= 0.0 ? json(r.host.steal_percent) : json()}};
    out["probes"] = {{"available", r.probes.available}, {"status", r.probes.status}};
    json series_json = json::array();
    for (const auto& s : r.series_list) {
        series_json.push_back(stats_json(s));
    }
    out["series"] = std::move(series_json);
    json intr = json::array();
    for (const auto& i : r.intrusions) {
        intr.push_back({{"cpu", i.cpu},
                        {"kind", i.kind},
                        {"source", i.source},
                        {"count", i.count},
                        {"total_ns", i.total_ns},
                        {"max_ns", i.max_ns}});
    }
    out["intrusions"] = std::move(intr);
    json outl = json::array();
    for (const auto& o : r.outliers) {
        json one{{"cpu", o.cpu},
                 {"tid", o.tid},
                 {"latency_ns", o.latency_ns},
                 {"main_cause", o.main_cause},
                 {"summary", o.summary}};
        if (o.at_ns > 0) {
            one["at_ns"] = o.at_ns;
        }
        if (!o.qpu.empty()) {
            one["qpu"] = o.qpu;
        }
        outl.push_back(std::move(one));
    }
    out["outliers"] = std::move(outl);
    out["notes"] = r.notes;
    if (r.slo) {
        json checks = json::array();
        for (const auto& c : r.slo->checks) {
            checks.push_back({{"series", c.series},
                              {"metric", c.metric},
                              {"stat", c.stat},
                              {"limit_ns", c.limit_ns},
                              {"measured_ns", c.measured_ns},
                              {"met", c.met}});
        }
        out["slo"] = {{"spec", r.slo->spec}, {"met", r.slo->met}, {"checks", std::move(checks)}};
    } else {
        out["slo"] = nullptr;
    }
    if (r.baseline) {
        const auto& c = *r.baseline;
        json rows = json::array();
        for (const auto& row : c.rows) {
            rows.push_back({{"scope", row.scope},
                            {"name", row.name},
                            {"metric", row.metric},
                            {"stat", row.stat},
                            {"baseline_ns", row.baseline_ns},
                            {"current_ns", row.current_ns},
                            {"ratio", row.ratio ? json(*row.ratio) : json()}});
        }
        out["baseline"] = {{"file", c.file},
                           {"mode", c.baseline_mode},
                           {"taken_ns", c.baseline_taken_ns},
                           {"rows", std::move(rows)},
                           {"only_in_baseline", c.only_in_baseline},
                           {"only_in_current", c.only_in_current}};
    } else {
        out["baseline"] = nullptr;
    }
    return out;
}

rtcore::result<report> report_from_json(const json& j) {
    reader top(j, "$");
    QRT_TRY(schema, top.str("schema"));
    if (schema != schema_name) {
        return rtcore::error::invalid(
            fmt::format("$.schema: '{}' is not a {} report", schema, schema_name));
    }
    QRT_TRY(version, top.i64("schema_version"));
    if (version < 1 || version > schema_version) {
        return rtcore::error::invalid(fmt::format(
            "$.schema_version: {} is not supported by this version (reads 1..{})", version,
            schema_version));
    }
    report r;
    if (auto tv = top.str("tool_version")) {
        r.tool_version = *tv;
    }
    QRT_TRY(run, top.field("run", json::value_t::object));
    reader rr(*run, "$.run");
    QRT_TRY(mode, rr.str("mode"));
    QRT_TRY(taken, rr.i64("taken_ns"));
    r.run.mode = mode;
    r.run.taken_ns = taken;
    QRT_TRY(list, top.field("series", json::value_t::array));
    std::size_t i = 0;
    for (const auto& s : *list) {
        QRT_TRY(one, series_from_json(s, fmt::format("$.series[{}]", i++)));
        r.series_list.push_back(std::move(one));
    }
    return r;
}

}  // namespace qrt::jitter
