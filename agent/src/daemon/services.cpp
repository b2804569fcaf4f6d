// The daemon's services: see services.hpp.

#include "services.hpp"

#include "rtcore/memory_lock.hpp"

#include <dirent.h>
#include <grp.h>
#include <malloc.h>
#include <sys/epoll.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <utility>

#include <fmt/format.h>

#include "qrt/dispatch/guard.hpp"
#include "qrt/log.hpp"
#include "qrt/rpc/auth.hpp"
#include "qrt/rpc/timeline_methods.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/task_ops.hpp"

#ifdef QRT_HAVE_BPF
#include "outlier_feed.hpp"
#include "qrt_bpf/histogram_convert.hpp"
#include "qrt_bpf/intrusion.hpp"
#include "qrt_bpf/probe_set.hpp"
#endif

namespace qrt {
namespace {

using json = nlohmann::json;
constexpr std::int64_t k_ms = 1'000'000;
// jobs.submit carries no shot count; a JSON payload may say {"shots": N}.
constexpr std::uint32_t k_default_shots = 1000;
constexpr std::uint32_t k_max_shots = 1'000'000;

std::string tl_error(const timeline::error& e) { return e.reason + ": " + e.message; }

std::size_t round_up_pow2(std::size_t v) {
    std::size_t p = 1;
    while (p < v) {
        p <<= 1U;
    }
    return p;
}

std::uint32_t shots_of(const timeline::blob& payload) {
    if (payload.empty() || payload.front() != '{') {
        return k_default_shots;
    }
    const json j = json::parse(payload.begin(), payload.end(), nullptr, false);
    if (j.is_object()) {
        const auto it = j.find("shots");
        if (it != j.end() && it->is_number_unsigned()) {
            return static_cast<std::uint32_t>(std::min<std::uint64_t>(it->get<std::uint64_t>(), k_max_shots));
        }
    }
    return k_default_shots;
}

// Task ids of this process (/proc/self/task).
std::set<pid_t> own_tids() {
    std::set<pid_t> out;
    DIR* d = ::opendir("/proc/self/task");
    if (d == nullptr) {
        return out;
    }
    while (const dirent* e = ::readdir(d)) {
        char* end = nullptr;
        const long v = std::strtol(e->d_name, &end, 10);
        if (end != e->d_name && *end == '\0' && v > 0) {
            out.insert(static_cast<pid_t>(v));
        }
    }
    ::closedir(d);
    return out;
}

bool group_exists(const std::string& name) {
    group gr{};
    group* found = nullptr;
    std::vector<char> buf(16384);
    return ::getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found) == 0 && found != nullptr;
}

std::string comm_of(pid_t tid) {
    std::ifstream in(fmt::format("/proc/self/task/{}/comm", tid));
    std::string s;
    std::getline(in, s);
    return s;
}

timeline::ledger_options ledger_options_for(const config& cfg) {
    timeline::ledger_options lo;
    lo.min_lead_ns = handover_timing_for(cfg).min_lead_ns;
    lo.policy = std::string(to_string(cfg.timeline.policy));
    lo.calibration_change = cfg.timeline.on_calibration_change == calibration_change::fail
                                ? timeline::on_calibration_change::fail
                                : timeline::on_calibration_change::replace;
    if (cfg.timeline.default_lease_ns > 0) {
        lo.default_lease_ns = cfg.timeline.default_lease_ns;
        lo.max_lease_ns = std::max(lo.max_lease_ns, lo.default_lease_ns);
    }
    if (cfg.timeline.horizon_ns > 0) {
        lo.horizon_ns = cfg.timeline.horizon_ns;
    }
    if (cfg.timeline.max_windows > 0) {
        lo.max_windows = cfg.timeline.max_windows;
    }
    if (cfg.timeline.commit_group_max > 0) {
        lo.commit_group_max = cfg.timeline.commit_group_max;
    }
    lo.commit_group_wait = std::chrono::microseconds(cfg.timeline.commit_group_wait_us);
    if (cfg.timeline.commit_queue_max > 0) {
        lo.commit_queue_max = cfg.timeline.commit_queue_max;
    }
    return lo;
}

std::vector<timeline::qpu_spec> qpu_specs_for(const config& cfg) {
    std::vector<timeline::qpu_spec> out;
    for (const auto& q : cfg.qpus) {
        timeline::qpu_spec s;
        s.name = q.name;
        if (q.calibration == calibration_source::periodic) {
            timeline::periodic_calibration pc;
            pc.period_ns = q.period_ns;
            pc.blackout_ns = q.blackout_ns;
            pc.phase_ns = q.phase_ns;
            pc.f0 = q.fidelity_f0;
            pc.tau_ns = q.fidelity_tau_ns;
            s.calibration = pc;
        } else {
            s.calibration = timeline::pushed_calibration{};
        }
        out.push_back(std::move(s));
    }
    return out;
}


}  // namespace

handover_timing handover_timing_for(const config& cfg) {
    handover_timing h;
    h.pump_period_ns = 2 * k_ms;
    const dispatch::lead_config defaults{};
    const std::int64_t lead_min = cfg.dispatch.lead_min_ns > 0 ? cfg.dispatch.lead_min_ns : defaults.min_ns;
    h.lead_max_ns = std::max(cfg.dispatch.lead_max_ns > 0 ? cfg.dispatch.lead_max_ns : defaults.max_ns, lead_min);
    h.margin_ns = cfg.dispatch.handover_margin_ns;
    h.min_lead_ns = h.pump_period_ns + h.lead_max_ns + h.margin_ns;
    // Hand jobs over well before their lead starts: a housekeeping stall
    // shorter than the horizon delays no dispatch already handed over.
    h.horizon_ns = std::max<std::int64_t>(h.min_lead_ns + 20 * k_ms, 250 * k_ms);
    return h;
}

rpc::server_options control_socket_options(const config& cfg, bool warn) {
    rpc::server_options so;
    if (!cfg.rpc.socket_path.empty()) {
        so.socket_path = cfg.rpc.socket_path;
    }
    so.socket_group = cfg.rpc.socket_group;
    if (!so.socket_group.empty() && !group_exists(so.socket_group)) {
        if (warn) {
            log::warn("rpc", "rpc.socket_group '{}' does not exist on this host: the socket keeps "
                         "the daemon's group",
                      so.socket_group);
        }
        so.socket_group.clear();
    }
    if (cfg.rpc.socket_mode != 0) {
        so.socket_mode = cfg.rpc.socket_mode;
    }
    if (cfg.rpc.max_connections > 0) {
        so.max_connections = cfg.rpc.max_connections;
    }
    if (cfg.rpc.max_inflight > 0) {
        so.max_inflight = cfg.rpc.max_inflight;
    }
    so.idle_timeout = cfg.rpc.idle_timeout_s > 0
                          ? std::chrono::milliseconds(std::chrono::seconds(cfg.rpc.idle_timeout_s))
                          : std::chrono::milliseconds(std::chrono::hours(24 * 365));
    if (cfg.rpc.max_line_bytes > 0) {
        so.max_line_bytes = cfg.rpc.max_line_bytes;
    }
    if (cfg.rpc.nss_timeout_ms > 0) {
        so.nss_timeout = std::chrono::milliseconds(cfg.rpc.nss_timeout_ms);
    }
    so.metrics_textfile = cfg.rpc.metrics_textfile;
    return so;
}

// ------------------------------------------------------------------ per QPU

struct services::qpu_runtime {
    std::uint32_t index = 0;
    std::string name;
    std::string endpoint;
    int dispatch_cpu = -1;
    std::int64_t tolerance_ns = 0;
    std::unique_ptr<dispatch::qpu_link> link;
    // Given to the link, no outcome yet: id -> (start, calibration id) as handed.
    std::map<std::uint64_t, std::pair<std::int64_t, std::uint64_t>> handed;
    bool withdrawals_pending = false;  // withdrawn since the last pump tick (report_withdrawn)
    std::vector<timeline::calibration_window> windows;  // ending after the last refresh
    std::int64_t current_until_ns = 0;  // refresh when now reaches this
    std::uint64_t calibration_id = 0;   // what the link's guard holds
    bool calibration_dirty = true;
    std::optional<event_loop::timer_id> switch_timer;
    std::string endpoint_state = "connecting";
    std::uint64_t completed = 0;
    std::uint64_t sent = 0;  // written to a write-only endpoint: no result
    std::uint64_t failed = 0;
    std::uint64_t missed = 0;
};

