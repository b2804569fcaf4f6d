// The dispatch thread allocates nothing (dispatcher_rt.cpp: "no allocation,
// no lock, no log"): this binary replaces the global operator new and counts
// every allocation made by a thread named qrt-dispatch, then runs a
// dispatcher (untuned mode, a real thread, a socketpair endpoint) through
// what its loop does -- sends, a missed job, a withdrawn one, a calibration
// change, an endpoint update, stop -- and expects the count to stay 0.
// Its own binary, so the replacement touches no other test.  Under
// AddressSanitizer (which owns operator new) it skips.

#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <thread>
#include <vector>

#include "qrt/dispatch/dispatch_group.hpp"
#include "qrt/dispatch/dispatcher.hpp"

#include "qrt_test/sanitizer.hpp"

namespace {

std::atomic<unsigned long> dispatch_thread_allocations{0};

// The calling thread's name is the dispatch thread's (prctl: no allocation).
bool on_dispatch_thread() noexcept {
    char name[17] = {};
    if (::prctl(PR_GET_NAME, name, 0, 0, 0) != 0) {
        return false;
    }
    return std::strcmp(name, "qrt-dispatch") == 0;
}

void* counted_alloc(std::size_t n, std::size_t align) {
    if (on_dispatch_thread()) {
        dispatch_thread_allocations.fetch_add(1, std::memory_order_relaxed);
    }
    void* p = nullptr;
    if (align <= alignof(std::max_align_t)) {
        p = std::malloc(n == 0 ? 1 : n);
    } else if (::posix_memalign(&p, align, n == 0 ? align : n) != 0) {
        p = nullptr;
    }
    return p;
}

}  // namespace

#ifndef QRT_TEST_SANITIZED
void* operator new(std::size_t n) {
    if (void* p = counted_alloc(n, 0)) {
        return p;
    }
    throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
    if (void* p = counted_alloc(n, 0)) {
        return p;
    }
    throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
    if (void* p = counted_alloc(n, static_cast<std::size_t>(a))) {
        return p;
    }
    throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
    if (void* p = counted_alloc(n, static_cast<std::size_t>(a))) {
        return p;
    }
    throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n, 0); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#endif

namespace {

using namespace qrt::dispatch;

constexpr std::int64_t ms = 1'000'000;

dispatch_job job_at(std::uint64_t id, std::int64_t t_rt, std::uint64_t calibration_id = 1) {
    dispatch_job j;
    j.job_id = id;
    j.scheduled_ns = t_rt;
    j.window_start_ns = t_rt - 1000 * ms;
    j.window_end_ns = t_rt + 1000 * ms;
    j.duration_ns = 100'000;
    j.calibration_id = calibration_id;
    j.tolerance_ns = 300 * ms;  // a late thread start on a loaded machine must not make these missed
    j.shots = 10;
    return j;
}

// Bounded wait for n records (the test thread allocates; it is not counted).
std::vector<dispatch_record> wait_records(dispatcher& d, std::size_t n) {
    std::vector<dispatch_record> out;
    for (int i = 0; i < 3000 && out.size() < n; ++i) {
        d.drain_records([&](const dispatch_record& r) { out.push_back(r); });
        if (out.size() < n) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    return out;
}

const std::uint8_t payload[] = {'h', 'e', 'l', 'l', 'o'};

}  // namespace

TEST(dispatch_rt, the_dispatch_thread_allocates_nothing_from_start_to_stop) {
#ifdef QRT_TEST_SANITIZED
    GTEST_SKIP() << "the sanitizer owns operator new in this build; the count would not be ours";
#else
    // The counter counts: an allocation on a thread named so is seen.
    std::thread probe([] {
        ::prctl(PR_SET_NAME, "qrt-dispatch", 0, 0, 0);
        void* p = ::operator new(64);  // a direct call: not elided as a new-expression may be
        ::operator delete(p);
    });
    probe.join();
    ASSERT_EQ(dispatch_thread_allocations.exchange(0), 1U) << "the replaced operator new does not count";

    int sp[2] = {-1, -1};
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    int sp2[2] = {-1, -1};
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp2), 0);
    rtcore::real_clock clock;
    dispatcher_config cfg;
    cfg.mode = dispatch_mode::untuned;
    cfg.slots = 8;
    cfg.max_payload_bytes = 256;
    {
        dispatcher d(cfg, clock);
        ASSERT_TRUE(d.set_endpoint_fd(sp[0]));
        d.set_calibration_id(1);
        const std::int64_t t = clock.now_realtime_ns() + 40 * ms;
        ASSERT_TRUE(d.submit(job_at(1, t), payload));                                    // sent
        ASSERT_TRUE(d.submit(job_at(2, clock.now_realtime_ns() - 1000 * ms), payload));  // missed
        ASSERT_TRUE(d.submit(job_at(3, t + 20 * ms), payload));                          // withdrawn
        ASSERT_TRUE(d.start());
        EXPECT_EQ(d.withdraw(3), dispatcher::withdraw_result::withdrawn);
        auto recs = wait_records(d, 3);
        // The thread applies an endpoint update itself (register_files_update),
        // and reads a calibration change through the seqlock.
        ASSERT_TRUE(d.set_endpoint_fd(sp2[0]));
        d.set_calibration_id(2);
        const std::int64_t t2 = clock.now_realtime_ns() + 30 * ms;
        ASSERT_TRUE(d.submit(job_at(4, t2, 2), payload));            // sent on the new endpoint
        ASSERT_TRUE(d.submit(job_at(6, t2 + 10 * ms, 1), payload));  // calibration_changed
        auto more = wait_records(d, 2);
        recs.insert(recs.end(), more.begin(), more.end());
        ASSERT_TRUE(d.submit(job_at(5, clock.now_realtime_ns() + 500 * ms), payload));  // cancelled by stop
        d.stop();
        std::map<dispatch_status, unsigned> seen;
        for (const auto& r : recs) {
            ++seen[r.status];
        }
        EXPECT_EQ(recs.size(), 5U);
        EXPECT_EQ(seen[dispatch_status::sent], 2U) << "jobs 1 and 4 went out";
        EXPECT_EQ(seen[dispatch_status::missed], 1U);
        EXPECT_EQ(seen[dispatch_status::cancelled], 1U) << "job 3 was withdrawn";
        EXPECT_EQ(seen[dispatch_status::calibration_changed], 1U) << "job 6 was of the old calibration";
    }
    ::close(sp[0]);
    ::close(sp[1]);
    ::close(sp2[0]);
    ::close(sp2[1]);
    EXPECT_EQ(dispatch_thread_allocations.load(), 0U)
        << "the dispatch thread allocated with operator new; dispatcher_rt.cpp must not allocate";
