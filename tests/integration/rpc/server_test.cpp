// The control socket end to end: a real server on a temporary UNIX socket,
// the event loop on its own thread, a real ledger with a SQLite store, and
// real client sockets.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "qrt/event_loop.hpp"
#include "qrt/rpc/methods.hpp"
#include "qrt/rpc/server.hpp"
#include "qrt/rpc/timeline_methods.hpp"
#include "qrt/timeline/ledger.hpp"
#include "qrt_test/rpc_client.hpp"
#include "rtcore/clock.hpp"

#include "rpc_harness.hpp"

using namespace std::chrono_literals;
using namespace qrt::testing::rpc_harness;

// ------------------------------------------------------------------ methods

TEST(rpc_server, every_method_answers_an_admin) {
    harness h(admin_options());
    client c(h.socket_path);
    ASSERT_TRUE(c.connected());

    const json hello = c.ok("agent.hello", {{"client", "test"}});
    EXPECT_EQ(hello.at("api_version"), 1);
    const auto caps = hello.at("capabilities").get<std::vector<std::string>>();
    for (const char* m : {"agent.hello", "agent.status", "qpus.list", "calibration.get",
                          "calibration.update", "slots.query", "slots.reserve", "slots.heartbeat",
                          "slots.release", "jobs.submit", "jobs.status", "jobs.result",
                          "jobs.cancel", "events.subscribe", "telemetry.snapshot", "metrics"}) {
        EXPECT_NE(std::find(caps.begin(), caps.end(), m), caps.end()) << m;
    }
    EXPECT_EQ(hello.at("peer").at("roles"), json::array({"admin"}));
    EXPECT_EQ(c.ok("agent.status").at("health"), "ok");
    const json qpus = c.ok("qpus.list");
    ASSERT_EQ(qpus.at("qpus").size(), 3U);

    const json cal = c.ok("calibration.get", {{"qpu", "q0"}});
    ASSERT_FALSE(cal.at("windows").empty());
    const std::int64_t t0 = h.now() + 60 * s_ns;
    const json upd = c.ok("calibration.update",
                          {{"qpu", "qp"},
                           {"windows", {{{"calibration_id", 7},
                                         {"valid_from_ns", t0},
                                         {"valid_until_ns", t0 + 5 * s_ns},
                                         {"f0", 0.98}}}}});
    EXPECT_EQ(upd.at("windows"), 1);
    EXPECT_EQ(c.ok("calibration.get", {{"qpu", "qp"}}).at("windows")[0].at("calibration_id"), 7);

    const std::int64_t start = h.window_start(30 * s_ns);
    const json q = c.ok("slots.query", request_at(start, 1'000'000));
    ASSERT_EQ(q.at("candidates").size(), 1U);
    EXPECT_EQ(q.at("candidates")[0].at("start_ns"), start);

    // A gang query: one start on both periodic QPUs, nothing reserved.
    json gq = request_at(start, 1'000'000);
    gq["qpus"] = {"q0", "q1"};
    gq["gang_size"] = 2;
    const json g = c.ok("slots.query", gq);
    ASSERT_EQ(g.at("candidates").size(), 2U) << g.dump();
    EXPECT_EQ(g.at("candidates")[0].at("start_ns"), g.at("candidates")[1].at("start_ns"));
    EXPECT_NE(g.at("candidates")[0].at("qpu"), g.at("candidates")[1].at("qpu"));
    gq["gang_size"] = 3;
    EXPECT_EQ(reason_of(c.call("slots.query", gq)), rpc::reason::invalid_argument);

    json req = request_at(start, 1'000'000);
    req["idempotency_key"] = "k1";
    req["lease_ns"] = 30 * s_ns;
    const json r = c.ok("slots.reserve", req);
    EXPECT_EQ(r.at("state"), "held");
    const auto id = r.at("reservation_id").get<std::uint64_t>();
    const auto token = r.at("fencing_token").get<std::uint64_t>();
    EXPECT_EQ(c.ok("slots.heartbeat", {{"reservation_id", id}, {"fencing_token", token}})
                  .at("state"),
              "held");
    const json sub = c.ok("jobs.submit", {{"reservation_id", id},
                                         {"fencing_token", token},
                                         {"payload", rpc::base64_encode("PULSE")}});
    EXPECT_EQ(sub.at("state"), "committed");
    EXPECT_EQ(sub.at("payload_bytes"), 5);
    EXPECT_EQ(c.ok("jobs.status", {{"job_id", id}}).at("state"), "committed");
    EXPECT_EQ(reason_of(c.call("jobs.result", {{"job_id", id}})), rpc::reason::not_ready);
    EXPECT_EQ(c.ok("jobs.cancel", {{"job_id", id}}).at("state"), "cancelled");

    // One-shot place + commit, then the agent dispatches and completes it.
    json oneshot = request_at(start + 2'000'000, 1'000'000);
    oneshot["idempotency_key"] = "k2";
    oneshot["payload"] = rpc::base64_encode(std::string("\x00\x01\x02", 3));
    const auto queued = [&](const char* qpu) {
        const json list = c.ok("qpus.list");
        for (const auto& entry : list.at("qpus")) {
            if (entry.at("name") == qpu) {
                return entry.at("queued_jobs").get<std::size_t>();
            }
        }
        return std::size_t{999};
    };
    EXPECT_EQ(queued("q0"), 0U);
    const json j = c.ok("jobs.submit", oneshot);
    const auto job = j.at("job_id").get<std::uint64_t>();
    EXPECT_EQ(j.at("state"), "committed");
    // The QPU's queue (QDMI's queue length): committed jobs not yet started.
    EXPECT_EQ(queued(j.at("qpu").get<std::string>().c_str()), 1U);
    h.on_loop([&] {
        EXPECT_TRUE(h.ledger->mark_dispatched(job, h.now()));
        EXPECT_TRUE(h.ledger->complete(job, tl::blob{'o', 'k'}, h.now()));
        h.eng->drain_event_sources();
        return 0;
    });
    const json res = c.ok("jobs.result", {{"job_id", job}});
    EXPECT_EQ(res.at("state"), "completed");
    EXPECT_EQ(queued(j.at("qpu").get<std::string>().c_str()), 0U);
    EXPECT_EQ(rpc::base64_decode_strict(res.at("result").get<std::string>()), std::string("ok"));

    // A second held reservation, released.
    json req3 = request_at(start + 4'000'000, 1'000'000);
    req3["idempotency_key"] = "k3";
    const json r3 = c.ok("slots.reserve", req3);
    EXPECT_EQ(c.ok("slots.release", {{"reservation_id", r3.at("reservation_id")},
                                      {"fencing_token", r3.at("fencing_token")}})
                  .at("state"),
              "released");

    EXPECT_EQ(c.ok("events.subscribe").at("subscribed"), true);
    const json snap = c.ok("telemetry.snapshot");
    EXPECT_FALSE(snap.at("counters").empty());
    const std::string text = c.ok("metrics").at("text");
    EXPECT_NE(text.find("qrt_rpc_requests_total{method=\"slots.reserve\"} 2"), std::string::npos);
    EXPECT_NE(text.find("qrt_rpc_connections 1"), std::string::npos) << text;
}

TEST(rpc_server, the_socket_file_gets_the_configured_mode_and_a_stale_one_is_replaced) {
    harness_options o = admin_options();
    o.server.socket_mode = 0660;
    auto h = std::make_unique<harness>(o);
    struct stat st {};
    ASSERT_EQ(::stat(h->socket_path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777U, 0660U);
    // A second server on the same live path refuses to steal it.
    qrt::event_loop loop2;
    rpc::engine eng2;
    rpc::server_options so;
    so.socket_path = h->socket_path;
    so.socket_activation = false;
    rpc::server s2(loop2, eng2, *h->auth, so);
    auto st2 = s2.start();
    ASSERT_FALSE(st2);
    EXPECT_NE(st2.err().message.find(h->socket_path), std::string::npos) << st2.err().message;
    // A stale socket (nobody listening) is replaced.
    const qrt::testing::unix_socket_file stale_file((h->dir / "stale.sock").string());
    const std::string& stale = stale_file.path();
    so.socket_path = stale;
    rpc::server s3(loop2, eng2, *h->auth, so);
    ASSERT_TRUE(s3.start());
    EXPECT_EQ(s3.listen_source(), "bind");
    client c(stale);
    EXPECT_TRUE(c.connected());
    s3.stop();
    EXPECT_FALSE(std::filesystem::exists(stale)) << "stop() unlinks the socket it bound";
}

TEST(rpc_server, a_systemd_socket_is_used_instead_of_binding) {
    const auto dir = std::filesystem::temp_directory_path() /
                     fmt::format("qrt-rpc-activation-{}", ::getpid());
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "activated.sock").string();
    const qrt::testing::unix_socket_file listener(path, 16);
    const int lfd = listener.fd();
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        // The child plays qrtd started by qrtd.socket: fd 3 + LISTEN_FDS.
        if (::dup2(lfd, 3) < 0) {
            ::_exit(10);
        }
        ::setenv("LISTEN_FDS", "1", 1);
        ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
        qrt::event_loop loop;
        rpc::engine eng;
        rpc::role_map m;
        m.admin = {me()};
        auto auth = rpc::authorizer::compile(m);
        rpc::agent_hooks hooks;
        rpc::register_agent_methods(eng, hooks);
        eng.methods().add({"test.quit", rpc::role::admin, "", [&loop](const json&, rpc::call_context&) {
                               loop.stop();
                               return json(true);
                           }});
        rpc::server_options so;
        so.socket_path = (dir / "must-not-be-bound.sock").string();
        rpc::server srv(loop, eng, *auth, so);
        if (!srv.start()) {
            ::_exit(11);
        }
        if (srv.listen_source() != "systemd" || std::filesystem::exists(so.socket_path)) {
            ::_exit(12);
        }
        loop.run();
        srv.stop();
        ::_exit(0);
    }
    {
        client c(path);
        ASSERT_TRUE(c.connected());
        EXPECT_EQ(c.ok("agent.hello").at("api_version"), 1);
        c.ok("test.quit");
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "11: start failed, 12: did not use the passed socket";
    std::filesystem::remove_all(dir);
}

TEST(rpc_server, the_metrics_textfile_is_written_for_node_exporter) {
    harness_options o = admin_options();
    o.with_store = false;
    o.server.metrics_textfile_interval = 50ms;
    const auto dir = std::filesystem::temp_directory_path() /
                     fmt::format("qrt-rpc-textfile-{}", ::getpid());
    std::filesystem::create_directories(dir);
    o.server.metrics_textfile = (dir / "qrtd.prom").string();
    harness h(o);
    client c(h.socket_path);
    c.ok("agent.hello");
    std::string content;
    for (int attempt = 0; attempt < 200; ++attempt) {
        if (FILE* f = std::fopen(o.server.metrics_textfile.c_str(), "rb"); f != nullptr) {
            content.assign(1 << 20, '\0');
            content.resize(std::fread(content.data(), 1, content.size(), f));
            std::fclose(f);
            if (content.find("qrt_rpc_requests_total{method=\"agent.hello\"}") != std::string::npos) {
                break;
            }
        }
        std::this_thread::sleep_for(20ms);
    }
    EXPECT_NE(content.find("# TYPE qrt_rpc_connections gauge"), std::string::npos) << content;
    EXPECT_NE(content.find("qrt_rpc_requests_total{method=\"agent.hello\"}"), std::string::npos);
    std::filesystem::remove_all(dir);
}