// ------------------------------------------------------------------- probes

struct services::probes_state {
#ifdef QRT_HAVE_BPF
    explicit probes_state(qrt_bpf::probe_set p) : set(std::move(p)) {}
    qrt_bpf::probe_set set;
    std::optional<outlier_feed> outliers;  // when probe 3 loaded
    int outlier_fd = -1;                    // its ring buffer's epoll fd, in the loop
    std::uint64_t intrusion_keys_pruned = 0;
    std::size_t intrusion_map_keys = 0;
    std::size_t intrusion_exited_rows = 0;
#endif
};

namespace {

telemetry::labels qpu_labels(const std::string& name, int dispatch_cpu) {
    telemetry::labels l{{"qpu", name}};
    if (dispatch_cpu >= 0) {
        l.emplace_back("cpu", std::to_string(dispatch_cpu));
    }
    return l;
}

json summary_json(const rtcore::histogram& h) {
    const auto s = h.summary();
    return {{"count", s.count},   {"p50_ns", s.p50_ns},   {"p99_ns", s.p99_ns},
            {"p999_ns", s.p999_ns}, {"max_ns", s.max_ns}, {"stddev_ns", s.stddev_ns}};
}

}  // namespace

services::services(event_loop& loop, const config& cfg, host_facts facts)
    : _loop(loop), _cfg(cfg), _facts(std::move(facts)), _handover(handover_timing_for(cfg)) {}

services::~services() { stop(); }

rtcore::status services::start() {
    _started_ns = _clock.now_realtime_ns();
    // a. The durable ledger, recovered before anything may be dispatched.
    if (auto st = open_ledger(); !st) {
        return st;
    }
    // b. The realtime-step watch, armed before anything samples the time
    //    base: each dispatcher converts realtime starts with the offset it
    //    samples in its constructor (step c), so a step between that sample
    //    and an arming done later would go unseen and every deadline would
    //    be off by the step (issue #14: a +2 s step at boot missed all
    //    jobs).  Armed first, any step after this point makes the watch's
    //    fd readable, and the loop re-converts every queued deadline as
    //    soon as it runs.  (The dispatch threads also check the offset
    //    themselves before each send, see dispatcher.hpp.)  The unit is
    //    ordered After=time-sync.target without pulling it in, so a host
    //    that waits for its first synchronisation starts qrtd after the
    //    boot step and one that does not starts at once; see qrtd(8),
    //    CLOCK STEPS.
    if (auto st = start_step_watch(); !st) {
        stop();
        return st;
    }
    // c. One link (endpoint + dispatch thread) per QPU.
    if (auto st = start_links(); !st) {
        stop();
        return st;
    }
    // d. The job pump, lease/missed housekeeping and calibration switches.
    if (auto st = start_timers(); !st) {
        stop();
        return st;
    }
    // e. The eBPF probes: never fatal.
    start_probes();
    // f. The control socket, last: no client is answered before the state
    //    it queries exists.
    if (auto st = start_server(); !st) {
        stop();
        return st;
    }
    return rtcore::ok();
}

rtcore::status services::open_ledger() {
    const std::string path = (_facts.state_dir / "ledger.sqlite").string();
    const std::int64_t now = _clock.now_realtime_ns();
    auto l = timeline::ledger::open(qpu_specs_for(_cfg), ledger_options_for(_cfg), path, now);
    if (!l) {
        return rtcore::error::invalid(fmt::format("ledger: open {}: {}", path, tl_error(l.err())));
    }
    _ledger = std::move(*l);
    // Cancel and preemption change a handed-over job only when its
    // withdrawal from the dispatch thread wins the race with the send.
    timeline::ledger::dispatch_gate gate;
    gate.take = [this](std::uint64_t id) {
        for (auto& q : _qpus) {
            if (q->handed.count(id) != 0) {
                const auto w = q->link->withdraw(id);
                q->withdrawals_pending = q->withdrawals_pending || w == dispatch::dispatcher::withdraw_result::withdrawn;
                return w != dispatch::dispatcher::withdraw_result::too_late;
            }
        }
        return true;  // not handed over: nothing to race
    };
    gate.give_back = [this](std::uint64_t id) {
        for (auto& q : _qpus) {
            if (q->handed.count(id) != 0 && !q->link->restore(id)) {
                // Already dropped by the dispatch thread: its `cancelled`
                // record comes back and the pump hands the job over again.
                log::debug("dispatch", "{}: job {} could not be restored after a withdrawal", q->name, id);
            }
        }
    };
    _ledger->set_dispatch_gate(std::move(gate));
    // Group commit (#15 §1): from here the writer thread owns the database.
    // A change is in memory at once and acknowledged when its group is
    // durable; the listener runs on this loop after every group: it sends
    // the held replies (or store_error for a group that failed and was
    // undone), then publishes the events that became durable and lets the
    // pump hand over what is now on disk (due_jobs holds back the rest).
    _ledger->start_writer([this](std::function<void()> fn) { _loop.post(std::move(fn)); });
    _ledger->set_commit_listener([this](const timeline::commit_notice& n) {
        if (n.failed_to != 0) {
            ++_ledger_errors;
            log::error("timeline",
                       "ledger: the commit of changes {}..{} failed: {}; they were undone (the "
                       "ledger reloaded the database) and their clients got store_error",
                       n.failed_from, n.failed_to, n.why);
        }
        if (_server) {
            _server->on_durable(n.durable_seq, n.failed_from, n.failed_to, n.why);
        }
        publish_ledger_events();
    });
    // What recovery changed (missed, expired, failed) is published once the
    // server is up; count it now for the log.
    const auto st = _ledger->stats();
    log::info("timeline", "ledger {}: {} reservations ({} active), policy {}", path,
              st.reservations, st.active, _ledger->policy().name());
    return rtcore::ok();
}

rtcore::status services::start_step_watch() {
    // Realtime-clock steps re-convert every queued deadline (see start()).
    auto watch = rtcore::realtime_step_watch::open(_clock);
    if (!watch) {
        return rtcore::error{watch.err().code, "clock: realtime_step_watch: " + watch.err().message};
    }
    _step_watch.emplace(std::move(*watch));
    return _loop.add_fd(_step_watch->fd(), EPOLLIN, [this](std::uint32_t) { on_realtime_step(); });
}

// Why a dispatch thread on cpu cannot be real-time on an isolated CPU,
// known before it starts, or "".
std::string services::not_realtime_before_start(int cpu) const {
    if (cpu < 0) {
        return "the QPU has no dispatch CPU (set qpu.dispatch_cpu or host.isolated_cpus); or set "
               "dispatch.require_rt = \"never\"";
    }
    if (!_facts.isolated.test(static_cast<unsigned>(cpu))) {
        return fmt::format("dispatch CPU {} is not isolated (isolated CPUs: {}): set qpu.dispatch_cpu to one of "
                           "them, or host.isolated_cpus to include it; or set dispatch.require_rt = \"never\"",
                           cpu, _facts.isolated.empty() ? std::string("none") : _facts.isolated.to_list());
    }
    if (!_facts.partition_applied) {
        return fmt::format("CPU {} is planned as isolated but no partition is applied: run `qrtd host apply` as "
                           "root (the unit's ExecStartPre=+ does), or start `qrtd run` as root; or set "
                           "dispatch.require_rt = \"never\"",
                           cpu);
    }
    if (!_facts.rt_reachable) {
        return fmt::format("CPU {} cannot be reached: {}", cpu, _facts.rt_reach);
    }
    return "";
}

// Where the dispatch threads are placed, and the thread's cgroup, for errors.
std::string services::placement_text() const {
    rtcore::host_fs fs(_facts.root);
    std::string cg = "unknown";
    if (auto text = fs.read("/proc/self/cgroup")) {
        cg.clear();
        std::string_view rest = *text;
        while (!rest.empty()) {
            const auto nl = rest.find('\n');
            const auto line = rest.substr(0, nl);
            if (line.find("cpuset") != std::string_view::npos || line.substr(0, 3) == "0::") {
                cg += (cg.empty() ? "" : ", ") + std::string(line);
            }
            rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
        }
    }
    return fmt::format("the daemon's cgroup is {}; isolation {}; {}", cg.empty() ? "unknown" : cg,
                       _facts.isolation, _facts.rt_reach.empty() ? "no partition applied" : _facts.rt_reach);
}