#endif
}

// The same for one thread serving two QPUs (dispatch_group.cpp): sends on
// both, a missed job, a withdrawn one, an endpoint update on one, stop.
TEST(dispatch_rt, a_dispatch_groups_thread_allocates_nothing_from_start_to_stop) {
#ifdef QRT_TEST_SANITIZED
    GTEST_SKIP() << "the sanitizer owns operator new in this build; the count would not be ours";
#else
    dispatch_thread_allocations.store(0);
    int sp[2] = {-1, -1};
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    int sp2[2] = {-1, -1};
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp2), 0);
    rtcore::real_clock clock;
    dispatcher_config cfg;
    cfg.mode = dispatch_mode::untuned;
    cfg.slots = 8;
    cfg.max_payload_bytes = 256;
    {
        dispatcher d0(cfg, clock);
        cfg.qpu_index = 1;
        dispatcher d1(cfg, clock);
        ASSERT_TRUE(d0.set_endpoint_fd(sp[0]));
        ASSERT_TRUE(d1.set_endpoint_fd(sp2[0]));
        d0.set_calibration_id(1);
        d1.set_calibration_id(1);
        dispatch_group g({&d0, &d1});
        const std::int64_t t = clock.now_realtime_ns() + 40 * ms;
        ASSERT_TRUE(d0.submit(job_at(1, t), payload));                                    // sent
        ASSERT_TRUE(d1.submit(job_at(2, t), payload));                                    // sent
        ASSERT_TRUE(d1.submit(job_at(3, clock.now_realtime_ns() - 1000 * ms), payload));  // missed
        ASSERT_TRUE(d0.submit(job_at(4, t + 20 * ms), payload));                          // withdrawn
        ASSERT_TRUE(g.start());
        EXPECT_EQ(d0.withdraw(4), dispatcher::withdraw_result::withdrawn);
        d0.report_withdrawn();
        std::vector<dispatch_record> recs;
        for (int i = 0; i < 3000 && recs.size() < 4; ++i) {
            d0.drain_records([&](const dispatch_record& r) { recs.push_back(r); });
            d1.drain_records([&](const dispatch_record& r) { recs.push_back(r); });
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        ASSERT_TRUE(d1.set_endpoint_fd(sp[0]));  // applied by the group's thread
        ASSERT_TRUE(d1.submit(job_at(5, clock.now_realtime_ns() + 20 * ms), payload));  // sent on the new one
        auto more = wait_records(d1, 1);
        recs.insert(recs.end(), more.begin(), more.end());
        ASSERT_TRUE(d0.submit(job_at(6, clock.now_realtime_ns() + 500 * ms), payload));  // cancelled by stop
        g.stop();
        more = wait_records(d0, 1);
        recs.insert(recs.end(), more.begin(), more.end());
        std::map<dispatch_status, unsigned> seen;
        for (const auto& r : recs) {
            ++seen[r.status];
        }
        EXPECT_EQ(recs.size(), 6U);
        EXPECT_EQ(seen[dispatch_status::sent], 3U) << "jobs 1, 2 and 5 went out";
        EXPECT_EQ(seen[dispatch_status::missed], 1U);
        EXPECT_EQ(seen[dispatch_status::cancelled], 2U) << "job 4 was withdrawn, job 6 stopped";
    }
    ::close(sp[0]);
    ::close(sp[1]);
    ::close(sp2[0]);
    ::close(sp2[1]);
    EXPECT_EQ(dispatch_thread_allocations.load(), 0U)
        << "the group's dispatch thread allocated with operator new; dispatch_group.cpp must not allocate";
#endif
}
