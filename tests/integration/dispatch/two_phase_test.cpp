// qpu_link in wire version 2 (ARM ahead, FIRE at T) against a real qpu-sim
// whose prepare (compile, upload, arm) costs 200 ms and 1 ms per 64 KiB of
// program: every job is armed before its start and fired on time, none
// starts late by its upload (against version 1 in the same run, where every
// job does); a burst beyond the endpoint's max_armed is paced, not failed;
// a withdrawn armed job is DISARMed and never fired, a re-placed one armed
// again and fired at its new start; a job not armed by T
// ends not_armed; a refusal at ARM ends arm_refused naming the stage; an
// endpoint killed with armed jobs: each is re-armed after the restart or
// ends endpoint_disconnected, none is fired unarmed.  Counted at the
// endpoint (qpu-sim's summary and arrivals file).

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "qrt/dispatch/qpu_link.hpp"
#include "qrt/event_loop.hpp"

using namespace qrt::dispatch;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t ms = 1'000'000;
const std::vector<std::string> prepare_200ms = {"--prepare-ms", "200", "--prepare-ns-per-byte", "15.2587890625"};

// qpu-sim on a UNIX socket, SIGTERMed (or killed) and reaped.
class sim {
public:
    sim(const fs::path& sock, const fs::path& dir, const std::vector<std::string>& extra) {
        _summary = (dir / "summary.json").string();
        _arrivals = (dir / "arrivals.jsonl").string();
        std::vector<std::string> args = {QPU_SIM_PATH, "--listen", "unix://" + sock.string(), "--summary-file",
                                         _summary, "--arrivals-file", _arrivals, "--json", "--duration-s", "120"};
        args.insert(args.end(), extra.begin(), extra.end());
        _pid = ::fork();
        if (_pid == 0) {
            std::vector<char*> argv;
            for (auto& a : args) {
                argv.push_back(a.data());
            }
            argv.push_back(nullptr);
            const int devnull = ::open("/dev/null", O_WRONLY);
            ::dup2(devnull, 1);
            ::execv(argv[0], argv.data());
            ::_exit(127);
        }
        for (int i = 0; i < 1000 && !fs::exists(sock); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }
    ~sim() { stop(); }
    sim(const sim&) = delete;
    sim& operator=(const sim&) = delete;
    nlohmann::json stop(int sig = SIGTERM) {
        if (_pid > 0) {
            ::kill(_pid, sig);
            int status = 0;
            ::waitpid(_pid, &status, 0);
            _pid = -1;
        }
        nlohmann::json j;
        if (std::ifstream in(_summary); in) {
            in >> j;
        }
        return j;
    }
    // job id -> the frames ("ARM", "FIRE", "DISARM"; "JOB" for version 1) that reached qpu-sim.
    std::map<std::uint64_t, std::vector<std::string>> frames() const {
        std::map<std::uint64_t, std::vector<std::string>> m;
        std::ifstream in(_arrivals);
        for (std::string line; std::getline(in, line);) {
            const auto j = nlohmann::json::parse(line, nullptr, false);
            if (j.is_object()) {
                m[j["job_id"].get<std::uint64_t>()].push_back(j.value("frame", std::string("JOB")));
            }
        }
        return m;
    }

private:
    std::string _summary;
    std::string _arrivals;
    pid_t _pid = -1;
};

dispatch_job make_job(std::uint64_t id, std::int64_t t) {
    dispatch_job j;
    j.job_id = id;
    j.scheduled_ns = t;
    j.window_start_ns = t - 10'000 * ms;
    j.window_end_ns = t + 10'000 * ms;
    j.duration_ns = 1 * ms;
    j.calibration_id = 1;
    j.tolerance_ns = 50 * ms;
    j.shots = 10;
    return j;
}

class dispatch_two_phase : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/qrt-two-phase-XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        _dir = tmpl;
        _sock = _dir / "qpu.sock";
    }
    void TearDown() override {
        _link.reset();
        std::error_code ec;
        fs::remove_all(_dir, ec);
    }

    void open_link(unsigned wire_version) {
        qpu_link_config cfg;
        cfg.endpoint = "unix://" + _sock.string();
        cfg.wire_version = wire_version;
        cfg.dispatch.mode = dispatch_mode::untuned;
        cfg.dispatch.slots = 64;
        cfg.dispatch.max_payload_bytes = 1024 * 1024;
        cfg.result_timeout_ns = 5'000 * ms;
        cfg.backoff_initial = std::chrono::milliseconds(20);
        cfg.backoff_max = std::chrono::milliseconds(100);
        qpu_link_callbacks cb;
        cb.on_outcome = [this](const dispatch_outcome& o) {
            EXPECT_EQ(_outcomes.count(o.job_id), 0U) << "two outcomes for job " << o.job_id;
            _outcomes[o.job_id] = o;
        };
        _link = std::make_unique<qpu_link>(_loop, _clock, cfg, cb);
        ASSERT_TRUE(_link->start());
        wait_up();
    }
    void wait_up() {
        for (int i = 0; i < 2000 && !_link->endpoint_up(); ++i) {
            _loop.run_once(std::chrono::milliseconds(5));
        }
        ASSERT_TRUE(_link->endpoint_up()) << _link->last_endpoint_error();
    }
    void run_until(std::size_t outcomes, std::chrono::seconds limit) {
        const auto give_up = std::chrono::steady_clock::now() + limit;
        while (_outcomes.size() < outcomes && std::chrono::steady_clock::now() < give_up) {
            _loop.run_once(std::chrono::milliseconds(2));
        }
    }
    void run_for(std::chrono::milliseconds d) {
        const auto end = std::chrono::steady_clock::now() + d;
        while (std::chrono::steady_clock::now() < end) {
            _loop.run_once(std::chrono::milliseconds(2));
        }
    }
    std::string reasons() const {
        std::map<std::string, int> m;
        for (const auto& [id, o] : _outcomes) {
            ++m[o.reason + (o.detail.empty() ? "" : " (" + o.detail.substr(0, 120) + ")")];
        }
        std::string s;
        for (const auto& [r, n] : m) {
            s += r + " x" + std::to_string(n) + "; ";
        }
        return s;
    }
    // Payloads of 64 KiB to 1 MiB (the wire's largest).
    static std::vector<std::uint8_t> program(std::size_t i) {
        const std::size_t kib = 64 + (i * 193) % (1024 - 64 + 1);
        std::vector<std::uint8_t> p(kib * 1024, ' ');
        const std::string head = "OPENQASM 3; qubit[2] q; h q[0]; cx q[0], q[1];\n";
        std::copy(head.begin(), head.end(), p.begin());
        return p;
    }

    fs::path _dir, _sock;
    qrt::event_loop _loop;
    rtcore::real_clock _clock;
    std::unique_ptr<qpu_link> _link;
    std::map<std::uint64_t, dispatch_outcome> _outcomes;
};

}  // namespace

