// What the services say about themselves: agent.status, telemetry.snapshot
// (and so `metrics`), and the probes' feed on the housekeeping loop (the
// outlier ring buffer, the recent-window checkpoints).

#include "services.hpp"
#include "services_internal.hpp"

#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "qrt/log.hpp"
#include "qrt/proto/protocol.hpp"
#include "qrt/proto/wire.h"
#include "rtcore/memory_lock.hpp"

#ifdef QRT_HAVE_BPF
#include "qrt_bpf/histogram_convert.hpp"
#include "qrt_bpf/intrusion.hpp"
#endif

namespace qrt {
namespace {

using json = nlohmann::json;

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

// What the dispatch threads found of their own placement (they do not log:
// they only count).  Every 100 ms, on the loop.
void services::log_dispatch_placement() {
    for (auto& q : _qpus) {
        const auto ts = q->link->dispatch().thread_stats();
        if (ts.placement_lost > q->placement_lost_logged) {
            log::warn("dispatch",
                      "{}: the dispatch thread found itself moved off CPU {} or not SCHED_FIFO {} more "
                      "time(s) ({} in all, re-pinned itself {} times; now {} on CPU {}): something "
                      "changes its affinity (taskset, a tool that sweeps tasks off isolated CPUs)",
                      q->name, q->dispatch_cpu, ts.placement_lost - q->placement_lost_logged, ts.placement_lost,
                      ts.repinned, ts.placement_ok ? "back" : "still not", ts.cpu_seen);
            q->placement_lost_logged = ts.placement_lost;
        }
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
        const auto hc = _room ? _room->counts(q->index) : handover::qpu_counts{};
        json j{{"name", q->name},
               {"endpoint", q->endpoint},
               {"endpoint_up", q->link->endpoint_up()},
               {"endpoint_state", q->endpoint_state},
               {"dispatch_cpu", q->dispatch_cpu},
               {"mode", tel.tuned ? "tuned" : "untuned"},
               // Measured by the thread itself, not the set-up flag: a
               // thread something moved off its CPU is not real-time.
               {"realtime", ts.rt_applied && ts.placement_ok},
               {"placement",
                {{"on_dispatch_cpu", ts.placement_ok},
                 {"cpu_seen", ts.cpu_seen},
                 {"checks", ts.placement_checks},
                 {"found_moved", ts.placement_lost},
                 {"repinned", ts.repinned}}},
               {"mlocked", ts.mlocked},
               {"locked_bytes", ts.locked_bytes},
               {"cpu_dma_latency_held", ts.dma_latency_held},
               {"lead_ns", tel.lead_ns},
               {"min_lead_ns", _handover.min_lead_ns},
               {"submit_mode", dispatch::to_string(q->link->dispatch().effective_submit_mode())},
               {"send_blocked", ts.send_blocked},
               {"submit_errors", ts.submit_errors},
               {"calibration_id", hc.calibration_id},
               {"in_flight", hc.in_flight},
               {"completed", hc.completed},
               {"sent", hc.sent},
               {"failed", hc.failed},
               {"missed", hc.missed}};
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
        j["wire"] = tel.wire_version;
        if (tel.wire_version >= 2) {
            // Where the time goes: ARM -> ARMED (and the endpoint's own
            // cost), then the start at the endpoint after T.
            j["arm"] = {{"lead_ns", tel.arm_lead_ns},
                        {"lead_floor_ns", tel.arm_lead_floor_ns},
                        {"sent", tel.arms_sent},
                        {"armed", tel.armed},
                        {"refused", tel.arm_refused},
                        {"not_armed", tel.not_armed},
                        {"disarms_sent", tel.disarms_sent},
                        // Now, of the jobs in flight: ARM sent, and ARMED (the
                        // hand-over table's arm column).
                        {"now_arming", hc.arming},
                        {"now_armed", hc.armed},
                        {"arm_to_armed", summary_json(q->link->histograms().arm_latency)},
                        {"endpoint_cost", summary_json(q->link->histograms().arm_cost)},
                        {"start_lateness", summary_json(q->link->histograms().start_lateness)}};
            json by_stage = json::object();
            for (std::size_t i = 0; i < dispatch::dispatch_histograms::arm_stages; ++i) {
                if (const auto& sh = q->link->histograms().arm_stage_cost[i]; sh.count() > 0) {
                    by_stage[std::string(proto::wire_stages[QRT_WIRE_STAGE_PARSE + i])] = summary_json(sh);
                }
            }
            j["arm"]["endpoint_cost_by_stage"] = std::move(by_stage);
        }
        if (!q->link->endpoint_up()) {
            j["endpoint_error"] = q->link->last_endpoint_error();
            degraded.push_back(fmt::format("qpu {}: endpoint {} is {}", q->name, q->endpoint,
                                           q->endpoint_state));
        }
        if (tel.tuned && !ts.rt_applied) {
            degraded.push_back(fmt::format("qpu {}: dispatch thread not real-time ({})", q->name,
                                           q->link->dispatch().setup_error()));
        } else if (tel.tuned && !ts.placement_ok) {
            degraded.push_back(fmt::format("qpu {}: dispatch thread is not SCHED_FIFO alone on CPU {} (last seen "
                                           "on CPU {}; moved {} times, re-pinned itself {} times)",
                                           q->name, q->dispatch_cpu, ts.cpu_seen, ts.placement_lost, ts.repinned));
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
    const auto rc = _room ? _room->counts() : handover::room_counts{};
    if (const auto pst = _room ? _room->pump_state() : std::nullopt) {
        // The job pump's own thread (job_pump.hpp): how late its ticks came
        // and how long a pass took, at most, since the start.
        const auto& ps = *pst;
        st["dispatch"]["pump"] = {{"thread", ps.sched},
                                  {"ticks", ps.ticks},
                                  {"ticks_skipped", ps.ticks_skipped},
                                  {"max_tick_lateness_ns", ps.max_lateness_ns},
                                  {"max_pass_ns", ps.max_work_ns},
                                  {"max_plan_publish_ns", rc.max_plan_publish_ns},
                                  {"plan_jobs", ps.plan_jobs},
                                  // The plans the loop published last, not yet taken maybe.
                                  {"plan_published_jobs", rc.published_jobs},
                                  {"plan_max_jobs_per_qpu", _handover.plan_max_jobs},
                                  {"plan_horizon_ns", _handover.plan_horizon_ns},
                                  {"plans_taken", ps.plans_taken},
                                  {"handed", rc.handed},
                                  // Jobs whose start (+ tolerance) had passed when the pump
                                  // came to hand them over: the housekeeping side was late.
                                  // A job missed by the dispatch thread itself (it woke
                                  // past T + tolerance) counts in the QPU's "missed" only.
                                  {"missed_before_handover", rc.missed_before_handover},
                                  {"refused_by_dispatcher", rc.refused_by_dispatcher},
                                  // Jobs left to the next pass (2 ms) because the storage the
                                  // loop sized for the pump was full (it never allocates).
                                  {"deferred", ps.deferred},
                                  // Hand-over table transitions refused (handover_table.hpp): 0
                                  // unless the loop and the pump disagree on a job, a bug.
                                  {"refused_transitions", ps.refused_transitions}};
        if (_cfg.dispatch.mode != dispatch_mode::untuned && ps.sched.rfind("SCHED_FIFO", 0) != 0 && ps.ticks > 0) {
            degraded.push_back("job pump not real-time: " + ps.sched);
        }
    }
    const auto ls = _ledger->stats();
    st["ledger"] = {{"reservations", ls.reservations},
                    {"active", ls.active},
                    {"windows", ls.windows},
                    {"policy", std::string(_ledger->policy().name())},
                    {"handed_to_dispatch", rc.handed},
                    {"store_errors", _ledger_errors + rc.ledger_errors}};
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
        if (tel.wire_version >= 2) {
            s.add_histogram("qrt_dispatch_arm_seconds", "ARM sent to ARMED read (wire 2)", l, h.arm_latency);
            // The endpoint's own cost from ARMED: in all, then by stage
            // (a stage the endpoint never reported is left out).
            auto total = l;
            total.emplace_back("stage", "total");
            s.add_histogram("qrt_dispatch_arm_cost_seconds", "the endpoint's arm cost from ARMED (wire 2)", total,
                            h.arm_cost);
            for (std::size_t i = 0; i < dispatch::dispatch_histograms::arm_stages; ++i) {
                if (h.arm_stage_cost[i].count() == 0) {
                    continue;
                }
                auto ll = l;
                ll.emplace_back("stage", std::string(proto::wire_stages[QRT_WIRE_STAGE_PARSE + i]));
                s.add_histogram("qrt_dispatch_arm_cost_seconds", "the endpoint's arm cost from ARMED (wire 2)", ll,
                                h.arm_stage_cost[i]);
            }
            s.add_histogram("qrt_dispatch_start_lateness_seconds",
                            "the endpoint's started_ns minus T (wire 2, CLOCK_REALTIME)", l, h.start_lateness);
        }
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
        if (tel.wire_version >= 2) {
            s.add_gauge("qrt_dispatch_arm_lead_seconds", "learned arm lead (wire 2)", l,
                        static_cast<double>(tel.arm_lead_ns) / 1e9);
            s.add_counter("qrt_dispatch_arms_total", "ARM frames sent (wire 2)", l, tel.arms_sent);
            s.add_counter("qrt_dispatch_armed_total", "ARMED answers (wire 2)", l, tel.armed);
            s.add_counter("qrt_dispatch_arm_refused_total", "jobs refused at ARM (wire 2)", l, tel.arm_refused);
            s.add_counter("qrt_dispatch_not_armed_total", "jobs not armed by T, never fired (wire 2)", l,
                          tel.not_armed);
            s.add_counter("qrt_dispatch_disarms_total", "DISARM frames sent (wire 2)", l, tel.disarms_sent);
        }
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
                    static_cast<double>(_room ? _room->counts(q->index).in_flight : 0));
    }
    s.add_counter("qrt_event_loop_callback_errors_total", "exceptions caught from event-loop callbacks", {},
                  _loop.callback_errors());
    if (const auto pst = _room ? _room->pump_state() : std::nullopt) {
        const auto& ps = *pst;
        s.add_counter("qrt_pump_ticks_total", "job pump ticks (one per pump period)", {}, ps.ticks);
        s.add_gauge("qrt_pump_max_tick_lateness_seconds", "job pump: the latest a tick woke after its absolute time, "
                    "since the start", {}, static_cast<double>(ps.max_lateness_ns) / 1e9);
        s.add_gauge("qrt_pump_max_pass_seconds", "job pump: longest pass over every QPU, since the start", {},
                    static_cast<double>(ps.max_work_ns) / 1e9);
        s.add_gauge("qrt_pump_plan_jobs", "jobs in the hand-over plans the pump holds", {},
                    static_cast<double>(ps.plan_jobs));
    }
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
        s.add_counter("qrt_ledger_late_commits_total",
                      "jobs whose commit became durable too late for their start: refused, not acknowledged", {},
                      _room ? _room->counts().late_commits : 0);
        s.add_gauge("qrt_calibration_blocks", "live calibration blocks (yielding, scheduled, started)", {},
                    static_cast<double>(ls.live_blocks));
        // Each QPU's next calibration block (the one in force, else the
        // next to start): absent when none.
        const std::int64_t now = rtcore::realtime_now_ns();
        for (const auto& qpu : _ledger->qpu_names()) {
            if (const auto b = _ledger->next_block(qpu, now)) {
                s.add_gauge("qrt_calibration_next_start_seconds",
                            "start of the QPU's next calibration block (the one in force, else the next), "
                            "Unix time",
                            {{"qpu", qpu}}, static_cast<double>(b->start_ns) / 1e9);
                s.add_gauge("qrt_calibration_next_duration_seconds", "length of the QPU's next calibration block",
                            {{"qpu", qpu}}, static_cast<double>(b->duration_ns) / 1e9);
            }
        }
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
                // Label cardinality stays bounded for months of running: tasks by
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