rtcore::status services::start_links() {
    for (std::uint32_t i = 0; i < _cfg.qpus.size(); ++i) {
        const auto& qc = _cfg.qpus[i];
        auto q = std::make_unique<qpu_runtime>();
        q->index = i;
        q->name = qc.name;
        q->endpoint = qc.target.uri;
        q->tolerance_ns = qc.effective_job_tolerance_ns(_cfg);
        q->dispatch_cpu = qc.dispatch_cpu >= 0 ? qc.dispatch_cpu
                          : i < _facts.dispatch_cpus.size() ? static_cast<int>(_facts.dispatch_cpus[i])
                                                            : -1;

        dispatch::qpu_link_config lc;
        lc.endpoint = qc.target.uri;
        lc.identity = "qrtd/" + qc.name;
        auto& dc = lc.dispatch;
        dc.qpu_index = i;
        dc.mode = _cfg.dispatch.mode == dispatch_mode::untuned ? dispatch::dispatch_mode::untuned
                                                               : dispatch::dispatch_mode::tuned;
        dc.dispatch_cpu = q->dispatch_cpu;
        if (_cfg.dispatch.priority > 0) {
            dc.rt_priority = _cfg.dispatch.priority;
        }
        dc.hold_cpu_dma_latency = _cfg.dispatch.cpu_dma_latency;
        dc.submit = _cfg.dispatch.submit == submit_mode::sqpoll ? dispatch::submit_mode::sqpoll
                                                                : dispatch::submit_mode::syscall;
        dc.sqpoll_cpu = _cfg.dispatch.sqpoll_cpu;  // -1: the dispatch CPU
        if (_cfg.dispatch.sqpoll_idle_ms > 0) {
            dc.sqpoll_idle_ms = _cfg.dispatch.sqpoll_idle_ms;
        }
        if (_cfg.dispatch.ring_capacity > 0) {
            dc.slots = round_up_pow2(_cfg.dispatch.ring_capacity);
        }
        if (_cfg.dispatch.max_payload_bytes > 0) {
            dc.max_payload_bytes = _cfg.dispatch.max_payload_bytes;
        }
        if (_cfg.dispatch.lead_min_ns > 0) {
            dc.lead.min_ns = _cfg.dispatch.lead_min_ns;
        }
        dc.lead.max_ns = _handover.lead_max_ns;
        if (_cfg.dispatch.lead_margin_ns > 0) {
            dc.lead.margin_ns = _cfg.dispatch.lead_margin_ns;
        }
        if (_cfg.dispatch.lead_quantile > 0) {
            dc.lead.quantile = _cfg.dispatch.lead_quantile;
        }
        dc.lead.initial_ns = std::clamp(dc.lead.initial_ns, dc.lead.min_ns, dc.lead.max_ns);

        if (dc.mode == dispatch::dispatch_mode::tuned) {
            dc.require_rt = _facts.require_rt;
            if (_facts.require_rt) {
                if (auto why = not_realtime_before_start(q->dispatch_cpu); !why.empty()) {
                    _refused_not_realtime = true;
                    return rtcore::error{EPERM, fmt::format("dispatch: qpu {}: dispatch.require_rt ({}): {}", qc.name,
                                                            _facts.require_rt_why, why)};
                }
            }
            if (!_facts.rt_tasks_file.empty() && q->dispatch_cpu >= 0) {
                // cgroup v1: the thread joins the isolated cpuset itself (the
                // kernel sets its allowed CPUs to the cpuset's), then pins.
                const std::string tasks_file = _facts.rt_tasks_file;
                const std::filesystem::path root = _facts.root;
                dc.before_rt_setup = [tasks_file, root](pid_t tid) -> rtcore::status {
                    rtcore::host_fs fs(root);
                    if (auto st = fs.write(tasks_file, std::to_string(tid)); !st) {
                        return rtcore::error{st.err().code,
                                             st.err().message + " (joining the isolated cpuset; `qrtd host apply` "
                                                                "hands that file to agent.user, and the unit makes it "
                                                                "writable with ReadWritePaths=)"};
                    }
                    return rtcore::ok();
                };
            }
        }

        qpu_runtime* qp = q.get();
        dispatch::qpu_link_callbacks cb;
        cb.on_dispatched = [this, qp](std::uint64_t id, std::int64_t sent_ns) { on_dispatched(*qp, id, sent_ns); };
        cb.on_outcome = [this, qp](const dispatch::dispatch_outcome& o) { on_outcome(*qp, o); };
        cb.on_endpoint_state = [qp](bool up, const std::string& reason) {
            qp->endpoint_state = up ? "up" : "down (" + reason + ")";
            if (up) {
                log::info("dispatch", "{}: endpoint {} up", qp->name, qp->endpoint);
            } else {
                log::warn("dispatch", "{}: endpoint {} down: {}", qp->name, qp->endpoint, reason);
            }
        };
        try {
            q->link = std::make_unique<dispatch::qpu_link>(_loop, _clock, lc, std::move(cb));
        } catch (const std::exception& e) {
            return rtcore::error::invalid(fmt::format("qpu {}: {}", qc.name, e.what()));
        }
        // The dispatch thread's TID (for the probes): the task that appears
        // while start() runs, io_uring workers (iou-*) aside.
        const auto before = own_tids();
        auto started = q->link->start();
        if (!started) {
            if (dc.mode == dispatch::dispatch_mode::tuned && dc.require_rt) {
                _refused_not_realtime = true;
                return rtcore::error{started.err().code,
                                     fmt::format("dispatch: qpu {}: dispatch.require_rt ({}): the dispatch thread "
                                                 "cannot run SCHED_FIFO on isolated CPU {}: {}; {}", qc.name,
                                                 _facts.require_rt_why, q->dispatch_cpu,
                                                 q->link->dispatch().setup_error(), placement_text())};
            }
            return rtcore::error{started.err().code, fmt::format("qpu {}: {}", qc.name, started.err().message)};
        }
        for (const pid_t t : own_tids()) {
            if (before.count(t) == 0 && comm_of(t).rfind("iou-", 0) != 0) {
                _dispatch_tids.push_back(t);
                _qpu_of_tid[t] = qc.name;
            }
        }
        const auto& disp = q->link->dispatch();
        const auto ts = disp.thread_stats();
        std::string submit = dispatch::to_string(disp.effective_submit_mode());
        if (disp.effective_submit_mode() == dispatch::submit_mode::sqpoll) {
            _sqpoll_tids.push_back(disp.sqpoll_tid());  // works on the dispatch CPU: not an intrusion
            const int poller_cpu = dc.sqpoll_cpu >= 0 ? dc.sqpoll_cpu : q->dispatch_cpu;
            submit += fmt::format(" (poller tid {}, CPU {})", disp.sqpoll_tid(), poller_cpu);
            if (poller_cpu < 0 || !_facts.isolated.test(static_cast<unsigned>(poller_cpu))) {
                // A SCHED_OTHER poller on a shared CPU waits for its CFS turn:
                // arrival p95 of 1 ms and worse was measured (bench/README.md).
                log::warn("dispatch",
                          "{}: the SQPOLL poller runs on CPU {}, which is not isolated: other tasks there "
                          "delay every write by up to a scheduler slice; isolate it or use submit_mode = "
                          "\"syscall\"",
                          qc.name, poller_cpu < 0 ? std::string("(any)") : std::to_string(poller_cpu));
            }
        } else if (!disp.submit_fallback_reason().empty()) {
            log::warn("dispatch", "{}: {}", qc.name, disp.submit_fallback_reason());
        }
        log::info("dispatch", "{}: endpoint {}, {} mode, CPU {}, {}, submit {}", qc.name, lc.endpoint,
                  to_string(_cfg.dispatch.mode), q->dispatch_cpu,
                  ts.rt_applied ? fmt::format("SCHED_FIFO {}", dc.rt_priority)
                                : std::string("not real-time"),
                  submit);
        if (dc.mode == dispatch::dispatch_mode::tuned && !ts.rt_applied) {
            log::warn("dispatch", "{}: real-time setup failed ({}): dispatching untuned ({}; dispatch.require_rt = "
                                  "\"always\" refuses to start instead)",
                      qc.name, q->link->dispatch().setup_error(), placement_text());
        } else if (dc.mode == dispatch::dispatch_mode::tuned) {
            log::info("dispatch", "{}: dispatch thread tid {} is SCHED_FIFO on CPU {} ({})", qc.name,
                      _dispatch_tids.empty() ? 0 : _dispatch_tids.back(), q->dispatch_cpu, _facts.rt_reach);
        }
        _qpus.push_back(std::move(q));
    }
    return rtcore::ok();
}

