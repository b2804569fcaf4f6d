// The command line in-process: bad input gives a message naming the problem,
// exit 2, and no output file.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "jitter_report/cli.hpp"
#include "qrt_test/rpc_client.hpp"

using namespace qrt::jitter;
namespace fs = std::filesystem;

namespace {

struct outcome {
    int code = -1;
    std::string out;
    std::string err;
};

outcome run(std::vector<std::string> args) {
    args.insert(args.begin(), "qrt-jitter-report");
    std::vector<const char*> argv;
    for (const auto& a : args) {
        argv.push_back(a.c_str());
    }
    std::ostringstream out;
    std::ostringstream err;
    outcome o;
    o.code = run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
    o.out = out.str();
    o.err = err.str();
    return o;
}

class cli : public ::testing::Test {
protected:
    void SetUp() override {
        dir = fs::temp_directory_path() / ("qrt-jitter-cli-" + std::to_string(::getpid()));
        fs::create_directories(dir);
    }
    void TearDown() override { fs::remove_all(dir); }
    std::string path(const std::string& name) const { return (dir / name).string(); }
    fs::path dir;
};

}  // namespace

TEST_F(cli, help_lists_examples_and_exit_codes) {
    const auto o = run({"--help"});
    EXPECT_EQ(o.code, 0);
    EXPECT_NE(o.out.find("EXAMPLES:"), std::string::npos) << o.out;
    EXPECT_NE(o.out.find("--standalone"), std::string::npos);
    EXPECT_NE(o.out.find("EXIT STATUS"), std::string::npos);
}

TEST_F(cli, an_unparsable_slo_is_exit_2_before_anything_runs) {
    const auto o = run({"--standalone", "--slo", "p99=10", "-o", path("r.txt")});
    EXPECT_EQ(o.code, exit_error);
    EXPECT_NE(o.err.find("--slo term 'p99=10': duration '10': missing unit"), std::string::npos) << o.err;
    EXPECT_TRUE(o.out.empty());
    EXPECT_FALSE(fs::exists(path("r.txt")));
}

TEST_F(cli, a_corrupted_baseline_is_exit_2_and_writes_nothing) {
    std::ofstream(path("b.json")) << R"({"schema":"qrt-jitter-report","schema_version":1,"run":{)";
    const auto o = run({"--socket", path("none.sock"), "--baseline", path("b.json"), "--svg", path("p.svg")});
    EXPECT_EQ(o.code, exit_error);
    EXPECT_NE(o.err.find("--baseline " + path("b.json") + ": not valid JSON"), std::string::npos) << o.err;
    EXPECT_FALSE(fs::exists(path("p.svg")));
}

TEST_F(cli, an_unknown_cpu_is_exit_2) {
    const auto o = run({"--standalone", "--cpus", "4000", "--duration", "1s"});
    EXPECT_EQ(o.code, exit_error);
    EXPECT_NE(o.err.find("unknown CPU 4000"), std::string::npos) << o.err;
    const auto garbage = run({"--standalone", "--cpus", "1-x"});
    EXPECT_EQ(garbage.code, exit_error);
    EXPECT_NE(garbage.err.find("--cpus '1-x'"), std::string::npos) << garbage.err;
}

TEST_F(cli, bad_standalone_ranges_are_exit_2) {
    EXPECT_EQ(run({"--standalone", "--priority", "0"}).code, exit_error);
    EXPECT_EQ(run({"--standalone", "--interval", "1us"}).code, exit_error);
    EXPECT_EQ(run({"--standalone", "--duration", "10"}).code, exit_error);
    EXPECT_EQ(run({"--standalone", "--no-such-option"}).code, exit_error);
}

TEST_F(cli, a_missing_agent_is_exit_2_naming_the_socket) {
    const auto o = run({"--socket", path("qrtd.sock")});
    EXPECT_EQ(o.code, exit_error);
    EXPECT_NE(o.err.find("agent: no socket at " + path("qrtd.sock")), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("--standalone"), std::string::npos) << o.err;
}

TEST_F(cli, a_stale_socket_is_exit_2) {
    // A socket file nobody listens on: what a crashed daemon leaves.
    const qrt::testing::unix_socket_file stale(path("stale.sock"));
    const std::string& p = stale.path();
    const auto o = run({"--socket", p});
    EXPECT_EQ(o.code, exit_error);
    EXPECT_NE(o.err.find("stale socket " + p + ": nobody is listening"), std::string::npos) << o.err;
}

TEST_F(cli, an_agent_that_never_answers_is_exit_2) {
    const qrt::testing::unix_socket_file mute(path("mute.sock"), 4);  // accepts (backlog), never reads
    const std::string& p = mute.path();
    const auto o = run({"--socket", p, "--timeout", "200ms"});
    EXPECT_EQ(o.code, exit_error);
    EXPECT_NE(o.err.find("did not answer telemetry.snapshot within 200 ms"), std::string::npos) << o.err;
}
