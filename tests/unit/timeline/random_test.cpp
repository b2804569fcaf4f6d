// Randomized operations with a fixed seed: after every step every invariant
// holds, and every failed operation left the ledger exactly as it was.
#include <random>
#include <set>

#include "helpers.hpp"

namespace qrt::timeline {
namespace {

using namespace qrt::timeline::test;

class random_ops : public ::testing::TestWithParam<const char*> {};

struct world {
    std::mt19937_64 rng{20261129};
    std::int64_t now = t0_ns;
    std::set<std::uint64_t> known;
    std::uint64_t next_window_id = 1;
    std::int64_t pushed_until = t0_ns;

    std::int64_t uni(std::int64_t lo, std::int64_t hi) {
        return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    }
    bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

    request random_request() {
        request r;
        r.duration_ns = uni(1, 60) * s_ns;
        if (chance(0.02)) {
            r.duration_ns = uni(-2, 0) * s_ns;  // bad input
        }
        r.not_before_ns = chance(0.5) ? 0 : now + uni(0, 300) * s_ns;
        if (chance(0.5)) {
            const std::int64_t from = std::max(now, r.not_before_ns);
            r.deadline_ns = from + r.duration_ns + uni(-5, 400) * s_ns;
            if (r.deadline_ns < r.not_before_ns + r.duration_ns && chance(0.7)) {
                r.deadline_ns = 0;
            }
        }
        r.priority = static_cast<std::int32_t>(uni(0, 3));
        if (chance(0.3)) {
            r.min_fidelity = 0.9 + 0.09 * std::uniform_real_distribution<double>(0, 1)(rng);
        }
        if (chance(0.01)) {
            r.min_fidelity = 1.2;
        }
        const char* names[] = {"q0", "q1", "p0", "zz"};
        if (chance(0.4)) {
            const int n = static_cast<int>(uni(1, 2));
            for (int i = 0; i < n; ++i) {
                const std::string q = names[uni(0, chance(0.02) ? 3 : 2)];
                if (std::find(r.qpus.begin(), r.qpus.end(), q) == r.qpus.end()) {
                    r.qpus.push_back(q);
                }
            }
        }
        r.max_candidates = static_cast<std::size_t>(uni(1, 5));
        return r;
    }

