#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "jitter_report/render.hpp"
#include "jitter_report/slo.hpp"

namespace qrt::jitter {

namespace {

constexpr int width = 760;
constexpr int panel_height = 280;
constexpr int margin_left = 70;
constexpr int margin_right = 20;
constexpr int margin_top = 44;
constexpr int margin_bottom = 56;

std::string xml_escape(std::string_view s) {
    std::string out;
    for (const char c : s) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&apos;"; break;
            default:
                // Control characters are not allowed in XML 1.0.
                out.push_back(static_cast<unsigned char>(c) < 0x20 ? ' ' : c);
        }
    }
    return out;
}

void panel(std::string& out, const series& s, int top) {
    const auto rows = display_bins(s, 60);
    const int plot_w = width - margin_left - margin_right;
    const int plot_h = panel_height - margin_top - margin_bottom;
    const int x0 = margin_left;
    const int y0 = top + margin_top + plot_h;  // baseline of the bars
    std::uint64_t peak = 1;
    for (const auto& b : rows) {
        peak = std::max(peak, b.count);
    }
    // Height of a count: log10(count + 1) over log10 of the next power of ten.
    const double decades = std::ceil(std::log10(static_cast<double>(peak) + 1.0));
    const auto height_of = [&](double count) {
        return decades > 0.0 ? std::log10(count + 1.0) / decades * plot_h : 0.0;
    };
    const auto& st = s.stats;
    out += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-size=\"14\" font-weight=\"bold\">{}</text>\n", x0,
        top + 18,
        xml_escape(fmt::format("{} {}: p50 {} p99 {} p99.9 {} max {} (n={})", s.name,
                               metric_title(s.metric), format_ns(static_cast<double>(st.p50_ns)),
                               format_ns(static_cast<double>(st.p99_ns)),
                               format_ns(static_cast<double>(st.p999_ns)),
                               format_ns(static_cast<double>(st.max_ns)), st.count)));
    // The agent's recent windows, under the title.
    std::string recent;
    for (const auto& w : s.recent) {
        recent += fmt::format("{}last {}: p99 {} max {} (n={})", recent.empty() ? "" : "; ", w.window,
                              format_ns(static_cast<double>(w.stats.p99_ns)),
                              format_ns(static_cast<double>(w.stats.max_ns)), w.stats.count);
    }
    if (!recent.empty()) {
        out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\">{}</text>\n", x0, top + 34,
                           xml_escape(recent));
    }
    // Axes.
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", x0, y0,
                       x0 + plot_w, y0);
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", x0, y0,
                       x0, y0 - plot_h);
    // Y ticks at powers of ten.
    for (int k = 0; k <= static_cast<int>(decades); ++k) {
        const double c = std::pow(10.0, k);
        const double y = static_cast<double>(y0) - height_of(c);
        out += fmt::format(
            "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ccc\"/>\n"
            "<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n",
            x0, y, x0 + plot_w, y, x0 - 6, y + 4, fmt::format("{:.0f}", c));
    }
    out += fmt::format(
        "<text x=\"14\" y=\"{}\" font-size=\"12\" transform=\"rotate(-90 14 {})\" "
        "text-anchor=\"middle\">samples (log scale)</text>\n",
        y0 - plot_h / 2, y0 - plot_h / 2);
    if (rows.empty()) {
        return;
    }
    const double bar_w = static_cast<double>(plot_w) / static_cast<double>(rows.size());
    const std::size_t label_every = std::max<std::size_t>(1, rows.size() / 10);
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& b = rows[i];
        const double x = x0 + bar_w * static_cast<double>(i);
        if (b.count > 0) {
            const double h = std::max(1.0, height_of(static_cast<double>(b.count)));
            out += fmt::format(
                "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#3b6ea5\">"
                "<title>{}</title></rect>\n",
                x + 0.5, static_cast<double>(y0) - h, std::max(0.5, bar_w - 1.0), h,
                xml_escape(fmt::format("<= {}: {}", format_ns(static_cast<double>(b.le_ns)), b.count)));
        }
        if (i % label_every == 0 || i + 1 == rows.size()) {
            out += fmt::format(
                "<text x=\"{:.1f}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\">{}</text>\n",
                x + bar_w / 2, y0 + 14, xml_escape(format_ns(static_cast<double>(b.le_ns))));
        }
    }
    out += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">latency (bin upper "
        "bound)</text>\n",
        x0 + plot_w / 2, y0 + 34);
}

}  // namespace

std::string render_svg(const report& r) {
    // Each primary series; a two-phase QPU's (wire 2) is followed by where
    // the rest of its time goes: the start at the endpoint after the host's
    // send, then ahead of T the ARM -> ARMED and the endpoint's arm cost.
    std::vector<const series*> shown;
    for (const auto& s : r.series_list) {
        if (!s.primary || s.stats.count == 0) {
            continue;
        }
        shown.push_back(&s);
        for (const char* metric : {"start_lateness", "arm_to_armed", "arm_cost"}) {
            for (const auto& t : r.series_list) {
                if (t.scope == s.scope && t.name == s.name && t.metric == metric && t.stats.count > 0) {
                    shown.push_back(&t);
                }
            }
        }
    }
    const int panels = std::max<int>(1, static_cast<int>(shown.size()));
    const int height = 30 + panels * panel_height;
    std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    out += fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{}\" height=\"{}\" "
        "viewBox=\"0 0 {} {}\" font-family=\"sans-serif\">\n",
        width, height, width, height);
    out += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n", width,
                       height);
    std::string subtitle = fmt::format("qrt-jitter-report {} ({})", r.tool_version, r.run.mode);
    if (r.run.mode == "standalone") {
        subtitle += fmt::format(", cpus {}, interval {}, {} {}", r.run.cpus,
                                format_ns(static_cast<double>(r.run.interval_ns)), r.run.policy,
                                r.run.priority);
    }
    if (r.slo) {
        subtitle += fmt::format(", SLO {} {}", r.slo->spec, r.slo->met ? "met" : "VIOLATED");
    }
    out += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"12\">{}</text>\n", margin_left,
                       xml_escape(subtitle));
    if (shown.empty()) {
        out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"14\">no samples</text>\n",
                           margin_left, 30 + panel_height / 2);
    }
    int top = 30;
    for (const auto* s : shown) {
        out += "<g>\n";
        panel(out, *s, top);
        out += "</g>\n";
        top += panel_height;
    }
    out += "</svg>\n";
    return out;
}

}  // namespace qrt::jitter
