// qrt-policy-compare: run every placement policy on the same deterministic
// synthetic workload and print, per policy, utilization inside calibration
// windows, deadline-miss rate, p50/p95 wait, Jain fairness across tenants,
// preemptions and decision latency; then the edf-backfill / fifo ratios and
// ONE JSON line with every figure.
//
//   qrt-policy-compare                     # defaults: seed 1, 12 h, load 1.1
//   qrt-policy-compare --seed 7 --load 0.9 --hours 24
//
// The simulation: every --batch-s seconds the arrivals since the last epoch
// are ordered by the policy (fifo: arrival, edf: deadline, priority: priority)
// and submitted one-shot (place + commit) at that epoch's time; committed
// jobs whose start has come are dispatched and completed.  Jobs that find no
// slot before their deadline are rejected (a deadline miss); reservations
// displaced by preemption and not re-placed are misses too.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "qrt/timeline/ledger.hpp"
#include "workload.hpp"

namespace {

using namespace qrt::timeline;
using namespace qrt::timeline::bench;

constexpr std::int64_t s_ns = 1'000'000'000;

struct outcome {
    std::string policy;
    double utilization = 0;       // busy time / window time, inside [measure_from, end)
    double miss_rate = 0;         // jobs with a deadline that did not complete by it
    std::size_t rejected = 0;     // no slot at all
    std::size_t displaced = 0;
    std::size_t completed = 0;
    double wait_p50_s = 0;
    double wait_p95_s = 0;
    double jain = 0;
    std::size_t preemptions = 0;
    double decide_p50_us = 0;
    double decide_p99_us = 0;
    double mean_fidelity = 0;
    std::size_t fidelity_violations = 0;
};

double quantile(std::vector<double> v, double q) {
    if (v.empty()) {
        return 0.0;
    }
    std::sort(v.begin(), v.end());
    const auto idx = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(idx, v.size() - 1)];
}

std::int64_t overlap(std::int64_t a0, std::int64_t a1, std::int64_t b0, std::int64_t b1) {
    return std::max<std::int64_t>(0, std::min(a1, b1) - std::max(a0, b0));
}

