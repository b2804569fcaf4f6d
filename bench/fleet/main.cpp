// qrt-fleet-sim: the fleet simulator (see bench/fleet/README.md, which is
// also its manual: model, objective, reward, commands, results).
//
//   qrt-fleet-sim run --structure limited --regime drift --load 0.9
//   qrt-fleet-sim sweep --seeds 1,2 --out bench/fleet/results
//   qrt-fleet-sim scale --hosts-list 8,32,128,512,1024
//   qrt-fleet-sim claims --seeds 1,2
//
// Every subcommand prints a text table and ends with ONE JSON line.

#include <CLI/CLI.hpp>

#include <sys/utsname.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>
#include <string>
#include <vector>

#include "fleet.hpp"
#include "report.hpp"

namespace {

using namespace qrt::fleet;
namespace wb = qrt::timeline::bench;

std::string machine() {
    std::string model = "?";
    std::ifstream f("/proc/cpuinfo");
    for (std::string line; std::getline(f, line);) {
        if (line.rfind("model name", 0) == 0) {
            model = line.substr(line.find(':') + 2);
            break;
        }
    }
    struct utsname u {};
    uname(&u);
    return std::to_string(std::thread::hardware_concurrency()) + " CPUs, " + model + ", Linux " +
           u.release;
}

struct common {
    fleet_params p;
    std::string regime = "stationary";
    std::string model;
    std::string out;
};

void add_common(CLI::App* app, common& c) {
    fleet_params& p = c.p;
    app->add_option("--hosts", p.hosts, "hosts")->capture_default_str()->check(CLI::Range(1, 4096));
    app->add_option("--min-qpus", p.min_qpus, "QPUs per host, at least")->capture_default_str()->check(CLI::Range(1, 4));
    app->add_option("--max-qpus", p.max_qpus, "QPUs per host, at most")->capture_default_str()->check(CLI::Range(1, 4));
    app->add_option("--hours", p.hours, "arrival span in hours")->capture_default_str()->check(CLI::Range(0.05, 168.0));
    app->add_option("--warmup-h", p.warmup_h, "hours excluded from the figures")->capture_default_str()->check(CLI::Range(0.0, 24.0));
    app->add_option("--policy", p.policy, "every host's placement policy")->capture_default_str();
    app->add_option("--gang-fraction", p.gang_fraction, "share of gang jobs (2 QPUs)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
    app->add_option("--delay-ms", p.delay_ms, "one-way message delay")->capture_default_str()->check(CLI::Range(0.0, 10000.0));
    app->add_option("--gossip-s", p.gossip_s, "load gossip period T")->capture_default_str()->check(CLI::Range(0.1, 3600.0));
    app->add_option("--d", p.d, "agents asked per try (limited, learned)")->capture_default_str()->check(CLI::Range(1, 16));
    app->add_option("--host-mtbf-h", p.host_mtbf_h, "mean time between host failures (0: none)")->capture_default_str()->check(CLI::Range(0.0, 1e6));
    app->add_option("--stall-mtbf-h", p.stall_mtbf_h, "mean time between endpoint stalls per QPU (0: none)")->capture_default_str()->check(CLI::Range(0.0, 1e6));
    app->add_option("--overrun-prob", p.overrun_prob, "calibration overrun probability")->capture_default_str()->check(CLI::Range(0.0, 1.0));
    app->add_option("--model", c.model, "learned actor (qrt-mlp file from qrt-fleet-train)");
    app->add_option("--out", c.out, "directory for the JSON and SVG files");
}

std::vector<structure> structures_for(const std::optional<mlp>& actor) {
    std::vector<structure> s = {structure::central, structure::no_comm, structure::limited};
    if (actor) {
        s.push_back(structure::learned);
    }
    return s;
}

std::optional<mlp> load_model(const std::string& path) {
    if (path.empty()) {
        return std::nullopt;
    }
    auto m = mlp::load(path);
    if (!m) {
        throw std::runtime_error(m.err().message);
    }
    return std::move(*m);
}

bool regime_from(const std::string& s, wb::regime* r) {
    for (const wb::regime x : {wb::regime::stationary, wb::regime::bursty, wb::regime::drift}) {
        if (s == wb::to_string(x)) {
            *r = x;
            return true;
        }
    }
    return false;
}

fleet_metrics run_one(const fleet_params& p, structure s, const std::optional<mlp>& actor) {
    learned_config lc;
    if (actor) {
        lc.actor = &*actor;
    }
    const fleet_metrics m = simulate(p, s, lc);
    std::fprintf(stderr, "  %-8s %-10s hosts %4zu load %.2f seed %llu: %zu jobs, miss %.2f%%, %.1f s\n",
                 m.structure.c_str(), m.regime.c_str(), m.hosts, m.load,
                 static_cast<unsigned long long>(m.seed), m.jobs, 100.0 * m.miss_rate, m.wall_s);
    return m;
}

void write_file(const std::string& dir, const std::string& name, const std::string& text) {
    if (dir.empty()) {
        return;
    }
    std::ofstream f(dir + "/" + name, std::ios::trunc);
    f << text;
    if (!f) {
        throw std::runtime_error("cannot write " + dir + "/" + name);
    }
}

// The best rule-based structure's figure for one regime and load.
const fleet_metrics* best_rule(const std::vector<fleet_metrics>& means, const std::string& regime,
                               double load) {
    const fleet_metrics* best = nullptr;
    for (const fleet_metrics& m : means) {
        if (m.regime == regime && std::abs(m.load - load) < 1e-9 && m.structure != "learned" &&
            (best == nullptr || m.mean_cost < best->mean_cost)) {
            best = &m;
        }
    }
    return best;
}

int cmd_sweep(common& c, const std::vector<std::uint64_t>& seeds, const std::vector<double>& loads,
              const std::vector<std::string>& regimes) {
    const auto actor = load_model(c.model);
    report r;
    r.title = "structures x regimes x loads";
    r.machine = machine();
    r.base = c.p;
    r.seeds = seeds;
    for (const std::string& rg : regimes) {
        for (const double load : loads) {
            for (const structure s : structures_for(actor)) {
                for (const std::uint64_t seed : seeds) {
                    fleet_params p = c.p;
                    p.seed = seed;
                    p.load = load;
                    if (!regime_from(rg, &p.regime)) {
                        throw std::runtime_error("unknown regime " + rg);
                    }
                    r.rows.push_back(run_one(p, s, actor));
                }
            }
        }
    }
    const auto means = mean_over_seeds(r.rows);
    std::printf("qrt-fleet-sim sweep: %zu hosts (%zu..%zu QPUs), %.1f h, policy %s, seeds",
                c.p.hosts, c.p.min_qpus, c.p.max_qpus, c.p.hours, c.p.policy.c_str());
    for (const auto s : seeds) {
        std::printf(" %llu", static_cast<unsigned long long>(s));
    }
    std::printf("\nmachine: %s\n\n%s\n", r.machine.c_str(), render_table(means).c_str());
    // The learned structure against the best rule-based one, by the objective.
    if (actor) {
        nlohmann::json verdicts = nlohmann::json::array();
        std::printf("learned vs best rule-based structure (mean objective cost, lower is better):\n");
        for (const fleet_metrics& m : means) {
            if (m.structure != "learned") {
                continue;
            }
            const fleet_metrics* b = best_rule(means, m.regime, m.load);
            if (b == nullptr) {
                continue;
            }
            const double rel = b->mean_cost > 0 ? (m.mean_cost - b->mean_cost) / b->mean_cost : 0;
            // And against limited sharing, the structure with the same information.
            const fleet_metrics* lim = nullptr;
            for (const fleet_metrics& x : means) {
                if (x.structure == "limited" && x.regime == m.regime && std::abs(x.load - m.load) < 1e-9) {
                    lim = &x;
                }
            }
            const double rel_lim = lim != nullptr && lim->mean_cost > 0
                                       ? (m.mean_cost - lim->mean_cost) / lim->mean_cost
                                       : 0;
            std::printf("  %-10s load %.2f: learned %.4f, best %s %.4f (%+.1f%%), limited %.4f "
                        "(%+.1f%%)\n",
                        m.regime.c_str(), m.load, m.mean_cost, b->structure.c_str(), b->mean_cost,
                        100.0 * rel, lim != nullptr ? lim->mean_cost : 0.0, 100.0 * rel_lim);
            verdicts.push_back({{"regime", m.regime}, {"load", m.load},
                                {"learned_cost", m.mean_cost}, {"best_rule", b->structure},
                                {"best_rule_cost", b->mean_cost}, {"relative", rel},
                                {"limited_cost", lim != nullptr ? lim->mean_cost : 0.0},
                                {"relative_to_limited", rel_lim},
                                {"learned_miss_rate", m.miss_rate}, {"best_miss_rate", b->miss_rate}});
        }
        r.extra["learned_vs_best_rule"] = verdicts;
    }
    for (const std::string& rg : regimes) {
        write_file(c.out, "miss_" + rg + ".svg",
                   render_svg(means, rg, "miss_rate", "deadline-miss rate vs load (" + rg + ")"));
        write_file(c.out, "util_" + rg + ".svg",
                   render_svg(means, rg, "utilization", "QPU utilisation in windows vs load (" + rg + ")"));
    }
    const std::string json = to_json(r).dump();
    write_file(c.out, "sweep.json", json + "\n");
    std::printf("%s\n", json.c_str());
    return 0;
}

int cmd_scale(common& c, const std::vector<std::size_t>& hosts_list, std::uint64_t seed,
              double job_budget) {
    const auto actor = load_model(c.model);
    report r;
    r.title = "scaling with hosts";
    r.machine = machine();
    r.base = c.p;
    r.seeds = {seed};
    for (const std::size_t n : hosts_list) {
        fleet_params p = c.p;
        p.seed = seed;
        p.hosts = n;
        // About job_budget jobs per run whatever the size (arrival rate grows with N).
        const double jobs_per_h = static_cast<double>(n) * 2.5 * 0.9 * p.load / 70.0 * 3600.0;
        p.hours = std::clamp(job_budget / jobs_per_h, 0.1, c.p.hours);
        p.warmup_h = p.hours * 0.125;
        for (const structure s : structures_for(actor)) {
            r.rows.push_back(run_one(p, s, actor));
        }
    }
    std::printf("qrt-fleet-sim scale: load %.2f, regime %s, seed %llu\nmachine: %s\n\n%s\n",
                c.p.load, wb::to_string(c.p.regime), static_cast<unsigned long long>(seed),
                r.machine.c_str(), render_table(r.rows).c_str());
    // Ratio of decision latency at the largest size to the smallest, per structure.
    nlohmann::json growth = nlohmann::json::object();
    for (const structure s : structures_for(actor)) {
        const fleet_metrics* lo = nullptr;
        const fleet_metrics* hi = nullptr;
        for (const fleet_metrics& m : r.rows) {
            if (m.structure == to_string(s)) {
                lo = lo == nullptr || m.hosts < lo->hosts ? &m : lo;
                hi = hi == nullptr || m.hosts > hi->hosts ? &m : hi;
            }
        }
        if (lo != nullptr && hi != nullptr && lo->decide_ns_p50 > 0) {
            growth[to_string(s)] = {{"hosts", {lo->hosts, hi->hosts}},
                                    {"decide_ns_p50_ratio", hi->decide_ns_p50 / lo->decide_ns_p50},
                                    {"messages_per_job", {lo->messages_per_job, hi->messages_per_job}}};
            std::printf("%-8s decision p50 x%.1f from %zu to %zu hosts; messages/job %.1f -> %.1f\n",
                        to_string(s), hi->decide_ns_p50 / lo->decide_ns_p50, lo->hosts, hi->hosts,
                        lo->messages_per_job, hi->messages_per_job);
        }
    }
    r.extra["growth"] = growth;
    const std::string json = to_json(r).dump();
    write_file(c.out, "scale.json", json + "\n");
    std::printf("%s\n", json.c_str());
    return 0;
}

// The field's claims: backfill+gang vs FIFO throughput (single host and
// fleet), and what admission control does to deadline compliance.
int cmd_claims(common& c, const std::vector<std::uint64_t>& seeds, const std::vector<double>& loads) {
    report r;
    r.title = "claims";
    r.machine = machine();
    r.base = c.p;
    r.seeds = seeds;
    nlohmann::json throughput = nlohmann::json::array();
    std::printf("backfill + gang (edf-backfill) vs fifo: completed QPU-hours per hour\n");
    for (const bool single : {true, false}) {
        for (const double load : loads) {
            double t_fifo = 0;
            double t_edf = 0;
            double m_fifo = 0;
            double m_edf = 0;
            for (const std::uint64_t seed : seeds) {
                fleet_params p = c.p;
                p.seed = seed;
                p.load = load;
                p.gang_fraction = 0.2;
                if (single) {
                    p.hosts = 1;
                    p.min_qpus = p.max_qpus = 4;
                    p.hours = std::max(c.p.hours, 12.0);
                    p.warmup_h = 1.0;
                }
                p.policy = "fifo";
                const fleet_metrics f = run_one(p, structure::central, std::nullopt);
                p.policy = "edf-backfill";
                const fleet_metrics e = run_one(p, structure::central, std::nullopt);
                t_fifo += f.throughput_qpu_h_per_h;
                t_edf += e.throughput_qpu_h_per_h;
                m_fifo += f.miss_rate;
                m_edf += e.miss_rate;
                r.rows.push_back(f);
                r.rows.back().structure = "central/fifo";
                r.rows.push_back(e);
                r.rows.back().structure = "central/edf";
            }
            const auto n = static_cast<double>(seeds.size());
            const double ratio = t_fifo > 0 ? t_edf / t_fifo : 0;
            std::printf("  %-12s load %.2f: fifo %.3f, edf-backfill %.3f QPU-h/h: %+.1f%% "
                        "(misses %.1f%% vs %.1f%%)\n",
                        single ? "single host" : "fleet", load, t_fifo / n, t_edf / n,
                        100.0 * (ratio - 1.0), 100.0 * m_fifo / n, 100.0 * m_edf / n);
            throughput.push_back({{"scope", single ? "single_host" : "fleet"}, {"load", load},
                                  {"fifo", t_fifo / n}, {"edf_backfill", t_edf / n},
                                  {"gain", ratio - 1.0}, {"fifo_miss", m_fifo / n},
                                  {"edf_miss", m_edf / n}});
        }
    }
    r.extra["backfill_vs_fifo"] = throughput;
    nlohmann::json admission = nlohmann::json::array();
    std::printf("\nadmission control (the ledger refuses a slot that misses the deadline):\n"
                "deadline compliance of every deadline job, with and without\n");
    for (const double load : loads) {
        double on = 0;
        double off = 0;
        double on_adm = 0;
        double rej = 0;
        for (const std::uint64_t seed : seeds) {
            fleet_params p = c.p;
            p.seed = seed;
            p.load = load;
            p.admission = true;
            const fleet_metrics a = run_one(p, structure::central, std::nullopt);
            p.admission = false;
            const fleet_metrics b = run_one(p, structure::central, std::nullopt);
            on += 1.0 - a.miss_rate;
            on_adm += a.compliance_admitted;
            off += 1.0 - b.miss_rate;
            rej += a.with_deadline > 0 ? static_cast<double>(a.rejected) / static_cast<double>(a.jobs) : 0;
            r.rows.push_back(a);
            r.rows.back().structure = "central/admission";
            r.rows.push_back(b);
            r.rows.back().structure = "central/no-admission";
        }
        const auto n = static_cast<double>(seeds.size());
        std::printf("  load %.2f: without %.2f%%, with %.2f%% of all (%.2f%% of admitted; %.1f%% "
                    "refused at submit)\n",
                    load, 100.0 * off / n, 100.0 * on / n, 100.0 * on_adm / n, 100.0 * rej / n);
        admission.push_back({{"load", load}, {"compliance_without", off / n},
                             {"compliance_with", on / n}, {"compliance_admitted", on_adm / n},
                             {"refused", rej / n}});
    }
    r.extra["admission"] = admission;
    const std::string json = to_json(r).dump();
    write_file(c.out, "claims.json", json + "\n");
    std::printf("%s\n", json.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"qrt-fleet-sim: N hosts running qrtd's own ledger and placement policy in "
                 "virtual time; compares central, no-communication, limited-sharing and learned "
                 "(CTDE) placement.  Manual: bench/fleet/README.md"};
    app.footer("Examples:\n"
               "  qrt-fleet-sim run --structure limited --regime drift --load 0.9\n"
               "  qrt-fleet-sim sweep --seeds 1,2 --model bench/fleet/model/actor.mlp --out DIR\n"
               "  qrt-fleet-sim scale --hosts-list 8,32,128,512,1024\n"
               "  qrt-fleet-sim claims --seeds 1,2\n");
    app.require_subcommand(1);
    common c;
    std::string structure_name = "limited";
    bool json_only = false;
    auto* run = app.add_subcommand("run", "one simulation");
    add_common(run, c);
    run->add_option("--structure", structure_name, "central | no-comm | limited | learned")->capture_default_str();
    run->add_option("--regime", c.regime, "stationary | bursty | drift")->capture_default_str();
    run->add_option("--load", c.p.load, "offered load")->capture_default_str()->check(CLI::Range(0.05, 5.0));
    run->add_option("--seed", c.p.seed, "seed")->capture_default_str();
    run->add_flag("--no-admission", [&](std::int64_t) { c.p.admission = false; }, "do not tell hosts the deadlines");
    run->add_flag("--json", json_only, "print only the JSON line");

    std::vector<std::uint64_t> seeds = {1, 2};
    std::vector<double> loads = {0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2};
    std::vector<std::string> regimes = {"stationary", "bursty", "drift"};
    auto* sweep = app.add_subcommand("sweep", "every structure x regime x load x seed");
    add_common(sweep, c);
    sweep->add_option("--seeds", seeds, "seeds")->delimiter(',')->capture_default_str();
    sweep->add_option("--loads", loads, "loads")->delimiter(',')->capture_default_str();
    sweep->add_option("--regimes", regimes, "regimes")->delimiter(',')->capture_default_str();

    std::vector<std::size_t> hosts_list = {8, 32, 128, 512, 1024};
    std::uint64_t scale_seed = 1;
    double job_budget = 20000;
    auto* scale = app.add_subcommand("scale", "decision latency and messages per job vs hosts");
    add_common(scale, c);
    scale->add_option("--hosts-list", hosts_list, "fleet sizes")->delimiter(',')->capture_default_str();
    scale->add_option("--seed", scale_seed, "seed")->capture_default_str();
    scale->add_option("--load", c.p.load, "offered load")->capture_default_str();
    scale->add_option("--jobs", job_budget, "about this many jobs per run")->capture_default_str();

    std::vector<std::uint64_t> claim_seeds = {1, 2};
    std::vector<double> claim_loads = {0.8, 0.9, 1.0, 1.1, 1.2};
    auto* claims = app.add_subcommand("claims", "backfill+gang vs fifo; admission control");
    add_common(claims, c);
    claims->add_option("--seeds", claim_seeds, "seeds")->delimiter(',')->capture_default_str();
    claims->add_option("--loads", claim_loads, "loads")->delimiter(',')->capture_default_str();

    CLI11_PARSE(app, argc, argv);
    try {
        if (c.p.min_qpus > c.p.max_qpus) {
            throw std::runtime_error("--min-qpus is larger than --max-qpus");
        }
        if (*run) {
            structure s{};
            if (!structure_from_string(structure_name, &s)) {
                throw std::runtime_error("--structure " + structure_name +
                                         ": not central, no-comm, limited or learned");
            }
            if (!regime_from(c.regime, &c.p.regime)) {
                throw std::runtime_error("--regime " + c.regime + ": not stationary, bursty or drift");
            }
            const auto actor = load_model(c.model);
            const fleet_metrics m = run_one(c.p, s, actor);
            if (!json_only) {
                std::printf("%s", render_table({m}).c_str());
            }
            std::printf("%s\n", to_json(m).dump().c_str());
            return 0;
        }
        if (*sweep) {
            return cmd_sweep(c, seeds, loads, regimes);
        }
        if (*scale) {
            if (!regime_from(c.regime, &c.p.regime)) {
                throw std::runtime_error("unknown regime " + c.regime);
            }
            return cmd_scale(c, hosts_list, scale_seed, job_budget);
        }
        if (*claims) {
            return cmd_claims(c, claim_seeds, claim_loads);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "qrt-fleet-sim: %s\n", e.what());
        return 1;
    }
    return 0;
}