// -------------------------------------------------------------------- roles

TEST(rpc_server, each_role_may_call_exactly_its_methods) {
    // method -> roles allowed to call it (admin always)
    const std::vector<std::pair<std::string, std::vector<std::string>>> matrix = {
        {"agent.hello", {"none", "reader", "scheduler", "calibration"}},
        {"agent.status", {"reader", "scheduler", "calibration"}},
        {"qpus.list", {"reader", "scheduler", "calibration"}},
        {"calibration.get", {"reader", "scheduler", "calibration"}},
        {"slots.query", {"reader", "scheduler", "calibration"}},
        {"metrics", {"reader", "scheduler", "calibration"}},
        {"telemetry.snapshot", {"reader", "scheduler", "calibration"}},
        {"events.subscribe", {"reader", "scheduler", "calibration"}},
        {"calibration.update", {"calibration"}},
        {"calibration.request", {"calibration"}},
        {"calibration.cancel", {"calibration"}},
        {"calibration.blocks", {"reader", "scheduler", "calibration"}},
        {"slots.reserve", {"scheduler"}},
        {"slots.heartbeat", {"scheduler"}},
        {"slots.release", {"scheduler"}},
        {"jobs.submit", {"scheduler"}},
        {"jobs.status", {"reader", "scheduler", "calibration"}},
        {"jobs.result", {"scheduler"}},
        {"jobs.cancel", {"scheduler"}},
    };
    for (const std::string role : {"none", "reader", "scheduler", "calibration", "admin"}) {
        harness_options o;
        o.roles = only(role, me());
        o.with_store = false;
        harness h(o);
        client c(h.socket_path);
        ASSERT_TRUE(c.connected());
        for (const auto& [method, allowed_roles] : matrix) {
            const bool allowed = role == "admin" || std::find(allowed_roles.begin(), allowed_roles.end(),
                                                              role) != allowed_roles.end();
            // Params are deliberately empty: an allowed call then fails on
            // its params (or succeeds), never on permissions.
            const json r = c.call(method, json::object());
            if (allowed) {
                EXPECT_NE(reason_of(r), rpc::reason::permission_denied) << role << " " << method;
            } else {
                EXPECT_EQ(reason_of(r), rpc::reason::permission_denied) << role << " " << method << r.dump();
                EXPECT_EQ(r.at("error").at("code"), -32000);
                EXPECT_NE(r.at("error").at("message").get<std::string>().find(method),
                          std::string::npos);
            }
        }
    }
}

TEST(rpc_server, a_tenant_never_sees_or_changes_another_tenants_reservation) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to connect as a second uid";
    }
    constexpr uid_t other_uid = 65534;
    harness_options o;
    o.roles.scheduler = {me(), fmt::format("uid:{}", other_uid)};
    o.server.socket_mode = 0666;
    harness h(o);
    ::chmod(h.dir.c_str(), 0755);
    client owner(h.socket_path);
    json req = request_at(h.window_start(30 * s_ns), 1'000'000);
    req["idempotency_key"] = "mine";
    const json r = owner.ok("slots.reserve", req);
    const auto id = r.at("reservation_id").get<std::uint64_t>();
    const auto token = r.at("fencing_token").get<std::uint64_t>();
    owner.ok("jobs.submit", {{"reservation_id", id}, {"fencing_token", token},
                             {"payload", rpc::base64_encode("secret")}});

    // A thread with other credentials (raw syscalls change only the calling
    // thread's credentials; SO_PEERCRED records the connecting thread's).
    std::vector<std::string> reasons;
    std::string tenant;
    std::thread other([&] {
        const gid_t g = other_uid;
        if (::syscall(SYS_setgroups, 1, &g) != 0 || ::syscall(SYS_setresgid, g, g, g) != 0 ||
            ::syscall(SYS_setresuid, other_uid, other_uid, other_uid) != 0) {
            reasons.push_back("setresuid failed");
            return;
        }
        client c(h.socket_path);
        if (!c.connected()) {
            reasons.push_back(fmt::format("connect: {}", std::strerror(c.connect_errno())));
            return;
        }
        tenant = c.ok("agent.hello").at("peer").at("tenant");
        reasons.push_back(reason_of(c.call("jobs.status", {{"job_id", id}})));
        reasons.push_back(reason_of(c.call("jobs.result", {{"job_id", id}})));
        reasons.push_back(reason_of(c.call("jobs.cancel", {{"job_id", id}})));
        reasons.push_back(reason_of(
            c.call("slots.heartbeat", {{"reservation_id", id}, {"fencing_token", token}})));
        // Same idempotency key, other tenant: a different reservation.
        json again = request_at(h.window_start(30 * s_ns) + 5'000'000, 1'000'000);
        again["idempotency_key"] = "mine";
        const json mine = c.call("slots.reserve", again);
        reasons.push_back(mine.contains("result") && mine.at("result").at("reservation_id") != id
                              ? "separate"
                              : mine.dump());
    });
    other.join();
    ASSERT_EQ(reasons.size(), 5U) << (reasons.empty() ? "" : reasons[0]);
    EXPECT_NE(tenant, owner.ok("agent.hello").at("peer").at("tenant"));
    for (std::size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(reasons[i], rpc::reason::not_owner) << i;
    }
    EXPECT_EQ(reasons[4], "separate");
    EXPECT_EQ(owner.ok("jobs.status", {{"job_id", id}}).at("state"), "committed");
}

// jobs.status is a read: a reader may call it, and sees only its own
// tenant's jobs, as a scheduler does.
TEST(rpc_server, a_reader_may_ask_jobs_status_but_never_of_another_tenants_job) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to connect as a second uid";
    }
    constexpr uid_t reader_uid = 65534;
    harness_options o;
    o.roles.scheduler = {me()};
    o.roles.reader = {fmt::format("uid:{}", reader_uid)};
    o.server.socket_mode = 0666;
    harness h(o);
    ::chmod(h.dir.c_str(), 0755);
    client owner(h.socket_path);
    json req = request_at(h.window_start(30 * s_ns), 1'000'000);
    req["idempotency_key"] = "mine";
    const auto id = owner.ok("slots.reserve", req).at("reservation_id").get<std::uint64_t>();
    EXPECT_EQ(owner.ok("jobs.status", {{"job_id", id}}).at("state"), "held");
    std::vector<std::string> seen;
    std::thread other([&] {
        const gid_t g = reader_uid;
        if (::syscall(SYS_setgroups, 1, &g) != 0 || ::syscall(SYS_setresgid, g, g, g) != 0 ||
            ::syscall(SYS_setresuid, reader_uid, reader_uid, reader_uid) != 0) {
            seen.push_back("setresuid failed");
            return;
        }
        client c(h.socket_path);
        seen.push_back(reason_of(c.call("jobs.status", {{"job_id", id}})));
        seen.push_back(reason_of(c.call("jobs.status", {{"job_id", id + 1000}})));
        seen.push_back(reason_of(c.call("jobs.result", {{"job_id", id}})));
    });
    other.join();
    EXPECT_EQ(seen, (std::vector<std::string>{"not_owner", "not_found", "permission_denied"}));
}

// -------------------------------------------------------------- concurrency

TEST(rpc_server, fifty_clients_racing_for_one_slot_have_exactly_one_winner) {
    harness h(admin_options());
    const std::int64_t start = h.window_start(30 * s_ns);
    constexpr int n = 50;
    std::latch go(n);
    std::vector<std::string> outcome(n);
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
        threads.emplace_back([&, i] {
            client c(h.socket_path);
            json req = request_at(start, 2'000'000);
            req["idempotency_key"] = fmt::format("racer-{}", i);
            go.arrive_and_wait();
            const json r = c.call("slots.reserve", req);
            outcome[static_cast<std::size_t>(i)] =
                r.contains("result") ? "won" : reason_of(r);
        });
    }
    for (auto& t : threads) {
        t.join();
    }
    EXPECT_EQ(std::count(outcome.begin(), outcome.end(), "won"), 1);
    EXPECT_EQ(std::count(outcome.begin(), outcome.end(), "no_fit"), n - 1);
    EXPECT_TRUE(h.on_loop([&] { return h.ledger->check_invariants(); }).empty());
}

TEST(rpc_server, a_retried_reserve_with_the_same_key_returns_the_same_reservation) {
    harness h(admin_options());
    client c(h.socket_path);
    json req = request_at(h.window_start(30 * s_ns), 1'000'000);
    req["idempotency_key"] = "retry-me";
    const json a = c.ok("slots.reserve", req);
    client again(h.socket_path);  // e.g. after a lost reply and a reconnect
    const json b = again.ok("slots.reserve", req);
    EXPECT_EQ(a.at("reservation_id"), b.at("reservation_id"));
    EXPECT_EQ(a.at("fencing_token"), b.at("fencing_token"));
    req["duration_ns"] = 2'000'000;
    req["deadline_ns"] = req["not_before_ns"].get<std::int64_t>() + 2'000'000;
    EXPECT_EQ(reason_of(again.call("slots.reserve", req)), rpc::reason::duplicate);
}

TEST(rpc_server, an_expired_lease_refuses_heartbeat_and_commit_and_is_announced) {
    harness h(admin_options());
    client c(h.socket_path);
    c.ok("events.subscribe", {{"topics", {"reservation.expired"}}});
    json req = request_at(h.window_start(30 * s_ns), 1'000'000);
    req["idempotency_key"] = "short";
    req["lease_ns"] = 1 * s_ns;
    const json r = c.ok("slots.reserve", req);
    h.skew_ns += 2 * s_ns;  // the lease runs out
    const json hb = c.call("slots.heartbeat", {{"reservation_id", r.at("reservation_id")},
                                               {"fencing_token", r.at("fencing_token")}});
    EXPECT_EQ(reason_of(hb), rpc::reason::lease_expired);
    EXPECT_EQ(hb.at("error").at("code"), -32004);
    const json sub = c.call("jobs.submit", {{"reservation_id", r.at("reservation_id")},
                                            {"fencing_token", r.at("fencing_token")},
                                            {"payload", ""}});
    EXPECT_EQ(reason_of(sub), rpc::reason::lease_expired);
    h.on_loop([&] {
        rpc::ledger_housekeeping(*h.eng, *h.ledger, h.now());
        return 0;
    });
    const auto ev = c.read_json();
    ASSERT_TRUE(ev.has_value());
    EXPECT_EQ(ev->at("method"), "events.event");
    EXPECT_EQ(ev->at("params").at("type"), "reservation.expired");
    EXPECT_EQ(ev->at("params").at("data").at("reservation_id"), r.at("reservation_id"));
}

