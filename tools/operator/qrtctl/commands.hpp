#pragma once
// qrtctl's commands: what a row of the command table is (qrtctl.cpp), the
// pieces several commands share (command_common.cpp), and each command's
// rows (help, options, handler), one file a concern (cmd_*.cpp).

#include <CLI/CLI.hpp>

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "context.hpp"
#include "render.hpp"

namespace qrtctl {

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

// ------------------------------------------------------------------ shared

inline constexpr std::array<column, 6> window_columns{{
    {"CALIBRATION", "calibration_id"},
    {"VALID_FROM", "valid_from_ns", shown_as::time},
    {"VALID_UNTIL", "valid_until_ns", shown_as::time},
    {"QPU", "qpu"},
    {"F0", "f0", shown_as::fixed3},
    {"TAU", "tau_ns", shown_as::duration},
}};

// Adds a parsed time/duration to params, or fails with a usage message.
bool put_duration(context& ctx, json& params, const char* key, const std::string& option,
                  const std::string& text, std::string& problem);
// The request fields shared by slots query/reserve and one-shot submit.
std::optional<json> request_params(context& ctx, int& rc);
// A file's bytes ('-': standard input), or nullopt with problem set.
std::optional<std::string> read_file(const std::string& path, std::string& problem);
// A reservation (or each member of a gang) as "key: value" lines.
void show_reservation(context& ctx, const json& r);

// Options shared by several commands.
void no_options(CLI::App&, options&, given&);
void request_options(CLI::App& app, options& o, given& g);
void reservation_options(CLI::App& app, options& o, given& g, bool required);
void held_reservation_options(CLI::App& app, options& o, given& g);
void job_option(CLI::App& app, options& o, given& g);
void gang_size_option(CLI::App& app, options& o, given& g, const std::string& what);
void idempotency_key_option(CLI::App& app, options& o, given& g, const std::string& what);

// A method on a held reservation ({reservation_id, fencing_token}).
int call_on_reservation(context& ctx, std::string_view method);
// A method on a job ({job_id}) that answers with the reservation.
int call_on_job(context& ctx, std::string_view method);
// The key given with --idempotency-key, or a generated one.
std::string idempotency_key(const context& ctx);

// ------------------------------------------------------------------ rows

// Each file's rows of the command table (a command's help, options and
// handler are that file's own), run by qrtctl.cpp in this order, which is
// --help's.
extern const std::array<command, 3> agent_commands;        // cmd_agent.cpp: agent hello|status, qpus list
extern const std::array<command, 2> calibration_commands;  // cmd_calibration.cpp: calibration get|update
extern const std::array<command, 4> slots_commands;        // cmd_slots.cpp: query|reserve|heartbeat|release
extern const std::array<command, 4> jobs_commands;         // cmd_jobs.cpp: submit|status|result|cancel
extern const std::array<command, 1> events_commands;       // cmd_events.cpp: events
extern const std::array<command, 2> telemetry_commands;    // cmd_telemetry.cpp: telemetry, metrics
extern const std::array<command, 1> health_commands;       // cmd_health.cpp: health
extern const std::array<command, 2> raw_commands;          // cmd_raw.cpp: raw, exit-codes

}  // namespace qrtctl
