#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "qrt/rpc/engine.hpp"
#include "qrt/rpc/methods.hpp"

using namespace qrt::rpc;

namespace {

session make_session(role_set roles, std::string tenant = "alice", std::uint64_t id = 1) {
    session s;
    s.id = id;
    s.peer.uid = 1000;
    s.peer.gid = 1000;
    s.peer.pid = 42;
    s.peer.user_name = tenant;
    s.roles = roles;
    s.tenant = std::move(tenant);
    return s;
}

role_set roles(std::initializer_list<role> rs) {
    role_set out;
    for (const role r : rs) {
        out = out.with(r);
    }
    return out;
}

class engine_test : public ::testing::Test {
protected:
    void SetUp() override {
        eng.methods().add({"echo", role::reader, "echo params",
                           [](const json& params, call_context&) { return params; }});
        eng.methods().add({"reserve", role::scheduler, "",
                           [](const json&, call_context& ctx) { return json(ctx.caller.tenant); }});
        eng.methods().add({"cal", role::calibration, "", [](const json&, call_context&) {
                               return json("ok");
                           }});
        eng.methods().add({"fails", role::reader, "", [](const json&, call_context&) -> json {
                               throw rpc_failure("no_fit", "nothing fits duration_ns=5");
                           }});
        eng.methods().add({"throws", role::reader, "", [](const json&, call_context&) -> json {
                               throw std::runtime_error("bug");
                           }});
        eng.methods().add({"count", role::reader, "", [this](const json&, call_context&) {
                               return json(++counted);
                           }});
    }

    // One line in, the parsed reply out (null when nothing was sent).
    json call(std::string_view line, session& s) {
        const line_reply r = eng.handle_line(line, s);
        if (r.text.empty()) {
            return nullptr;
        }
        EXPECT_EQ(r.text.back(), '\n');
        EXPECT_EQ(r.text.find('\n'), r.text.size() - 1) << "a reply is exactly one line";
        return json::parse(r.text);
    }

    static std::string reason_of(const json& reply) {
        return reply.at("error").at("data").at("reason").get<std::string>();
    }

    engine eng{engine_limits{1024, 8, 4}};
    session reader = make_session(roles({role::reader}));
    int counted = 0;
};

}  // namespace

TEST_F(engine_test, a_valid_request_gets_its_result_with_the_same_id) {
    const json r = call(R"({"jsonrpc":"2.0","method":"echo","params":{"a":1},"id":"x-1"})", reader);
    EXPECT_EQ(r.at("jsonrpc"), "2.0");
    EXPECT_EQ(r.at("id"), "x-1");
    EXPECT_EQ(r.at("result"), (json{{"a", 1}}));
    EXPECT_FALSE(r.contains("error"));
    const json n = call(R"({"jsonrpc":"2.0","method":"echo","id":7})", reader);
    EXPECT_EQ(n.at("id"), 7);
    const json z = call(R"({"jsonrpc":"2.0","method":"echo","id":null})", reader);
    EXPECT_TRUE(z.at("id").is_null());
    EXPECT_TRUE(z.contains("result"));
}

TEST_F(engine_test, invalid_json_and_invalid_utf8_are_parse_errors_with_null_id) {
    for (const std::string& line : {std::string(R"({"jsonrpc":"2.0","method":)"),
                                   std::string("{\"jsonrpc\":\"2.0\",\"method\":\"echo\xff\",\"id\":1}"),
                                   std::string("\xc3\x28"), std::string("nul\x00l", 5)}) {
        const json r = call(line, reader);
        EXPECT_EQ(r.at("error").at("code"), -32700) << line;
        EXPECT_EQ(reason_of(r), reason::parse_error);
        EXPECT_TRUE(r.at("id").is_null());
    }
}

TEST_F(engine_test, numbers_beyond_double_are_parse_errors_and_big_integers_are_invalid_params) {
    const json r = call(R"({"jsonrpc":"2.0","method":"echo","params":{"n":1e400},"id":1})", reader);
    EXPECT_EQ(r.at("error").at("code"), -32700);
    const json id = call(R"({"jsonrpc":"2.0","method":"echo","id":123456789012345678901234567890})",
                         reader);
    EXPECT_EQ(id.at("id").get<double>(), 123456789012345678901234567890.0);
}