// Every job armed before its T, fired on time; started within milliseconds
// of T, where version 1 (the same qpu-sim, the same programs) starts every
// job late by its upload.  A burst of 24 jobs against max_armed 6 is paced.
TEST_F(dispatch_two_phase, every_job_is_armed_ahead_and_none_starts_late_by_its_upload) {
    constexpr std::size_t n = 24;
    nlohmann::json by_version[3];
    for (unsigned version : {2U, 1U}) {
        _outcomes.clear();
        sim s(_sock, _dir, [&] {
            auto a = prepare_200ms;
            a.insert(a.end(), {"--max-armed", "6"});
            return a;
        }());
        open_link(version);
        // Jobs 260 ms apart (more than one prepare each), the first 1.5 s out:
        // the link may hold only 6 armed at once.
        const std::int64_t t0 = _clock.now_realtime_ns() + 1'500 * ms;
        for (std::size_t i = 0; i < n; ++i) {
            ASSERT_TRUE(_link->submit(make_job(100 + i, t0 + static_cast<std::int64_t>(i) * 260 * ms), program(i)));
        }
        run_until(n, std::chrono::seconds(30));
        const dispatch_telemetry tel = _link->telemetry();
        if (version == 2) {
            // The arm lead learned from ARMED: at least what the endpoint's
            // HELLO states (200 ms + 16 ms for the largest program) and what
            // ARM -> ARMED took here; the endpoint's own start after T is
            // what the link saw in RESULT.
            EXPECT_GE(tel.arm_lead_ns, 216 * ms);
            EXPECT_GE(tel.arm_lead_ns, tel.arm_latency.p50_ns);
            EXPECT_GE(tel.arm_latency.min_ns, 200 * ms);
            EXPECT_EQ(tel.armed, n);
            EXPECT_EQ(tel.start_lateness.count, n);
            EXPECT_LT(tel.start_lateness.max_ns, 200 * ms);
        } else {
            EXPECT_EQ(tel.arms_sent, 0U);
        }
        _link->stop();
        by_version[version] = s.stop();
        ASSERT_EQ(_outcomes.size(), n) << reasons();
        for (const auto& [id, o] : _outcomes) {
            EXPECT_EQ(o.state, job_state::completed) << "v" << version << " job " << id << ": " << o.reason << " "
                                                     << o.detail;
        }
        if (version == 2) {
            const auto frames = s.frames();
            for (std::size_t i = 0; i < n; ++i) {
                EXPECT_EQ(frames.at(100 + i), (std::vector<std::string>{"ARM", "FIRE"})) << "job " << 100 + i;
            }
        }
        _link.reset();
    }
    const auto& v2 = by_version[2];
    const auto& v1 = by_version[1];
    ASSERT_TRUE(v2.contains("two_phase")) << v2.dump();
    EXPECT_EQ(v2["two_phase"]["armed"].get<std::uint64_t>(), n);
    EXPECT_EQ(v2["two_phase"]["fires"].get<std::uint64_t>(), n);
    EXPECT_EQ(v2["two_phase"]["fired_unarmed"].get<std::uint64_t>(), 0U);
    EXPECT_EQ(v2["two_phase"]["arm_refused"].get<std::uint64_t>(), 0U) << "a burst beyond max_armed is paced";
    EXPECT_LE(v2["two_phase"]["max_held"].get<std::uint64_t>(), 6U);
    EXPECT_EQ(v1["two_phase"]["arms"].get<std::uint64_t>(), 0U);
    // None starts late by its upload (>= 201 ms each); version 1's all do.
    const std::int64_t upload = 200 * ms;
    EXPECT_LT(v2["start_lateness_ns"]["max"].get<std::int64_t>(), upload) << v2.dump();
    EXPECT_GE(v1["start_lateness_ns"]["min"].get<std::int64_t>(), upload) << v1.dump();
    std::printf("start lateness at the endpoint, p50/p99 (us): two-phase %.0f/%.0f, one-phase %.0f/%.0f\n",
                v2["start_lateness_ns"]["p50"].get<double>() / 1e3, v2["start_lateness_ns"]["p99"].get<double>() / 1e3,
                v1["start_lateness_ns"]["p50"].get<double>() / 1e3, v1["start_lateness_ns"]["p99"].get<double>() / 1e3);
}