rtcore::status services::start_timers() {
    // The job pump: every pump period, due jobs within the horizon go to
    // their link (handover_timing).
    const std::chrono::nanoseconds pump_period(_handover.pump_period_ns);
    auto pump_timer = _loop.add_timer(pump_period, pump_period, [this] { pump(); });
    if (!pump_timer) {
        return std::move(pump_timer).err();
    }
    _timers.push_back(*pump_timer);

    // Leases and the missed backstop: every 100 ms.  Jobs handed to a link
    // get their outcome from it; mark_missed only catches jobs nobody
    // handed over, so its tolerance leaves the link time to report.
    std::int64_t tol = 0;
    for (const auto& q : _qpus) {
        tol = std::max(tol, q->tolerance_ns);
    }
    _missed_backstop_ns = tol + 2'000 * k_ms;
    auto hk = _loop.add_timer(std::chrono::milliseconds(100), std::chrono::milliseconds(100), [this] {
        if (!_engine) {
            return;
        }
        rpc::ledger_housekeeping(*_engine, *_ledger, _clock.now_realtime_ns(), _missed_backstop_ns);
    });
    if (!hk) {
        return std::move(hk).err();
    }
    _timers.push_back(*hk);

    // Forget terminal reservations (with their results and idempotency
    // keys) timeline.retention_ns after their slot ended, memory and store.
    auto forget = _loop.add_timer(std::chrono::minutes(1), std::chrono::minutes(1), [this] {
        const std::int64_t before = _clock.now_realtime_ns() - _cfg.timeline.retention_ns;
        const auto before_stats = _ledger->stats();
        if (auto n = _ledger->forget_terminal(before); !n) {
            log::warn("timeline", "forget_terminal: {}", tl_error(n.err()));
        }
        if (auto c = _ledger->checkpoint(); !c) {
            log::warn("timeline", "checkpoint: {}", tl_error(c.err()));
        }
        // glibc keeps freed memory in its arenas; after a burst of records
        // was forgotten, hand the free pages back so RSS follows the ledger.
        const auto after_stats = _ledger->stats();
        if (after_stats.reservations + after_stats.windows < before_stats.reservations + before_stats.windows) {
            ::malloc_trim(0);
        }
    });
    if (!forget) {
        return std::move(forget).err();
    }
    _timers.push_back(*forget);

    // Recent windows of the histograms and the intrusion map's pruning, on
    // one housekeeping timer (telemetry::recent_windows, qrtd.toml(5) LIMITS).
    _recent = std::make_unique<telemetry::recent_windows>();
    const std::chrono::nanoseconds tick(_recent->tick_ns());
    auto tel = _loop.add_timer(tick, tick, [this] { telemetry_tick(); });
    if (!tel) {
        return std::move(tel).err();
    }
    _timers.push_back(*tel);

    for (auto& q : _qpus) {
        refresh_calibration(*q, _clock.now_realtime_ns());
    }
    return rtcore::ok();
}

void services::start_probes() {
    if (!_cfg.probes.enabled) {
        _probes_status = "unavailable (disabled by probes.enabled = false)";
        return;
    }
#ifdef QRT_HAVE_BPF
    qrt_bpf::probe_config pc;
    pc.isolated_cpus = _facts.isolated;
    pc.intrusions = !_facts.isolated.empty();
    pc.intrusion_exempt_tids = _dispatch_tids;
    for (const pid_t t : _sqpoll_tids) {
        if (t > 0) {
            pc.intrusion_exempt_tids.push_back(t);  // works on the dispatch CPU for the RT thread
        }
    }
    pc.force_raw_tp = _cfg.probes.flavour == probe_flavour::raw_tp;
    if (_cfg.probes.outlier_threshold_ns > 0) {
        pc.outlier_threshold_ns = static_cast<std::uint64_t>(_cfg.probes.outlier_threshold_ns);
    }
    _probes = std::make_unique<probes_state>(qrt_bpf::probe_set::start(pc));
    auto& ps = _probes->set;
    for (const pid_t t : _dispatch_tids) {
        if (auto st = ps.add_tid(t); !st) {
            log::warn("probes", "add dispatch tid {}: {}", t, st.err().message);
        }
    }
    if (auto* op = ps.outliers()) {
        outlier_feed_options fo;
        fo.threshold_ns = pc.outlier_threshold_ns;
        _probes->outliers.emplace(fo);
        if (auto st = _loop.add_fd(op->epoll_fd(), EPOLLIN, [this](std::uint32_t) { drain_outliers(); }); !st) {
            log::warn("probes", "outliers: watch the ring buffer: {}: outliers are not reported",
                      st.err().message);
        } else {
            _probes->outlier_fd = op->epoll_fd();
        }
    }
    _probes_status = ps.availability().to_string();
    if (ps.availability().available()) {
        log::info("probes", "available: {} (dispatch tids {})", ps.describe(),
                  fmt::join(_dispatch_tids, ","));
    } else {
        log::warn("probes", "{}", _probes_status);
    }
#else
    _probes_status = "unavailable (qrtd built without qrt_bpf)";
    log::warn("probes", "{}", _probes_status);
#endif
}

