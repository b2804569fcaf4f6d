#include "workload.hpp"

#include <cmath>
#include <random>

namespace qrt::timeline::bench {

namespace {
constexpr std::int64_t s_ns = 1'000'000'000;
}

workload generate(const workload_params& p) {
    workload w;
    w.params = p;
    w.t0_ns = 1'800'000'000LL * s_ns;  // 2027-01-15, aligned to the cycle
    w.t0_ns -= w.t0_ns % (p.period_s * s_ns);
    w.end_ns = w.t0_ns + static_cast<std::int64_t>(p.hours * 3600.0) * s_ns;
    for (std::size_t i = 0; i < p.qpus; ++i) {
        w.qpus.push_back(qpu_spec{"qpu" + std::to_string(i),
                                  periodic_calibration{p.period_s * s_ns, p.blackout_s * s_ns,
                                                       0, p.f0, p.tau_s * s_ns}});
    }
    std::mt19937_64 rng(p.seed);
    auto uni01 = [&] { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); };
    auto uni = [&](std::int64_t lo, std::int64_t hi) {
        return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    };
    // Window capacity per second of wall time, over all QPUs.
    const double window_share = static_cast<double>(p.period_s - p.blackout_s) /
                                static_cast<double>(p.period_s);
    const double capacity = static_cast<double>(p.qpus) * window_share;
    // Durations: log-uniform between min and max (many short, some long).
    const double lmin = std::log(static_cast<double>(p.min_duration_s));
    const double lmax = std::log(static_cast<double>(p.max_duration_s));
    const double mean_duration_s =
        (static_cast<double>(p.max_duration_s - p.min_duration_s)) / (lmax - lmin);
    const double rate_per_s = p.offered_load * capacity / mean_duration_s;
    std::exponential_distribution<double> gap_s(rate_per_s);
    std::vector<double> weights;
    for (std::size_t i = 0; i < p.tenants; ++i) {
        weights.push_back(1.0 / static_cast<double>(i + 1));
    }
    std::discrete_distribution<std::size_t> tenant_of(weights.begin(), weights.end());
    double t_s = 0.0;
    std::uint64_t seq = 0;
    for (;;) {
        t_s += gap_s(rng);
        const std::int64_t arrival = w.t0_ns + static_cast<std::int64_t>(t_s * 1e9);
        if (arrival >= w.end_ns) {
            break;
        }
        job j;
        j.seq = seq++;
        j.tenant = "tenant" + std::to_string(tenant_of(rng));
        j.arrival_ns = arrival;
        request& r = j.req;
        const double d_s = std::exp(lmin + (lmax - lmin) * uni01());
        r.duration_ns = static_cast<std::int64_t>(d_s * 1e9);
        std::int64_t wish = arrival;
        if (uni01() < p.lookahead_fraction) {
            wish = arrival + uni(0, p.max_lookahead_s) * s_ns;
            r.not_before_ns = wish;
        }
        if (uni01() < p.deadline_fraction) {
            const double slack = p.min_slack + (p.max_slack - p.min_slack) * uni01();
            r.deadline_ns = wish + static_cast<std::int64_t>(d_s * (1.0 + slack) * 1e9) +
                            uni(0, p.max_extra_slack_s) * s_ns;
        }
        r.priority = static_cast<std::int32_t>(uni(0, p.priorities - 1));
        if (uni01() < p.fidelity_fraction) {
            r.min_fidelity = p.min_fidelity_lo + (p.min_fidelity_hi - p.min_fidelity_lo) * uni01();
        }
        w.jobs.push_back(std::move(j));
    }
    return w;
}

}  // namespace qrt::timeline::bench