    std::vector<calibration_window> random_windows() {
        std::vector<calibration_window> ws;
        std::int64_t t = now + uni(-50, 100) * s_ns;
        const int n = static_cast<int>(uni(0, 4));
        for (int i = 0; i < n; ++i) {
            calibration_window w;
            w.calibration_id = next_window_id++;
            w.valid_from_ns = t;
            w.valid_until_ns = t + uni(20, 200) * s_ns;
            w.f0 = 0.9 + 0.1 * std::uniform_real_distribution<double>(0, 1)(rng);
            w.tau_ns = chance(0.5) ? 0 : uni(100, 2000) * s_ns;
            ws.push_back(w);
            t = w.valid_until_ns + uni(0, 60) * s_ns;
        }
        if (!ws.empty() && chance(0.05)) {
            ws.back().valid_from_ns = ws.front().valid_from_ns;  // overlap or backwards
        }
        return ws;
    }
};

TEST_P(random_ops, keep_every_invariant_over_ten_thousand_operations) {
    ledger_options o;
    o.policy = GetParam();
    o.horizon_ns = 20 * period_ns;
    o.calibration_yield_ns = 20 * s_ns;
    o.calibration_preempt = std::string(GetParam()) == "fidelity-aware" ? calibration_preempt::never
                                                                         : calibration_preempt::held;
    o.calibration_change = std::string(GetParam()) == "fifo" ? on_calibration_change::fail
                                                             : on_calibration_change::replace;
    auto opened = ledger::open({periodic_qpu("q0"), periodic_qpu("q1"), pushed_qpu("p0")}, o, "",
                               t0_ns);
    ASSERT_TRUE(opened);
    ledger& l = **opened;
    world w;
    const char* tenants[] = {"alice", "bob", "carol"};
    std::size_t ok_ops = 0;
    std::size_t failed_ops = 0;
    std::size_t replaced_or_displaced = 0;
    std::size_t gangs_dispatched = 0;
    std::size_t blocks_placed = 0;
    std::size_t blocks_yielding = 0;
    std::set<std::uint64_t> blocks;
    auto snap = [&] {
        std::vector<reservation> out;
        for (const std::uint64_t id : w.known) {
            if (const reservation* r = l.find(id)) {
                out.push_back(*r);
            }
        }
        return out;
    };
    auto pick = [&]() -> const reservation* {
        if (w.known.empty()) {
            return nullptr;
        }
        auto it = w.known.lower_bound(static_cast<std::uint64_t>(
            w.uni(0, static_cast<std::int64_t>(*w.known.rbegin()))));
        if (it == w.known.end()) {
            it = w.known.begin();
        }
        return l.find(*it);
    };
    constexpr int k_ops = 10'000;
    for (int step = 0; step < k_ops; ++step) {
        if (w.chance(0.3)) {
            w.now += w.uni(0, 5) * s_ns;
        }
        const std::string tenant = tenants[w.uni(0, 2)];
        const std::string key = w.chance(0.3) ? "k" + std::to_string(w.uni(0, 40)) : "";
        const auto before = snap();
        bool ok = true;
        std::string what;
        const int op = static_cast<int>(w.uni(0, 18));
        // No acknowledged job is displaced for calibration: every committed
        // or dispatched job keeps its state and start through a block op.
        std::vector<reservation> acknowledged;
        if (op >= 16) {
            for (const reservation& r : before) {
                if (r.state == res_state::committed || r.state == res_state::dispatched) {
                    acknowledged.push_back(r);
                }
            }
        }
        auto track = [&](const auto& r) {
            ok = r.has_value();
            if (ok) {
                w.known.insert(r->id);
            }
        };
        const reservation* target = pick();
        // Mostly the owner and the right token; sometimes not.
        const std::string who =
            target != nullptr && w.chance(0.9) ? target->tenant : tenant;
        const std::uint64_t token =
            target != nullptr ? target->fencing_token + (w.chance(0.05) ? 1U : 0U) : 0U;
        const std::uint64_t id = target != nullptr ? target->id : 424242U;
        switch (op) {
        case 0:
            what = "query";
            ok = l.query(w.random_request(), w.now).has_value();
            break;
        case 1:
        case 2:
            what = "reserve";
            track(l.reserve(tenant, w.random_request(), key, w.uni(0, 60) * s_ns, w.now));
            break;
        case 3:
            what = "submit";
            track(l.submit(tenant, w.random_request(), key, {1, 2, 3}, w.now));
            break;
        case 4: {
            what = "gang";
            request gr = w.random_request();
            if (w.chance(0.7)) {
                gr.qpus.clear();  // all three QPUs: k = 2 or 3 is valid
            }
            auto g = l.reserve_gang(tenant, gr, static_cast<std::size_t>(w.uni(1, 3)),
                                    key, w.uni(0, 60) * s_ns, w.now);
            ok = g.has_value();
            if (ok) {
                for (const reservation& m : *g) {
                    w.known.insert(m.id);
                }
                if (w.chance(0.6)) {  // so that gangs reach the dispatcher
                    (void)l.drain_events();
                    ASSERT_TRUE(l.check_invariants().empty());
                    const reservation& m = g->front();
                    ok = l.commit(m.tenant, m.id, m.fencing_token, {7}, w.now).has_value() || true;
                }
            }
            break;
        }
        case 5:
            what = "heartbeat";
            ok = l.heartbeat(who, id, token, w.now).has_value();
            break;
        case 6:
            what = "release";
            ok = l.release(who, id, token, w.now).has_value();
            break;
        case 7:
            what = "commit";
            ok = l.commit(who, id, token, {9}, w.now).has_value();
            break;
        case 8:
            what = "cancel";
            ok = l.cancel(who, id, w.now).has_value();
            break;
        case 9:
            what = "expire";
            ok = l.expire_leases(w.now).has_value();
            break;
        case 10:
            what = "missed";
            ok = l.mark_missed(w.now, w.uni(0, 2) * s_ns).has_value();
            break;
        case 11: {
            what = "dispatch";
            const char* q = w.chance(0.5) ? "q0" : (w.chance(0.5) ? "q1" : "p0");
            const auto due = l.due_jobs(q, w.now + s_ns);
            if (!due.empty()) {
                const reservation& d = due[static_cast<std::size_t>(
                    w.uni(0, static_cast<std::int64_t>(due.size()) - 1))];
                ok = (w.chance(0.9) ? l.mark_dispatched(d.id, std::max(w.now, d.start_ns))
                                    : l.miss(d.id, "endpoint down", w.now))
                         .has_value();
                gangs_dispatched += d.gang_id != 0 ? 1U : 0U;
            }
            break;
        }
        case 12:
            what = "complete/fail";
            if (target != nullptr && w.chance(0.8)) {
                ok = (w.chance(0.7) ? l.complete(id, {4}, w.now) : l.fail(id, "qpu error", w.now))
                         .has_value();
            } else {
                ok = l.complete(id, {}, w.now).has_value();
            }
            break;
        case 13:
        case 14: {
            what = "calibration";
            auto r = l.update_calibration(w.chance(0.95) ? "p0" : "q0", w.random_windows(), w.now);
            ok = r.has_value();
            if (ok) {
                replaced_or_displaced += r->replaced + r->displaced;
            }
            break;
        }
        case 16: {
            what = "calibration block";
            const char* q = w.chance(0.4) ? "q0" : (w.chance(0.6) ? "p0" : (w.chance(0.95) ? "q1" : "zz"));
            block_request br{q, "step" + std::to_string(w.uni(0, 3)), w.uni(1, 40) * s_ns,
                             w.now + w.uni(-5, 400) * s_ns, static_cast<std::int32_t>(w.uni(0, 4))};
            auto b = l.request_block(tenant, br, key, w.now);
            ok = b.has_value();
            if (ok) {
                blocks.insert(b->id);
                ++blocks_placed;
                blocks_yielding += b->state == block_state::yielding ? 1U : 0U;
                if (b->state != block_state::yielding && w.chance(0.5)) {
                    // The service's own job, inside the block.
                    request in;
                    in.duration_ns = std::max<std::int64_t>(1, b->duration_ns / 4);
                    in.block_id = b->id;
                    (void)l.drain_events();
                    ASSERT_TRUE(l.check_invariants().empty());
                    (void)l.submit(b->tenant, in, "", {5}, w.now);
                }
            }
            break;
        }
        case 17:
            what = "settle blocks";
            ok = l.settle_blocks(w.now).has_value();
            break;
        case 18: {
            what = "cancel block";
            const std::uint64_t bid = blocks.empty() ? 99U : *std::next(blocks.begin(), w.uni(0, static_cast<std::int64_t>(blocks.size()) - 1));
            const calibration_block* b = l.find_block(bid);
            ok = l.cancel_block(b != nullptr && w.chance(0.9) ? b->tenant : tenant, bid, w.now).has_value();
            break;
        }
        default:
            what = "status";
            ok = l.status(who, id).has_value();
            break;
        }
        for (const reservation& a : acknowledged) {
            const reservation* now_r = l.find(a.id);
            ASSERT_NE(now_r, nullptr) << "step " << step << " (" << what << ")";
            ASSERT_EQ(now_r->state, a.state) << "step " << step << " (" << what << ") changed job " << a.id;
            ASSERT_EQ(now_r->start_ns, a.start_ns) << "step " << step << " (" << what << ") moved job " << a.id;
        }
        const auto events = l.drain_events();
        if (!ok) {
            ++failed_ops;
            ASSERT_EQ(snap(), before) << "step " << step << " (" << what << ") failed but changed the ledger";
            ASSERT_TRUE(events.empty()) << "step " << step << " (" << what << ") failed but emitted events";
        } else {
            ++ok_ops;
        }
        const auto bad = l.check_invariants();
        ASSERT_TRUE(bad.empty()) << "step " << step << " (" << what << "): "
                                 << ::testing::PrintToString(bad);
        if (step % 500 == 499) {
            ASSERT_TRUE(l.forget_terminal(w.now - 300 * s_ns));
            for (auto it = w.known.begin(); it != w.known.end();) {
                it = l.find(*it) == nullptr ? w.known.erase(it) : std::next(it);
            }
        }
    }
    // The run exercised both outcomes.
    EXPECT_GT(ok_ops, 3000U);
    EXPECT_GT(failed_ops, 500U);
    EXPECT_GT(replaced_or_displaced, 0U);
    EXPECT_GT(gangs_dispatched, 0U);
    EXPECT_GT(blocks_placed, 100U);
    EXPECT_GT(blocks_yielding, 0U);
    if (std::string(GetParam()) == "priority-preempt") {
        EXPECT_GT(l.stats().preemptions, 0U);
    }
    RecordProperty("ok_ops", static_cast<int>(ok_ops));
}

INSTANTIATE_TEST_SUITE_P(policies, random_ops,
                         ::testing::Values("fifo", "edf-backfill", "priority-preempt",
                                           "fidelity-aware"),
                         [](const auto& p) {
                             std::string n = p.param;
                             std::replace(n.begin(), n.end(), '-', '_');
                             return n;
                         });

}  // namespace
}  // namespace qrt::timeline