rtcore::status services::start_server() {
    _engine = std::make_unique<rpc::engine>(rpc::engine_limits{
        _cfg.rpc.max_line_bytes > 0 ? _cfg.rpc.max_line_bytes : (1U << 20), 64, 256});
    _hooks.status = [this] { return status_json(); };
    _hooks.telemetry = [this] { return telemetry_snapshot(); };
    _hooks.annotate = [this](telemetry::snapshot& s) {
        if (_recent) {
            _recent->annotate(s, _clock.now_monotonic_ns());
        }
    };
#ifdef QRT_HAVE_BPF
    if (_probes && _probes->outliers) {
        _hooks.outliers = [this](std::size_t limit) {
            std::uint64_t dropped = 0;
            if (auto* op = _probes->set.outliers()) {
                dropped = op->dropped().value_or(0);
            }
            return _probes->outliers->to_json(limit, dropped);
        };
    }
#endif
    rpc::register_agent_methods(*_engine, _hooks);
    rpc::timeline_options to;
    to.now_ns = [this] { return _clock.now_realtime_ns(); };
    to.qpu_details = [this](std::string_view name) {
        for (const auto& q : _qpus) {
            if (q->name == name) {
                return json{{"endpoint", q->endpoint},
                            {"endpoint_up", q->link->endpoint_up()},
                            {"dispatch_cpu", q->dispatch_cpu},
                            {"calibration_id", q->calibration_id},
                            {"min_lead_ns", _handover.min_lead_ns}};
            }
        }
        return json::object();
    };
    if (_cfg.dispatch.max_payload_bytes > 0) {
        to.max_payload_bytes = _cfg.dispatch.max_payload_bytes;
    }
    // [tenants]: priority ceilings and quotas, checked by the methods; the
    // request rate, checked before any handler runs.
    rpc::tenant_policy tp;
    tp.scheduler_max_priority = _cfg.tenants.scheduler_max_priority;
    tp.admin_max_priority = _cfg.tenants.admin_max_priority;
    for (const auto& c : _cfg.tenants.priority_ceilings) {
        tp.priority_ceilings.emplace_back(c.who.text, c.max_priority);
    }
    tp.max_reservations = _cfg.tenants.max_reservations;
    tp.max_booked_ns = _cfg.tenants.max_booked_ns;
    tp.max_payload_bytes = static_cast<std::uint64_t>(_cfg.tenants.max_payload_bytes);
    tp.max_requests_per_s = _cfg.tenants.max_requests_per_s;
    tp.request_burst = _cfg.tenants.request_burst;
    auto limits = rpc::tenant_limits::compile(tp);
    if (!limits) {
        return rtcore::error{limits.err().code, limits.err().message};
    }
    auto shared_limits = std::make_shared<rpc::tenant_limits>(std::move(*limits));
    to.limits = shared_limits;
    _engine->set_admission([shared_limits, this](const rpc::method_info&, rpc::session& s) {
        shared_limits->admit(s, _clock.now_monotonic_ns());
    });
    rpc::register_timeline_methods(*_engine, *_ledger, to);
    // Drained after every handled line, after the ledger's events: hand what
    // the line committed to the dispatch threads now (handover_timing).
    _engine->add_event_source([this] {
        hand_over_now();
        return std::vector<rpc::event>{};
    });

    // An internal subscriber: a calibration change re-reads the windows
    // the links' guards follow.
    _internal.id = UINT64_MAX;
    _internal.tenant = "qrtd";
    _internal.roles = rpc::role_set().with(rpc::role::admin);
    _internal.subscribed = true;
    _internal.topics = {"calibration.changed"};
    _internal.push = [this](std::string_view) {
        for (auto& q : _qpus) {
            q->calibration_dirty = true;
        }
    };
    _engine->attach(_internal);
    _internal_attached = true;

    // A group that does not exist on this host grants nothing (a fresh host
    // has no `qrt` group until the package's sysusers.d runs): it is left
    // out with a warning instead of keeping the agent from starting.
    rpc::role_map rm;
    const auto copy = [](const char* role, const std::vector<principal>& from, std::vector<std::string>& out) {
        for (const auto& p : from) {
            if (p.type == principal::kind::group && !group_exists(p.name)) {
                log::warn("rpc", "roles.{}: group '{}' does not exist on this host: it grants nothing",
                          role, p.name);
                continue;
            }
            out.push_back(p.text);
        }
    };
    copy("reader", _cfg.roles.reader, rm.reader);
    copy("scheduler", _cfg.roles.scheduler, rm.scheduler);
    copy("calibration", _cfg.roles.calibration, rm.calibration);
    copy("admin", _cfg.roles.admin, rm.admin);
    auto auth = rpc::authorizer::compile(rm);
    if (!auth) {
        return rtcore::error{auth.err().code, "roles: " + auth.err().message};
    }
    _auth = std::make_unique<rpc::authorizer>(std::move(*auth));

    rpc::server_options so = control_socket_options(_cfg, _prebound.fd < 0);
    so.prebound = std::exchange(_prebound, rpc::prebound_socket{});
    if (so.prebound.fd < 0) {
        // The socket's directory (/run/qrtd under systemd's RuntimeDirectory=;
        // created here for `qrtd run` by hand).
        if (const auto dir = std::filesystem::path(so.socket_path).parent_path(); !dir.empty()) {
            std::error_code ec;
            if (std::filesystem::create_directories(dir, ec); ec) {
                return rtcore::error{ec.value(), fmt::format("rpc: create_directories {}: {}", dir.string(),
                                                             ec.message())};
            }
        }
    }
    _server = std::make_unique<rpc::server>(_loop, *_engine, *_auth, so);
    rpc::server* srv = _server.get();
    _hooks.transport = [srv] { return srv->stats(); };
    if (!so.metrics_textfile.empty()) {
        rpc::engine* eng = _engine.get();
        _server->set_metrics_source([eng, this] { return rpc::metrics_text(*eng, _hooks); });
    }
    if (auto st = _server->start(); !st) {
        return rtcore::error{st.err().code, "rpc: " + st.err().message};
    }
    log::info("rpc", "listening on {} ({})", so.socket_path, _server->listen_source());
    // Recovery's changes (missed, expired) reach subscribers from now on.
    publish_ledger_events();
    // The first checkpoint of the recent windows: they count from here.
    telemetry_tick();
    return rtcore::ok();
}

void services::stop() noexcept {
    if (_stopped) {
        return;
    }
    _stopped = true;
    try {
        // Reverse order: server, probes, timers, links, ledger.
        if (_server) {
            _server->stop();
        }
#ifdef QRT_HAVE_BPF
        if (_probes && _probes->outlier_fd >= 0) {
            _loop.remove_fd(_probes->outlier_fd);
            _probes->outlier_fd = -1;
        }
#endif
        _probes.reset();
        for (const auto id : _timers) {
            _loop.cancel_timer(id);
        }
        _timers.clear();
        if (_step_watch) {
            _loop.remove_fd(_step_watch->fd());
        }
        for (auto& q : _qpus) {
            if (q->switch_timer) {
                _loop.cancel_timer(*q->switch_timer);
                q->switch_timer.reset();
            }
            if (q->link) {
                q->link->stop();  // unfinished jobs get outcomes (on_outcome)
            }
        }
        if (_internal_attached && _engine) {
            _engine->detach(_internal);
            _internal_attached = false;
        }
        _server.reset();
        for (auto& q : _qpus) {
            q->link.reset();
        }
        _ledger.reset();
    } catch (const std::exception& e) {
        log::error("daemon", "stopping services: {}", e.what());
    }
}

// -------------------------------------------------------------- the pump

void services::pump() noexcept {
    if (_pumping) {
        return;  // publish_ledger_events() below drains the sources, hand_over_now() among them
    }
    _pumping = true;
    try {
        _pumped_generation = _ledger->generation();
        const std::int64_t now = _clock.now_realtime_ns();
        for (auto& q : _qpus) {
            pump_qpu(*q, now);
        }
        publish_ledger_events();
    } catch (const std::exception& e) {
        static log::rate_limiter rl{std::chrono::seconds(10)};
        log::warn_rl(rl, "dispatch", "job pump: {}", e.what());
    }
    _pumping = false;
}

void services::hand_over_now() noexcept {
    if (_ledger && _ledger->generation() != _pumped_generation) {
        pump();
    }
}

void services::refresh_calibration(qpu_runtime& q, std::int64_t now_ns) {
    // Only the windows the pump can hand jobs into (those starting before
    // the hand-over horizon, and the next one): this runs at every window
    // end, so with a 1 ms period, copying every window up to
    // timeline.horizon_ns here was the daemon's CPU.
    auto ws = _ledger->calibration(q.name, now_ns, now_ns + _handover.horizon_ns);
    if (!ws) {
        log::warn("calibration", "{}: {}", q.name, tl_error(ws.err()));
        return;
    }
    q.windows = std::move(*ws);
    q.calibration_dirty = false;
    // The guard follows the window that contains now, or (in a blackout)
    // the next one: it switches at each window's end.
    // With no window at all the guard gets an id that matches no job, so
    // jobs already handed over are refused rather than sent uncalibrated.
    std::uint64_t id = dispatch::no_window_calibration_id;
    std::int64_t until = now_ns + 1'000 * k_ms;
    // A next window that starts exactly at the current one's end takes over
    // at that instant in the guard itself: the first job of that window (T at
    // the boundary) must not race the switch timer below.
    std::uint64_t next_id = id;
    std::int64_t switch_ns = INT64_MAX;
    if (!q.windows.empty()) {
        id = q.windows.front().calibration_id;
        until = q.windows.front().valid_until_ns;
        next_id = id;
        if (q.windows.size() > 1 && q.windows[1].valid_from_ns == until) {
            next_id = q.windows[1].calibration_id;
            switch_ns = until;
        }
    }
    if (id != q.calibration_id) {
        log::debug("calibration", "{}: current calibration id {} (until {})", q.name, id, until);
    }
    q.calibration_id = id;
    q.current_until_ns = until;
    q.link->set_calibration(id, next_id, switch_ns);
    // A one-shot timer at the window's end, so the guard switches on time
    // and not at the next pump tick.
    if (q.switch_timer) {
        _loop.cancel_timer(*q.switch_timer);
        q.switch_timer.reset();
    }
    const auto delay = std::chrono::nanoseconds(std::max<std::int64_t>(until - _clock.now_realtime_ns(), 1));
    qpu_runtime* qp = &q;
    auto t = _loop.add_timer(delay, std::chrono::nanoseconds(0), [this, qp] {
        qp->switch_timer.reset();
        refresh_calibration(*qp, _clock.now_realtime_ns());
    });
    if (t) {
        q.switch_timer = *t;
    }
}

