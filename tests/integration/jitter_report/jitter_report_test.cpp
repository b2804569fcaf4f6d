// qrt-jitter-report end to end: the installed binary, run as a subprocess.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qrt/event_loop.hpp"
#include "qrt/rpc/auth.hpp"
#include "qrt/rpc/engine.hpp"
#include "qrt/rpc/methods.hpp"
#include "qrt/rpc/server.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct outcome {
    int code = -1;
    std::string out;
    std::string err;
};

std::string slurp(const fs::path& p) {
    std::ifstream in(p);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

class jitter_report : public ::testing::Test {
protected:
    void SetUp() override {
        dir = fs::temp_directory_path() / fmt::format("qrt-jitter-it-{}-{}", ::getpid(), counter++);
        fs::create_directories(dir);
    }
    void TearDown() override { fs::remove_all(dir); }

    std::string path(const std::string& name) const { return (dir / name).string(); }

    // Runs the binary with args (no shell metacharacters in them).
    outcome run(const std::string& args) const {
        const std::string cmd = fmt::format("{} {} >{} 2>{}", QRT_JITTER_REPORT_BIN, args,
                                            path("stdout"), path("stderr"));
        const int status = std::system(cmd.c_str());
        outcome o;
        o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        o.out = slurp(path("stdout"));
        o.err = slurp(path("stderr"));
        return o;
    }

    static bool have_cpu1() { return ::sysconf(_SC_NPROCESSORS_ONLN) >= 2; }

    // What the probes need (README.md, "eBPF measurement"): a build with BPF,
    // kernel BTF, and CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN).  With all of
    // them the report must say "available"; without, "unavailable (why)".
    static std::string probes_missing() {
#ifndef QRT_HAVE_BPF
        return "built without BPF";
#else
        if (!fs::exists("/sys/kernel/btf/vmlinux")) {
            return "no /sys/kernel/btf/vmlinux";
        }
        std::ifstream in("/proc/self/status");
        std::string line;
        std::uint64_t eff = 0;
        while (std::getline(in, line)) {
            if (line.rfind("CapEff:", 0) == 0) {
                eff = std::stoull(line.substr(7), nullptr, 16);
            }
        }
        const auto has = [eff](int cap) { return (eff >> cap & 1U) != 0; };
        constexpr int cap_sys_admin = 21;
        constexpr int cap_perfmon = 38;
        constexpr int cap_bpf = 39;
        if (!has(cap_sys_admin) && !(has(cap_bpf) && has(cap_perfmon))) {
            return "neither CAP_BPF + CAP_PERFMON nor CAP_SYS_ADMIN";
        }
        return "";
#endif
    }

    fs::path dir;
    static inline int counter = 0;
};

}  // namespace