TEST(rpc_server, pipelined_requests_and_batches_are_answered_in_order) {
    harness h(admin_options());
    client c(h.socket_path);
    std::string burst;
    constexpr int n = 500;
    for (int i = 0; i < n; ++i) {
        burst += json{{"jsonrpc", "2.0"}, {"method", i % 2 == 0 ? "agent.hello" : "qpus.list"},
                      {"id", i}}
                     .dump();
        burst += '\n';
    }
    ASSERT_TRUE(c.send_raw(burst));
    for (int i = 0; i < n; ++i) {
        const auto r = c.read_json();
        ASSERT_TRUE(r.has_value()) << i;
        ASSERT_EQ(r->at("id"), i);
        EXPECT_TRUE(r->contains("result"));
    }
    const std::string batch =
        R"([{"jsonrpc":"2.0","method":"qpus.list","id":"a"},)"
        R"({"jsonrpc":"2.0","method":"agent.hello"},)"
        R"({"jsonrpc":"2.0","method":"slots.query","params":{"duration_ns":"x"},"id":"b"},)"
        R"({"jsonrpc":"2.0","method":"nope","id":"c"}])"
        "\n";
    ASSERT_TRUE(c.send_raw(batch));
    const auto r = c.read_json();
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(r->is_array());
    ASSERT_EQ(r->size(), 3U);
    EXPECT_EQ((*r)[0].at("id"), "a");
    EXPECT_EQ((*r)[1].at("id"), "b");
    EXPECT_EQ(reason_of((*r)[1]), rpc::reason::invalid_params);
    EXPECT_EQ((*r)[1].at("error").at("data").at("field"), "duration_ns");
    EXPECT_EQ((*r)[2].at("error").at("code"), -32601);
    ASSERT_TRUE(c.send_raw("[]\n"));
    EXPECT_EQ(c.read_json()->at("error").at("code"), -32600);

    // A client that sends everything, then shuts down its write side, still
    // gets every reply (more than the in-flight limit), then EOF.
    client half(h.socket_path);
    ASSERT_TRUE(half.send_raw(burst));
    ASSERT_EQ(::shutdown(half.fd(), SHUT_WR), 0);
    for (int i = 0; i < n; ++i) {
        const auto r2 = half.read_json();
        ASSERT_TRUE(r2.has_value()) << i;
        ASSERT_EQ(r2->at("id"), i);
    }
    EXPECT_FALSE(half.read_line().has_value());
    EXPECT_EQ(half.last_errno(), 0) << "a clean EOF";
}

TEST(rpc_server, events_arrive_in_order_after_the_reply_that_caused_them) {
    harness h(admin_options());
    client watcher(h.socket_path);
    watcher.ok("events.subscribe");
    client c(h.socket_path);
    json req = request_at(h.window_start(30 * s_ns), 1'000'000);
    req["idempotency_key"] = "ev";
    req["payload"] = rpc::base64_encode("x");
    const auto id = c.ok("jobs.submit", req).at("job_id").get<std::uint64_t>();
    h.on_loop([&] {
        EXPECT_TRUE(h.ledger->mark_dispatched(id, h.now()));
        h.eng->drain_event_sources();  // the daemon's hook after dispatch
        EXPECT_TRUE(h.ledger->complete(id, tl::blob{1}, h.now()));
        h.eng->drain_event_sources();
        return 0;
    });
    // A calibration change is announced to everyone.
    const std::int64_t t0 = h.now() + 3600 * s_ns;
    c.ok("calibration.update", {{"qpu", "qp"},
                                {"windows", {{{"calibration_id", 1},
                                              {"valid_from_ns", t0},
                                              {"valid_until_ns", t0 + s_ns}}}}});
    std::vector<std::string> types;
    std::int64_t last_seq = 0;
    while (types.size() < 4) {
        const auto ev = watcher.read_json();
        ASSERT_TRUE(ev.has_value()) << "got only " << types.size() << " events";
        const auto& p = ev->at("params");
        EXPECT_EQ(p.at("seq").get<std::int64_t>(), last_seq + 1);
        last_seq = p.at("seq");
        const std::string type = p.at("type");
        if (type.rfind("reservation.", 0) == 0 && type != "reservation.committed") {
            continue;  // bookkeeping events the ledger may add
        }
        types.push_back(type);
    }
    EXPECT_EQ(types, (std::vector<std::string>{"reservation.committed", "job.dispatched",
                                               "job.finished", "calibration.changed"}));
}

TEST(rpc_server, an_acknowledged_reservation_survives_a_restart_and_clients_reconnect) {
    harness_options o = admin_options();
    o.dir = std::filesystem::temp_directory_path() / fmt::format("qrt-rpc-restart-{}", ::getpid());
    std::filesystem::create_directories(o.dir);
    json req;
    json first;
    {
        harness h(o);
        req = request_at(h.window_start(60 * s_ns), 1'000'000);
        req["idempotency_key"] = "durable";
        req["payload"] = rpc::base64_encode("keep me");
        client c(h.socket_path);
        first = c.ok("jobs.submit", req);
        EXPECT_EQ(first.at("state"), "committed");
    }  // the daemon stops: clients see EOF
    harness h2(o);  // a new daemon on the same state directory and socket path
    client again(h2.socket_path);
    ASSERT_TRUE(again.connected());
    const json st = again.ok("jobs.status", {{"job_id", first.at("job_id")}});
    EXPECT_EQ(st.at("state"), "committed");
    EXPECT_EQ(st.at("payload_bytes"), 7);
    // The client's retry after a lost reply is answered from the ledger.
    EXPECT_EQ(again.ok("jobs.submit", req).at("job_id"), first.at("job_id"));
    std::filesystem::remove_all(o.dir);
}

// ---------------------------------------------------------------- bad input

TEST(rpc_server, bad_input_gets_its_error_and_the_connection_stays_usable) {
    harness h(admin_options());
    client c(h.socket_path);
    struct probe {
        std::string line;
        int code;
        std::string reason;
    };
    const std::vector<probe> probes = {
        {"{not json", -32700, "parse_error"},
        {std::string("{\"jsonrpc\":\"2.0\",\"method\":\"agent.hello\",\"params\":{\"client\":\"\xc3\x28\"},\"id\":1}"),
         -32700, "parse_error"},
        {R"({"jsonrpc":"2.0","method":"slots.query","params":{"duration_ns":"5"},"id":1})", -32602,
         "invalid_params"},
        {R"({"jsonrpc":"2.0","method":"slots.query","params":{},"id":1})", -32602,
         "invalid_params"},
        {R"({"jsonrpc":"2.0","method":"slots.query","params":{"duration_ns":5,"bogus":1},"id":1})",
         -32602, "invalid_params"},
        {R"({"jsonrpc":"2.0","method":"no.such.method","id":1})", -32601, "method_not_found"},
        {R"({"jsonrpc":"2.0","method":"slots.query","params":{"duration_ns":1e400},"id":1})",
         -32700, "parse_error"},
        {R"({"jsonrpc":"2.0","method":"slots.query","params":{"duration_ns":123456789012345678901234567890},"id":1})",
         -32602, "invalid_params"},
        {R"({"jsonrpc":"2.0","method":"jobs.status","params":{"job_id":-1},"id":1})", -32602,
         "invalid_params"},
        {R"({"jsonrpc":"2.0","method":"jobs.submit","params":{"reservation_id":1,"fencing_token":1,"payload":"!!"},"id":1})",
         -32602, "invalid_params"},
        {std::string(200000, '[') + std::string(200000, ']'), -32600, "too_deep"},
        {R"({"jsonrpc":"2.0","method":"jobs.status","params":{"job_id":999999},"id":1})", -32002,
         "not_found"},
        {R"({"jsonrpc":"2.0","method":"calibration.get","params":{"qpu":"nope"},"id":1})", -32007,
         "unknown_qpu"},
    };
    for (const auto& p : probes) {
        ASSERT_TRUE(c.send_raw(p.line + "\n"));
        const auto r = c.read_json();
        ASSERT_TRUE(r.has_value()) << p.line.substr(0, 80);
        ASSERT_TRUE(r->contains("error")) << r->dump();
        EXPECT_EQ(r->at("error").at("code"), p.code) << p.line.substr(0, 80) << " -> " << r->dump();
        EXPECT_EQ(reason_of(*r), p.reason) << p.line.substr(0, 80);
        EXPECT_FALSE(r->at("error").at("message").get<std::string>().empty());
    }
    EXPECT_EQ(c.ok("agent.hello").at("api_version"), 1);
}

TEST(rpc_server, a_line_over_the_limit_gets_an_error_then_the_connection_closes) {
    harness h(admin_options());
    client side(h.socket_path);
    client c(h.socket_path);
    const std::string huge(h.srv->options().max_line_bytes + 4096, 'a');
    c.send_raw(huge);  // may fail part-way once the server closes: that is fine
    const auto r = c.read_json();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(reason_of(*r), rpc::reason::line_too_long);
    EXPECT_EQ(r->at("error").at("code"), -32600);
    EXPECT_FALSE(c.read_line().has_value()) << "then EOF";
    EXPECT_EQ(side.ok("agent.hello").at("api_version"), 1);
}

TEST(rpc_server, a_half_line_that_stalls_is_closed_by_the_idle_timeout) {
    harness_options o = admin_options();
    o.server.idle_timeout = 300ms;
    harness h(o);
    client subscriber(h.socket_path);
    subscriber.ok("events.subscribe");
    client c(h.socket_path);
    ASSERT_TRUE(c.send_raw(R"({"jsonrpc":"2.0","meth)"));
    const auto r = c.read_json();  // blocks until the server gives up
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(reason_of(*r), rpc::reason::idle_timeout);
    EXPECT_FALSE(c.read_line().has_value());
    // A quiet subscriber is not idle: it is still served.
    EXPECT_EQ(subscriber.ok("agent.hello").at("api_version"), 1);
}

namespace {

// An NSS behind the seam that answers at once for its first `fast` calls,
// then sleeps `sleep` before every answer (LDAP or sssd that hangs).  Shared
// by value: the resolver thread may outlive the test's frame.
struct slow_nss {
    std::atomic<int> calls{0};
    int fast = 1;
    std::chrono::milliseconds sleep{2000};
};

// The first line a fresh connection gets after one request: its reply, or
// the error line the server sent when it refused the connection.
json first_reply(client& c, const std::string& method, json params = json::object()) {
    (void)c.send_raw(json{{"jsonrpc", "2.0"}, {"method", method}, {"id", 1}, {"params", std::move(params)}}
                         .dump() +
                     "\n");
    const auto r = c.read_json();
    return r ? *r : json{{"error", {{"data", {{"reason", "no_reply"}}}}}};
}

rpc::nss_lookup lookup_through(const std::shared_ptr<slow_nss>& nss) {
    return [nss](const rpc::nss_query&) {
        if (++nss->calls > nss->fast) {
            std::this_thread::sleep_for(nss->sleep);
        }
        rpc::nss_answer a;
        a.user_name = "tester";
        return a;
    };
}

bool readable_within(int fd, int timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) > 0;
}

}  // namespace

