#include "qrt/timeline/gap_index.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace qrt::timeline {
namespace {

using gap = gap_index::gap;

TEST(gap_index, finds_containing_exact_and_first_fit) {
    gap_index g;
    g.insert({0, 10});
    g.insert({20, 25});
    g.insert({30, 100});
    EXPECT_EQ(g.size(), 3U);
    EXPECT_EQ(g.containing(5), (gap{0, 10}));
    EXPECT_FALSE(g.containing(10));
    EXPECT_FALSE(g.containing(15));
    EXPECT_EQ(g.find(20), (gap{20, 25}));
    EXPECT_FALSE(g.find(21));
    EXPECT_EQ(g.first_fit(0, 10), (gap{0, 10}));
    EXPECT_EQ(g.first_fit(1, 5), (gap{20, 25}));
    EXPECT_EQ(g.first_fit(1, 6), (gap{30, 100}));
    EXPECT_FALSE(g.first_fit(31, 1));
    EXPECT_FALSE(g.first_fit(0, 71));
    EXPECT_EQ(g.first(), (gap{0, 10}));
    EXPECT_EQ(g.last_fit(100, 70), (gap{30, 100}));
    EXPECT_EQ(g.last_fit(60, 30), (gap{30, 100}));  // [30, 60) ends by 60
    EXPECT_FALSE(g.last_fit(60, 31));
    EXPECT_EQ(g.last_fit(34, 5), (gap{20, 25}));    // [30, 34) is too short
    EXPECT_EQ(g.last_fit(25, 6), (gap{0, 10}));
    EXPECT_FALSE(g.last_fit(9, 10));
    EXPECT_FALSE(g.last_fit(0, 1));
    EXPECT_TRUE(g.erase(20));
    EXPECT_FALSE(g.erase(20));
    EXPECT_EQ(g.first_fit(1, 1), (gap{30, 100}));
    EXPECT_EQ(g.to_vector(), (std::vector<gap>{{0, 10}, {30, 100}}));
}

// The blocked index against a std::map reference under random inserts,
// erases and queries (thousands of gaps: blocks split and merge).
TEST(gap_index, matches_a_linear_reference_under_random_operations) {
    std::mt19937_64 rng(7);
    gap_index g;
    std::map<std::int64_t, std::int64_t> ref;
    for (int step = 0; step < 40000; ++step) {
        const std::int64_t slot = static_cast<std::int64_t>(rng() % 2000);
        const std::int64_t start = slot * 10;
        const int op = static_cast<int>(rng() % 3);
        if (op == 0 && ref.count(start) == 0) {
            const std::int64_t len = 1 + static_cast<std::int64_t>(rng() % 10);
            g.insert({start, start + len});
            ref[start] = start + len;
        } else if (op == 1) {
            EXPECT_EQ(g.erase(start), ref.erase(start) == 1);
        } else {
            const std::int64_t len = 1 + static_cast<std::int64_t>(rng() % 10);
            std::optional<gap> want;
            for (auto it = ref.lower_bound(start); it != ref.end(); ++it) {
                if (it->second - it->first >= len) {
                    want = gap{it->first, it->second};
                    break;
                }
            }
            ASSERT_EQ(g.first_fit(start, len), want) << "step " << step;
            std::optional<gap> cont;
            const std::int64_t t = start + 3;
            auto it = ref.upper_bound(t);
            if (it != ref.begin() && std::prev(it)->second > t) {
                cont = gap{std::prev(it)->first, std::prev(it)->second};
            }
            ASSERT_EQ(g.containing(t), cont) << "step " << step;
            std::optional<gap> from = cont && cont->end_ns - t >= len ? cont : std::nullopt;
            if (!from) {
                for (auto f = ref.upper_bound(t); f != ref.end(); ++f) {
                    if (f->second - f->first >= len) {
                        from = gap{f->first, f->second};
                        break;
                    }
                }
            }
            ASSERT_EQ(g.first_fit_from(t, len), from) << "step " << step;
            // The latest place a len-long interval ending by max_end fits.
            const std::int64_t max_end = start + static_cast<std::int64_t>(rng() % 40);
            std::optional<gap> last;
            for (auto l = ref.lower_bound(max_end); l != ref.begin();) {
                --l;
                if (std::min(l->second, max_end) - l->first >= len) {
                    last = gap{l->first, l->second};
                    break;
                }
            }
            ASSERT_EQ(g.last_fit(max_end, len), last) << "step " << step;
        }
        ASSERT_EQ(g.size(), ref.size());
    }
}

}  // namespace
}  // namespace qrt::timeline