TEST_F(engine_test, malformed_requests_are_invalid_requests) {
    const char* bad[] = {
        R"({"foo":"boo"})",
        R"({"jsonrpc":"1.0","method":"echo","id":1})",
        R"({"jsonrpc":"2.0","method":1,"id":1})",
        R"({"jsonrpc":"2.0","method":"echo","params":"x","id":1})",
        R"({"jsonrpc":"2.0","method":"echo","id":1,"extra":true})",
        R"({"jsonrpc":"2.0","method":"echo","id":{"a":1}})",
        R"(42)",
        R"("just a string")",
    };
    for (const char* line : bad) {
        const json r = call(line, reader);
        EXPECT_EQ(r.at("error").at("code"), -32600) << line;
        EXPECT_EQ(reason_of(r), reason::invalid_request) << line;
    }
    // The id is echoed when it is itself valid.
    EXPECT_EQ(call(R"({"jsonrpc":"1.0","method":"echo","id":5})", reader).at("id"), 5);
}

TEST_F(engine_test, unknown_methods_get_method_not_found_and_unknown_notifications_get_nothing) {
    const json r = call(R"({"jsonrpc":"2.0","method":"nope","id":1})", reader);
    EXPECT_EQ(r.at("error").at("code"), -32601);
    EXPECT_EQ(r.at("error").at("data").at("method"), "nope");
    EXPECT_TRUE(call(R"({"jsonrpc":"2.0","method":"nope"})", reader).is_null());
}

TEST_F(engine_test, notifications_run_but_are_never_answered) {
    EXPECT_TRUE(call(R"({"jsonrpc":"2.0","method":"count"})", reader).is_null());
    EXPECT_TRUE(call(R"({"jsonrpc":"2.0","method":"fails"})", reader).is_null());
    EXPECT_EQ(counted, 1);
}

TEST_F(engine_test, batches_answer_each_request_in_order_and_skip_notifications) {
    const json r = call(R"([{"jsonrpc":"2.0","method":"echo","params":{"i":1},"id":1},
                            {"jsonrpc":"2.0","method":"count"},
                            {"jsonrpc":"2.0","method":"nope","id":2},
                            3])",
                        reader);
    ASSERT_TRUE(r.is_array());
    ASSERT_EQ(r.size(), 3U);
    EXPECT_EQ(r[0].at("result").at("i"), 1);
    EXPECT_EQ(r[1].at("error").at("code"), -32601);
    EXPECT_EQ(r[2].at("error").at("code"), -32600);
    EXPECT_EQ(counted, 1);
}

TEST_F(engine_test, empty_batches_are_one_invalid_request_and_all_notification_batches_are_silent) {
    const json r = call("[]", reader);
    ASSERT_TRUE(r.is_object());
    EXPECT_EQ(r.at("error").at("code"), -32600);
    EXPECT_TRUE(call(R"([{"jsonrpc":"2.0","method":"count"},{"jsonrpc":"2.0","method":"count"}])",
                     reader)
                    .is_null());
    EXPECT_EQ(counted, 2);
}

TEST_F(engine_test, limits_refuse_oversized_batches_deep_nesting_and_long_lines) {
    const json big = call(R"([1,2,3,4,5])", reader);
    EXPECT_EQ(reason_of(big), reason::batch_too_large);
    const json deep = call(std::string(9, '[') + std::string(9, ']'), reader);
    EXPECT_EQ(reason_of(deep), reason::too_deep);
    EXPECT_EQ(deep.at("error").at("code"), -32600);
    const json longer = call(std::string(2000, ' ') + "x" + std::string(2000, 'y'), reader);
    EXPECT_EQ(reason_of(longer), reason::line_too_long);
}

TEST_F(engine_test, blank_lines_and_crlf_are_accepted) {
    EXPECT_TRUE(call("", reader).is_null());
    EXPECT_TRUE(call("   \r", reader).is_null());
    EXPECT_EQ(call("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"id\":3}\r", reader).at("id"), 3);
}

TEST_F(engine_test, handler_failures_carry_the_table_code_and_reason) {
    const json r = call(R"({"jsonrpc":"2.0","method":"fails","id":1})", reader);
    EXPECT_EQ(r.at("error").at("code"), code_for_reason(reason::no_fit));
    EXPECT_EQ(reason_of(r), reason::no_fit);
    EXPECT_NE(r.at("error").at("message").get<std::string>().find("duration_ns"), std::string::npos);
    const json i = call(R"({"jsonrpc":"2.0","method":"throws","id":2})", reader);
    EXPECT_EQ(i.at("error").at("code"), -32603);
    EXPECT_EQ(reason_of(i), reason::internal_error);
}

