// What several of qrtctl's commands share: the reservation's shape, the
// request's fields and their options, reading a file, the calls on a held
// reservation or a job.

#include "commands.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <ostream>

#include "units.hpp"
#include "rtcore/unique_fd.hpp"

namespace qrtctl {

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

namespace {

std::string generated_key() {
    std::array<char, 256> host{};
    if (::gethostname(host.data(), host.size() - 1) != 0) {
        host[0] = '\0';
    }
    return std::string("qrtctl-") + host.data() + "-" + std::to_string(::getpid()) + "-" +
           std::to_string(realtime_now_ns());
}

}  // namespace

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

}  // namespace qrtctl
