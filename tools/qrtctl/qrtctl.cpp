// qrtctl: the command table and its execution.  Every agent method is a
// subcommand; each entry says which options it takes, how it builds the
// method's params and how the reply is shown to people (--json prints the
// reply itself).  Errors print the agent's stable reason and exit with the
// status of one table (exit_table), shared with libqrt-client.

#include "qrtctl.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "base64.hpp"
#include "connection.hpp"
#include "place_best.hpp"
#include "qrt/rpc/errors.hpp"
#include "render.hpp"
#include "units.hpp"
#include "rtcore/unique_fd.hpp"

namespace qrtctl {

namespace {

using qrt::client::call_error;
using qrt::client::connection;

constexpr int exit_ok = 0;
constexpr int exit_usage = 64;

// ------------------------------------------------------------------ options

// Every option of every subcommand (only one subcommand runs per call).
struct options {
    // global
    std::string socket;                // the first --socket
    std::vector<std::string> sockets;  // every --socket (several: multi-agent slots reserve)
    bool json = false;
    std::string timeout = "5s";
    std::string connect_timeout = "2s";
    // slot requests
    std::string duration;
    std::string not_before;
    std::string deadline;
    std::vector<std::string> qpus;
    std::int64_t priority = 0;
    double min_fidelity = 0.0;
    std::int64_t max_candidates = 4;
    std::string idempotency_key;
    std::string lease;
    std::int64_t gang_size = 1;
    // reservations and jobs
    std::uint64_t reservation = 0;
    std::uint64_t fencing_token = 0;
    std::uint64_t job = 0;
    std::string payload_file;
    std::string payload_text;
    std::string output;
    // calibration
    std::string qpu;
    std::string windows_file;
    std::vector<std::string> windows;
    // events
    std::vector<std::string> topics;
    bool follow = false;
    std::int64_t count = 0;
    std::string for_duration = "1s";
    // telemetry
    std::string prefix;
    // health
    bool liveness = false;
    // raw
    std::string raw_method;
    std::string raw_params;
    std::string raw_line;
};

// Which options were given (CLI11 2.1 has no std::optional binding).
// Several subcommands declare the same option; only the one parsed counts.
struct given {
    std::multimap<std::string, CLI::Option*> opts;
    void add(const std::string& name, CLI::Option* o) { opts.emplace(name, o); }
    bool has(const std::string& name) const {
        const auto [first, last] = opts.equal_range(name);
        return std::any_of(first, last, [](const auto& kv) { return kv.second->count() > 0; });
    }
};

// ------------------------------------------------------------------ context

class context {
public:
    context(options& o, given& g, std::ostream& out, std::ostream& err)
        : opt(o), has(g), _out(out), _err(err) {}

    options& opt;
    given& has;

    std::ostream& out() { return _out; }
    std::ostream& err() { return _err; }

    int usage(const std::string& message) {
        _err << "qrtctl: " << message << '\n';
        if (opt.json) {
            print_error_json(call_error{0, EINVAL, "client_error", message, nullptr});
        }
        return exit_usage;
    }

    // The connection, opened on first use.
    connection* conn(int& exit_code) {
        if (_conn) {
            return _conn.get();
        }
        qrt::client::connect_options co;
        co.connect_timeout = std::chrono::milliseconds(_connect_timeout_ns / 1'000'000);
        co.call_timeout = std::chrono::milliseconds(_timeout_ns / 1'000'000);
        const std::string path = qrt::client::resolve_socket_path(opt.socket);
        auto r = connection::open(path, co);
        if (auto* e = std::get_if<call_error>(&r)) {
            exit_code = fail("", *e);
            return nullptr;
        }
        _conn = std::move(std::get<0>(r));
        return _conn.get();
    }

    // Validates the global durations; call once before any command.
    std::optional<int> prepare() {
        auto t = parse_duration_ns(opt.timeout);
        auto ct = parse_duration_ns(opt.connect_timeout);
        if (!t.value || *t.value < 1'000'000) {
            return usage("--timeout " + (t.value ? opt.timeout + " is under 1ms" : t.error));
        }
        if (!ct.value || *ct.value < 1'000'000) {
            return usage("--connect-timeout " +
                         (ct.value ? opt.connect_timeout + " is under 1ms" : ct.error));
        }
        _timeout_ns = *t.value;
        _connect_timeout_ns = *ct.value;
        return std::nullopt;
    }

    // Print an error (stderr always; stdout as JSON with --json) and return
    // its exit status.
    int fail(std::string_view method, const call_error& e) {
        _err << "qrtctl: ";
        if (!method.empty()) {
            _err << method << ": ";
        }
        _err << e.message;
        if (!e.is_local() || e.reason != qrt::client::local_reason::unreachable) {
            _err << " (" << e.reason;
            if (!e.is_local()) {
                _err << ", code " << e.code;
            }
            _err << ")";
        }
        if (e.data.is_object() && e.data.contains("field")) {
            _err << " [field " << qrtctl::show(e.data["field"], shown_as::text) << "]";
        }
        _err << '\n';
        if (opt.json) {
            print_error_json(e);
        }
        return qrt::client::exit_code_for(e.reason);
    }

    // One call: the result, or the exit status after reporting the error.
    std::optional<json> call(std::string_view method, const json& params, int& exit_code) {
        connection* c = conn(exit_code);
        if (c == nullptr) {
            return std::nullopt;
        }
        auto r = c->call(method, params);
        if (!r) {
            exit_code = fail(method, r.error());
            return std::nullopt;
        }
        return std::move(r).result();
    }

    // Call and print: --json prints the result, otherwise `human` does.
    int call_and_show(std::string_view method, const json& params,
                      const std::function<void(const json&)>& human) {
        int rc = exit_ok;
        auto res = call(method, params, rc);
        if (!res) {
            return rc;
        }
        if (opt.json) {
            print_json(*res);
        } else {
            human(*res);
        }
        return exit_ok;
    }

    void print_json(const json& j) {
        _out << j.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
    }

    std::int64_t timeout_ns() const noexcept { return _timeout_ns; }

