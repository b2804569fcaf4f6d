#include "fleet.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numbers>
#include <queue>
#include <stdexcept>
#include <unordered_map>

#include "qrt/timeline/ledger.hpp"

namespace qrt::fleet {

namespace tl = qrt::timeline;
namespace wb = qrt::timeline::bench;

const char* to_string(structure s) noexcept {
    switch (s) {
    case structure::central: return "central";
    case structure::no_comm: return "no-comm";
    case structure::limited: return "limited";
    case structure::learned: return "learned";
    }
    return "?";
}

bool structure_from_string(std::string_view s, structure* out) noexcept {
    for (const structure x : k_structures) {
        if (s == to_string(x)) {
            *out = x;
            return true;
        }
    }
    return false;
}

wb::workload fleet_workload(const fleet_params& p, std::size_t total_qpus) {
    wb::workload_params wp;
    wp.seed = p.seed;
    wp.hours = p.hours;
    wp.qpus = total_qpus;
    wp.period_s = p.period_s;
    wp.blackout_s = p.blackout_s;
    wp.offered_load = p.load;
    wp.kind = p.regime;
    wp.gang_fraction = p.gang_fraction;
    wp.max_gang = 2;
    wp.drift_gang_fraction = std::max(0.3, p.gang_fraction);
    return wb::generate(wp);
}

namespace {

constexpr std::int64_t s_ns = 1'000'000'000;
constexpr std::size_t npos = static_cast<std::size_t>(-1);
constexpr std::int64_t k_lease_ns = 30 * s_ns;
constexpr std::int64_t k_retention_ns = 3600 * s_ns;

std::int64_t secs(double s) { return static_cast<std::int64_t>(s * 1e9); }

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

std::uint64_t mix64(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

enum class ev_kind : unsigned char {
    arrival,      // a = job
    step,         // a = job, b = a protocol_step, c = decision generation
    start,        // a = host, c = reservation id, b = start time check (the ns)
    finish,       // a = host, c = reservation id, b = 1 when the endpoint stalled
    calibrate,    // a = host, b = qpu: a cycle's planned blackout end
    recalibrate,  // a = host, b = qpu: an unscheduled pushed update
    host_down,    // a = host
    host_up,      // a = host
    detect,       // a = host: schedulers learn the host is down
    stall,        // a = host, b = qpu
    unstall,      // a = host, b = qpu
    gossip,       // a = host
    redecide,     // a = job, c = generation: a job lost its slot
};

// Where a decision's messages are (ev_kind::step's b).
enum protocol_step : std::size_t {
    step_replies = 0,   // the replies reach the decider
    step_at_hosts = 1,  // the requests reach the hosts asked
    step_commit = 2,    // commit and releases reach the hosts
};

struct sim_event {
    std::int64_t t = 0;
    std::uint64_t seq = 0;
    ev_kind kind = ev_kind::arrival;
    std::size_t a = 0;
    std::size_t b = 0;
    std::uint64_t c = 0;
    bool operator>(const sim_event& o) const noexcept {
        return t != o.t ? t > o.t : seq > o.seq;
    }
};

struct cycle {
    std::int64_t start_ns = 0;   // blackout begins
    std::int64_t length_ns = 0;  // to the next cycle's start
    std::uint64_t id = 0;
    double f0 = 0.99;
    std::int64_t overrun_ns = 0;  // known once the blackout ended
};

struct qpu_proc {
    std::string name;
    std::vector<cycle> cycles;   // from the current one on
    std::int64_t tau_ns = 0;
    double phase = 0;            // of the period drift
    std::uint64_t next_id = 1;
    bool stalled = false;
    std::mt19937_64 rng;
};

struct gossip_entry {
    float load = 0;
    std::int64_t at_ns = -1;  // -1: never heard
    bool up = true;
};

struct host_state {
    std::unique_ptr<tl::ledger> l;
    std::vector<qpu_proc> qpus;
    bool up = true;
    bool known_down = false;  // the schedulers noticed
    std::unordered_map<std::uint64_t, std::size_t> res_job;  // reservation -> job
    std::unordered_map<std::uint64_t, std::int64_t> res_start;
    std::unordered_map<std::uint64_t, std::int64_t> booked;  // active reservation -> duration
    std::int64_t booked_ns = 0;
    std::vector<gossip_entry> table;  // limited/learned: what this host heard
    std::mt19937_64 rng;
};

// A decision in progress (one per job at a time).
struct attempt {
    std::uint64_t gen = 0;
    std::size_t tries = 0;
    bool some_down = false;  // a host asked is down: the replies wait for the timeout
    std::vector<std::size_t> asked;     // hosts asked this try
    std::vector<std::size_t> picked_random;  // 1 when chosen at random
    std::vector<std::vector<tl::reservation>> held;  // per asked host (members), empty = refused
    std::vector<std::size_t> excluded;  // hosts that refused this decision
    std::size_t chosen = npos;
    std::size_t entry = 0;
    std::int64_t decide_ns = 0;  // real ns spent so far on this decision
};

struct job_state {
    std::size_t host = npos;
    std::vector<std::uint64_t> res;  // reservation ids on host (members)
    std::size_t members_left = 0;
    bool failed_member = false;
    bool placed = false;
    bool final = false;
    bool completed = false;
    bool admitted = false;
    std::int64_t end_ns = 0;
    std::uint32_t reschedules = 0;
    std::uint32_t messages = 0;
    attempt at;
    std::vector<std::size_t> records;  // learned decisions for this job
};

class simulator {
public:
    simulator(const fleet_params& p, structure s, const learned_config& lc,
              const objective_weights& ow)
        : _p(p), _s(s), _lc(lc), _ow(ow), _rng(mix64(p.seed ^ 0xf1ee7ULL)) {
        if ((_s == structure::learned) && (_lc.actor == nullptr || _lc.actor->empty())) {
            throw std::runtime_error("structure learned needs an actor model (--model)");
        }
        if (_lc.actor != nullptr && !_lc.actor->empty() &&
            _lc.actor->inputs() != k_actor_features) {
            throw std::runtime_error("actor model has " + std::to_string(_lc.actor->inputs()) +
                                     " inputs, the simulator gives " +
                                     std::to_string(k_actor_features));
        }
        _explore_rng.seed(mix64(_lc.explore_seed ^ p.seed));
        build_hosts();
        _w = fleet_workload(p, _total_qpus);
        _t0 = _w.t0_ns;
        _measure_from = _t0 + secs(p.warmup_h * 3600.0);
        _measure_to = _w.end_ns;
        _jobs.resize(_w.jobs.size());
        init_hosts();
    }

    fleet_metrics run();

private:
    // ------------------------------------------------------------ setup
    void build_hosts() {
        std::mt19937_64 r(mix64(_p.seed ^ 0x4057ULL));
        _hosts.resize(_p.hosts);
        for (std::size_t h = 0; h < _p.hosts; ++h) {
            const auto n = std::uniform_int_distribution<std::size_t>(_p.min_qpus, _p.max_qpus)(r);
            _hosts[h].qpus.resize(n);
            _total_qpus += n;
        }
    }

    void init_hosts() {
        for (std::size_t h = 0; h < _hosts.size(); ++h) {
            host_state& hs = _hosts[h];
            hs.rng.seed(mix64(_p.seed * 1315423911ULL + h));
            std::vector<tl::qpu_spec> specs;
            for (std::size_t q = 0; q < hs.qpus.size(); ++q) {
                qpu_proc& qp = hs.qpus[q];
                qp.name = "qpu" + std::to_string(q);
                qp.rng.seed(mix64(_p.seed * 2654435761ULL + h * 8 + q + 1));
                specs.push_back(tl::qpu_spec{qp.name, tl::pushed_calibration{}});
            }
            tl::ledger_options o;
            o.policy = _p.policy;
            auto opened = tl::ledger::open(specs, o, "", _t0);
            if (!opened) {
                throw std::runtime_error("ledger::open: " + opened.err().message);
            }
            hs.l = std::move(*opened);
            for (std::size_t q = 0; q < hs.qpus.size(); ++q) {
                qpu_proc& qp = hs.qpus[q];
                auto u = [&](double lo, double hi) {
                    return std::uniform_real_distribution<double>(lo, hi)(qp.rng);
                };
                qp.tau_ns = secs(u(static_cast<double>(_p.tau_lo_s), static_cast<double>(_p.tau_hi_s)));
                qp.phase = u(0.0, 2.0 * std::numbers::pi);
                // The cycle in progress at t0 started up to one period ago.
                const std::int64_t first = _t0 - secs(u(0.0, static_cast<double>(_p.period_s)));
                qp.cycles.push_back(new_cycle(qp, first));
                extend_forecast(qp);
                push_windows(h, q, _t0);
                // Window time of a window already open at t0 (later ones are
                // counted when their blackout ends).
                for (const cycle& c : qp.cycles) {
                    if (c.start_ns + _p.blackout_s * s_ns <= _t0) {
                        const tl::calibration_window w = window_of(qp, c);
                        _window_ns += overlap(w.valid_from_ns, w.valid_until_ns, _measure_from,
                                              _measure_to);
                    }
                }
                // The first blackout still to end.
                for (const cycle& c : qp.cycles) {
                    if (c.start_ns + _p.blackout_s * s_ns > _t0) {
                        schedule(c.start_ns + _p.blackout_s * s_ns, ev_kind::calibrate, h, q);
                        break;
                    }
                }
                if (_p.push_rate_per_h > 0) {
                    schedule(_t0 + exp_ns(qp.rng, 3600.0 / _p.push_rate_per_h),
                             ev_kind::recalibrate, h, q);
                }
                if (_p.stall_mtbf_h > 0) {
                    schedule(_t0 + exp_ns(qp.rng, _p.stall_mtbf_h * 3600.0), ev_kind::stall, h, q);
                }
            }
            if (_p.host_mtbf_h > 0) {
                schedule(_t0 + exp_ns(hs.rng, _p.host_mtbf_h * 3600.0), ev_kind::host_down, h);
            }
            if (gossips()) {
                hs.table.assign(_hosts.size(), gossip_entry{});
                const auto phase = std::uniform_real_distribution<double>(0.0, _p.gossip_s)(hs.rng);
                schedule(_t0 + secs(phase), ev_kind::gossip, h);
            }
        }
        for (std::size_t j = 0; j < _w.jobs.size(); ++j) {
            schedule(_w.jobs[j].arrival_ns, ev_kind::arrival, j);
        }
    }

    bool gossips() const noexcept { return _s == structure::limited || _s == structure::learned; }

    static std::int64_t exp_ns(std::mt19937_64& r, double mean_s) {
        return secs(std::exponential_distribution<double>(1.0 / mean_s)(r));
    }

    cycle new_cycle(qpu_proc& qp, std::int64_t start_ns) const {
        cycle c;
        c.start_ns = start_ns;
        const double hours = static_cast<double>(start_ns - _t0) / 3.6e12;
        const double drift =
            _p.period_drift * std::sin(2.0 * std::numbers::pi * hours / _p.drift_cycle_h + qp.phase);
        c.length_ns = secs(static_cast<double>(_p.period_s) * (1.0 + drift));
        c.id = qp.next_id++;
        c.f0 = std::uniform_real_distribution<double>(_p.f0_lo, _p.f0_hi)(qp.rng);
        return c;
    }

    void extend_forecast(qpu_proc& qp) const {
        while (qp.cycles.size() < _p.forecast_windows) {
            const cycle& last = qp.cycles.back();
            qp.cycles.push_back(new_cycle(qp, last.start_ns + last.length_ns));
        }
    }

    tl::calibration_window window_of(const qpu_proc& qp, const cycle& c) const {
        tl::calibration_window w;
        w.calibration_id = c.id;
        w.valid_from_ns = c.start_ns + _p.blackout_s * s_ns + c.overrun_ns;
        w.valid_until_ns = c.start_ns + c.length_ns;
        w.f0 = c.f0;
        w.tau_ns = qp.tau_ns;
        return w;
    }

    void push_windows(std::size_t h, std::size_t q, std::int64_t now) {
        host_state& hs = _hosts[h];
        qpu_proc& qp = hs.qpus[q];
        std::vector<tl::calibration_window> ws;
        for (const cycle& c : qp.cycles) {
            tl::calibration_window w = window_of(qp, c);
            if (w.valid_until_ns > now && w.valid_until_ns > w.valid_from_ns) {
                ws.push_back(w);
            }
        }
        ++_ledger_ops;
        auto r = hs.l->update_calibration(qp.name, std::move(ws), now);
        if (!r) {
            throw std::runtime_error("update_calibration: " + r.err().message);
        }
        if (_s == structure::central) {
            shared_message(now);  // the host tells the coordinator its new windows
        }
        drain(h, now);
    }

    // ------------------------------------------------------------ events
    void schedule(std::int64_t t, ev_kind k, std::size_t a, std::size_t b = 0, std::uint64_t c = 0) {
        _q.push(sim_event{t, _seq++, k, a, b, c});
    }

    std::int64_t delay() const noexcept { return secs(_p.delay_ms / 1000.0); }
    std::int64_t timeout() const noexcept { return secs(_p.timeout_ms / 1000.0); }
    std::int64_t commit_lead() const noexcept { return 4 * delay() + 1'000'000; }

    // A message no single job caused (gossip, calibration reports, cancels).
    // Per job, only those sent while jobs arrive count: the run goes on
    // after the last arrival until every job resolved, and gossip with it.
    void shared_message(std::int64_t now) noexcept {
        ++_messages;
        if (now < _w.end_ns) {
            ++_shared_in_span;
        }
    }

    std::size_t gang_of(std::size_t j) const noexcept {
        return std::max<std::size_t>(1, _w.jobs[j].req.gang_size);
    }
    bool eligible(std::size_t h, std::size_t j) const noexcept {
        return _hosts[h].qpus.size() >= gang_of(j);
    }

    tl::request host_request(std::size_t j, std::int64_t now) const {
        tl::request r = _w.jobs[j].req;
        r.gang_size = 1;
        r.max_candidates = 1;
        if (!_p.admission) {
            r.deadline_ns = 0;
        }
        // A held slot is committed a round trip later and commit refuses a
        // start that passed: ask for a start after the protocol's messages.
        r.not_before_ns = std::max(r.not_before_ns, now + commit_lead());
        return r;
    }

    // Reserve (held) on host h for job j: members, or empty when refused.
    std::vector<tl::reservation> reserve_on(std::size_t h, std::size_t j, std::int64_t now) {
        host_state& hs = _hosts[h];
        const wb::job& jb = _w.jobs[j];
        const std::string key = "job-" + std::to_string(jb.seq) + "-" +
                                std::to_string(_jobs[j].at.gen) + "-" +
                                std::to_string(_jobs[j].at.tries);
        const tl::request req = host_request(j, now);
        ++_ledger_ops;
        if (gang_of(j) > 1) {
            auto r = hs.l->reserve_gang(jb.tenant, req, gang_of(j), key, k_lease_ns, now);
            return r ? std::move(*r) : std::vector<tl::reservation>{};
        }
        auto r = hs.l->reserve(jb.tenant, req, key, k_lease_ns, now);
        if (!r) {
            return {};
        }
        return {std::move(*r)};
    }

    void release_on(std::size_t h, std::size_t j, const std::vector<tl::reservation>& members,
                    std::int64_t now) {
        if (members.empty() || !_hosts[h].up) {
            return;  // a dead host's lease runs out by itself
        }
        ++_ledger_ops;
        (void)_hosts[h].l->release(_w.jobs[j].tenant, members.front().id,
                                   members.front().fencing_token, now);
    }

    // Commit held members on h: the job is placed there.
    bool commit_on(std::size_t h, std::size_t j, const std::vector<tl::reservation>& members,
                   std::int64_t now) {
        host_state& hs = _hosts[h];
        ++_ledger_ops;
        auto r = hs.l->commit(_w.jobs[j].tenant, members.front().id, members.front().fencing_token,
                              {}, now);
        if (!r) {
            return false;
        }
        job_state& js = _jobs[j];
        js.host = h;
        js.res.clear();
        js.placed = true;
        js.admitted = true;
        js.members_left = members.size();
        js.failed_member = false;
        for (const tl::reservation& m : members) {
            const tl::reservation* cur = hs.l->find(m.id);
            const std::int64_t start = cur != nullptr ? cur->start_ns : m.start_ns;
            js.res.push_back(m.id);
            hs.res_job[m.id] = j;
            hs.res_start[m.id] = start;
            hs.booked[m.id] = m.duration_ns;
            hs.booked_ns += m.duration_ns;
            schedule(start, ev_kind::start, h, 0, m.id);
            _fp = (_fp ^ (j * 1000003ULL + h * 7919ULL + static_cast<std::uint64_t>(start))) *
                  1099511628211ULL;
        }
        if (gossips()) {
            // The deciding host knows what it just booked there (and only that).
            std::int64_t work = 0;
            for (const tl::reservation& m : members) {
                work += m.duration_ns;
            }
            gossip_entry& e = _hosts[js.at.entry].table[h];
            e.load += static_cast<float>(static_cast<double>(work) / horizon_ns(h));
        }
        drain(h, now);
        return true;
    }

    // A host's load as it reports it: QPU time booked and not yet done over
    // 30 min of all its QPUs.
    double horizon_ns(std::size_t h) const noexcept {
        return 1800.0 * 1e9 * static_cast<double>(_hosts[h].qpus.size());
    }
    double load_of(std::size_t h) const noexcept {
        return static_cast<double>(_hosts[h].booked_ns) / horizon_ns(h);
    }

    void unbook(host_state& hs, std::uint64_t id) {
        const auto it = hs.booked.find(id);
        if (it != hs.booked.end()) {
            hs.booked_ns -= it->second;
            hs.booked.erase(it);
        }
    }

    // Ledger events after a host-side change: guard moves and displacements.
    void drain(std::size_t h, std::int64_t now) {
        host_state& hs = _hosts[h];
        for (const tl::event& e : hs.l->drain_events()) {
            const auto jt = hs.res_job.find(e.reservation_id);
            if (jt == hs.res_job.end()) {
                continue;
            }
            const std::size_t j = jt->second;
            job_state& js = _jobs[j];
            if (js.host != h) {
                continue;  // an old placement of a job that moved on
            }
            if (e.type == tl::event_type::replaced) {
                auto st = hs.res_start.find(e.reservation_id);
                if (st != hs.res_start.end() && st->second != e.start_ns) {
                    st->second = e.start_ns;
                    ++js.reschedules;
                    schedule(e.start_ns, ev_kind::start, h, 0, e.reservation_id);
                }
            } else if (e.type == tl::event_type::displaced || e.type == tl::event_type::missed) {
                unbook(hs, e.reservation_id);
                lose(j, now);
            }
        }
    }

    // The job lost its slot (displaced, missed, failed): decide again while
    // its deadline still allows, else it is over.
    void lose(std::size_t j, std::int64_t now) {
        job_state& js = _jobs[j];
        if (js.final || !js.placed) {
            return;
        }
        js.placed = false;
        const tl::request& r = _w.jobs[j].req;
        const bool too_late = r.deadline_ns > 0 && now + r.duration_ns > r.deadline_ns;
        if (js.reschedules >= _p.max_reschedules || too_late) {
            finish_job(j, false, now);
            return;
        }
        ++js.reschedules;
        ++js.at.gen;
        schedule(now + delay(), ev_kind::redecide, j, 0, js.at.gen);  // the event reaches the scheduler
        ++_messages;
        ++js.messages;
    }

    void finish_job(std::size_t j, bool ok, std::int64_t end_ns) {
        job_state& js = _jobs[j];
        if (js.final) {
            return;
        }
        js.final = true;
        js.completed = ok;
        js.end_ns = end_ns;
        --_open;
    }

    // ------------------------------------------------------------ decisions
    void begin_decision(std::size_t j, std::int64_t now) {
        job_state& js = _jobs[j];
        js.at.tries = 0;
        js.at.excluded.clear();
        js.at.decide_ns = 0;
        js.at.entry = std::uniform_int_distribution<std::size_t>(0, _hosts.size() - 1)(_rng);
        try_once(j, now);
    }

    void reject(std::size_t j, std::int64_t now) {
        finish_job(j, false, now);
        if (_w.jobs[j].arrival_ns >= _measure_from) {
            ++_rejected;
        }
    }

    void account_decision(std::size_t j) {
        _decide_ns.push_back(static_cast<double>(_jobs[j].at.decide_ns));
        _jobs[j].at.decide_ns = 0;
    }

    bool excluded(std::size_t j, std::size_t h) const {
        const auto& ex = _jobs[j].at.excluded;
        return std::find(ex.begin(), ex.end(), h) != ex.end();
    }

    void try_once(std::size_t j, std::int64_t now) {
        job_state& js = _jobs[j];
        if (js.at.tries >= _p.tries) {
            account_decision(j);
            reject(j, now);
            return;
        }
        ++js.at.tries;
        switch (_s) {
        case structure::central: try_central(j, now); break;
        case structure::no_comm: try_no_comm(j, now); break;
        case structure::limited:
        case structure::learned: try_limited(j, now); break;
        }
    }

    // Central: the coordinator asks its full view (every live host's ledger)
    // for the request's best slot and sends one reserve+commit.
    void try_central(std::size_t j, std::int64_t now) {
        job_state& js = _jobs[j];
        const auto t_a = std::chrono::steady_clock::now();
        tl::request req = host_request(j, now);
        req.gang_size = gang_of(j);
        std::size_t best = npos;
        double best_score = 0;
        double best_load = 0;
        std::int64_t best_start = 0;
        for (std::size_t h = 0; h < _hosts.size(); ++h) {
            if (_hosts[h].known_down || !eligible(h, j) || excluded(j, h)) {
                continue;
            }
            ++_ledger_ops;
            auto r = _hosts[h].l->query(req, now);
            if (!r || r->candidates.empty()) {
                continue;
            }
            // Earliest start; ties (idle hosts all offer "now") go to the
            // policy's score, then to the least loaded host.
            const tl::candidate& c = r->candidates.front();
            const double load = load_of(h);
            if (best == npos || c.start_ns < best_start ||
                (c.start_ns == best_start &&
                 (c.score < best_score || (c.score == best_score && load < best_load)))) {
                best = h;
                best_score = c.score;
                best_start = c.start_ns;
                best_load = load;
            }
        }
        js.at.decide_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - t_a).count();
        if (best == npos) {
            account_decision(j);
            reject(j, now);
            return;
        }
        js.at.asked = {best};
        js.at.some_down = false;
        send(j, best, now);
    }

    // No communication: a random eligible host (a hash of the job), which
    // decides alone; a refusal is retried elsewhere.
    void try_no_comm(std::size_t j, std::int64_t now) {
        job_state& js = _jobs[j];
        std::size_t h = npos;
        for (int guard = 0; guard < 64; ++guard) {
            const auto c = std::uniform_int_distribution<std::size_t>(0, _hosts.size() - 1)(_rng);
            if (eligible(c, j) && !excluded(j, c)) {
                h = c;
                break;
            }
        }
        if (h == npos) {
            account_decision(j);
            reject(j, now);
            return;
        }
        js.at.asked = {h};
        js.at.some_down = false;
        send(j, h, now);
    }

    // One request to one host (reserve + commit there); the reply comes back
    // after 2 delays, or the timeout when the host is down.
    void send(std::size_t j, std::size_t h, std::int64_t now) {
        job_state& js = _jobs[j];
        _messages += 1;
        js.messages += 1;
        if (!_hosts[h].up) {
            schedule(now + timeout(), ev_kind::step, j, step_replies, js.at.gen);
            js.at.held.assign(1, {});
            return;
        }
        const std::int64_t at = now + delay();
        js.at.held.assign(1, {});
        schedule(at, ev_kind::step, j, step_at_hosts, js.at.gen);
    }

    // Limited sharing (and learned): ask d hosts, 1 at random and d-1 of the
    // least loaded this entry host heard of by gossip, to hold a slot; keep
    // the best, commit it, release the others.
    void try_limited(std::size_t j, std::int64_t now) {
        job_state& js = _jobs[j];
        const auto t_a = std::chrono::steady_clock::now();
        const host_state& entry = _hosts[js.at.entry];
        js.at.asked.clear();
        js.at.picked_random.clear();
        for (int guard = 0; guard < 64 && js.at.asked.empty(); ++guard) {
            const auto c = std::uniform_int_distribution<std::size_t>(0, _hosts.size() - 1)(_rng);
            if (eligible(c, j) && !excluded(j, c)) {
                js.at.asked.push_back(c);
                js.at.picked_random.push_back(1);
            }
        }
        const std::int64_t stale = now - secs(3.0 * _p.gossip_s);
        while (js.at.asked.size() < _p.d) {
            std::size_t best = npos;
            float best_load = 0;
            for (std::size_t h = 0; h < _hosts.size(); ++h) {
                const gossip_entry& e = entry.table[h];
                if (!eligible(h, j) || excluded(j, h) || _hosts[h].known_down ||
                    (e.at_ns >= 0 && !e.up && e.at_ns > stale) ||
                    std::find(js.at.asked.begin(), js.at.asked.end(), h) != js.at.asked.end()) {
                    continue;
                }
                const float load = e.at_ns >= 0 ? e.load : 0.5F;
                if (best == npos || load < best_load) {
                    best = h;
                    best_load = load;
                }
            }
            if (best == npos) {
                break;
            }
            js.at.asked.push_back(best);
            js.at.picked_random.push_back(0);
        }
        js.at.decide_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - t_a).count();
        if (js.at.asked.empty()) {
            account_decision(j);
            reject(j, now);
            return;
        }
        js.at.held.assign(js.at.asked.size(), {});
        bool any_down = false;
        for (const std::size_t h : js.at.asked) {
            ++_messages;
            ++js.messages;
            any_down = any_down || !_hosts[h].up;
        }
        schedule(now + delay(), ev_kind::step, j, step_at_hosts, js.at.gen);
        js.at.some_down = any_down;
    }