TEST(rpc_server, a_slow_nss_lookup_delays_only_the_connection_that_waits_for_it) {
    auto nss = std::make_shared<slow_nss>();
    harness_options o = admin_options();
    o.server.nss_lookup_fn = lookup_through(nss);
    o.server.nss_cache_opts.ttl_ns = 100'000'000;  // 100 ms: the next connection asks again
    o.server.nss_timeout = 20s;
    harness h(o);
    client victim(h.socket_path);
    EXPECT_EQ(victim.ok("agent.hello").at("peer").at("tenant"), "tester");  // the fast lookup
    std::this_thread::sleep_for(150ms);

    client waiter(h.socket_path);  // its lookup sleeps 2 s
    ASSERT_TRUE(waiter.connected());
    ASSERT_TRUE(waiter.send_raw(R"({"jsonrpc":"2.0","method":"agent.hello","id":1})" "\n"));
    const auto t0 = std::chrono::steady_clock::now();
    // Meanwhile the other connection is served as if nothing waited.
    std::chrono::nanoseconds worst{0};
    for (int i = 0; i < 20; ++i) {
        const auto a = std::chrono::steady_clock::now();
        victim.ok("slots.query", {{"duration_ns", 1'000'000}, {"qpus", {"q0"}}});
        worst = std::max(worst, std::chrono::steady_clock::now() - a);
    }
    const auto served_by = std::chrono::steady_clock::now() - t0;
    // A loop blocked in NSS would hold one of these for the whole 2 s.
    EXPECT_LT(worst, 1000ms) << "a slots.query waited behind the other connection's NSS lookup";
    if (served_by < 1500ms) {
        EXPECT_FALSE(readable_within(waiter.fd(), 0))
            << "the waiting connection was answered before its identity was known";
    }
    // Its request, sent while it waited, is answered once the name is known,
    // under that name.
    const auto r = waiter.read_json();
    ASSERT_TRUE(r.has_value()) << "no reply after the lookup";
    EXPECT_EQ(r->at("id"), 1);
    EXPECT_EQ(r->at("result").at("peer").at("tenant"), "tester");
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 1500ms);
    EXPECT_EQ(nss->calls.load(), 2);
}

TEST(rpc_server, a_connection_whose_nss_lookup_times_out_gets_unavailable_and_is_closed) {
    auto nss = std::make_shared<slow_nss>();
    nss->fast = 0;
    nss->sleep = 1500ms;
    harness_options o = admin_options();
    o.server.nss_lookup_fn = lookup_through(nss);
    o.server.nss_timeout = 200ms;
    harness h(o);
    client c(h.socket_path);
    ASSERT_TRUE(c.send_raw(R"({"jsonrpc":"2.0","method":"agent.hello","id":1})" "\n"));
    const auto r = c.read_json();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(reason_of(*r), rpc::reason::unavailable) << r->dump();
    EXPECT_EQ(r->at("error").at("data").at("cause"), "nss_timeout");
    EXPECT_EQ(r->at("error").at("data").at("uid"), ::getuid());
    EXPECT_NE(r->at("error").at("message").get<std::string>().find("rpc.nss_timeout_ms"),
              std::string::npos);
    EXPECT_FALSE(c.read_line().has_value());
    const std::string metrics =
        h.on_loop([&] { return rpc::metrics_text(*h.eng, h.hooks).value(); });
    EXPECT_NE(metrics.find("qrt_rpc_connections_closed_total{cause=\"nss_timeout\"} 1"),
              std::string::npos);
}

// NSS failing (an LDAP server down, sssd restarting) is not "no such user":
// the connection is told so (unavailable, data.cause nss_error) and closed,
// nothing is remembered, and the next connection, once NSS answers, is
// served under its own name -- never under uid:N, another tenant's quotas
// and objects, for the cache's 60 s.
TEST(rpc_server, an_nss_error_is_unavailable_and_not_remembered_as_no_such_user) {
    auto calls = std::make_shared<std::atomic<int>>(0);
    harness_options o = admin_options();
    o.server.nss_lookup_fn = [calls](const rpc::nss_query&) {
        if (++*calls == 1) {
            throw std::runtime_error("NSS backend unreachable");
        }
        rpc::nss_answer a;
        a.user_name = "tester";
        return a;
    };
    harness h(o);
    client first(h.socket_path);
    const json r = first_reply(first, "agent.hello");
    EXPECT_EQ(reason_of(r), rpc::reason::unavailable) << r.dump();
    EXPECT_EQ(r.at("error").at("data").value("cause", ""), "nss_error") << r.dump();
    EXPECT_FALSE(first.read_line().has_value()) << "the connection stayed open";

    client second(h.socket_path);
    const json hello = first_reply(second, "agent.hello");
    ASSERT_TRUE(hello.contains("result")) << hello.dump();
    EXPECT_EQ(hello.at("result").at("peer").at("tenant"), "tester");
    EXPECT_EQ(calls->load(), 2);
}

TEST(rpc_server, a_thousand_connections_at_once_hit_the_cap_and_the_server_keeps_serving) {
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < 2200) {
        rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, 4096);
        ::setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < 2200) {
        GTEST_SKIP() << "RLIMIT_NOFILE hard limit " << rl.rlim_max << " is below 2200";
    }
    harness_options o = admin_options();
    o.server.max_connections = 64;
    o.with_store = false;
    harness h(o);
    client side(h.socket_path);
    ASSERT_TRUE(side.connected());
    EXPECT_EQ(side.ok("agent.hello").at("api_version"), 1);

    constexpr int n = 1000;
    std::vector<std::unique_ptr<client>> flood;
    flood.reserve(n);
    for (int i = 0; i < n; ++i) {
        flood.push_back(std::make_unique<client>(h.socket_path, 10000ms));
        ASSERT_TRUE(flood.back()->connected()) << i << ": " << std::strerror(flood.back()->connect_errno());
    }
    EXPECT_EQ(side.ok("agent.hello").at("api_version"), 1) << "served during the flood";
    int served = 0;
    int refused = 0;
    const std::string hello = R"({"jsonrpc":"2.0","method":"agent.hello","id":1})" "\n";
    for (auto& f : flood) {
        f->send_raw(hello);  // refused ones may be closed already
    }
    for (auto& f : flood) {
        const auto r = f->read_json();
        ASSERT_TRUE(r.has_value()) << "every connection gets an answer or an error";
        if (r->contains("result")) {
            ++served;
        } else {
            EXPECT_EQ(reason_of(*r), rpc::reason::overloaded);
            EXPECT_FALSE(f->read_line().has_value()) << "refused connections are closed";
            ++refused;
        }
    }
    EXPECT_EQ(served, 63);  // the cap (64) minus the side client
    EXPECT_EQ(refused, n - 63);
    flood.clear();
    EXPECT_EQ(side.ok("agent.hello").at("api_version"), 1);
    // Slots free up again once the flood is gone.
    bool reconnected = false;
    for (int attempt = 0; attempt < 50 && !reconnected; ++attempt) {
        client again(h.socket_path);
        const json r = again.call("agent.hello");
        reconnected = r.contains("result");
        if (!reconnected) {
            std::this_thread::sleep_for(20ms);
        }
    }
    EXPECT_TRUE(reconnected);
}

TEST(rpc_server, a_client_that_never_reads_is_paused_then_cut_off_without_unbounded_memory) {
    harness_options o = admin_options();
    o.server.max_inflight = 16;
    o.server.output_soft_limit = 64 * 1024;
    o.server.output_hard_limit = 512 * 1024;
    o.with_store = false;
    harness h(o);
    client side(h.socket_path);

    // 1. Pipelining without reading: the server stops reading, so the
    // client's writes block (here: EAGAIN) instead of the daemon buffering.
    client greedy(h.socket_path);
    ::fcntl(greedy.fd(), F_SETFL, ::fcntl(greedy.fd(), F_GETFL) | O_NONBLOCK);
    const std::string req = R"({"jsonrpc":"2.0","method":"metrics","id":1})" "\n";
    std::string block;
    for (int i = 0; i < 64; ++i) {
        block += req;
    }
    std::size_t sent = 0;
    for (int i = 0; i < 20000; ++i) {
        const ssize_t n = ::send(greedy.fd(), block.data(), block.size(), MSG_NOSIGNAL);
        if (n < 0) {
            break;  // EAGAIN: the server no longer reads us
        }
        sent += static_cast<std::size_t>(n);
    }
    EXPECT_LT(sent, 64U * 1024 * 1024) << "the server kept reading a client that never reads";
    // The loop serves the greedy connection asynchronously: poll the
    // server's own counters until it has paused reading it.
    double buffered = -1;
    std::uint64_t pauses = 0;
    json snap;
    for (int attempt = 0; attempt < 500 && pauses == 0; ++attempt) {
        snap = side.ok("telemetry.snapshot", {{"prefix", "qrt_rpc_"}});
        for (const auto& g : snap.at("gauges")) {
            if (g.at("name") == "qrt_rpc_buffered_bytes") {
                buffered = g.at("value");
            }
        }
        for (const auto& c : snap.at("counters")) {
            if (c.at("name") == "qrt_rpc_backpressure_pauses_total") {
                pauses = c.at("value");
            }
        }
        if (pauses == 0) {
            std::this_thread::sleep_for(10ms);
        }
    }
    EXPECT_GT(pauses, 0U) << "sent " << sent << " " << snap.dump();
    EXPECT_GE(buffered, 0.0);
    EXPECT_LT(buffered, 2.0 * 1024 * 1024) << "server-side buffers stay bounded";

    // 2. A subscriber that never reads while events pour in is closed at the
    // hard cap.
    client deaf(h.socket_path);
    deaf.ok("events.subscribe");
    const json big_data{{"pad", std::string(4096, 'x')}};
    for (int round = 0; round < 10; ++round) {
        h.on_loop([&] {
            for (int i = 0; i < 200; ++i) {
                h.srv->publish(rpc::event{"calibration.changed", "", big_data});
            }
            return 0;
        });
    }
    std::uint64_t slow_closed = 0;
    for (int attempt = 0; attempt < 500 && slow_closed == 0; ++attempt) {
        const json snap2 =
            side.ok("telemetry.snapshot", {{"prefix", "qrt_rpc_connections_closed"}});
        for (const auto& c : snap2.at("counters")) {
            if (c.at("labels").contains("cause") && c.at("labels").at("cause") == "slow_reader") {
                slow_closed = c.at("value");
            }
        }
        if (slow_closed == 0) {
            std::this_thread::sleep_for(10ms);
        }
    }
    EXPECT_GE(slow_closed, 1U);
    EXPECT_EQ(side.ok("agent.hello").at("api_version"), 1);
}

// ------------------------------------------------------------------ tenants

