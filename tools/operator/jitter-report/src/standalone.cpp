#include "jitter_report/standalone.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "jitter_report/slo.hpp"
#include "qrt_bpf/availability.hpp"
#include "qrt_bpf/histogram_convert.hpp"
#include "qrt_bpf/intrusion_probe.hpp"
#include "qrt_bpf/outlier_probe.hpp"
#include "qrt_bpf/wakeup_probe.hpp"
#include "rtcore/cpu_dma_latency.hpp"
#include "rtcore/clock.hpp"
#include "rtcore/rt_thread.hpp"

namespace qrt::jitter {

namespace {

constexpr std::int64_t ns_per_s = 1'000'000'000;
constexpr std::size_t max_outliers = 20;
constexpr std::size_t max_intrusions = 50;

// The measurement itself: cyclictest's loop (clock_nanosleep TIMER_ABSTIME
// on CLOCK_MONOTONIC, lateness read right after the wakeup).  Nothing here
// allocates, locks, logs or throws.
std::uint64_t timer_loop(rtcore::histogram& hist, std::int64_t interval_ns, std::uint64_t loops,
                         const std::atomic<bool>* stop) noexcept {
    std::uint64_t overruns = 0;
    std::int64_t next = rtcore::monotonic_now_ns() + interval_ns;
    for (std::uint64_t i = 0; i < loops; ++i) {
        if (stop != nullptr && stop->load(std::memory_order_relaxed)) {
            break;
        }
        const timespec t{static_cast<time_t>(next / ns_per_s), static_cast<long>(next % ns_per_s)};
        int rc = 0;
        do {
            rc = ::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, nullptr);
        } while (rc == EINTR && (stop == nullptr || !stop->load(std::memory_order_relaxed)));
        const std::int64_t now = rtcore::monotonic_now_ns();
        if (rc != 0) {
            break;  // EINTR with stop set
        }
        hist.record(now - next);
        next += interval_ns;
        while (next <= now) {
            next += interval_ns;
            ++overruns;
        }
    }
    return overruns;
}

// starting -> ready (configured, tid known) -> measured (loop over, still
// real-time) -> done (policy restored); or starting -> failed.
enum class thread_state : int { starting = 0, ready = 1, measured = 2, done = 3, failed = 4 };

// One measuring thread's shared state.  Fields other than the atomics are
// written by the thread before it publishes `state` (release) and read by
// the main thread after it sees that state (acquire).
struct cpu_run {
    unsigned cpu = 0;
    std::unique_ptr<rtcore::histogram> hist = std::make_unique<rtcore::histogram>();
    std::atomic<thread_state> state{thread_state::starting};
    pid_t tid = 0;
    std::string policy;
    int priority = 0;
    std::string fallback_reason;  // why the full setup was refused
    bool memory_unlocked = false;  // SCHED_FIFO, but memory not locked
    std::string error;
    std::uint64_t overruns = 0;
};

struct shared_control {
    std::atomic<bool> go{false};       // start measuring
    std::atomic<bool> release{false};  // probes detached: the threads may restore their policy
    std::atomic<bool> abort{false};
};

// Setup-side wait for a flag: blocks in the kernel (futex) until notified,
// so a parked thread adds no wakeups to what the probes count.
void wait_for(const std::atomic<bool>& flag, const std::atomic<bool>& abort) {
    while (!flag.load(std::memory_order_acquire) && !abort.load(std::memory_order_acquire)) {
        flag.wait(false, std::memory_order_acquire);
    }
}

// Sets a flag and wakes its waiters.
void raise(std::atomic<bool>& flag) {
    flag.store(true, std::memory_order_release);
    flag.notify_all();
}

void measure_thread(cpu_run& run, const standalone_options& opt, shared_control& ctl) {
    rtcore::rt_thread_config cfg;
    cfg.cpu = static_cast<int>(run.cpu);
    cfg.policy = rtcore::sched_policy::fifo;
    cfg.priority = opt.priority;
    std::optional<rtcore::scoped_rt_thread> rt;
    // SCHED_FIFO with locked memory; else SCHED_FIFO alone (RLIMIT_RTPRIO
    // but a small RLIMIT_MEMLOCK); else SCHED_OTHER.  Each fallback is said.
    if (auto r = rtcore::scoped_rt_thread::enter(cfg)) {
        rt.emplace(std::move(*r));
    } else {
        run.fallback_reason = r.err().message;
        cfg.lock_memory = false;
        if (auto unlocked = rtcore::scoped_rt_thread::enter(cfg)) {
            rt.emplace(std::move(*unlocked));
            run.memory_unlocked = true;
        } else {
            run.fallback_reason = unlocked.err().message;  // the policy itself was refused
        }
    }
    if (rt) {
        run.policy = "SCHED_FIFO";
        run.priority = opt.priority;
    } else {
        cfg.policy = rtcore::sched_policy::other;
        cfg.priority = 0;
        auto again = rtcore::scoped_rt_thread::enter(cfg);
        if (!again) {
            run.error = fmt::format("cpu {}: {}", run.cpu, again.err().message);
            run.state.store(thread_state::failed, std::memory_order_release);
            return;
        }
        rt.emplace(std::move(*again));
        run.policy = "SCHED_OTHER";
        run.priority = 0;
    }
    run.tid = static_cast<pid_t>(::syscall(SYS_gettid));
    run.state.store(thread_state::ready, std::memory_order_release);
    wait_for(ctl.go, ctl.abort);
    if (!ctl.abort.load(std::memory_order_acquire)) {
        const auto loops = static_cast<std::uint64_t>(opt.duration_ns / opt.interval_ns);
        run.overruns = timer_loop(*run.hist, opt.interval_ns, loops, opt.stop);
    }
    // Stay real-time until the probes stop watching this thread, so its
    // wakeups under the restored policy are not counted.
    run.state.store(thread_state::measured, std::memory_order_release);
    wait_for(ctl.release, ctl.abort);
    rt.reset();
    run.state.store(thread_state::done, std::memory_order_release);
}

std::pair<std::uint64_t, std::uint64_t> read_steal(const rtcore::host_fs& fs) {
    auto text = fs.read("/proc/stat");
    if (!text) {
        return {0, 0};
    }
    std::istringstream in(*text);
    std::string cpu;
    in >> cpu;
    if (cpu != "cpu") {
        return {0, 0};
    }
    std::uint64_t v = 0;
    std::uint64_t total = 0;
    std::uint64_t steal = 0;
    for (int i = 0; i < 8 && (in >> v); ++i) {  // user..steal (guest is in user)
        total += v;
        if (i == 7) {
            steal = v;
        }
    }
    return {steal, total};
}

// A wakeup-probe histogram as a report series (bucket midpoints for the
// bins and stddev; the probe's own interpolated quantiles and exact max).
series probe_series(unsigned cpu, const qrt_bpf::wakeup_histogram& w) {
    const rtcore::histogram h = qrt_bpf::to_rtcore_histogram(w);
    std::uint64_t top_ns = 0;  // upper bound of the highest non-empty bucket
    for (unsigned i = qrt_bpf::wakeup_histogram::bucket_count; i-- > 0;) {
        if (w.buckets[i] != 0) {
            top_ns = qrt_bpf::wakeup_histogram::bucket_upper_ns(i);
            break;
        }
    }
    series s;
    s.scope = "cpu";
    s.name = fmt::format("cpu{}", cpu);
    s.cpu = static_cast<int>(cpu);
    s.metric = "probe_wakeup";
    s.stats = stats_of(h);
    if (w.count > 0) {
        // max_ns of a difference is the later counter's max, which may be
        // from before the run: keep it only when it lies in a counted bucket.
        s.stats.max_ns = static_cast<std::int64_t>(std::min(w.max_ns, top_ns));
        s.stats.mean_ns = w.mean_ns();
        s.stats.p50_ns = std::llround(w.quantile_ns(0.50));
        s.stats.p95_ns = std::llround(w.quantile_ns(0.95));
        s.stats.p99_ns = std::llround(w.quantile_ns(0.99));
        s.stats.p999_ns = std::llround(w.quantile_ns(0.999));
    }
    s.bins = bins_of(h);
    return s;
}

struct probes {
    std::vector<std::pair<unsigned, qrt_bpf::wakeup_probe>> wakeup;
    std::optional<qrt_bpf::intrusion_probe> intrusions;
    std::optional<qrt_bpf::outlier_probe> outliers;
};

// All three probes for the measuring threads, or the reason they cannot run.
rtcore::result<probes> attach_probes(const standalone_options& opt, const std::vector<std::unique_ptr<cpu_run>>& runs,
                                     const rtcore::host_fs& fs) {
    const auto pre = qrt_bpf::preflight(fs);
    if (!pre.available()) {
        return rtcore::error::invalid(pre.reason());
    }
    probes p;
    for (const auto& run : runs) {
        auto w = qrt_bpf::wakeup_probe::load({});
        if (!w) {
            return rtcore::error::invalid("wakeup: " + w.err().message);
        }
        if (auto st = w->add_tid(run->tid); !st) {
            return rtcore::error::invalid("wakeup: " + st.err().message);
        }
        p.wakeup.emplace_back(run->cpu, std::move(*w));
    }
    qrt_bpf::intrusion_options io;
    io.isolated_cpus = opt.cpus;
    auto in = qrt_bpf::intrusion_probe::load(io);
    if (!in) {
        return rtcore::error::invalid("intrusions: " + in.err().message);
    }
    qrt_bpf::outlier_options oo;
    oo.threshold_ns = static_cast<std::uint64_t>(opt.outlier_threshold_ns);
    auto out = qrt_bpf::outlier_probe::load(oo);
    if (!out) {
        return rtcore::error::invalid("outliers: " + out.err().message);
    }
    for (const auto& run : runs) {
        if (auto st = in->add_tid(run->tid); !st) {
            return rtcore::error::invalid("intrusions: " + st.err().message);
        }
        if (auto st = out->add_tid(run->tid); !st) {
            return rtcore::error::invalid("outliers: " + st.err().message);
        }
    }
    p.intrusions.emplace(std::move(*in));
    p.outliers.emplace(std::move(*out));
    return p;
}

void keep_worst(std::vector<outlier_row>& rows, std::vector<qrt_bpf::outlier>&& events) {
    for (auto& e : events) {
        outlier_row row;
        row.cpu = e.cpu;
        row.tid = e.tid;
        row.latency_ns = e.latency_ns;
        if (auto c = e.main_cause()) {
            row.main_cause = fmt::format("{} {}", c->source(), format_ns(static_cast<double>(c->overlap_ns)));
        }
        row.summary = e.summary();
        rows.push_back(std::move(row));
    }
    std::stable_sort(rows.begin(), rows.end(),
                     [](const outlier_row& a, const outlier_row& b) { return a.latency_ns > b.latency_ns; });
    if (rows.size() > max_outliers) {
        rows.resize(max_outliers);
    }
}

// Keeps the main thread off the measured CPUs while it polls, when the host
// has other CPUs; puts its affinity back on destruction.
class main_thread_fence {
public:
    main_thread_fence(const rtcore::cpu_set& measured, const rtcore::cpu_set& online) {
        const rtcore::cpu_set others = online - measured;
        if (others.empty() || ::sched_getaffinity(0, sizeof _saved, &_saved) != 0) {
            return;
        }
        cpu_set_t set;
        CPU_ZERO(&set);
        for (const auto c : others.cpus()) {
            CPU_SET(c, &set);
        }
        _active = ::sched_setaffinity(0, sizeof set, &set) == 0;
    }
    main_thread_fence(const main_thread_fence&) = delete;
    main_thread_fence& operator=(const main_thread_fence&) = delete;
    ~main_thread_fence() {
        if (_active) {
            ::sched_setaffinity(0, sizeof _saved, &_saved);
        }
    }

private:
    cpu_set_t _saved{};
    bool _active = false;
};

rtcore::result<rtcore::cpu_set> online_cpus(const rtcore::host_fs& fs) {
    auto text = fs.read_line("/sys/devices/system/cpu/online");
    if (!text) {
        return rtcore::error{text.err().code, "read online CPUs: " + text.err().message};
    }
    auto set = rtcore::cpu_set::parse_list(*text);
    if (!set) {
        return rtcore::error::invalid("/sys/devices/system/cpu/online: " + set.err().message);
    }
    return set;
}

}  // namespace