TEST_F(engine_test, role_checks_follow_the_role_matrix) {
    struct row {
        role_set held;
        bool echo, reserve, cal;
    };
    const row rows[] = {
        {role_set{}, false, false, false},
        {roles({role::reader}), true, false, false},
        {roles({role::scheduler}), true, true, false},
        {roles({role::calibration}), true, false, true},
        {roles({role::admin}), true, true, true},
    };
    for (const auto& r : rows) {
        session s = make_session(r.held);
        const auto allowed = [&](const char* m) {
            const json rep = call(fmt::format(R"({{"jsonrpc":"2.0","method":"{}","id":1}})", m), s);
            if (rep.contains("error")) {
                EXPECT_EQ(reason_of(rep), reason::permission_denied);
                EXPECT_EQ(rep.at("error").at("code"), -32000);
                EXPECT_EQ(rep.at("error").at("data").at("method"), m);
                EXPECT_NE(rep.at("error").at("message").get<std::string>().find(m),
                          std::string::npos);
                return false;
            }
            return true;
        };
        const auto names = r.held.names();
        EXPECT_EQ(allowed("echo"), r.echo) << ::testing::PrintToString(names);
        EXPECT_EQ(allowed("reserve"), r.reserve) << ::testing::PrintToString(names);
        EXPECT_EQ(allowed("cal"), r.cal) << ::testing::PrintToString(names);
    }
    EXPECT_GT(eng.denied_total(), 0U);
}

TEST_F(engine_test, denied_replies_name_the_role_needed) {
    const json r = call(R"({"jsonrpc":"2.0","method":"reserve","id":1})", reader);
    EXPECT_EQ(r.at("error").at("data").at("required_role"), "scheduler");
    EXPECT_EQ(r.at("error").at("data").at("roles"), json::array({"reader"}));
}

TEST_F(engine_test, events_reach_subscribers_of_the_tenant_in_order_with_a_sequence) {
    agent_hooks hooks;
    register_agent_methods(eng, hooks);
    std::vector<json> alice_got;
    std::vector<json> bob_got;
    std::vector<json> admin_got;
    session alice = make_session(roles({role::scheduler}), "alice", 10);
    session bob = make_session(roles({role::scheduler}), "bob", 11);
    session admin = make_session(roles({role::admin}), "root", 12);
    alice.push = [&](std::string_view l) { alice_got.push_back(json::parse(l)); };
    bob.push = [&](std::string_view l) { bob_got.push_back(json::parse(l)); };
    admin.push = [&](std::string_view l) { admin_got.push_back(json::parse(l)); };
    for (session* s : {&alice, &bob, &admin}) {
        eng.attach(*s);
    }
    EXPECT_TRUE(call(R"({"jsonrpc":"2.0","method":"events.subscribe","id":1})", alice)
                    .at("result")
                    .at("subscribed"));
    EXPECT_TRUE(call(R"({"jsonrpc":"2.0","method":"events.subscribe","params":{"topics":
                        ["calibration.changed"]},"id":1})",
                     bob)
                    .contains("result"));
    EXPECT_TRUE(call(R"({"jsonrpc":"2.0","method":"events.subscribe","id":1})", admin)
                    .contains("result"));
    const json bad = call(R"({"jsonrpc":"2.0","method":"events.subscribe","params":{"topics":
                             ["no.such"]},"id":1})",
                          bob);
    EXPECT_EQ(reason_of(bad), reason::invalid_params);

    eng.publish(event{"job.dispatched", "alice", json{{"job_id", 1}}});
    eng.publish(event{"job.finished", "alice", json{{"job_id", 1}}});
    eng.publish(event{"calibration.changed", "", json{{"qpu", "q0"}}});
    eng.publish(event{"job.finished", "bob", json{{"job_id", 2}}});

    ASSERT_EQ(alice_got.size(), 3U);
    EXPECT_EQ(alice_got[0].at("method"), "events.event");
    EXPECT_FALSE(alice_got[0].contains("id"));
    EXPECT_EQ(alice_got[0].at("params").at("type"), "job.dispatched");
    EXPECT_EQ(alice_got[1].at("params").at("type"), "job.finished");
    EXPECT_EQ(alice_got[2].at("params").at("type"), "calibration.changed");
    for (std::size_t i = 0; i < alice_got.size(); ++i) {
        EXPECT_EQ(alice_got[i].at("params").at("seq"), i + 1);
    }
    ASSERT_EQ(bob_got.size(), 1U);  // topic filter: calibration only
    EXPECT_EQ(bob_got[0].at("params").at("type"), "calibration.changed");
    EXPECT_EQ(admin_got.size(), 4U);  // admins see every tenant

    call(R"({"jsonrpc":"2.0","method":"events.unsubscribe","id":2})", alice);
    eng.publish(event{"calibration.changed", "", json::object()});
    EXPECT_EQ(alice_got.size(), 3U);
    for (session* s : {&alice, &bob, &admin}) {
        eng.detach(*s);
    }
}