namespace {

constexpr uid_t other_uid = 65534;

// Run f with a client connected as other_uid (raw syscalls change only the
// calling thread's credentials; SO_PEERCRED records the connecting
// thread's).  Returns "" or why it could not connect.
std::string as_other_tenant(const harness& h, const std::function<void(client&)>& f) {
    std::string why;
    std::thread other([&] {
        const gid_t g = other_uid;
        if (::syscall(SYS_setgroups, 1, &g) != 0 || ::syscall(SYS_setresgid, g, g, g) != 0 ||
            ::syscall(SYS_setresuid, other_uid, other_uid, other_uid) != 0) {
            why = "setresuid failed";
            return;
        }
        client c(h.socket_path);
        if (!c.connected()) {
            why = fmt::format("connect: {}", std::strerror(c.connect_errno()));
            return;
        }
        f(c);
    });
    other.join();
    return why;
}

harness_options two_schedulers(const rpc::tenant_policy& policy) {
    harness_options o;
    o.roles.scheduler = {me(), fmt::format("uid:{}", other_uid)};
    o.server.socket_mode = 0666;
    o.tenants = policy;
    return o;
}

std::string quota_of(const json& reply) {
    if (reason_of(reply) != rpc::reason::quota_exceeded) {
        return "not refused by a quota: " + reply.dump();
    }
    return reply.at("error").at("data").at("quota").get<std::string>();
}

}  // namespace

TEST(rpc_tenants, a_priority_above_the_ceiling_is_refused_and_a_granted_tenant_may_use_its_own) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to connect as a second uid";
    }
    rpc::tenant_policy p;
    p.scheduler_max_priority = 0;
    p.priority_ceilings = {{fmt::format("uid:{}", other_uid), 5}};
    harness h(two_schedulers(p));
    ::chmod(h.dir.c_str(), 0755);
    client c(h.socket_path);
    json req = request_at(h.window_start(30 * s_ns), 1'000'000);
    req["idempotency_key"] = "a";
    req["priority"] = 1;
    const json refused = c.call("slots.reserve", req);
    EXPECT_EQ(quota_of(refused), "priority");
    EXPECT_NE(refused.at("error").at("message").get<std::string>().find("ceiling 0"),
              std::string::npos)
        << refused.dump();
    EXPECT_EQ(quota_of(c.call("slots.query", {{"duration_ns", 1'000'000}, {"priority", 1}})),
              "priority");
    req["priority"] = 0;
    c.ok("slots.reserve", req);

    std::vector<std::string> seen;
    const std::string why = as_other_tenant(h, [&](client& o) {
        json r = request_at(h.window_start(30 * s_ns) + 5'000'000, 1'000'000);
        r["idempotency_key"] = "b";
        r["priority"] = 5;
        seen.push_back(o.call("slots.reserve", r).contains("result") ? "ok" : "refused");
        r["idempotency_key"] = "c";
        r["priority"] = 6;
        seen.push_back(quota_of(o.call("slots.reserve", r)));
    });
    ASSERT_EQ(why, "");
    EXPECT_EQ(seen, (std::vector<std::string>{"ok", "priority"}));
}

TEST(rpc_tenants, each_quota_holds_for_its_tenant_and_leaves_the_other_unaffected) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to connect as a second uid";
    }
    rpc::tenant_policy p;
    p.max_reservations = 2;
    p.max_booked_ns = 3'000'000;
    p.max_payload_bytes = 10;
    p.max_requests_per_s = 1;
    p.request_burst = 1000;
    harness h(two_schedulers(p));
    ::chmod(h.dir.c_str(), 0755);
    client c(h.socket_path);
    const std::int64_t t0 = h.window_start(30 * s_ns);
    const auto reserve = [&](client& cl, std::int64_t at, std::int64_t dur, const std::string& key) {
        json r = request_at(at, dur);
        r["idempotency_key"] = key;
        return cl.call("slots.reserve", r);
    };

    // Booked time: 2 ms + 2 ms > 3 ms.
    const json a = reserve(c, t0, 2'000'000, "a");
    ASSERT_TRUE(a.contains("result")) << a.dump();
    EXPECT_EQ(quota_of(reserve(c, t0 + 10'000'000, 2'000'000, "b")), "booked_time");
    // Reservations: a second one fits, a third does not; a retry of an
    // acknowledged one is not a new booking.
    const json b = reserve(c, t0 + 10'000'000, 1'000'000, "b2");
    ASSERT_TRUE(b.contains("result")) << b.dump();
    EXPECT_EQ(quota_of(reserve(c, t0 + 20'000'000, 1, "c")), "reservations");
    EXPECT_EQ(reserve(c, t0, 2'000'000, "a").at("result").at("reservation_id"),
              a.at("result").at("reservation_id"));
    // Payload bytes: 8 fit, 8 more do not.
    const auto id_a = a.at("result").at("reservation_id");
    const auto id_b = b.at("result").at("reservation_id");
    c.ok("jobs.submit", {{"reservation_id", id_a},
                         {"fencing_token", a.at("result").at("fencing_token")},
                         {"payload", rpc::base64_encode("12345678")}});
    EXPECT_EQ(quota_of(c.call("jobs.submit",
                              {{"reservation_id", id_b},
                               {"fencing_token", b.at("result").at("fencing_token")},
                               {"payload", rpc::base64_encode("12345678")}})),
              "payload_bytes");

    // The other tenant books, submits and is served as if alone.
    std::vector<std::string> seen;
    const std::string why = as_other_tenant(h, [&](client& o) {
        const json r = reserve(o, t0 + 30'000'000, 2'000'000, "a");
        seen.push_back(r.contains("result") ? "reserved" : r.dump());
        if (r.contains("result")) {
            const json s = o.call("jobs.submit",
                                  {{"reservation_id", r.at("result").at("reservation_id")},
                                   {"fencing_token", r.at("result").at("fencing_token")},
                                   {"payload", rpc::base64_encode("12345678")}});
            seen.push_back(s.contains("result") ? "submitted" : s.dump());
        }
    });
    ASSERT_EQ(why, "");
    EXPECT_EQ(seen, (std::vector<std::string>{"reserved", "submitted"}));

    // Releasing gives the quota back.
    c.ok("slots.release", {{"reservation_id", id_b}, {"fencing_token", b.at("result").at("fencing_token")}});
    EXPECT_TRUE(reserve(c, t0 + 40'000'000, 1'000'000, "d").contains("result"));

    // Requests: the bucket (1000, no refill on the frozen clock) runs dry;
    // the other tenant's bucket is its own.
    std::string last;
    for (int i = 0; i < 1100 && last.empty(); ++i) {
        const json r = c.call("agent.hello");
        if (r.contains("error")) {
            last = quota_of(r);
        }
    }
    EXPECT_EQ(last, "requests");
    std::string other_hello;
    ASSERT_EQ(as_other_tenant(h, [&](client& o) {
                  other_hello = o.call("qpus.list").contains("result") ? "served" : "refused";
              }),
              "");
    EXPECT_EQ(other_hello, "served");

    // Every refusal is counted by quota.
    const std::string metrics =
        h.on_loop([&] { return rpc::metrics_text(*h.eng, h.hooks).value(); });
    for (const char* q : {"booked_time", "reservations", "payload_bytes", "requests", "priority"}) {
        const bool want = std::string(q) != "priority";
        EXPECT_EQ(metrics.find(fmt::format("qrt_rpc_quota_exceeded_total{{quota=\"{}\"}}", q)) !=
                      std::string::npos,
                  want)
            << q;
    }
}

namespace {

// Changes the calling thread's credentials only (raw syscalls).
bool become_other_tenant() {
    const gid_t g = other_uid;
    return ::syscall(SYS_setgroups, 1, &g) == 0 && ::syscall(SYS_setresgid, g, g, g) == 0 &&
           ::syscall(SYS_setresuid, other_uid, other_uid, other_uid) == 0;
}

double quantile_ms(std::vector<std::int64_t> ns, double q) {
    if (ns.empty()) {
        return 0;
    }
    std::sort(ns.begin(), ns.end());
    const auto i = static_cast<std::size_t>(q * static_cast<double>(ns.size() - 1) + 0.5);
    return static_cast<double>(ns[std::min(i, ns.size() - 1)]) / 1e6;
}

}  // namespace

