// qrt-fleet-sim's engine: same seed, same run; the structures really
// differ; the agent's own policy errors come through; the model file
// round-trips exactly and is refused when broken.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "fleet.hpp"
#include "mlp.hpp"
#include "report.hpp"

namespace {

using namespace qrt::fleet;
namespace wb = qrt::timeline::bench;

fleet_params small(std::uint64_t seed, wb::regime r = wb::regime::stationary) {
    fleet_params p;
    p.seed = seed;
    p.hosts = 8;
    p.hours = 0.5;
    p.warmup_h = 0.05;
    p.load = 0.9;
    p.regime = r;
    p.host_mtbf_h = 2.0;   // faults happen inside half an hour of 8 hosts
    p.stall_mtbf_h = 4.0;
    return p;
}

// A fixed actor that prefers the earlier start (weight -1 on feature 0),
// so a learned run needs no training.
mlp earliest_start_actor() {
    mlp m({k_actor_features, 1}, activation::linear);
    m.layers()[0].w[0] = -1.0F;
    return m;
}

fleet_metrics run(const fleet_params& p, structure s) {
    static const mlp actor = earliest_start_actor();
    learned_config lc;
    lc.actor = &actor;
    return simulate(p, s, lc);
}

TEST(fleet, the_same_seed_gives_the_same_run_for_every_structure) {
    for (const structure s : k_structures) {
        for (const wb::regime r : {wb::regime::stationary, wb::regime::bursty, wb::regime::drift}) {
            const fleet_metrics a = run(small(3, r), s);
            const fleet_metrics b = run(small(3, r), s);
            SCOPED_TRACE(std::string(to_string(s)) + " " + wb::to_string(r));
            EXPECT_GT(a.jobs, 100U);
            EXPECT_EQ(a.fingerprint, b.fingerprint);
            EXPECT_EQ(a.completed, b.completed);
            EXPECT_EQ(a.deadline_missed, b.deadline_missed);
            EXPECT_EQ(a.messages, b.messages);
            EXPECT_EQ(a.ledger_ops, b.ledger_ops);
            EXPECT_DOUBLE_EQ(a.utilization, b.utilization);
            EXPECT_DOUBLE_EQ(a.response_p95_s, b.response_p95_s);
        }
    }
}

TEST(fleet, another_seed_gives_another_run) {
    EXPECT_NE(run(small(3), structure::limited).fingerprint,
              run(small(4), structure::limited).fingerprint);
}

TEST(fleet, jobs_complete_and_figures_are_in_range) {
    for (const structure s : k_structures) {
        const fleet_metrics m = run(small(5), s);
        SCOPED_TRACE(to_string(s));
        EXPECT_GT(m.completed, m.jobs / 2);
        EXPECT_GE(m.miss_rate, 0.0);
        EXPECT_LE(m.miss_rate, 1.0);
        EXPECT_GT(m.utilization, 0.3);
        EXPECT_LE(m.utilization, 1.0);
        EXPECT_GT(m.jain, 0.0);
        EXPECT_LE(m.jain, 1.0 + 1e-12);
        EXPECT_LE(m.response_p50_s, m.response_p95_s);
        EXPECT_GT(m.decide_ns_p50, 0.0);
    }
}

TEST(fleet, messages_follow_each_structures_protocol) {
    fleet_params p = small(6);
    p.host_mtbf_h = 0;  // no timeouts or re-decisions: the protocol's own count
    p.stall_mtbf_h = 0;
    p.overrun_prob = 0;
    p.push_rate_per_h = 0;
    const fleet_metrics none = run(p, structure::no_comm);
    const fleet_metrics lim = run(p, structure::limited);
    const fleet_metrics cen = run(p, structure::central);
    // no-comm: a request and a reply per try, and at least one try.
    EXPECT_GE(none.messages_per_job, 2.0);
    // limited, d = 2: 2 holds + 2 replies + commit/release of each hold, plus gossip.
    EXPECT_GE(lim.messages_per_job, 4.0 * static_cast<double>(p.d) - 0.5);
    // central: reserve + reply + the completion report + calibration pushes.
    EXPECT_GE(cen.messages_per_job, 3.0);
    EXPECT_LT(none.messages_per_job, lim.messages_per_job);
}

TEST(fleet, the_hosts_policy_changes_the_placements) {
    fleet_params p = small(7);
    p.load = 1.1;
    p.policy = "fifo";
    const fleet_metrics f = run(p, structure::central);
    p.policy = "edf-backfill";
    const fleet_metrics e = run(p, structure::central);
    EXPECT_NE(f.fingerprint, e.fingerprint);
    // Backfill fills gaps fifo leaves: it serves at least as much.
    EXPECT_GE(e.utilization, f.utilization);
}

TEST(fleet, an_unknown_policy_is_refused_with_the_agents_own_message) {
    fleet_params p = small(1);
    p.policy = "round-robin";
    try {
        (void)run(p, structure::central);
        FAIL() << "an unknown policy was accepted";
    } catch (const std::runtime_error& e) {
        // The text of qrt::timeline::make_policy (agent/src/timeline/policy.cpp).
        EXPECT_NE(std::string(e.what()).find(
                      "policy \"round-robin\" is unknown (fifo, edf-backfill, priority-preempt, "
                      "fidelity-aware)"),
                  std::string::npos)
            << e.what();
    }
}

TEST(fleet, a_learned_run_without_a_model_is_refused) {
    EXPECT_THROW((void)simulate(small(1), structure::learned, learned_config{}), std::runtime_error);
}

TEST(fleet, without_admission_control_fewer_deadlines_are_met_under_overload) {
    // Long enough at 1.2x for a queue to build up past the deadlines' slack.
    fleet_params p = small(8);
    p.load = 1.2;
    p.hours = 1.5;
    const fleet_metrics with = run(p, structure::central);
    p.admission = false;
    const fleet_metrics without = run(p, structure::central);
    EXPECT_GT(with.compliance_admitted, without.compliance_admitted);
    EXPECT_LT(with.miss_rate, without.miss_rate);
    EXPECT_GT(with.rejected, 0U);     // refused at submit, with the reason, early
    EXPECT_EQ(without.rejected, 0U);  // everything queued; the misses come late
}

TEST(fleet, recorded_decisions_carry_features_and_rewards) {
    const mlp actor = earliest_start_actor();
    std::vector<decision_record> recs;
    learned_config lc;
    lc.actor = &actor;
    lc.explore = true;
    lc.explore_seed = 9;
    lc.record = &recs;
    const fleet_metrics m = simulate(small(9), structure::learned, lc);
    ASSERT_GT(recs.size(), 50U);
    for (const decision_record& r : recs) {
        ASSERT_GE(r.k, 2U);
        ASSERT_EQ(r.candidates.size(), r.k * k_actor_features);
        ASSERT_EQ(r.global.size(), k_critic_features);
        ASSERT_LT(r.chosen, r.k);
        // -(miss + 0.1 * min(resp/600, 3) + 0.002 * messages): within [-1.4, 0].
        EXPECT_LE(r.reward, 0.0F);
        EXPECT_GE(r.reward, -1.5F);
    }
    EXPECT_GT(m.jobs, 0U);
}

TEST(mlp, a_saved_model_loads_back_and_evaluates_the_same) {
    mlp m({k_actor_features, 5, 3, 1}, activation::tanh);
    float v = 0.1F;
    for (dense_layer& l : m.layers()) {
        for (float& w : l.w) {
            w = v;
            v = -v * 1.07F + 0.013F;
        }
        for (float& b : l.b) {
            b = v;
            v = -v * 0.93F;
        }
    }
    m.norm_mean()[3] = 0.5F;
    m.norm_std()[3] = 2.0F;
    auto back = mlp::parse(m.serialize());
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_EQ(back->serialize(), m.serialize());
    float x[k_actor_features];
    for (std::size_t i = 0; i < k_actor_features; ++i) {
        x[i] = static_cast<float>(i) * 0.25F - 1.0F;
    }
    EXPECT_EQ(back->eval1(x), m.eval1(x));
    // By hand for a 1-layer linear model: w . ((x - mean) / std) + b.
    mlp lin({2, 1}, activation::linear);
    lin.layers()[0].w = {2.0F, -1.0F};
    lin.layers()[0].b = {0.5F};
    lin.norm_mean() = {1.0F, 0.0F};
    lin.norm_std() = {2.0F, 1.0F};
    const float y[2] = {3.0F, 4.0F};
    EXPECT_FLOAT_EQ(lin.eval1(y), 2.0F * 1.0F - 4.0F + 0.5F);
}

TEST(mlp, a_broken_model_file_is_refused_with_the_reason) {
    struct bad_case {
        const char* text;
        const char* says;
    };
    const bad_case cases[] = {
        {"", "not a 'qrt-mlp 1' file"},
        {"qrt-mlp 2\n", "not a 'qrt-mlp 1' file"},
        {"qrt-mlp 1\ninputs 0\n", "'inputs <n>' missing or out of range"},
        {"qrt-mlp 1\ninputs 2\nlayers 1\nlayer 3 1 linear\n", "3 inputs, the previous layer gives 2"},
        {"qrt-mlp 1\ninputs 2\nlayers 1\nlayer 2 1 sigmoid\n", "activation \"sigmoid\""},
        {"qrt-mlp 1\ninputs 2\nlayers 1\nlayer 2 1 linear\n1 nan\n0\n", "a weight is missing or not finite"},
        {"qrt-mlp 1\ninputs 2\nlayers 1\nlayer 2 1 linear\n1 2\n0\nnorm 0 0 1 0\nend\n",
         "standard deviation"},
        {"qrt-mlp 1\ninputs 2\nlayers 1\nlayer 2 1 linear\n1 2\n0\nnorm 0 0 1 1\n", "'end' missing"},
    };
    for (const bad_case& c : cases) {
        auto m = mlp::parse(c.text);
        ASSERT_FALSE(m) << c.text;
        EXPECT_NE(m.err().message.find(c.says), std::string::npos)
            << "for:\n" << c.text << "\ngot: " << m.err().message;
    }
}

TEST(report, json_and_svg_carry_every_row) {
    report r;
    r.title = "t";
    r.seeds = {1};
    r.base = small(1);
    r.rows.push_back(run(small(1), structure::no_comm));
    r.rows.push_back(run(small(1), structure::limited));
    const auto j = to_json(r);
    EXPECT_EQ(j["runs"].size(), 2U);
    EXPECT_EQ(j["means"].size(), 2U);
    EXPECT_EQ(j["runs"][1]["structure"], "limited");
    const std::string svg = render_svg(mean_over_seeds(r.rows), "stationary", "miss_rate", "m");
    EXPECT_NE(svg.find("<svg"), std::string::npos);
    EXPECT_NE(svg.find(">limited</text>"), std::string::npos);
    EXPECT_NE(svg.find(">no-comm</text>"), std::string::npos);
    EXPECT_NE(render_table(r.rows).find("limited"), std::string::npos);
}

}  // namespace
