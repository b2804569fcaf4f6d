// qrt-fleet-train: trains the learned (CTDE) structure of qrt-fleet-sim with
// LibTorch and exports the actor as a qrt-mlp file that plain C++ evaluates
// (bench/fleet/mlp.hpp): no LibTorch is needed to use the model.
//
//   qrt-fleet-train --seed 1 --out bench/fleet/model/actor.mlp   # the committed model
//   qrt-fleet-train --smoke                                      # the CI smoke test
//
// Centralised training, decentralised execution: the actor scores each
// candidate from what the deciding host sees (its held slots and the load
// gossip of limited sharing); the critic sees the global state (every
// host's true load, hosts down, the job) and only serves as the baseline
// of the policy gradient.  The reward is minus the operating objective's
// cost of the placed job (README "Operating objective").
//
// Training episodes use seeds 100000 + iteration; qrt-fleet-sim's
// comparisons use seeds 1, 2, ...: the model never sees an evaluation seed.

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "fleet.hpp"

namespace {

using namespace qrt::fleet;
namespace wb = qrt::timeline::bench;

constexpr std::int64_t k_hidden = 32;

struct actor_net : torch::nn::Module {
    torch::nn::Linear l1{nullptr};
    torch::nn::Linear l2{nullptr};
    torch::nn::Linear l3{nullptr};
    actor_net() {
        l1 = register_module("l1", torch::nn::Linear(static_cast<std::int64_t>(k_actor_features), k_hidden));
        l2 = register_module("l2", torch::nn::Linear(k_hidden, k_hidden));
        l3 = register_module("l3", torch::nn::Linear(k_hidden, 1));
    }
    torch::Tensor forward(torch::Tensor x) {
        return l3->forward(torch::tanh(l2->forward(torch::tanh(l1->forward(x)))));
    }
};

struct critic_net : torch::nn::Module {
    torch::nn::Linear l1{nullptr};
    torch::nn::Linear l2{nullptr};
    torch::nn::Linear l3{nullptr};
    critic_net() {
        l1 = register_module("l1", torch::nn::Linear(static_cast<std::int64_t>(k_critic_features), 64));
        l2 = register_module("l2", torch::nn::Linear(64, 64));
        l3 = register_module("l3", torch::nn::Linear(64, 1));
    }
    torch::Tensor forward(torch::Tensor x) {
        return l3->forward(torch::relu(l2->forward(torch::relu(l1->forward(x))))).squeeze(-1);
    }
};

// The torch actor -> the plain C++ model (with the input standardisation).
mlp export_actor(actor_net& a, const std::vector<float>& mean, const std::vector<float>& stdev) {
    mlp m({k_actor_features, static_cast<std::size_t>(k_hidden), static_cast<std::size_t>(k_hidden), 1},
          activation::tanh);
    torch::NoGradGuard ng;
    const torch::nn::Linear* ls[] = {&a.l1, &a.l2, &a.l3};
    for (std::size_t i = 0; i < 3; ++i) {
        const torch::Tensor w = (*ls[i])->weight.contiguous().to(torch::kFloat);
        const torch::Tensor b = (*ls[i])->bias.contiguous().to(torch::kFloat);
        dense_layer& l = m.layers()[i];
        std::copy(w.data_ptr<float>(), w.data_ptr<float>() + w.numel(), l.w.begin());
        std::copy(b.data_ptr<float>(), b.data_ptr<float>() + b.numel(), l.b.begin());
    }
    m.norm_mean() = mean;
    m.norm_std() = stdev;
    return m;
}

struct batch {
    torch::Tensor cand;    // B x D x F (standardised)
    torch::Tensor mask;    // B x D (true where a candidate exists)
    torch::Tensor chosen;  // B
    torch::Tensor global;  // B x G
    torch::Tensor reward;  // B
};

batch to_batch(const std::vector<decision_record>& recs, std::size_t d, const std::vector<float>& mean,
               const std::vector<float>& stdev) {
    const auto n = static_cast<std::int64_t>(recs.size());
    const auto D = static_cast<std::int64_t>(d);
    const auto F = static_cast<std::int64_t>(k_actor_features);
    batch b;
    b.cand = torch::zeros({n, D, F});
    b.mask = torch::zeros({n, D}, torch::kBool);
    b.chosen = torch::zeros({n}, torch::kLong);
    b.global = torch::zeros({n, static_cast<std::int64_t>(k_critic_features)});
    b.reward = torch::zeros({n});
    auto cand = b.cand.accessor<float, 3>();
    auto mask = b.mask.accessor<bool, 2>();
    auto chosen = b.chosen.accessor<std::int64_t, 1>();
    auto global = b.global.accessor<float, 2>();
    auto reward = b.reward.accessor<float, 1>();
    for (std::int64_t i = 0; i < n; ++i) {
        const decision_record& r = recs[static_cast<std::size_t>(i)];
        for (std::size_t k = 0; k < r.k && k < d; ++k) {
            for (std::size_t f = 0; f < k_actor_features; ++f) {
                cand[i][static_cast<std::int64_t>(k)][static_cast<std::int64_t>(f)] =
                    (r.candidates[k * k_actor_features + f] - mean[f]) / stdev[f];
            }
            mask[i][static_cast<std::int64_t>(k)] = true;
        }
        chosen[i] = static_cast<std::int64_t>(r.chosen);
        for (std::size_t g = 0; g < k_critic_features; ++g) {
            global[i][static_cast<std::int64_t>(g)] = r.global[g];
        }
        reward[i] = r.reward;
    }
    return b;
}

struct losses {
    double actor = 0;
    double critic = 0;
    double entropy = 0;
};

// One gradient step of actor and critic on a batch.
losses step(actor_net& actor, critic_net& critic, torch::optim::Adam& opt_a,
            torch::optim::Adam& opt_c, const batch& b, double entropy_coef) {
    const torch::Tensor logits =
        actor.forward(b.cand).squeeze(-1).masked_fill(b.mask.logical_not(), -1e9);
    const torch::Tensor logp = torch::log_softmax(logits, 1);
    const torch::Tensor p = logp.exp();
    const torch::Tensor ent = -(p * logp.masked_fill(b.mask.logical_not(), 0.0)).sum(1).mean();
    const torch::Tensor chosen_logp = logp.gather(1, b.chosen.unsqueeze(1)).squeeze(1);
    const torch::Tensor v = critic.forward(b.global);
    torch::Tensor adv = (b.reward - v.detach());
    adv = (adv - adv.mean()) / (adv.std() + 1e-6);
    const torch::Tensor actor_loss = -(adv * chosen_logp).mean() - entropy_coef * ent;
    const torch::Tensor critic_loss = torch::mse_loss(v, b.reward);
    opt_a.zero_grad();
    actor_loss.backward();
    opt_a.step();
    opt_c.zero_grad();
    critic_loss.backward();
    opt_c.step();
    return {actor_loss.item<double>(), critic_loss.item<double>(), ent.item<double>()};
}

void feature_stats(const std::vector<decision_record>& recs, std::vector<float>& mean,
                   std::vector<float>& stdev) {
    std::vector<double> s(k_actor_features, 0.0);
    std::vector<double> sq(k_actor_features, 0.0);
    double n = 0;
    for (const decision_record& r : recs) {
        for (std::size_t k = 0; k < r.k; ++k) {
            for (std::size_t f = 0; f < k_actor_features; ++f) {
                const double x = r.candidates[k * k_actor_features + f];
                s[f] += x;
                sq[f] += x * x;
            }
            n += 1;
        }
    }
    mean.assign(k_actor_features, 0.0F);
    stdev.assign(k_actor_features, 1.0F);
    for (std::size_t f = 0; f < k_actor_features && n > 0; ++f) {
        const double m = s[f] / n;
        const double var = sq[f] / n - m * m;
        mean[f] = static_cast<float>(m);
        stdev[f] = static_cast<float>(var > 1e-8 ? std::sqrt(var) : 1.0);
    }
}

fleet_params episode(std::uint64_t seed, std::size_t it, std::mt19937_64& rng, std::size_t hosts,
                     double hours) {
    fleet_params p;
    p.seed = seed;
    p.hosts = hosts;
    p.hours = hours;
    p.warmup_h = 0.0;
    const wb::regime regimes[] = {wb::regime::stationary, wb::regime::bursty, wb::regime::drift};
    p.regime = regimes[it % 3];
    p.load = std::uniform_real_distribution<double>(0.5, 1.2)(rng);
    return p;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Train qrt-fleet-sim's learned (CTDE) placement with LibTorch and export the "
                 "actor as a qrt-mlp file"};
    app.footer("Examples:\n"
               "  qrt-fleet-train --seed 1 --out bench/fleet/model/actor.mlp\n"
               "  qrt-fleet-train --smoke     # a few hundred steps on one batch; exit 1 unless the loss falls\n");
    std::uint64_t seed = 1;
    std::size_t iterations = 150;
    std::size_t hosts = 32;
    double hours = 1.0;
    std::size_t epochs = 4;
    double lr = 3e-3;
    double entropy_coef = 0.01;
    std::string out = "actor.mlp";
    bool smoke = false;
    std::size_t smoke_steps = 300;
    app.add_option("--seed", seed, "training seed (network init, episode draws)")->capture_default_str();
    app.add_option("--iterations", iterations, "episodes")->capture_default_str()->check(CLI::Range(1, 100000));
    app.add_option("--hosts", hosts, "hosts per episode")->capture_default_str()->check(CLI::Range(2, 1024));
    app.add_option("--hours", hours, "arrival span per episode")->capture_default_str()->check(CLI::Range(0.05, 24.0));
    app.add_option("--epochs", epochs, "gradient steps per episode")->capture_default_str()->check(CLI::Range(1, 100));
    app.add_option("--lr", lr, "Adam learning rate")->capture_default_str();
    app.add_option("--entropy", entropy_coef, "entropy bonus")->capture_default_str();
    app.add_option("--out", out, "model file to write")->capture_default_str();
    app.add_flag("--smoke", smoke, "smoke test: one small batch, --smoke-steps steps, loss must fall");
    app.add_option("--smoke-steps", smoke_steps, "steps of the smoke test")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    torch::manual_seed(seed);
    torch::set_num_threads(1);  // deterministic, and the machine has 2 cores
    std::mt19937_64 rng(seed);
    actor_net actor;
    critic_net critic;
    torch::optim::Adam opt_a(actor.parameters(), torch::optim::AdamOptions(lr));
    torch::optim::Adam opt_c(critic.parameters(), torch::optim::AdamOptions(lr * 3));
    std::vector<float> mean(k_actor_features, 0.0F);
    std::vector<float> stdev(k_actor_features, 1.0F);
    const std::size_t d = fleet_params{}.d;
    const auto t0 = std::chrono::steady_clock::now();