    // The hosts asked by job j act (reserve; for central/no-comm also commit).
    void host_acts(std::size_t j, std::int64_t now) {
        job_state& js = _jobs[j];
        const auto t_a = std::chrono::steady_clock::now();
        for (std::size_t i = 0; i < js.at.asked.size(); ++i) {
            const std::size_t h = js.at.asked[i];
            if (!_hosts[h].up) {
                continue;
            }
            js.at.held[i] = reserve_on(h, j, now);
            drain(h, now);
        }
        if (_s == structure::central || _s == structure::no_comm) {
            const std::size_t h = js.at.asked.front();
            if (!js.at.held[0].empty() && !commit_on(h, j, js.at.held[0], now)) {
                js.at.held[0].clear();
            }
        }
        js.at.decide_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - t_a).count();
    }

    // Replies are in: decide.
    void replies(std::size_t j, std::int64_t now) {
        job_state& js = _jobs[j];
        _messages += js.at.asked.size();  // one reply each (a dead host's is the timeout)
        js.messages += static_cast<std::uint32_t>(js.at.asked.size());
        if (_s == structure::central || _s == structure::no_comm) {
            if (!js.at.held[0].empty() && js.placed) {
                account_decision(j);
                return;
            }
            js.at.excluded.push_back(js.at.asked.front());
            try_once(j, now);
            return;
        }
        const auto t_a = std::chrono::steady_clock::now();
        std::size_t best = npos;
        if (_s == structure::limited) {
            for (std::size_t i = 0; i < js.at.held.size(); ++i) {
                const auto& m = js.at.held[i];
                if (m.empty()) {
                    continue;
                }
                if (best == npos || m.front().start_ns < js.at.held[best].front().start_ns) {
                    best = i;
                }
            }
        } else {
            best = actor_choice(j, now);
        }
        js.at.decide_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - t_a).count();
        for (std::size_t i = 0; i < js.at.held.size(); ++i) {
            if (js.at.held[i].empty()) {
                js.at.excluded.push_back(js.at.asked[i]);
            }
        }
        if (best == npos) {
            try_once(j, now);
            return;
        }
        js.at.chosen = best;
        // Commit the best, release the others: they arrive one delay later.
        for (std::size_t i = 0; i < js.at.held.size(); ++i) {
            if (!js.at.held[i].empty()) {
                _messages += 2;  // request and reply
                js.messages += 2;
            }
        }
        schedule(now + delay(), ev_kind::step, j, step_commit, js.at.gen);
    }

    void commit_phase(std::size_t j, std::int64_t now) {
        job_state& js = _jobs[j];
        const auto t_a = std::chrono::steady_clock::now();
        bool ok = false;
        for (std::size_t i = 0; i < js.at.held.size(); ++i) {
            const std::size_t h = js.at.asked[i];
            if (js.at.held[i].empty()) {
                continue;
            }
            if (i == js.at.chosen) {
                ok = _hosts[h].up && commit_on(h, j, js.at.held[i], now);
            } else {
                release_on(h, j, js.at.held[i], now);
                if (_hosts[h].up) {
                    drain(h, now);
                }
            }
        }
        js.at.decide_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - t_a).count();
        if (ok) {
            account_decision(j);
            return;
        }
        js.at.excluded.push_back(js.at.asked[js.at.chosen]);
        try_once(j, now);
    }

    // ------------------------------------------------------------ learned
    void candidate_features(std::size_t j, std::size_t i, std::int64_t now, float* f) const {
        const job_state& js = _jobs[j];
        const tl::request& r = _w.jobs[j].req;
        const tl::reservation& m = js.at.held[i].front();
        const std::size_t h = js.at.asked[i];
        const host_state& hs = _hosts[h];
        const std::int64_t earliest = std::max(now, r.not_before_ns);
        double fid = 1.0;
        double window_left_s = 0;
        for (const tl::reservation& mm : js.at.held[i]) {
            for (const qpu_proc& qp : hs.qpus) {
                if (qp.name != mm.qpu) {
                    continue;
                }
                for (const cycle& c : qp.cycles) {
                    if (c.id == mm.calibration_id) {
                        const tl::calibration_window w = window_of(qp, c);
                        fid = std::min(fid, w.predicted_fidelity(mm.start_ns));
                        window_left_s = static_cast<double>(w.valid_until_ns - mm.end_ns()) / 1e9;
                    }
                }
            }
        }
        const double dur_s = static_cast<double>(r.duration_ns) / 1e9;
        const bool has_deadline = r.deadline_ns > 0;
        const double slack_after =
            has_deadline ? static_cast<double>(r.deadline_ns - m.end_ns()) / 1e9 : 3600.0;
        const gossip_entry& g = _hosts[js.at.entry].table[h];
        const double age_s = g.at_ns >= 0 ? static_cast<double>(now - g.at_ns) / 1e9 : 10.0 * _p.gossip_s;
        f[0] = static_cast<float>(static_cast<double>(m.start_ns - earliest) / 1e9 / 600.0);
        f[1] = static_cast<float>(std::log1p(std::max(0.0, slack_after) / 60.0));
        f[2] = has_deadline ? 1.0F : 0.0F;
        f[3] = static_cast<float>(fid);
        f[4] = static_cast<float>(r.min_fidelity > 0 ? fid - r.min_fidelity : 0.0);
        f[5] = static_cast<float>(window_left_s / 600.0);
        f[6] = g.at_ns >= 0 ? g.load : 0.5F;
        f[7] = static_cast<float>(age_s / _p.gossip_s);
        f[8] = static_cast<float>(static_cast<double>(hs.qpus.size()) / 4.0);
        f[9] = static_cast<float>(dur_s / 600.0);
        f[10] = static_cast<float>(static_cast<double>(gang_of(j)) / 4.0);
        f[11] = static_cast<float>(js.at.picked_random[i]);
    }

    void global_features(std::size_t j, std::int64_t now, float* g) const {
        double sum = 0;
        double sq = 0;
        double mx = 0;
        std::size_t down = 0;
        for (std::size_t h = 0; h < _hosts.size(); ++h) {
            const double l = load_of(h);
            sum += l;
            sq += l * l;
            mx = std::max(mx, l);
            down += _hosts[h].up ? 0U : 1U;
        }
        const auto n = static_cast<double>(_hosts.size());
        const double mean = sum / n;
        const tl::request& r = _w.jobs[j].req;
        const double dur_s = static_cast<double>(r.duration_ns) / 1e9;
        const std::int64_t earliest = std::max(now, r.not_before_ns);
        const double slack_s =
            r.deadline_ns > 0 ? static_cast<double>(r.deadline_ns - earliest - r.duration_ns) / 1e9
                              : 3600.0;
        g[0] = static_cast<float>(mean);
        g[1] = static_cast<float>(std::sqrt(std::max(0.0, sq / n - mean * mean)));
        g[2] = static_cast<float>(mx);
        g[3] = static_cast<float>(static_cast<double>(down) / n);
        g[4] = static_cast<float>(static_cast<double>(now - _t0) / 1e9 / (_p.hours * 3600.0));
        g[5] = static_cast<float>(_p.load);
        g[6] = static_cast<float>(dur_s / 600.0);
        g[7] = r.deadline_ns > 0 ? 1.0F : 0.0F;
        g[8] = static_cast<float>(std::log1p(std::max(0.0, slack_s) / 60.0));
        g[9] = static_cast<float>(static_cast<double>(gang_of(j)) / 4.0);
    }

    std::size_t actor_choice(std::size_t j, std::int64_t now) {
        job_state& js = _jobs[j];
        std::vector<std::size_t> idx;
        for (std::size_t i = 0; i < js.at.held.size(); ++i) {
            if (!js.at.held[i].empty()) {
                idx.push_back(i);
            }
        }
        if (idx.empty()) {
            return npos;
        }
        std::vector<float> feats(idx.size() * k_actor_features);
        std::vector<double> score(idx.size());
        for (std::size_t k = 0; k < idx.size(); ++k) {
            float* f = feats.data() + k * k_actor_features;
            candidate_features(j, idx[k], now, f);
            score[k] = static_cast<double>(_lc.actor->eval1(f));
        }
        std::size_t pick = 0;
        if (_lc.explore && idx.size() > 1) {
            const double mx = *std::max_element(score.begin(), score.end());
            std::vector<double> w;
            for (const double s : score) {
                w.push_back(std::exp(s - mx));
            }
            pick = std::discrete_distribution<std::size_t>(w.begin(), w.end())(_explore_rng);
        } else {
            pick = static_cast<std::size_t>(std::max_element(score.begin(), score.end()) -
                                            score.begin());
        }
        if (_lc.record != nullptr && idx.size() > 1) {
            decision_record rec;
            rec.candidates = std::move(feats);
            rec.k = idx.size();
            rec.chosen = pick;
            rec.global.resize(k_critic_features);
            global_features(j, now, rec.global.data());
            rec.job = j;
            js.records.push_back(_lc.record->size());
            _lc.record->push_back(std::move(rec));
        }
        return idx[pick];
    }

    // ------------------------------------------------------------ handlers
    void on_step(const sim_event& e) {
        job_state& js = _jobs[e.a];
        if (e.c != js.at.gen || js.final) {
            return;
        }
        switch (e.b) {
        case step_at_hosts: {
            host_acts(e.a, e.t);
            // Sent one delay ago: the replies arrive one delay from now, or
            // at the timeout when a host asked is down.
            const std::int64_t back = js.at.some_down ? e.t - delay() + timeout() : e.t + delay();
            schedule(back, ev_kind::step, e.a, step_replies, js.at.gen);
            break;
        }
        case step_replies: replies(e.a, e.t); break;
        case step_commit: commit_phase(e.a, e.t); break;
        default: break;
        }
    }

    void on_start(const sim_event& e) {
        host_state& hs = _hosts[e.a];
        const std::uint64_t id = e.c;
        const tl::reservation* r = hs.l->find(id);
        if (r == nullptr || r->state != tl::res_state::committed || r->start_ns != e.t) {
            return;
        }
        if (!hs.up) {
            return;  // the agent is down: mark_missed on restart
        }
        bool stalled = false;
        for (const qpu_proc& qp : hs.qpus) {
            if (qp.name == r->qpu) {
                stalled = qp.stalled;
            }
        }
        ++_ledger_ops;
        (void)hs.l->mark_dispatched(id, e.t);
        schedule(e.t + r->duration_ns, ev_kind::finish, e.a, stalled ? 1 : 0, id);
    }

    void on_finish(const sim_event& e) {
        host_state& hs = _hosts[e.a];
        const std::uint64_t id = e.c;
        const tl::reservation* r = hs.l->find(id);
        if (r == nullptr || r->state != tl::res_state::dispatched) {
            return;
        }
        const std::int64_t start = r->start_ns;
        const std::int64_t dur = r->duration_ns;
        ++_ledger_ops;
        if (e.b == 1 || !hs.up) {
            (void)hs.l->fail(id, e.b == 1 ? "endpoint stalled: no result" : "agent down", e.t);
        } else {
            (void)hs.l->complete(id, {}, e.t);
            _busy_ns += overlap(start, start + dur, _measure_from, _measure_to);
        }
        (void)hs.l->drain_events();
        unbook(hs, id);
        const auto jt = hs.res_job.find(id);
        if (jt == hs.res_job.end()) {
            return;
        }
        const std::size_t j = jt->second;
        hs.res_job.erase(jt);
        hs.res_start.erase(id);
        job_state& js = _jobs[j];
        if (js.host != e.a || js.final) {
            return;
        }
        if (e.b == 1 || !hs.up) {
            js.failed_member = true;
        }
        if (--js.members_left == 0) {
            if (js.failed_member) {
                lose(j, e.t);
            } else {
                finish_job(j, true, e.t);
                if (_s == structure::central) {
                    ++_messages;  // the host reports the completion to the coordinator
                    ++js.messages;
                }
            }
        }
    }

    void on_calibrate(const sim_event& e) {
        host_state& hs = _hosts[e.a];
        qpu_proc& qp = hs.qpus[e.b];
        // Forget cycles whose window ended; find the one whose blackout ends now.
        while (qp.cycles.size() > 1 &&
               qp.cycles.front().start_ns + qp.cycles.front().length_ns <= e.t) {
            qp.cycles.erase(qp.cycles.begin());
        }
        std::size_t ci = 0;
        while (ci + 1 < qp.cycles.size() && qp.cycles[ci].start_ns + _p.blackout_s * s_ns != e.t) {
            ++ci;
        }
        cycle& c = qp.cycles[ci];
        // The blackout was planned to end now; it may run long.
        std::uniform_real_distribution<double> u(0.0, 1.0);
        if (u(qp.rng) < _p.overrun_prob) {
            const double o = 10.0 + u(qp.rng) * static_cast<double>(_p.overrun_max_s - 10);
            const std::int64_t max_o = c.length_ns - _p.blackout_s * s_ns - 60 * s_ns;
            c.overrun_ns = std::min(secs(o), std::max<std::int64_t>(0, max_o));
        }
        const tl::calibration_window w = window_of(qp, c);
        _window_ns += overlap(w.valid_from_ns, w.valid_until_ns, _measure_from, _measure_to);
        // Roll the forecast (the current cycle counts: its window is open).
        qp.cycles.erase(qp.cycles.begin(), qp.cycles.begin() + static_cast<std::ptrdiff_t>(ci));
        extend_forecast(qp);
        push_windows(e.a, e.b, e.t);
        const cycle& next = qp.cycles[1];
        schedule(next.start_ns + _p.blackout_s * s_ns, ev_kind::calibrate, e.a, e.b);
        // Housekeeping the agent does now and then.
        ++_ledger_ops;
        (void)hs.l->expire_leases(e.t);
        (void)hs.l->forget_terminal(e.t - k_retention_ns);
        drain(e.a, e.t);
    }

    void on_recalibrate(const sim_event& e) {
        host_state& hs = _hosts[e.a];
        qpu_proc& qp = hs.qpus[e.b];
        // Re-measured: the current window (if one is open) gets a new id and f0.
        for (cycle& c : qp.cycles) {
            const tl::calibration_window w = window_of(qp, c);
            if (w.contains(e.t)) {
                c.id = qp.next_id++;
                c.f0 = std::uniform_real_distribution<double>(_p.f0_lo, _p.f0_hi)(qp.rng);
                push_windows(e.a, e.b, e.t);
                break;
            }
        }
        schedule(e.t + exp_ns(qp.rng, 3600.0 / _p.push_rate_per_h), ev_kind::recalibrate, e.a, e.b);
    }

    void on_host_down(const sim_event& e) {
        host_state& hs = _hosts[e.a];
        hs.up = false;
        schedule(e.t + secs(_p.detect_s), ev_kind::detect, e.a);
        schedule(e.t + exp_ns(hs.rng, _p.host_down_mean_s), ev_kind::host_up, e.a);
    }

    void on_detect(const sim_event& e) {
        host_state& hs = _hosts[e.a];
        if (hs.up) {
            return;
        }
        hs.known_down = true;
        // Every scheduler that placed a job there decides it again.
        std::vector<std::size_t> moved;
        for (const auto& [id, j] : hs.res_job) {
            const job_state& js = _jobs[j];
            if (js.host == e.a && js.placed && !js.final) {
                const tl::reservation* r = hs.l->find(id);
                if (r != nullptr && r->state == tl::res_state::committed) {
                    moved.push_back(j);
                }
            }
        }
        std::sort(moved.begin(), moved.end());
        moved.erase(std::unique(moved.begin(), moved.end()), moved.end());
        for (const std::size_t j : moved) {
            for (const std::uint64_t id : _jobs[j].res) {
                unbook(hs, id);
            }
            lose(j, e.t);
        }
    }

    void on_host_up(const sim_event& e) {
        host_state& hs = _hosts[e.a];
        hs.up = true;
        hs.known_down = false;
        // The agent restarts: what passed is missed, held leases ran out.
        _ledger_ops += 2;
        (void)hs.l->mark_missed(e.t, 0);
        (void)hs.l->expire_leases(e.t);
        // Committed reservations of jobs that moved elsewhere: their owners cancel them.
        for (const auto& [id, j] : hs.res_job) {
            const tl::reservation* r = hs.l->find(id);
            const job_state& js = _jobs[j];
            if (r != nullptr && r->state == tl::res_state::committed &&
                (js.host != e.a || js.final || !js.placed)) {
                ++_ledger_ops;
                shared_message(e.t);
                (void)hs.l->cancel(_w.jobs[j].tenant, id, e.t);
                unbook(hs, id);
            }
        }
        drain(e.a, e.t);
        // Re-arm the dispatcher for what is still ahead.
        for (const auto& [id, j] : hs.res_job) {
            const tl::reservation* r = hs.l->find(id);
            if (r != nullptr && r->state == tl::res_state::committed && r->start_ns >= e.t) {
                schedule(r->start_ns, ev_kind::start, e.a, 0, id);
            }
        }
        schedule(e.t + exp_ns(hs.rng, _p.host_mtbf_h * 3600.0), ev_kind::host_down, e.a);
    }

    void on_gossip(const sim_event& e) {
        host_state& hs = _hosts[e.a];
        schedule(e.t + secs(_p.gossip_s), ev_kind::gossip, e.a);
        if (!hs.up) {
            return;
        }
        hs.table[e.a] = gossip_entry{static_cast<float>(load_of(e.a)), e.t, true};
        std::size_t peer = std::uniform_int_distribution<std::size_t>(0, _hosts.size() - 1)(hs.rng);
        if (peer == e.a) {
            peer = (peer + 1) % _hosts.size();
        }
        shared_message(e.t);
        if (!_hosts[peer].up || peer == e.a) {
            return;
        }
        // Own entry plus a random sample of what this host knows.
        auto merge = [&](std::size_t k) {
            const gossip_entry& src = hs.table[k];
            gossip_entry& dst = _hosts[peer].table[k];
            if (src.at_ns > dst.at_ns) {
                dst = src;
            }
        };
        merge(e.a);
        for (std::size_t i = 1; i < _p.gossip_entries; ++i) {
            merge(std::uniform_int_distribution<std::size_t>(0, _hosts.size() - 1)(hs.rng));
        }
    }

    // ------------------------------------------------------------ figures
    fleet_metrics figures(double wall_s);

    fleet_params _p;
    structure _s;
    learned_config _lc;
    objective_weights _ow;
    std::mt19937_64 _rng;
    std::mt19937_64 _explore_rng;
    wb::workload _w;
    std::vector<host_state> _hosts;
    std::vector<job_state> _jobs;
    std::size_t _total_qpus = 0;
    std::int64_t _t0 = 0;
    std::int64_t _measure_from = 0;
    std::int64_t _measure_to = 0;
    std::priority_queue<sim_event, std::vector<sim_event>, std::greater<>> _q;
    std::uint64_t _seq = 0;
    std::size_t _open = 0;
    std::size_t _rejected = 0;
    std::uint64_t _messages = 0;
    std::uint64_t _shared_in_span = 0;
    std::uint64_t _ledger_ops = 0;
    std::int64_t _busy_ns = 0;
    std::int64_t _window_ns = 0;
    std::vector<double> _decide_ns;
    std::uint64_t _fp = 14695981039346656037ULL;
};

