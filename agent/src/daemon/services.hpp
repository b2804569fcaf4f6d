#pragma once
// The daemon's services (step 9 of daemon::run): the durable ledger, one
// qpu_link (dispatch thread + endpoint) per QPU, the hand-over room that
// feeds the links from the ledger (qrt/handover/room.hpp: the job pump and
// its tables), the housekeeping timers, the eBPF probes and the control
// socket.  Everything runs on the housekeeping event loop except the
// dispatch threads (one per QPU, SCHED_FIFO on an isolated CPU) and the job
// pump (one thread, SCHED_FIFO 1 on the housekeeping CPUs; job_pump.hpp says
// what it shares with the loop and the bound it keeps).
//
//   qrt::services svc(loop, cfg, facts);
//   if (auto st = svc.start(); !st) { ... }   // in the order written in start()
//   loop.run();
//   svc.stop();                               // reverse order
//
// Private to the daemon (agent/src/daemon); the tests drive it through
// `qrtd run` and the socket.

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qrt/config.hpp"
#include "qrt/dispatch/dispatch_group.hpp"
#include "qrt/dispatch/qpu_link.hpp"
#include "qrt/event_loop.hpp"
#include "qrt/handover/room.hpp"
#include "qrt/rpc/engine.hpp"
#include "qrt/rpc/methods.hpp"
#include "qrt/rpc/server.hpp"
#include "qrt/telemetry.hpp"
#include "qrt/timeline/ledger.hpp"
#include "rtcore/clock.hpp"
#include "rtcore/cpu_set.hpp"
#include "rtcore/kernel_probe.hpp"

namespace qrt {

// What steps 1-6 of the startup learned about the host, for agent.status.
struct host_facts {
    std::filesystem::path state_dir;
    bool partition_applied = false;      // by this process
    std::string isolation;               // "cgroup2", "applied by qrtd host apply", "not applied" ...
    rtcore::cpu_set isolated;
    rtcore::cpu_set housekeeping;
    std::vector<unsigned> dispatch_cpus;  // index = QPU index
    // IRQ summary of the apply (empty when not applied here).
    std::map<std::string, std::size_t> irq_counts;  // action -> count
    std::vector<std::string> managed_irqs;           // "24 (nvme0q1)"
    std::string irqbalance;
    std::optional<std::string> kernel_release;
    std::string preempt_model;
    std::vector<rtcore::warning> kernel_warnings;
    std::vector<std::string> capability_notes;  // e.g. CAP_BPF not permitted
    // How the dispatch threads reach their isolated CPUs (rtcore::rt_reach,
    // see the DESIGN comment in rtcore/isolation.hpp): cgroup v1, each one
    // writes its TID into rt_tasks_file (host path) before pinning itself;
    // otherwise it pins itself.  rt_reach is the sentence agent.status and
    // the log show; isolation_not_used the methods not used, with why.
    std::filesystem::path root = "/";
    std::string isolated_cgroup;
    std::string rt_tasks_file;
    bool rt_reachable = false;
    std::string rt_reach;
    std::vector<std::string> isolation_not_used;
    // dispatch.require_rt resolved ("auto" decided at startup), and why.
    bool require_rt = false;
    std::string require_rt_why;
};

// The hand-over contract between the ledger and the dispatch threads, in one
// place.  The job pump (its own thread, job_pump.hpp) runs every
// pump_period_ns and hands each committed job to its dispatch thread once its
// start is within horizon_ns; the dispatch thread (which takes jobs in any
// start order) wakes lead_max_ns at most before T.  The pump works from a
// plan the event loop builds from the ledger and publishes right after the
// request line that made a job durable, and at every pump period: every
// durable committed job starting within plan_horizon_ns, at most
// plan_max_jobs per QPU.  A job is dispatchable when its hand-over, after
// any housekeeping stall up to handover_margin_ns (the ledger's fsync before
// the acknowledgement, the plan's publication), still comes before
// T - lead_max:
//
//   min_lead_ns = pump_period_ns + lead_max_ns + handover_margin_ns
//
// The ledger never offers or accepts a start earlier than now + min_lead_ns
// (ledger_options::min_lead_ns); agent.status and qpus.list state it.  A
// loop stall shorter than plan_horizon_ns - horizon_ns delays no hand-over
// of a job planned before it (the pump keeps handing over from the plan it
// has).
struct handover_timing {
    std::int64_t pump_period_ns = 0;
    std::int64_t horizon_ns = 0;       // > min_lead_ns: jobs are handed over well before T
    std::int64_t plan_horizon_ns = 0;  // 2 x horizon_ns: what the loop plans ahead
    std::size_t plan_max_jobs = 0;     // per QPU: 2 x the dispatch ring's slots
    std::int64_t lead_max_ns = 0;      // the dispatch threads' largest spin lead
    std::int64_t margin_ns = 0;        // dispatch.handover_margin_ns
    std::int64_t arm_lead_ns = 0;      // the largest qpu.arm_lead_ns of a wire = 2 QPU
    std::int64_t min_lead_ns = 0;
};
handover_timing handover_timing_for(const config& cfg);

// The control socket's settings from [rpc] (an unknown socket_group is
// dropped, with a warning when warn).  `qrtd run` as root binds with them
// before it drops to agent.user; services::start_server uses them too.
rpc::server_options control_socket_options(const config& cfg, bool warn = true);

class services {
public:
    services(event_loop& loop, const config& cfg, host_facts facts);
    ~services();
    services(const services&) = delete;
    services& operator=(const services&) = delete;