    auto collect = [&](const fleet_params& p, std::uint64_t explore_seed) {
        std::vector<decision_record> recs;
        const mlp m = export_actor(actor, mean, stdev);
        learned_config lc;
        lc.actor = &m;
        lc.explore = true;
        lc.explore_seed = explore_seed;
        lc.record = &recs;
        const fleet_metrics fm = simulate(p, structure::learned, lc);
        return std::make_pair(std::move(recs), fm);
    };

    if (smoke) {
        fleet_params p = episode(100000, 0, rng, 8, 0.5);
        p.load = 1.0;
        auto [recs, fm] = collect(p, 1);
        if (recs.size() < 50) {
            std::fprintf(stderr, "smoke: only %zu decisions recorded\n", recs.size());
            return 1;
        }
        feature_stats(recs, mean, stdev);
        const batch b = to_batch(recs, d, mean, stdev);
        double first = 0;
        double last = 0;
        for (std::size_t i = 0; i < smoke_steps; ++i) {
            const losses l = step(actor, critic, opt_a, opt_c, b, entropy_coef);
            if (i == 0) {
                first = l.critic;
            }
            last = l.critic;
        }
        const bool ok = last < 0.5 * first;
        std::printf("smoke: %zu decisions, %zu steps, critic loss %.5f -> %.5f: %s\n", recs.size(),
                    smoke_steps, first, last, ok ? "falls" : "DOES NOT FALL");
        std::printf("{\"bench\":\"fleet_train_smoke\",\"decisions\":%zu,\"steps\":%zu,"
                    "\"critic_loss_first\":%.6f,\"critic_loss_last\":%.6f,\"pass\":%s}\n",
                    recs.size(), smoke_steps, first, last, ok ? "true" : "false");
        return ok ? 0 : 1;
    }