fleet_metrics simulator::run() {
    const auto wall_a = std::chrono::steady_clock::now();
    _open = _jobs.size();
    const std::int64_t hard_end = _w.end_ns + 24 * 3600 * s_ns;
    while (!_q.empty()) {
        const sim_event e = _q.top();
        if ((_open == 0 && e.t > _w.end_ns) || e.t > hard_end) {
            break;
        }
        _q.pop();
        switch (e.kind) {
        case ev_kind::arrival: begin_decision(e.a, e.t); break;
        case ev_kind::step: on_step(e); break;
        case ev_kind::redecide:
            if (e.c == _jobs[e.a].at.gen && !_jobs[e.a].final) {
                begin_decision(e.a, e.t);
            }
            break;
        case ev_kind::start: on_start(e); break;
        case ev_kind::finish: on_finish(e); break;
        case ev_kind::calibrate: on_calibrate(e); break;
        case ev_kind::recalibrate: on_recalibrate(e); break;
        case ev_kind::host_down: on_host_down(e); break;
        case ev_kind::host_up: on_host_up(e); break;
        case ev_kind::detect: on_detect(e); break;
        case ev_kind::stall:
            _hosts[e.a].qpus[e.b].stalled = true;
            schedule(e.t + exp_ns(_hosts[e.a].qpus[e.b].rng, _p.stall_mean_s), ev_kind::unstall,
                     e.a, e.b);
            break;
        case ev_kind::unstall:
            _hosts[e.a].qpus[e.b].stalled = false;
            schedule(e.t + exp_ns(_hosts[e.a].qpus[e.b].rng, _p.stall_mtbf_h * 3600.0),
                     ev_kind::stall, e.a, e.b);
            break;
        case ev_kind::gossip: on_gossip(e); break;
        }
    }
    const double wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_a).count();
    return figures(wall_s);
}

