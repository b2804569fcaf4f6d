// qrtctl: the command table and its execution.  Every agent method is a
// subcommand; each entry says which options it takes, how it builds the
// method's params and how the reply is shown to people (--json prints the
// reply itself); the commands live in cmd_*.cpp (commands.hpp).  Errors print the agent's stable reason and exit with the
// status of one table (exit_table), shared with libqrt-client.

#include "qrtctl.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <ostream>
#include <span>

#include "commands.hpp"
#include "connection.hpp"
#include "place_best.hpp"
#include "qrt/proto/protocol.hpp"

namespace qrtctl {

namespace {

// ---- the table: each file's rows (commands.hpp), in --help order
const std::array<std::span<const command>, 8> command_table{{
    agent_commands, calibration_commands, slots_commands, jobs_commands,
    events_commands, telemetry_commands, health_commands, raw_commands,
}};

constexpr std::string_view main_description =
    "qrtctl - control and query qrtd, the QPU host agent, over its UNIX socket\n";

std::string main_footer() {
    return "ENVIRONMENT\n"
           "  QRT_SOCKET   socket path (or tcp://HOST:PORT) when --socket is not given (default " +
           qrt::client::default_socket_path() +
           ")\n"
           "  QRT_MUNGE_SOCKET\n"
           "               for tcp:// agents, the local munged's socket (default "
           "/run/munge/munge.socket.2)\n\n"
           "EXIT STATUS (from the error's data.reason; `qrtctl exit-codes`)\n" +
           exit_table_text() +
           "\nEXAMPLES\n"
           "  qrtctl agent hello\n"
           "  qrtctl slots query --duration 2ms --qpu qpu0\n"
           "  qrtctl slots reserve --duration 2ms --qpu qpu0 -k slurm-$SLURM_JOB_ID --json\n"
           "  qrtctl jobs submit --reservation 42 --fencing-token 7 --payload-file job.bin\n"
           "  qrtctl jobs status 42\n"
           "  qrtctl events --follow\n"
           "  qrtctl health || scontrol update nodename=$(hostname) state=drain reason=qrtd\n"
           "  qrtctl raw slots.query '{\"duration_ns\":1000000}'\n"
           "\nSee qrtctl(1).";
}

}  // namespace

std::vector<exit_row> exit_table() {
    std::vector<exit_row> rows;
    rows.push_back({0, "-", "success"});
    for (const auto& e : qrt::proto::client_reasons) {
        rows.push_back({e.exit_code, std::string(e.name), std::string(e.meaning)});
    }
    for (const auto& e : qrt::proto::reasons) {
        if (e.error) {
            rows.push_back({e.exit_code, std::string(e.name), std::string(e.meaning)});
        }
    }
    rows.push_back({1, "(other)", "a reason this qrtctl does not know"});
    std::stable_sort(rows.begin(), rows.end(),
                     [](const exit_row& a, const exit_row& b) { return a.exit_code < b.exit_code; });
    return rows;
}

std::string exit_table_text() {
    std::string out;
    for (const auto& r : exit_table()) {
        std::array<char, 16> code{};
        std::snprintf(code.data(), code.size(), "%4d", r.exit_code);
        std::string reason = r.reason;
        reason.resize(std::max<std::size_t>(reason.size(), 20), ' ');
        out += std::string(code.data()) + "  " + reason + "  " + r.meaning + "\n";
    }
    return out;
}

int run(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
    options opt;
    given has;
    CLI::App app{std::string(main_description), "qrtctl"};
    app.footer(main_footer());
    app.require_subcommand(1);
    app.fallthrough();
    app.add_option("--socket,-s", opt.sockets,
                   "agent socket (default $QRT_SOCKET or " + qrt::client::default_socket_path() +
                       "), or tcp://HOST:PORT for an agent on another node (MUNGE-authenticated); "
                       "give it several times to `slots reserve` on the best of several agents")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->envname("QRT_SOCKET");
    app.add_flag("--json,-j", opt.json, "print replies (and errors) as one JSON line");
    app.add_option("--timeout", opt.timeout, "per-call timeout (default 5s)");
    app.add_option("--connect-timeout", opt.connect_timeout, "connect timeout (default 2s)");
    app.set_version_flag("--version", "qrtctl " QRTCTL_VERSION);

    std::map<std::string, CLI::App*, std::less<>> groups;
    const std::map<std::string_view, std::string_view> group_summary{
        {"agent", "the agent itself: hello, status"},
        {"qpus", "the host's QPUs"},
        {"calibration", "calibration windows"},
        {"slots", "slot queries and reservations"},
        {"jobs", "jobs: submit, status, result, cancel"},
    };
    const command* chosen = nullptr;
    for (const auto& rows : command_table) {
        for (const auto& c : rows) {
            CLI::App* parent = &app;
            if (!c.group.empty()) {
                auto it = groups.find(c.group);
                if (it == groups.end()) {
                    CLI::App* g = app.add_subcommand(std::string(c.group),
                                                     std::string(group_summary.at(c.group)));
                    g->require_subcommand(1);
                    g->fallthrough();
                    it = groups.emplace(std::string(c.group), g).first;
                }
                parent = it->second;
            }
            CLI::App* sub = parent->add_subcommand(std::string(c.name), std::string(c.help.summary));
            sub->footer("EXAMPLES\n" + std::string(c.help.examples));
            sub->fallthrough();
            c.setup(*sub, opt, has);
            sub->callback([&chosen, &c] { chosen = &c; });
        }
    }
    for (auto& [name, g] : groups) {
        std::string ex;
        for (const auto& rows : command_table) {
            for (const auto& c : rows) {
                if (c.group == name) {
                    ex += c.help.examples;
                }
            }
        }
        g->footer("EXAMPLES\n" + ex);
    }

    std::vector<std::string> args(argv.begin() + (argv.empty() ? 0 : 1), argv.end());
    std::reverse(args.begin(), args.end());  // CLI11 takes them reversed
    try {
        app.parse(args);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e, out, err);
        return e.get_exit_code() == 0 ? code : exit_usage;
    }
    if (chosen == nullptr) {
        err << app.help();
        return exit_usage;
    }
    opt.socket = opt.sockets.empty() ? std::string() : opt.sockets.front();
    context ctx(opt, has, out, err);
    if (opt.sockets.size() > qrt::client::k_max_agents) {
        return ctx.usage("--socket is given " + std::to_string(opt.sockets.size()) +
                         " times; at most 16 agents");
    }
    if (opt.sockets.size() > 1 && !(chosen->group == "slots" && chosen->name == "reserve")) {
        return ctx.usage("several --socket are only for `slots reserve` (multi-agent placement)");
    }
    if (auto bad = ctx.prepare()) {
        return *bad;
    }
    try {
        return chosen->handle(ctx);
    } catch (const std::exception& e) {
        // Only a bug gets here (json type errors on an unexpected reply).
        err << "qrtctl: " << chosen->name << ": " << e.what() << '\n';
        return qrt::client::exit_code_for(qrt::client::local_reason::protocol_error);
    }
}

}  // namespace qrtctl
