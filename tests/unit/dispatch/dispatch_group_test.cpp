// Two QPUs' dispatchers served by one dispatch thread (dispatch_group):
// frames go out in start order across the two, equal starts in [[qpu]]
// order, and what happens on one QPU (a withdrawal, its endpoint down)
// leaves the other sending.  Both members write to dups of ONE socket, so
// the order the peer reads is the order the thread sent in.  No timing is
// asserted.

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "qrt/dispatch/dispatch_group.hpp"
#include "qrt/proto/wire_codec.hpp"
#include "rtcore/capabilities.hpp"
#include "qrt_test/memory_lock.hpp"

using namespace qrt::dispatch;
namespace wire = qrt::wire;

namespace {

constexpr std::int64_t ms = 1'000'000;
constexpr std::int64_t us = 1'000;

class dispatch_group_fixture : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, _sp), 0);
        _fd0 = ::dup(_sp[0]);
        _fd1 = ::dup(_sp[0]);
        ASSERT_GE(_fd0, 0);
        ASSERT_GE(_fd1, 0);
    }
    void TearDown() override {
        for (int fd : {_sp[0], _sp[1], _fd0, _fd1}) {
            if (fd >= 0) {
                ::close(fd);
            }
        }
    }

    static dispatcher_config member(std::uint32_t qpu, dispatch_mode mode = dispatch_mode::untuned) {
        dispatcher_config c;
        c.qpu_index = qpu;
        c.mode = mode;
        c.slots = 16;
        c.max_payload_bytes = 256;
        c.hold_cpu_dma_latency = false;
        return c;
    }

    static dispatch_job job_at(std::uint64_t id, std::int64_t t_rt) {
        dispatch_job j;
        j.job_id = id;
        j.scheduled_ns = t_rt;
        j.window_start_ns = t_rt - 1000 * ms;
        j.window_end_ns = t_rt + 1000 * ms;
        j.duration_ns = 10'000;
        j.calibration_id = 1;
        j.tolerance_ns = 300 * ms;  // a loaded CI machine must not turn these into `missed`
        j.shots = 1;
        return j;
    }

    // Bounded wait for n records across both members.
    static std::vector<dispatch_record> wait_records(dispatcher& a, dispatcher& b, std::size_t n) {
        std::vector<dispatch_record> out;
        for (int i = 0; i < 3000 && out.size() < n; ++i) {
            a.drain_records([&](const dispatch_record& r) { out.push_back(r); });
            b.drain_records([&](const dispatch_record& r) { out.push_back(r); });
            if (out.size() < n) {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
        }
        return out;
    }

    // Job ids in the order the peer received their frames.
    std::vector<std::uint64_t> arrival_order() {
        wire::frame_reader r;
        std::uint8_t buf[4096];
        ssize_t n = 0;
        while ((n = ::recv(_sp[1], buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
            r.feed({buf, static_cast<std::size_t>(n)});
        }
        std::vector<std::uint64_t> out;
        while (auto f = r.next()) {
            out.push_back(f->hdr.job_id);
        }
        EXPECT_EQ(r.error(), wire::decode_status::ok);
        return out;
    }

    // Submits jobs[i] to the member its qpu says, in the order given, and
    // checks every one is sent and the frames arrive in `expected` order.
    struct placed {
        int qpu;
        std::uint64_t id;
        std::int64_t t_rt;
    };
    void expect_arrival(dispatch_mode mode, const std::vector<placed>& submits,
                        const std::vector<std::uint64_t>& expected) {
        dispatcher d0(member(0, mode), _clock);
        dispatcher d1(member(1, mode), _clock);
        ASSERT_TRUE(d0.set_endpoint_fd(_fd0));
        ASSERT_TRUE(d1.set_endpoint_fd(_fd1));
        dispatch_group g({&d0, &d1});
        ASSERT_TRUE(g.start());
        const std::uint8_t payload[] = {1, 2, 3};
        for (const placed& p : submits) {
            ASSERT_TRUE((p.qpu == 0 ? d0 : d1).submit(job_at(p.id, p.t_rt), payload));
        }
        const auto recs = wait_records(d0, d1, submits.size());
        ASSERT_EQ(recs.size(), submits.size());
        for (const auto& r : recs) {
            EXPECT_EQ(r.status, dispatch_status::sent) << "job " << r.job_id;
        }
        g.stop();
        EXPECT_EQ(arrival_order(), expected);
    }

    int _sp[2] = {-1, -1};
    int _fd0 = -1;
    int _fd1 = -1;
    rtcore::real_clock _clock;
};

TEST_F(dispatch_group_fixture, interleaved_starts_on_two_qpus_go_out_in_start_order) {
    const std::int64_t t = _clock.now_realtime_ns() + 30 * ms;
    // QPU 1's jobs handed over last, though each is before one of QPU 0's.
    expect_arrival(dispatch_mode::untuned,
                   {{0, 2, t + 10 * ms}, {0, 4, t + 30 * ms}, {0, 6, t + 50 * ms},
                    {1, 1, t}, {1, 3, t + 20 * ms}, {1, 5, t + 40 * ms}},
                   {1, 2, 3, 4, 5, 6});
}

TEST_F(dispatch_group_fixture, equal_starts_on_two_qpus_go_out_in_qpu_order) {
    const std::int64_t t = _clock.now_realtime_ns() + 30 * ms;
    // Handed over QPU 1 first: the tie still goes to QPU 0.
    expect_arrival(dispatch_mode::untuned,
                   {{1, 2, t}, {1, 4, t + 10 * ms}, {0, 1, t}, {0, 3, t + 10 * ms}},
                   {1, 2, 3, 4});
}

TEST_F(dispatch_group_fixture, starts_50_us_apart_on_two_qpus_go_out_in_start_order) {
    const std::int64_t t = _clock.now_realtime_ns() + 30 * ms;
    std::vector<placed> submits;
    std::vector<std::uint64_t> expected;
    // Ids 1..8 at t, t + 50 us, ...; odd ids on QPU 1, even on QPU 0,
    // handed over in reverse start order.
    for (std::uint64_t id = 8; id >= 1; --id) {
        submits.push_back({static_cast<int>(id % 2), id, t + static_cast<std::int64_t>(id - 1) * 50 * us});
    }
    for (std::uint64_t id = 1; id <= 8; ++id) {
        expected.push_back(id);
    }
    expect_arrival(dispatch_mode::untuned, submits, expected);
}

TEST_F(dispatch_group_fixture, a_tuned_group_on_one_cpu_sends_in_start_order_and_keeps_its_placement) {
    if (!qrt::testing::mlock_really_locks()) {
        GTEST_SKIP() << qrt::testing::mlock_locks_nothing;
    }
    if (!rtcore::has_capability(CAP_SYS_NICE) || !rtcore::has_capability(CAP_IPC_LOCK)) {
        GTEST_SKIP() << "needs CAP_SYS_NICE and CAP_IPC_LOCK (root) for a tuned dispatch thread";
    }
    const int cpu = std::thread::hardware_concurrency() > 1 ? 1 : 0;
    auto c0 = member(0, dispatch_mode::tuned);
    auto c1 = member(1, dispatch_mode::tuned);
    c0.dispatch_cpu = c1.dispatch_cpu = cpu;
    dispatcher d0(c0, _clock);
    dispatcher d1(c1, _clock);
    ASSERT_TRUE(d0.set_endpoint_fd(_fd0));
    ASSERT_TRUE(d1.set_endpoint_fd(_fd1));
    dispatch_group g({&d0, &d1});
    ASSERT_TRUE(g.start());
    for (const dispatcher* d : {&d0, &d1}) {
        const auto ts = d->thread_stats();
        EXPECT_TRUE(ts.rt_applied) << d->setup_error();
        EXPECT_TRUE(ts.mlocked) << d->setup_error();
        EXPECT_TRUE(ts.placement_ok);
        EXPECT_EQ(ts.cpu_seen, cpu);
    }
    const std::int64_t t = _clock.now_realtime_ns() + 30 * ms;
    const std::uint8_t payload[] = {7};
    // Same start, then 50 us apart, alternating QPUs.
    ASSERT_TRUE(d1.submit(job_at(2, t), payload));
    ASSERT_TRUE(d0.submit(job_at(1, t), payload));
    ASSERT_TRUE(d1.submit(job_at(3, t + 50 * us), payload));
    ASSERT_TRUE(d0.submit(job_at(4, t + 100 * us), payload));
    ASSERT_TRUE(d1.submit(job_at(5, t + 150 * us), payload));
    const auto recs = wait_records(d0, d1, 5);
    ASSERT_EQ(recs.size(), 5U);
    for (const auto& r : recs) {
        EXPECT_EQ(r.status, dispatch_status::sent) << "job " << r.job_id;
    }
    g.stop();
    EXPECT_EQ(arrival_order(), (std::vector<std::uint64_t>{1, 2, 3, 4, 5}));
}

TEST_F(dispatch_group_fixture, a_withdrawal_on_one_qpu_leaves_the_other_sending) {
    dispatcher d0(member(0), _clock);
    dispatcher d1(member(1), _clock);
    ASSERT_TRUE(d0.set_endpoint_fd(_fd0));
    ASSERT_TRUE(d1.set_endpoint_fd(_fd1));
    dispatch_group g({&d0, &d1});
    ASSERT_TRUE(g.start());
    const std::int64_t t = _clock.now_realtime_ns() + 50 * ms;
    const std::uint8_t payload[] = {1};
    ASSERT_TRUE(d0.submit(job_at(1, t), payload));
    ASSERT_TRUE(d1.submit(job_at(2, t + 1 * ms), payload));
    ASSERT_TRUE(d0.submit(job_at(3, t + 2 * ms), payload));
    EXPECT_EQ(d0.withdraw(1), dispatcher::withdraw_result::withdrawn);
    d0.report_withdrawn();
    const auto recs = wait_records(d0, d1, 3);
    ASSERT_EQ(recs.size(), 3U);
    for (const auto& r : recs) {
        EXPECT_EQ(r.status, r.job_id == 1 ? dispatch_status::cancelled : dispatch_status::sent) << "job " << r.job_id;
    }
    g.stop();
    EXPECT_EQ(arrival_order(), (std::vector<std::uint64_t>{2, 3}));
}

TEST_F(dispatch_group_fixture, one_qpus_endpoint_down_leaves_the_other_sending) {
    dispatcher d0(member(0), _clock);
    dispatcher d1(member(1), _clock);
    ASSERT_TRUE(d0.set_endpoint_fd(_fd0));
    ASSERT_TRUE(d1.set_endpoint_fd(_fd1));
    dispatch_group g({&d0, &d1});
    ASSERT_TRUE(g.start());
    d0.clear_endpoint();  // applied by the group's thread
    const std::int64_t t = _clock.now_realtime_ns() + 50 * ms;
    const std::uint8_t payload[] = {1};
    ASSERT_TRUE(d0.submit(job_at(1, t), payload));
    ASSERT_TRUE(d1.submit(job_at(2, t), payload));
    ASSERT_TRUE(d0.submit(job_at(3, t + 1 * ms), payload));
    ASSERT_TRUE(d1.submit(job_at(4, t + 1 * ms), payload));
    const auto recs = wait_records(d0, d1, 4);
    ASSERT_EQ(recs.size(), 4U);
    for (const auto& r : recs) {
        EXPECT_EQ(r.status, r.job_id % 2 == 1 ? dispatch_status::endpoint_down : dispatch_status::sent)
            << "job " << r.job_id;
    }
    // And back: a new endpoint on QPU 0 is taken by the same thread.
    ASSERT_TRUE(d0.set_endpoint_fd(_fd0));
    ASSERT_TRUE(d0.submit(job_at(5, _clock.now_realtime_ns() + 20 * ms), payload));
    const auto more = wait_records(d0, d1, 1);
    ASSERT_EQ(more.size(), 1U);
    EXPECT_EQ(more[0].status, dispatch_status::sent);
    g.stop();
    EXPECT_EQ(arrival_order(), (std::vector<std::uint64_t>{2, 4, 5}));
}

TEST_F(dispatch_group_fixture, stop_cancels_every_members_queued_jobs_and_members_cannot_start_alone) {
    dispatcher d0(member(0), _clock);
    dispatcher d1(member(1), _clock);
    dispatch_group g({&d0, &d1});
    EXPECT_FALSE(d0.start()) << "a member is started by its group";
    ASSERT_TRUE(g.start());
    const std::int64_t t = _clock.now_realtime_ns() + 10'000 * ms;
    const std::uint8_t payload[] = {1};
    ASSERT_TRUE(d0.submit(job_at(1, t), payload));
    ASSERT_TRUE(d1.submit(job_at(2, t), payload));
    g.stop();
    const auto recs = wait_records(d0, d1, 2);
    ASSERT_EQ(recs.size(), 2U);
    for (const auto& r : recs) {
        EXPECT_EQ(r.status, dispatch_status::cancelled);
    }
}

TEST_F(dispatch_group_fixture, members_that_cannot_share_a_thread_are_refused_with_the_reason) {
    dispatcher d0(member(0), _clock);
    auto c1 = member(1, dispatch_mode::tuned);
    dispatcher d1(c1, _clock);
    try {
        dispatch_group g({&d0, &d1});
        FAIL() << "a tuned and an untuned member in one group";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("qpu 1 differs from qpu 0"), std::string::npos) << e.what();
    }
    std::vector<std::unique_ptr<dispatcher>> many;
    std::vector<dispatcher*> ptrs;
    for (std::uint32_t i = 0; i <= dispatch_group::max_members; ++i) {
        many.push_back(std::make_unique<dispatcher>(member(10 + i), _clock));
        ptrs.push_back(many.back().get());
    }
    EXPECT_THROW(dispatch_group{ptrs}, std::invalid_argument);
    // Refused members were left alone: each still starts its own thread.
    ASSERT_TRUE(d0.start());
    d0.stop();
}

}  // namespace