// One tenant floods the socket -- pipelining connections, and connections
// opened and closed in a loop -- while the other runs slots.query.  The
// flooder is throttled (quota_exceeded, data.quota "requests"), and every
// one of the victim's queries is answered with its p99 round trip under
// 500 ms.  Why 500 ms: idle, a slots.query round trip here is 0.1-0.2 ms
// (p50) and 0.2-2.5 ms (p99) on this loaded 2-vCPU VM (printed below); a
// loop that blocks -- an NSS call on the accept path of each of the 2,000
// churn connections, a handler that waits -- or that serves the flood
// before the victim holds the victim for the whole flood phase (2-5 s
// here), and a loop blocked outright never answers.  The tail under the
// flood is CPU starvation on a shared machine: p99 9-29 ms alone, up to
// 206 ms (max 287 ms) under ctest -j2 beside other builds.  500 ms is
// above that noise and still an order of magnitude below a blocked loop;
// it is absolute, not a ratio, because the idle p99 itself moves 10x.
TEST(rpc_tenants, a_tenant_flooding_the_socket_is_throttled_and_the_others_queries_stay_fast) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to connect as a second uid";
    }
    rpc::tenant_policy p;
    p.max_requests_per_s = 500;
    p.request_burst = 500;
    harness_options o = two_schedulers(p);
    o.tenants_real_clock = true;
    o.server.max_connections = 256;
    harness h(o);
    ::chmod(h.dir.c_str(), 0755);
    client victim(h.socket_path);
    ASSERT_TRUE(victim.connected());
    const json query{{"duration_ns", 1'000'000}, {"qpus", {"q0"}}};
    // The victim stays under its own bucket (500/s): one query every 4 ms.
    const auto run_victim = [&](int n, std::vector<std::int64_t>& rtt, int& answered) {
        for (int i = 0; i < n; ++i) {
            const std::int64_t a = rtcore::monotonic_now_ns();
            const json r = victim.call("slots.query", query);
            rtt.push_back(rtcore::monotonic_now_ns() - a);
            answered += r.contains("result") ? 1 : 0;
            std::this_thread::sleep_for(4ms);
        }
    };
    constexpr int victim_queries = 250;
    std::vector<std::int64_t> idle_rtt;
    int idle_answered = 0;
    run_victim(victim_queries, idle_rtt, idle_answered);
    ASSERT_EQ(idle_answered, victim_queries);

    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> flood_sent{0};
    std::atomic<std::uint64_t> flood_served{0};
    std::atomic<std::uint64_t> flood_throttled{0};
    std::atomic<std::uint64_t> flood_other{0};
    std::atomic<std::uint64_t> flood_connects{0};
    std::atomic<int> flood_failures{0};
    std::mutex bad_mu;
    std::string bad_reply;
    const auto tally = [&](const json& r) {
        if (r.contains("result")) {
            ++flood_served;
        } else if (reason_of(r) == rpc::reason::quota_exceeded &&
                   r.at("error").at("data").at("quota") == "requests") {
            ++flood_throttled;
        } else {
            ++flood_other;
            const std::lock_guard<std::mutex> l(bad_mu);
            bad_reply = r.dump();
        }
    };
    std::vector<std::thread> flooders;
    // Pipelining connections: 64 requests written at once, then their
    // replies read; bounded by `stop` and by 400 rounds.
    for (int t = 0; t < 4; ++t) {
        flooders.emplace_back([&] {
            if (!become_other_tenant()) {
                ++flood_failures;
                return;
            }
            client c(h.socket_path, 10000ms);
            if (!c.connected()) {
                ++flood_failures;
                return;
            }
            std::string burst;
            for (int i = 0; i < 64; ++i) {
                burst += json{{"jsonrpc", "2.0"}, {"method", "slots.query"}, {"id", i},
                              {"params", {{"duration_ns", 1'000'000}, {"qpus", {"q0"}}}}}
                             .dump() +
                         "\n";
            }
            for (int round = 0; round < 400 && !stop.load(); ++round) {
                if (!c.send_raw(burst)) {
                    ++flood_failures;
                    return;
                }
                flood_sent += 64;
                for (int i = 0; i < 64; ++i) {
                    auto r = c.read_json();
                    if (!r) {
                        ++flood_failures;
                        return;
                    }
                    tally(*r);
                }
            }
        });
    }
    // Connection churn: connect, one request, close; at most 2,000.
    flooders.emplace_back([&] {
        if (!become_other_tenant()) {
            ++flood_failures;
            return;
        }
        for (int i = 0; i < 2000 && !stop.load(); ++i) {
            client c(h.socket_path, 10000ms);
            if (!c.connected()) {
                continue;  // the backlog was full for a moment: not the victim's problem
            }
            ++flood_connects;
            ++flood_sent;
            tally(c.call("agent.hello"));
        }
    });
    std::this_thread::sleep_for(200ms);  // the flood is under way
    std::vector<std::int64_t> flood_rtt;
    int flood_answered = 0;
    run_victim(victim_queries, flood_rtt, flood_answered);
    stop = true;
    for (auto& t : flooders) {
        t.join();
    }
    ASSERT_EQ(flood_failures.load(), 0);

    const double idle_p50 = quantile_ms(idle_rtt, 0.5);
    const double idle_p99 = quantile_ms(idle_rtt, 0.99);
    const double flood_p50 = quantile_ms(flood_rtt, 0.5);
    const double flood_p99 = quantile_ms(flood_rtt, 0.99);
    std::printf("flood: victim slots.query round trip idle p50 %.3f ms p99 %.3f ms; flooded p50 %.3f "
                "ms p99 %.3f ms max %.3f ms; flooder sent %llu (%llu connections), served %llu, "
                "throttled %llu\n",
                idle_p50, idle_p99, flood_p50, flood_p99, quantile_ms(flood_rtt, 1.0),
                static_cast<unsigned long long>(flood_sent.load()),
                static_cast<unsigned long long>(flood_connects.load()),
                static_cast<unsigned long long>(flood_served.load()),
                static_cast<unsigned long long>(flood_throttled.load()));
    RecordProperty("idle_p99_ms", std::to_string(idle_p99));
    RecordProperty("flooded_p99_ms", std::to_string(flood_p99));

    // Every one of the victim's queries was answered, none refused.
    EXPECT_EQ(flood_answered, victim_queries);
    EXPECT_LT(flood_p99, 500.0) << "the flood held the other tenant's slots.query";
    // The flooder was throttled by its own bucket, and only by it.
    EXPECT_GT(flood_throttled.load(), flood_sent.load() / 2);
    EXPECT_EQ(flood_other.load(), 0u) << bad_reply;
    EXPECT_EQ(flood_served.load() + flood_throttled.load(), flood_sent.load());
    const std::string metrics =
        h.on_loop([&] { return rpc::metrics_text(*h.eng, h.hooks).value(); });
    EXPECT_NE(metrics.find("qrt_rpc_quota_exceeded_total{quota=\"requests\"}"), std::string::npos);
}

// ------------------------------------------------------- connection slots

namespace {

// A client connected as `uid` (the connecting thread's credentials are what
// SO_PEERCRED records; the client is then used from the caller's thread).
// nullptr when the credentials could not be changed.
std::unique_ptr<client> connect_as(const harness& h, uid_t uid) {
    std::unique_ptr<client> out;
    std::thread t([&] {
        const gid_t g = uid;
        if (::syscall(SYS_setgroups, 1, &g) != 0 || ::syscall(SYS_setresgid, g, g, g) != 0 ||
            ::syscall(SYS_setresuid, uid, uid, uid) != 0) {
            return;
        }
        out = std::make_unique<client>(h.socket_path);
    });
    t.join();
    return out;
}

constexpr uid_t calibration_uid = 65530;
constexpr uid_t hog_uids[] = {65531, 65532, 65533};

harness_options slot_options() {
    harness_options o;
    o.roles.admin = {me()};
    o.roles.scheduler = {fmt::format("uid:{}", other_uid)};
    for (const uid_t u : hog_uids) {
        o.roles.scheduler.push_back(fmt::format("uid:{}", u));
    }
    o.roles.calibration = {fmt::format("uid:{}", calibration_uid)};
    o.server.socket_mode = 0666;
    o.server.max_connections = 32;
    o.server.max_connections_per_uid = 16;  // the defaults
    o.server.reserved_connections = 8;
    return o;
}

// Connections of `uid` opened until one is refused (at most `most`), each
// sending `method` first; the ones served are kept open.
struct opened {
    std::vector<std::unique_ptr<client>> kept;
    json refusal;  // the refused connection's line (null: none refused)
};
opened open_until_refused(const harness& h, uid_t uid, const std::string& method, int most) {
    opened out;
    for (int i = 0; i < most; ++i) {
        auto c = connect_as(h, uid);
        if (!c || !c->connected()) {
            ADD_FAILURE() << "could not connect as uid " << uid;
            return out;
        }
        const json r = first_reply(*c, method);
        if (!r.contains("result")) {
            out.refusal = r;
            return out;
        }
        out.kept.push_back(std::move(c));
    }
    return out;
}

void calibration_update_is_served(const harness& h) {
    auto cal = connect_as(h, calibration_uid);
    ASSERT_TRUE(cal && cal->connected());
    const std::int64_t t0 = h.now() + 60 * s_ns;
    const json upd = first_reply(*cal, "calibration.update",
                                 {{"qpu", "qp"},
                                  {"windows", {{{"calibration_id", 3},
                                                {"valid_from_ns", t0},
                                                {"valid_until_ns", t0 + s_ns}}}}});
    EXPECT_TRUE(upd.contains("result")) << upd.dump();
}

}  // namespace

// One tenant opens connections and subscribes on each (a subscriber is
// exempt from the idle timeout, so these would stay forever): it is stopped
// at its per-uid cap, and root, another tenant and the calibration service
// are still served.
TEST(rpc_slots, a_subscribing_hog_is_held_to_its_per_uid_cap_and_the_others_are_served) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to connect as other uids";
    }
    harness h(slot_options());
    ::chmod(h.dir.c_str(), 0755);
    const std::size_t max = h.srv->options().max_connections;
    opened hog = open_until_refused(h, hog_uids[0], "events.subscribe", static_cast<int>(max) + 8);
    EXPECT_EQ(hog.kept.size(), h.srv->options().max_connections_per_uid)
        << "one uid took " << hog.kept.size() << " of " << max;
    EXPECT_EQ(reason_of(hog.refusal), rpc::reason::overloaded) << hog.refusal.dump();
    EXPECT_EQ(hog.refusal.at("error").at("data").value("cause", ""), "connections_per_uid")
        << hog.refusal.dump();
    EXPECT_NE(hog.refusal.at("error").at("message").get<std::string>().find("rpc.max_connections_per_uid"),
              std::string::npos);
    // Its connections are still served.
    EXPECT_TRUE(hog.kept.front()->call("agent.hello").contains("result"));

    auto root = connect_as(h, ::getuid());
    ASSERT_TRUE(root && root->connected());
    EXPECT_TRUE(first_reply(*root, "agent.hello").contains("result"));
    auto other = connect_as(h, other_uid);
    ASSERT_TRUE(other && other->connected());
    const json q = first_reply(*other, "slots.query", {{"duration_ns", 1'000'000}, {"qpus", {"q0"}}});
    EXPECT_TRUE(q.contains("result")) << q.dump();
    calibration_update_is_served(h);
}

// The same without subscribing (one request per connection within the idle
// timeout keeps it open), by several uids at once: each is held to the same
// per-uid cap, and once they have every slot not reserved, another tenant is
// refused while root and the calibration service still get in.
TEST(rpc_slots, hogs_that_fill_every_open_slot_leave_the_reserved_ones_to_admin_and_calibration) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to connect as other uids";
    }
    harness h(slot_options());
    ::chmod(h.dir.c_str(), 0755);
    const auto& so = h.srv->options();
    const std::size_t max = so.max_connections;
    const std::size_t open_slots = max - so.reserved_connections;
    std::vector<opened> hogs;
    std::size_t held = 0;
    for (const uid_t u : hog_uids) {
        hogs.push_back(open_until_refused(h, u, "agent.hello", static_cast<int>(max) + 8));
        const opened& hog = hogs.back();
        held += hog.kept.size();
        // Each up to its own cap, or what is left of the open slots.
        EXPECT_EQ(hog.kept.size(), std::min(so.max_connections_per_uid, open_slots - (held - hog.kept.size())))
            << "uid " << u;
        EXPECT_EQ(reason_of(hog.refusal), rpc::reason::overloaded) << hog.refusal.dump();
    }
    EXPECT_EQ(held, open_slots);
    EXPECT_EQ(hogs.back().refusal.at("error").at("data").value("cause", ""), "connections")
        << hogs.back().refusal.dump();
    // Another tenant finds the open slots taken...
    auto other = connect_as(h, other_uid);
    ASSERT_TRUE(other && other->connected());
    const json refused = first_reply(*other, "agent.hello");
    EXPECT_EQ(reason_of(refused), rpc::reason::overloaded) << refused.dump();
    EXPECT_NE(refused.at("error").at("message").get<std::string>().find("rpc.reserved_connections"),
              std::string::npos);

    auto root = connect_as(h, ::getuid());
    ASSERT_TRUE(root && root->connected());
    EXPECT_TRUE(first_reply(*root, "agent.hello").contains("result"));
    calibration_update_is_served(h);
    // ... and gets in once a hog lets one go.
    hogs.front().kept.pop_back();
    bool served = false;
    for (int i = 0; i < 100 && !served; ++i) {  // the server sees the close on its next pass
        auto again = connect_as(h, other_uid);
        ASSERT_TRUE(again && again->connected());
        served = first_reply(*again, "agent.hello").contains("result");
        if (!served) {
            std::this_thread::sleep_for(10ms);
        }
    }
    EXPECT_TRUE(served);
}

// ------------------------------------------------------------ request rate

