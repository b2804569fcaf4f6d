// The near-term share's booked time, kept incrementally (booked_time.hpp,
// ledger::booked_within), against a full recount: the index on its own with
// random intervals, and the ledger after a randomized sequence of every
// operation that places or vacates a reservation -- reserve, submit, gangs,
// commit, release, cancel, completion, failure, misses, lease expiry,
// preemption, re-placement and displacement by a calibration change,
// forgetting, restarts that reload the store -- while time passes and the
// near term slides.  Fixed seeds: deterministic.

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "helpers.hpp"
#include "qrt/timeline/booked_time.hpp"

namespace qrt::timeline {
namespace {

using namespace qrt::timeline::test;

std::int64_t overlap(std::int64_t s, std::int64_t e, std::int64_t a, std::int64_t b) {
    const std::int64_t lo = std::max(s, a);
    const std::int64_t hi = std::min(e, b);
    return hi > lo ? hi - lo : 0;
}

TEST(booked_time, equals_a_recount_of_random_intervals_over_any_window) {
    std::mt19937_64 rng(20261207);
    const auto uni = [&](std::int64_t lo, std::int64_t hi) {
        return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    };
    booked_time index;
    // tenant, id, start, end: overlapping, sharing starts, far in the past
    // and the future (CLOCK_REALTIME nanoseconds: the sums pass 2^63).
    std::set<std::tuple<std::string, std::uint64_t, std::int64_t, std::int64_t>> held;
    const std::string tenants[] = {"a", "b", "c/ns"};
    const std::int64_t base = 1'790'000'000 * s_ns;
    for (int step = 0; step < 4000; ++step) {
        if (held.empty() || uni(0, 2) != 0) {
            const std::int64_t s = base + uni(-1000, 100'000) * 1'000'000;
            const std::int64_t e = s + uni(1, 5000) * 1'000'000;
            const std::string& t = tenants[uni(0, 2)];
            const auto id = static_cast<std::uint64_t>(step);
            index.add(t, id, s, e);
            held.insert({t, id, s, e});
        } else {
            auto it = held.begin();
            std::advance(it, uni(0, static_cast<std::int64_t>(held.size()) - 1));
            const auto& [t, id, s, e] = *it;
            index.remove(t, id, s, e);
            held.erase(it);
        }
        ASSERT_EQ(index.intervals(), held.size());
        for (int k = 0; k < 3; ++k) {
            const std::int64_t a = base + uni(-2000, 110'000) * 1'000'000;
            const std::int64_t b = k == 0 ? a + 600 * s_ns : a + uni(-10, 20'000) * 1'000'000;
            for (const std::string& t : tenants) {
                std::int64_t want = 0;
                for (const auto& [ht, id, s, e] : held) {
                    want += ht == t ? overlap(s, e, a, b) : 0;
                }
                ASSERT_EQ(index.within(t, a, b), want) << "step " << step << " tenant " << t;
            }
        }
    }
    // Whole range, and what is not held.
    index.add("a", 1'000'000, 5, 10);
    index.add("a", 1'000'000, 5, 10);  // held already: nothing changes
    const std::int64_t all = index.within("a", std::numeric_limits<std::int64_t>::min(),
                                          std::numeric_limits<std::int64_t>::max());
    index.remove("a", 1'000'000, 5, 10);
    index.remove("a", 1'000'000, 5, 10);
    EXPECT_EQ(index.within("a", std::numeric_limits<std::int64_t>::min(),
                           std::numeric_limits<std::int64_t>::max()),
              all - 5);
    EXPECT_EQ(index.within("nobody", 0, std::numeric_limits<std::int64_t>::max()), 0);
    index.clear();
    EXPECT_EQ(index.intervals(), 0U);
    EXPECT_EQ(index.tenants(), 0U);
}

// The ledger, operation after operation: booked_within equals a recount of
// the live reservations for the near term, which slides as time passes,
// and for random windows.
class booked_within_random : public ::testing::TestWithParam<const char*> {
protected:
    void SetUp() override {
        const std::string shm = "/dev/shm";
        const std::filesystem::path dir =
            ::access(shm.c_str(), W_OK) == 0 ? std::filesystem::path(shm) : std::filesystem::temp_directory_path();
        std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
        std::replace(name.begin(), name.end(), '/', '-');
        _path = (dir / ("qrt-booked-" + std::to_string(::getpid()) + "-" + name)).string();
        std::filesystem::remove(_path);
    }
    void TearDown() override {
        _l.reset();
        for (const char* suffix : {"", "-wal", "-shm"}) {
            std::filesystem::remove(_path + suffix);
        }
    }
    void open(std::int64_t now) {
        if (_l) {
            _preemptions += _l->stats().preemptions;
        }
        _l.reset();  // a restart: everything comes back from the store
        ledger_options o;
        o.policy = GetParam();
        o.horizon_ns = 20 * period_ns;
        o.calibration_change = on_calibration_change::replace;
        auto l = ledger::open({periodic_qpu("q0"), periodic_qpu("q1"), pushed_qpu("p0")}, o, _path, now);
        ASSERT_TRUE(l.has_value()) << l.err().message;
        _l = std::move(*l);
    }

    std::string _path;
    std::unique_ptr<ledger> _l;
    std::size_t _preemptions = 0;  // of the ledgers before the last restart
};

TEST_P(booked_within_random, equals_a_full_recount_after_every_operation) {
    std::mt19937_64 rng(20261207);
    const auto uni = [&](std::int64_t lo, std::int64_t hi) {
        return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    };
    const auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
    constexpr std::int64_t near_term_ns = 600 * s_ns;
    std::int64_t now = t0_ns;
    std::uint64_t next_window = 1;
    open(now);
    std::set<std::uint64_t> known;
    const std::string tenants[] = {"alice", "bob", "k8s/team-a"};
    std::map<std::string, std::size_t> ops;  // kind -> the times it changed something
    std::size_t moved = 0;                    // re-placed or displaced by a calibration change
    std::size_t steps_booked = 0;             // steps after which the near term held something
    const auto recount = [&](const std::string& tenant, std::int64_t a, std::int64_t b) {
        std::int64_t total = 0;
        for (const std::uint64_t id : known) {
            const reservation* r = _l->find(id);
            if (r != nullptr && r->tenant == tenant && is_active(r->state)) {
                total += overlap(r->start_ns, r->end_ns(), a, b);
            }
        }
        return total;
    };
    const auto random_request = [&] {
        request r;
        r.duration_ns = uni(1, 60) * s_ns;
        r.not_before_ns = chance(0.5) ? 0 : now + uni(0, 900) * s_ns;
        r.priority = static_cast<std::int32_t>(uni(0, 3));
        if (chance(0.3)) {
            // A tight deadline: under priority-preempt a higher priority
            // displaces what is in its way.
            r.deadline_ns = std::max(now, r.not_before_ns) + r.duration_ns + uni(0, 30) * s_ns;
        }
        if (chance(0.3)) {
            r.qpus = {chance(0.5) ? "p0" : "q0"};
        }
        return r;
    };
    // A random reservation in one of `states` (nullptr: none is).
    const auto pick = [&](std::initializer_list<res_state> states) -> const reservation* {
        std::vector<const reservation*> in;
        for (const std::uint64_t id : known) {
            const reservation* r = _l->find(id);
            if (r != nullptr && std::find(states.begin(), states.end(), r->state) != states.end()) {
                in.push_back(r);
            }
        }
        return in.empty() ? nullptr : in[static_cast<std::size_t>(uni(0, static_cast<std::int64_t>(in.size()) - 1))];
    };
    for (int step = 0; step < 2500; ++step) {
        if (chance(0.4)) {
            now += uni(0, 20) * s_ns;  // the near term slides
        }
        const std::string tenant = tenants[uni(0, 2)];
        const int op = static_cast<int>(uni(0, 13));
        std::string what;
        bool done = false;  // the operation changed something
        const auto track = [&](const auto& r) {
            if (r) {
                known.insert(r->id);
                done = true;
            }
        };
        switch (op) {
        case 0:
        case 1:
            what = "reserve";
            track(_l->reserve(tenant, random_request(), "", uni(1, 120) * s_ns, now));
            break;
        case 2:
            what = "submit";
            track(_l->submit(tenant, random_request(), "", {1}, now));
            break;
        case 3: {
            what = "gang";
            request g = random_request();
            g.qpus.clear();
            if (auto r = _l->reserve_gang(tenant, g, static_cast<std::size_t>(uni(2, 3)), "", 60 * s_ns, now)) {
                for (const reservation& m : *r) {
                    known.insert(m.id);
                }
                done = true;
            }
            break;
        }
        case 4:
            what = "commit";
            if (const reservation* t = pick({res_state::held})) {
                done = _l->commit(t->tenant, t->id, t->fencing_token, {2}, now).has_value();
            }
            break;
        case 5:
            what = "release";
            if (const reservation* t = pick({res_state::held})) {
                done = _l->release(t->tenant, t->id, t->fencing_token, now).has_value();
            }
            break;
        case 6:
            what = "cancel";
            if (const reservation* t = pick({res_state::committed})) {
                done = _l->cancel(t->tenant, t->id, now).has_value();
            }
            break;
        case 7: {
            what = "dispatch";
            for (const char* q : {"q0", "q1", "p0"}) {
                for (const reservation& d : _l->due_jobs(q, now + 30 * s_ns)) {
                    if (chance(0.5)) {
                        done = _l->mark_dispatched(d.id, std::max(now, d.start_ns)).has_value() || done;
                    }
                }
            }
            break;
        }
        case 8:
            what = "complete/fail";
            if (const reservation* t = pick({res_state::dispatched})) {
                done = (chance(0.7) ? _l->complete(t->id, {4}, now) : _l->fail(t->id, "qpu error", now)).has_value();
            }
            break;
        case 9:
            what = "expire/missed";
            done = _l->expire_leases(now).value_or(0) + _l->mark_missed(now, s_ns).value_or(0) > 0;
            break;
        case 10:
        case 11: {
            what = "calibration";
            std::vector<calibration_window> ws;
            std::int64_t from = now + uni(-50, 100) * s_ns;
            for (int i = 0; i < uni(0, 4); ++i) {
                calibration_window w;
                w.calibration_id = next_window++;
                w.valid_from_ns = from;
                w.valid_until_ns = from + uni(20, 400) * s_ns;
                w.f0 = 0.99;
                ws.push_back(w);
                from = w.valid_until_ns + uni(0, 60) * s_ns;
            }
            if (auto r = _l->update_calibration("p0", ws, now)) {
                done = true;
                moved += r->replaced + r->displaced;
            }
            break;
        }
        case 12:
            what = "forget";
            done = _l->forget_terminal(now - 300 * s_ns).value_or(0) > 0;
            break;
        default:
            what = "restart";
            open(now);
            done = true;
            break;
        }
        ops[what] += done ? 1 : 0;
        (void)_l->drain_events();
        for (const std::string& who : tenants) {
            const std::int64_t a = now + uni(-100, 1500) * s_ns;
            const std::int64_t b = a + uni(0, 900) * s_ns;
            ASSERT_EQ(_l->booked_within(who, now, now + near_term_ns), recount(who, now, now + near_term_ns))
                << "step " << step << " (" << what << "), " << who << ", the near term";
            ASSERT_EQ(_l->booked_within(who, a, b), recount(who, a, b))
                << "step " << step << " (" << what << "), " << who << ", [" << a << ", " << b << ")";
        }
        ASSERT_TRUE(_l->check_invariants().empty()) << "step " << step << " (" << what << ")";
        std::int64_t near = 0;
        for (const std::string& who : tenants) {
            near += _l->booked_within(who, now, now + near_term_ns);
        }
        steps_booked += near > 0 ? 1 : 0;
    }
    // Every kind of operation changed the ledger, many times, with
    // something booked in the near term most of the time.
    EXPECT_EQ(ops.size(), 12U);
    for (const auto& [what, n] : ops) {
        EXPECT_GE(n, 10U) << what;
    }
    EXPECT_GT(moved, 0U) << "no calibration change re-placed or displaced a reservation";
    EXPECT_GT(steps_booked, 500U) << "the near term was mostly empty";
    if (std::string(GetParam()) == "priority-preempt") {
        EXPECT_GT(_preemptions + _l->stats().preemptions, 0U);
    }
}

INSTANTIATE_TEST_SUITE_P(policies, booked_within_random, ::testing::Values("edf-backfill", "priority-preempt"),
                         [](const auto& p) {
                             std::string n = p.param;
                             std::replace(n.begin(), n.end(), '-', '_');
                             return n;
                         });

}  // namespace
}  // namespace qrt::timeline