    // A listening socket bound before the privilege drop (see
    // rpc::server_options::prebound); start_server listens on it.
    void use_prebound_socket(rpc::prebound_socket s) { _prebound = s; }
    // Called (on the loop) when the daemon must stop and exit with a
    // failure: the ledger stopped (a failed commit whose reload failed
    // too).  Unset: the loop is stopped.
    void on_fatal(std::function<void(std::string why)> fn) { _on_fatal = std::move(fn); }

    // Opens the ledger, arms the realtime-step watch, starts the links,
    // pump, timers, probes and the server, in that order.  On error, what was started is stopped.
    rtcore::status start();
    // start() failed because dispatch.require_rt refused to run degraded
    // (the daemon exits with exit_code::not_realtime).
    bool refused_not_realtime() const { return _refused_not_realtime; }
    // Server, probes, timers, links (unfinished jobs get outcomes), ledger.
    void stop() noexcept;

    nlohmann::json status_json();
    telemetry::snapshot telemetry_snapshot();

private:
    struct qpu_runtime;

    rtcore::status open_ledger();
    rtcore::status start_step_watch();
    int shared_dispatch_cpu(std::uint32_t i) const;
    rtcore::status start_links();
    rtcore::status start_timers();
    rtcore::status start_loop_stall_hook();
    void start_probes();
    std::string not_realtime_before_start(int cpu) const;
    std::string placement_text() const;
    rtcore::status start_server();

    void publish_ledger_events();
    void on_realtime_step();
    // Probe 3's ring buffer is readable: log, keep, count and publish.
    void drain_outliers() noexcept;
    // Every recent-window slice (10 s): checkpoint the histograms, prune
    // exited threads from the intrusion map.
    void telemetry_tick() noexcept;
    void log_dispatch_placement();

    event_loop& _loop;
    const config& _cfg;
    host_facts _facts;
    rtcore::real_clock _clock;
    std::int64_t _started_ns = 0;

    std::unique_ptr<timeline::ledger> _ledger;
    std::vector<std::unique_ptr<qpu_runtime>> _qpus;
    // Dispatch threads shared by the QPUs on one CPU (dispatch.qpus_per_cpu);
    // stopped and destroyed before the links whose dispatchers they serve.
    std::vector<std::unique_ptr<dispatch::dispatch_group>> _groups;
    std::vector<pid_t> _dispatch_tids;
    std::map<pid_t, std::string> _qpu_of_tid;  // dispatch TID -> QPU name (outlier events)
    std::vector<pid_t> _sqpoll_tids;  // sqpoll submit mode: the io_uring pollers (not intrusions)
    handover_timing _handover;
    // The hand-over (agent/src/handover): the job pump, the per-QPU
    // hand-over tables, the plans, the outcomes, the guards' calibration.
    std::unique_ptr<handover::room> _room;
    std::int64_t _missed_backstop_ns = 0;

    std::optional<rtcore::realtime_step_watch> _step_watch;
    std::vector<event_loop::timer_id> _timers;

    struct probes_state;
    std::unique_ptr<probes_state> _probes;
    std::unique_ptr<telemetry::recent_windows> _recent;
    std::string _probes_status = "unavailable (not started)";

    std::unique_ptr<rpc::engine> _engine;
    rpc::agent_hooks _hooks;
    std::unique_ptr<rpc::authorizer> _auth;
    std::unique_ptr<rpc::server> _server;
    rpc::prebound_socket _prebound;

    std::uint64_t _ledger_errors = 0;  // the commit listener's; the room counts its own
    bool _stopped = false;
    std::function<void(std::string why)> _on_fatal;
    bool _refused_not_realtime = false;
};

}  // namespace qrt