// Every line is charged to its tenant's bucket before anything else is
// done with it: unknown methods, calls the roles deny and lines that do not
// parse use it up like any request, and a long line costs more than a short
// one.
TEST(rpc_tenants, unknown_denied_and_malformed_lines_are_charged_to_the_bucket) {
    rpc::tenant_policy p;
    p.max_requests_per_s = 1;
    p.request_burst = 90;  // the frozen clock never refills it
    harness_options o;
    o.roles = only("reader", me());
    o.tenants = p;
    harness h(o);
    client c(h.socket_path);
    ASSERT_TRUE(c.connected());
    for (int i = 0; i < 30; ++i) {
        EXPECT_EQ(reason_of(c.call("no.such.method")), rpc::reason::method_not_found);
        EXPECT_EQ(reason_of(c.call("slots.reserve", {{"duration_ns", 1}})), rpc::reason::permission_denied);
        ASSERT_TRUE(c.send_raw("{not json\n"));
        const auto r = c.read_json();
        ASSERT_TRUE(r.has_value());
        EXPECT_EQ(reason_of(*r), rpc::reason::parse_error);
    }
    // 90 lines: the bucket is empty, whatever comes next.
    EXPECT_EQ(quota_of(c.call("qpus.list")), "requests");
    EXPECT_EQ(quota_of(c.call("no.such.method")), "requests");
    ASSERT_TRUE(c.send_raw("{not json\n"));
    const auto r = c.read_json();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(quota_of(*r), "requests");
}

TEST(rpc_tenants, a_long_line_costs_one_request_per_started_bytes_per_request) {
    rpc::tenant_policy p;
    p.max_requests_per_s = 1;
    p.request_burst = 10;
    harness_options o;
    o.roles = only("reader", me());
    o.tenants = p;
    harness h(o);
    client c(h.socket_path);
    ASSERT_TRUE(c.connected());
    // 100,000 bytes: 7 requests' worth at the default 16 KiB each.
    const std::string pad(100'000, 'x');
    EXPECT_EQ(reason_of(c.call("no.such.method", {{"pad", pad}})), rpc::reason::method_not_found);
    for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(c.call("qpus.list").contains("result")) << i;
    }
    EXPECT_EQ(quota_of(c.call("qpus.list")), "requests");
}

// ------------------------------------------------------------- near term

// One tenant books as fast as it can within the default quotas -- held
// reservations, no payload, each filling the rest of the earliest window
// with room, and when refused for the near term, the earliest past it --
// and another tenant's earliest 100 ms slot is still in the near term.
TEST(rpc_tenants, a_tenant_booking_as_fast_as_it_can_leaves_the_near_term_to_the_others) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to connect as a second uid";
    }
    harness h(two_schedulers(rpc::tenant_policy{}));
    ::chmod(h.dir.c_str(), 0755);
    client c(h.socket_path);
    ASSERT_TRUE(c.connected());
    const std::int64_t t0 = h.now();
    int booked = 0;
    std::int64_t not_before = 0;
    std::string stopped_by;
    for (int i = 0; i < 2000 && stopped_by.empty(); ++i) {
        json q{{"duration_ns", 100'000'000}, {"qpus", {"q0"}}, {"max_candidates", 1}};
        if (not_before != 0) {
            q["not_before_ns"] = not_before;
        }
        const json found = c.call("slots.query", q);
        ASSERT_TRUE(found.contains("result")) << found.dump();
        ASSERT_FALSE(found.at("result").at("candidates").empty()) << found.dump();
        const json& slot = found.at("result").at("candidates")[0];
        const std::int64_t start = slot.at("start_ns").get<std::int64_t>();
        const std::int64_t until = slot.at("window_until_ns").get<std::int64_t>();
        // The rest of that window, but for 20 ms of slack (the start moves
        // on with the clock between the query and the reserve).
        const std::int64_t duration = until - start - 20'000'000;
        if (duration < 100'000'000) {
            not_before = until;  // a sliver: the next window
            continue;
        }
        json r{{"duration_ns", duration}, {"not_before_ns", start}, {"deadline_ns", until},
               {"qpus", {"q0"}}, {"idempotency_key", fmt::format("k{}", i)}};
        const json reply = c.call("slots.reserve", r);
        if (reply.contains("result")) {
            ++booked;
            continue;
        }
        const std::string quota = quota_of(reply);
        // Refused for the near term: go on past it.  The hint is "now +
        // near_term_ns" at the moment of refusal, so it moves on with the
        // clock; a client that asked again at exactly the hint would be
        // refused again a few microseconds later and chase it.  A second of
        // slack ends the chase, as it would for any real client.
        if (quota == "near_term") {
            const auto hint = reply.at("error").at("data").at("not_before_ns").get<std::int64_t>();
            if (hint > not_before) {
                not_before = hint + 1 * s_ns;
                continue;
            }
        }
        stopped_by = quota;
    }
    EXPECT_NE(stopped_by, "") << "the booking tenant was never stopped";
    std::int64_t start = -1;
    ASSERT_EQ(as_other_tenant(h, [&](client& o) {
                  const json q = o.call("slots.query", {{"duration_ns", 100'000'000}, {"qpus", {"q0"}}});
                  ASSERT_TRUE(q.contains("result")) << q.dump();
                  ASSERT_FALSE(q.at("result").at("candidates").empty()) << q.dump();
                  start = q.at("result").at("candidates")[0].at("start_ns").get<std::int64_t>();
              }),
              "");
    std::printf("near term: the first tenant booked %d windows (stopped by %s); the other's earliest "
                "100 ms slot starts %.1f s ahead\n",
                booked, stopped_by.c_str(), static_cast<double>(start - t0) / 1e9);
    EXPECT_LT(start - t0, 600 * s_ns) << "the other tenant's earliest slot is past the near term";
}

// tenants.delegates: the Kubernetes driver (tools/integrations/k8s) books on_behalf_of a
// namespace, whose quotas are its own and not the driver's.
TEST(rpc_tenants, a_delegate_books_on_behalf_of_a_namespace_under_that_namespaces_quotas) {
    rpc::tenant_policy p;
    p.max_reservations = 1;
    p.max_delegated_tenants = 2;
    p.delegates = {me()};
    // The delegate's own ceiling, for its own calls only.
    p.priority_ceilings = {{me(), 50}};
    harness_options o;
    o.roles.scheduler = {me()};
    o.tenants = p;
    harness h(o);
    client c(h.socket_path);
    const std::int64_t t0 = h.window_start(30 * s_ns);
    const auto reserve = [&](const std::string& ns, std::int64_t at, const std::string& key) {
        json r = request_at(at, 1'000'000);
        r["idempotency_key"] = key;
        r["lease_ns"] = 30 * s_ns;
        if (!ns.empty()) {
            r["on_behalf_of"] = ns;
        }
        return c.call("slots.reserve", r);
    };
    // The delegate's tenant: its user name (peer_identity::tenant).
    const passwd* pw = ::getpwuid(::getuid());
    const std::string self = pw != nullptr ? pw->pw_name : fmt::format("uid:{}", ::getuid());

    const json a = reserve("team-a", t0, "claim-1");
    ASSERT_TRUE(a.contains("result")) << a.dump();
    EXPECT_EQ(a.at("result").at("tenant"), self + "/team-a");
    // team-a's own quota of one reservation; the same key is a retry.
    EXPECT_EQ(quota_of(reserve("team-a", t0 + 10'000'000, "claim-2")), "reservations");
    EXPECT_EQ(reserve("team-a", t0, "claim-1").at("result").at("reservation_id"),
              a.at("result").at("reservation_id"));
    // team-b has a quota of its own, and its keys are its own too.
    const json b = reserve("team-b", t0 + 10'000'000, "claim-1");
    ASSERT_TRUE(b.contains("result")) << b.dump();
    EXPECT_NE(b.at("result").at("reservation_id"), a.at("result").at("reservation_id"));
    // A third namespace passes the delegate's max_delegated_tenants.
    const json third = reserve("team-c", t0 + 20'000'000, "claim-1");
    EXPECT_EQ(quota_of(third), "delegated_tenants");
    EXPECT_NE(third.at("error").at("message").get<std::string>().find("max_delegated_tenants"),
              std::string::npos);
    // The delegate's own tenant is not team-a's: it can neither see nor
    // release team-a's reservation without naming it.
    const json id_a = a.at("result").at("reservation_id");
    const json tok_a = a.at("result").at("fencing_token");
    EXPECT_FALSE(c.call("slots.release", {{"reservation_id", id_a}, {"fencing_token", tok_a}})
                     .contains("result"));
    EXPECT_EQ(c.ok("slots.heartbeat", {{"reservation_id", id_a}, {"fencing_token", tok_a},
                                       {"on_behalf_of", "team-a"}})
                  .at("state"),
              "held");
    EXPECT_EQ(c.ok("jobs.status", {{"job_id", id_a}, {"on_behalf_of", "team-a"}}).at("state"),
              "held");
    c.ok("slots.release",
         {{"reservation_id", id_a}, {"fencing_token", tok_a}, {"on_behalf_of", "team-a"}});
    // Released: team-a holds nothing, so team-c now fits.
    EXPECT_TRUE(reserve("team-c", t0 + 20'000'000, "claim-1").contains("result"));
    // slots.query runs as the namespace too: its own priority ceiling
    // (tenants.delegated_max_priority, 0), not the delegate's 50.
    json q = request_at(t0 + 30'000'000, 1'000'000);
    q["on_behalf_of"] = "team-a";
    q["priority"] = 1;
    EXPECT_EQ(quota_of(c.call("slots.query", q)), "priority");
    q["priority"] = 0;
    EXPECT_EQ(c.ok("slots.query", q).at("candidates").size(), 1U);
    q.erase("on_behalf_of");
    q["priority"] = 50;
    EXPECT_EQ(c.ok("slots.query", q).at("candidates").size(), 1U);

    // Bad names are refused naming the field.
    for (const std::string& bad : std::vector<std::string>{"Team_A", "-a", std::string(64, 'a'), "a/b", "a b"}) {
        const json r = reserve(bad, t0, "k");
        EXPECT_EQ(reason_of(r), rpc::reason::invalid_params) << bad << ": " << r.dump();
        EXPECT_EQ(r.at("error").at("data").at("field"), "on_behalf_of") << r.dump();
    }
    json not_string = request_at(t0, 1'000'000);
    not_string["idempotency_key"] = "k";
    not_string["on_behalf_of"] = 7;
    EXPECT_EQ(c.call("slots.reserve", not_string).at("error").at("data").at("field"),
              "on_behalf_of");
    // Only the delegable methods take it.
    EXPECT_EQ(reason_of(c.call("qpus.list", {{"on_behalf_of", "team-a"}})),
              rpc::reason::invalid_params);
}

TEST(rpc_tenants, on_behalf_of_from_a_peer_that_is_no_delegate_is_permission_denied) {
    for (const bool admin : {false, true}) {
        rpc::tenant_policy p;
        harness_options o;
        if (admin) {
            o.roles.admin = {me()};
        } else {
            o.roles.scheduler = {me()};
        }
        o.tenants = p;
        harness h(o);
        client c(h.socket_path);
        json r = request_at(h.window_start(30 * s_ns), 1'000'000);
        r["idempotency_key"] = "k";
        r["on_behalf_of"] = "team-a";
        const json refused = c.call("slots.reserve", r);
        EXPECT_EQ(reason_of(refused), rpc::reason::permission_denied) << refused.dump();
        EXPECT_NE(refused.at("error").at("message").get<std::string>().find("tenants.delegates"),
                  std::string::npos)
            << refused.dump();
    }
}

