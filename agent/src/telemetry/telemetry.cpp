#include "qrt/telemetry.hpp"

#include <map>
#include <string_view>

#include <fmt/format.h>

#include "rtcore/atomic_file.hpp"

namespace qrt::telemetry {

void snapshot::add_counter(std::string name, std::string help, labels l, std::uint64_t v) {
    counters.push_back(counter{std::move(name), std::move(help), std::move(l), v, false, 0.0});
}

void snapshot::add_real_counter(std::string name, std::string help, labels l, double v) {
    counter c{std::move(name), std::move(help), std::move(l), 0, true, v};
    counters.push_back(std::move(c));
}

void snapshot::add_gauge(std::string name, std::string help, labels l, double v) {
    gauges.push_back(gauge{std::move(name), std::move(help), std::move(l), v});
}

void snapshot::add_histogram(std::string name, std::string help, labels l,
                             const rtcore::histogram& h) {
    histograms.push_back(histogram{std::move(name), std::move(help), std::move(l),
                                   std::make_shared<const rtcore::histogram>(h), {}});
}

void snapshot::merge(snapshot other) {
    taken_ns = std::max(taken_ns, other.taken_ns);
    for (auto& c : other.counters) {
        counters.push_back(std::move(c));
    }
    for (auto& g : other.gauges) {
        gauges.push_back(std::move(g));
    }
    for (auto& h : other.histograms) {
        histograms.push_back(std::move(h));
    }
}

const std::vector<std::int64_t>& prometheus_bounds_ns() {
    static const std::vector<std::int64_t> bounds = [] {
        std::vector<std::int64_t> b;
        for (std::int64_t decade = 1'000; decade <= 10'000'000'000; decade *= 10) {
            for (const std::int64_t step : {1, 2, 5}) {
                const std::int64_t v = decade * step;
                if (v > 10'000'000'000) {
                    break;
                }
                b.push_back(rtcore::histogram::bucket_upper_at_or_above(v));
            }
        }
        return b;
    }();
    return bounds;
}

namespace {

bool name_char(char c, bool first, bool colon_ok) {
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (first) {
        return alpha || (colon_ok && c == ':');
    }
    return alpha || (c >= '0' && c <= '9') || (colon_ok && c == ':');
}

bool valid_name(std::string_view name, bool colon_ok) {
    if (name.empty()) {
        return false;
    }
    for (std::size_t i = 0; i < name.size(); ++i) {
        if (!name_char(name[i], i == 0, colon_ok)) {
            return false;
        }
    }
    return true;
}

// count, min_ns ... p999_ns: the summary's fields under their one set of names.
nlohmann::json summary_json(const rtcore::histogram_summary& s) {
    nlohmann::json j = nlohmann::json::object();
    rtcore::for_each_summary_field(s, [&](const char* key, const auto& v) { j[key] = v; });
    return j;
}

nlohmann::json labels_json(const labels& l) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : l) {
        j[k] = v;
    }
    return j;
}

std::string escape_label_value(std::string_view v) {
    std::string out;
    out.reserve(v.size());
    for (const char c : v) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c == '"') {
            out += "\\\"";
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out.push_back(c);
        }
    }
    return out;
}

std::string escape_help(std::string_view v) {
    std::string out;
    for (const char c : v) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out.push_back(c);
        }
    }
    return out;
}

// {a="x",b="y"} with an optional extra label appended (for `le`).
std::string label_text(const labels& l, std::string_view extra_name = {},
                       std::string_view extra_value = {}) {
    if (l.empty() && extra_name.empty()) {
        return {};
    }
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : l) {
        out += first ? "" : ",";
        first = false;
        out += k;
        out += "=\"";
        out += escape_label_value(v);
        out += '"';
    }
    if (!extra_name.empty()) {
        out += first ? "" : ",";
        out += extra_name;
        out += "=\"";
        out += extra_value;
        out += '"';
    }
    out += '}';
    return out;
}

