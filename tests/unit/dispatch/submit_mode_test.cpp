// SQPOLL submission: frames reach the endpoint as in syscall mode, every
// send is counted, and a refused SQPOLL setup falls back to syscall
// submission with a reason.  No timing is asserted.

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "qrt/dispatch/dispatcher.hpp"
#include "qrt/proto/wire_codec.hpp"

using namespace qrt::dispatch;
namespace wire = qrt::wire;

namespace {

constexpr std::int64_t ms = 1'000'000;
const std::uint8_t payload[] = {'s', 'q', 'p'};

class submit_mode_fixture : public ::testing::Test {
protected:
    void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, _sp), 0); }
    void TearDown() override {
        ::close(_sp[0]);
        ::close(_sp[1]);
    }

    static dispatcher_config sqpoll_config(int sqpoll_cpu) {
        dispatcher_config c;
        c.mode = dispatch_mode::untuned;  // no root needed
        c.slots = 8;
        c.max_payload_bytes = 64;
        c.submit = submit_mode::sqpoll;
        c.sqpoll_cpu = sqpoll_cpu;
        c.sqpoll_idle_ms = 10;
        return c;
    }

    dispatch_job job_at(std::uint64_t id, std::int64_t t_rt) {
        dispatch_job j;
        j.job_id = id;
        j.scheduled_ns = t_rt;
        j.window_start_ns = t_rt - 1000 * ms;
        j.window_end_ns = t_rt + 1000 * ms;
        j.duration_ns = 1000;
        j.calibration_id = 1;
        j.tolerance_ns = 300 * ms;
        return j;
    }

    // Sends n jobs 5 ms apart (the first 20 ms out, the 4th after an 80 ms gap
    // so a 10 ms-idle poller has gone to sleep); returns the records (in
    // CQE order) and checks the frames that arrived.
    std::vector<dispatch_record> send_jobs(dispatcher& d, std::size_t n) {
        EXPECT_TRUE(d.set_endpoint_fd(_sp[0]));
        d.set_calibration_id(1);
        const std::int64_t t0 = _clock.now_realtime_ns() + 20 * ms;
        for (std::size_t i = 0; i < n; ++i) {
            const auto gap = static_cast<std::int64_t>(i) * 5 * ms + (i >= 3 ? 80 * ms : 0);
            EXPECT_TRUE(d.submit(job_at(i + 1, t0 + gap), payload));
        }
        EXPECT_TRUE(d.start());
        std::vector<dispatch_record> out;
        for (int i = 0; i < 3000 && out.size() < n; ++i) {
            d.drain_records([&](const dispatch_record& r) { out.push_back(r); });
            if (out.size() < n) {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
        }
        d.stop();
        wire::frame_reader r;
        std::uint8_t buf[4096];
        ssize_t got = 0;
        while ((got = ::recv(_sp[1], buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
            r.feed({buf, static_cast<std::size_t>(got)});
        }
        std::uint64_t want = 1;
        while (auto f = r.next()) {
            EXPECT_EQ(f->hdr.job_id, want++);
            EXPECT_EQ(f->payload_text(), "sqp");
            EXPECT_NE(f->hdr.sent_ns, 0);
        }
        EXPECT_EQ(want, n + 1) << "frames received";
        return out;
    }

    int _sp[2] = {-1, -1};
    rtcore::real_clock _clock;
};

}  // namespace

TEST(submit_mode_names, parse_and_format_round_trip) {
    EXPECT_EQ(parse_submit_mode("syscall"), submit_mode::syscall);
    EXPECT_EQ(parse_submit_mode("sqpoll"), submit_mode::sqpoll);
    EXPECT_FALSE(parse_submit_mode("SQPOLL").has_value());
    EXPECT_FALSE(parse_submit_mode("").has_value());
    EXPECT_STREQ(to_string(submit_mode::syscall), "syscall");
    EXPECT_STREQ(to_string(submit_mode::sqpoll), "sqpoll");
    EXPECT_EQ(dispatcher_config{}.submit, submit_mode::syscall) << "syscall stays the default";
}

TEST_F(submit_mode_fixture, sqpoll_sends_every_frame_in_order_without_a_syscall_per_send) {
    dispatcher d(sqpoll_config(0), _clock);
    if (d.effective_submit_mode() != submit_mode::sqpoll) {
        GTEST_SKIP() << "SQPOLL not available here: " << d.submit_fallback_reason();
    }
    EXPECT_TRUE(d.submit_fallback_reason().empty());
    EXPECT_GE(d.ring_fd(), 0);
    const auto recs = send_jobs(d, 6);
    ASSERT_EQ(recs.size(), 6u);
    for (const auto& r : recs) {
        EXPECT_EQ(r.status, dispatch_status::sent) << to_string(r.status) << " io " << r.io_result;
        EXPECT_EQ(r.io_result, static_cast<std::int32_t>(wire::header_len + sizeof(payload)));
    }
    const auto st = d.thread_stats();
    EXPECT_EQ(st.submits, 6u);
    EXPECT_EQ(st.submit_errors, 0u);
    // The poller sleeps after 10 ms idle: the first send after the 80 ms gap
    // has to wake it (a syscall, counted): at T - lead when the thread wakes
    // (prewake), or at T if the poller had not yet run; never more than one
    // per send at T.
    EXPECT_GE(st.sqpoll_wakeups + st.sqpoll_prewakes, 1u);
    EXPECT_LE(st.sqpoll_wakeups, st.submits);
}

TEST_F(submit_mode_fixture, the_poller_defaults_to_the_dispatch_cpu_and_is_named) {
    // sqpoll_cpu -1: the poller shares the dispatch CPU (it runs while the
    // RT thread sleeps).  Its TID is known, for the intrusion probe.
    const long ncpu = ::sysconf(_SC_NPROCESSORS_ONLN);
    ASSERT_GT(ncpu, 0);
    dispatcher_config c = sqpoll_config(-1);
    c.dispatch_cpu = static_cast<int>(ncpu - 1);
    dispatcher d(c, _clock);
    if (d.effective_submit_mode() != submit_mode::sqpoll) {
        GTEST_SKIP() << "SQPOLL not available here: " << d.submit_fallback_reason();
    }
    ASSERT_GT(d.sqpoll_tid(), 0);
    const auto recs = send_jobs(d, 4);
    ASSERT_EQ(recs.size(), 4u);
    for (const auto& r : recs) {
        EXPECT_EQ(r.status, dispatch_status::sent) << to_string(r.status) << " io " << r.io_result;
    }
    // Where the kernel put it (the kernel's own view, from /proc).
    std::ifstream status("/proc/self/task/" + std::to_string(d.sqpoll_tid()) + "/status");
    std::string line, allowed;
    while (std::getline(status, line)) {
        if (line.rfind("Cpus_allowed_list:", 0) == 0) {
            allowed = line.substr(line.find_first_not_of(" \t", 18));
        }
    }
    EXPECT_EQ(allowed, std::to_string(ncpu - 1)) << "poller not on the dispatch CPU";
}

TEST_F(submit_mode_fixture, a_refused_sqpoll_setup_falls_back_to_syscall_with_a_reason) {
    // No CPU 4095: IORING_SETUP_SQ_AFF is refused (EINVAL).
    dispatcher d(sqpoll_config(4095), _clock);
    ASSERT_EQ(d.effective_submit_mode(), submit_mode::syscall);
    EXPECT_NE(d.submit_fallback_reason().find("IORING_SETUP_SQPOLL"), std::string::npos)
        << d.submit_fallback_reason();
    EXPECT_NE(d.submit_fallback_reason().find("4095"), std::string::npos) << d.submit_fallback_reason();
    const auto recs = send_jobs(d, 4);
    ASSERT_EQ(recs.size(), 4u);
    for (const auto& r : recs) {
        EXPECT_EQ(r.status, dispatch_status::sent) << to_string(r.status);
    }
    EXPECT_EQ(d.thread_stats().submits, 4u);
    EXPECT_EQ(d.thread_stats().sqpoll_wakeups, 0u) << "no poller in syscall mode";
}

TEST_F(submit_mode_fixture, syscall_mode_never_reports_a_fallback) {
    dispatcher_config c = sqpoll_config(0);
    c.submit = submit_mode::syscall;
    dispatcher d(c, _clock);
    EXPECT_EQ(d.effective_submit_mode(), submit_mode::syscall);
    EXPECT_TRUE(d.submit_fallback_reason().empty());
}

TEST_F(submit_mode_fixture, back_to_back_jobs_wait_for_the_poller_between_them) {
    // Two jobs 50 us apart: the thread would not sleep between them, so
    // after the first it waits (bounded) for the poller to take the write.
    dispatcher_config c = sqpoll_config(-1);
    c.dispatch_cpu = 0;
    dispatcher d(c, _clock);
    if (d.effective_submit_mode() != submit_mode::sqpoll) {
        GTEST_SKIP() << "SQPOLL not available here: " << d.submit_fallback_reason();
    }
    ASSERT_TRUE(d.set_endpoint_fd(_sp[0]));
    d.set_calibration_id(1);
    const std::int64_t t = _clock.now_realtime_ns() + 30 * ms;
    ASSERT_TRUE(d.submit(job_at(1, t), payload));
    ASSERT_TRUE(d.submit(job_at(2, t + 50'000), payload));
    ASSERT_TRUE(d.start());
    std::vector<dispatch_record> recs;
    for (int i = 0; i < 3000 && recs.size() < 2; ++i) {
        d.drain_records([&](const dispatch_record& r) { recs.push_back(r); });
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    d.stop();
    ASSERT_EQ(recs.size(), 2u);
    for (const auto& r : recs) {
        EXPECT_EQ(r.status, dispatch_status::sent) << to_string(r.status) << " io " << r.io_result;
    }
    EXPECT_GE(d.thread_stats().sqpoll_yields, 1u);
}