// ------------------------------------------- device facts and job envelopes

namespace {

// q0 states a 2-qubit device taking at most 100 shots; q1 and qp state none.
harness_options device_options() {
    harness_options o = admin_options();
    o.qpu_details = [](std::string_view qpu) {
        if (qpu != "q0") {
            return json{{"device", nullptr}};
        }
        return json{{"device", {{"qubits", 2}, {"technology", "superconducting"},
                                {"basis_gates", {"x", "cx", "measure"}}, {"coupling_map", {{0, 1}}},
                                {"gate_durations_ns", {{"cx", 300}}}, {"max_shots", 100}}}};
    };
    return o;
}

std::string envelope(int qubits, std::int64_t shots, const std::string& qasm = "OPENQASM 3.0;\nqubit[2] q;\n") {
    return json{{"format", "qasm3"}, {"shots", shots},
                {"circuits", {{{"name", "c"}, {"qubits", qubits}, {"qasm", qasm}}}}}
        .dump();
}

json one_shot(const std::string& key, const std::string& payload, std::optional<std::string> qpu = "q0") {
    json r{{"duration_ns", 1'000'000}, {"idempotency_key", key}, {"payload", rpc::base64_encode(payload)}};
    if (qpu) {
        r["qpus"] = {*qpu};
    }
    return r;
}

std::string message_of(const json& reply) { return reply.at("error").at("message").get<std::string>(); }

}  // namespace

TEST(rpc_device, qpus_list_serves_the_device_and_the_window_in_force) {
    harness h(device_options());
    client c(h.socket_path);
    // Now inside a window: 5 s into a 10 s cycle whose first second is calibration.
    h.skew_ns = 0;
    const std::int64_t real = h.now();
    h.skew_ns = (real / period_ns + 1) * period_ns + 5 * s_ns - real;
    json qpus = c.ok("qpus.list").at("qpus");
    ASSERT_EQ(qpus.size(), 3U);
    for (const auto& q : qpus) {
        ASSERT_TRUE(q.contains("device")) << q.dump();
        ASSERT_TRUE(q.contains("window")) << q.dump();
        // qp is pushed and has no window yet: null, like a blackout.
        EXPECT_EQ(q.at("window").is_null(), q.at("name") == "qp") << q.dump();
        if (q.at("name") == "q0") {
            EXPECT_EQ(q.at("device").at("qubits"), 2);
            EXPECT_EQ(q.at("device").at("max_shots"), 100);
            EXPECT_DOUBLE_EQ(q.at("predicted_fidelity").get<double>(), 0.99);
            const std::int64_t t = h.now();
            EXPECT_LE(q.at("window").at("valid_from_ns").get<std::int64_t>(), t);
            EXPECT_GT(q.at("window").at("valid_until_ns").get<std::int64_t>(), t);
        } else if (q.at("name") == "q1") {
            EXPECT_TRUE(q.at("device").is_null());
        }
    }
    // Inside a blackout: no window in force and no predicted fidelity.
    h.skew_ns = h.skew_ns.load() + 5 * s_ns + s_ns / 2;
    qpus = c.ok("qpus.list").at("qpus");
    for (const auto& q : qpus) {
        if (q.at("name") == "q0") {
            EXPECT_TRUE(q.at("window").is_null()) << q.dump();
            EXPECT_TRUE(q.at("predicted_fidelity").is_null()) << q.dump();
        }
    }
}

TEST(rpc_device, calibration_get_until_ns_stops_after_the_window_holding_it) {
    harness h(admin_options());
    client c(h.socket_path);
    const std::size_t all = c.ok("calibration.get", {{"qpu", "q0"}}).at("windows").size();
    const std::int64_t t = h.window_start(30 * s_ns) + s_ns;
    const json ws = c.ok("calibration.get", {{"qpu", "q0"}, {"until_ns", t + 1}}).at("windows");
    ASSERT_FALSE(ws.empty());
    EXPECT_LT(ws.size(), all);
    const json& last = ws.back();
    EXPECT_LE(last.at("valid_from_ns").get<std::int64_t>(), t + period_ns);
    bool holds = false;
    for (const auto& w : ws) {
        holds = holds || (w.at("valid_from_ns").get<std::int64_t>() <= t && t < w.at("valid_until_ns").get<std::int64_t>());
    }
    EXPECT_TRUE(holds) << ws.dump();
}

TEST(rpc_device, jobs_submit_refuses_an_envelope_the_qpu_cannot_take_naming_the_field) {
    harness h(device_options());
    client c(h.socket_path);
    struct bad {
        std::string payload;
        std::optional<std::string> qpu;
        std::string field;
        std::string text;
    };
    const std::vector<bad> cases = {
        {envelope(3, 10), "q0", "payload.circuits", "payload: a circuit needs 3 qubits; q0 has 2"},
        {envelope(2, 101), "q0", "payload.shots", "payload: shots = 101 is more than q0 takes (100)"},
        {envelope(2, 1'000'001), "q1", "payload.shots", "payload: shots = 1000001 is more than q1 takes (1000000)"},
        {envelope(2, 0), "q0", "payload.shots", "payload: shots must be 1 or more"},
        {envelope(2, -3), "q0", "payload.shots", "payload: shots must be 1 or more"},
        {envelope(2, 10, "OPENQASM 2.0;\nqreg q[2];\n"), "q0", "payload.circuits[0].qasm",
         "payload: circuits[0].qasm is not OpenQASM 3: it must begin with \"OPENQASM 3\""},
        {R"({"format":"qasm3","shots":5,"circuits":[]})", "q0", "payload.circuits",
         "payload: circuits must be a non-empty array of {name, qubits, qasm}"},
        {R"({"format":"qasm3","shots":5,"circuits":[{"qasm":"OPENQASM 3;"}]})", "q0", "payload.circuits[0].qubits",
         "payload: circuits[0].qubits must be an integer of 1 or more"},
        {R"({"format":"quil","shots":5})", "q0", "payload.format",
         "payload: format is not one qrtd knows (\"qasm3\")"},
    };
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const json reply = c.call("jobs.submit", one_shot(fmt::format("bad-{}", i), cases[i].payload, cases[i].qpu));
        EXPECT_EQ(reason_of(reply), rpc::reason::invalid_argument) << reply.dump();
        EXPECT_EQ(reply.at("error").at("data").value("field", ""), cases[i].field) << reply.dump();
        EXPECT_NE(message_of(reply).find(cases[i].text), std::string::npos) << message_of(reply);
    }
    // Nothing was kept under a refused key: the same key with a good payload
    // is a new job holding that payload (a kept one would come back instead).
    const std::string good = envelope(2, 100);
    const json again = c.ok("jobs.submit", one_shot("bad-0", good));
    EXPECT_EQ(again.at("payload_bytes"), good.size()) << again.dump();
    // Comments and blanks before the version line are fine; an opaque payload is not read.
    const std::string commented = envelope(2, 100, "// Bell\n/* two */\n  OPENQASM 3.0;\nqubit[2] q;\n");
    EXPECT_EQ(c.ok("jobs.submit", one_shot("good", commented)).at("qpu"), "q0");
    EXPECT_EQ(c.ok("jobs.submit", one_shot("opaque", R"({"shots": 5000})")).at("state"), "committed");
    EXPECT_EQ(c.ok("jobs.submit", one_shot("pulse", "PULSE")).at("state"), "committed");
    // Without qpus, a wide circuit goes only where it fits (not q0).
    for (int i = 0; i < 4; ++i) {
        const json r = c.ok("jobs.submit", one_shot(fmt::format("wide-{}", i), envelope(3, 10), std::nullopt));
        EXPECT_NE(r.at("qpu"), "q0") << r.dump();
    }
    // A held reservation on q0 refuses it and stays held.
    json req = request_at(h.window_start(30 * s_ns), 1'000'000);
    req["idempotency_key"] = "held";
    const json held = c.ok("slots.reserve", req);
    const json reply = c.call("jobs.submit", {{"reservation_id", held.at("reservation_id")},
                                              {"fencing_token", held.at("fencing_token")},
                                              {"payload", rpc::base64_encode(envelope(3, 10))}});
    EXPECT_EQ(reason_of(reply), rpc::reason::invalid_argument) << reply.dump();
    EXPECT_EQ(c.ok("jobs.status", {{"job_id", held.at("reservation_id")}}).at("state"), "held");
}

// The shot count travels in the request (the hand-over never reads the
// payload): the "shots" parameter, else the envelope's, else an opaque JSON
// payload's "shots", else 0 (not stated: 1000 are sent).  It is kept with
// the job, so jobs.status says what the frame will carry.
TEST(rpc_device, jobs_submit_keeps_the_shot_count_the_request_states) {
    harness h(device_options());
    client c(h.socket_path);
    const auto shots_of = [&](const json& booked) {
        return c.ok("jobs.status", {{"job_id", booked.at("job_id")}}).at("shots").get<std::uint64_t>();
    };
    json p = one_shot("param", "PULSE", "q1");
    p["shots"] = 250;
    EXPECT_EQ(shots_of(c.ok("jobs.submit", p)), 250U);
    EXPECT_EQ(shots_of(c.ok("jobs.submit", one_shot("envelope", envelope(2, 40)))), 40U);
    json agree = one_shot("agree", envelope(2, 60));
    agree["shots"] = 60;
    EXPECT_EQ(shots_of(c.ok("jobs.submit", agree)), 60U);
    EXPECT_EQ(shots_of(c.ok("jobs.submit", one_shot("opaque", R"({"shots": 5000})", "q1"))), 5000U);
    EXPECT_EQ(shots_of(c.ok("jobs.submit", one_shot("pulse", "PULSE", "q1"))), 0U);
    // Refused, naming the parameter: out of range, or not what the envelope says.
    for (const auto& [key, shots, payload] :
         std::vector<std::tuple<std::string, json, std::string>>{{"zero", 0, "PULSE"},
                                                                 {"huge", 1'000'001, "PULSE"},
                                                                 {"text", "many", "PULSE"},
                                                                 {"differs", 70, envelope(2, 60)}}) {
        json bad = one_shot(key, payload);
        bad["shots"] = shots;
        const json reply = c.call("jobs.submit", bad);
        EXPECT_EQ(reason_of(reply), "invalid_params") << reply.dump();
        EXPECT_EQ(reply.at("error").at("data").value("field", ""), "shots") << reply.dump();
    }
    // Into a held reservation too.
    json req = request_at(h.window_start(30 * s_ns), 1'000'000);
    req["idempotency_key"] = "held-shots";
    req["qpus"] = {"q1"};
    const json held = c.ok("slots.reserve", req);
    const json sub = c.ok("jobs.submit", {{"reservation_id", held.at("reservation_id")},
                                          {"fencing_token", held.at("fencing_token")},
                                          {"payload", rpc::base64_encode("PULSE")},
                                          {"shots", 12}});
    EXPECT_EQ(shots_of(sub), 12U);
}
