// qrtd: the command line.  Parses arguments, sets up logging, and calls into
// qrt_agent.  Only this file decides the process's exit code.

#include <CLI/CLI.hpp>

#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "qrt/config.hpp"
#include "qrt/daemon.hpp"
#include "qrt/host_cmd.hpp"
#include "qrt/log.hpp"
#include "qrt/version.hpp"

namespace {

constexpr const char* footer = R"(EXIT STATUS
  0  success (verify: nothing drifted)
  1  runtime failure: the host refused a change, restore incomplete, drift found
  2  usage or configuration error; nothing was changed
  3  run: dispatch.require_rt refused to run degraded (a dispatch thread cannot
     be SCHED_FIFO on its isolated CPU; the log names the cause and the remedy)

EXAMPLES
  qrtd check-config                       validate /etc/qrtd/qrtd.toml
  qrtd check-config -c demo.toml --json   errors and effective config as JSON
  qrtd config-reference > qrtd.toml       every option, commented, at its default
  qrtd host plan                          show the partition this host would get
  qrtd host apply --dry-run               list every write apply would make
  qrtd host plan --slurm                  slurm.conf/cgroup.conf/gres.conf lines for this node
  qrtd host apply && qrtd host verify     apply the partition, then check it
  qrtd host verify --repin                re-pin drifted and new IRQs; 0 when fixed
                                          (what qrtd-repin.timer runs every 30 s)
  qrtd host restore                       put back every value apply changed
                                          (waits for a restore helper still at work)
  qrtd run -c /usr/share/qrtd/demo.toml --state-dir /tmp/q --duration-s 5
                                          apply, drop to agent.user, run 5 s,
                                          restore (as root)
  qrtd host plan --root tests/data/trees/vm2-v1 --json
                                          plan against a fake /proc,/sys tree
  qrtd host apply --root /tmp/tree --journal-dir /tmp/j --state-dir /tmp/s
                                          apply to a copy of a fake tree

See qrtd(8) and qrtd.toml(5).)";

struct globals {
    std::string config_path = QRT_DEFAULT_CONFIG_PATH;
    std::string root = "/";
    std::string state_dir;
    std::string journal_dir;
    std::string log_level;
    std::string topology;
    bool json = false;
    bool dry_run = false;
    bool slurm = false;
    bool repin = false;
    long duration_s = -1;
};

qrt::exit_code print_config_errors(const qrt::config_load_result& res) {
    for (const auto& e : res.errors) {
        std::cerr << e.to_string() << '\n';
    }
    return qrt::exit_code::usage;
}

std::optional<qrt::config> load(const globals& g, bool quiet_errors = false) {
    rtcore::host_fs fs(g.root, rtcore::host_fs::mode::dry_run);
    auto res = qrt::load_config_file(g.config_path, {qrt::read_online_cpus(fs)});
    if (!res.ok()) {
        if (!quiet_errors) {
            print_config_errors(res);
        }
        return std::nullopt;
    }
    if (!g.state_dir.empty()) {
        res.cfg.agent.state_dir = g.state_dir;
    }
    if (!g.journal_dir.empty()) {
        res.cfg.host.journal_dir = g.journal_dir;
    }
    if (!g.log_level.empty()) {
        res.cfg.agent.level = *qrt::enum_from_string<qrt::log_level>(g.log_level);
    }
    return std::move(res.cfg);
}

qrt::host_context context(const globals& g, const qrt::config& cfg) {
    qrt::host_context ctx;
    ctx.root = g.root;
    ctx.state_dir = cfg.agent.state_dir;
    ctx.journal_dir = cfg.host.journal_dir;
    ctx.lock_wait = std::chrono::seconds(cfg.host.lock_wait_s);
    ctx.dry_run = g.dry_run;
    ctx.json = g.json;
    ctx.slurm = g.slurm;
    ctx.repin = g.repin;
    ctx.topology = g.topology;
    return ctx;
}

