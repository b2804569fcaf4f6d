#include "workload.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace qrt::timeline::bench {

namespace {
constexpr std::int64_t s_ns = 1'000'000'000;

// The mix at progress x in [0, 1] through the run (constant unless drift).
struct mix {
    double duration_scale = 1.0;
    double slack_scale = 1.0;
    double gang_fraction = 0.0;
    std::vector<double> tenant_weights;
};

mix mix_at(const workload_params& p, double x) {
    mix m;
    const double d = p.kind == regime::drift ? x : 0.0;
    m.duration_scale = 1.0 + (p.drift_duration_factor - 1.0) * d;
    m.slack_scale = 1.0 + (p.drift_slack_factor - 1.0) * d;
    m.gang_fraction = p.gang_fraction + (p.drift_gang_fraction - p.gang_fraction) * d;
    for (std::size_t i = 0; i < p.tenants; ++i) {
        // 1/(i+1) at the start; under drift the weights reverse to 1/(T-i).
        const double w0 = 1.0 / static_cast<double>(i + 1);
        const double w1 = 1.0 / static_cast<double>(p.tenants - i);
        m.tenant_weights.push_back(w0 + (w1 - w0) * d);
    }
    return m;
}

double mean_gang(const workload_params& p, double gang_fraction) {
    const double k = (2.0 + static_cast<double>(std::max<std::size_t>(p.max_gang, 2))) / 2.0;
    return 1.0 + gang_fraction * (k - 1.0);
}

}  // namespace

const char* to_string(regime r) noexcept {
    switch (r) {
    case regime::stationary: return "stationary";
    case regime::bursty: return "bursty";
    case regime::drift: return "drift";
    }
    return "?";
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
    // QPU-seconds asked per second at progress x: rate(x) * work(x) = load * capacity.
    auto rate_at = [&](const mix& m) {
        return p.offered_load * capacity /
               (mean_duration_s * m.duration_scale * mean_gang(p, m.gang_fraction));
    };
    const double span_s = p.hours * 3600.0;
    const mix m0 = mix_at(p, 0.0);
    const bool plain = p.kind == regime::stationary && p.gang_fraction <= 0.0;

    // One job at progress x (the draws of the plain case come first, in the
    // order they always had).
    auto make_job = [&](std::int64_t arrival, const mix& m,
                        std::discrete_distribution<std::size_t>& tenant_of, std::uint64_t seq) {
        job j;
        j.seq = seq;
        j.tenant = "tenant" + std::to_string(tenant_of(rng));
        j.arrival_ns = arrival;
        request& r = j.req;
        const double d_s = std::exp(lmin + (lmax - lmin) * uni01()) * m.duration_scale;
        r.duration_ns = static_cast<std::int64_t>(d_s * 1e9);
        std::int64_t wish = arrival;
        if (uni01() < p.lookahead_fraction) {
            wish = arrival + uni(0, p.max_lookahead_s) * s_ns;
            r.not_before_ns = wish;
        }
        if (uni01() < p.deadline_fraction) {
            const double slack =
                (p.min_slack + (p.max_slack - p.min_slack) * uni01()) * m.slack_scale;
            const auto extra = static_cast<double>(uni(0, p.max_extra_slack_s)) * m.slack_scale;
            r.deadline_ns = wish + static_cast<std::int64_t>(d_s * (1.0 + slack) * 1e9) +
                            static_cast<std::int64_t>(extra * 1e9);
        }
        r.priority = static_cast<std::int32_t>(uni(0, p.priorities - 1));
        if (uni01() < p.fidelity_fraction) {
            r.min_fidelity = p.min_fidelity_lo + (p.min_fidelity_hi - p.min_fidelity_lo) * uni01();
        }
        if (m.gang_fraction > 0.0 && uni01() < m.gang_fraction) {
            r.gang_size = static_cast<std::size_t>(
                uni(2, static_cast<std::int64_t>(std::max<std::size_t>(p.max_gang, 2))));
        }
        return j;
    };

    std::uint64_t seq = 0;
    if (plain) {
        std::exponential_distribution<double> gap_s(rate_at(m0));
        std::discrete_distribution<std::size_t> tenant_of(m0.tenant_weights.begin(),
                                                          m0.tenant_weights.end());
        double t_s = 0.0;
        for (;;) {
            t_s += gap_s(rng);
            const std::int64_t arrival = w.t0_ns + static_cast<std::int64_t>(t_s * 1e9);
            if (arrival >= w.end_ns) {
                break;
            }
            w.jobs.push_back(make_job(arrival, m0, tenant_of, seq++));
        }
        return w;
    }

    // Modulated arrivals by thinning: candidates at the highest rate the run
    // reaches, each kept with probability rate(t) / max.
    const mix m1 = mix_at(p, 1.0);
    double rate_max = std::max(rate_at(m0), rate_at(m1));
    double calm_factor = 1.0;
    if (p.kind == regime::bursty) {
        // burst_fraction * burst_factor + (1 - burst_fraction) * calm = 1
        calm_factor = std::max(0.0, (1.0 - p.burst_fraction * p.burst_factor) /
                                        (1.0 - p.burst_fraction));
        rate_max *= std::max(p.burst_factor, 1.0);
    }
    const double calm_dwell_s = p.burst_dwell_s * (1.0 - p.burst_fraction) / p.burst_fraction;
    std::exponential_distribution<double> gap_s(rate_max);
    bool burst = false;
    double switch_at_s = p.kind == regime::bursty
                             ? std::exponential_distribution<double>(1.0 / calm_dwell_s)(rng)
                             : span_s;
    double t_s = 0.0;
    for (;;) {
        t_s += gap_s(rng);
        if (t_s >= span_s) {
            break;
        }
        while (t_s >= switch_at_s) {
            burst = !burst;
            const double dwell = burst ? p.burst_dwell_s : calm_dwell_s;
            switch_at_s += std::exponential_distribution<double>(1.0 / dwell)(rng);
        }
        const mix m = mix_at(p, t_s / span_s);
        const double modulation = p.kind == regime::bursty ? (burst ? p.burst_factor : calm_factor)
                                                           : 1.0;
        if (uni01() * rate_max >= rate_at(m) * modulation) {
            continue;
        }
        std::discrete_distribution<std::size_t> tenant_of(m.tenant_weights.begin(),
                                                          m.tenant_weights.end());
        const std::int64_t arrival = w.t0_ns + static_cast<std::int64_t>(t_s * 1e9);
        w.jobs.push_back(make_job(arrival, m, tenant_of, seq++));
    }
    return w;
}

}  // namespace qrt::timeline::bench