TEST_F(dispatch_two_phase, a_withdrawn_armed_job_is_disarmed_and_never_fired) {
    sim s(_sock, _dir, {"--prepare-ms", "20"});
    open_link(2);
    const std::int64_t t0 = _clock.now_realtime_ns() + 1'000 * ms;
    for (std::uint64_t i = 0; i < 3; ++i) {
        ASSERT_TRUE(_link->submit(make_job(1 + i, t0 + static_cast<std::int64_t>(i) * 50 * ms), program(0)));
    }
    run_for(std::chrono::milliseconds(400));  // armed (3 x 20 ms of prepare), well before T
    ASSERT_EQ(_link->withdraw(2), dispatcher::withdraw_result::withdrawn);
    _link->report_withdrawn();
    run_until(3, std::chrono::seconds(10));
    ASSERT_EQ(_outcomes.size(), 3U) << reasons();
    EXPECT_EQ(_outcomes[1].state, job_state::completed);
    EXPECT_EQ(_outcomes[3].state, job_state::completed);
    EXPECT_EQ(_outcomes[2].reason, outcome::cancelled);
    run_for(std::chrono::milliseconds(100));  // the DISARM's answer
    _link->stop();
    const auto j = s.stop();
    EXPECT_EQ(s.frames()[2], (std::vector<std::string>{"ARM", "DISARM"}));
    EXPECT_EQ(j["two_phase"]["disarmed"].get<std::uint64_t>(), 1U) << j.dump();
    EXPECT_EQ(j["two_phase"]["fires"].get<std::uint64_t>(), 2U);
    EXPECT_EQ(j["two_phase"]["fired_unarmed"].get<std::uint64_t>(), 0U);
}

