// The daemon's services, wired: start-up in order, stop in reverse (see
// services.hpp).  The hand-over is agent/src/handover (handover::room),
// status in services_status.cpp, the control socket's start in
// control_socket.cpp.

#include "services.hpp"
#include "services_internal.hpp"

#include <dirent.h>
#include <malloc.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "qrt/dispatch/dispatch_group.hpp"
#include "qrt/dispatch/submit_choice.hpp"
#include "qrt/log.hpp"
#include "qrt/rpc/timeline_methods.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/task_ops.hpp"

#ifdef QRT_HAVE_BPF
#include "outlier_feed.hpp"
#include "qrt_bpf/probe_set.hpp"
#endif

namespace qrt {
namespace {

using services_detail::k_ms;
using services_detail::tl_error;

std::size_t round_up_pow2(std::size_t v) {
    std::size_t p = 1;
    while (p < v) {
        p <<= 1U;
    }
    return p;
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

std::string comm_of(pid_t tid) {
    std::ifstream in(fmt::format("/proc/self/task/{}/comm", tid));
    std::string s;
    std::getline(in, s);
    return s;
}

timeline::ledger_options ledger_options_for(const config& cfg) {
    timeline::ledger_options lo;
    lo.min_lead_ns = handover_timing_for(cfg).min_lead_ns;
    lo.dispatch_mark_reach_ns = handover_timing_for(cfg).plan_horizon_ns;
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
    lo.endpoint_down_horizon_ns = cfg.timeline.endpoint_down_horizon_ns;
    lo.calibration_preempt = cfg.timeline.calibration_preempt == calibration_preempt::held
                                 ? timeline::calibration_preempt::held
                                 : timeline::calibration_preempt::never;
    if (cfg.timeline.calibration_yield_ns > 0) {
        lo.calibration_yield_ns = cfg.timeline.calibration_yield_ns;
    }
    if (cfg.timeline.max_calibration_blocks > 0) {
        lo.max_calibration_blocks = cfg.timeline.max_calibration_blocks;
    }
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


// What an operator can do about an endpoint qrtd cannot reach, from the
// error the connect gave (stated in the endpoint_down refusal and the log).
std::string endpoint_remedy(const std::string& error, const std::string& uri, const std::string& user) {
    const std::string who = user.empty() ? std::string("qrtd's user") : "user " + user;
    if (error.find("Permission denied") != std::string::npos) {
        return fmt::format("{} may not connect to {}: give the endpoint's socket a group {} is in "
                           "(qpu-sim --socket-group {} --socket-mode 0660); qrtd reconnects by itself",
                           who, uri, who, user.empty() ? "qrtd" : user);
    }
    if (error.find("No such file") != std::string::npos ||
        error.find("Connection refused") != std::string::npos) {
        return fmt::format("nothing listens on {}: start the QPU endpoint; qrtd reconnects by itself", uri);
    }
    return fmt::format("check the QPU endpoint {} (agent.status qpus[].endpoint_state); qrtd "
                       "reconnects by itself", uri);
}

}  // namespace

handover_timing handover_timing_for(const config& cfg) {
    handover_timing h;
    h.pump_period_ns = 2 * k_ms;
    const dispatch::lead_config defaults{};
    const std::int64_t lead_min = cfg.dispatch.lead_min_ns > 0 ? cfg.dispatch.lead_min_ns : defaults.min_ns;
    h.lead_max_ns = std::max(cfg.dispatch.lead_max_ns > 0 ? cfg.dispatch.lead_max_ns : defaults.max_ns, lead_min);
    h.margin_ns = cfg.dispatch.handover_margin_ns;
    // Wire version 2: a job's ARM leaves when it is handed over, and must
    // leave arm_lead before its start: the lead, and so the horizon, grow by it.
    for (const auto& q : cfg.qpus) {
        if (q.wire >= 2) {
            h.arm_lead_ns = std::max(h.arm_lead_ns, q.arm_lead_ns);
        }
    }
    h.min_lead_ns = h.pump_period_ns + h.lead_max_ns + h.margin_ns + h.arm_lead_ns;
    // Hand jobs over well before their lead starts: a housekeeping stall
    // shorter than the horizon delays no dispatch already handed over.
    h.horizon_ns = std::max<std::int64_t>(h.min_lead_ns + 20 * k_ms, 250 * k_ms);
    // The plan reaches twice as far: a loop stall up to horizon_ns delays no
    // hand-over of a job planned before it.  Its size per QPU: twice the
    // jobs the dispatch ring can hold (qrtd.toml(5) LIMITS).
    h.plan_horizon_ns = 2 * h.horizon_ns;
    const std::size_t slots = cfg.dispatch.ring_capacity > 0 ? round_up_pow2(cfg.dispatch.ring_capacity)
                                                             : dispatch::dispatcher_config{}.slots;
    h.plan_max_jobs = 2 * slots;
    return h;
}

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
    //    be off by the step (a +2 s step at boot once missed every
    //    job).  Armed first, any step after this point makes the watch's
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
    // Cancel, preemption and calibration updates change a handed-over job
    // only when its withdrawal from the dispatch thread wins the race with
    // the send: through the hand-over room, to the one QPU that holds the
    // job (a hand-over in progress on the pump's thread is either done and
    // withdrawn, or not begun and withheld).
    timeline::ledger::dispatch_gate gate;
    gate.withdraw = [this](std::uint64_t id) {
        return !_room || _room->withdraw(id) != dispatch::dispatcher::withdraw_result::too_late;
    };
    gate.restore = [this](std::uint64_t id) {
        if (_room) {
            _room->restore(id);
        }
    };
    _ledger->set_dispatch_gate(std::move(gate));
    // Group commit: from here the writer thread owns the database.
    // A change is in memory at once and acknowledged when its group is
    // durable; the listener runs on this loop after every group: it takes
    // back the jobs durable too late, plans what is now on disk (due_jobs
    // holds back the rest), sends the held replies (or store_error for a
    // group that failed and was undone), then publishes the events that
    // became durable.
    _ledger->start_writer([this](std::function<void()> fn) { _loop.post(std::move(fn)); });
    _ledger->set_commit_listener([this](const timeline::commit_notice& n) {
        if (n.failed_to != 0) {
            ++_ledger_errors;
            log::error("timeline",
                       "ledger: the commit of changes {}..{} failed: {}; they were undone (the "
                       "ledger reloaded the database) and their clients got store_error",
                       n.failed_from, n.failed_to, n.why);
        }
        if (n.stopped) {
            // Fail-stop: memory may hold what the disk does not, and nothing
            // tells which; the ledger refuses every change and plans none of
            // them.  The held replies get store_error below; the next start
            // reloads what is on disk.
            log::error("timeline", "ledger: stopped: {}; qrtd exits, and its next start reloads the "
                                   "database",
                       _ledger->stopped());
            if (_on_fatal) {
                _on_fatal("ledger stopped: " + _ledger->stopped());
            } else {
                _loop.stop();
            }
        }
        // The hand-over room withdraws the jobs durable too late for their
        // start and plans what is now durable (room::on_commit); the
        // request that made a withdrawn job's change is answered with the
        // refusal instead of the acknowledgement, each request of a batch
        // on its own (false: no reply waits for it, a notification).
        if (_room) {
            for (const auto& j : _room->on_commit(n)) {
                if (_engine) {
                    (void)_engine->refuse_change(j.seq, rpc::late_commit_refusal(j));
                }
            }
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

// The plan's dispatch CPU for QPU i: its own, or, where QPUs share (untuned
// or host.isolation = "none" on a host with fewer spare cores than QPUs,
// see plan_for), CPU i mod n of the plan's n.  -1: no plan.
int services::shared_dispatch_cpu(std::uint32_t i) const {
    if (_facts.dispatch_cpus.empty()) {
        return -1;
    }
    return static_cast<int>(_facts.dispatch_cpus[i % _facts.dispatch_cpus.size()]);
}

rtcore::status services::start_links() {
    // dispatch.submit_mode = "auto" places SQPOLL pollers on spare isolated
    // CPUs (qrt/dispatch/submit_choice.hpp); it needs every QPU's dispatch
    // CPU and, for SMT siblings, the topology of the real host.
    std::vector<unsigned> dispatch_cpus;
    for (std::uint32_t i = 0; i < _cfg.qpus.size(); ++i) {
        const int c = _cfg.qpus[i].dispatch_cpu >= 0 ? _cfg.qpus[i].dispatch_cpu : shared_dispatch_cpu(i);
        dispatch_cpus.push_back(c >= 0 ? static_cast<unsigned>(c) : rtcore::cpu_set::max_cpus);
    }
    std::optional<rtcore::topology> topology;
    if (_facts.root == "/") {
        if (auto t = rtcore::topology::from_system()) {
            topology.emplace(std::move(*t));
        }
    }
    // Every frame pool is registered with io_uring, which locks it: said
    // once, before any QPU starts.  Tuned mode refuses (exit status 3, so
    // systemd does not restart into the same refusal); untuned does
    // without registered buffers.
    bool said_pool_shortfall = false;
    if (!_cfg.qpus.empty()) {
        const std::string why = dispatch::frame_pool_shortfall(frame_pool_bytes(_cfg), _cfg.qpus.size(),
                                                               rtcore::current_memlock_allowance());
        if (!why.empty() && _cfg.dispatch.mode != dispatch_mode::untuned) {
            _refused_not_realtime = true;
            return rtcore::error{ENOMEM, "dispatch: tuned mode cannot lock its frame buffers: " + why +
                                             "; or run dispatch.mode = \"untuned\""};
        }
        if (!why.empty()) {
            log::warn("dispatch", "untuned: frame buffers not registered with io_uring (plain writes): {}", why);
            said_pool_shortfall = true;
        }
    }
    // Tuned QPUs on one dispatch CPU (dispatch.qpus_per_cpu > 1, host plan)
    // share one dispatch thread there (qrt/dispatch/dispatch_group.hpp):
    // group_of[i] = the [[qpu]] indices on QPU i's CPU, when more than one.
    std::vector<std::vector<std::uint32_t>> group_of(_cfg.qpus.size());
    if (_cfg.dispatch.mode != dispatch_mode::untuned && _cfg.dispatch.qpus_per_cpu > 1) {
        for (std::uint32_t i = 0; i < _cfg.qpus.size(); ++i) {
            for (std::uint32_t k = 0; k < _cfg.qpus.size(); ++k) {
                if (dispatch_cpus[i] != rtcore::cpu_set::max_cpus && dispatch_cpus[k] == dispatch_cpus[i]) {
                    group_of[i].push_back(k);
                }
            }
            if (group_of[i].size() > _cfg.dispatch.qpus_per_cpu) {
                return rtcore::error::invalid(fmt::format(
                    "dispatch: {} QPUs on dispatch CPU {}, dispatch.qpus_per_cpu = {} allows {}: give them "
                    "more CPUs (qpu.dispatch_cpu) or raise dispatch.qpus_per_cpu",
                    group_of[i].size(), dispatch_cpus[i], _cfg.dispatch.qpus_per_cpu, _cfg.dispatch.qpus_per_cpu));
            }
            if (group_of[i].size() < 2) {
                group_of[i].clear();
            }
        }
    }
    // Starts QPU qr's link (its dispatcher's thread too, unless its group
    // runs it) and says how it runs; before: the process's threads before
    // the dispatch thread started.
    const auto start_qpu = [&](qpu_runtime& qr, const std::set<pid_t>& before) -> rtcore::status {
        const auto& qc = _cfg.qpus[qr.index];
        const auto& disp = qr.link->dispatch();
        const auto& dc = disp.config();
        auto started = qr.link->start();
        if (!started) {
            if (dc.mode == dispatch::dispatch_mode::tuned && dc.require_rt) {
                _refused_not_realtime = true;
                return rtcore::error{started.err().code,
                                     fmt::format("dispatch: qpu {}: dispatch.require_rt ({}): the dispatch thread "
                                                 "cannot run SCHED_FIFO on isolated CPU {}: {}; {}", qc.name,
                                                 _facts.require_rt_why, qr.dispatch_cpu,
                                                 disp.setup_error(), placement_text())};
            }
            return rtcore::error{started.err().code, fmt::format("qpu {}: {}", qc.name, started.err().message)};
        }
        for (const pid_t t : own_tids()) {
            if (before.count(t) == 0 && comm_of(t).rfind("iou-", 0) != 0) {
                if (_qpu_of_tid.count(t) == 0) {
                    _dispatch_tids.push_back(t);
                    _qpu_of_tid[t] = qc.name;
                } else {
                    _qpu_of_tid[t] += "+" + qc.name;  // one thread serving the QPUs of a dispatch group
                }
            }
        }
        const auto ts = disp.thread_stats();
        std::string submit = dispatch::to_string(disp.effective_submit_mode());
        if (disp.effective_submit_mode() == dispatch::submit_mode::sqpoll) {
            _sqpoll_tids.push_back(disp.sqpoll_tid());  // works on the dispatch CPU: not an intrusion
            const int poller_cpu = dc.sqpoll_cpu >= 0 ? dc.sqpoll_cpu : qr.dispatch_cpu;
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
        if (!disp.fixed_buffers() && !said_pool_shortfall) {
            log::warn("dispatch", "{}: {}", qc.name, disp.buffers_fallback_reason());
        }
        log::info("dispatch", "{}: endpoint {}, {} mode, CPU {}, {}, submit {}{}", qc.name, qc.target.uri,
                  to_string(_cfg.dispatch.mode), qr.dispatch_cpu,
                  ts.rt_applied ? fmt::format("SCHED_FIFO {}", dc.rt_priority)
                                : std::string("not real-time"),
                  submit,
                  disp.group() != nullptr ? fmt::format(", dispatch thread shared by {} QPUs on this CPU",
                                                        group_of[qr.index].size())
                                          : std::string());
        if (dc.mode == dispatch::dispatch_mode::tuned && !ts.rt_applied) {
            log::warn("dispatch", "{}: real-time setup failed ({}): dispatching untuned ({}; dispatch.require_rt = "
                                  "\"always\" refuses to start instead)",
                      qc.name, disp.setup_error(), placement_text());
        } else if (dc.mode == dispatch::dispatch_mode::tuned) {
            log::info("dispatch", "{}: dispatch thread tid {} is SCHED_FIFO on CPU {} ({})", qc.name,
                      _dispatch_tids.empty() ? 0 : _dispatch_tids.back(), qr.dispatch_cpu, _facts.rt_reach);
        }
        return rtcore::ok();
    };
    for (std::uint32_t i = 0; i < _cfg.qpus.size(); ++i) {
        const auto& qc = _cfg.qpus[i];
        auto q = std::make_unique<qpu_runtime>();
        q->index = i;
        q->name = qc.name;
        q->endpoint = qc.target.uri;
        q->tolerance_ns = qc.effective_job_tolerance_ns(_cfg);
        q->dispatch_cpu = qc.dispatch_cpu >= 0 ? qc.dispatch_cpu : shared_dispatch_cpu(i);

        dispatch::qpu_link_config lc;
        lc.endpoint = qc.target.uri;
        lc.identity = "qrtd/" + qc.name;
        lc.wire_version = static_cast<unsigned>(qc.wire);
        lc.arm_lead_ns = qc.arm_lead_ns;
        lc.budgeted_arm_lead_ns = _handover.arm_lead_ns;
        auto& dc = lc.dispatch;
        dc.qpu_index = i;
        dc.mode = _cfg.dispatch.mode == dispatch_mode::untuned ? dispatch::dispatch_mode::untuned
                                                               : dispatch::dispatch_mode::tuned;
        dc.dispatch_cpu = q->dispatch_cpu;
        if (_cfg.dispatch.priority > 0) {
            dc.rt_priority = _cfg.dispatch.priority;
        }
        dc.hold_cpu_dma_latency = _cfg.dispatch.cpu_dma_latency;
        const auto choice = dispatch::choose_submit(
            _cfg.dispatch.submit == submit_mode::automatic ? dispatch::submit_request::automatic
            : _cfg.dispatch.submit == submit_mode::sqpoll  ? dispatch::submit_request::sqpoll
                                                           : dispatch::submit_request::syscall,
            _cfg.dispatch.sqpoll_cpu, dc.mode == dispatch::dispatch_mode::tuned, i, dispatch_cpus,
            _facts.isolated, topology ? &*topology : nullptr);
        dc.submit = choice.mode;
        dc.sqpoll_cpu = choice.poller_cpu;  // -1: the dispatch CPU
        if (!group_of[i].empty() && dc.submit != dispatch::submit_mode::syscall) {
            dc.submit = dispatch::submit_mode::syscall;
            log::info("dispatch", "{}: submit mode syscall: its dispatch thread serves {} QPUs on CPU {} "
                                  "(dispatch.qpus_per_cpu), which sqpoll does not support",
                      qc.name, group_of[i].size(), q->dispatch_cpu);
        } else {
            log::info("dispatch", "{}: submit mode {}: {}", qc.name, dispatch::to_string(choice.mode), choice.why);
        }
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
        cb.on_dispatched = [this, qp](std::uint64_t id, std::int64_t sent_ns) {
            if (_room) {
                _room->on_dispatched(qp->index, id, sent_ns);
            }
        };
        cb.on_arm = [this, qp](std::uint64_t id, dispatch::arm_event e) {
            if (_room) {
                _room->on_arm(qp->index, id, e);
            }
        };
        cb.on_outcome = [this, qp](const dispatch::dispatch_outcome& o) {
            if (_room) {
                _room->on_outcome(qp->index, o);
            }
        };
        cb.on_endpoint_state = [this, qp](bool up, const std::string& reason) {
            qp->endpoint_state = up ? "up" : "down (" + reason + ")";
            const std::string remedy = up ? std::string() : endpoint_remedy(reason, qp->endpoint, _cfg.agent.user);
            if (up) {
                log::info("dispatch", "{}: endpoint {} up", qp->name, qp->endpoint);
            } else {
                log::warn("dispatch", "{}: endpoint {} down: {}; {}", qp->name, qp->endpoint, reason, remedy);
            }
            // Requests within timeline.endpoint_down_horizon_ns are refused
            // while it is down; subscribers hear of it now.
            _ledger->set_endpoint_state(qp->name, up, reason, remedy, _clock.now_realtime_ns());
            publish_ledger_events();
        };
        // The learned arm lead beyond what min_lead_ns budgets: no start on
        // this QPU is offered or acknowledged that its endpoint could not
        // be armed for (the pump and the plan reach that much further too).
        cb.on_extra_lead = [this, qp](std::int64_t extra_ns) {
            log::info("dispatch", "{}: the learned arm lead needs {} ms more than min_lead_ns; the earliest start "
                                  "offered on it moves by as much",
                      qp->name, extra_ns / 1'000'000);
            _ledger->set_extra_lead(qp->name, extra_ns, _clock.now_realtime_ns());
        };
        try {
            q->link = std::make_unique<dispatch::qpu_link>(_loop, _clock, lc, std::move(cb));
        } catch (const std::exception& e) {
            return rtcore::error::invalid(fmt::format("qpu {}: {}", qc.name, e.what()));
        }
        // The dispatch thread's TID (for the probes): the task that appears
        // while start() runs, io_uring workers (iou-*) aside.
        qpu_runtime& qr = *q;
        _qpus.push_back(std::move(q));
        if (group_of[i].empty()) {
            if (auto st = start_qpu(qr, own_tids()); !st) {
                return st;
            }
            continue;
        }
        if (group_of[i].back() != i) {
            continue;  // started with the last QPU of its group
        }
        // The group's members, in [[qpu]] order, all created by now.
        std::vector<dispatch::dispatcher*> members;
        std::vector<qpu_runtime*> runtimes;
        for (const std::uint32_t k : group_of[i]) {
            for (auto& other : _qpus) {
                if (other->index == k) {
                    members.push_back(&other->link->dispatch_for_group());
                    runtimes.push_back(other.get());
                }
            }
        }
        try {
            _groups.push_back(std::make_unique<dispatch::dispatch_group>(std::move(members)));
        } catch (const std::exception& e) {
            return rtcore::error::invalid(fmt::format("qpu {}: {}", qc.name, e.what()));
        }
        const auto before = own_tids();
        if (auto st = _groups.back()->start(); !st) {
            if (dc.require_rt) {
                _refused_not_realtime = true;
                return rtcore::error{st.err().code,
                                     fmt::format("dispatch: qpu {}: dispatch.require_rt ({}): the dispatch thread "
                                                 "of its group cannot run SCHED_FIFO on isolated CPU {}: {}; {}",
                                                 qc.name, _facts.require_rt_why, qr.dispatch_cpu,
                                                 _groups.back()->setup_error(), placement_text())};
            }
            return rtcore::error{st.err().code, fmt::format("qpu {}: {}", qc.name, st.err().message)};
        }
        for (qpu_runtime* r : runtimes) {
            if (auto st = start_qpu(*r, before); !st) {
                return st;
            }
        }
    }
    return rtcore::ok();
}

rtcore::status services::start_timers() {
    // The hand-over room (qrt/handover/room.hpp): the job pump on its own
    // thread (job_pump.hpp), and its plan on the loop: every pump period,
    // and whenever the commit listener makes changes durable (on_durable),
    // the room takes the pump's reports and publishes each QPU's plan; the
    // pump hands over from the newest plan.
    std::vector<handover::qpu_target> targets;
    for (auto& q : _qpus) {
        targets.push_back({q->index, q->name, q->link.get(), q->tolerance_ns});
    }
    handover::room::options ro;
    ro.plan_horizon_ns = _handover.plan_horizon_ns;
    ro.plan_max_jobs = _handover.plan_max_jobs;
    ro.handover_ns = _handover.pump_period_ns + _handover.lead_max_ns;
    _room = std::make_unique<handover::room>(_loop, *_ledger, _clock, ro, std::move(targets),
                                             [this] { publish_ledger_events(); });
    job_pump::options po;
    po.period_ns = _handover.pump_period_ns;
    po.horizon_ns = _handover.horizon_ns;
    // SCHED_FIFO 1 (job_pump.hpp says why); untuned, the comparison mode,
    // runs nothing real-time.
    po.priority = _cfg.dispatch.mode == dispatch_mode::untuned ? 0 : 1;
    po.cpus = _facts.housekeeping;
    for (const auto& q : _qpus) {
        if (q->dispatch_cpu >= 0) {
            po.cpus.reset(static_cast<unsigned>(q->dispatch_cpu));
        }
    }
    // Each QPU's hand-over table: the current and the next plan, what was
    // released and not yet forgotten, and what the gate withheld
    // (qrtd.toml(5) LIMITS, dispatch.plan_max_jobs).
    po.max_jobs = 4 * _handover.plan_max_jobs;
    if (auto st = _room->start(po); !st) {
        return st;
    }
    const std::chrono::nanoseconds pump_period(_handover.pump_period_ns);
    auto plan_timer = _loop.add_timer(pump_period, pump_period, [this] { _room->sync(); });
    if (!plan_timer) {
        return std::move(plan_timer).err();
    }
    _timers.push_back(*plan_timer);
    if (auto st = start_loop_stall_hook(); !st) {
        return st;
    }

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
        log_dispatch_placement();
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

    return rtcore::ok();
}

// A test hook, never set in production: QRTD_TEST_LOOP_STALL="EVERY_MS:STALL_MS"
// blocks the event loop for STALL_MS every EVERY_MS, as a burst of commits or
// a slow client would, to show that the pump's hand-overs do not wait for the
// loop (tests/integration/e2e/test_pump_stall.py).  Logged as a warning.
rtcore::status services::start_loop_stall_hook() {
    const char* spec = std::getenv("QRTD_TEST_LOOP_STALL");
    if (spec == nullptr || *spec == '\0') {
        return rtcore::ok();
    }
    unsigned every_ms = 0;
    unsigned stall_ms = 0;
    if (std::sscanf(spec, "%u:%u", &every_ms, &stall_ms) != 2 || every_ms == 0 || stall_ms >= every_ms) {
        return rtcore::error::invalid(fmt::format(
            "daemon: QRTD_TEST_LOOP_STALL=\"{}\": expected EVERY_MS:STALL_MS with STALL_MS < EVERY_MS; unset it",
            spec));
    }
    log::warn("daemon", "QRTD_TEST_LOOP_STALL: the event loop blocks {} ms every {} ms (a test hook)", stall_ms,
              every_ms);
    auto t = _loop.add_timer(std::chrono::milliseconds(every_ms), std::chrono::milliseconds(every_ms),
                             [stall_ms] { std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms)); });
    if (!t) {
        return std::move(t).err();
    }
    _timers.push_back(*t);
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

void services::stop() noexcept {
    if (_stopped) {
        return;
    }
    _stopped = true;
    try {
        // Reverse order: server, probes, timers, pump, links, ledger.
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
        // The pump first: once its thread is joined nothing else produces
        // into the rings; its last reports go into the ledger.
        if (_room) {
            _room->stop();
        }
        // Shared dispatch threads first: their members' records are then
        // drained by each link's stop.
        for (auto& g : _groups) {
            g->stop();
        }
        for (auto& q : _qpus) {
            if (q->link) {
                q->link->stop();  // unfinished jobs get outcomes (on_outcome)
            }
        }
        _groups.clear();  // before the dispatchers they serve go

        _server.reset();
        _room.reset();  // before the links it points at
        for (auto& q : _qpus) {
            q->link.reset();
        }
        if (_ledger) {
            // Every outcome is recorded: a clean stop (ledger::close).
            _ledger->close();
        }
        _ledger.reset();
    } catch (const std::exception& e) {
        log::error("daemon", "stopping services: {}", e.what());
    }
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
    }
    if (_room) {
        _room->on_calibration_all();
    }
    log::warn("clock", "CLOCK_REALTIME stepped by {} ns: {} queued deadlines re-converted", s.step_ns, n);
}

}  // namespace qrt