TEST_F(engine_test, a_delegate_subscribed_with_delegated_gets_the_events_of_its_tenants_only) {
    agent_hooks hooks;
    hooks.may_delegate = [](const session& s) { return s.tenant == "root"; };
    register_agent_methods(eng, hooks);
    std::vector<json> driver_got;
    std::vector<json> plain_got;
    session driver = make_session(roles({role::scheduler}), "root", 0);
    session plain = make_session(roles({role::scheduler}), "alice", 10);
    driver.push = [&](std::string_view l) { driver_got.push_back(json::parse(l)); };
    plain.push = [&](std::string_view l) { plain_got.push_back(json::parse(l)); };
    eng.attach(driver);
    eng.attach(plain);
    const json refused = call(R"({"jsonrpc":"2.0","method":"events.subscribe",
                                  "params":{"delegated":true},"id":1})",
                              plain);
    EXPECT_EQ(reason_of(refused), reason::permission_denied);
    EXPECT_EQ(refused.at("error").at("data").at("field"), "delegated");
    const json ok = call(R"({"jsonrpc":"2.0","method":"events.subscribe",
                             "params":{"topics":["job.finished"],"delegated":true},"id":2})",
                         driver);
    EXPECT_EQ(ok.at("result").at("scope"), "own tenant and its delegated tenants");
    eng.publish(event{"job.finished", "root/team-a", json{{"job_id", 1}}});
    eng.publish(event{"job.finished", "rootx/team-a", json{{"job_id", 2}}});  // another delegate's
    eng.publish(event{"job.finished", "alice", json{{"job_id", 3}}});
    eng.publish(event{"job.finished", "root", json{{"job_id", 4}}});
    eng.publish(event{"job.finished", "root/", json{{"job_id", 5}}});
    ASSERT_EQ(driver_got.size(), 2U);
    EXPECT_EQ(driver_got[0].at("params").at("tenant"), "root/team-a");
    EXPECT_EQ(driver_got[1].at("params").at("data").at("job_id"), 4);
    EXPECT_TRUE(plain_got.empty());  // never subscribed
    // Unsubscribed, and subscribed again without delegated: its own only.
    call(R"({"jsonrpc":"2.0","method":"events.unsubscribe","id":3})", driver);
    call(R"({"jsonrpc":"2.0","method":"events.subscribe","id":4})", driver);
    eng.publish(event{"job.finished", "root/team-a", json{{"job_id", 6}}});
    EXPECT_EQ(driver_got.size(), 2U);
    eng.detach(driver);
    eng.detach(plain);
}

TEST_F(engine_test, hello_lists_every_method_and_the_callers_allowed_ones) {
    agent_hooks hooks;
    register_agent_methods(eng, hooks);
    session nobody = make_session(role_set{});
    const json r = call(R"({"jsonrpc":"2.0","method":"agent.hello","id":1})", nobody);
    const json& res = r.at("result");
    EXPECT_EQ(res.at("api_version"), 1);
    EXPECT_TRUE(res.at("agent_version").is_string());
    const auto caps = res.at("capabilities").get<std::vector<std::string>>();
    EXPECT_NE(std::find(caps.begin(), caps.end(), "reserve"), caps.end());
    EXPECT_EQ(res.at("allowed"), json::array({"agent.hello"}));
    EXPECT_EQ(res.at("peer").at("uid"), 1000);
    // status without a provider is `unavailable`; with one it is the provider's.
    const json st = call(R"({"jsonrpc":"2.0","method":"agent.status","id":2})", reader);
    EXPECT_EQ(reason_of(st), reason::unavailable);
    hooks.status = [] { return json{{"health", "ok"}}; };
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"agent.status","id":3})", reader)
                  .at("result")
                  .at("health"),
              "ok");
}