fleet_metrics simulator::figures(double wall_s) {
    fleet_metrics m;
    m.structure = to_string(_s);
    m.regime = wb::to_string(_p.regime);
    m.load = _p.load;
    m.hosts = _hosts.size();
    m.qpus = _total_qpus;
    m.seed = _p.seed;
    m.wall_s = wall_s;
    m.ledger_ops = _ledger_ops;
    m.fingerprint = _fp;
    std::vector<double> resp;
    std::map<std::string, std::pair<double, double>> tenant;
    std::size_t admitted_deadline = 0;
    std::size_t admitted_met = 0;
    double cost = 0;
    double offered_ns = 0;
    double job_msgs = 0;
    std::uint64_t resched = 0;
    for (std::size_t j = 0; j < _jobs.size(); ++j) {
        const wb::job& jb = _w.jobs[j];
        const job_state& js = _jobs[j];
        const bool measured = jb.arrival_ns >= _measure_from;
        job_msgs += static_cast<double>(js.messages);
        const auto work = static_cast<double>(jb.req.duration_ns * static_cast<std::int64_t>(gang_of(j)));
        const bool has_deadline = jb.req.deadline_ns > 0;
        const bool met = js.completed && (!has_deadline || js.end_ns <= jb.req.deadline_ns);
        const std::int64_t earliest = std::max(jb.arrival_ns, jb.req.not_before_ns);
        const double resp_s = js.completed ? static_cast<double>(js.end_ns - earliest) / 1e9 : 0.0;
        // The operating objective (README): cost of this job.
        const double c = _ow.miss * (met ? 0.0 : 1.0) +
                         _ow.response * (js.completed ? std::min(resp_s / 600.0, 3.0) : 3.0) +
                         _ow.message * static_cast<double>(js.messages);
        if (_lc.record != nullptr) {
            for (const std::size_t r : js.records) {
                (*_lc.record)[r].reward = static_cast<float>(-c);
            }
        }
        if (!measured) {
            continue;
        }
        ++m.jobs;
        offered_ns += work;
        cost += c;
        resched += js.reschedules;
        tenant[jb.tenant].second += work;
        if (has_deadline) {
            ++m.with_deadline;
            m.deadline_missed += met ? 0 : 1;
            if (js.admitted) {
                ++admitted_deadline;
                admitted_met += met ? 1 : 0;
            }
        }
        if (js.completed) {
            ++m.completed;
            resp.push_back(resp_s);
            tenant[jb.tenant].first += work;
        }
    }
    m.rejected = _rejected;
    m.miss_rate = m.with_deadline > 0 ? static_cast<double>(m.deadline_missed) /
                                            static_cast<double>(m.with_deadline)
                                      : 0.0;
    m.compliance_admitted = admitted_deadline > 0 ? static_cast<double>(admitted_met) /
                                                        static_cast<double>(admitted_deadline)
                                                  : 0.0;
    m.offered = _window_ns > 0 ? offered_ns / static_cast<double>(_window_ns) : 0;
    m.utilization = _window_ns > 0 ? static_cast<double>(_busy_ns) / static_cast<double>(_window_ns) : 0;
    const double span_h = static_cast<double>(_measure_to - _measure_from) / 3.6e12;
    m.throughput_qpu_h_per_h = span_h > 0 ? static_cast<double>(_busy_ns) / 3.6e12 / span_h : 0;
    m.response_p50_s = quantile(resp, 0.50);
    m.response_p95_s = quantile(resp, 0.95);
    double sum = 0;
    double sq = 0;
    for (const auto& [name, sr] : tenant) {
        const double x = sr.second > 0 ? sr.first / sr.second : 0;
        sum += x;
        sq += x * x;
    }
    m.jain = sq > 0 ? sum * sum / (static_cast<double>(tenant.size()) * sq) : 0;
    m.messages = _messages;
    m.messages_per_job =
        _jobs.empty() ? 0
                      : (job_msgs + static_cast<double>(_shared_in_span)) /
                            static_cast<double>(_jobs.size());
    m.decide_ns_p50 = quantile(_decide_ns, 0.5);
    double dsum = 0;
    for (const double d : _decide_ns) {
        dsum += d;
    }
    m.decide_ns_mean = _decide_ns.empty() ? 0 : dsum / static_cast<double>(_decide_ns.size());
    m.reschedules_per_job = m.jobs > 0 ? static_cast<double>(resched) / static_cast<double>(m.jobs) : 0;
    m.mean_cost = m.jobs > 0 ? cost / static_cast<double>(m.jobs) : 0;
    return m;
}

}  // namespace

fleet_metrics simulate(const fleet_params& p, structure s, const learned_config& lc,
                       const objective_weights& ow) {
    if (p.hosts == 0 || p.min_qpus == 0 || p.max_qpus < p.min_qpus || p.d == 0 || p.tries == 0) {
        throw std::runtime_error("fleet: hosts, qpus, d and tries must be >= 1 (and min <= max)");
    }
    simulator sim(p, s, lc, ow);
    return sim.run();
}

}  // namespace qrt::fleet