const timeline::calibration_window* services::window_of(qpu_runtime& q, std::int64_t start_ns,
                                                         std::int64_t now_ns) {
    for (int attempt = 0; attempt < 2; ++attempt) {
        const auto it = std::upper_bound(q.windows.begin(), q.windows.end(), start_ns,
                                         [](std::int64_t t, const timeline::calibration_window& w) {
                                             return t < w.valid_until_ns;
                                         });
        if (it != q.windows.end() && it->contains(start_ns)) {
            return &*it;
        }
        if (attempt == 0) {
            refresh_calibration(q, now_ns);
        }
    }
    return nullptr;
}

void services::pump_qpu(qpu_runtime& q, std::int64_t now_ns) {
    if (q.calibration_dirty || now_ns >= q.current_until_ns) {
        refresh_calibration(q, now_ns);
    }
    const auto due = _ledger->due_jobs(q.name, now_ns + _handover.horizon_ns);
    // A handed-over job that is no longer due as handed (cancelled, displaced
    // by preemption, or moved by a calibration change) is withdrawn from the
    // dispatcher, so its old slot is never sent.  A moved job comes back
    // through on_outcome (cancelled, never sent) and is handed over again.
    if (!q.handed.empty()) {
        std::map<std::uint64_t, std::pair<std::int64_t, std::uint64_t>> due_as;
        for (const auto& r : due) {
            due_as.emplace(r.id, std::make_pair(r.start_ns, r.calibration_id));
        }
        for (const auto& [id, as_handed] : q.handed) {
            const auto d = due_as.find(id);
            if (d == due_as.end()) {
                // Beyond the horizon but unchanged: a backward realtime step
                // moved now back.  The dispatcher re-converts its deadline;
                // withdrawing it would only hand it over again later.
                const timeline::reservation* r = _ledger->find(id);
                if (r != nullptr && r->state == timeline::res_state::committed &&
                    std::make_pair(r->start_ns, r->calibration_id) == as_handed) {
                    continue;
                }
            }
            if (d == due_as.end() || d->second != as_handed) {
                q.withdrawals_pending = q.withdrawals_pending ||
                                        q.link->withdraw(id) == dispatch::dispatcher::withdraw_result::withdrawn;
            }
        }
    }
    // The stale copies come back `cancelled` now rather than at their old
    // start, so a re-placed job is handed over again in time.
    if (q.withdrawals_pending) {
        q.link->report_withdrawn();
        q.withdrawals_pending = false;
    }
    for (const auto& r : due) {
        if (q.handed.count(r.id) != 0) {
            continue;
        }
        std::string refuse;
        if (r.start_ns + q.tolerance_ns < now_ns) {
            refuse = fmt::format("missed: start {} passed by {} ns before hand-over (tolerance {} ns)",
                                 r.start_ns, now_ns - r.start_ns, q.tolerance_ns);
            ++_missed_before_handover;
        } else if (const auto* w = window_of(q, r.start_ns, now_ns); w == nullptr) {
            refuse = fmt::format("calibration_changed: no calibration window holds start {}", r.start_ns);
        } else if (w->calibration_id != r.calibration_id) {
            refuse = fmt::format("calibration_changed: placed in calibration {}, the window at start is {}",
                                 r.calibration_id, w->calibration_id);
        } else {
            dispatch::dispatch_job j;
            j.job_id = r.id;
            j.qpu_index = q.index;
            j.scheduled_ns = r.start_ns;
            j.window_start_ns = w->valid_from_ns;
            j.window_end_ns = w->valid_until_ns;
            j.duration_ns = r.duration_ns;
            j.calibration_id = r.calibration_id;
            j.tolerance_ns = q.tolerance_ns;
            j.shots = shots_of(r.payload);
            if (auto st = q.link->submit(j, r.payload); st) {
                q.handed[r.id] = {r.start_ns, r.calibration_id};
                ++_handed_total;
                continue;
            } else {
                refuse = "dispatch_refused: " + st.err().message;
                ++_refused_total;
            }
        }
        ++q.missed;
        if (auto m = _ledger->miss(r.id, refuse, now_ns); !m) {
            ++_ledger_errors;
            log::warn("timeline", "{}: miss job {}: {}", q.name, r.id, tl_error(m.err()));
        } else {
            log::debug("dispatch", "{}: job {} not dispatched: {}", q.name, r.id, refuse);
        }
    }
}

void services::on_dispatched(qpu_runtime& q, std::uint64_t id, std::int64_t sent_ns) {
    if (auto r = _ledger->mark_dispatched(id, sent_ns); !r) {
        // e.g. cancelled after the hand-over: the frame left anyway.
        ++_ledger_errors;
        log::debug("timeline", "{}: mark_dispatched {}: {}", q.name, id, tl_error(r.err()));
    }
    publish_ledger_events();
}

void services::on_outcome(qpu_runtime& q, const dispatch::dispatch_outcome& o) {
    std::optional<std::pair<std::int64_t, std::uint64_t>> as_handed;
    if (const auto h = q.handed.find(o.job_id); h != q.handed.end()) {
        as_handed = h->second;
        q.handed.erase(h);
    }
    const std::int64_t now = _clock.now_realtime_ns();
    const timeline::reservation* r = _ledger ? _ledger->find(o.job_id) : nullptr;
    if (r == nullptr) {
        return;
    }
    // Re-placed after the hand-over (calibration.update or a preemption moved
    // it): the guard refused, or the withdrawal dropped, the stale copy; the
    // pump hands the job over again with its new start and calibration id.
    // Likewise a job withdrawn and then kept (a preemption that gave its
    // victims back, a cancel that could not be stored): not sent, still due.
    const bool withdrawn_kept = o.reason == dispatch::to_string(dispatch::dispatch_status::cancelled);
    if (r->state == timeline::res_state::committed && o.sent_ns == 0 && as_handed &&
        (as_handed->first != r->start_ns || as_handed->second != r->calibration_id || withdrawn_kept) &&
        !_stopped) {
        log::debug("dispatch", "{}: job {} re-placed after hand-over ({}): handing it over again",
                   q.name, o.job_id, o.reason);
        return;
    }
    std::string why = o.reason;
    if (!o.detail.empty()) {
        why += ": " + o.detail;
    }
    if (r->state == timeline::res_state::committed) {
        // Never sent (missed, calibration guard, endpoint down, stopped).
        ++q.missed;
        if (auto m = _ledger->miss(o.job_id, why, now); !m) {
            ++_ledger_errors;
            log::warn("timeline", "{}: miss {}: {}", q.name, o.job_id, tl_error(m.err()));
        }
    } else if (r->state == timeline::res_state::dispatched) {
        if (o.state == dispatch::job_state::completed) {
            ++q.completed;
            if (auto c = _ledger->complete(o.job_id, o.result, now); !c) {
                ++_ledger_errors;
                log::warn("timeline", "{}: complete {}: {}", q.name, o.job_id, tl_error(c.err()));
            }
        } else if (o.state == dispatch::job_state::sent) {
            ++q.sent;
            if (auto s = _ledger->mark_sent(o.job_id, o.detail, now); !s) {
                ++_ledger_errors;
                log::warn("timeline", "{}: mark_sent {}: {}", q.name, o.job_id, tl_error(s.err()));
            }
        } else {
            ++q.failed;
            if (auto f = _ledger->fail(o.job_id, why, now); !f) {
                ++_ledger_errors;
                log::warn("timeline", "{}: fail {}: {}", q.name, o.job_id, tl_error(f.err()));
            }
        }
    }
    publish_ledger_events();
}

void services::publish_ledger_events() {
    if (_engine) {
        _engine->drain_event_sources();
    }
}

void services::on_realtime_step() {
    auto step = _step_watch->check();
    if (!step) {
        log::warn("clock", "realtime step watch: {}", step.err().message);
        return;
    }
    if (!*step) {
        return;
    }
    const auto& s = **step;
    std::size_t n = 0;
    for (auto& q : _qpus) {
        n += q->link->on_realtime_step(s.after);
        q->calibration_dirty = true;
    }
    log::warn("clock", "CLOCK_REALTIME stepped by {} ns: {} queued deadlines re-converted", s.step_ns, n);
}

// ------------------------------------------------- probes on housekeeping