outcome run(const workload& w, const std::string& policy, std::int64_t batch_ns,
            std::int64_t measure_from_ns) {
    const workload_params& p = w.params;
    ledger_options o;
    o.policy = policy;
    o.horizon_ns = 48 * 3600 * s_ns;
    auto opened = ledger::open(w.qpus, o, "", w.t0_ns);
    if (!opened) {
        std::fprintf(stderr, "ledger::open: %s\n", opened.err().message.c_str());
        std::exit(1);
    }
    ledger& l = **opened;
    std::vector<pending_request> batch;
    std::unordered_map<std::uint64_t, std::size_t> job_of;  // reservation id -> job index
    std::vector<std::int64_t> start_of(w.jobs.size(), -1);  // at dispatch
    std::vector<bool> missed(w.jobs.size(), false);
    std::vector<double> decide_us;
    decide_us.reserve(w.jobs.size());
    std::size_t next = 0;
    std::size_t open_jobs = 0;
    outcome out;
    out.policy = policy;
    for (std::int64_t now = w.t0_ns;; now += batch_ns) {
        // Dispatch what is due (the simulated dispatcher is always on time).
        for (const qpu_spec& q : w.qpus) {
            for (const reservation& r : l.due_jobs(q.name, now + 1)) {
                (void)l.mark_dispatched(r.id, r.start_ns);
                (void)l.complete(r.id, {}, r.end_ns());
                start_of[job_of.at(r.id)] = r.start_ns;
                --open_jobs;
            }
        }
        batch.clear();
        while (next < w.jobs.size() && w.jobs[next].arrival_ns <= now) {
            batch.push_back(pending_request{w.jobs[next].req, w.jobs[next].arrival_ns,
                                            w.jobs[next].seq});
            ++next;
        }
        const placement_policy& pol = l.policy();
        std::stable_sort(batch.begin(), batch.end(),
                         [&](const pending_request& a, const pending_request& b) {
                             return pol.before(a, b);
                         });
        for (const pending_request& pr : batch) {
            const job& j = w.jobs[pr.seq];
            const auto t_a = std::chrono::steady_clock::now();
            auto r = l.submit(j.tenant, j.req, "", {}, now);
            const auto t_b = std::chrono::steady_clock::now();
            decide_us.push_back(std::chrono::duration<double, std::micro>(t_b - t_a).count());
            if (r) {
                job_of.emplace(r->id, pr.seq);
                ++open_jobs;
            } else {
                ++out.rejected;
                missed[pr.seq] = true;
            }
        }
        for (const event& e : l.drain_events()) {
            if (e.type == event_type::displaced) {
                missed[job_of.at(e.reservation_id)] = true;
                ++out.displaced;
                --open_jobs;
            }
        }
        (void)l.mark_missed(now, 0);
        if (next == w.jobs.size() && open_jobs == 0) {
            break;
        }
    }
    // Figures.
    std::int64_t window_ns = 0;
    for (std::int64_t c = w.t0_ns; c < w.end_ns; c += p.period_s * s_ns) {
        window_ns += overlap(c + p.blackout_s * s_ns, c + p.period_s * s_ns, measure_from_ns,
                             w.end_ns);
    }
    window_ns *= static_cast<std::int64_t>(p.qpus);
    std::int64_t busy_ns = 0;
    std::vector<double> waits;
    std::map<std::string, std::pair<double, double>> tenant;  // served, requested
    std::size_t with_deadline = 0;
    std::size_t deadline_missed = 0;
    double fid_sum = 0;
    for (std::size_t i = 0; i < w.jobs.size(); ++i) {
        const job& j = w.jobs[i];
        tenant[j.tenant].second += static_cast<double>(j.req.duration_ns);
        const bool has_deadline = j.req.deadline_ns > 0;
        with_deadline += has_deadline ? 1 : 0;
        if (start_of[i] < 0) {
            deadline_missed += has_deadline ? 1 : 0;
            continue;
        }
        const std::int64_t s = start_of[i];
        const std::int64_t e = s + j.req.duration_ns;
        if (has_deadline && e > j.req.deadline_ns) {
            ++deadline_missed;  // never happens: the ledger refuses such slots
        }
        ++out.completed;
        busy_ns += overlap(s, e, measure_from_ns, w.end_ns);
        waits.push_back(static_cast<double>(s - std::max(j.arrival_ns, j.req.not_before_ns)) / 1e9);
        tenant[j.tenant].first += static_cast<double>(j.req.duration_ns);
        const std::int64_t age = (s - w.t0_ns) % (p.period_s * s_ns) - p.blackout_s * s_ns;
        const double f = p.f0 * std::exp(-static_cast<double>(age) /
                                         static_cast<double>(p.tau_s * s_ns));
        fid_sum += f;
        if (j.req.min_fidelity > 0 && f + 1e-9 < j.req.min_fidelity) {
            ++out.fidelity_violations;
        }
    }
    out.utilization = window_ns > 0 ? static_cast<double>(busy_ns) / static_cast<double>(window_ns) : 0;
    out.miss_rate = with_deadline > 0 ? static_cast<double>(deadline_missed) /
                                            static_cast<double>(with_deadline)
                                      : 0;
    out.wait_p50_s = quantile(waits, 0.50);
    out.wait_p95_s = quantile(waits, 0.95);
    double sum = 0;
    double sum_sq = 0;
    for (const auto& [name, sr] : tenant) {
        const double x = sr.second > 0 ? sr.first / sr.second : 0;
        sum += x;
        sum_sq += x * x;
    }
    out.jain = sum_sq > 0 ? sum * sum / (static_cast<double>(tenant.size()) * sum_sq) : 0;
    out.preemptions = l.stats().preemptions;
    out.decide_p50_us = quantile(decide_us, 0.50);
    out.decide_p99_us = quantile(decide_us, 0.99);
    out.mean_fidelity = out.completed > 0 ? fid_sum / static_cast<double>(out.completed) : 0;
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Run every QPU placement policy on one synthetic workload and compare them"};
    workload_params p;
    double batch_s = 10.0;
    double warmup_h = 1.0;
    app.add_option("--seed", p.seed, "workload seed")->capture_default_str();
    app.add_option("--hours", p.hours, "arrival span in hours")->capture_default_str()->check(CLI::Range(1.0, 168.0));
    app.add_option("--load", p.offered_load, "offered load: requested time / window time")
        ->capture_default_str()->check(CLI::Range(0.05, 5.0));
    app.add_option("--qpus", p.qpus, "QPUs")->capture_default_str()->check(CLI::Range(1, 64));
    app.add_option("--tenants", p.tenants, "tenants (skewed 1/k weights)")->capture_default_str()->check(CLI::Range(1, 100));
    app.add_option("--period-s", p.period_s, "calibration period")->capture_default_str()->check(CLI::Range(60, 86400));
    app.add_option("--blackout-s", p.blackout_s, "calibration blackout per period")->capture_default_str()->check(CLI::Range(0, 3600));
    app.add_option("--batch-s", batch_s, "decision epoch")->capture_default_str()->check(CLI::Range(0.1, 600.0));
    app.add_option("--warmup-h", warmup_h, "hours excluded from utilization")->capture_default_str()->check(CLI::Range(0.0, 24.0));
    CLI11_PARSE(app, argc, argv);
    if (p.blackout_s >= p.period_s) {
        std::fprintf(stderr, "--blackout-s %lld must be shorter than --period-s %lld\n",
                     static_cast<long long>(p.blackout_s), static_cast<long long>(p.period_s));
        return 2;
    }
    const workload w = generate(p);
    const auto batch_ns = static_cast<std::int64_t>(batch_s * 1e9);
    const std::int64_t measure_from = w.t0_ns + static_cast<std::int64_t>(warmup_h * 3600.0 * 1e9);
    std::printf("workload: seed %llu, %.1f h, %zu QPUs, period %lld s (blackout %lld s), load %.2f, "
                "%zu jobs, %zu tenants, epoch %.1f s\n\n",
                static_cast<unsigned long long>(p.seed), p.hours, p.qpus,
                static_cast<long long>(p.period_s), static_cast<long long>(p.blackout_s),
                p.offered_load, w.jobs.size(), p.tenants, batch_s);
    std::printf("%-17s %6s %6s %5s %5s %8s %8s %5s %7s %8s %8s %6s\n", "policy", "util", "miss%",
                "rej", "disp", "p50wait", "p95wait", "jain", "preempt", "dec_p50", "dec_p99",
                "fid");
    std::vector<outcome> all;
    for (const std::string_view name : policy_names()) {
        all.push_back(run(w, std::string(name), batch_ns, measure_from));
        const outcome& o = all.back();
        std::printf("%-17s %6.3f %6.2f %5zu %5zu %7.0fs %7.0fs %5.3f %7zu %6.1fus %6.1fus %6.4f\n",
                    o.policy.c_str(), o.utilization, 100.0 * o.miss_rate, o.rejected, o.displaced,
                    o.wait_p50_s, o.wait_p95_s, o.jain, o.preemptions, o.decide_p50_us,
                    o.decide_p99_us, o.mean_fidelity);
        if (o.fidelity_violations != 0) {
            std::printf("  !! %zu jobs started below their min_fidelity\n", o.fidelity_violations);
        }
    }
    const outcome& fifo = all[0];
    const outcome& edf = all[1];
    const double util_ratio = fifo.utilization > 0 ? edf.utilization / fifo.utilization : 0;
    const bool util_ok = util_ratio >= 1.15;
    const bool miss_ok = edf.miss_rate < fifo.miss_rate;
    std::printf("\nedf-backfill / fifo utilization: %.3fx (goal >= 1.15x) %s\n", util_ratio,
                util_ok ? "PASS" : "FAIL");
    std::printf("deadline misses: edf-backfill %.2f%% vs fifo %.2f%% (goal: fewer) %s\n",
                100.0 * edf.miss_rate, 100.0 * fifo.miss_rate, miss_ok ? "PASS" : "FAIL");
    std::string json = "{\"bench\":\"timeline_policy_compare\",\"seed\":" + std::to_string(p.seed) +
                       ",\"hours\":" + std::to_string(p.hours) + ",\"load\":" +
                       std::to_string(p.offered_load) + ",\"jobs\":" + std::to_string(w.jobs.size()) +
                       ",\"policies\":{";
    for (std::size_t i = 0; i < all.size(); ++i) {
        const outcome& o = all[i];
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "%s\"%s\":{\"utilization\":%.4f,\"miss_rate\":%.4f,\"rejected\":%zu,"
                      "\"displaced\":%zu,\"wait_p50_s\":%.1f,\"wait_p95_s\":%.1f,\"jain\":%.4f,"
                      "\"preemptions\":%zu,\"decide_p50_us\":%.2f,\"decide_p99_us\":%.2f,"
                      "\"mean_fidelity\":%.5f}",
                      i == 0 ? "" : ",", o.policy.c_str(), o.utilization, o.miss_rate, o.rejected,
                      o.displaced, o.wait_p50_s, o.wait_p95_s, o.jain, o.preemptions,
                      o.decide_p50_us, o.decide_p99_us, o.mean_fidelity);
        json += buf;
    }
    char tail[256];
    std::snprintf(tail, sizeof tail,
                  "},\"edf_over_fifo_utilization\":%.4f,\"goal\":1.15,\"edf_fewer_misses\":%s,"
                  "\"pass\":%s}",
                  util_ratio, miss_ok ? "true" : "false", (util_ok && miss_ok) ? "true" : "false");
    json += tail;
    std::printf("%s\n", json.c_str());
    return 0;
}
