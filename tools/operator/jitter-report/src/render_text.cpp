#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include <fmt/format.h>

#include "jitter_report/render.hpp"
#include "jitter_report/slo.hpp"

namespace qrt::jitter {

namespace {

constexpr std::size_t max_line = text_columns - 1;

// Cuts s to n columns (ASCII), marking the cut with '~'.
std::string fit(std::string_view s, std::size_t n) {
    if (s.size() <= n) {
        return std::string(s);
    }
    if (n == 0) {
        return {};
    }
    return std::string(s.substr(0, n - 1)) + "~";
}

// Word-wraps text after `first` into lines of at most max_line columns,
// continuation lines indented by `indent` spaces.
void wrap(std::string& out, std::string_view first, std::string_view text, std::size_t indent) {
    std::string line(first);
    std::size_t pos = 0;
    bool line_has_word = false;
    while (pos < text.size()) {
        while (pos < text.size() && text[pos] == ' ') {
            ++pos;
        }
        std::size_t end = text.find(' ', pos);
        if (end == std::string_view::npos) {
            end = text.size();
        }
        if (end == pos) {
            break;
        }
        std::string_view word = text.substr(pos, end - pos);
        const std::size_t need = (line_has_word ? 1 : 0) + word.size();
        if (line_has_word && line.size() + need > max_line) {
            out += line + "\n";
            line = std::string(indent, ' ');
            line_has_word = false;
        }
        if (line_has_word) {
            line += ' ';
        }
        line += fit(word, max_line - line.size());
        line_has_word = true;
        pos = end;
    }
    out += line + "\n";
}

std::string utc_time(std::int64_t ns) {
    const std::time_t t = static_cast<std::time_t>(ns / 1'000'000'000);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
    return buf;
}

void header(std::string& out, const report& r) {
    const auto& run = r.run;
    if (run.mode == "standalone") {
        wrap(out,
             fmt::format("qrt-jitter-report {}: standalone, {:.1f} s on cpu{} {}", r.tool_version,
                         static_cast<double>(run.duration_ns) / 1e9,
                         run.cpus.find_first_of(",-") == std::string::npos ? "" : "s", run.cpus),
             "", 2);
        wrap(out, "  ",
             fmt::format("interval {}, {} {}, {} overrun{}, clock CLOCK_MONOTONIC",
                         format_ns(static_cast<double>(run.interval_ns)), run.policy, run.priority,
                         run.overruns, run.overruns == 1 ? "" : "s"),
             2);
    } else {
        wrap(out,
             fmt::format("qrt-jitter-report {}: agent{} at {}", r.tool_version,
                         run.agent_version.empty() ? "" : " qrtd " + run.agent_version, run.socket),
             "", 2);
    }
    wrap(out, "  ", fmt::format("taken {}", utc_time(run.taken_ns)), 2);
    std::string host = fmt::format("host {} (kernel {}, {})", r.host.hostname.empty() ? "?" : r.host.hostname,
                                   r.host.kernel.empty() ? "?" : r.host.kernel,
                                   r.host.preempt_rt ? "PREEMPT_RT" : "not PREEMPT_RT");
    if (r.host.steal_percent >= 0.0) {
        host += fmt::format(", steal {:.1f} % during the run", r.host.steal_percent);
    }
    wrap(out, "", host, 2);
    wrap(out, "probes: ", r.probes.status.empty() ? "unknown" : r.probes.status, 2);
    for (const auto& n : r.notes) {
        wrap(out, "note: ", n, 6);
    }
}

void stats_tables(std::string& out, const report& r) {
    std::vector<std::string> metrics;
    for (const auto& s : r.series_list) {
        if (std::find(metrics.begin(), metrics.end(), s.metric) == metrics.end()) {
            metrics.push_back(s.metric);
        }
    }
    if (metrics.empty()) {
        out += "\nno latency samples in this report\n";
        return;
    }
    for (const auto& m : metrics) {
        out += "\n" + fit(metric_title(m), max_line) + "\n";
        out += fmt::format("  {:<12}{:>9}{:>8}{:>8}{:>8}{:>8}{:>8}{:>8}\n", "series", "count",
                           "p50", "p95", "p99", "p99.9", "max", "stddev");
        for (const auto& s : r.series_list) {
            if (s.metric != m) {
                continue;
            }
            const auto& st = s.stats;
            std::string name = s.name;
            if (s.scope == "qpu" && s.cpu >= 0) {
                name += fmt::format("/cpu{}", s.cpu);
            }
            if (st.count == 0) {
                out += fmt::format("  {:<12}{:>9}  (no samples)\n", fit(name, 12), 0);
                continue;
            }
            const std::string count =
                st.count < 100'000'000 ? fmt::format("{}", st.count)
                                       : fmt::format("{:.1f}M", static_cast<double>(st.count) / 1e6);
            out += fmt::format("  {:<12}{:>9}{:>8}{:>8}{:>8}{:>8}{:>8}{:>8}\n", fit(name, 12), count,
                               format_ns(static_cast<double>(st.p50_ns)),
                               format_ns(static_cast<double>(st.p95_ns)),
                               format_ns(static_cast<double>(st.p99_ns)),
                               format_ns(static_cast<double>(st.p999_ns)),
                               format_ns(static_cast<double>(st.max_ns)), format_ns(st.stddev_ns));
            if (st.negative_count > 0) {
                wrap(out, "    ",
                     fmt::format("{} sample(s) measured early (negative), counted as 0",
                                 st.negative_count),
                     4);
            }
            // The agent's recent windows, under the lifetime row.
            for (const auto& w : s.recent) {
                const auto& ws = w.stats;
                const std::string label = "  last " + w.window;
                if (ws.count == 0) {
                    out += fmt::format("  {:<12}{:>9}  (no samples)\n", fit(label, 12), 0);
                    continue;
                }
                out += fmt::format("  {:<12}{:>9}{:>8}{:>8}{:>8}{:>8}{:>8}{:>8}\n", fit(label, 12), ws.count,
                                   format_ns(static_cast<double>(ws.p50_ns)),
                                   format_ns(static_cast<double>(ws.p95_ns)),
                                   format_ns(static_cast<double>(ws.p99_ns)),
                                   format_ns(static_cast<double>(ws.p999_ns)),
                                   format_ns(static_cast<double>(ws.max_ns)), format_ns(ws.stddev_ns));
            }
        }
    }
}

void histograms(std::string& out, const report& r, const text_options& opt) {
    const std::size_t width = std::min<std::size_t>(opt.histogram_width, 48);
    for (const auto& s : r.series_list) {
        if (!s.primary || s.stats.count == 0) {
            continue;
        }
        const auto rows = display_bins(s, 24);
        std::uint64_t top = 0;
        for (const auto& b : rows) {
            top = std::max(top, b.count);
        }
        out += "\n" + fit(fmt::format("histogram: {} {} (bar: log10 of the count)", s.name,
                                      metric_title(s.metric)),
                          max_line) +
               "\n";
        const double scale = std::log10(static_cast<double>(top) + 1.0);
        for (std::size_t i = 0; i < rows.size(); ++i) {
            const auto& b = rows[i];
            // A run of more than two empty bins is shown as one line.
            std::size_t empty_run = 0;
            while (i + empty_run < rows.size() && rows[i + empty_run].count == 0) {
                ++empty_run;
            }
            if (empty_run > 2) {
                out += fmt::format("  {:>9} |{:<{}}|\n", "...",
                                   fmt::format(" {} empty bins up to {}", empty_run,
                                               format_ns(static_cast<double>(rows[i + empty_run - 1].le_ns))),
                                   width);
                i += empty_run - 1;
                continue;
            }
            std::size_t len = 0;
            if (b.count > 0 && scale > 0.0) {
                len = static_cast<std::size_t>(std::ceil(
                    std::log10(static_cast<double>(b.count) + 1.0) / scale * static_cast<double>(width)));
                len = std::clamp<std::size_t>(len, 1, width);
            }
            out += fmt::format("  <={:>7} |{:<{}}|{:>10}\n", format_ns(static_cast<double>(b.le_ns)),
                               std::string(len, '#'), width, b.count);
        }
    }
}

// Wire version 2: where the time of each two-phase QPU goes, in the order
// it is spent: ahead of T the arm (ARM -> ARMED, and the endpoint's own
// cost by stage), then at T the host's send (FIRE sent - T), then the
// start at the endpoint (started - T).
void two_phase(std::string& out, const report& r) {
    const auto find = [&](const std::string& qpu, const std::string& metric) -> const series* {
        for (const auto& s : r.series_list) {
            if (s.scope == "qpu" && s.name == qpu && s.metric == metric && s.stats.count > 0) {
                return &s;
            }
        }
        return nullptr;
    };
    const auto p50_p99 = [](const series& s) {
        return fmt::format("p50 {} p99 {}", format_ns(static_cast<double>(s.stats.p50_ns)),
                           format_ns(static_cast<double>(s.stats.p99_ns)));
    };
    bool any = false;
    for (const auto& st : r.series_list) {
        if (st.scope != "qpu" || st.metric != "start_lateness" || st.stats.count == 0) {
            continue;
        }
        if (!any) {
            out += "\ntwo-phase QPUs (wire 2): where the time goes\n";
            any = true;
        }
        out += fmt::format("  {}\n", st.name);
        if (const series* a = find(st.name, "arm_to_armed")) {
            out += fmt::format("    before T  ARM -> ARMED        {}\n", p50_p99(*a));
        }
        if (const series* c = find(st.name, "arm_cost")) {
            out += fmt::format("    before T  arm cost (endpoint) {}\n", p50_p99(*c));
            for (const char* stage : {"parse", "compile", "upload", "arm"}) {
                if (const series* p = find(st.name, std::string("arm_cost_") + stage)) {
                    out += fmt::format("                {:<20}{}\n", stage, p50_p99(*p));
                }
            }
        }
        if (const series* f = find(st.name, "dispatch_lateness")) {
            out += fmt::format("    at T      1. host send (FIRE sent - T)        {}\n", p50_p99(*f));
        }
        out += fmt::format("    at T      2. endpoint start (started - T)     {}\n", p50_p99(st));
    }
}

void intrusions(std::string& out, const report& r, const text_options& opt) {
    if (r.intrusions.empty()) {
        if (r.probes.available) {
            out += "\nno intrusions recorded on the measured CPUs\n";
        }
        return;
    }
    out += "\ntop intrusions on the measured CPUs (by total time)\n";
    out += fmt::format("  {:>3} {:<11} {:<26}{:>8}{:>10}{:>9}\n", "cpu", "kind", "source", "count",
                       "total", "max");
    std::size_t n = 0;
    for (const auto& i : r.intrusions) {
        if (n++ >= opt.top_intrusions) {
            break;
        }
        out += fmt::format("  {:>3} {:<11} {:<26}{:>8}{:>10}{:>9}\n", i.cpu, fit(i.kind, 11),
                           fit(i.source, 26), i.count, format_ns(static_cast<double>(i.total_ns)),
                           format_ns(static_cast<double>(i.max_ns)));
    }
    if (r.intrusions.size() > opt.top_intrusions) {
        out += fmt::format("  ... {} more sources (see --json)\n",
                           r.intrusions.size() - opt.top_intrusions);
    }
}

void outliers(std::string& out, const report& r, const text_options& opt) {
    if (r.outliers.empty()) {
        return;
    }
    out += "\nworst wakeups over the outlier threshold, with their cause\n";
    std::size_t n = 0;
    for (const auto& o : r.outliers) {
        if (n++ >= opt.top_outliers) {
            break;
        }
        std::string when;
        if (o.at_ns > 0) {
            // Milliseconds: two outliers in one second are told apart.
            const std::string t = utc_time(o.at_ns);  // "YYYY-MM-DD HH:MM:SS UTC"
            when = fmt::format(" at {}.{:03}", t.substr(11, 8), (o.at_ns / 1'000'000) % 1000);
        }
        wrap(out,
             fmt::format("  {}cpu{} tid {} {}{}: ", o.qpu.empty() ? "" : o.qpu + " ", o.cpu, o.tid,
                         format_ns(static_cast<double>(o.latency_ns)), when),
             o.main_cause.empty() ? "no other activity seen on the CPU" : "mostly " + o.main_cause, 6);
    }
}

void baseline(std::string& out, const report& r) {
    if (!r.baseline) {
        return;
    }
    const auto& c = *r.baseline;
    out += "\n";
    wrap(out, "against baseline ",
         fmt::format("{} ({}, taken {})", c.file, c.baseline_mode, utc_time(c.baseline_taken_ns)), 2);
    std::string current_key;
    for (const auto& row : c.rows) {
        const std::string key = row.scope + "|" + row.name + "|" + row.metric;
        if (key != current_key) {
            current_key = key;
            out += fit(fmt::format("  {}, {}", row.name, metric_title(row.metric)), max_line) + "\n";
            out += fmt::format("    {:<8}{:>10}{:>10}{:>10}\n", "stat", "baseline", "now", "ratio");
        }
        out += fmt::format("    {:<8}{:>10}{:>10}{:>10}\n", row.stat, format_ns(row.baseline_ns),
                           format_ns(row.current_ns),
                           row.ratio ? fmt::format("{:.2f}x", *row.ratio) : std::string("-"));
    }
    for (const auto& s : c.only_in_baseline) {
        wrap(out, "  only in the baseline: ", s, 4);
    }
    for (const auto& s : c.only_in_current) {
        wrap(out, "  only in this run: ", s, 4);
    }
}

void verdict(std::string& out, const report& r) {
    out += "\n";
    if (!r.slo) {
        out += "verdict: no SLO given (e.g. --slo p99=50us,max=500us)\n";
        return;
    }
    const auto& v = *r.slo;
    wrap(out, "SLO ", v.spec, 4);
    std::size_t failed = 0;
    for (const auto& c : v.checks) {
        failed += c.met ? 0 : 1;
        out += fmt::format("  {:<12} {:<6}{:>8} {} {:<8} {}\n", fit(c.series, 12), c.stat,
                           format_ns(c.measured_ns), c.met ? "<=" : "> ",
                           format_ns(static_cast<double>(c.limit_ns)), c.met ? "met" : "VIOLATED");
    }
    if (v.met) {
        out += fmt::format("verdict: SLO met ({} check{})\n", v.checks.size(),
                           v.checks.size() == 1 ? "" : "s");
    } else {
        out += fmt::format("verdict: SLO VIOLATED ({} of {} checks failed)\n", failed, v.checks.size());
    }
}

}  // namespace

std::string render_text(const report& r, const text_options& opt) {
    std::string out;
    header(out, r);
    stats_tables(out, r);
    if (opt.histograms) {
        histograms(out, r, opt);
    }
    two_phase(out, r);
    intrusions(out, r, opt);
    outliers(out, r, opt);
    baseline(out, r);
    verdict(out, r);
    // The width promise holds whatever the data (names come from the kernel
    // and the agent): clip any line that would still be too long.
    std::string clipped;
    std::size_t start = 0;
    while (start < out.size()) {
        std::size_t end = out.find('\n', start);
        if (end == std::string::npos) {
            end = out.size();
        }
        clipped += fit(std::string_view(out).substr(start, end - start), max_line) + "\n";
        start = end + 1;
    }
    return clipped;
}

}  // namespace qrt::jitter
