#include "report.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include <fmt/format.h>

namespace qrt::fleet {

nlohmann::json to_json(const fleet_metrics& m) {
    return nlohmann::json{{"structure", m.structure},
                          {"regime", m.regime},
                          {"load", m.load},
                          {"offered", m.offered},
                          {"hosts", m.hosts},
                          {"qpus", m.qpus},
                          {"seed", m.seed},
                          {"jobs", m.jobs},
                          {"completed", m.completed},
                          {"rejected", m.rejected},
                          {"miss_rate", m.miss_rate},
                          {"compliance_admitted", m.compliance_admitted},
                          {"utilization", m.utilization},
                          {"throughput_qpu_h_per_h", m.throughput_qpu_h_per_h},
                          {"response_p50_s", m.response_p50_s},
                          {"response_p95_s", m.response_p95_s},
                          {"jain", m.jain},
                          {"messages_per_job", m.messages_per_job},
                          {"decide_ns_p50", m.decide_ns_p50},
                          {"decide_ns_mean", m.decide_ns_mean},
                          {"reschedules_per_job", m.reschedules_per_job},
                          {"mean_cost", m.mean_cost},
                          {"fingerprint", fmt::format("{:016x}", m.fingerprint)}};
}

std::vector<fleet_metrics> mean_over_seeds(const std::vector<fleet_metrics>& rows) {
    using key = std::tuple<std::string, std::string, long, std::size_t>;
    std::map<key, std::vector<const fleet_metrics*>> groups;
    std::vector<key> order;
    for (const fleet_metrics& m : rows) {
        const key k{m.structure, m.regime, std::lround(m.load * 1000), m.hosts};
        if (groups.find(k) == groups.end()) {
            order.push_back(k);
        }
        groups[k].push_back(&m);
    }
    std::vector<fleet_metrics> out;
    for (const key& k : order) {
        const auto& g = groups[k];
        fleet_metrics a = *g.front();
        const auto n = static_cast<double>(g.size());
        auto avg = [&](double fleet_metrics::*f) {
            double s = 0;
            for (const fleet_metrics* m : g) {
                s += m->*f;
            }
            a.*f = s / n;
        };
        for (auto f : {&fleet_metrics::offered, &fleet_metrics::miss_rate, &fleet_metrics::compliance_admitted,
                       &fleet_metrics::utilization, &fleet_metrics::throughput_qpu_h_per_h,
                       &fleet_metrics::response_p50_s, &fleet_metrics::response_p95_s,
                       &fleet_metrics::jain, &fleet_metrics::messages_per_job,
                       &fleet_metrics::decide_ns_p50, &fleet_metrics::decide_ns_mean,
                       &fleet_metrics::reschedules_per_job, &fleet_metrics::mean_cost,
                       &fleet_metrics::wall_s}) {
            avg(f);
        }
        std::size_t jobs = 0;
        for (const fleet_metrics* m : g) {
            jobs += m->jobs;
        }
        a.jobs = jobs;
        a.seed = 0;
        out.push_back(a);
    }
    return out;
}

std::string render_table(const std::vector<fleet_metrics>& rows) {
    std::string s = fmt::format("{:<8} {:<10} {:>5} {:>5} {:>5} {:>7} {:>6} {:>6} {:>7} {:>7} {:>5} "
                                "{:>7} {:>8} {:>7} {:>6}\n",
                                "struct", "regime", "hosts", "load", "offer", "jobs", "miss%", "util",
                                "p50 s", "p95 s", "jain", "msg/job", "dec ns", "resch", "cost");
    for (const fleet_metrics& m : rows) {
        s += fmt::format("{:<8} {:<10} {:>5} {:>5.2f} {:>5.2f} {:>7} {:>6.2f} {:>6.3f} {:>7.0f} "
                         "{:>7.0f} {:>5.3f} {:>7.1f} {:>8.0f} {:>7.3f} {:>6.3f}\n",
                         m.structure, m.regime, m.hosts, m.load, m.offered, m.jobs, 100.0 * m.miss_rate,
                         m.utilization, m.response_p50_s, m.response_p95_s, m.jain,
                         m.messages_per_job, m.decide_ns_p50, m.reschedules_per_job, m.mean_cost);
    }
    return s;
}

nlohmann::json to_json(const report& r) {
    nlohmann::json rows = nlohmann::json::array();
    for (const fleet_metrics& m : r.rows) {
        rows.push_back(to_json(m));
    }
    nlohmann::json means = nlohmann::json::array();
    for (const fleet_metrics& m : mean_over_seeds(r.rows)) {
        nlohmann::json j = to_json(m);
        j.erase("seed");
        j.erase("fingerprint");
        means.push_back(std::move(j));
    }
    const fleet_params& p = r.base;
    return nlohmann::json{{"bench", "fleet_sim"},
                          {"title", r.title},
                          {"machine", r.machine},
                          {"seeds", r.seeds},
                          {"params",
                           {{"hosts", p.hosts},
                            {"qpus_per_host", {p.min_qpus, p.max_qpus}},
                            {"hours", p.hours},
                            {"warmup_h", p.warmup_h},
                            {"policy", p.policy},
                            {"delay_ms", p.delay_ms},
                            {"gossip_s", p.gossip_s},
                            {"d", p.d},
                            {"gang_fraction", p.gang_fraction},
                            {"host_mtbf_h", p.host_mtbf_h},
                            {"stall_mtbf_h", p.stall_mtbf_h}}},
                          {"means", means},
                          {"runs", rows},
                          {"claims", r.extra}};
}

namespace {

constexpr int k_w = 640;
constexpr int k_h = 400;
constexpr int k_left = 70;
constexpr int k_right = 130;
constexpr int k_top = 40;
constexpr int k_bottom = 50;

double metric_of(const fleet_metrics& m, const std::string& name) {
    if (name == "miss_rate") {
        return m.miss_rate;
    }
    if (name == "utilization") {
        return m.utilization;
    }
    if (name == "response_p95_s") {
        return m.response_p95_s;
    }
    return m.mean_cost;
}

}  // namespace

std::string render_svg(const std::vector<fleet_metrics>& means, const std::string& regime,
                       const std::string& metric, const std::string& title) {
    std::map<std::string, std::vector<std::pair<double, double>>> lines;
    std::vector<std::string> names;
    double xmin = 1e9;
    double xmax = -1e9;
    double ymax = 0;
    for (const fleet_metrics& m : means) {
        if (m.regime != regime) {
            continue;
        }
        if (lines.find(m.structure) == lines.end()) {
            names.push_back(m.structure);
        }
        const double y = metric_of(m, metric);
        lines[m.structure].emplace_back(m.load, y);
        xmin = std::min(xmin, m.load);
        xmax = std::max(xmax, m.load);
        ymax = std::max(ymax, y);
    }
    if (xmax <= xmin) {
        xmax = xmin + 1;
    }
    ymax = ymax <= 0 ? 1.0 : ymax * 1.1;
    const int pw = k_w - k_left - k_right;
    const int ph = k_h - k_top - k_bottom;
    auto X = [&](double x) { return k_left + (x - xmin) / (xmax - xmin) * pw; };
    auto Y = [&](double y) { return k_top + ph - y / ymax * ph; };
    static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
    std::string s = fmt::format(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
        "width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n"
        "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        "<text x=\"{}\" y=\"22\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
        k_w, k_h, k_left, title);
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", k_left,
                     k_top + ph, k_left + pw, k_top + ph);
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", k_left,
                     k_top, k_left, k_top + ph);
    for (int i = 0; i <= 5; ++i) {
        const double y = ymax * i / 5.0;
        s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
                         "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.3g}</text>\n",
                         k_left, Y(y), k_left + pw, Y(y), k_left - 6, Y(y) + 4, y);
    }
    for (int i = 0; i <= 7; ++i) {
        const double x = xmin + (xmax - xmin) * i / 7.0;
        s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.2f}</text>\n", X(x),
                         k_top + ph + 18, x);
    }
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">offered load (of window "
                     "capacity)</text>\n",
                     k_left + pw / 2, k_h - 10);
    s += fmt::format("<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" "
                     "text-anchor=\"middle\">{}</text>\n",
                     k_top + ph / 2, k_top + ph / 2, metric);
    for (std::size_t i = 0; i < names.size(); ++i) {
        auto pts = lines[names[i]];
        std::sort(pts.begin(), pts.end());
        std::string path;
        for (const auto& [x, y] : pts) {
            path += fmt::format("{:.1f},{:.1f} ", X(x), Y(y));
        }
        const char* c = colors[i % 6];
        s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                         c, path);
        for (const auto& [x, y] : pts) {
            s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", X(x),
                             Y(y), c);
        }
        const int ly = k_top + 10 + static_cast<int>(i) * 18;
        s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" "
                         "stroke-width=\"2\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                         k_left + pw + 10, ly, k_left + pw + 30, ly, c, k_left + pw + 36, ly + 4,
                         names[i]);
    }
    s += "</svg>\n";
    return s;
}

}  // namespace qrt::fleet
