// qrtctl without an agent: its parsers and renderers, the exit-code table
// against the man page, and command lines that must fail before any
// connection is tried.  tests/integration/clients runs qrtctl against a
// real server.

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "qrt/proto/protocol.hpp"
#include "qrtctl.hpp"
#include "render.hpp"
#include "units.hpp"

namespace {

using qrtctl::format_duration_ns;
using qrtctl::format_time_ns;
using qrtctl::parse_duration_ns;
using qrtctl::parse_time_ns;

struct ran {
    int code;
    std::string out;
    std::string err;
};

ran run(std::vector<std::string> args) {
    args.insert(args.begin(), "qrtctl");
    std::ostringstream out;
    std::ostringstream err;
    const int code = qrtctl::run(args, out, err);
    return {code, out.str(), err.str()};
}

TEST(qrtctl_units, durations_parse_with_every_unit_and_exact_fractions) {
    EXPECT_EQ(parse_duration_ns("2ms").value, 2'000'000);
    EXPECT_EQ(parse_duration_ns("250us").value, 250'000);
    EXPECT_EQ(parse_duration_ns("250\xc2\xb5s").value, 250'000);
    EXPECT_EQ(parse_duration_ns("1.5s").value, 1'500'000'000);
    EXPECT_EQ(parse_duration_ns("10m").value, 600'000'000'000);
    EXPECT_EQ(parse_duration_ns("2min").value, 120'000'000'000);
    EXPECT_EQ(parse_duration_ns("1h").value, 3'600'000'000'000);
    EXPECT_EQ(parse_duration_ns("42").value, 42);
    EXPECT_EQ(parse_duration_ns("0.001us").value, 1);
}

TEST(qrtctl_units, durations_refuse_loose_text_naming_it) {
    for (const char* bad : {"", "ms", "2 ms", "-2ms", "+2ms", "2e3ms", "2.ms", ".5ms", "2xs",
                            "1.5", "0.5ns", "0.0001us", "99999999999h"}) {
        const auto r = parse_duration_ns(bad);
        EXPECT_FALSE(r.value.has_value()) << "'" << bad << "' parsed as " << r.value.value_or(0);
        EXPECT_NE(r.error.find(std::string("'") + bad + "'"), std::string::npos) << r.error;
    }
}

TEST(qrtctl_units, times_parse_now_relative_epoch_and_iso) {
    const std::int64_t now = 1'700'000'000'000'000'000;
    EXPECT_EQ(parse_time_ns("now", now).value, now);
    EXPECT_EQ(parse_time_ns("+2s", now).value, now + 2'000'000'000);
    EXPECT_EQ(parse_time_ns("123", now).value, 123);
    EXPECT_EQ(parse_time_ns("2023-11-14T22:13:20Z", now).value, now);
    EXPECT_EQ(parse_time_ns("2023-11-14T22:13:20.5Z", now).value, now + 500'000'000);
    EXPECT_EQ(parse_time_ns("2023-11-14T22:13:20.000000001Z", now).value, now + 1);
}

TEST(qrtctl_units, times_refuse_non_dates_and_local_times) {
    const std::int64_t now = 1'700'000'000'000'000'000;
    for (const char* bad : {"yesterday", "2023-11-14 22:13:20Z", "2023-11-14T22:13:20",
                            "2023-02-30T00:00:00Z", "2023-13-01T00:00:00Z",
                            "2023-11-14T22:13:20.Z", "2023-11-14T22:13:20+01:00", "+",
                            "99999999999999999999"}) {
        EXPECT_FALSE(parse_time_ns(bad, now).value.has_value()) << bad;
    }
}

TEST(qrtctl_units, formatting_reads_back) {
    EXPECT_EQ(format_time_ns(1'700'000'000'123'456'789), "2023-11-14T22:13:20.123456Z");
    EXPECT_EQ(format_duration_ns(2'000'000), "2ms");
    EXPECT_EQ(format_duration_ns(1'500'000'000), "1.5s");
    EXPECT_EQ(format_duration_ns(250'000), "250us");
    EXPECT_EQ(format_duration_ns(999), "999ns");
    EXPECT_EQ(format_duration_ns(3'723'000'000'000), "1h2m3s");
    EXPECT_EQ(format_duration_ns(-2'000'000), "-2ms");
    for (const std::int64_t d : {1LL, 999LL, 2'000'000LL, 1'500'000'000LL, 600'000'000'000LL}) {
        EXPECT_EQ(parse_duration_ns(format_duration_ns(d)).value, d) << format_duration_ns(d);
    }
}

TEST(qrtctl_render, tables_align_columns_and_show_units) {
    const nlohmann::json items = nlohmann::json::array(
        {{{"qpu", "qpu0"}, {"start_ns", 1'700'000'000'000'000'000}, {"score", 0.5}},
         {{"qpu", "qpu-long-name"}, {"start_ns", nullptr}, {"score", 1}}});
    static constexpr std::array<qrtctl::column, 3> cols{{{"QPU", "qpu"},
                                                          {"START", "start_ns", qrtctl::shown_as::time},
                                                          {"SCORE", "score", qrtctl::shown_as::fixed3}}};
    const std::string text = qrtctl::make_table(items, cols).render();
    EXPECT_EQ(text,
              "QPU            START                        SCORE\n"
              "qpu0           2023-11-14T22:13:20.000000Z  0.500\n"
              "qpu-long-name  -                            1.000\n");
}

TEST(qrtctl_render, fields_skip_absent_members_and_descend_paths) {
    const nlohmann::json obj{{"a", 1}, {"peer", {{"roles", {"reader", "admin"}}}}, {"n", nullptr}};
    static constexpr std::array<qrtctl::column, 4> fields{{{"a", "a"},
                                                            {"roles", "peer.roles", qrtctl::shown_as::list},
                                                            {"missing", "missing"},
                                                            {"n", "n"}}};
    EXPECT_EQ(qrtctl::render_fields(obj, fields), "a:     1\nroles: reader,admin\nn:     -\n");
    EXPECT_EQ(qrtctl::render_flat(obj), "a:          1\nn:          -\npeer.roles: reader,admin\n");
}

TEST(qrtctl_render, values_show_in_their_units_and_maps_as_pairs) {
    using qrtctl::shown_as;
    EXPECT_EQ(qrtctl::show(nlohmann::json{{"method", "slots.query"}, {"qpu", "q0"}}, shown_as::text),
              "method=slots.query,qpu=q0");
    EXPECT_EQ(qrtctl::show(nlohmann::json::object(), shown_as::text), "-");
    EXPECT_EQ(qrtctl::show(2'000'000, shown_as::duration), "2ms");
    EXPECT_EQ(qrtctl::show(0, shown_as::time), "-");
    EXPECT_EQ(qrtctl::show(true, shown_as::yes_no), "yes");
    EXPECT_EQ(qrtctl::show(nlohmann::json::array({"a", 1}), shown_as::list), "a,1");
}

TEST(qrtctl_exit_codes, every_reason_of_the_agent_table_is_listed_once_with_its_code) {
    const auto rows = qrtctl::exit_table();
    for (const auto& e : qrt::proto::reasons) {
        if (!e.error) {
            continue;
        }
        const auto n = std::count_if(rows.begin(), rows.end(),
                                     [&](const auto& r) { return r.reason == e.name; });
        EXPECT_EQ(n, 1) << e.name;
        const auto it = std::find_if(rows.begin(), rows.end(),
                                     [&](const auto& r) { return r.reason == e.name; });
        ASSERT_NE(it, rows.end());
        EXPECT_EQ(it->exit_code, e.exit_code) << e.name;
    }
}

TEST(qrtctl_exit_codes, the_man_page_lists_the_same_table) {
    std::ifstream f(QRTCTL_MAN_PAGE);
    ASSERT_TRUE(f) << "cannot open " << QRTCTL_MAN_PAGE;
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string man = ss.str();
    for (const auto& r : qrtctl::exit_table()) {
        if (r.reason == "-" || r.reason == "(other)") {
            continue;
        }
        // ".TP\n.B <code>\n<reason>" ... in the EXIT STATUS section.
        const std::regex row("\\.B " + std::to_string(r.exit_code) + "\\n" + r.reason + "\\b");
        EXPECT_TRUE(std::regex_search(man, row))
            << "qrtctl.1 lacks exit status " << r.exit_code << " for " << r.reason;
    }
}

TEST(qrtctl_cli, help_lists_examples_and_exit_status_and_succeeds) {
    const auto top = run({"--help"});
    EXPECT_EQ(top.code, 0);
    EXPECT_NE(top.out.find("EXIT STATUS"), std::string::npos);
    EXPECT_NE(top.out.find("no_fit"), std::string::npos);
    for (const auto& sub : std::vector<std::vector<std::string>>{
             {"agent", "hello"}, {"agent", "status"}, {"qpus", "list"}, {"calibration", "get"},
             {"calibration", "update"}, {"slots", "query"}, {"slots", "reserve"},
             {"slots", "heartbeat"}, {"slots", "release"}, {"jobs", "submit"}, {"jobs", "status"},
             {"jobs", "result"}, {"jobs", "cancel"}, {"events"}, {"telemetry"}, {"metrics"},
             {"health"}, {"raw"}, {"exit-codes"}}) {
        auto args = sub;
        args.push_back("--help");
        const auto r = run(args);
        EXPECT_EQ(r.code, 0) << args[0];
        EXPECT_NE(r.out.find("EXAMPLES\n  qrtctl " + sub[0]), std::string::npos)
            << args[0] << " help has no examples:\n"
            << r.out;
    }
}

TEST(qrtctl_cli, bad_command_lines_exit_64_before_connecting) {
    // The socket does not exist: reaching connect would exit 69, not 64.
    const std::string sock = "--socket=/nonexistent/qrtd.sock";
    for (const auto& args : std::vector<std::vector<std::string>>{
             {sock},
             {sock, "nonsense"},
             {sock, "slots", "query"},
             {sock, "slots", "query", "--duration", "2 ms"},
             {sock, "slots", "query", "--duration", "2ms", "--deadline", "tomorrow"},
             {sock, "slots", "query", "--duration", "2ms", "--min-fidelity", "1.5"},
             {sock, "slots", "release", "--reservation", "1"},
             {sock, "jobs", "submit", "--reservation", "1", "--payload", "x"},
             {sock, "jobs", "submit", "-r", "1", "-t", "2"},
             {sock, "jobs", "submit", "-r", "1", "-t", "2", "--payload", "x", "--duration", "1ms"},
             {sock, "calibration", "update", "--qpu", "q", "--window", "1,2"},
             {sock, "raw"},
             {sock, "--timeout", "0s", "agent", "hello"},
         }) {
        const auto r = run(args);
        std::string joined;
        for (const auto& a : args) {
            joined += a + " ";
        }
        EXPECT_EQ(r.code, 64) << joined << "\nstderr: " << r.err;
    }
}

TEST(qrtctl_cli, a_missing_agent_says_so_and_exits_69) {
    const auto r = run({"--socket", "/nonexistent/qrtd.sock", "agent", "hello"});
    EXPECT_EQ(r.code, 69);
    EXPECT_EQ(r.err,
              "qrtctl: cannot connect to /nonexistent/qrtd.sock: No such file or directory "
              "(is qrtd running?)\n");
    const auto j = run({"--json", "--socket", "/nonexistent/qrtd.sock", "health"});
    EXPECT_EQ(j.code, 69);
    const auto parsed = nlohmann::json::parse(j.out);
    EXPECT_EQ(parsed["error"]["reason"], "unreachable");
    EXPECT_EQ(parsed["error"]["exit_code"], 69);
}

TEST(qrtctl_cli, exit_codes_json_is_the_table) {
    const auto r = run({"exit-codes", "--json"});
    ASSERT_EQ(r.code, 0);
    const auto rows = nlohmann::json::parse(r.out);
    EXPECT_EQ(rows.size(), qrtctl::exit_table().size());
}

}  // namespace
