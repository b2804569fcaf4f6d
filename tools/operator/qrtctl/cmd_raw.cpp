// qrtctl raw, exit-codes.

#include "commands.hpp"

#include <array>
#include <ostream>

#include "qrtctl.hpp"

namespace qrtctl {

namespace {


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

}  // namespace

// clang-format off
constexpr std::array<command, 2> raw_commands{{
    {"",            "raw",       raw_help,                raw_options,                raw},
    {"",            "exit-codes", exit_codes_help,        no_options,                 exit_codes},
}};
// clang-format on

}  // namespace qrtctl