TEST_F(jitter_report, standalone_two_seconds_on_cpu1_gives_the_documented_json) {
    if (!have_cpu1()) {
        GTEST_SKIP() << "needs CPU 1 online";
    }
    const auto o = run(fmt::format("--standalone --cpus 1 --duration 2s --interval 1ms --priority 80 "
                                   "--json -o {}",
                                   path("run.json")));
    ASSERT_EQ(o.code, 0) << o.err;
    EXPECT_TRUE(o.out.empty()) << "-o sends the report to the file";
    const json j = json::parse(slurp(path("run.json")));
    EXPECT_EQ(j.at("schema"), "qrt-jitter-report");
    EXPECT_EQ(j.at("schema_version"), 1);
    const auto& run = j.at("run");
    EXPECT_EQ(run.at("mode"), "standalone");
    EXPECT_EQ(run.at("cpus"), "1");
    EXPECT_EQ(run.at("interval_ns"), 1'000'000);
    if (::geteuid() == 0) {
        EXPECT_EQ(run.at("policy"), "SCHED_FIFO");
        EXPECT_EQ(run.at("priority"), 80);
    } else {
        EXPECT_EQ(run.at("policy"), "SCHED_OTHER");
        EXPECT_NE(j.at("notes").dump().find("measured under SCHED_OTHER"), std::string::npos);
    }
    const std::string probes = j.at("probes").at("status");
    const std::string missing = probes_missing();
    if (missing.empty()) {
        EXPECT_EQ(probes.rfind("available (", 0), 0u) << "BTF and the capabilities are here: " << probes;
        EXPECT_TRUE(j.at("probes").at("available").get<bool>());
    } else {
        EXPECT_EQ(probes.rfind("unavailable (", 0), 0u) << missing << ", yet: " << probes;
        EXPECT_GT(probes.size(), std::string("unavailable ()").size()) << "no reason given";
        EXPECT_FALSE(j.at("probes").at("available").get<bool>());
    }

    const auto& s = j.at("series").at(0);
    EXPECT_EQ(s.at("name"), "cpu1");
    EXPECT_EQ(s.at("cpu"), 1);
    EXPECT_EQ(s.at("metric"), "timer_lateness");
    EXPECT_TRUE(s.at("primary").get<bool>());
    // One sample per period: duration / interval loops, whatever the timing.
    EXPECT_EQ(s.at("count"), 2000);
    EXPECT_LE(s.at("p50_ns").get<std::int64_t>(), s.at("p99_ns").get<std::int64_t>());
    EXPECT_LE(s.at("p99_ns").get<std::int64_t>(), s.at("max_ns").get<std::int64_t>());
    std::uint64_t binned = 0;
    for (const auto& b : s.at("bins")) {
        binned += b.at("count").get<std::uint64_t>();
    }
    EXPECT_EQ(binned, 2000U);
    if (j.at("probes").at("available").get<bool>()) {
        bool wakeup = false;
        for (const auto& x : j.at("series")) {
            wakeup = wakeup || (x.at("metric") == "probe_wakeup" && x.at("count").get<std::uint64_t>() > 0);
        }
        EXPECT_TRUE(wakeup) << "probes loaded but no wakeup latency of the measuring thread";
    }
}

TEST_F(jitter_report, compares_with_a_baseline_and_exits_by_the_slo) {
    if (!have_cpu1()) {
        GTEST_SKIP() << "needs CPU 1 online";
    }
    auto first = run(fmt::format("--standalone --cpus 1 --duration 1s --no-probes --json -o {}",
                                 path("before.json")));
    ASSERT_EQ(first.code, 0) << first.err;

    auto met = run(fmt::format("--standalone --cpus 1 --duration 1s --no-probes --baseline {} "
                               "--slo max=10s --json --svg {}",
                               path("before.json"), path("plot.svg")));
    ASSERT_EQ(met.code, 0) << met.err;
    const json j = json::parse(met.out);
    EXPECT_TRUE(j.at("slo").at("met").get<bool>());
    const auto& rows = j.at("baseline").at("rows");
    ASSERT_EQ(rows.size(), 6U);  // cpu1 timer_lateness: p50 p95 p99 p99.9 max stddev
    EXPECT_EQ(rows.at(0).at("stat"), "p50");
    EXPECT_GT(rows.at(0).at("ratio").get<double>(), 0.0);
    EXPECT_EQ(j.at("baseline").at("file"), path("before.json"));
    const std::string svg = slurp(path("plot.svg"));
    EXPECT_EQ(svg.rfind("<?xml", 0), 0U);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);

    auto violated = run("--standalone --cpus 1 --duration 1s --no-probes --slo p50=1ns");
    EXPECT_EQ(violated.code, 1) << violated.err;
    EXPECT_NE(violated.out.find("verdict: SLO VIOLATED"), std::string::npos) << violated.out;
}

