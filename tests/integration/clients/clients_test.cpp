// The three clients against a real agent socket (qrt-test-server: the rpc
// server, engine, methods and a SQLite-backed ledger): qrtctl (as a
// process), libqrt-client (its C ABI in-process, and the C example as a
// process).  The Python client has its own test (test_python_client.py).
//
// Each error case checks the stable reason AND that the exit status is the
// one the shared table gives for it.

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "qrt_test/process.hpp"
#include "qrt_test/rpc_client.hpp"
#include "qrt/client.h"
#include "qrt/proto/protocol.hpp"

namespace {

using json = nlohmann::json;
namespace reason = qrt::proto::reason;
using qrt::testing::background;
using qrt::testing::ran;
using qrt::testing::run_options;

constexpr uid_t nobody_uid = 65534;
constexpr gid_t nogroup_gid = 65534;

std::string make_temp_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "qrt-clients-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
        throw std::runtime_error("mkdtemp: " + std::string(std::strerror(errno)));
    }
    ::chmod(tmpl.c_str(), 0755);  // the nobody client must reach the socket
    return tmpl;
}

std::vector<std::string> server_argv(const std::string& dir, const std::string& health) {
    const std::string me = "uid:" + std::to_string(::getuid());
    return {QRT_TEST_SERVER,
            "--socket", dir + "/qrtd.sock",
            "--store", dir + "/ledger.db",
            "--scheduler", me,
            "--calibration", me,
            "--reader", "uid:" + std::to_string(nobody_uid),
            "--health", health,
            "--reason", "test: probe " + health,
            "--duration-s", "300"};
}

class clients : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir = new std::string(make_temp_dir());
        server = new background(server_argv(*dir, "ok"), "ready ");
    }
    static void TearDownTestSuite() {
        delete server;
        server = nullptr;
        std::filesystem::remove_all(*dir);
        delete dir;
    }

    static std::string sock() { return *dir + "/qrtd.sock"; }

    // qrtctl --socket <sock> args...
    static ran qrtctl(std::vector<std::string> args, run_options o = {}) {
        args.insert(args.begin(), {QRTCTL, "--socket", sock()});
        return qrt::testing::run(std::move(args), o);
    }
    // The same with --json, the output parsed (fails the test if it is not
    // one JSON document).
    static std::pair<ran, json> qrtctl_json(std::vector<std::string> args, run_options o = {}) {
        args.insert(args.begin(), "--json");
        ran r = qrtctl(std::move(args), o);
        json j = json::parse(r.out, nullptr, false);
        EXPECT_FALSE(j.is_discarded()) << "--json output is not JSON:\n" << r.out << r.err;
        return {r, j};
    }
    static int exit_for(std::string_view reason) { return qrt::proto::exit_code_for_reason(reason); }

    // A fresh key per call, so tests never collide through idempotency.
    static std::string key(std::string_view what) {
        static int n = 0;
        return std::string(what) + "-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
    }

    static std::string* dir;
    static background* server;
};

std::string* clients::dir = nullptr;
background* clients::server = nullptr;

// ------------------------------------------------------------------ qrtctl

