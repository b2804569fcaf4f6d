#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <thread>

#include "rtcore/spsc_ring.hpp"

namespace {

struct job_descriptor {
    std::uint64_t job_id;
    std::int64_t scheduled_ns;
    std::uint32_t payload_len;
};

}  // namespace

TEST(spsc_ring, rejects_a_capacity_that_is_not_a_power_of_two) {
    EXPECT_THROW(rtcore::spsc_ring<int>(0), std::invalid_argument);
    EXPECT_THROW(rtcore::spsc_ring<int>(3), std::invalid_argument);
    EXPECT_THROW(rtcore::spsc_ring<int>(1000), std::invalid_argument);
    EXPECT_EQ(rtcore::spsc_ring<int>(1).capacity(), 1u);
    EXPECT_EQ(rtcore::spsc_ring<int>(1024).capacity(), 1024u);
}

TEST(spsc_ring, keeps_producer_and_consumer_indices_on_separate_cache_lines) {
    EXPECT_GE(sizeof(rtcore::spsc_ring<int>), 3 * rtcore::cache_line_bytes);
    EXPECT_EQ(alignof(rtcore::spsc_ring<int>), rtcore::cache_line_bytes);
}

TEST(spsc_ring, an_empty_ring_pops_nothing) {
    rtcore::spsc_ring<int> ring(4);
    EXPECT_FALSE(ring.try_pop().has_value());
    EXPECT_EQ(ring.peek(), nullptr);
    EXPECT_TRUE(ring.empty_approx());
}

TEST(spsc_ring, fills_every_slot_then_refuses_without_losing_items) {
    rtcore::spsc_ring<int> ring(8);
    for (int i = 0; i < 8; ++i) {
        EXPECT_TRUE(ring.try_push(i)) << "push " << i;
    }
    EXPECT_EQ(ring.size_approx(), 8u);
    EXPECT_FALSE(ring.try_push(99));
    for (int i = 0; i < 8; ++i) {
        const auto v = ring.try_pop();
        ASSERT_TRUE(v.has_value());
        EXPECT_EQ(*v, i);
    }
    EXPECT_FALSE(ring.try_pop().has_value());
    EXPECT_EQ(ring.pushed_total(), 8u);
    EXPECT_EQ(ring.popped_total(), 8u);
}

TEST(spsc_ring, wraps_around_many_times_in_order) {
    rtcore::spsc_ring<std::uint64_t> ring(4);
    std::uint64_t next_in = 0;
    std::uint64_t next_out = 0;
    for (int round = 0; round < 1000; ++round) {
        const int n = 1 + round % 4;
        for (int i = 0; i < n; ++i) {
            ASSERT_TRUE(ring.try_push(next_in++));
        }
        for (int i = 0; i < n; ++i) {
            const auto v = ring.try_pop();
            ASSERT_TRUE(v.has_value());
            ASSERT_EQ(*v, next_out++);
        }
    }
    EXPECT_TRUE(ring.empty_approx());
}

TEST(spsc_ring, peek_shows_the_oldest_item_until_pop_front) {
    rtcore::spsc_ring<job_descriptor> ring(2);
    ASSERT_TRUE(ring.try_push({7, 1000, 16}));
    ASSERT_TRUE(ring.try_push({8, 2000, 32}));
    const job_descriptor* front = ring.peek();
    ASSERT_NE(front, nullptr);
    EXPECT_EQ(front->job_id, 7u);
    EXPECT_EQ(ring.peek(), front);
    ring.pop_front();
    front = ring.peek();
    ASSERT_NE(front, nullptr);
    EXPECT_EQ(front->job_id, 8u);
    EXPECT_EQ(front->scheduled_ns, 2000);
    EXPECT_EQ(front->payload_len, 32u);
}

TEST(spsc_ring, push_and_pop_are_noexcept) {
    rtcore::spsc_ring<int> ring(2);
    static_assert(noexcept(ring.try_push(1)));
    static_assert(noexcept(ring.try_pop()));
    static_assert(noexcept(ring.peek()));
    static_assert(noexcept(ring.pop_front()));
    SUCCEED();
}

// Two threads through a small ring: every item arrives once, in order, with
// its payload intact.  Bounded count; no timing is asserted.
TEST(spsc_ring, two_threads_pass_every_item_in_order_without_loss) {
    constexpr std::uint64_t items = 2'000'000;
    rtcore::spsc_ring<job_descriptor> ring(64);
    std::atomic<bool> go{false};

    std::thread producer([&] {
        while (!go.load(std::memory_order_acquire)) {
        }
        for (std::uint64_t i = 0; i < items;) {
            const job_descriptor d{i, static_cast<std::int64_t>(i * 3), static_cast<std::uint32_t>(i & 0xffff)};
            if (ring.try_push(d)) {
                ++i;
            } else {
                std::this_thread::yield();
            }
        }
    });

    std::uint64_t expected = 0;
    std::uint64_t bad = 0;
    go.store(true, std::memory_order_release);
    while (expected < items) {
        const auto d = ring.try_pop();
        if (!d) {
            std::this_thread::yield();
            continue;
        }
        if (d->job_id != expected || d->scheduled_ns != static_cast<std::int64_t>(expected * 3) ||
            d->payload_len != static_cast<std::uint32_t>(expected & 0xffff)) {
            ++bad;
        }
        ++expected;
    }
    producer.join();
    EXPECT_EQ(bad, 0u);
    EXPECT_EQ(expected, items);
    EXPECT_FALSE(ring.try_pop().has_value());
    EXPECT_EQ(ring.pushed_total(), items);
    EXPECT_EQ(ring.popped_total(), items);
}
