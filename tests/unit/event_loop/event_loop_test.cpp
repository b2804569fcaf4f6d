#include <gtest/gtest.h>

#include <sys/epoll.h>
#include <unistd.h>

#include <stdexcept>
#include <thread>

#include "qrt/event_loop.hpp"

using namespace std::chrono_literals;

TEST(event_loop, calls_back_when_an_fd_becomes_readable) {
    qrt::event_loop loop;
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    int calls = 0;
    ASSERT_TRUE(loop.add_fd(p[0], EPOLLIN, [&](std::uint32_t ev) {
        EXPECT_TRUE(ev & EPOLLIN);
        char c;
        ASSERT_EQ(::read(p[0], &c, 1), 1);
        ++calls;
        loop.remove_fd(p[0]);  // removing itself from inside a callback is allowed
        loop.stop();
    }));
    ASSERT_EQ(::write(p[1], "x", 1), 1);
    loop.run();
    EXPECT_EQ(calls, 1);
    EXPECT_FALSE(loop.watching(p[0]));
    ::close(p[0]);
    ::close(p[1]);
}

TEST(event_loop, one_shot_timer_fires_once_and_periodic_timer_repeats) {
    qrt::event_loop loop;
    int once = 0;
    int periodic = 0;
    ASSERT_TRUE(loop.add_timer(1ms, 0ns, [&] { ++once; }));
    auto id = loop.add_timer(1ms, 1ms, [&] {
        if (++periodic == 3) {
            loop.stop();
        }
    });
    ASSERT_TRUE(id);
    loop.run();
    EXPECT_EQ(once, 1);
    EXPECT_EQ(periodic, 3);
    loop.cancel_timer(*id);
}

TEST(event_loop, post_runs_tasks_from_other_threads_on_the_loop_thread) {
    qrt::event_loop loop;
    std::thread::id ran_on;
    std::thread poster([&] { loop.post([&] { ran_on = std::this_thread::get_id(); loop.stop(); }); });
    loop.run();
    poster.join();
    EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(event_loop, add_fd_on_a_bad_fd_names_the_call) {
    qrt::event_loop loop;
    auto st = loop.add_fd(-1, EPOLLIN, [](std::uint32_t) {});
    ASSERT_FALSE(st);
    EXPECT_EQ(st.err().message, "epoll_ctl ADD fd -1: Bad file descriptor");
}

TEST(event_loop, a_throwing_callback_does_not_end_the_loop) {
    qrt::event_loop loop;
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    int reads = 0;
    ASSERT_TRUE(loop.add_fd(p[0], EPOLLIN, [&](std::uint32_t) {
        char c;
        ASSERT_EQ(::read(p[0], &c, 1), 1);
        ++reads;
        if (c == 'x') {
            throw std::runtime_error("bad request");
        }
        loop.stop();
    }));
    ASSERT_TRUE(loop.add_timer(1ms, 0ms, [] { throw std::logic_error("timer bug"); }));
    loop.post([] { throw 42; });  // not even a std::exception
    ASSERT_EQ(::write(p[1], "x", 1), 1);
    ASSERT_TRUE(loop.add_timer(20ms, 0ms, [&] { ASSERT_EQ(::write(p[1], "y", 1), 1); }));
    loop.run();  // returns only through the second read's stop()
    EXPECT_EQ(reads, 2);
    EXPECT_EQ(loop.callback_errors(), 3u);
    EXPECT_TRUE(loop.watching(p[0])) << "one throw does not cost the fd its watch";
    ::close(p[0]);
    ::close(p[1]);
}

TEST(event_loop, an_fd_whose_callback_keeps_throwing_is_dropped_not_spun_on) {
    qrt::event_loop loop;
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    int calls = 0;
    // Level-triggered and never read: it would fire forever.
    ASSERT_TRUE(loop.add_fd(p[0], EPOLLIN, [&](std::uint32_t) {
        ++calls;
        throw std::runtime_error("cannot parse");
    }));
    ASSERT_EQ(::write(p[1], "x", 1), 1);
    for (int i = 0; i < 1000 && loop.watching(p[0]); ++i) {
        loop.run_once(100ms);
    }
    EXPECT_FALSE(loop.watching(p[0]));
    EXPECT_EQ(calls, static_cast<int>(qrt::event_loop::max_consecutive_throws));
    EXPECT_EQ(loop.callback_errors(), qrt::event_loop::max_consecutive_throws);
    ::close(p[0]);
    ::close(p[1]);
}

TEST(event_loop, a_timer_that_keeps_throwing_keeps_firing) {
    // A timer's fd is read before its callback, so it cannot spin the loop;
    // dropping it (the job pump, an endpoint poll) would silently stop work.
    qrt::event_loop loop;
    int fired = 0;
    ASSERT_TRUE(loop.add_timer(100us, 100us, [&] {
        ++fired;
        throw std::runtime_error("pump bug");
    }));
    const unsigned enough = qrt::event_loop::max_consecutive_throws + 20;
    for (int i = 0; i < 20000 && static_cast<unsigned>(fired) < enough; ++i) {
        loop.run_once(10ms);
    }
    EXPECT_GE(static_cast<unsigned>(fired), enough);
    EXPECT_EQ(loop.callback_errors(), static_cast<std::uint64_t>(fired));
}
