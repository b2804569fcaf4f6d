#include "jitter_report/cli.hpp"

#include <time.h>

#include <optional>
#include <ostream>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "jitter_report/agent_source.hpp"
#include "jitter_report/atomic_file.hpp"
#include "jitter_report/baseline.hpp"
#include "jitter_report/render.hpp"
#include "jitter_report/slo.hpp"
#include "jitter_report/standalone.hpp"

#ifndef QRT_VERSION
#define QRT_VERSION "0.0.0"
#endif
#ifndef QRT_DEFAULT_SOCKET_PATH
#define QRT_DEFAULT_SOCKET_PATH "/run/qrtd/qrtd.sock"
#endif

namespace qrt::jitter {

namespace {

constexpr const char* examples = R"(EXAMPLES:
  Report on the running agent (socket /run/qrtd/qrtd.sock):
    qrt-jitter-report
  Measure CPU 1 for 10 s without the agent, like cyclictest:
    qrt-jitter-report --standalone --cpus 1 --duration 10s --interval 1ms --priority 80
  Fail a CI job when p99 > 10 us or max > 100 us (exit 1):
    qrt-jitter-report --standalone --duration 30s --slo p99=10us,max=100us
  Keep a baseline, tune the host, then compare:
    qrt-jitter-report --standalone --json -o before.json
    qrt-jitter-report --standalone --baseline before.json --svg after.svg

EXIT STATUS: 0 report made (SLO met or none given), 1 SLO violated,
  2 error (bad option, agent missing or stale, bad baseline, unknown CPU).
See qrt-jitter-report(1) for the JSON schema and the probes' overhead.)";

struct options {
    bool standalone = false;
    std::string socket = QRT_DEFAULT_SOCKET_PATH;
    std::string cpus;
    std::string duration = "10s";
    std::string interval = "1ms";
    int priority = 80;
    bool no_probes = false;
    std::string outlier_threshold = "100us";
    std::string timeout = "5s";
    std::string max_age = "60s";
    bool json = false;
    std::string output;
    std::string svg;
    std::string baseline;
    std::string slo;
    bool no_histogram = false;
};

// Everything given on the command line, checked before any measurement.
struct plan {
    standalone_options standalone;
    agent_options agent;
    std::optional<slo_spec> slo;
    std::optional<report> baseline;
};

rtcore::result<plan> make_plan(const options& o, const std::atomic<bool>* stop) {
    plan p;
    if (!o.slo.empty()) {
        auto s = parse_slo(o.slo);
        if (!s) {
            return std::move(s).err();
        }
        p.slo = std::move(*s);
    }
    if (!o.baseline.empty()) {
        auto b = load_baseline(o.baseline);
        if (!b) {
            return std::move(b).err();
        }
        p.baseline = std::move(*b);
    }
    rtcore::cpu_set cpus;
    if (!o.cpus.empty()) {
        auto c = rtcore::cpu_set::parse_list(o.cpus);
        if (!c) {
            return rtcore::error::invalid(fmt::format("--cpus '{}': {}", o.cpus, c.err().message));
        }
        if (c->empty()) {
            return rtcore::error::invalid(fmt::format("--cpus '{}': no CPU given", o.cpus));
        }
        cpus = *c;
    }
    const auto duration = [](const std::string& opt, const std::string& text,
                             bool minutes) -> rtcore::result<std::int64_t> {
        auto v = parse_duration_ns(text, minutes);
        if (!v) {
            return rtcore::error::invalid(opt + ": " + v.err().message);
        }
        return v;
    };
    if (o.standalone) {
        auto d = duration("--duration", o.duration, true);
        auto i = duration("--interval", o.interval, false);
        auto t = duration("--outlier-threshold", o.outlier_threshold, false);
        for (const auto* r : {&d, &i, &t}) {
            if (!*r) {
                return r->err();
            }
        }
        p.standalone.cpus = cpus.empty() ? rtcore::cpu_set{1} : cpus;
        p.standalone.duration_ns = *d;
        p.standalone.interval_ns = *i;
        p.standalone.priority = o.priority;
        p.standalone.probes = !o.no_probes;
        p.standalone.outlier_threshold_ns = *t;
        p.standalone.stop = stop;
    } else {
        auto t = duration("--timeout", o.timeout, false);
        auto a = duration("--max-age", o.max_age, true);
        for (const auto* r : {&t, &a}) {
            if (!*r) {
                return r->err();
            }
        }
        if (*t <= 0 || *a < 1'000'000'000) {
            return rtcore::error::invalid("--timeout must be > 0 and --max-age >= 1s");
        }
        p.agent.socket_path = o.socket;
        p.agent.timeout = std::chrono::milliseconds(*t / 1'000'000);
        p.agent.max_age = std::chrono::seconds(*a / 1'000'000'000);
        p.agent.cpus = cpus;
    }
    return p;
}

}  // namespace

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
            const std::atomic<bool>* stop) {
    options o;
    CLI::App app{"qrt-jitter-report: how well this host keeps time, and why not.\n"
                 "Reads the running qrtd, or measures on its own with --standalone.",
                 "qrt-jitter-report"};
    app.footer(examples);
    app.set_version_flag("--version", std::string("qrt-jitter-report ") + QRT_VERSION);
    app.add_option("--socket", o.socket, "qrtd control socket (agent mode)")->capture_default_str();
    app.add_flag("--standalone", o.standalone,
                 "measure with a SCHED_FIFO timer loop per CPU instead of asking the agent");
    app.add_option("--cpus", o.cpus,
                   "CPU list (kernel form, 1 or 0-3,8): standalone, the CPUs to measure "
                   "(default 1); agent, the CPUs to show (default all)");
    app.add_option("--duration", o.duration, "standalone: run time (ns, us, ms, s, m)")->capture_default_str();
    app.add_option("--interval", o.interval, "standalone: timer period")->capture_default_str();
    app.add_option("--priority", o.priority, "standalone: SCHED_FIFO priority (1..99)")->capture_default_str();
    app.add_flag("--no-probes", o.no_probes, "standalone: do not attach the eBPF probes");
    app.add_option("--outlier-threshold", o.outlier_threshold,
                   "standalone: wakeups slower than this are explained one by one")
        ->capture_default_str();
    app.add_option("--timeout", o.timeout, "agent: how long to wait for an answer")->capture_default_str();
    app.add_option("--max-age", o.max_age, "agent: an older snapshot is stale (error)")->capture_default_str();
    app.add_flag("--json", o.json, "print the report as JSON (schema in the man page)");
    app.add_option("-o,--output", o.output, "write the text or JSON report to FILE (atomically)");
    app.add_option("--svg", o.svg, "also write a latency histogram plot to FILE (SVG)");
    app.add_option("--baseline", o.baseline, "compare with FILE, an earlier --json output");
    app.add_option("--slo", o.slo, "objectives, e.g. p99=10us,max=100us (exit 1 when violated)");
    app.add_flag("--no-histogram", o.no_histogram, "text: leave out the terminal histograms");

    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e, out, err);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e, out, err);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e, out, err);
    } catch (const CLI::ParseError& e) {
        (void)app.exit(e, out, err);
        return exit_error;
    }

    auto p = make_plan(o, stop);
    if (!p) {
        err << "qrt-jitter-report: " << p.err().message << "\n";
        return exit_error;
    }
    rtcore::result<report> r = rtcore::error::invalid("no source");
    if (o.standalone) {
        rtcore::host_fs fs = rtcore::host_fs::system();
        r = run_standalone(p->standalone, fs);
    } else {
        r = read_agent(p->agent);
    }
    if (!r) {
        err << "qrt-jitter-report: " << r.err().message << "\n";
        return exit_error;
    }
    report& rep = *r;
    rep.tool_version = QRT_VERSION;
    if (p->slo) {
        auto v = check_slo(*p->slo, rep);
        if (!v) {
            err << "qrt-jitter-report: " << v.err().message << "\n";
            return exit_error;
        }
        rep.slo = std::move(*v);
    }
    if (p->baseline) {
        rep.baseline = compare(rep, *p->baseline, o.baseline);
    }

    text_options topt;
    topt.histograms = !o.no_histogram;
    const std::string main_text =
        o.json ? to_json(rep).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"
               : render_text(rep, topt);
    if (!o.svg.empty()) {
        if (auto st = write_file_atomically(o.svg, render_svg(rep)); !st) {
            err << "qrt-jitter-report: --svg: " << st.err().message << "\n";
            return exit_error;
        }
    }
    if (!o.output.empty()) {
        if (auto st = write_file_atomically(o.output, main_text); !st) {
            err << "qrt-jitter-report: --output: " << st.err().message << "\n";
            return exit_error;
        }
    } else {
        out << main_text;
        out.flush();
    }
    if (rep.slo && !rep.slo->met) {
        return exit_slo_violated;
    }
    return exit_ok;
}

}  // namespace qrt::jitter