qrt::exit_code check_config(const globals& g) {
    rtcore::host_fs fs(g.root, rtcore::host_fs::mode::dry_run);
    const auto online = qrt::read_online_cpus(fs);
    auto res = qrt::load_config_file(g.config_path, {online});
    // The file parsed: check what it names on this host (file:// endpoints).
    qrt::host_config_check host;
    if (res.ok()) {
        host = qrt::check_config_on_host(res.cfg, g.config_path, g.root);
        res.errors.insert(res.errors.end(), host.errors.begin(), host.errors.end());
    }
    if (g.json) {
        nlohmann::json errors = nlohmann::json::array();
        for (const auto& e : res.errors) {
            errors.push_back({{"file", e.file},
                              {"line", e.line},
                              {"column", e.column},
                              {"option", e.option},
                              {"message", e.message},
                              {"text", e.to_string()}});
        }
        nlohmann::json out{{"file", g.config_path},
                           {"ok", res.ok()},
                           {"online_cpus", online ? nlohmann::json(online->to_list()) : nlohmann::json(nullptr)},
                           {"errors", std::move(errors)},
                           {"warnings", host.warnings}};
        if (res.ok()) {
            out["config"] = qrt::config_to_json(res.cfg);
        }
        std::cout << out.dump(2) << '\n';
        return res.ok() ? qrt::exit_code::ok : qrt::exit_code::usage;
    }
    for (const auto& w : host.warnings) {
        std::cerr << g.config_path << ": warning: " << w << '\n';
    }
    if (!res.ok()) {
        return print_config_errors(res);
    }
    std::cout << g.config_path << ": OK (" << res.cfg.qpus.size() << " QPU"
              << (res.cfg.qpus.size() == 1 ? "" : "s") << ")\n";
    return qrt::exit_code::ok;
}

}  // namespace

