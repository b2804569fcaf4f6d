#pragma once
// qrtctl's commands: what a row of the command table is (qrtctl.cpp), the
// pieces several commands share (command_common.cpp), and each command's
// help, options and handler, one file a concern (cmd_*.cpp).

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

// ------------------------------------------------------------------ commands

// cmd_agent.cpp: agent hello|status, qpus list
extern const command_help agent_hello_help;
int agent_hello(context& ctx);
extern const command_help agent_status_help;
int agent_status(context& ctx);
extern const command_help qpus_list_help;
int qpus_list(context& ctx);

// cmd_calibration.cpp: calibration get|update
extern const command_help calibration_get_help;
void calibration_get_options(CLI::App& app, options& o, given&);
int calibration_get(context& ctx);
extern const command_help calibration_update_help;
void calibration_update_options(CLI::App& app, options& o, given& g);
int calibration_update(context& ctx);

// cmd_slots.cpp: slots query|reserve|heartbeat|release
extern const command_help slots_query_help;
void slots_query_options(CLI::App& app, options& o, given& g);
int slots_query(context& ctx);
extern const command_help slots_reserve_help;
void slots_reserve_options(CLI::App& app, options& o, given& g);
int slots_reserve(context& ctx);
extern const command_help slots_heartbeat_help;
int slots_heartbeat(context& ctx);
extern const command_help slots_release_help;
int slots_release(context& ctx);

// cmd_jobs.cpp: jobs submit|status|result|cancel
extern const command_help jobs_submit_help;
void jobs_submit_options(CLI::App& app, options& o, given& g);
int jobs_submit(context& ctx);
extern const command_help jobs_status_help;
int jobs_status(context& ctx);
extern const command_help jobs_result_help;
void jobs_result_options(CLI::App& app, options& o, given& g);
int jobs_result(context& ctx);
extern const command_help jobs_cancel_help;
int jobs_cancel(context& ctx);

// cmd_events.cpp: events
extern const command_help events_help;
void events_options(CLI::App& app, options& o, given& g);
int events(context& ctx);

// cmd_telemetry.cpp: telemetry, metrics
extern const command_help telemetry_help;
void telemetry_options(CLI::App& app, options& o, given& g);
int telemetry(context& ctx);
extern const command_help metrics_help;
int metrics(context& ctx);

// cmd_health.cpp: health
extern const command_help health_help;
void health_options(CLI::App& app, options& o, given&);
int health(context& ctx);

// cmd_raw.cpp: raw, exit-codes
extern const command_help raw_help;
void raw_options(CLI::App& app, options& o, given& g);
int raw(context& ctx);
extern const command_help exit_codes_help;
int exit_codes(context& ctx);

}  // namespace qrtctl