void services::drain_outliers() noexcept {
#ifdef QRT_HAVE_BPF
    try {
        auto* op = _probes ? _probes->set.outliers() : nullptr;
        if (op == nullptr || !_probes->outliers) {
            return;
        }
        auto list = op->poll(0);
        if (!list) {
            static log::rate_limiter rl{std::chrono::seconds(30)};
            log::warn_rl(rl, "probes", "{}", list.err().message);
            return;
        }
        const std::int64_t rt = _clock.now_realtime_ns();
        const std::int64_t mono = _clock.now_monotonic_ns();
        for (const auto& o : *list) {
            // The QPU whose dispatch thread it is.
            const auto it = _qpu_of_tid.find(static_cast<pid_t>(o.tid));
            const std::string qpu = it == _qpu_of_tid.end() ? std::string() : it->second;
            auto data = _probes->outliers->add(o, qpu, rt, mono);
            if (data && _engine) {
                _engine->publish(rpc::event{"outlier", "", std::move(*data)});
            }
        }
    } catch (const std::exception& e) {
        static log::rate_limiter rl{std::chrono::seconds(30)};
        log::warn_rl(rl, "probes", "outliers: {}", e.what());
    }
#endif
}

void services::telemetry_tick() noexcept {
    try {
#ifdef QRT_HAVE_BPF
        if (_probes) {
            if (auto* in = _probes->set.intrusions()) {
                if (auto r = in->prune_exited_tasks()) {
                    _probes->intrusion_keys_pruned += r->pruned;
                    _probes->intrusion_map_keys = r->live_keys;
                    _probes->intrusion_exited_rows = r->exited_rows;
                } else {
                    static log::rate_limiter rl{std::chrono::seconds(60)};
                    log::warn_rl(rl, "probes", "{}", r.err().message);
                }
            }
        }
#endif
        if (_recent && _engine) {
            _recent->observe(rpc::full_snapshot(*_engine, _hooks), _clock.now_monotonic_ns());
        }
    } catch (const std::exception& e) {
        static log::rate_limiter rl{std::chrono::seconds(60)};
        log::warn_rl(rl, "telemetry", "recent windows: {}", e.what());
    }
}

// ------------------------------------------------------ status, telemetry

nlohmann::json services::status_json() {
    json st;
    std::vector<std::string> degraded;
    st["agent_version"] = QRT_VERSION;
    if (utsname u{}; ::uname(&u) == 0) {
        st["hostname"] = u.nodename;
    }
    st["pid"] = ::getpid();
    st["uptime_s"] = static_cast<double>(_clock.now_realtime_ns() - _started_ns) / 1e9;
    st["state_dir"] = _facts.state_dir.string();

    std::vector<unsigned> dcpus;
    for (const auto& q : _qpus) {
        if (q->dispatch_cpu >= 0) {
            dcpus.push_back(static_cast<unsigned>(q->dispatch_cpu));
        }
    }
    st["partition"] = {{"applied", _facts.partition_applied},
                       {"isolation", _facts.isolation},
                       {"isolation_not_used", _facts.isolation_not_used},
                       {"dispatch_placement", _facts.rt_reach},
                       {"require_rt", _facts.require_rt},
                       {"require_rt_why", _facts.require_rt_why},
                       {"isolated_cpus", _facts.isolated.to_list()},
                       {"housekeeping_cpus", _facts.housekeeping.to_list()},
                       {"dispatch_cpus", dcpus}};
    json irqs = json::object();
    for (const auto& [k, v] : _facts.irq_counts) {
        irqs[k] = v;
    }
    irqs["managed_irqs"] = _facts.managed_irqs;
    if (!_facts.irqbalance.empty()) {
        irqs["irqbalance"] = _facts.irqbalance;
    }
    st["irqs"] = irqs;
    json warnings = json::array();
    for (const auto& w : _facts.kernel_warnings) {
        warnings.push_back({{"subsystem", w.subsystem},
                            {"message", w.message},
                            {"fix", w.fix},
                            {"needs_reboot", w.needs_reboot}});
    }
    st["kernel"] = {{"release", _facts.kernel_release.value_or("unknown")},
                    {"preempt_model", _facts.preempt_model},
                    {"warnings", warnings}};
    st["probes"] = _probes_status;
    st["event_loop_errors"] = _loop.callback_errors();
    if (_loop.callback_errors() != 0) {
        degraded.push_back(fmt::format("{} event-loop callbacks threw (see the log)", _loop.callback_errors()));
    }
#ifdef QRT_HAVE_BPF
    if (_probes) {
        st["probes_detail"] = _probes->set.describe();
        if (_probes->outliers) {
            const auto& f = *_probes->outliers;
            json last = f.recent_json(1);
            st["outliers"] = {{"threshold_ns", f.options().threshold_ns},
                              {"total", f.total()},
                              {"kept", f.kept()},
                              {"last", last.empty() ? json(nullptr) : last.front()}};
        }
        if (_probes->set.intrusions()) {
            st["intrusion_map"] = {{"keys", _probes->intrusion_map_keys},
                                   {"max_keys", qrt_bpf::intrusion_probe::max_keys},
                                   {"exited_threads_pruned", _probes->intrusion_keys_pruned},
                                   {"exited_rows", _probes->intrusion_exited_rows}};
        }
    }
#endif
    st["capabilities"] = _facts.capability_notes;

    json qpus = json::array();
    for (const auto& q : _qpus) {
        const auto ts = q->link->dispatch().thread_stats();
        const auto tel = q->link->telemetry();
        json j{{"name", q->name},
               {"endpoint", q->endpoint},
               {"endpoint_up", q->link->endpoint_up()},
               {"endpoint_state", q->endpoint_state},
               {"dispatch_cpu", q->dispatch_cpu},
               {"mode", tel.tuned ? "tuned" : "untuned"},
               {"realtime", ts.rt_applied},
               {"mlocked", ts.mlocked},
               {"locked_bytes", ts.locked_bytes},
               {"cpu_dma_latency_held", ts.dma_latency_held},
               {"lead_ns", tel.lead_ns},
               {"min_lead_ns", _handover.min_lead_ns},
               {"submit_mode", dispatch::to_string(q->link->dispatch().effective_submit_mode())},
               {"send_blocked", ts.send_blocked},
               {"submit_errors", ts.submit_errors},
               {"calibration_id", q->calibration_id},
               {"in_flight", q->handed.size()},
               {"completed", q->completed},
               {"sent", q->sent},
               {"failed", q->failed},
               {"missed", q->missed}};
        {
            // Dispatch lateness, lifetime next to the recent windows.
            telemetry::snapshot one;
            one.add_histogram("qrt_dispatch_lateness_seconds", "", qpu_labels(q->name, q->dispatch_cpu),
                              q->link->histograms().dispatch_lateness);
            if (_recent) {
                _recent->annotate(one, _clock.now_monotonic_ns());
            }
            json lat{{"lifetime", summary_json(*one.histograms.front().ns)}};
            for (const auto& v : one.histograms.front().recent) {
                lat[v.window] = summary_json(*v.ns);
                lat[v.window]["span_ns"] = v.span_ns;
            }
            j["dispatch_lateness"] = std::move(lat);
        }
        if (!q->link->endpoint_up()) {
            j["endpoint_error"] = q->link->last_endpoint_error();
            degraded.push_back(fmt::format("qpu {}: endpoint {} is {}", q->name, q->endpoint,
                                           q->endpoint_state));
        }
        if (tel.tuned && !ts.rt_applied) {
            degraded.push_back(fmt::format("qpu {}: dispatch thread not real-time ({})", q->name,
                                           q->link->dispatch().setup_error()));
        }
        qpus.push_back(std::move(j));
    }
    st["qpus"] = qpus;
    {
        // Locked memory: only the dispatch path is locked (not every
        // client's buffers), so VmLck stays flat under client load.
        const auto m = rtcore::read_process_locked_memory();
        st["memory"] = {{"locked", "dispatch path"},
                        {"vm_lck_bytes", m.vm_lck_bytes},
                        {"vm_pin_bytes", m.vm_pin_bytes},
                        {"dispatch_locked_bytes", rtcore::locked_bytes()}};
    }
    st["dispatch"] = {{"min_lead_ns", _handover.min_lead_ns},
                      {"pump_period_ns", _handover.pump_period_ns},
                      {"handover_horizon_ns", _handover.horizon_ns},
                      {"lead_max_ns", _handover.lead_max_ns},
                      {"handover_margin_ns", _handover.margin_ns}};
    const auto ls = _ledger->stats();
    st["ledger"] = {{"reservations", ls.reservations},
                    {"active", ls.active},
                    {"windows", ls.windows},
                    {"policy", std::string(_ledger->policy().name())},
                    {"handed_to_dispatch", _handed_total},
                    {"store_errors", _ledger_errors}};
    if (_server) {
        st["rpc"] = {{"socket", _server->options().socket_path},
                     {"listen_source", _server->listen_source()},
                     {"connections", _server->connections()}};
    }
    if (_facts.isolated.empty()) {
        degraded.push_back("no isolated CPU: dispatch shares CPUs with housekeeping");
    }
    st["health"] = {{"status", degraded.empty() ? "ok" : "degraded"}, {"reasons", degraded}};
    return st;
}