host_info read_host_info(const rtcore::host_fs& fs) {
    host_info h;
    utsname u{};
    if (::uname(&u) == 0) {
        h.hostname = u.nodename;
        h.kernel = u.release;
        h.preempt_rt = std::string_view(u.version).find("PREEMPT_RT") != std::string_view::npos;
    }
    if (auto rt = fs.read_line("/sys/kernel/realtime"); rt && *rt == "1") {
        h.preempt_rt = true;
    }
    return h;
}

rtcore::status validate(const standalone_options& opt, const rtcore::host_fs& fs) {
    if (opt.cpus.empty()) {
        return rtcore::error::invalid("--cpus: no CPU given");
    }
    if (opt.interval_ns < 10'000 || opt.interval_ns > ns_per_s) {
        return rtcore::error::invalid(fmt::format("--interval {}: must be between 10us and 1s",
                                                  format_ns_exact(opt.interval_ns)));
    }
    if (opt.duration_ns < opt.interval_ns || opt.duration_ns > 24 * 3600 * ns_per_s) {
        return rtcore::error::invalid(fmt::format(
            "--duration {}: must be at least one interval ({}) and at most 24 h",
            format_ns_exact(opt.duration_ns), format_ns_exact(opt.interval_ns)));
    }
    if (opt.priority < 1 || opt.priority > 99) {
        return rtcore::error::invalid(
            fmt::format("--priority {}: SCHED_FIFO priorities are 1..99", opt.priority));
    }
    if (opt.outlier_threshold_ns <= 0) {
        return rtcore::error::invalid("--outlier-threshold: must be greater than 0");
    }
    auto online = online_cpus(fs);
    if (!online) {
        return std::move(online).err();
    }
    for (const auto c : opt.cpus.cpus()) {
        if (!online->test(c)) {
            return rtcore::error::invalid(fmt::format("--cpus: unknown CPU {}: this host has CPU{} {} online",
                                                      c, online->count() == 1 ? "" : "s",
                                                      online->to_list()));
        }
    }
    return rtcore::ok();
}