// Preempted or moved (a calibration switch's re-placement goes the same
// way: the gate withdraws, the room hands the job over again): DISARM,
// then ARM again for the new start, and FIRE at that one.
TEST_F(dispatch_two_phase, a_replaced_armed_job_is_disarmed_rearmed_and_fired_at_its_new_start) {
    sim s(_sock, _dir, {"--prepare-ms", "20"});
    open_link(2);
    const std::int64_t t_old = _clock.now_realtime_ns() + 800 * ms;
    ASSERT_TRUE(_link->submit(make_job(5, t_old), program(0)));
    run_for(std::chrono::milliseconds(300));  // armed
    ASSERT_EQ(_link->withdraw(5), dispatcher::withdraw_result::withdrawn);
    _link->report_withdrawn();
    run_until(1, std::chrono::seconds(10));
    ASSERT_EQ(_outcomes.size(), 1U);
    EXPECT_EQ(_outcomes[5].reason, outcome::cancelled);
    _outcomes.clear();
    dispatch_job moved = make_job(5, t_old + 600 * ms);
    moved.calibration_id = 2;  // its new window's
    ASSERT_TRUE(_link->submit(moved, program(0)));
    run_until(1, std::chrono::seconds(10));
    ASSERT_EQ(_outcomes.size(), 1U) << reasons();
    EXPECT_EQ(_outcomes[5].state, job_state::completed) << _outcomes[5].detail;
    EXPECT_GE(_outcomes[5].sent_ns, moved.scheduled_ns) << "fired at its new start, not the old";
    _link->stop();
    const auto j = s.stop();
    EXPECT_EQ(s.frames()[5], (std::vector<std::string>{"ARM", "DISARM", "ARM", "FIRE"}));
    EXPECT_EQ(j["two_phase"]["fired_unarmed"].get<std::uint64_t>(), 0U) << j.dump();
}

TEST_F(dispatch_two_phase, a_job_not_armed_by_its_start_is_never_fired) {
    sim s(_sock, _dir, {"--prepare-ms", "600"});
    open_link(2);
    ASSERT_TRUE(_link->submit(make_job(7, _clock.now_realtime_ns() + 200 * ms), program(0)));
    run_until(1, std::chrono::seconds(10));
    ASSERT_EQ(_outcomes.size(), 1U);
    EXPECT_EQ(_outcomes[7].reason, outcome::not_armed) << _outcomes[7].detail;
    EXPECT_EQ(_outcomes[7].state, job_state::missed);
    EXPECT_EQ(_outcomes[7].sent_ns, 0);
    EXPECT_EQ(_link->telemetry().not_armed, 1U);
    EXPECT_GE(_link->arm_lead_ns(), 600 * ms) << "never below what the endpoint's HELLO states";
    _link->stop();
    const auto j = s.stop();
    EXPECT_EQ(j["two_phase"]["fires"].get<std::uint64_t>(), 0U) << j.dump();
}

