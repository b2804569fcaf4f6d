// qrtctl events.

#include "commands.hpp"

#include <array>
#include <chrono>
#include <ostream>

#include "units.hpp"

namespace qrtctl {

namespace {


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

}  // namespace

// clang-format off
constexpr std::array<command, 1> events_commands{{
    {"",            "events",    events_help,             events_options,             events},
}};
// clang-format on

}  // namespace qrtctl