std::string format_double(double v) {
    if (std::isnan(v)) {
        return "NaN";
    }
    if (std::isinf(v)) {
        return v > 0 ? "+Inf" : "-Inf";
    }
    return fmt::format("{}", v);
}

std::string seconds_of_ns(std::int64_t ns) {
    return format_double(static_cast<double>(ns) / 1e9);
}

struct family {
    std::string type;
    std::string help;
    std::string body;
};

rtcore::status check_labels(const std::string& metric, const labels& l) {
    for (const auto& [k, v] : l) {
        if (!valid_label_name(k) || k == "le" || k.rfind("__", 0) == 0) {
            return rtcore::error::invalid(
                fmt::format("metric {}: invalid label name '{}'", metric, k));
        }
    }
    return rtcore::ok();
}

}  // namespace

bool valid_metric_name(std::string_view name) noexcept { return valid_name(name, true); }
bool valid_label_name(std::string_view name) noexcept { return valid_name(name, false); }

nlohmann::json to_json(const snapshot& s) {
    nlohmann::json out;
    out["taken_ns"] = s.taken_ns;
    auto& counters = out["counters"] = nlohmann::json::array();
    for (const auto& c : s.counters) {
        counters.push_back({{"name", c.name}, {"help", c.help}, {"labels", labels_json(c.label_set)},
                            {"value", c.is_real ? nlohmann::json(c.real_value) : nlohmann::json(c.value)}});
    }
    auto& gauges = out["gauges"] = nlohmann::json::array();
    for (const auto& g : s.gauges) {
        gauges.push_back({{"name", g.name}, {"help", g.help}, {"labels", labels_json(g.label_set)},
                          {"value", g.value}});
    }
    auto& hists = out["histograms"] = nlohmann::json::array();
    for (const auto& h : s.histograms) {
        static const rtcore::histogram empty_histogram;
        const rtcore::histogram& hh = h.ns ? *h.ns : empty_histogram;
        const auto sum = hh.summary();
        nlohmann::json buckets = nlohmann::json::array();
        std::uint64_t prev = 0;
        for (const auto le : prometheus_bounds_ns()) {
            const auto c = hh.count_at_or_below(le);
            if (c != prev) {
                buckets.push_back({{"le_ns", le}, {"count", c}});
                prev = c;
            }
        }
        nlohmann::json recent = nlohmann::json::object();
        for (const auto& v : h.recent) {
            static const rtcore::histogram empty_view;
            const rtcore::histogram& vh = v.ns ? *v.ns : empty_view;
            nlohmann::json w = summary_json(vh.summary());
            w["span_ns"] = v.span_ns;
            recent[v.window] = std::move(w);
        }
        nlohmann::json one = summary_json(sum);
        one["name"] = h.name;
        one["help"] = h.help;
        one["labels"] = labels_json(h.label_set);
        one["negative_count"] = hh.negative_count();
        one["buckets"] = std::move(buckets);
        one["recent"] = std::move(recent);
        hists.push_back(std::move(one));
    }
    return out;
}