TEST_F(dispatch_two_phase, a_program_refused_at_arm_fails_naming_the_stage_before_its_slot) {
    sim s(_sock, _dir, {"--prepare-ms", "1", "--refuse-marker", "nosuchgate"});
    open_link(2);
    const std::string text = "OPENQASM 3;\nqubit q;\nnosuchgate q;\n";
    const std::int64_t t = _clock.now_realtime_ns() + 2'000 * ms;
    ASSERT_TRUE(_link->submit(make_job(9, t), std::vector<std::uint8_t>(text.begin(), text.end())));
    run_until(1, std::chrono::seconds(10));
    ASSERT_EQ(_outcomes.size(), 1U);
    const auto& o = _outcomes[9];
    EXPECT_EQ(o.state, job_state::failed);
    EXPECT_EQ(o.reason, outcome::arm_refused);
    EXPECT_NE(o.detail.find("stage parse"), std::string::npos) << o.detail;
    EXPECT_NE(o.detail.find("line 3"), std::string::npos) << o.detail;
    EXPECT_LT(_clock.now_realtime_ns(), t) << "ended before its slot";
    _link->stop();
    EXPECT_EQ(s.stop()["two_phase"]["fires"].get<std::uint64_t>(), 0U);
}

// 20 armed jobs; the endpoint is killed and restarted: each job is re-armed
// on the new connection and completes, or (its T passed while down) ends
// endpoint_disconnected; the new endpoint never sees a FIRE for a job it
// does not hold armed.
TEST_F(dispatch_two_phase, an_endpoint_killed_with_armed_jobs_rearms_them_or_ends_them_disconnected) {
    const fs::path first = _dir / "first", second = _dir / "second";
    fs::create_directories(first);
    fs::create_directories(second);
    auto s1 = std::make_unique<sim>(_sock, first, std::vector<std::string>{"--prepare-ms", "5", "--max-armed", "32"});
    open_link(2);
    const std::int64_t t0 = _clock.now_realtime_ns() + 800 * ms;
    for (std::uint64_t i = 0; i < 20; ++i) {
        ASSERT_TRUE(_link->submit(make_job(200 + i, t0 + static_cast<std::int64_t>(i) * 40 * ms), program(0)));
    }
    run_for(std::chrono::milliseconds(400));  // all armed (20 x 5 ms)
    s1->stop(SIGKILL);
    fs::remove(_sock);
    run_for(std::chrono::milliseconds(600));  // the first starts pass while it is down
    sim s2(_sock, second, {"--prepare-ms", "5", "--max-armed", "32"});
    run_until(20, std::chrono::seconds(20));
    ASSERT_EQ(_outcomes.size(), 20U) << reasons();
    std::size_t completed = 0, disconnected = 0;
    for (const auto& [id, o] : _outcomes) {
        if (o.state == job_state::completed) {
            ++completed;
        } else {
            EXPECT_EQ(o.reason, outcome::endpoint_disconnected) << "job " << id << ": " << o.detail;
            EXPECT_EQ(o.sent_ns, 0) << "job " << id << " was fired";
            ++disconnected;
        }
    }
    EXPECT_GT(completed, 0U) << reasons();
    EXPECT_GT(disconnected, 0U) << reasons();
    _link->stop();
    const auto j = s2.stop();
    EXPECT_EQ(j["two_phase"]["fired_unarmed"].get<std::uint64_t>(), 0U) << j.dump();
    EXPECT_EQ(j["two_phase"]["fires"].get<std::uint64_t>(), completed);
    for (const auto& [id, f] : s2.frames()) {
        EXPECT_EQ(f.front(), "ARM") << "job " << id << " re-armed before any FIRE";
    }
}