int main(int argc, char** argv) {
    globals g;
    CLI::App app{"qrtd: real-time host agent for a QPU's classical host.\n"
                 "Partitions CPUs, pins IRQs, dispatches QPU jobs on time, measures itself,\n"
                 "and serves cluster schedulers on a local socket.",
                 "qrtd"};
    app.footer(footer);
    app.set_version_flag("--version", std::string(qrt::version()));
    app.require_subcommand(1);
    app.fallthrough();
    app.add_option("-c,--config", g.config_path, "Configuration file")
        ->capture_default_str();
    app.add_option("--root", g.root,
                   "Root prefix for /proc, /sys and /dev (a fake tree, for tests)")
        ->capture_default_str();
    app.add_option("--state-dir", g.state_dir, "The daemon's state directory (overrides agent.state_dir)");
    app.add_option("--journal-dir", g.journal_dir,
                   "Root-owned restore journal directory (overrides host.journal_dir)");
    app.add_option("--log-level", g.log_level, "Overrides agent.log_level")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));

    auto* run = app.add_subcommand("run", "Run the daemon (as root: apply the partition, restore on exit)");
    run->add_option("--duration-s", g.duration_s, "Stop by itself after this many seconds")
        ->check(CLI::Range(1L, 86400L * 365));
    run->add_option("--topology", g.topology, "system | synthetic:<hwloc description> | xml:<path>");

    auto* host = app.add_subcommand("host", "Host partitioning");
    host->require_subcommand(1);
    host->fallthrough();
    auto* plan = host->add_subcommand("plan", "Show the partition plan and kernel warnings (changes nothing)");
    auto* apply = host->add_subcommand("apply", "Apply the partition (journaled for restore)");
    auto* restore = host->add_subcommand("restore", "Put back every value apply changed, byte for byte");
    auto* verify = host->add_subcommand("verify", "Report drift and re-pin IRQs that moved or appeared");
    for (auto* sub : {plan, apply, restore, verify}) {
        sub->fallthrough();
        sub->add_flag("--json", g.json, "Print the report as JSON");
        sub->add_flag("--dry-run", g.dry_run, "Read the host, change nothing, list the writes");
        sub->add_option("--topology", g.topology,
                        "system | synthetic:<hwloc description> | xml:<path>");
    }

    verify->add_flag("--repin", g.repin,
                     "For a timer or root helper (qrtd-repin.service): re-pin, then exit 0 when "
                     "the host is as applied again or nothing is applied, 1 only for drift left");
    plan->add_flag("--slurm", g.slurm,
                   "Print the slurm.conf, cgroup.conf, gres.conf and plugstack.conf lines that "
                   "keep Slurm's tasks off the isolated CPUs");
    auto* check = app.add_subcommand("check-config", "Validate the configuration file");
    check->add_flag("--json", g.json, "Print errors and the effective configuration as JSON");
    auto* reference = app.add_subcommand("config-reference",
                                         "Print every option as commented TOML, at its default");
    bool roff = false;
    reference->add_flag("--roff", roff, "Print the option list of qrtd.toml(5) in roff instead");

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return rc == 0 ? 0 : static_cast<int>(qrt::exit_code::usage);
    }

    qrt::log::options lopts;
    lopts.fallback = run->parsed() ? qrt::log::style::plain : qrt::log::style::brief;
    if (!g.log_level.empty()) {
        lopts.level = *qrt::enum_from_string<qrt::log_level>(g.log_level);
    }
    qrt::log::init(lopts);

    if (reference->parsed()) {
        std::cout << (roff ? qrt::reference_roff() : qrt::reference_toml());
        return 0;
    }
    if (check->parsed()) {
        return static_cast<int>(check_config(g));
    }
    if (run->parsed()) {
        qrt::run_options ro;
        ro.config_path = g.config_path;
        ro.root = g.root;
        if (!g.state_dir.empty()) {
            ro.state_dir = g.state_dir;
        }
        if (!g.journal_dir.empty()) {
            ro.journal_dir = g.journal_dir;
        }
        if (!g.log_level.empty()) {
            ro.level = *qrt::enum_from_string<qrt::log_level>(g.log_level);
        }
        ro.topology = g.topology;
        if (g.duration_s > 0) {
            ro.duration = std::chrono::seconds(g.duration_s);
        }
        qrt::daemon d(std::move(ro));
        return static_cast<int>(d.run());
    }
    if (auto why = qrt::journal_dir_apart(g.journal_dir, g.state_dir)) {
        std::cerr << "qrtd: --journal-dir: " << *why << '\n';
        return static_cast<int>(qrt::exit_code::usage);
    }
    if (restore->parsed()) {
        // restore must work with a broken or missing config: it only needs
        // the journal directory (and the state directory for the summary).
        qrt::host_context ctx;
        ctx.root = g.root;
        if (auto cfg = load(g, true)) {
            ctx.state_dir = cfg->agent.state_dir;
            ctx.journal_dir = cfg->host.journal_dir;
            ctx.lock_wait = std::chrono::seconds(cfg->host.lock_wait_s);
        } else {
            ctx.state_dir = g.state_dir.empty() ? QRT_DEFAULT_STATE_DIR : g.state_dir;
            ctx.journal_dir = g.journal_dir.empty() ? QRT_DEFAULT_JOURNAL_DIR : g.journal_dir;
            ctx.lock_wait = std::chrono::seconds(qrt::default_config().host.lock_wait_s);
            qrt::log::warn("config", "{} does not load; restoring from {} with the default settings",
                           g.config_path, ctx.journal_dir.string());
        }
        ctx.dry_run = g.dry_run;
        ctx.json = g.json;
        return static_cast<int>(qrt::host_restore(ctx, std::cout));
    }
    auto cfg = load(g);
    if (!cfg) {
        return static_cast<int>(qrt::exit_code::usage);
    }
    qrt::log::set_level(cfg->agent.level);
    const auto ctx = context(g, *cfg);
    if (plan->parsed()) {
        return static_cast<int>(qrt::host_plan(*cfg, ctx, std::cout));
    }
    if (apply->parsed()) {
        return static_cast<int>(qrt::host_apply(*cfg, ctx, std::cout));
    }
    if (verify->parsed()) {
        return static_cast<int>(qrt::host_verify(*cfg, ctx, std::cout));
    }
    return static_cast<int>(qrt::exit_code::usage);
}