rtcore::result<report> run_standalone(const standalone_options& opt, rtcore::host_fs& fs) {
    if (auto st = validate(opt, fs); !st) {
        return std::move(st).err();
    }
    report r;
    r.run.mode = "standalone";
    r.run.cpus = opt.cpus.to_list();
    r.run.interval_ns = opt.interval_ns;
    r.host = read_host_info(fs);

    // Hold the CPUs out of deep C-states during the run, as cyclictest does.
    auto dma = rtcore::cpu_dma_latency_hold::acquire(fs, 0);
    if (!dma) {
        r.notes.push_back("cpu_dma_latency not held (" + dma.err().message +
                          "): deep C-state exits may add latency");
    }

    shared_control ctl;
    std::vector<std::unique_ptr<cpu_run>> runs;
    for (const auto c : opt.cpus.cpus()) {
        runs.push_back(std::make_unique<cpu_run>());
        runs.back()->cpu = c;
    }
    std::vector<std::thread> threads;
    threads.reserve(runs.size());
    for (auto& run : runs) {
        threads.emplace_back(measure_thread, std::ref(*run), std::cref(opt), std::ref(ctl));
    }
    const auto join_all = [&] {
        for (auto& t : threads) {
            if (t.joinable()) {
                t.join();
            }
        }
    };
    // Every thread either configured or failed (setup is bounded: no waits).
    std::string failure;
    for (auto& run : runs) {
        while (run->state.load(std::memory_order_acquire) == thread_state::starting) {
            const timespec ms{0, 1'000'000};
            ::nanosleep(&ms, nullptr);
        }
        if (run->state.load(std::memory_order_acquire) == thread_state::failed && failure.empty()) {
            failure = run->error;
        }
    }
    if (!failure.empty()) {
        ctl.abort.store(true, std::memory_order_release);
        raise(ctl.go);
        raise(ctl.release);
        join_all();
        return rtcore::error::invalid("standalone: " + failure);
    }

    std::optional<probes> attached;
    if (opt.probes) {
        auto p = attach_probes(opt, runs, fs);
        if (p) {
            attached.emplace(std::move(*p));
            r.probes.available = true;
            r.probes.status = fmt::format("available ({})", attached->wakeup.front().second.flavour());
        } else {
            r.probes.status = "unavailable (" + p.err().message + ")";
        }
    } else {
        r.probes.status = "unavailable (disabled by --no-probes)";
    }

    auto online = online_cpus(fs);
    std::optional<main_thread_fence> fence;
    if (online) {
        fence.emplace(opt.cpus, *online);
    }
    // What the probes saw while the threads waited for the start is taken
    // off at the end (wakeup_histogram::since).
    std::vector<qrt_bpf::wakeup_histogram> wakeup_at_start;
    if (attached) {
        for (auto& [cpu, probe] : attached->wakeup) {
            auto h = probe.read();
            wakeup_at_start.push_back(h ? *h : qrt_bpf::wakeup_histogram{});
        }
    }
    const auto steal_before = read_steal(fs);
    const std::int64_t started = rtcore::monotonic_now_ns();
    raise(ctl.go);
    const auto all_measured = [&] {
        return std::all_of(runs.begin(), runs.end(), [](const auto& run) {
            return run->state.load(std::memory_order_acquire) == thread_state::measured;
        });
    };
    while (!all_measured()) {
        if (attached) {
            if (auto ev = attached->outliers->poll(100)) {
                keep_worst(r.outliers, std::move(*ev));
            } else {
                const timespec t{0, 100'000'000};
                ::nanosleep(&t, nullptr);
            }
        } else {
            const timespec t{0, 50'000'000};
            ::nanosleep(&t, nullptr);
        }
    }
    r.run.duration_ns = rtcore::monotonic_now_ns() - started;
    if (attached) {
        for (const auto& run : runs) {
            for (auto& [cpu, probe] : attached->wakeup) {
                (void)probe.remove_tid(run->tid);
            }
            (void)attached->intrusions->remove_tid(run->tid);
            (void)attached->outliers->remove_tid(run->tid);
        }
    }
    raise(ctl.release);
    join_all();
    r.run.taken_ns = rtcore::realtime_now_ns();
    const auto steal_after = read_steal(fs);
    if (steal_after.second > steal_before.second) {
        r.host.steal_percent = 100.0 * static_cast<double>(steal_after.first - steal_before.first) /
                               static_cast<double>(steal_after.second - steal_before.second);
    }
    fence.reset();

    // Policy actually used (the same on every CPU unless one fell back).
    r.run.policy = runs.front()->policy;
    r.run.priority = runs.front()->priority;
    for (const auto& run : runs) {
        r.run.overruns += run->overruns;
        if (run->policy != r.run.policy) {
            r.run.policy = "mixed";
        }
        if (run->memory_unlocked) {
            r.notes.push_back(fmt::format(
                "cpu{}: memory not locked ({}); SCHED_FIFO {} used, page faults may add latency",
                run->cpu, run->fallback_reason, opt.priority));
        } else if (!run->fallback_reason.empty()) {
            r.notes.push_back(fmt::format(
                "cpu{}: SCHED_FIFO {} refused ({}); measured under SCHED_OTHER, so the "
                "figures include ordinary scheduling delays",
                run->cpu, opt.priority, run->fallback_reason));
        }
        series s;
        s.scope = "cpu";
        s.name = fmt::format("cpu{}", run->cpu);
        s.cpu = static_cast<int>(run->cpu);
        s.metric = "timer_lateness";
        s.primary = true;
        s.stats = stats_of(*run->hist);
        s.bins = bins_of(*run->hist);
        r.series_list.push_back(std::move(s));
    }
    if (opt.stop != nullptr && opt.stop->load()) {
        r.notes.push_back("interrupted: the run ended early");
    }
    if (r.host.steal_percent >= 1.0) {
        r.notes.push_back(fmt::format(
            "hypervisor steal was {:.1f} % during the run: the latencies include time the "
            "hypervisor took the vCPUs away",
            r.host.steal_percent));
    }

    if (attached) {
        std::size_t k = 0;
        for (auto& [cpu, probe] : attached->wakeup) {
            if (auto h = probe.read()) {
                r.series_list.push_back(probe_series(cpu, h->since(wakeup_at_start[k])));
            } else {
                r.notes.push_back(fmt::format("wakeup probe cpu{}: {}", cpu, h.err().message));
            }
            ++k;
        }
        if (auto list = attached->intrusions->read()) {
            for (const auto& i : *list) {
                if (r.intrusions.size() >= max_intrusions) {
                    break;
                }
                r.intrusions.push_back({i.cpu, std::string(qrt_bpf::to_string(i.kind)), i.source(),
                                        i.count, i.total_ns, i.max_ns});
            }
        } else {
            r.notes.push_back("intrusion probe: " + list.err().message);
        }
        if (auto ev = attached->outliers->poll(0)) {
            keep_worst(r.outliers, std::move(*ev));
        }
        if (auto dropped = attached->outliers->dropped(); dropped && *dropped > 0) {
            r.notes.push_back(fmt::format("{} outlier events were dropped (ring buffer full)", *dropped));
        }
    }
    return r;
}

}  // namespace qrt::jitter