TEST_F(engine_test, metrics_count_requests_by_method_and_errors_by_reason) {
    agent_hooks hooks;
    register_agent_methods(eng, hooks);
    call(R"({"jsonrpc":"2.0","method":"echo","id":1})", reader);
    call(R"({"jsonrpc":"2.0","method":"fails","id":1})", reader);
    call("{", reader);
    const json m = call(R"({"jsonrpc":"2.0","method":"metrics","id":1})", reader);
    const std::string text = m.at("result").at("text");
    EXPECT_NE(text.find("qrt_rpc_requests_total{method=\"echo\"} 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("qrt_rpc_errors_total{reason=\"no_fit\"} 1\n"), std::string::npos);
    EXPECT_NE(text.find("qrt_rpc_errors_total{reason=\"parse_error\"} 1\n"), std::string::npos);
    EXPECT_NE(text.find("# TYPE qrt_rpc_line_handling_seconds histogram\n"), std::string::npos);
    const json snap = call(R"({"jsonrpc":"2.0","method":"telemetry.snapshot",
                              "params":{"prefix":"qrt_rpc_line"},"id":1})",
                           reader);
    EXPECT_EQ(snap.at("result").at("histograms").size(), 1U);
    EXPECT_TRUE(snap.at("result").at("counters").size() >= 1U);
}

// Replies are written straight into the output (agent.hello from a cached,
// pre-serialised head): the bytes must be exactly nlohmann's serialisation of
// the same reply, for every role set, in batches, and after a method is added.
TEST_F(engine_test, directly_written_replies_are_byte_identical_to_nlohmann_serialisation) {
    agent_hooks hooks;
    register_agent_methods(eng, hooks);
    const auto same_as_tree = [](const std::string& text) {
        ASSERT_FALSE(text.empty());
        EXPECT_EQ(to_line(json::parse(text)), text);
    };
    session nobody = make_session(role_set{});
    session admin = make_session(role_set{}.with(role::admin));
    const std::string hello = R"({"jsonrpc":"2.0","method":"agent.hello","id":"h\u00e9"})";
    const std::string first = eng.handle_line(hello, nobody).text;
    same_as_tree(first);
    same_as_tree(eng.handle_line(hello, admin).text);
    EXPECT_EQ(eng.handle_line(hello, nobody).text, first) << "the cached head is reused as is";
    same_as_tree(eng.handle_line(R"([{"jsonrpc":"2.0","method":"agent.hello","id":1},)"
                                 R"({"jsonrpc":"2.0","method":"agent.hello"},)"
                                 R"({"jsonrpc":"2.0","method":"echo","params":{"a":[1.5,"x"]},"id":2},)"
                                 R"({"jsonrpc":"2.0","method":"nope","id":3}])",
                                 admin)
                     .text);
    eng.methods().add({"late.method", role::reader, "added after a hello",
                       [](const json&, call_context&) { return json(true); }});
    const json r = call(hello, nobody);
    const auto caps = r.at("result").at("capabilities").get<std::vector<std::string>>();
    EXPECT_NE(std::find(caps.begin(), caps.end(), "late.method"), caps.end());
    // A raw handler that fails leaves no partial result behind.
    const json bad = call(R"({"jsonrpc":"2.0","method":"agent.hello","params":{"x":1},"id":9})",
                          nobody);
    EXPECT_EQ(reason_of(bad), reason::invalid_params);
}

