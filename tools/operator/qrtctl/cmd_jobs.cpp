// qrtctl jobs submit|status|result|cancel.

#include "commands.hpp"

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <ostream>

#include "base64.hpp"

namespace qrtctl {

namespace {

constexpr std::array<column, 7> result_fields{{
    {"job", "job_id"},
    {"state", "state"},
    {"reason", "reason"},
    {"sent", "sent_ns", shown_as::time},
    {"updated", "updated_ns", shown_as::time},
    {"result_bytes", "result_bytes"},
    {"result", "result"},
}};

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

}  // namespace

// clang-format off
constexpr std::array<command, 4> jobs_commands{{
    {"jobs",        "submit",    jobs_submit_help,        jobs_submit_options,        jobs_submit},
    {"jobs",        "status",    jobs_status_help,        job_option,                 jobs_status},
    {"jobs",        "result",    jobs_result_help,        jobs_result_options,        jobs_result},
    {"jobs",        "cancel",    jobs_cancel_help,        job_option,                 jobs_cancel},
}};
// clang-format on

}  // namespace qrtctl
