#pragma once
// qrtctl's command context: every option of every subcommand (only one runs
// per call), which of them were given, and the context a command runs in --
// its output streams, the connection to the agent, calls, errors and their
// exit status.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "connection.hpp"
#include "render.hpp"

namespace qrtctl {

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

    int usage(const std::string& message);

    // The connection, opened on first use.
    connection* conn(int& exit_code);

    // Validates the global durations; call once before any command.
    std::optional<int> prepare();

    // Print an error (stderr always; stdout as JSON with --json) and return
    // its exit status.
    int fail(std::string_view method, const call_error& e);

    // One call: the result, or the exit status after reporting the error.
    std::optional<json> call(std::string_view method, const json& params, int& exit_code);

    // Call and print: --json prints the result, otherwise `human` does.
    int call_and_show(std::string_view method, const json& params,
                      const std::function<void(const json&)>& human);

    void print_json(const json& j) {
        _out << j.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
    }

    std::int64_t timeout_ns() const noexcept { return _timeout_ns; }

    // slots reserve with several --socket: hold on every agent at once, keep
    // the earliest start, release the others (qrt::client::place_best).
    int place_best(const json& params);
    std::function<void(const json&)> show_reserved;  // the human rendering (show_reservation)

private:
    void print_error_json(const call_error& e);

    std::ostream& _out;
    std::ostream& _err;
    std::unique_ptr<connection> _conn;
    std::int64_t _timeout_ns = 5'000'000'000;
    std::int64_t _connect_timeout_ns = 2'000'000'000;
};

}  // namespace qrtctl