// One request on a line is read without a document for its envelope
// (request_reader.hpp); what it answers must be exactly what the request's
// document answers (handle_request, read from the DOM as a batch element
// is): duplicate members, members in any order, the unknown member named
// first by name, escaped names, containers where scalars belong and the
// other way round, nested params, nesting up to the limit.
TEST_F(engine_test, a_request_read_from_its_line_answers_as_its_document_does) {
    const char* lines[] = {
        R"({"jsonrpc":"2.0","method":"echo","params":{"a":[1,{"b":null}],"c":"d"},"id":3})",
        R"({"id":3,"params":[1,2,[3]],"method":"echo","jsonrpc":"2.0"})",
        R"({"jsonrpc":"2.0","method":"nope","method":"echo","id":1})",
        R"({"jsonrpc":"1.0","jsonrpc":"2.0","method":"echo","id":1})",
        R"({"jsonrpc":"2.0","method":"echo","id":1,"params":{"x":1},"params":[2]})",
        R"({"zeta":1,"jsonrpc":"2.0","alpha":{"deep":[1]},"method":"echo","id":2})",
        R"({"\u006a\u0073onrpc":"2.0","\u006dethod":"echo","id":"\u00e9"})",
        R"({"jsonrpc":["2.0"],"method":"echo","id":1})",
        R"({"jsonrpc":"2.0","method":{"name":"echo"},"id":1})",
        R"({"jsonrpc":"2.0","method":"echo","id":[1]})",
        R"({"jsonrpc":"2.0","method":"echo","id":1.5,"params":true})",
        R"({"jsonrpc":"2.0","method":"echo","id":null,"params":{}})",
        R"({"jsonrpc":"2.0","method":"echo"})",
        R"({"jsonrpc":"2.0","method":"nope","id":9})",
        R"({"jsonrpc":"2.0","method":"cal","id":9})",
        R"({"jsonrpc":"2.0","method":"fails","id":9})",
        R"({"method":"echo","id":4})",
        R"({"jsonrpc":"2.0","id":4})",
        R"({})",
        R"({"jsonrpc":"2.0","method":"echo","params":{"a":{"b":{"c":{"d":{"e":{"f":1}}}}}},"id":5})",
        R"({"jsonrpc":"2.0","method":"echo","params":[[[[[[1]]]]]],"id":5})",
        R"( { "jsonrpc" : "2.0" , "method" : "echo" , "params" : { "s" : "a\"b\\c" } , "id" : -7 } )",
    };
    for (const char* line : lines) {
        const json from_line = call(line, reader);
        const json doc = json::parse(line);
        const json from_doc = nesting_exceeds(line, eng.limits().max_depth) ? json() : eng.handle_request(doc, reader);
        EXPECT_EQ(from_line, from_doc) << line;
    }
    // At the limit (8 levels) it is read; one more is too_deep, found while reading.
    const std::string at_limit = R"({"jsonrpc":"2.0","method":"echo","id":1,"params":)" + std::string(7, '[') +
                                 std::string(7, ']') + "}";
    EXPECT_TRUE(call(at_limit, reader).contains("result")) << at_limit;
    const std::string past = R"({"jsonrpc":"2.0","method":"echo","id":1,"params":)" + std::string(8, '[') +
                             std::string(8, ']') + "}";
    EXPECT_EQ(reason_of(call(past, reader)), reason::too_deep);
    // Scalars and trailing bytes.
    for (const char* line : {"42", "\"s\"", "null", "true"}) {
        const json r = call(line, reader);
        EXPECT_EQ(reason_of(r), reason::invalid_request) << line;
        EXPECT_EQ(r.at("error").at("message"), eng.handle_request(json::parse(line), reader).at("error").at("message"));
    }
    EXPECT_EQ(reason_of(call(R"({"jsonrpc":"2.0","method":"echo","id":1} x)", reader)), reason::parse_error);
}

// Group commit, seen from the engine: a method acknowledged when durable
// that makes one change (a sequence), or none (an idempotent retry), and a
// tracker the test moves by hand.
class held_reply_test : public engine_test {
protected:
    void SetUp() override {
        engine_test::SetUp();
        eng.set_commit_tracker([this] { return latest; }, [this] { return durable; });
        method_info change{"change", role::reader, "one change", [this](const json& p, call_context&) {
                               if (p.is_object() && p.value("retry", false)) {
                                   return json("again");  // changed nothing
                               }
                               return json(++latest);
                           }};
        change.acknowledged_when_durable = true;
        eng.methods().add(change);
    }

    // A line whose reply is held: its text and what it waits for.
    struct held {
        std::string text;
        pending_ack ack;
    };
    held hold(std::string_view line) {
        held h;
        eng.handle_line(line, reader, h.text);
        h.ack = eng.take_pending_ack();
        EXPECT_NE(h.ack.seq, 0U) << line;
        return h;
    }
    json release(held& h, std::uint64_t failed_from = 0, std::uint64_t failed_to = 0) {
        eng.release_held(h.ack, h.text, failed_from, failed_to, "test: the disk said no");
        return json::parse(h.text);
    }
    static rpc_failure late(std::uint64_t seq) {
        return rpc_failure("unavailable", fmt::format("change {} too late", seq), json{{"cause", "commit_late"}});
    }