    // slots reserve with several --socket: hold on every agent at once, keep
    // the earliest start, release the others (qrt::client::place_best).
    int place_best(const json& params) {
        qrt::client::connect_options co;
        co.connect_timeout = std::chrono::milliseconds(_connect_timeout_ns / 1'000'000);
        co.call_timeout = std::chrono::milliseconds(_timeout_ns / 1'000'000);
        std::vector<std::unique_ptr<connection>> owned(opt.sockets.size());
        std::vector<connection*> agents(opt.sockets.size(), nullptr);
        std::vector<std::optional<call_error>> unreachable(opt.sockets.size());
        for (std::size_t i = 0; i < opt.sockets.size(); ++i) {
            auto r = connection::open(opt.sockets[i], co);
            if (auto* e = std::get_if<call_error>(&r)) {
                unreachable[i] = *e;
                continue;
            }
            owned[i] = std::move(std::get<0>(r));
            agents[i] = owned[i].get();
        }
        std::vector<connection*> live;
        std::vector<std::size_t> index;
        for (std::size_t i = 0; i < agents.size(); ++i) {
            if (agents[i] != nullptr) {
                live.push_back(agents[i]);
                index.push_back(i);
            }
        }
        const qrt::client::placement p = qrt::client::place_best(live, params);
        std::vector<std::optional<call_error>> errors = unreachable;
        for (std::size_t k = 0; k < index.size(); ++k) {
            errors[index[k]] = p.errors[k];
        }
        for (std::size_t i = 0; i < errors.size(); ++i) {
            if (errors[i]) {
                _err << "qrtctl: " << opt.sockets[i] << ": slots.reserve: " << errors[i]->message
                     << " (" << errors[i]->reason << ")\n";
            }
        }
        if (p.chosen == qrt::client::placement::none) {
            const call_error* first = nullptr;
            for (const auto& e : errors) {
                if (e && (first == nullptr || (first->is_local() && !e->is_local()))) {
                    first = &*e;
                }
            }
            return fail("slots.reserve", *first);
        }
        const std::size_t winner = index[p.chosen];
        if (opt.json) {
            json agents_json = json::array();
            for (std::size_t i = 0; i < errors.size(); ++i) {
                agents_json.push_back(json{{"socket", opt.sockets[i]},
                                           {"held", !errors[i].has_value()},
                                           {"reason", errors[i] ? errors[i]->reason : ""}});
            }
            print_json(json{{"socket", opt.sockets[winner]},
                            {"chosen", winner},
                            {"reservation", p.reservation},
                            {"agents", agents_json}});
        } else {
            _out << "socket          " << opt.sockets[winner] << " (best of "
                 << opt.sockets.size() << ")\n";
            show_reserved(p.reservation);
        }
        return exit_ok;
    }
    std::function<void(const json&)> show_reserved;  // the human rendering (show_reservation)

private:
    void print_error_json(const call_error& e) {
        json err{{"code", e.code}, {"reason", e.reason}, {"message", e.message},
                 {"exit_code", qrt::client::exit_code_for(e.reason)}};
        if (!e.data.is_null()) {
            err["data"] = e.data;
        }
        if (e.is_local()) {
            err["errno"] = e.sys_errno;
        }
        print_json(json{{"error", std::move(err)}});
    }