    std::printf("qrt-fleet-train: seed %llu, %zu episodes of %zu hosts x %.2f h, %zu epochs, lr %g\n",
                static_cast<unsigned long long>(seed), iterations, hosts, hours, epochs, lr);
    double ema_cost = 0;
    for (std::size_t it = 0; it < iterations; ++it) {
        const fleet_params p = episode(100000 + it, it, rng, hosts, hours);
        auto [recs, fm] = collect(p, seed * 7919 + it);
        if (recs.empty()) {
            continue;
        }
        if (it == 0) {
            feature_stats(recs, mean, stdev);  // fixed from here on
        }
        const batch b = to_batch(recs, d, mean, stdev);
        losses l;
        for (std::size_t e = 0; e < epochs; ++e) {
            l = step(actor, critic, opt_a, opt_c, b, entropy_coef);
        }
        ema_cost = it == 0 ? fm.mean_cost : 0.9 * ema_cost + 0.1 * fm.mean_cost;
        if (it % 10 == 0 || it + 1 == iterations) {
            const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::printf("  it %4zu %-10s load %.2f: %5zu decisions, cost %.4f (ema %.4f), miss %.3f, "
                        "critic %.4f, entropy %.3f, %.0f s\n",
                        it, wb::to_string(p.regime), p.load, recs.size(), fm.mean_cost, ema_cost,
                        fm.miss_rate, l.critic, l.entropy, el);
            std::fflush(stdout);
        }
    }
    const mlp m = export_actor(actor, mean, stdev);
    std::string text = m.serialize();
    char head[512];
    std::snprintf(head, sizeof head,
                  "# qrt-fleet-sim learned actor, written by: qrt-fleet-train --seed %llu "
                  "--iterations %zu --hosts %zu --hours %g --epochs %zu --lr %g --entropy %g\n",
                  static_cast<unsigned long long>(seed), iterations, hosts, hours, epochs, lr,
                  entropy_coef);
    std::FILE* f = std::fopen(out.c_str(), "w");
    if (f == nullptr || std::fputs(head, f) < 0 || std::fputs(text.c_str(), f) < 0 ||
        std::fclose(f) != 0) {
        std::fprintf(stderr, "qrt-fleet-train: cannot write %s\n", out.c_str());
        return 1;
    }
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("wrote %s (%zu bytes) in %.0f s\n", out.c_str(), text.size() + std::strlen(head), el);
    std::printf("{\"bench\":\"fleet_train\",\"seed\":%llu,\"iterations\":%zu,\"wall_s\":%.1f,"
                "\"final_cost_ema\":%.5f}\n",
                static_cast<unsigned long long>(seed), iterations, el, ema_cost);
    return 0;
}