    std::uint64_t latest = 0;
    std::uint64_t durable = 0;
};

// The case an acknowledged job vanished in: a line that changed nothing
// waits for the change in flight before it, another line's, without taking
// it over; that line's refusal still reaches that line alone.
TEST_F(held_reply_test, a_line_that_changed_nothing_waits_without_claiming_another_lines_change) {
    held made = hold(R"({"jsonrpc":"2.0","method":"change","id":1})");
    held retry = hold(R"({"jsonrpc":"2.0","method":"change","params":{"retry":true},"id":2})");
    EXPECT_EQ(retry.ack.seq, made.ack.seq) << "the retry waits for what is in flight";
    durable = latest;
    EXPECT_TRUE(eng.refuse_change(made.ack.seq, late(made.ack.seq)));
    const json r_retry = release(retry);
    EXPECT_EQ(r_retry.at("result"), "again") << r_retry.dump();
    const json r_made = release(made);
    ASSERT_TRUE(r_made.contains("error")) << "the refused change was acknowledged: " << r_made.dump();
    EXPECT_EQ(r_made.at("error").at("data").at("cause"), "commit_late");
    EXPECT_EQ(r_made.at("id"), 1);
    EXPECT_EQ(eng.held_tracked(), 0U);
}

TEST_F(held_reply_test, in_a_batch_only_the_request_whose_change_was_refused_is_refused) {
    held b = hold(R"([{"jsonrpc":"2.0","method":"change","id":"kept"},)"
                  R"({"jsonrpc":"2.0","method":"echo","params":[7],"id":"read"},)"
                  R"({"jsonrpc":"2.0","method":"change"},)"
                  R"({"jsonrpc":"2.0","method":"change","id":"late"}])");
    ASSERT_EQ(b.ack.requests.size(), 3U) << "the notification has no reply";
    durable = latest;
    EXPECT_TRUE(eng.refuse_change(latest, late(latest)));
    EXPECT_FALSE(eng.refuse_change(latest - 1, late(latest - 1))) << "a notification's change waits for no reply";
    const json r = release(b);
    ASSERT_TRUE(r.is_array()) << r.dump();
    ASSERT_EQ(r.size(), 3U);
    EXPECT_EQ(r[0].at("id"), "kept");
    EXPECT_EQ(r[0].at("result"), 1) << r.dump();
    EXPECT_EQ(r[1].at("result"), json::array({7}));
    EXPECT_EQ(r[2].at("id"), "late");
    EXPECT_EQ(r[2].at("error").at("data").at("cause"), "commit_late") << r.dump();
    EXPECT_EQ(eng.held_tracked(), 0U);
}

TEST_F(held_reply_test, a_failed_commit_answers_store_error_only_to_the_requests_whose_changes_failed) {
    held b = hold(R"([{"jsonrpc":"2.0","method":"change","id":1},)"
                  R"({"jsonrpc":"2.0","method":"echo","params":[1],"id":2},)"
                  R"({"jsonrpc":"2.0","method":"change","id":3}])");
    // The first change committed in one group, the second failed in the next.
    EXPECT_EQ(eng.release_held(b.ack, b.text, 2, 2, "test: the disk said no"), 1U);
    const json r = json::parse(b.text);
    EXPECT_EQ(r[0].at("result"), 1) << r.dump();
    EXPECT_EQ(r[1].at("result"), json::array({1}));
    EXPECT_EQ(reason_of(r[2]), "store_error");
    EXPECT_NE(r[2].at("error").at("message").get<std::string>().find("the disk said no"), std::string::npos);
}

TEST_F(held_reply_test, a_line_never_sent_is_forgotten_with_its_refusals) {
    held h = hold(R"({"jsonrpc":"2.0","method":"change","id":1})");
    EXPECT_TRUE(eng.refuse_change(h.ack.seq, late(h.ack.seq)));
    eng.forget_held(h.ack);
    EXPECT_EQ(eng.held_tracked(), 0U);
    EXPECT_FALSE(eng.refuse_change(h.ack.seq, late(h.ack.seq)));
}