telemetry::snapshot services::telemetry_snapshot() {
    telemetry::snapshot s;
    s.taken_ns = _clock.now_realtime_ns();
    for (const auto& q : _qpus) {
        const auto tel = q->link->telemetry();
        const auto& h = q->link->histograms();
        const telemetry::labels l = qpu_labels(q->name, q->dispatch_cpu);
        s.add_histogram("qrt_dispatch_lateness_seconds",
                        "send time minus the job's start T (CLOCK_MONOTONIC)", l, h.dispatch_lateness);
        s.add_histogram("qrt_dispatch_arrival_lateness_seconds",
                        "arrival at the QPU endpoint minus T (CLOCK_REALTIME)", l, h.arrival_lateness);
        s.add_histogram("qrt_dispatch_wakeup_latency_seconds",
                        "dispatch thread timer wake-up minus the requested wake-up", l, h.wakeup_latency);
        const auto& c = tel.counters;
        const std::pair<const char*, std::uint64_t> outcomes[] = {
            {"on_time", c.on_time},
            {"late", c.late},
            {"missed", c.missed},
            {"failed", c.failed},
            {"completed", c.completed},
            {"sent", c.sent},
            {"out_of_window", c.out_of_window},
            {"calibration_changed", c.calibration_changed},
            {"endpoint_down", c.endpoint_down},
            {"send_failed", c.send_failed},
            {"endpoint_error", c.endpoint_errors},
            {"endpoint_timeout", c.endpoint_timeouts},
            {"qpu_out_of_window", c.qpu_out_of_window},
        };
        for (const auto& [what, v] : outcomes) {
            auto ll = l;
            ll.emplace_back("outcome", what);
            s.add_counter("qrt_dispatch_jobs_total", "jobs by dispatch outcome", ll, v);
        }
        s.add_counter("qrt_dispatch_submitted_total", "jobs handed to the dispatcher", l, c.submitted);
        s.add_counter("qrt_dispatch_endpoint_reconnects_total", "endpoint reconnects", l, c.reconnects);
        s.add_gauge("qrt_dispatch_lead_seconds", "current spin lead", l, static_cast<double>(tel.lead_ns) / 1e9);
        s.add_gauge("qrt_dispatch_spin_seconds_per_dispatch", "CPU time spent spinning per dispatch", l,
                    tel.spin_ns_per_dispatch / 1e9);
        const auto ts = q->link->dispatch().thread_stats();
        s.add_counter("qrt_dispatch_send_blocked_total",
                      "writes refused at T because the endpoint's buffer was full", l, ts.send_blocked);
        s.add_counter("qrt_dispatch_submit_errors_total", "io_uring submissions that failed on the RT thread", l,
                      ts.submit_errors);
        s.add_gauge("qrt_dispatch_endpoint_up", "1 when the QPU endpoint is connected", l,
                    tel.endpoint_up ? 1.0 : 0.0);
        s.add_gauge("qrt_dispatch_in_flight", "jobs handed over without an outcome yet", l,
                    static_cast<double>(q->handed.size()));
    }
    s.add_counter("qrt_event_loop_callback_errors_total", "exceptions caught from event-loop callbacks", {},
                  _loop.callback_errors());
    {
        const auto m = rtcore::read_process_locked_memory();
        if (m.vm_lck_bytes >= 0) {
            s.add_gauge("qrt_process_locked_bytes",
                        "VmLck: memory locked by the process (the dispatch path only)", {},
                        static_cast<double>(m.vm_lck_bytes));
        }
        if (m.vm_pin_bytes >= 0) {
            s.add_gauge("qrt_process_pinned_bytes",
                        "VmPin: memory the kernel pins (io_uring registered buffers)", {},
                        static_cast<double>(m.vm_pin_bytes));
        }
        s.add_gauge("qrt_dispatch_locked_bytes", "memory the dispatch threads locked, shared pages once",
                    {}, static_cast<double>(rtcore::locked_bytes()));
    }
    if (_ledger) {
        const auto ls = _ledger->stats();
        s.add_gauge("qrt_ledger_reservations", "reservations held in the ledger", {},
                    static_cast<double>(ls.reservations));
        s.add_gauge("qrt_ledger_active_reservations", "held, committed and dispatched reservations", {},
                    static_cast<double>(ls.active));
        s.add_counter("qrt_ledger_preemptions_total", "reservations displaced or moved by preemption", {},
                      ls.preemptions);
        s.add_histogram("qrt_ledger_commit_seconds",
                        "one ledger commit (a group of changes), BEGIN to COMMIT with its fsync", {},
                        _ledger->commit_latency());
        s.add_counter("qrt_ledger_commits_failed_total",
                      "ledger commits that failed (their changes were undone)", {},
                      _ledger->commits_failed());
        s.add_gauge("qrt_ledger_commit_backlog", "ledger changes waiting for their commit", {},
                    static_cast<double>(_ledger->commit_backlog()));
    }
#ifdef QRT_HAVE_BPF
    if (_probes) {
        if (auto* w = _probes->set.wakeup()) {
            if (auto per_cpu = w->read_per_cpu()) {
                for (std::size_t cpu = 0; cpu < per_cpu->size(); ++cpu) {
                    const auto& wh = (*per_cpu)[cpu];
                    if (wh.count == 0) {
                        continue;
                    }
                    s.add_histogram("qrt_probe_wakeup_latency_seconds",
                                    "eBPF: dispatch thread wakeup latency (sched_wakeup to sched_switch)",
                                    {{"cpu", std::to_string(cpu)}}, qrt_bpf::to_rtcore_histogram(wh));
                }
            }
        }
        if (auto* in = _probes->set.intrusions()) {
            if (auto list = in->read()) {
                // Label cardinality stays bounded (issue #14 §3): tasks by
                // command name, at most 32 sources per CPU, the rest "other".
                for (const auto& a : qrt_bpf::aggregate_for_metrics(std::move(*list), 32)) {
                    telemetry::labels l{{"cpu", std::to_string(a.cpu)},
                                        {"kind", std::string(qrt_bpf::to_string(a.kind))},
                                        {"source", a.source}};
                    s.add_counter("qrt_probe_intrusions_total", "eBPF: intrusions on isolated CPUs", l,
                                  a.count);
                    s.add_real_counter("qrt_probe_intrusion_seconds_total",
                                       "eBPF: time taken by intrusions on isolated CPUs", l,
                                       static_cast<double>(a.total_ns) / 1e9);
                    s.add_gauge("qrt_probe_intrusion_max_seconds", "eBPF: longest intrusion", l,
                                static_cast<double>(a.max_ns) / 1e9);
                }
            }
            s.add_gauge("qrt_probe_intrusion_map_keys", "eBPF: keys in the intrusion map (at the last prune)", {},
                        static_cast<double>(_probes->intrusion_map_keys));
            s.add_counter("qrt_probe_intrusion_exited_pruned_total",
                          "eBPF: intrusion-map keys of exited threads pruned (their totals are kept)", {},
                          _probes->intrusion_keys_pruned);
        }
        if (_probes->outliers) {
            std::uint64_t dropped = 0;
            if (auto* op = _probes->set.outliers()) {
                dropped = op->dropped().value_or(0);
            }
            _probes->outliers->add_metrics(s, dropped);
        }
    }
#endif
    return s;
}

}  // namespace qrt