rtcore::result<std::string> to_prometheus(const snapshot& s) {
    std::vector<std::string> order;
    std::map<std::string, family, std::less<>> families;
    auto fam = [&](const std::string& name, std::string_view type,
                   const std::string& help) -> rtcore::result<family*> {
        if (!valid_metric_name(name)) {
            return rtcore::error::invalid(fmt::format("invalid metric name '{}'", name));
        }
        auto it = families.find(name);
        if (it == families.end()) {
            order.push_back(name);
            it = families.emplace(name, family{std::string(type), help, {}}).first;
        } else if (it->second.type != type) {
            return rtcore::error::invalid(fmt::format("metric {} is both a {} and a {}", name,
                                                      it->second.type, type));
        }
        return &it->second;
    };
    for (const auto& c : s.counters) {
        auto f = fam(c.name, "counter", c.help);
        if (!f) {
            return std::move(f).err();
        }
        if (auto st = check_labels(c.name, c.label_set); !st) {
            return std::move(st).err();
        }
        (*f)->body += c.is_real ? fmt::format("{}{} {}\n", c.name, label_text(c.label_set),
                                              format_double(c.real_value))
                                : fmt::format("{}{} {}\n", c.name, label_text(c.label_set), c.value);
    }
    for (const auto& g : s.gauges) {
        auto f = fam(g.name, "gauge", g.help);
        if (!f) {
            return std::move(f).err();
        }
        if (auto st = check_labels(g.name, g.label_set); !st) {
            return std::move(st).err();
        }
        (*f)->body += fmt::format("{}{} {}\n", g.name, label_text(g.label_set), format_double(g.value));
    }
    for (const auto& h : s.histograms) {
        auto f = fam(h.name, "histogram", h.help);
        if (!f) {
            return std::move(f).err();
        }
        if (auto st = check_labels(h.name, h.label_set); !st) {
            return std::move(st).err();
        }
        static const rtcore::histogram empty_histogram;
        const rtcore::histogram& hh = h.ns ? *h.ns : empty_histogram;
        std::string& body = (*f)->body;
        for (const auto le : prometheus_bounds_ns()) {
            body += fmt::format("{}_bucket{} {}\n", h.name,
                                label_text(h.label_set, "le", seconds_of_ns(le)),
                                hh.count_at_or_below(le));
        }
        body += fmt::format("{}_bucket{} {}\n", h.name, label_text(h.label_set, "le", "+Inf"),
                            hh.count());
        const double sum_s = hh.mean() * static_cast<double>(hh.count()) / 1e9;
        body += fmt::format("{}_sum{} {}\n", h.name, label_text(h.label_set), format_double(sum_s));
        body += fmt::format("{}_count{} {}\n", h.name, label_text(h.label_set), hh.count());
    }
    // Recent windows as gauges (a Prometheus histogram is cumulative by
    // definition): <name>_recent_seconds{...,window,stat} and
    // <name>_recent_samples{...,window}.
    for (const auto& h : s.histograms) {
        if (h.recent.empty()) {
            continue;
        }
        const std::string rname = recent_metric_name(h.name);
        const std::string cname = recent_samples_metric_name(h.name);
        auto fr = fam(rname, "gauge", "recent windows of " + h.name + " (stat by window)");
        if (!fr) {
            return std::move(fr).err();
        }
        std::string& rbody = (*fr)->body;
        for (const auto& v : h.recent) {
            static const rtcore::histogram empty_view;
            const rtcore::histogram& vh = v.ns ? *v.ns : empty_view;
            const auto vs = vh.summary();
            const std::pair<const char*, double> stats[] = {
                {"p50", static_cast<double>(vs.p50_ns)},   {"p95", static_cast<double>(vs.p95_ns)},
                {"p99", static_cast<double>(vs.p99_ns)},   {"p999", static_cast<double>(vs.p999_ns)},
                {"max", static_cast<double>(vs.max_ns)},   {"mean", vs.mean_ns},
            };
            for (const auto& [stat, ns] : stats) {
                auto l = h.label_set;
                l.emplace_back("window", v.window);
                l.emplace_back("stat", stat);
                rbody += fmt::format("{}{} {}\n", rname, label_text(l), format_double(ns / 1e9));
            }
        }
        auto fc = fam(cname, "gauge", "samples in the recent windows of " + h.name);
        if (!fc) {
            return std::move(fc).err();
        }
        for (const auto& v : h.recent) {
            auto l = h.label_set;
            l.emplace_back("window", v.window);
            (*fc)->body += fmt::format("{}{} {}\n", cname, label_text(l), v.ns ? v.ns->count() : 0);
        }
    }
    std::string out;
    for (const auto& name : order) {
        const auto& f = families.find(name)->second;
        if (!f.help.empty()) {
            out += fmt::format("# HELP {} {}\n", name, escape_help(f.help));
        }
        out += fmt::format("# TYPE {} {}\n", name, f.type);
        out += f.body;
    }
    return out;
}

rtcore::status write_textfile_atomically(const std::string& path, std::string_view text) {
    return rtcore::write_file_atomically(path, text);
}

}  // namespace qrt::telemetry