    std::ostream& _out;
    std::ostream& _err;
    std::unique_ptr<connection> _conn;
    std::int64_t _timeout_ns = 5'000'000'000;
    std::int64_t _connect_timeout_ns = 2'000'000'000;
};

// ------------------------------------------------------------------ shapes

constexpr std::array<column, 17> reservation_fields{{
    {"reservation", "reservation_id"},
    {"state", "state"},
    {"reason", "reason"},
    {"tenant", "tenant"},
    {"qpu", "qpu"},
    {"start", "start_ns", shown_as::time},
    {"end", "end_ns", shown_as::time},
    {"duration", "duration_ns", shown_as::duration},
    {"calibration_id", "calibration_id"},
    {"fencing_token", "fencing_token"},
    {"lease_expires", "lease_expires_ns", shown_as::time},
    {"idempotency_key", "idempotency_key"},
    {"priority", "priority"},
    {"not_before", "not_before_ns", shown_as::time},
    {"deadline", "deadline_ns", shown_as::time},
    {"payload_bytes", "payload_bytes"},
    {"has_result", "has_result", shown_as::yes_no},
}};

constexpr std::array<column, 7> candidate_columns{{
    {"QPU", "qpu"},
    {"START", "start_ns", shown_as::time},
    {"END", "end_ns", shown_as::time},
    {"CALIBRATION", "calibration_id"},
    {"CAL_AGE", "calibration_age_ns", shown_as::duration},
    {"FIDELITY", "predicted_fidelity", shown_as::fixed3},
    {"SCORE", "score", shown_as::fixed3},
}};

constexpr std::array<column, 6> window_columns{{
    {"CALIBRATION", "calibration_id"},
    {"VALID_FROM", "valid_from_ns", shown_as::time},
    {"VALID_UNTIL", "valid_until_ns", shown_as::time},
    {"QPU", "qpu"},
    {"F0", "f0", shown_as::fixed3},
    {"TAU", "tau_ns", shown_as::duration},
}};

constexpr std::array<column, 4> method_columns{{
    {"METHOD", "name"},
    {"ROLE", "role"},
    {"ALLOWED", "allowed", shown_as::yes_no},
    {"SUMMARY", "summary"},
}};

constexpr std::array<column, 7> hello_fields{{
    {"agent", "agent"},
    {"agent_version", "agent_version"},
    {"api_version", "api_version"},
    {"tenant", "peer.tenant"},
    {"uid", "peer.uid"},
    {"roles", "peer.roles", shown_as::list},
    {"max_line_bytes", "limits.max_line_bytes"},
}};

constexpr std::array<column, 7> result_fields{{
    {"job", "job_id"},
    {"state", "state"},
    {"reason", "reason"},
    {"sent", "sent_ns", shown_as::time},
    {"updated", "updated_ns", shown_as::time},
    {"result_bytes", "result_bytes"},
    {"result", "result"},
}};

// ------------------------------------------------------------------ helpers

// Adds a parsed time/duration to params, or fails with a usage message.
bool put_duration(context& ctx, json& params, const char* key, const std::string& option,
                  const std::string& text, std::string& problem) {
    auto d = parse_duration_ns(text);
    if (!d.value) {
        problem = option + " " + d.error;
        return false;
    }
    params[key] = *d.value;
    (void)ctx;
    return true;
}

bool put_time(json& params, const char* key, const std::string& option, const std::string& text,
              std::string& problem) {
    auto t = parse_time_ns(text, realtime_now_ns());
    if (!t.value) {
        problem = option + " " + t.error;
        return false;
    }
    params[key] = *t.value;
    return true;
}

// The request fields shared by slots query/reserve and one-shot submit.
std::optional<json> request_params(context& ctx, int& rc) {
    json p = json::object();
    std::string problem;
    if (!ctx.has.has("--duration")) {
        rc = ctx.usage("--duration is required (e.g. --duration 2ms)");
        return std::nullopt;
    }
    if (!put_duration(ctx, p, "duration_ns", "--duration", ctx.opt.duration, problem) ||
        (ctx.has.has("--not-before") &&
         !put_time(p, "not_before_ns", "--not-before", ctx.opt.not_before, problem)) ||
        (ctx.has.has("--deadline") &&
         !put_time(p, "deadline_ns", "--deadline", ctx.opt.deadline, problem))) {
        rc = ctx.usage(problem);
        return std::nullopt;
    }
    if (p["duration_ns"].get<std::int64_t>() <= 0) {
        rc = ctx.usage("--duration must be greater than zero");
        return std::nullopt;
    }
    if (!ctx.opt.qpus.empty()) {
        p["qpus"] = ctx.opt.qpus;
    }
    if (ctx.has.has("--priority")) {
        p["priority"] = ctx.opt.priority;
    }
    if (ctx.has.has("--min-fidelity")) {
        p["min_fidelity"] = ctx.opt.min_fidelity;
    }
    return p;
}

std::string generated_key() {
    std::array<char, 256> host{};
    if (::gethostname(host.data(), host.size() - 1) != 0) {
        host[0] = '\0';
    }
    return std::string("qrtctl-") + host.data() + "-" + std::to_string(::getpid()) + "-" +
           std::to_string(realtime_now_ns());
}

std::optional<std::string> read_file(const std::string& path, std::string& problem) {
    // Standard input stays open; a file is closed on return.
    const rtcore::unique_fd file(path == "-" ? -1 : ::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    const int fd = path == "-" ? STDIN_FILENO : file.get();
    if (fd < 0) {
        const int err = errno;
        problem = "cannot open " + path + ": " + std::strerror(err);
        return std::nullopt;
    }
    std::string data;
    std::array<char, 65536> buf{};
    for (;;) {
        const ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n > 0) {
            data.append(buf.data(), static_cast<std::size_t>(n));
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            const int err = errno;
            problem = "cannot read " + path + ": " + std::strerror(err);
        }
        break;
    }
    if (!problem.empty()) {
        return std::nullopt;
    }
    return data;
}

void show_reservation(context& ctx, const json& r) {
    if (r.contains("gang") && r["gang"].is_array()) {
        for (const auto& m : r["gang"]) {
            ctx.out() << render_fields(m, reservation_fields) << '\n';
        }
        return;
    }
    ctx.out() << render_fields(r, reservation_fields);
}

// One event, one line: SEQ TIME TYPE key=value...
std::string event_line(const json& ev) {
    std::string line = show(ev.value("seq", json()), shown_as::text);
    const json& data = ev.contains("data") ? ev["data"] : json::object();
    const json& t = data.is_object() && data.contains("time_ns") ? data["time_ns"] : json();
    line += "  " + show(t, shown_as::time);
    line += "  " + show(ev.value("type", json()), shown_as::text);
    if (data.is_object()) {
        for (const auto& [k, v] : data.items()) {
            if (k == "time_ns") {
                continue;
            }
            const bool is_time = k.size() > 3 && k.compare(k.size() - 3, 3, "_ns") == 0 &&
                                 k.find("start") != std::string::npos;
            line += "  " + k + "=" + show(v, is_time ? shown_as::time : shown_as::list);
        }
    }
    return line;
}

// A window "ID,FROM,UNTIL[,F0[,TAU]]" (times in the time syntax, TAU a
// duration).
std::optional<json> parse_window(const std::string& text, std::string& problem) {
    std::vector<std::string> parts;
    std::stringstream ss(text);
    std::string part;
    while (std::getline(ss, part, ',')) {
        parts.push_back(part);
    }
    if (parts.size() < 3 || parts.size() > 5) {
        problem = "--window '" + text + "' is not ID,FROM,UNTIL[,F0[,TAU]]";
        return std::nullopt;
    }
    json w = json::object();
    auto id = parse_duration_ns(parts[0]);  // a bare integer parses as ns
    if (!id.value || parts[0].find_first_not_of("0123456789") != std::string::npos) {
        problem = "--window '" + text + "': calibration id '" + parts[0] + "' is not an integer";
        return std::nullopt;
    }
    w["calibration_id"] = *id.value;
    const std::int64_t now = realtime_now_ns();
    auto from = parse_time_ns(parts[1], now);
    auto until = parse_time_ns(parts[2], now);
    if (!from.value || !until.value) {
        problem = "--window '" + text + "': " + (from.value ? until.error : from.error);
        return std::nullopt;
    }
    w["valid_from_ns"] = *from.value;
    w["valid_until_ns"] = *until.value;
    if (parts.size() >= 4) {
        try {
            std::size_t used = 0;
            const double f0 = std::stod(parts[3], &used);
            if (used != parts[3].size()) {
                throw std::invalid_argument("trailing");
            }
            w["f0"] = f0;
        } catch (const std::exception&) {
            problem = "--window '" + text + "': f0 '" + parts[3] + "' is not a number";
            return std::nullopt;
        }
    }
    if (parts.size() == 5) {
        auto tau = parse_duration_ns(parts[4]);
        if (!tau.value) {
            problem = "--window '" + text + "': tau " + tau.error;
            return std::nullopt;
        }
        w["tau_ns"] = *tau.value;
    }
    return w;
}

// The agent's health verdict from agent.status: (healthy, reasons).
std::pair<bool, std::vector<std::string>> judge_health(const json& status) {
    std::vector<std::string> reasons;
    const auto collect = [&](const json& list) {
        if (!list.is_array()) {
            return;
        }
        for (const auto& r : list) {
            if (r.is_string()) {
                reasons.push_back(r.get<std::string>());
            } else if (r.is_object() && r.contains("message")) {
                reasons.push_back(show(r["message"], shown_as::text));
            } else {
                reasons.push_back(r.dump());
            }
        }
    };
    const auto healthy_word = [](const std::string& s) {
        return s == "ok" || s == "healthy" || s == "ready";
    };
    if (!status.is_object() || !status.contains("health")) {
        return {false, {"agent.status carries no 'health' member"}};
    }
    const json& h = status["health"];
    if (h.is_string()) {
        const auto s = h.get<std::string>();
        if (!healthy_word(s)) {
            reasons.push_back("health is '" + s + "'");
        }
        return {healthy_word(s), reasons};
    }
    if (h.is_boolean()) {
        return {h.get<bool>(), h.get<bool>() ? reasons : std::vector<std::string>{"health is false"}};
    }
    if (h.is_object()) {
        bool ok = false;
        if (h.contains("ok") && h["ok"].is_boolean()) {
            ok = h["ok"].get<bool>();
        } else {
            const json& s = h.contains("status") ? h["status"] : h.contains("state") ? h["state"] : json();
            ok = s.is_string() && healthy_word(s.get<std::string>());
            if (!ok) {
                reasons.push_back("health is '" + show(s, shown_as::text) + "'");
            }
        }
        for (const char* key : {"reasons", "problems", "degraded", "errors"}) {
            if (h.contains(key)) {
                collect(h[key]);
            }
        }
        return {ok, reasons};
    }
    return {false, {"agent.status 'health' has an unexpected form: " + h.dump()}};
}

// ------------------------------------------------------------------ commands

// A command's help: its one-line summary and its EXAMPLES footer.
struct command_help {
    std::string_view summary;
    std::string_view examples;
};

using setup_fn = void (*)(CLI::App&, options&, given&);
using handler_fn = int (*)(context&);

struct command {
    std::string_view group;  // "" for a top-level command
    std::string_view name;
    command_help help;
    setup_fn setup;     // declares the command's options
    handler_fn handle;  // runs it; returns the exit status
};

// ---- options shared by several commands

void no_options(CLI::App&, options&, given&) {}

void request_options(CLI::App& app, options& o, given& g) {
    g.add("--duration", app.add_option("--duration", o.duration,
                                          "slot length, e.g. 2ms, 500us, 1.5s (required)"));
    g.add("--qpu", app.add_option("--qpu", o.qpus, "restrict to this QPU (repeatable)"));
    g.add("--not-before", app.add_option(
        "--not-before", o.not_before, "earliest start: now, +30s, ns since epoch, or ISO 8601 UTC"));
    g.add("--deadline", app.add_option("--deadline", o.deadline,
                                          "latest end (same forms as --not-before)"));
    g.add("--priority", app.add_option("--priority", o.priority, "priority (higher first)"));
    g.add("--min-fidelity", app.add_option("--min-fidelity", o.min_fidelity,
                                              "minimum predicted fidelity at start, 0..1")
                                   ->check(CLI::Range(0.0, 1.0)));
}

void reservation_options(CLI::App& app, options& o, given& g, bool required) {
    auto* r = app.add_option("--reservation,-r", o.reservation, "reservation id");
    auto* t = app.add_option("--fencing-token,-t", o.fencing_token,
                             "the fencing token slots reserve returned");
    if (required) {
        r->required();
        t->required();
    }
    g.add("--reservation", r);
    g.add("--fencing-token", t);
}

void held_reservation_options(CLI::App& app, options& o, given& g) {
    reservation_options(app, o, g, true);
}

void job_option(CLI::App& app, options& o, given& g) {
    g.add("job", app.add_option("job,--job", o.job, "job id (= its reservation id)")->required());
}

void gang_size_option(CLI::App& app, options& o, given& g, const std::string& what) {
    g.add("--gang-size",
          app.add_option("--gang-size", o.gang_size, what + " (1..64)")->check(CLI::Range(1, 64)));
}

void idempotency_key_option(CLI::App& app, options& o, given& g, const std::string& what) {
    g.add("--idempotency-key", app.add_option("--idempotency-key,-k", o.idempotency_key, what));
}

// ---- calls shared by several commands

// A method on a held reservation ({reservation_id, fencing_token}).
int call_on_reservation(context& ctx, std::string_view method) {
    return ctx.call_and_show(
        method,
        json{{"reservation_id", ctx.opt.reservation}, {"fencing_token", ctx.opt.fencing_token}},
        [&](const json& r) { show_reservation(ctx, r); });
}

// A method on a job ({job_id}) that answers with the reservation.
int call_on_job(context& ctx, std::string_view method) {
    return ctx.call_and_show(method, json{{"job_id", ctx.opt.job}},
                             [&](const json& r) { show_reservation(ctx, r); });
}

// The key given with --idempotency-key, or a generated one.
std::string idempotency_key(const context& ctx) {
    return ctx.has.has("--idempotency-key") ? ctx.opt.idempotency_key : generated_key();
}

// ---- agent

constexpr command_help agent_hello_help{
    "API version, agent version, your roles and the methods",
    "  qrtctl agent hello\n  qrtctl agent hello --json | jq .allowed\n"};

int agent_hello(context& ctx) {
    return ctx.call_and_show("agent.hello", json{{"client", "qrtctl"}}, [&](const json& r) {
        ctx.out() << render_fields(r, hello_fields) << '\n';
        ctx.out() << make_table(r.value("methods", json::array()), method_columns).render();
    });
}

constexpr command_help agent_status_help{
    "partition, IRQs, kernel, probes, QPUs and health",
    "  qrtctl agent status\n  qrtctl agent status --json | jq .health\n"};

int agent_status(context& ctx) {
    return ctx.call_and_show("agent.status", json::object(),
                             [&](const json& r) { ctx.out() << render_flat(r); });
}

// ---- qpus

constexpr command_help qpus_list_help{
    "the QPUs of this host and the placement policy",
    "  qrtctl qpus list\n  qrtctl qpus list --json | jq -r '.qpus[].name'\n"};

// One row per QPU: its scalars, with the device facts and the window in
// force folded into a column each (--json keeps the objects).
json qpu_rows(const json& qpus) {
    json rows = json::array();
    for (const auto& q : qpus) {
        if (!q.is_object()) {
            continue;
        }
        json row = json::object();
        for (const auto& [k, v] : q.items()) {
            if (!v.is_object() && !v.is_array() && k != "window" && k != "device") {
                row[k] = v;
            }
        }
        const json& dev = q.contains("device") ? q.at("device") : json();
        row["qubits"] = dev.is_object() ? dev.value("qubits", json()) : json("-");
        const json& w = q.contains("window") ? q.at("window") : json();
        row["window"] = w.is_object() ? json("id " + std::to_string(w.value("calibration_id", std::uint64_t{0}))) : json("blackout");
        rows.push_back(std::move(row));
    }
    return rows;
}

int qpus_list(context& ctx) {
    return ctx.call_and_show("qpus.list", json::object(), [&](const json& r) {
        ctx.out() << make_table_auto(qpu_rows(r.value("qpus", json::array()))).render();
        ctx.out() << "policy: " << show(r.value("policy", json()), shown_as::text) << '\n';
    });
}

// ---- calibration

constexpr command_help calibration_get_help{"a QPU's calibration windows from now on",
                                            "  qrtctl calibration get --qpu qpu0\n"};

void calibration_get_options(CLI::App& app, options& o, given&) {
    app.add_option("--qpu", o.qpu, "QPU name")->required();
}

int calibration_get(context& ctx) {
    return ctx.call_and_show("calibration.get", json{{"qpu", ctx.opt.qpu}}, [&](const json& r) {
        ctx.out() << make_table(r.value("windows", json::array()), window_columns).render();
    });
}

constexpr command_help calibration_update_help{
    "replace a QPU's pushed windows from now on (role calibration)",
    "  qrtctl calibration update --qpu qpu0 --window 7,+1s,+10m,0.99,1h\n"
    "  qrtctl calibration update --qpu qpu0 --windows-file windows.json\n"
    "    (windows.json: [{\"calibration_id\":7,\"valid_from_ns\":...,\"valid_until_ns\":...}])\n"};

void calibration_update_options(CLI::App& app, options& o, given& g) {
    app.add_option("--qpu", o.qpu, "QPU name")->required();
    g.add("--window", app.add_option(
        "--window", o.windows,
        "ID,FROM,UNTIL[,F0[,TAU]]: FROM/UNTIL as --not-before, TAU a duration (repeatable)"));
    g.add("--windows-file", app.add_option(
        "--windows-file", o.windows_file, "a JSON array of window objects ('-': stdin)"));
}

int calibration_update(context& ctx) {
    json windows = json::array();
    std::string problem;
    if (ctx.has.has("--windows-file") == ctx.has.has("--window")) {
        return ctx.usage("give either --window (repeatable) or --windows-file");
    }
    if (ctx.has.has("--windows-file")) {
        auto text = read_file(ctx.opt.windows_file, problem);
        if (!text) {
            return ctx.usage(problem);
        }
        windows = json::parse(*text, nullptr, false);
        if (windows.is_discarded() || !windows.is_array()) {
            return ctx.usage(ctx.opt.windows_file + " does not hold a JSON array");
        }
    } else {
        for (const auto& w : ctx.opt.windows) {
            auto parsed = parse_window(w, problem);
            if (!parsed) {
                return ctx.usage(problem);
            }
            windows.push_back(std::move(*parsed));
        }
    }
    return ctx.call_and_show("calibration.update", json{{"qpu", ctx.opt.qpu}, {"windows", windows}},
                             [&](const json& r) { ctx.out() << render_flat(r); });
}

// ---- slots

constexpr command_help slots_query_help{
    "candidate slots for a request (or the next window when none fits)",
    "  qrtctl slots query --duration 2ms --qpu qpu0\n"
    "  qrtctl slots query --duration 500us --not-before +1s --deadline +10s --max-candidates 8\n"
    "  qrtctl slots query --duration 2ms --min-fidelity 0.98 --json\n"
    "  qrtctl slots query --duration 1ms --gang-size 2   (one start on 2 QPUs)\n"};

void slots_query_options(CLI::App& app, options& o, given& g) {
    request_options(app, o, g);
    g.add("--max-candidates",
          app.add_option("--max-candidates", o.max_candidates, "how many candidates (1..64)")
              ->check(CLI::Range(1, 64)));
    gang_size_option(app, o, g, "the gang a reserve of this size would take now");
}

int slots_query(context& ctx) {
    int rc = exit_ok;
    auto p = request_params(ctx, rc);
    if (!p) {
        return rc;
    }
    if (ctx.has.has("--max-candidates")) {
        (*p)["max_candidates"] = ctx.opt.max_candidates;
    }
    if (ctx.has.has("--gang-size")) {
        (*p)["gang_size"] = ctx.opt.gang_size;
    }
    return ctx.call_and_show("slots.query", *p, [&](const json& r) {
        const json& cands = r.value("candidates", json::array());
        if (!cands.empty()) {
            ctx.out() << make_table(cands, candidate_columns).render();
            return;
        }
        ctx.out() << "no slot fits: " << show(r.value("why_none", json()), shown_as::text) << '\n';
        if (r.contains("next_window")) {
            ctx.out() << "next window:\n"
                      << make_table(json::array({r["next_window"]}), window_columns).render();
        }
    });
}

constexpr command_help slots_reserve_help{
    "hold a slot under a lease; prints the id and fencing token",
    "  qrtctl slots reserve --duration 2ms --qpu qpu0 --idempotency-key slurm-$SLURM_JOB_ID\n"
    "  qrtctl slots reserve --duration 1ms --lease 60s --deadline +5m --json\n"
    "  qrtctl slots reserve --duration 1ms --gang-size 2   (one start on 2 QPUs)\n"
    "  qrtctl -s /run/qrtd/a.sock -s /run/qrtd/b.sock slots reserve --duration 1ms -k job-7\n"
    "      (the best of several agents: held on each, earliest start kept, others released)\n"};

void slots_reserve_options(CLI::App& app, options& o, given& g) {
    request_options(app, o, g);
    idempotency_key_option(app, o, g,
                           "retry-safe key (default: generated; pass the scheduler's job id)");
    g.add("--lease",
          app.add_option("--lease", o.lease, "lease length, e.g. 30s (default: the agent's)"));
    gang_size_option(app, o, g, "reserve one start on this many QPUs");
}

int slots_reserve(context& ctx) {
    int rc = exit_ok;
    auto p = request_params(ctx, rc);
    if (!p) {
        return rc;
    }
    (*p)["idempotency_key"] = idempotency_key(ctx);
    std::string problem;
    if (ctx.has.has("--lease") &&
        !put_duration(ctx, *p, "lease_ns", "--lease", ctx.opt.lease, problem)) {
        return ctx.usage(problem);
    }
    if (ctx.has.has("--gang-size")) {
        (*p)["gang_size"] = ctx.opt.gang_size;
    }
    if (ctx.opt.sockets.size() > 1) {
        ctx.show_reserved = [&](const json& r) { show_reservation(ctx, r); };
        return ctx.place_best(*p);
    }
    return ctx.call_and_show("slots.reserve", *p, [&](const json& r) { show_reservation(ctx, r); });
}

constexpr command_help slots_heartbeat_help{
    "extend a held reservation's lease",
    "  qrtctl slots heartbeat --reservation 42 --fencing-token 7\n"};

int slots_heartbeat(context& ctx) { return call_on_reservation(ctx, "slots.heartbeat"); }

constexpr command_help slots_release_help{
    "give a held reservation back", "  qrtctl slots release --reservation 42 --fencing-token 7\n"};

int slots_release(context& ctx) { return call_on_reservation(ctx, "slots.release"); }

// ---- jobs

constexpr command_help jobs_submit_help{
    "commit a payload into a held reservation, or place and commit in one step",
    "  qrtctl jobs submit --reservation 42 --fencing-token 7 --payload-file circuit.bin\n"
    "  qrtctl jobs submit --duration 2ms --qpu qpu0 --idempotency-key run-17 --payload-file -\n"
    "  qrtctl jobs submit -r 42 -t 7 --payload 'text payload'\n"};

void jobs_submit_options(CLI::App& app, options& o, given& g) {
    reservation_options(app, o, g, false);
    request_options(app, o, g);
    idempotency_key_option(app, o, g, "one-shot submit: retry-safe key (default: generated)");
    g.add("--payload-file",
          app.add_option("--payload-file,-f", o.payload_file, "payload bytes ('-': stdin)"));
    g.add("--payload", app.add_option("--payload", o.payload_text, "payload as text"));
}

// jobs.submit's target: the held reservation, or a one-shot request.
std::optional<json> submit_target(context& ctx, int& rc) {
    if (ctx.has.has("--reservation")) {
        if (!ctx.has.has("--fencing-token")) {
            rc = ctx.usage("--reservation needs --fencing-token (from slots reserve)");
            return std::nullopt;
        }
        for (const char* f : {"--duration", "--qpu", "--not-before", "--deadline", "--priority",
                              "--min-fidelity", "--idempotency-key"}) {
            if (ctx.has.has(f)) {
                rc = ctx.usage(std::string(f) +
                               " does not go with --reservation (the reservation fixes the slot)");
                return std::nullopt;
            }
        }
        return json{{"reservation_id", ctx.opt.reservation},
                    {"fencing_token", ctx.opt.fencing_token}};
    }
    if (ctx.has.has("--fencing-token")) {
        rc = ctx.usage("--fencing-token needs --reservation");
        return std::nullopt;
    }
    auto req = request_params(ctx, rc);
    if (req) {
        (*req)["idempotency_key"] = idempotency_key(ctx);
    }
    return req;
}

int jobs_submit(context& ctx) {
    std::string problem;
    if (ctx.has.has("--payload-file") == ctx.has.has("--payload")) {
        return ctx.usage("give exactly one of --payload-file and --payload");
    }
    std::string payload = ctx.opt.payload_text;
    if (ctx.has.has("--payload-file")) {
        auto bytes = read_file(ctx.opt.payload_file, problem);
        if (!bytes) {
            return ctx.usage(problem);
        }
        payload = std::move(*bytes);
    }
    int rc = exit_ok;
    auto p = submit_target(ctx, rc);
    if (!p) {
        return rc;
    }
    (*p)["payload"] = qrt::client::base64_encode(payload);
    return ctx.call_and_show("jobs.submit", *p, [&](const json& r) { show_reservation(ctx, r); });
}

constexpr command_help jobs_status_help{
    "a job's (reservation's) state",
    "  qrtctl jobs status 42\n  qrtctl jobs status 42 --json | jq -r .state\n"};

int jobs_status(context& ctx) { return call_on_job(ctx, "jobs.status"); }

constexpr command_help jobs_result_help{
    "a finished job's result",
    "  qrtctl jobs result 42\n  qrtctl jobs result 42 --output result.bin\n"
    "  qrtctl jobs result 42 --output - | xxd\n"};

void jobs_result_options(CLI::App& app, options& o, given& g) {
    job_option(app, o, g);
    g.add("--output", app.add_option("--output,-o", o.output,
                                        "write the decoded result here ('-': stdout)"));
}

// Writes the decoded result to --output; nullopt when the caller goes on.
std::optional<int> write_result(context& ctx, const json& res) {
    auto bytes = qrt::client::base64_decode(res.value("result", std::string()));
    if (!bytes) {
        return ctx.fail("jobs.result", call_error{0, EPROTO, "protocol_error",
                                                  "the result is not valid base64", nullptr});
    }
    if (ctx.opt.output == "-") {
        ctx.out().write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
        ctx.out().flush();
        return exit_ok;
    }
    std::ofstream f(ctx.opt.output, std::ios::binary | std::ios::trunc);
    f.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    f.close();
    if (!f) {
        return ctx.usage("cannot write " + ctx.opt.output + ": " + std::strerror(errno));
    }
    return std::nullopt;
}

int jobs_result(context& ctx) {
    int rc = exit_ok;
    auto res = ctx.call("jobs.result", json{{"job_id", ctx.opt.job}}, rc);
    if (!res) {
        return rc;
    }
    if (ctx.has.has("--output")) {
        if (auto done = write_result(ctx, *res)) {
            return *done;
        }
    }
    if (ctx.opt.json) {
        ctx.print_json(*res);
    } else if (ctx.opt.output != "-") {
        ctx.out() << render_fields(*res, result_fields);
    }
    return exit_ok;
}

constexpr command_help jobs_cancel_help{"cancel a committed job before dispatch",
                                        "  qrtctl jobs cancel 42\n"};

int jobs_cancel(context& ctx) { return call_on_job(ctx, "jobs.cancel"); }

// ---- events

constexpr command_help events_help{
    "subscribe to events: reservation displaced/expired, calibration changed, job "
    "dispatched/finished",
    "  qrtctl events --follow                      stream until interrupted\n"
    "  qrtctl events --follow --topic job.finished --count 1\n"
    "  qrtctl events --for 10s --json              JSON lines for 10 s\n"};

void events_options(CLI::App& app, options& o, given& g) {
    app.add_option("--topic", o.topics, "only this event type (repeatable)");
    app.add_flag("--follow,-f", o.follow, "keep printing events until interrupted");
    g.add("--count", app.add_option("--count,-n", o.count, "stop after this many events")
                         ->check(CLI::PositiveNumber));
    g.add("--for", app.add_option("--for", o.for_duration,
                                     "without --follow: wait this long (default 1s)"));
}

// Prints the events that come on c until --count, or --for ends (never with
// --follow).
int print_events(context& ctx, connection& c, std::int64_t window_ns) {
    const auto stop_at = std::chrono::steady_clock::now() + std::chrono::nanoseconds(window_ns);
    std::int64_t seen = 0;
    for (;;) {
        if (ctx.has.has("--count") && seen >= ctx.opt.count) {
            return exit_ok;
        }
        auto wait = std::chrono::milliseconds(-1);
        if (!ctx.opt.follow) {
            wait = std::chrono::duration_cast<std::chrono::milliseconds>(
                stop_at - std::chrono::steady_clock::now());
            if (wait.count() <= 0) {
                return exit_ok;
            }
        }
        auto ev = c.next_notification(wait);
        if (auto* e = std::get_if<call_error>(&ev)) {
            return ctx.fail("events", *e);
        }
        auto& got = std::get<0>(ev);
        if (!got) {
            continue;  // the window ended: checked at the top
        }
        ++seen;
        if (ctx.opt.json) {
            ctx.print_json(*got);
        } else {
            ctx.out() << event_line(*got) << '\n';
        }
        ctx.out().flush();
    }
}

int events(context& ctx) {
    auto window = parse_duration_ns(ctx.opt.for_duration);
    if (!window.value) {
        return ctx.usage("--for " + window.error);
    }
    json params = json::object();
    if (!ctx.opt.topics.empty()) {
        params["topics"] = ctx.opt.topics;
    }
    int rc = exit_ok;
    auto sub = ctx.call("events.subscribe", params, rc);
    if (!sub) {
        return rc;
    }
    // The subscription first (JSON: its own line), so a script knows events
    // from here on will be seen.
    if (ctx.opt.json) {
        ctx.print_json(*sub);
    } else {
        ctx.out() << "subscribed (" << show(sub->value("scope", json()), shown_as::text)
                  << "): " << show(sub->value("topics", json()), shown_as::list) << '\n';
    }
    ctx.out().flush();
    return print_events(ctx, *ctx.conn(rc), *window.value);
}

// ---- telemetry, metrics

constexpr command_help telemetry_help{
    "histograms, counters and gauges (telemetry.snapshot)",
    "  qrtctl telemetry\n  qrtctl telemetry --prefix qrt_rpc_ --json\n"};

void telemetry_options(CLI::App& app, options& o, given& g) {
    g.add("--prefix",
          app.add_option("--prefix", o.prefix, "only metrics whose name starts so"));
}

int telemetry(context& ctx) {
    static constexpr std::array<column, 3> metric_cols{
        {{"NAME", "name"}, {"LABELS", "labels"}, {"VALUE", "value"}}};
    static constexpr std::array<column, 7> hist_cols{{{"NAME", "name"},
                                                      {"LABELS", "labels"},
                                                      {"COUNT", "count"},
                                                      {"P50", "p50_ns", shown_as::duration},
                                                      {"P99", "p99_ns", shown_as::duration},
                                                      {"P99.9", "p999_ns", shown_as::duration},
                                                      {"MAX", "max_ns", shown_as::duration}}};
    json p = json::object();
    if (ctx.has.has("--prefix")) {
        p["prefix"] = ctx.opt.prefix;
    }
    return ctx.call_and_show("telemetry.snapshot", p, [&](const json& r) {
        json metrics = json::array();
        for (const char* kind : {"counters", "gauges"}) {
            for (const auto& m : r.value(kind, json::array())) {
                metrics.push_back(m);
            }
        }
        ctx.out() << make_table(metrics, metric_cols).render();
        const json& h = r.value("histograms", json::array());
        if (!h.empty()) {
            ctx.out() << '\n' << make_table(h, hist_cols).render();
        }
    });
}

constexpr command_help metrics_help{
    "Prometheus text exposition",
    "  qrtctl metrics\n  qrtctl metrics | grep qrt_rpc_requests_total\n"};

int metrics(context& ctx) {
    return ctx.call_and_show("metrics", json::object(),
                             [&](const json& r) { ctx.out() << r.value("text", std::string()); });
}

// ---- health

constexpr command_help health_help{
    "exit 0 when the agent answers and reports itself healthy; otherwise print why and "
    "exit non-zero (Slurm HealthCheckProgram, Kubernetes probes)",
    "  qrtctl health                 readiness: agent.status must report health ok\n"
    "  qrtctl health --liveness      liveness: the agent answers agent.hello\n"
    "  qrtctl health --timeout 1s --socket /run/qrtd/qrtd.sock\n"};

void health_options(CLI::App& app, options& o, given&) {
    app.add_flag("--liveness", o.liveness, "only check that the agent answers (not its health)");
}

int health(context& ctx) {
    int rc = exit_ok;
    auto hello = ctx.call("agent.hello", json{{"client", "qrtctl health"}}, rc);
    if (!hello) {
        return rc;
    }
    json verdict{{"healthy", true},
                 {"agent_version", hello->value("agent_version", json())},
                 {"reasons", json::array()}};
    if (!ctx.opt.liveness) {
        auto st = ctx.call("agent.status", json::object(), rc);
        if (!st) {
            return rc;
        }
        auto [ok, reasons] = judge_health(*st);
        verdict["healthy"] = ok;
        verdict["reasons"] = reasons;
        if (st->contains("health")) {
            verdict["health"] = (*st)["health"];
        }
    }
    const bool ok = verdict["healthy"].get<bool>();
    if (ctx.opt.json) {
        ctx.print_json(verdict);
    } else if (ok) {
        ctx.out() << "ok: qrtd " << show(verdict["agent_version"], shown_as::text)
                  << (ctx.opt.liveness ? " answers" : " is healthy") << '\n';
    } else {
        std::string why;
        for (const auto& r : verdict["reasons"]) {
            why += (why.empty() ? "" : "; ") + r.get<std::string>();
        }
        ctx.out() << "degraded: " << why << '\n';
        ctx.err() << "qrtctl: health: degraded: " << why << '\n';
    }
    return ok ? exit_ok : qrt::client::exit_code_for(qrt::client::local_reason::degraded);
}

// ---- raw, exit-codes

constexpr command_help raw_help{
    "call any method with JSON params (or send one raw line)",
    "  qrtctl raw agent.hello\n"
    "  qrtctl raw slots.query '{\"duration_ns\":2000000,\"qpus\":[\"qpu0\"]}'\n"
    "  qrtctl raw --line '{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"metrics\"}'\n"};

void raw_options(CLI::App& app, options& o, given& g) {
    g.add("method", app.add_option("method", o.raw_method, "method name"));
    g.add("params", app.add_option("params", o.raw_params, "params as a JSON object"));
    g.add("--line", app.add_option("--line", o.raw_line,
                                      "send this line verbatim and print the reply line"));
}

// raw --line: the line as given, the reply line as it came.
int raw_line(context& ctx) {
    if (ctx.has.has("method")) {
        return ctx.usage("--line does not go with METHOD");
    }
    int rc = exit_ok;
    connection* c = ctx.conn(rc);
    if (c == nullptr) {
        return rc;
    }
    auto r = c->raw_line(ctx.opt.raw_line);
    if (auto* e = std::get_if<call_error>(&r)) {
        return ctx.fail("raw", *e);
    }
    ctx.out() << std::get<0>(r) << '\n';
    // The reply's own reason decides the exit status.
    json reply = json::parse(std::get<0>(r), nullptr, false);
    if (reply.is_object() && reply.contains("error")) {
        auto rr = qrt::client::reply_from_object(reply);
        return qrt::client::exit_code_for(rr.error().reason);
    }
    return exit_ok;
}

int raw(context& ctx) {
    if (ctx.has.has("--line")) {
        return raw_line(ctx);
    }
    if (!ctx.has.has("method")) {
        return ctx.usage("raw needs a METHOD (or --line)");
    }
    json params = json::object();
    if (ctx.has.has("params")) {
        params = json::parse(ctx.opt.raw_params, nullptr, false);
        if (params.is_discarded()) {
            return ctx.usage("params '" + ctx.opt.raw_params + "' is not JSON");
        }
    }
    return ctx.call_and_show(ctx.opt.raw_method, params, [&](const json& r) {
        ctx.out() << r.dump(2, ' ', false, json::error_handler_t::replace) << '\n';
    });
}

constexpr command_help exit_codes_help{"the exit status for each error reason",
                                       "  qrtctl exit-codes\n  qrtctl exit-codes --json\n"};

int exit_codes(context& ctx) {
    if (!ctx.opt.json) {
        ctx.out() << exit_table_text();
        return exit_ok;
    }
    json rows = json::array();
    for (const auto& r : exit_table()) {
        rows.push_back({{"exit_code", r.exit_code}, {"reason", r.reason}, {"meaning", r.meaning}});
    }
    ctx.print_json(rows);
    return exit_ok;
}

// ---- the table: one row a command, in --help order

// clang-format off
constexpr std::array<command, 19> command_table{{
    {"agent",       "hello",     agent_hello_help,        no_options,                 agent_hello},
    {"agent",       "status",    agent_status_help,       no_options,                 agent_status},
    {"qpus",        "list",      qpus_list_help,          no_options,                 qpus_list},
    {"calibration", "get",       calibration_get_help,    calibration_get_options,    calibration_get},
    {"calibration", "update",    calibration_update_help, calibration_update_options, calibration_update},
    {"slots",       "query",     slots_query_help,        slots_query_options,        slots_query},
    {"slots",       "reserve",   slots_reserve_help,      slots_reserve_options,      slots_reserve},
    {"slots",       "heartbeat", slots_heartbeat_help,    held_reservation_options,   slots_heartbeat},
    {"slots",       "release",   slots_release_help,      held_reservation_options,   slots_release},
    {"jobs",        "submit",    jobs_submit_help,        jobs_submit_options,        jobs_submit},
    {"jobs",        "status",    jobs_status_help,        job_option,                 jobs_status},
    {"jobs",        "result",    jobs_result_help,        jobs_result_options,        jobs_result},
    {"jobs",        "cancel",    jobs_cancel_help,        job_option,                 jobs_cancel},
    {"",            "events",    events_help,             events_options,             events},
    {"",            "telemetry", telemetry_help,          telemetry_options,          telemetry},
    {"",            "metrics",   metrics_help,            no_options,                 metrics},
    {"",            "health",    health_help,             health_options,             health},
    {"",            "raw",       raw_help,                raw_options,                raw},
    {"",            "exit-codes", exit_codes_help,        no_options,                 exit_codes},
}};
// clang-format on

constexpr std::string_view main_description =
    "qrtctl - control and query qrtd, the QPU host agent, over its UNIX socket\n";

std::string main_footer() {
    return "ENVIRONMENT\n"
           "  QRT_SOCKET   socket path when --socket is not given (default " +
           qrt::client::default_socket_path() +
           ")\n\n"
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
    for (const auto& e : qrt::client::local_exit_table) {
        rows.push_back({e.exit_code, std::string(e.reason), std::string(e.meaning)});
    }
    for (const auto& e : qrt::rpc::reason_table) {
        rows.push_back({e.exit_code, std::string(e.reason), std::string(e.meaning)});
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
                       "); give it several times to `slots reserve` on the best of several agents")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->envname("QRT_SOCKET");
    app.add_flag("--json,-j", opt.json, "print replies (and errors) as one JSON line");
    app.add_option("--timeout", opt.timeout, "per-call timeout (default 5s)");
    app.add_option("--connect-timeout", opt.connect_timeout, "connect timeout (default 2s)");
    app.set_version_flag("--version", "qrtctl " QRTCTL_VERSION);

    const auto& cmds = command_table;
    std::map<std::string, CLI::App*, std::less<>> groups;
    const std::map<std::string_view, std::string_view> group_summary{
        {"agent", "the agent itself: hello, status"},
        {"qpus", "the host's QPUs"},
        {"calibration", "calibration windows"},
        {"slots", "slot queries and reservations"},
        {"jobs", "jobs: submit, status, result, cancel"},
    };
    const command* chosen = nullptr;
    for (const auto& c : cmds) {
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
    for (auto& [name, g] : groups) {
        std::string ex;
        for (const auto& c : cmds) {
            if (c.group == name) {
                ex += c.help.examples;
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