TEST_F(jitter_report, bad_input_is_exit_2_with_no_half_written_file) {
    std::ofstream(path("broken.json")) << "{\"schema\": \"qrt-jitter-report\", \"series\": [";
    struct bad {
        std::string args;
        std::string says;
    };
    for (const bad& b : std::vector<bad>{
             {fmt::format("--standalone --baseline {} -o {}", path("broken.json"), path("out")),
              "not valid JSON"},
             {fmt::format("--socket {} -o {}", path("no.sock"), path("out")), "agent: no socket at"},
             {fmt::format("--standalone --cpus 4000 -o {}", path("out")), "unknown CPU 4000"},
             {fmt::format("--standalone --slo p99=fast -o {}", path("out")), "--slo term 'p99=fast'"}}) {
        const auto o = run(b.args);
        EXPECT_EQ(o.code, 2) << b.args;
        EXPECT_NE(o.err.find(b.says), std::string::npos) << b.args << " -> " << o.err;
        EXPECT_FALSE(fs::exists(path("out"))) << b.args;
        for (const auto& e : fs::directory_iterator(dir)) {
            EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos)
                << "temporary file left: " << e.path();
        }
    }
}

// Agent mode against the real control-socket server, with the daemon's
// telemetry hook publishing dispatch histograms.
TEST_F(jitter_report, reads_the_agent_over_its_socket) {
    namespace rpc = qrt::rpc;
    const std::string sock = path("qrtd.sock");
    rpc::role_map roles;
    roles.reader = {fmt::format("uid:{}", ::getuid())};
    auto auth = rpc::authorizer::compile(roles);
    ASSERT_TRUE(auth) << auth.err().message;
    rpc::engine eng;
    rpc::agent_hooks hooks;
    rtcore::histogram h;
    for (int i = 0; i < 3000; ++i) {
        h.record(2'000 + (i % 100) * 50);
    }
    hooks.telemetry = [&h] {
        qrt::telemetry::snapshot s;
        s.add_histogram("qrt_dispatch_lateness_seconds", "dispatch lateness",
                        {{"qpu", "q0"}, {"cpu", "1"}}, h);
        return s;
    };
    hooks.status = [] { return json{{"health", "ok"}, {"probes", "unavailable (test agent)"}}; };
    rpc::register_agent_methods(eng, hooks);
    qrt::event_loop loop;
    rpc::server_options so;
    so.socket_path = sock;
    so.socket_activation = false;
    rpc::server srv(loop, eng, *auth, so);
    ASSERT_TRUE(srv.start());
    std::thread t([&loop] { loop.run(); });
    struct stopper {
        qrt::event_loop& loop;
        rpc::server& srv;
        std::thread& t;
        ~stopper() {
            std::promise<void> done;
            loop.post([&] {
                srv.stop();
                done.set_value();
            });
            done.get_future().wait();
            loop.stop();
            t.join();
        }
    } stop{loop, srv, t};

    const auto o = run(fmt::format("--socket {} --json --slo p99=1ms", sock));
    ASSERT_EQ(o.code, 0) << o.err;
    const json j = json::parse(o.out);
    EXPECT_EQ(j.at("run").at("mode"), "agent");
    EXPECT_EQ(j.at("probes").at("status"), "unavailable (test agent)");
    ASSERT_EQ(j.at("series").size(), 1U);
    const auto& s = j.at("series").at(0);
    EXPECT_EQ(s.at("scope"), "qpu");
    EXPECT_EQ(s.at("name"), "q0");
    EXPECT_EQ(s.at("count"), 3000);
    EXPECT_EQ(s.at("p99_ns"), h.summary().p99_ns);
    EXPECT_TRUE(j.at("slo").at("met").get<bool>());

    const auto text = run(fmt::format("--socket {} --slo p50=1us", sock));
    EXPECT_EQ(text.code, 1) << text.err;
    EXPECT_NE(text.out.find("dispatch lateness"), std::string::npos) << text.out;

    const auto unknown = run(fmt::format("--socket {} --cpus 5", sock));
    EXPECT_EQ(unknown.code, 2);
    EXPECT_NE(unknown.err.find("unknown CPU 5: the agent reports CPUs 1"), std::string::npos) << unknown.err;
}