TEST_F(clients, qrtctl_hello_shows_the_agent_and_the_callers_roles) {
    const ran human = qrtctl({"agent", "hello"});
    ASSERT_EQ(human.exit_code, 0) << human.err;
    EXPECT_NE(human.out.find("agent_version:"), std::string::npos) << human.out;
    EXPECT_NE(human.out.find("scheduler"), std::string::npos) << human.out;
    EXPECT_NE(human.out.find("slots.reserve"), std::string::npos) << human.out;

    auto [r, j] = qrtctl_json({"agent", "hello"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(j["agent"], "qrtd");

    // Without --socket, $QRT_SOCKET names the agent.
    run_options env;
    env.env = {"QRT_SOCKET=" + sock()};
    const ran via_env = qrt::testing::run({QRTCTL, "--json", "agent", "hello"}, env);
    EXPECT_EQ(via_env.exit_code, 0) << via_env.err;
    EXPECT_TRUE(j["api_version"].is_number_integer());
    const auto& caps = j["capabilities"];
    for (const char* m : {"agent.hello", "agent.status", "qpus.list", "calibration.get",
                          "calibration.update", "slots.query", "slots.reserve", "slots.heartbeat",
                          "slots.release", "jobs.submit", "jobs.status", "jobs.result",
                          "jobs.cancel", "events.subscribe", "telemetry.snapshot", "metrics"}) {
        EXPECT_NE(std::find(caps.begin(), caps.end(), m), caps.end()) << m;
    }
}

TEST_F(clients, qrtctl_query_lists_candidates_as_a_table_and_as_json) {
    const ran human = qrtctl({"slots", "query", "--duration", "2ms", "--qpu", "qpu0"});
    ASSERT_EQ(human.exit_code, 0) << human.err;
    EXPECT_EQ(human.out.rfind("QPU  ", 0), 0U) << human.out;
    EXPECT_NE(human.out.find("\nqpu0  "), std::string::npos) << human.out;

    auto [r, j] = qrtctl_json(
        {"slots", "query", "--duration", "2ms", "--qpu", "qpu0", "--max-candidates", "3"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_FALSE(j["candidates"].empty());
    EXPECT_LE(j["candidates"].size(), 3U);
    for (const auto& c : j["candidates"]) {
        EXPECT_EQ(c["qpu"], "qpu0");
        EXPECT_EQ(c["end_ns"].get<std::int64_t>() - c["start_ns"].get<std::int64_t>(), 2'000'000);
    }
}

TEST_F(clients, qrtctl_reserve_heartbeat_submit_status_cancel_round_trip) {
    const std::string k = key("rt");
    // Placed 30 s ahead: nothing dispatches in the test agent, and a job
    // whose start passed is marked missed.
    // An absolute time: a retry must repeat the request exactly ("+30s"
    // would be a different request the second time: duplicate).
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    const std::string later = std::to_string((now.tv_sec + 30) * 1'000'000'000LL);
    auto [res, r] = qrtctl_json({"slots", "reserve", "--duration", "1ms", "--qpu", "qpu0",
                                 "--not-before", later, "--idempotency-key", k, "--lease", "60s"});
    ASSERT_EQ(res.exit_code, 0) << res.err;
    ASSERT_EQ(r["state"], "held");
    const auto id = std::to_string(r["reservation_id"].get<std::uint64_t>());
    const auto token = std::to_string(r["fencing_token"].get<std::uint64_t>());

    // The same key again: the same reservation (a retried prolog is safe).
    auto [again, r2] = qrtctl_json({"slots", "reserve", "--duration", "1ms", "--qpu", "qpu0",
                                    "--not-before", later, "--idempotency-key", k, "--lease",
                                    "60s"});
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(r2["reservation_id"], r["reservation_id"]);
    // The same key for another request is refused, not silently reused.
    auto [dup, d] = qrtctl_json({"slots", "reserve", "--duration", "2ms", "--qpu", "qpu0",
                                 "--not-before", later, "--idempotency-key", k});
    EXPECT_EQ(d["error"]["reason"], std::string(reason::duplicate)) << dup.out;
    EXPECT_EQ(dup.exit_code, exit_for(reason::duplicate));

    auto [hb, h] = qrtctl_json({"slots", "heartbeat", "-r", id, "-t", token});
    ASSERT_EQ(hb.exit_code, 0) << hb.err;
    EXPECT_GE(h["lease_expires_ns"].get<std::int64_t>(), r["lease_expires_ns"].get<std::int64_t>());

    const std::string payload_file = *dir + "/payload-" + id + ".bin";
    {
        std::ofstream f(payload_file, std::ios::binary);
        f << std::string("\x00\x01\xff circuit", 12);
    }
    auto [sub, s] = qrtctl_json({"jobs", "submit", "--reservation", id, "--fencing-token", token,
                                 "--payload-file", payload_file});
    ASSERT_EQ(sub.exit_code, 0) << sub.err;
    EXPECT_EQ(s["state"], "committed");
    EXPECT_EQ(s["payload_bytes"], 12);

    const ran status = qrtctl({"jobs", "status", id});
    ASSERT_EQ(status.exit_code, 0) << status.err;
    EXPECT_NE(status.out.find("state:           committed"), std::string::npos) << status.out;
    EXPECT_NE(status.out.find("qpu:             qpu0"), std::string::npos) << status.out;

    // No result before the job ran.
    auto [res_early, e] = qrtctl_json({"jobs", "result", id});
    EXPECT_EQ(res_early.exit_code, exit_for(e["error"]["reason"].get<std::string>()));
    EXPECT_NE(res_early.exit_code, 0);

    auto [can, c] = qrtctl_json({"jobs", "cancel", id});
    ASSERT_EQ(can.exit_code, 0) << can.err;
    EXPECT_EQ(c["state"], "cancelled");
}

TEST_F(clients, qrtctl_one_shot_submit_reads_the_payload_from_stdin) {
    run_options o;
    o.stdin_text = "payload from a pipe";
    auto [r, j] = qrtctl_json({"jobs", "submit", "--duration", "1ms", "--qpu", "qpu0",
                               "--not-before", "+30s", "--idempotency-key", key("oneshot"),
                               "--payload-file", "-"},
                              o);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(j["state"], "committed");
    EXPECT_EQ(j["payload_bytes"], 19);
}

TEST_F(clients, qrtctl_errors_exit_with_the_status_of_their_reason) {
    struct expect {
        std::vector<std::string> args;
        std::string reason;
    };
    const std::vector<expect> cases{
        // qpu1 has pushed calibration and no window yet
        {{"slots", "query", "--duration", "1ms", "--qpu", "qpu1", "--deadline", "+1s"}, ""},
        {{"slots", "reserve", "--duration", "1ms", "--qpu", "qpu1", "-k", key("nofit")}, "no_fit"},
        {{"slots", "query", "--duration", "1ms", "--qpu", "no-such-qpu"}, "unknown_qpu"},
        {{"jobs", "status", "999999"}, "not_found"},
        {{"raw", "no.such.method"}, "method_not_found"},
        {{"raw", "slots.query", R"({"duration_ns":"2ms"})"}, "invalid_params"},
        {{"raw", "slots.query", R"({"duration_ns":1000,"deadline":5})"}, "invalid_params"},
        {{"slots", "release", "-r", "999999", "-t", "1"}, "not_found"},
    };
    for (const auto& c : cases) {
        auto args = c.args;
        auto [r, j] = qrtctl_json(args);
        std::string joined;
        for (const auto& a : c.args) {
            joined += a + " ";
        }
        if (c.reason.empty()) {
            // A query that fits nothing is an answer, not an error.
            EXPECT_EQ(r.exit_code, 0) << joined << r.err;
            EXPECT_TRUE(j["candidates"].empty()) << joined;
            continue;
        }
        ASSERT_TRUE(j.contains("error")) << joined << "\n" << r.out;
        EXPECT_EQ(j["error"]["reason"], c.reason) << joined;
        EXPECT_EQ(r.exit_code, exit_for(c.reason)) << joined << r.err;
        EXPECT_NE(r.err.find("(" + c.reason), std::string::npos) << joined << r.err;
    }
}

TEST_F(clients, qrtctl_a_wrong_fencing_token_is_refused_with_its_reason) {
    auto [res, r] = qrtctl_json(
        {"slots", "reserve", "--duration", "1ms", "--qpu", "qpu0", "-k", key("token")});
    ASSERT_EQ(res.exit_code, 0) << res.err;
    const auto id = std::to_string(r["reservation_id"].get<std::uint64_t>());
    const auto bad = std::to_string(r["fencing_token"].get<std::uint64_t>() + 1000);
    auto [rel, e] = qrtctl_json({"slots", "release", "-r", id, "-t", bad});
    ASSERT_TRUE(e.contains("error")) << rel.out;
    EXPECT_EQ(e["error"]["reason"], std::string(reason::bad_fencing_token));
    EXPECT_EQ(rel.exit_code, exit_for(reason::bad_fencing_token));
}

namespace {
// Whether uid/gid can execute path: a checkout under a 0700 directory (as
// mktemp -d makes) hides the binaries from every other user.
bool executable_as(uid_t uid, gid_t gid, const char* path) {
    return qrt::testing::run_in_child([&](std::string&) {
               if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) {
                   return 2;
               }
               return ::access(path, X_OK) == 0 ? 0 : 1;
           }).exit_code == 0;
}
}  // namespace

TEST_F(clients, qrtctl_a_reader_may_query_but_not_reserve) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to run qrtctl as uid " << nobody_uid;
    }
    if (!executable_as(nobody_uid, nogroup_gid, QRTCTL)) {
        GTEST_SKIP() << "uid " << nobody_uid << " cannot execute " << QRTCTL
                     << " (a parent directory is not searchable by other users)";
    }
    run_options o;
    o.as_uid = nobody_uid;
    o.as_gid = nogroup_gid;
    auto [q, qj] = qrtctl_json({"slots", "query", "--duration", "1ms"}, o);
    EXPECT_EQ(q.exit_code, 0) << q.err;
    auto [r, rj] = qrtctl_json({"slots", "reserve", "--duration", "1ms", "-k", key("ro")}, o);
    ASSERT_TRUE(rj.contains("error")) << r.out << r.err;
    EXPECT_EQ(rj["error"]["reason"], std::string(reason::permission_denied));
    EXPECT_EQ(r.exit_code, exit_for(reason::permission_denied));
}

TEST_F(clients, qrtctl_calibration_update_opens_a_window_that_query_then_uses) {
    auto [u, uj] = qrtctl_json({"calibration", "update", "--qpu", "qpu1", "--window",
                                "41,+100ms,+10s,0.97", "--window", "42,+10s,+20s"});
    ASSERT_EQ(u.exit_code, 0) << u.err;
    EXPECT_EQ(uj["windows"], 2);

    const ran get = qrtctl({"calibration", "get", "--qpu", "qpu1"});
    ASSERT_EQ(get.exit_code, 0) << get.err;
    EXPECT_NE(get.out.find("\n41  "), std::string::npos) << get.out;
    EXPECT_NE(get.out.find("0.970"), std::string::npos) << get.out;

    auto [q, qj] = qrtctl_json({"slots", "query", "--duration", "1ms", "--qpu", "qpu1"});
    ASSERT_EQ(q.exit_code, 0) << q.err;
    ASSERT_FALSE(qj["candidates"].empty());
    EXPECT_EQ(qj["candidates"][0]["calibration_id"], 41);
}

TEST_F(clients, qrtctl_events_follow_prints_the_events_another_client_causes) {
    // The subscriber prints its subscription first: only then reserve.
    background sub({QRTCTL, "--socket", sock(), "--json", "events", "--follow", "--topic",
                    "reservation.reserved", "--count", "1"},
                   "{");
    const ran r = qrtctl({"slots", "reserve", "--duration", "1ms", "--qpu", "qpu0", "-k",
                          key("event")});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_EQ(sub.finish(std::chrono::seconds(10)), 0) << sub.output();
    const std::string& out = sub.output();
    const auto nl = out.find('\n');
    ASSERT_NE(nl, std::string::npos) << out;
    const json first = json::parse(out.substr(0, nl), nullptr, false);
    const json second = json::parse(out.substr(nl + 1), nullptr, false);
    ASSERT_FALSE(second.is_discarded()) << out;
    EXPECT_EQ(first["subscribed"], true) << out;
    EXPECT_EQ(second["type"], "reservation.reserved");
    EXPECT_EQ(second["seq"], 1);
    EXPECT_EQ(second["data"]["qpu"], "qpu0");
}

TEST_F(clients, qrtctl_metrics_and_telemetry_show_the_servers_counters) {
    const ran m = qrtctl({"metrics"});
    ASSERT_EQ(m.exit_code, 0) << m.err;
    EXPECT_NE(m.out.find("# TYPE "), std::string::npos) << m.out.substr(0, 500);
    EXPECT_NE(m.out.find("qrt_rpc_"), std::string::npos);
    auto [t, tj] = qrtctl_json({"telemetry", "--prefix", "qrt_rpc_"});
    ASSERT_EQ(t.exit_code, 0) << t.err;
    ASSERT_FALSE(tj["counters"].empty());
    for (const auto& c : tj["counters"]) {
        EXPECT_EQ(c["name"].get<std::string>().rfind("qrt_rpc_", 0), 0U) << c["name"];
    }
}

TEST_F(clients, qrtctl_raw_line_reports_malformed_input_with_parse_error) {
    const ran r = qrtctl({"raw", "--line", "{\"jsonrpc\":\"2.0\",\"id\":1,"});
    EXPECT_EQ(r.exit_code, exit_for(reason::parse_error)) << r.out << r.err;
    const json reply = json::parse(r.out, nullptr, false);
    ASSERT_FALSE(reply.is_discarded()) << r.out;
    EXPECT_EQ(reply["error"]["data"]["reason"], std::string(reason::parse_error));
}

TEST_F(clients, qrtctl_health_is_ok_on_a_healthy_agent) {
    const ran h = qrtctl({"health"});
    EXPECT_EQ(h.exit_code, 0) << h.out << h.err;
    EXPECT_EQ(h.out.rfind("ok: qrtd ", 0), 0U) << h.out;
    auto [l, lj] = qrtctl_json({"health", "--liveness"});
    EXPECT_EQ(l.exit_code, 0);
    EXPECT_EQ(lj["healthy"], true);
}

TEST_F(clients, qrtctl_health_fails_on_a_degraded_or_missing_agent_with_the_reason) {
    const std::string d = make_temp_dir();
    {
        background degraded(server_argv(d, "degraded"), "ready ");
        const ran h = qrt::testing::run({QRTCTL, "--socket", d + "/qrtd.sock", "health"});
        EXPECT_EQ(h.exit_code, 18) << h.out << h.err;
        EXPECT_NE(h.out.find("degraded: "), std::string::npos) << h.out;
        EXPECT_NE(h.out.find("test: probe degraded"), std::string::npos) << h.out;
        // Liveness only asks whether it answers.
        const ran l =
            qrt::testing::run({QRTCTL, "--socket", d + "/qrtd.sock", "health", "--liveness"});
        EXPECT_EQ(l.exit_code, 0) << l.err;
    }
    const ran gone = qrt::testing::run({QRTCTL, "--socket", d + "/qrtd.sock", "health"});
    EXPECT_EQ(gone.exit_code, 69);
    EXPECT_NE(gone.err.find("cannot connect to " + d + "/qrtd.sock"), std::string::npos)
        << gone.err;
    EXPECT_NE(gone.err.find("(is qrtd running?)"), std::string::npos) << gone.err;
    std::filesystem::remove_all(d);
}

TEST_F(clients, qrtctl_a_hung_agent_times_out_with_exit_75) {
    // Accepts connections (the kernel's backlog) but never answers: a hung agent.
    const qrt::testing::unix_socket_file hung(*dir + "/hung.sock", 8);
    const ran r = qrt::testing::run(
        {QRTCTL, "--socket", hung.path(), "--timeout", "300ms", "agent", "hello"});
    EXPECT_EQ(r.exit_code, 75) << r.err;
    EXPECT_NE(r.err.find("no reply from " + hung.path() + " within 300 ms"), std::string::npos)
        << r.err;
    const ran h = qrt::testing::run({QRTCTL, "--socket", hung.path(), "--timeout", "300ms", "health"});
    EXPECT_EQ(h.exit_code, 75) << h.err;
}

// ------------------------------------------------------------- C library

TEST_F(clients, c_example_reserves_submits_and_reads_status) {
    const ran r = qrt::testing::run({QRT_CLIENT_EXAMPLE, "--socket", sock(), "--qpu", "qpu0",
                                     "--duration-ns", "1000000", "--lead-ms", "30000", "--key",
                                     key("cexample")});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("hello {"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("reserved id="), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("state=committed"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("status job="), std::string::npos) << r.out;
}

TEST_F(clients, c_example_exits_with_the_reason_status_on_no_fit_and_no_agent) {
    const ran nofit = qrt::testing::run({QRT_CLIENT_EXAMPLE, "--socket", sock(), "--qpu",
                                         "no-such-qpu", "--key", key("cbad")});
    EXPECT_EQ(nofit.exit_code, exit_for(reason::unknown_qpu)) << nofit.err;
    EXPECT_NE(nofit.err.find("reason unknown_qpu"), std::string::npos) << nofit.err;
    const ran gone = qrt::testing::run({QRT_CLIENT_EXAMPLE, "--socket", *dir + "/none.sock"});
    EXPECT_EQ(gone.exit_code, 69) << gone.err;
    EXPECT_NE(gone.err.find("is qrtd running?"), std::string::npos) << gone.err;
}

class c_abi : public clients {
protected:
    void SetUp() override {
        qrt_error err;
        ASSERT_EQ(qrt_connect(sock().c_str(), &c, &err), 0) << err.message;
    }
    void TearDown() override { qrt_close(c); }
    qrt_client* c = nullptr;
};

TEST_F(c_abi, call_returns_json_text_the_caller_frees) {
    char* out = nullptr;
    qrt_error err;
    ASSERT_EQ(qrt_call(c, "qpus.list", nullptr, &out, &err), 0) << err.message;
    ASSERT_NE(out, nullptr);
    const json j = json::parse(out);
    qrt_free(out);
    EXPECT_EQ(j["qpus"].size(), 2U);
}

TEST_F(c_abi, an_agent_error_is_eremoteio_with_code_and_reason) {
    char* out = reinterpret_cast<char*>(0x1);
    qrt_error err;
    const int rc = qrt_call(c, "slots.query", R"({"duration_ns":1000,"qpus":["nope"]})", &out, &err);
    EXPECT_EQ(rc, -EREMOTEIO);
    EXPECT_EQ(out, nullptr);
    EXPECT_EQ(std::string_view(err.reason), reason::unknown_qpu);
    EXPECT_EQ(err.code, qrt::proto::code_for_reason(reason::unknown_qpu));
    EXPECT_EQ(err.sys_errno, 0);
    EXPECT_NE(std::string(err.message).find("nope"), std::string::npos) << err.message;
    EXPECT_EQ(qrt_exit_code_for_reason(err.reason), exit_for(reason::unknown_qpu));
}

TEST_F(c_abi, bad_arguments_are_einval_and_send_nothing) {
    qrt_error err;
    EXPECT_EQ(qrt_call(c, "slots.query", "{not json", nullptr, &err), -EINVAL);
    EXPECT_STREQ(err.reason, "client_error");
    EXPECT_EQ(qrt_call(c, "slots.query", "[1,2]", nullptr, &err), -EINVAL);
    EXPECT_EQ(qrt_call(c, nullptr, nullptr, nullptr, &err), -EINVAL);
    EXPECT_EQ(qrt_call(nullptr, "agent.hello", nullptr, nullptr, nullptr), -EINVAL);
    qrt_slot_request req{};
    EXPECT_EQ(qrt_slots_reserve(c, &req, "k", 0, nullptr, &err), -EINVAL);
    req.duration_ns = 1000;
    EXPECT_EQ(qrt_slots_reserve(c, &req, nullptr, 0, nullptr, &err), -EINVAL);
    // The connection is still good.
    EXPECT_EQ(qrt_hello(c, nullptr, &err), 0) << err.message;
}

TEST_F(c_abi, reserve_submit_status_release_through_the_convenience_calls) {
    qrt_error err;
    qrt_slot_request req{};
    req.duration_ns = 1'000'000;
    req.qpu = "qpu0";
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    req.not_before_ns = (now.tv_sec + 30) * 1'000'000'000LL;  // commit before the start
    const std::string k = key("cabi");
    qrt_reservation r{};
    ASSERT_EQ(qrt_slots_reserve(c, &req, k.c_str(), 30'000'000'000, &r, &err), 0) << err.message;
    EXPECT_GT(r.reservation_id, 0U);
    EXPECT_STREQ(r.state, "held");
    EXPECT_STREQ(r.qpu, "qpu0");
    EXPECT_EQ(r.end_ns - r.start_ns, 1'000'000);

    qrt_reservation hb{};
    ASSERT_EQ(qrt_slots_heartbeat(c, r.reservation_id, r.fencing_token, &hb, &err), 0);
    EXPECT_EQ(hb.reservation_id, r.reservation_id);

    EXPECT_EQ(qrt_slots_release(c, r.reservation_id, r.fencing_token + 99, &err), -EREMOTEIO);
    EXPECT_EQ(std::string_view(err.reason), reason::bad_fencing_token);

    const unsigned char payload[] = {0, 1, 2, 255, 254};
    qrt_reservation job{};
    ASSERT_EQ(qrt_jobs_submit(c, r.reservation_id, r.fencing_token, payload, sizeof(payload),
                              &job, &err),
              0)
        << err.message;
    EXPECT_STREQ(job.state, "committed");
    qrt_reservation st{};
    ASSERT_EQ(qrt_jobs_status(c, r.reservation_id, &st, &err), 0);
    EXPECT_STREQ(st.state, "committed");
    // A cancel that states a token that is not the job's changes nothing.
    EXPECT_EQ(qrt_jobs_cancel_fenced(c, r.reservation_id, r.fencing_token ^ 1, &err), -EREMOTEIO);
    EXPECT_EQ(std::string_view(err.reason), reason::bad_fencing_token);
    ASSERT_EQ(qrt_jobs_status(c, r.reservation_id, &st, &err), 0);
    EXPECT_STREQ(st.state, "committed");
    EXPECT_EQ(qrt_jobs_cancel(c, r.reservation_id, &err), 0) << err.message;
    ASSERT_EQ(qrt_jobs_status(c, r.reservation_id, &st, &err), 0);
    EXPECT_STREQ(st.state, "cancelled");
}

TEST_F(c_abi, a_gang_reserve_fills_one_record_per_qpu_with_one_start_and_one_token) {
    qrt_error err;
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    const std::int64_t now_ns = now.tv_sec * 1'000'000'000LL + now.tv_nsec;
    // qpu1 is pushed: give it a window that overlaps qpu0's periodic ones.
    const json windows{{"qpu", "qpu1"},
                       {"windows", json::array({{{"calibration_id", 7001},
                                                 {"valid_from_ns", now_ns},
                                                 {"valid_until_ns", now_ns + 120'000'000'000}}})}};
    ASSERT_EQ(qrt_call(c, "calibration.update", windows.dump().c_str(), nullptr, &err), 0)
        << err.message;
    qrt_slot_request req{};
    req.duration_ns = 2'000'000;
    req.not_before_ns = now_ns + 2'000'000'000;
    const std::string k = key("gang");
    qrt_reservation one[1];
    EXPECT_EQ(qrt_slots_reserve_gang(c, &req, 2, k.c_str(), 0, one, 1, &err), -ENOSPC);
    qrt_reservation g[2];
    ASSERT_EQ(qrt_slots_reserve_gang(c, &req, 2, k.c_str(), 0, g, 2, &err), 2) << err.message;
    EXPECT_EQ(g[0].start_ns, g[1].start_ns);
    EXPECT_STRNE(g[0].qpu, g[1].qpu);
    EXPECT_EQ(g[0].fencing_token, g[1].fencing_token);
    EXPECT_NE(g[0].reservation_id, g[1].reservation_id);
    EXPECT_STREQ(g[0].state, "held");
    // The same key returns the same gang.
    qrt_reservation again[2];
    ASSERT_EQ(qrt_slots_reserve_gang(c, &req, 2, k.c_str(), 0, again, 2, &err), 2);
    EXPECT_EQ(again[0].reservation_id, g[0].reservation_id);
    // Releasing one member releases the gang.
    ASSERT_EQ(qrt_slots_release(c, g[0].reservation_id, g[0].fencing_token, &err), 0);
    qrt_reservation st{};
    ASSERT_EQ(qrt_jobs_status(c, g[1].reservation_id, &st, &err), 0);
    EXPECT_STREQ(st.state, "released");
    // k == 1 is a plain reserve; a named QPU is refused for a gang.
    req.qpu = "qpu0";
    EXPECT_EQ(qrt_slots_reserve_gang(c, &req, 1, key("g1").c_str(), 0, one, 1, &err), 1)
        << err.message;
    EXPECT_STREQ(one[0].qpu, "qpu0");
    EXPECT_EQ(qrt_slots_reserve_gang(c, &req, 2, key("g2").c_str(), 0, g, 2, &err), -EINVAL);
}

TEST_F(c_abi, a_job_without_a_result_is_not_ready_and_nothing_is_returned) {
    qrt_error err;
    qrt_slot_request req{};
    req.duration_ns = 1'000'000;
    req.qpu = "qpu0";
    qrt_reservation r{};
    ASSERT_EQ(qrt_slots_reserve(c, &req, key("res").c_str(), 0, &r, &err), 0) << err.message;
    void* bytes = reinterpret_cast<void*>(0x1);
    std::size_t n = 99;
    EXPECT_EQ(qrt_jobs_result(c, r.reservation_id, &bytes, &n, nullptr, &err), -EREMOTEIO);
    EXPECT_EQ(std::string_view(err.reason), reason::not_ready);
    EXPECT_EQ(bytes, nullptr);
    EXPECT_EQ(n, 0U);
    EXPECT_EQ(qrt_jobs_result(c, r.reservation_id, nullptr, &n, nullptr, &err), -EINVAL);
}

TEST(c_abi_json, json_get_reads_members_by_pointer_and_says_why_not) {
    const char* doc = R"({"partition":{"isolated_cpus":"1-3"},"gang":[{"qpu":"a","id":7}],"ok":true})";
    char buf[64];
    EXPECT_EQ(qrt_json_get(doc, "/partition/isolated_cpus", buf, sizeof buf), 0);
    EXPECT_STREQ(buf, "1-3");
    EXPECT_EQ(qrt_json_get(doc, "/gang/0/id", buf, sizeof buf), 0);
    EXPECT_STREQ(buf, "7");
    EXPECT_EQ(qrt_json_get(doc, "/gang/0", buf, sizeof buf), 0);
    EXPECT_STREQ(buf, R"({"id":7,"qpu":"a"})");
    EXPECT_EQ(qrt_json_get(doc, "/ok", buf, sizeof buf), 0);
    EXPECT_STREQ(buf, "true");
    EXPECT_EQ(qrt_json_get(doc, "/partition/nope", buf, sizeof buf), -ENOENT);
    EXPECT_EQ(qrt_json_get(doc, "/gang/5", buf, sizeof buf), -ENOENT);
    char small[3];
    EXPECT_EQ(qrt_json_get(doc, "/partition/isolated_cpus", small, sizeof small), -ENOSPC);
    EXPECT_STREQ(small, "1-");
    EXPECT_EQ(qrt_json_get("{not json", "/a", buf, sizeof buf), -EINVAL);
    EXPECT_EQ(qrt_json_get(doc, "no-leading-slash", buf, sizeof buf), -EINVAL);
    EXPECT_EQ(qrt_json_get(doc, "/gang/x", buf, sizeof buf), -ENOENT);
}

TEST_F(c_abi, events_arrive_through_next_event_in_order) {
    qrt_error err;
    ASSERT_EQ(qrt_call(c, "events.subscribe", R"({"topics":["reservation.reserved"]})", nullptr,
                       &err),
              0)
        << err.message;
    char* ev = nullptr;
    EXPECT_EQ(qrt_next_event(c, 50, &ev, &err), -ETIMEDOUT);
    EXPECT_EQ(ev, nullptr);

    qrt_slot_request req{};
    req.duration_ns = 1'000'000;
    req.qpu = "qpu0";
    const std::string k1 = key("ev");
    const std::string k2 = key("ev");
    ASSERT_EQ(qrt_slots_reserve(c, &req, k1.c_str(), 0, nullptr, &err), 0) << err.message;
    ASSERT_EQ(qrt_slots_reserve(c, &req, k2.c_str(), 0, nullptr, &err), 0) << err.message;
    for (int seq = 1; seq <= 2; ++seq) {
        ASSERT_EQ(qrt_next_event(c, 5000, &ev, &err), 0) << err.message;
        const json j = json::parse(ev);
        qrt_free(ev);
        EXPECT_EQ(j["seq"], seq);
        EXPECT_EQ(j["type"], "reservation.reserved");
    }
}

// The holder of a held reservation in a calibration block's way hears
// reservation.yield_requested; qrt_yield_request_read gives its fields
// (the block, the deadline, the nearest free start, what happens then).
TEST_F(c_abi, a_yield_request_reaches_the_holder_and_reads_into_its_fields) {
    qrt_error err;
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    const std::int64_t now_ns = now.tv_sec * 1'000'000'000LL + now.tv_nsec;
    constexpr std::int64_t s = 1'000'000'000;
    const json windows{{"qpu", "qpu1"},
                       {"windows", json::array({{{"calibration_id", 7101},
                                                 {"valid_from_ns", now_ns},
                                                 {"valid_until_ns", now_ns + 120 * s}}})}};
    ASSERT_EQ(qrt_call(c, "calibration.update", windows.dump().c_str(), nullptr, &err), 0)
        << err.message;
    ASSERT_EQ(qrt_call(c, "events.subscribe", R"({"topics":["reservation.yield_requested"]})", nullptr,
                       &err),
              0)
        << err.message;
    // Held from 2 s to 30 s: a 10 s block ending by 30 s fits only there.
    qrt_slot_request req{};
    req.duration_ns = 28 * s;
    req.not_before_ns = now_ns + 2 * s;
    req.qpu = "qpu1";
    qrt_reservation held{};
    ASSERT_EQ(qrt_slots_reserve(c, &req, key("held").c_str(), 60 * s, &held, &err), 0) << err.message;
    ASSERT_EQ(held.start_ns, now_ns + 2 * s);
    const json ask{{"qpu", "qpu1"},         {"step", "x_amplitude"},  {"duration_ns", 10 * s},
                   {"needed_by_ns", now_ns + 30 * s}, {"idempotency_key", key("block")}};
    char* out = nullptr;
    ASSERT_EQ(qrt_call(c, "calibration.request", ask.dump().c_str(), &out, &err), 0) << err.message;
    const json block = json::parse(out);
    qrt_free(out);
    ASSERT_EQ(block["state"], "yielding") << block.dump();

    char* ev = nullptr;
    ASSERT_EQ(qrt_next_event(c, 5000, &ev, &err), 0) << err.message;
    qrt_yield_request y;
    const int rc = qrt_yield_request_read(ev, &y);
    const json j = json::parse(ev);
    qrt_free(ev);
    ASSERT_EQ(rc, 0) << j.dump();
    EXPECT_EQ(y.reservation_id, held.reservation_id);
    EXPECT_EQ(y.start_ns, held.start_ns);
    EXPECT_STREQ(y.qpu, "qpu1");
    EXPECT_EQ(y.block_id, block["block_id"].get<std::uint64_t>());
    EXPECT_EQ(y.block_start_ns, block["start_ns"].get<std::int64_t>());
    EXPECT_EQ(y.block_end_ns, block["end_ns"].get<std::int64_t>());
    EXPECT_STREQ(y.step, "x_amplitude");
    EXPECT_EQ(y.deadline_ns, block["yield_deadline_ns"].get<std::int64_t>());
    EXPECT_EQ(y.free_start_ns, j["data"]["free_start_ns"].get<std::int64_t>());
    EXPECT_GE(y.free_start_ns, y.block_end_ns);
    EXPECT_STREQ(y.at_deadline, "keep");  // timeline.calibration_preempt = "never"
    EXPECT_NE(std::string(y.reason).find("calibration block"), std::string::npos) << y.reason;

    // Any other event is -ENOENT, and what is not an event -EINVAL.
    EXPECT_EQ(qrt_yield_request_read(R"({"seq":1,"type":"reservation.reserved","data":{}})", &y), -ENOENT);
    EXPECT_EQ(y.reservation_id, 0U);
    EXPECT_EQ(qrt_yield_request_read("[1]", &y), -EINVAL);
    EXPECT_EQ(qrt_yield_request_read(R"({"type":"reservation.yield_requested","data":{}})", &y), -EINVAL);
    EXPECT_EQ(qrt_yield_request_read(nullptr, &y), -EINVAL);

    // The holder gives its time back.
    ASSERT_EQ(qrt_slots_release(c, held.reservation_id, held.fencing_token, &err), 0) << err.message;
}

TEST_F(clients, c_abi_a_hung_agent_is_etimedout_after_the_set_timeout) {
    const qrt::testing::unix_socket_file hung(*dir + "/hung-c.sock", 8);
    qrt_client* c = nullptr;
    qrt_error err;
    ASSERT_EQ(qrt_connect(hung.path().c_str(), &c, &err), 0) << err.message;
    ASSERT_EQ(qrt_set_timeout(c, 200), 0);
    EXPECT_EQ(qrt_set_timeout(c, 0), -EINVAL);
    EXPECT_EQ(qrt_hello(c, nullptr, &err), -ETIMEDOUT);
    EXPECT_STREQ(err.reason, "timeout");
    EXPECT_EQ(qrt_exit_code_for_reason(err.reason), 75);
    qrt_close(c);
}

TEST(c_abi_no_agent, connect_to_a_missing_socket_is_enoent_with_a_hint) {
    qrt_client* c = reinterpret_cast<qrt_client*>(0x1);
    qrt_error err;
    EXPECT_EQ(qrt_connect("/nonexistent/qrtd.sock", &c, &err), -ENOENT);
    EXPECT_EQ(c, nullptr);
    EXPECT_STREQ(err.reason, "unreachable");
    EXPECT_STREQ(err.message,
                 "cannot connect to /nonexistent/qrtd.sock: No such file or directory (is qrtd "
                 "running?)");
    EXPECT_EQ(qrt_exit_code_for_reason(err.reason), 69);
    const std::string long_path(200, 'x');
    EXPECT_EQ(qrt_connect(long_path.c_str(), &c, &err), -ENAMETOOLONG);
    EXPECT_EQ(qrt_connect(nullptr, nullptr, &err), -EINVAL);
}

}  // namespace
