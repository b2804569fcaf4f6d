// The rows of qrtd's option table.  See qrt/config_table.hpp.

#include "qrt/config_table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "config_checks.hpp"

namespace qrt {
namespace {

using namespace config_checks;  // the rows' syntax checks (config_checks.hpp)

// ---- struct field <-> option_value, by field type -------------------------

template <typename T>
void assign(T& dst, const option_value& v) {
    if constexpr (std::is_same_v<T, bool>) {
        dst = std::get<bool>(v);
    } else if constexpr (std::is_enum_v<T>) {
        dst = *enum_from_string<T>(std::get<std::string>(v));
    } else if constexpr (std::is_integral_v<T>) {
        dst = static_cast<T>(std::get<std::int64_t>(v));
    } else if constexpr (std::is_same_v<T, double>) {
        dst = std::holds_alternative<double>(v) ? std::get<double>(v)
                                                : static_cast<double>(std::get<std::int64_t>(v));
    } else if constexpr (std::is_same_v<T, std::string>) {
        dst = std::get<std::string>(v);
    } else if constexpr (std::is_same_v<T, std::optional<rtcore::cpu_set>>) {
        const auto& text = std::get<std::string>(v);
        if (text == "auto") {
            dst.reset();
        } else {
            dst = *rtcore::cpu_set::parse_list(text);
        }
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
        dst = std::get<std::vector<std::string>>(v);
    } else if constexpr (std::is_same_v<T, std::vector<principal>>) {
        dst.clear();
        for (const auto& s : std::get<std::vector<std::string>>(v)) {
            dst.push_back(*parse_principal(s));
        }
    } else if constexpr (std::is_same_v<T, std::vector<priority_ceiling>>) {
        dst.clear();
        for (const auto& s : std::get<std::vector<std::string>>(v)) {
            dst.push_back(*parse_priority_ceiling(s));
        }
    } else if constexpr (std::is_same_v<T, endpoint>) {
        dst = *parse_endpoint(std::get<std::string>(v));
    } else {
        static_assert(sizeof(T) == 0, "no option_value conversion for this field type");
    }
}

template <typename T>
option_value extract(const T& src) {
    if constexpr (std::is_same_v<T, bool>) {
        return src;
    } else if constexpr (std::is_enum_v<T>) {
        return std::string(to_string(src));
    } else if constexpr (std::is_integral_v<T>) {
        return static_cast<std::int64_t>(src);
    } else if constexpr (std::is_same_v<T, double>) {
        return src;
    } else if constexpr (std::is_same_v<T, std::string>) {
        return src;
    } else if constexpr (std::is_same_v<T, std::optional<rtcore::cpu_set>>) {
        return src ? src->to_list() : std::string("auto");
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
        return src;
    } else if constexpr (std::is_same_v<T, std::vector<principal>>) {
        std::vector<std::string> out;
        for (const auto& p : src) {
            out.push_back(p.text);
        }
        return out;
    } else if constexpr (std::is_same_v<T, std::vector<priority_ceiling>>) {
        std::vector<std::string> out;
        for (const auto& c : src) {
            out.push_back(c.text);
        }
        return out;
    } else if constexpr (std::is_same_v<T, endpoint>) {
        return src.uri;
    } else {
        static_assert(sizeof(T) == 0, "no option_value conversion for this field type");
    }
}

template <auto Section, auto Field>
void store_field(config& c, qpu_config& /*unused*/, const option_value& v) {
    assign((c.*Section).*Field, v);
}
template <auto Section, auto Field>
option_value load_field(const config& c, const qpu_config& /*unused*/) {
    return extract((c.*Section).*Field);
}
template <auto Field>
void store_qpu(config& /*unused*/, qpu_config& q, const option_value& v) {
    assign(q.*Field, v);
}
template <auto Field>
option_value load_qpu(const config& /*unused*/, const qpu_config& q) {
    return extract(q.*Field);
}

// socket_mode is written as an octal string ("0660") and kept as bits.
void store_socket_mode(config& c, qpu_config& /*unused*/, const option_value& v) {
    c.rpc.socket_mode = static_cast<unsigned>(std::stoul(std::get<std::string>(v), nullptr, 8));
}
option_value load_socket_mode(const config& c, const qpu_config& /*unused*/) {
    return fmt::format("{:04o}", c.rpc.socket_mode);
}

template <typename E>
std::vector<std::string_view> names_of() {
    const auto& n = enum_names<E>::names;
    return {n.begin(), n.end()};
}

constexpr std::int64_t us = 1000;
constexpr std::int64_t ms = 1000 * us;
constexpr std::int64_t sec = 1000 * ms;
constexpr std::int64_t hour = 3600 * sec;

#define QRT_FIELD(sec_, field_)                                       \
    .store = store_field<&config::sec_, &sec_##_config::field_>,      \
    .load = load_field<&config::sec_, &sec_##_config::field_>
#define QRT_QPU_FIELD(field_) \
    .store = store_qpu<&qpu_config::field_>, .load = load_qpu<&qpu_config::field_>

std::vector<config_option> build_table() {
    using k = option_kind;
    using strings = std::vector<std::string>;
    return {
        // ---------------------------------------------------------------- agent
        {.section = "agent", .key = "state_dir", .kind = k::string,
         .default_value = std::string(QRT_DEFAULT_STATE_DIR),
         .meaning = "The daemon's own state: the durable reservation ledger, its single-instance "
                    "lock, and a read-only summary of the host partition that root writes for "
                    "agent.status.  Owned by agent.user: systemd creates it (StateDirectory=qrtd), "
                    "and `qrtd run` started as root creates or hands it over (mode 0750).  Nothing "
                    "in it is ever replayed by root; the restore journal lives in "
                    "host.journal_dir.",
         .check = check_absolute_path, QRT_FIELD(agent, state_dir)},
        {.section = "agent", .key = "user", .kind = k::string, .default_value = std::string("qrtd"),
         .meaning = "The user `qrtd run` becomes after its root-only setup (apply the partition, "
                    "start the root restore helper, bind the socket), keeping only CAP_SYS_NICE, "
                    "CAP_BPF and CAP_PERFMON.  systemd-sysusers creates it from "
                    "sysusers.d/qrtd.conf.  \"root\" keeps uid 0 (with a warning; the capabilities "
                    "are dropped all the same).  Ignored when qrtd does not start as root.",
         .check = check_user_name, QRT_FIELD(agent, user)},
        {.section = "agent", .key = "group", .kind = k::string, .default_value = std::string("qrt"),
         .meaning = "The group `qrtd run` becomes with agent.user (with the user's supplementary "
                    "groups).  Empty: the user's primary group.",
         .check = check_optional_group_name, QRT_FIELD(agent, group)},
        {.section = "agent", .key = "log_level", .kind = k::enumeration,
         .default_value = std::string("info"), .allowed = names_of<log_level>(),
         .meaning = "Least severe message that is logged.  --log-level overrides it.",
         .store = [](config& c, qpu_config&, const option_value& v) { assign(c.agent.level, v); },
         .load = [](const config& c, const qpu_config&) { return extract(c.agent.level); }},
        {.section = "agent", .key = "watchdog", .kind = k::boolean, .default_value = true,
         .meaning = "Send WATCHDOG=1 to systemd at half of WatchdogSec= when the unit sets one.",
         QRT_FIELD(agent, watchdog)},

        // ----------------------------------------------------------------- host
        {.section = "host", .key = "apply_on_run", .kind = k::boolean, .default_value = true,
         .meaning = "When `qrtd run` starts as root, apply the host partition itself and "
                    "restore it on exit.  Under systemd, ExecStartPre=+qrtd host apply does "
                    "this instead and qrtd run finds it applied.",
         QRT_FIELD(host, apply_on_run)},
        {.section = "host", .key = "isolated_cpus", .kind = k::cpu_list,
         .default_value = std::string("auto"),
         .meaning = "CPUs reserved for the dispatch threads.  \"auto\" isolates one whole core "
                    "per QPU, preferring cores near locality_device.  An explicit list is "
                    "widened to whole cores (SMT siblings together) and must leave at least "
                    "housekeeping_min_cores cores for housekeeping.",
         QRT_FIELD(host, isolated_cpus)},
        {.section = "host", .key = "housekeeping_min_cores", .kind = k::integer,
         .default_value = std::int64_t{1}, .min = 1, .max = 4096,
         .meaning = "Whole cores that always stay for housekeeping: the event loop, the RPC "
                    "server, IRQs and every other task of the host.",
         QRT_FIELD(host, housekeeping_min_cores)},
        {.section = "host", .key = "isolation", .kind = k::enumeration,
         .default_value = std::string("auto"), .allowed = names_of<isolation_mode>(),
         .meaning = "How the isolated CPUs are kept free of other tasks.  \"auto\" takes the "
                    "first that works of: cgroup2 (cpuset.cpus.partition=isolated), cgroup1 "
                    "(a cpuset with sched_load_balance=0), fence (move every movable task off "
                    "the isolated CPUs).  \"none\" leaves scheduling alone.",
         QRT_FIELD(host, isolation)},
        {.section = "host", .key = "pin_irqs", .kind = k::boolean, .default_value = true,
         .meaning = "Move every IRQ and /proc/irq/default_smp_affinity to the housekeeping "
                    "CPUs.  Managed IRQs, which the kernel does not let move, are reported.",
         QRT_FIELD(host, pin_irqs)},
        {.section = "host", .key = "irq_verify_interval_s", .kind = k::integer,
         .default_value = std::int64_t{10}, .min = 0, .max = 86400,
         .meaning = "Seconds between checks that re-pin IRQs which drifted or appeared after "
                    "start (hot-plugged devices, drivers loaded later).  0 disables them.",
         QRT_FIELD(host, irq_verify_interval_s)},
        {.section = "host", .key = "journal_dir", .kind = k::string,
         .default_value = std::string(QRT_DEFAULT_JOURNAL_DIR),
         .meaning = "Root-owned directory (root:root 0700; tmpfiles.d and `qrtd host apply` create "
                    "it) of everything the root helpers read or replay: the restore journal, "
                    "journals of earlier boots, the host lock and the report of the last restore.  "
                    "It must not be inside agent.state_dir, and every parent must be owned by root "
                    "and not writable by others; a wrong owner or mode is refused.  A journal is "
                    "at most 64 MiB with lines of at most 64 KiB.",
         .check = check_absolute_path, QRT_FIELD(host, journal_dir)},
        {.section = "host", .key = "lock_wait_s", .kind = k::integer,
         .default_value = std::int64_t{30}, .min = 0, .max = 3600,
         .meaning = "Seconds a host command, or `qrtd run` as root, waits for the host lock held by "
                    "another qrtd (the restore helper of a daemon that was just killed, say), "
                    "reporting progress every 2 s.  0: fail at once.",
         QRT_FIELD(host, lock_wait_s)},
        {.section = "host", .key = "locality_device", .kind = k::string,
         .default_value = std::string(""),
         .meaning = "PCI bus id (\"0000:3b:00.0\") or network interface (\"eth1\") that the "
                    "QPU control electronics hang off; isolated cores near it are preferred.  "
                    "Empty: no preference.",
         .check = check_device_name, QRT_FIELD(host, locality_device)},
        {.section = "host", .key = "runtime_knobs", .kind = k::string_list,
         .default_value = strings{"workqueues", "kthreads", "vm_stat_interval", "timer_migration",
                                  "watchdog_cpumask"},
         .meaning = "Runtime knobs of tuned's cpu-partitioning profile that apply sets for the isolated "
                    "CPUs after isolation, journals first and restore puts back byte for byte; `host "
                    "plan` lists each with its before and after value, `host verify` sets a drifted one "
                    "again.  \"workqueues\": /sys/devices/virtual/workqueue/cpumask and every "
                    "workqueue's own cpumask (writeback too) to the housekeeping CPUs, so unbound "
                    "kworkers leave the isolated ones.  \"kthreads\": movable kernel threads get the "
                    "housekeeping CPUs; per-CPU ones are recorded, never retried.  \"vm_stat_interval\": "
                    "vm.stat_interval = 10 (the per-CPU vmstat work wakes each CPU every 10 s, not every "
                    "second).  \"timer_migration\": kernel.timer_migration = 0 (idle CPUs no longer send "
                    "their timers to a busy isolated CPU).  \"watchdog_cpumask\": "
                    "kernel.watchdog_cpumask = the housekeeping CPUs (the lockup watchdog's timer, work "
                    "and NMI leave the isolated CPUs; tuned's nmi_watchdog = 0 would stop it on every "
                    "CPU).  \"mce_ignore_ce\" (not by default): machinecheck*/ignore_ce = 1 stops the "
                    "5-minute corrected-error poll timer but also corrected-error reporting.  A knob the "
                    "kernel lacks is reported absent and skipped; one it refuses is reported and left.",
         .check = check_runtime_knob, QRT_FIELD(host, runtime_knobs)},
        {.section = "host", .key = "disable_rt_throttling", .kind = k::boolean, .default_value = false,
         .meaning = "Also set kernel.sched_rt_runtime_us = -1 and, where the kernel has a fair server "
                    "(/sys/kernel/debug/sched/fair_server), its runtime on the isolated CPUs to 0, "
                    "journaled and restored like the runtime knobs.  Off: both are only reported.  A "
                    "SCHED_FIFO thread that never sleeps can then starve the per-CPU kernel work of "
                    "its CPU.",
         QRT_FIELD(host, disable_rt_throttling)},

        // ------------------------------------------------------------- dispatch
        {.section = "dispatch", .key = "mode", .kind = k::enumeration,
         .default_value = std::string("tuned"), .allowed = names_of<dispatch_mode>(),
         .meaning = "\"tuned\": dispatch threads run SCHED_FIFO on isolated CPUs, mlocked, "
                    "with timer slack 1 ns, sleeping to T - lead and spinning to T.  "
                    "\"untuned\": a plain SCHED_OTHER thread that sleeps to T, the baseline "
                    "the jitter report compares against.",
         QRT_FIELD(dispatch, mode)},
        {.section = "dispatch", .key = "priority", .kind = k::integer,
         .default_value = std::int64_t{80}, .min = 1, .max = 99,
         .meaning = "SCHED_FIFO priority of the dispatch threads.  Keep it below the kernel's "
                    "threaded IRQ handlers the QPU path needs (50 by default on PREEMPT_RT is "
                    "lower, so raise those or lower this).",
         QRT_FIELD(dispatch, priority)},
        {.section = "dispatch", .key = "lead_min_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{10 * us}, .min = 0, .max = 10 * ms,
         .meaning = "Least spin lead: a dispatch thread wakes at least this long before the "
                    "slot start and spins the rest.",
         QRT_FIELD(dispatch, lead_min_ns)},
        {.section = "dispatch", .key = "lead_max_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{500 * us}, .min = 0, .max = 100 * ms,
         .meaning = "Largest spin lead, whatever the observed wakeup latency; bounds the CPU "
                    "burned per dispatch.",
         QRT_FIELD(dispatch, lead_max_ns)},
        {.section = "dispatch", .key = "lead_quantile", .kind = k::real,
         .default_value = 0.999, .min_real = 0.5, .max_real = 1.0,
         .meaning = "The spin lead adapts to this quantile of the observed wakeup latency "
                    "(plus lead_margin_ns), clamped to lead_min_ns..lead_max_ns.",
         QRT_FIELD(dispatch, lead_quantile)},
        {.section = "dispatch", .key = "lead_margin_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{5 * us}, .min = 0, .max = 10 * ms,
         .meaning = "Added to the wakeup-latency quantile to get the spin lead.",
         QRT_FIELD(dispatch, lead_margin_ns)},
        {.section = "dispatch", .key = "miss_tolerance_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{100 * us}, .min = 0, .max = 10 * sec,
         .meaning = "A job whose slot start has passed by more than this is never sent late: "
                    "it is marked missed, with the reason.  A [[qpu]] may override it with "
                    "job_tolerance_ns.",
         QRT_FIELD(dispatch, miss_tolerance_ns)},
        {.section = "dispatch", .key = "handover_margin_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{10 * ms}, .min = 0, .max = 10 * sec,
         .meaning = "Allowance for the housekeeping side between acknowledging a job and handing "
                    "it to its dispatch thread (the ledger's fsync, a burst of requests).  The "
                    "minimum lead is the job pump's period (2 ms) + lead_max_ns + this: no start "
                    "earlier than now + minimum lead is offered by slots.query or accepted by "
                    "slots.reserve and jobs.submit, so every acknowledged job can be dispatched.  "
                    "agent.status and qpus.list state it as min_lead_ns.",
         QRT_FIELD(dispatch, handover_margin_ns)},
        {.section = "dispatch", .key = "ring_capacity", .kind = k::integer,
         .default_value = std::int64_t{1024}, .min = 2, .max = 65536,
         .meaning = "Job descriptors in each lock-free ring between the housekeeping thread "
                    "and a dispatch thread, allocated at start.  A power of two.",
         QRT_FIELD(dispatch, ring_capacity)},
        {.section = "dispatch", .key = "max_payload_bytes", .kind = k::integer,
         .default_value = std::int64_t{65536}, .min = 1, .max = 16 * 1024 * 1024,
         .meaning = "Largest job payload.  Each ring slot owns a buffer of this size, "
                    "allocated and locked in memory at start.",
         QRT_FIELD(dispatch, max_payload_bytes)},
        {.section = "dispatch", .key = "cpu_dma_latency", .kind = k::boolean,
         .default_value = true,
         .meaning = "Hold /dev/cpu_dma_latency at 0 while running, keeping CPUs out of deep "
                    "idle states whose exit latency would delay a wakeup.",
         QRT_FIELD(dispatch, cpu_dma_latency)},
        {.section = "dispatch", .key = "submit_mode", .kind = k::enumeration,
         .default_value = std::string("auto"), .allowed = names_of<submit_mode>(),
         .meaning = "How a dispatch thread hands its write to the kernel at T.  \"auto\": "
                    "\"sqpoll\" with the poller on an isolated CPU that dispatches no QPU (an "
                    "SMT sibling of the dispatch CPU first), so the RT thread does not pay the "
                    "cross-CPU wake-up of the endpoint's reader; \"syscall\" when no such CPU "
                    "is isolated (or dispatch.sqpoll_cpu, when set, places the poller).  \"syscall\": "
                    "io_uring_enter from the dispatch thread (the frame leaves at once; the "
                    "system call's cost is in the dispatch lateness).  \"sqpoll\": an io_uring "
                    "SQPOLL kernel thread issues the write and the dispatch thread only "
                    "publishes it (lateness of a few hundred ns), at the price of a context "
                    "switch before the frame leaves and a CPU kept busy by the poller.  See "
                    "bench/README.md for both measured side by side.",
         QRT_FIELD(dispatch, submit)},
        {.section = "dispatch", .key = "sqpoll_cpu", .kind = k::integer,
         .default_value = std::int64_t{-1}, .min = -1, .max = 4095,
         .meaning = "submit_mode = \"sqpoll\": the CPU of the kernel poller.  -1 puts it on each "
                    "QPU's dispatch CPU, where it runs only while the dispatch thread sleeps "
                    "and keeps that CPU out of idle.",
         QRT_FIELD(dispatch, sqpoll_cpu)},
        {.section = "dispatch", .key = "sqpoll_idle_ms", .kind = k::integer,
         .default_value = std::int64_t{100}, .min = 1, .max = 60000,
         .meaning = "submit_mode = \"sqpoll\": the poller busy-polls this long after its last "
                    "write, then sleeps; the dispatch thread wakes it at T - lead, before the "
                    "send, so a sleeping poller costs one system call ahead of T.",
         QRT_FIELD(dispatch, sqpoll_idle_ms)},
        {.section = "dispatch", .key = "qpus_per_cpu", .kind = k::integer,
         .default_value = std::int64_t{1}, .min = 1, .max = 4,
         .meaning = "mode = \"tuned\": how many QPUs may share one isolated CPU and one dispatch "
                    "thread when the host cannot spare an isolated core per QPU.  1 (the default): "
                    "every QPU has its own CPU and thread, and a host without enough cores is "
                    "refused.  2..4: `qrtd host plan` gives the QPUs as few CPUs as it must (at "
                    "most this many QPUs on each, in [[qpu]] order) and says so in its reasons; "
                    "the QPUs on one CPU are served by one SCHED_FIFO thread that always sends "
                    "the earliest start among them next (equal starts in [[qpu]] order), each "
                    "QPU keeping its own ring, endpoint, guard and records.  A send waits for "
                    "the one before it on the same CPU: jobs on QPUs sharing a CPU less than a "
                    "send apart (tens of us) go out that much later.  Shared threads use "
                    "submit_mode = \"syscall\".",
         QRT_FIELD(dispatch, qpus_per_cpu)},
        {.section = "dispatch", .key = "require_rt", .kind = k::enumeration,
         .default_value = std::string("auto"), .allowed = names_of<require_rt_mode>(),
         .meaning = "\"always\": refuse to start (exit status 3) when a dispatch thread cannot run "
                    "SCHED_FIFO on its isolated CPU (the CPU is not isolated, the thread cannot join "
                    "the isolated cpuset or pin itself there, or sched_setattr/mlockall is refused); "
                    "the error names the call, the CPU, the thread's cgroup and the remedy.  "
                    "\"never\": run degraded (SCHED_OTHER, reported in agent.status).  \"auto\": "
                    "\"always\" when systemd started qrtd as a service ($INVOCATION_ID is set), "
                    "else \"never\".  Only with mode = \"tuned\".",
         QRT_FIELD(dispatch, require_rt)},

        // ------------------------------------------------------------- timeline
        {.section = "timeline", .key = "policy", .kind = k::enumeration,
         .default_value = std::string("edf-backfill"), .allowed = names_of<placement_policy>(),
         .meaning = "Placement policy: \"fifo\" appends after the last reservation; "
                    "\"edf-backfill\" places earliest deadline first and backfills gaps; "
                    "\"priority-preempt\" lets a higher priority displace unstarted lower "
                    "ones; \"fidelity-aware\" also scores the predicted fidelity at start.",
         QRT_FIELD(timeline, policy)},
        {.section = "timeline", .key = "on_calibration_change", .kind = k::enumeration,
         .default_value = std::string("replace"), .allowed = names_of<calibration_change>(),
         .meaning = "When the calibration window of a reservation changes before dispatch: "
                    "\"replace\" places it again, \"fail\" fails it.  The owner gets an event "
                    "either way.",
         QRT_FIELD(timeline, on_calibration_change)},
        {.section = "timeline", .key = "default_lease_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{30 * sec}, .min = 1 * sec, .max = 24 * hour,
         .meaning = "Lease of a reservation when the request names none; a reservation whose "
                    "lease runs out without a heartbeat or a job is released.",
         QRT_FIELD(timeline, default_lease_ns)},
        {.section = "timeline", .key = "horizon_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{24 * hour}, .min = 1 * sec, .max = 30 * 24 * hour,
         .meaning = "How far ahead of now reservations may be placed.",
         QRT_FIELD(timeline, horizon_ns)},
        {.section = "timeline", .key = "retention_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{1 * hour}, .min = 1 * sec, .max = 30 * 24 * hour,
         .meaning = "How long a finished reservation or job (completed, failed, missed, "
                    "cancelled, released, expired, displaced) is kept after its slot ended, "
                    "with its result and its idempotency key, in memory and in the ledger "
                    "database; jobs.status and jobs.result answer not_found after that.  Checked "
                    "every minute.  With tenants.max_reservations this bounds the ledger.  "
                    "Calibration windows that ended this long ago go too, unless a live "
                    "reservation still sits in one.",
         QRT_FIELD(timeline, retention_ns)},
        {.section = "timeline", .key = "max_windows", .kind = k::integer,
         .default_value = std::int64_t{100'000}, .min = 16, .max = 10'000'000,
         .meaning = "Calibration windows one QPU holds ahead of now, in memory and in the "
                    "ledger database.  A periodic source generates no further ahead, so jobs "
                    "can be placed up to min(horizon_ns, max_windows x period_ns) ahead; a "
                    "calibration.update with more windows ending after now is refused.  With "
                    "the windows that ended, a QPU holds at most 2 x max_windows: past that "
                    "the oldest ended windows go first (a window holding a live reservation "
                    "is kept).",
         QRT_FIELD(timeline, max_windows)},
        {.section = "timeline", .key = "commit_group_max", .kind = k::integer,
         .default_value = std::int64_t{256}, .min = 1, .max = 65'536,
         .meaning = "Group commit: the ledger's writer thread writes at most this many changes "
                    "in one SQLite transaction with one fsync; a change is acknowledged once "
                    "its group is durable.  Changes made while a commit runs form the next "
                    "group, so groups grow with the load (one change per fsync when idle).  1 "
                    "commits every change on the event loop before its reply, with no writer "
                    "thread (the path before group commit, kept as the benchmark's "
                    "reference).",
         QRT_FIELD(timeline, commit_group_max)},
        {.section = "timeline", .key = "commit_group_wait_us", .kind = k::integer,
         .default_value = std::int64_t{0}, .min = 0, .max = 100'000,
         .meaning = "Group commit: how long the writer waits, after the first change of a "
                    "group, for more to join it (fewer fsyncs at a low rate, at the cost of "
                    "this much latency per acknowledgement).  0 never waits.",
         QRT_FIELD(timeline, commit_group_wait_us)},
        {.section = "timeline", .key = "commit_queue_max", .kind = k::integer,
         .default_value = std::int64_t{4096}, .min = 1, .max = 1'000'000,
         .meaning = "Group commit: changes that may wait for their commit.  Past this, a "
                    "client's change is refused at once, before anything changes, with "
                    "`unavailable` (data.cause \"commit_backlog\"); reads and slots.heartbeat are "
                    "still answered (a lease is never lost to the backlog) and the agent's own "
                    "changes (leases, dispatch) are never refused.",
         QRT_FIELD(timeline, commit_queue_max)},
        {.section = "timeline", .key = "endpoint_down_horizon_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{30 * sec}, .min = 0, .max = 24 * hour,
         .meaning = "While a QPU's endpoint is not connected, no start on it sooner than "
                    "this from now is offered, and a slots.reserve, jobs.submit or commit "
                    "into a held reservation that asks for one is refused with "
                    "`endpoint_down` (data: since_ns, error, remedy, not_before_ns): a job "
                    "acknowledged there could not be dispatched.  A request further ahead "
                    "is accepted and its reply carries `endpoint_down`.  Jobs committed "
                    "before the endpoint went down stay; at their start each is sent if "
                    "the endpoint is back, or ends `failed: endpoint_down`.  The events "
                    "qpu.endpoint_down and qpu.endpoint_up tell subscribers at once.  0 "
                    "ignores the endpoint's state.",
         QRT_FIELD(timeline, endpoint_down_horizon_ns)},
        {.section = "timeline", .key = "calibration_preempt", .kind = k::enumeration,
         .default_value = std::string("never"), .allowed = names_of<calibration_preempt>(),
         .meaning = "Calibration blocks (calibration.request, qrtd(8) CALIBRATION BLOCKS): what "
                    "becomes of a held reservation that was asked to yield to a block "
                    "(reservation.yield_requested) and neither released nor moved by the deadline.  "
                    "\"never\": it stays and the block fails.  \"held\": it is revoked (displaced, its "
                    "fencing token dead) when the block's urgency is above its priority.  A committed "
                    "job is never displaced for calibration under either.",
         QRT_FIELD(timeline, calibration_preempt)},
        {.section = "timeline", .key = "calibration_yield_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{10 * sec}, .min = 1'000'000, .max = 1 * hour,
         .meaning = "Calibration blocks: how long the holder of a held reservation in a requested "
                    "block's time has to release or move it (the yield_requested event's "
                    "deadline_ns), at most until the block's start.",
         QRT_FIELD(timeline, calibration_yield_ns)},
        {.section = "timeline", .key = "max_calibration_blocks", .kind = k::integer,
         .default_value = std::int64_t{16}, .min = 1, .max = 4096,
         .meaning = "Calibration blocks one QPU holds live (yielding, scheduled, started), in "
                    "memory and in the ledger database; one more is refused with `overloaded`.  "
                    "Blocks that ended are kept timeline.retention_ns after their end, and at "
                    "most this many per QPU (the oldest go first).",
         QRT_FIELD(timeline, max_calibration_blocks)},

        // ------------------------------------------------------------------ rpc
        {.section = "rpc", .key = "socket_path", .kind = k::string,
         .default_value = std::string(QRT_DEFAULT_SOCKET_PATH),
         .meaning = "UNIX socket of the JSON-RPC API.  Under systemd the socket comes from "
                    "qrtd.socket and this path is only checked against it.",
         .check = check_socket_path, QRT_FIELD(rpc, socket_path)},
        {.section = "rpc", .key = "socket_group", .kind = k::string,
         .default_value = std::string("qrt"),
         .meaning = "Group that owns the socket; its members may connect.  Empty: the socket keeps "
                    "the daemon's group.  A group this host does not have, or one the daemon cannot give "
                    "the socket to (started as an ordinary user who is not a member), is left alone too, "
                    "with a warning.",
         .check = check_optional_group_name, QRT_FIELD(rpc, socket_group)},
        {.section = "rpc", .key = "socket_mode", .kind = k::string,
         .default_value = std::string("0660"),
         .meaning = "Permission bits of the socket, in octal.",
         .check = check_octal_mode, .store = store_socket_mode, .load = load_socket_mode},
        {.section = "rpc", .key = "max_connections", .kind = k::integer,
         .default_value = std::int64_t{64}, .min = 1, .max = 4096,
         .meaning = "Connections served at once; more are accepted and closed at once "
                    "(overloaded).  rpc.reserved_connections of them are kept for admins "
                    "and the calibration role.",
         QRT_FIELD(rpc, max_connections)},
        {.section = "rpc", .key = "max_connections_per_uid", .kind = k::integer,
         .default_value = std::int64_t{16}, .min = 1, .max = 4096,
         .meaning = "Connections one uid (one tenant) may hold at once, subscribers "
                    "included; one more gets overloaded (data.cause \"connections_per_uid\") "
                    "and is closed.  Admins are exempt.",
         QRT_FIELD(rpc, max_connections_per_uid)},
        {.section = "rpc", .key = "reserved_connections", .kind = k::integer,
         .default_value = std::int64_t{8}, .min = 0, .max = 4095,
         .meaning = "Of rpc.max_connections, the connections only admins and the calibration "
                    "role may use: once the others are taken, any other peer gets overloaded "
                    "(data.cause \"connections\") and is closed, while root and the "
                    "calibration service still get in.  Must be less than "
                    "rpc.max_connections.",
         QRT_FIELD(rpc, reserved_connections)},
        {.section = "rpc", .key = "max_inflight", .kind = k::integer,
         .default_value = std::int64_t{16}, .min = 1, .max = 1024,
         .meaning = "Requests one connection may have in flight; reading from it pauses at "
                    "this many.",
         QRT_FIELD(rpc, max_inflight)},
        {.section = "rpc", .key = "idle_timeout_s", .kind = k::integer,
         .default_value = std::int64_t{300}, .min = 0, .max = 86400,
         .meaning = "Seconds a connection may stay silent, without subscriptions, before it "
                    "is closed.  0 disables the timeout.",
         QRT_FIELD(rpc, idle_timeout_s)},
        {.section = "rpc", .key = "nss_timeout_ms", .kind = k::integer,
         .default_value = std::int64_t{2000}, .min = 10, .max = 60000,
         .meaning = "How long a new connection waits for its user name (NSS: getpwuid_r, "
                    "asked by one resolver thread off the event loop, at most 64 uids queued, "
                    "answers cached 60 s for 256 uids).  It is not read meanwhile; other "
                    "connections are served.  Past this it gets one error with reason "
                    "unavailable (data.cause nss_timeout) and is closed.",
         QRT_FIELD(rpc, nss_timeout_ms)},
        {.section = "rpc", .key = "max_line_bytes", .kind = k::integer,
         .default_value = std::int64_t{1048576}, .min = 1024, .max = 16 * 1024 * 1024,
         .meaning = "Longest request line; a longer one is answered with -32600 and the "
                    "connection closed.",
         QRT_FIELD(rpc, max_line_bytes)},
        {.section = "rpc", .key = "metrics_textfile", .kind = k::string,
         .default_value = std::string(""),
         .meaning = "When set, the Prometheus metrics are also written to this file every 10 s "
                    "(for node_exporter's textfile collector).  Empty: off.",
         .check = check_optional_absolute_path, QRT_FIELD(rpc, metrics_textfile)},
        {.section = "rpc", .key = "listen", .kind = k::string,
         .default_value = std::string(""),
         .meaning = "The network listener for the same JSON-RPC, \"tcp://ADDR:PORT\" (a literal "
                    "IPv4 address, or an IPv6 one in brackets); empty: off.  Every connection "
                    "authenticates with a MUNGE credential before any method (qrtd(8), NETWORK "
                    "LISTENER); the credential's uid and gid then get the roles SO_PEERCRED would.  "
                    "Under systemd the socket may come from a second ListenStream= of qrtd.socket.",
         .check = check_tcp_listen, QRT_FIELD(rpc, listen)},
        {.section = "rpc", .key = "listen_aliases", .kind = k::string_list,
         .default_value = strings{},
         .meaning = "Other addresses (\"tcp://ADDR:PORT\", literal) by which clients reach the "
                    "network listener through an address translation on the way (NAT, a port "
                    "forward, a load balancer).  A client's MUNGE credential names the address "
                    "it dialled, and qrtd accepts it only for the address the connection came in "
                    "on or one of these (qrtd(8), NETWORK LISTENER): a credential made for a "
                    "listener the client was steered to opens no other qrtd.  Empty: none.",
         .check = check_tcp_alias, QRT_FIELD(rpc, listen_aliases)},
        {.section = "rpc", .key = "max_connections_per_host", .kind = k::integer,
         .default_value = std::int64_t{32}, .min = 1, .max = 4096,
         .meaning = "Connections one peer address may hold at once on the network listener, "
                    "authenticated or not, counted from accept; one more gets overloaded "
                    "(data.cause \"connections_per_host\") and is closed.",
         QRT_FIELD(rpc, max_connections_per_host)},
        {.section = "rpc", .key = "max_unauthenticated", .kind = k::integer,
         .default_value = std::int64_t{32}, .min = 1, .max = 4096,
         .meaning = "Network connections that have not authenticated yet, from every host "
                    "together: a pool of their own, outside rpc.max_connections and its "
                    "reserved slots, so peers that never authenticate keep no local user, "
                    "admin or authenticated peer out.  One more gets overloaded (data.cause "
                    "\"unauthenticated_connections\") at accept and is closed.  Once "
                    "authenticated a connection counts in rpc.max_connections instead.",
         QRT_FIELD(rpc, max_unauthenticated)},
        {.section = "rpc", .key = "max_unauthenticated_per_host", .kind = k::integer,
         .default_value = std::int64_t{8}, .min = 1, .max = 4096,
         .meaning = "Network connections one peer address may hold before they have "
                    "authenticated; one more gets overloaded (data.cause "
                    "\"unauthenticated_per_host\") at accept and is closed.  Many clients of "
                    "one node connecting at the same moment meet it: libqrt-client (qrtctl, the "
                    "SPANK plugin) and the Python client try again until their connect timeout.",
         QRT_FIELD(rpc, max_unauthenticated_per_host)},
        {.section = "rpc", .key = "auth_silent_timeout_ms", .kind = k::integer,
         .default_value = std::int64_t{1000}, .min = 50, .max = 60000,
         .meaning = "A network connection that has sent nothing this long after its "
                    "auth.challenge gets unauthenticated (data.cause \"auth_timeout\") and is "
                    "closed (a client answers within a round trip and a munge_encode).  At "
                    "most rpc.auth_timeout_ms.",
         QRT_FIELD(rpc, auth_silent_timeout_ms)},
        {.section = "rpc", .key = "auth_timeout_ms", .kind = k::integer,
         .default_value = std::int64_t{5000}, .min = 100, .max = 60000,
         .meaning = "How long a connection of the network listener may take to authenticate "
                    "(send auth.munge and have munged verify it); then it gets unauthenticated "
                    "(data.cause \"auth_timeout\") and is closed.  Its lines before that are at "
                    "most 4096 bytes.",
         QRT_FIELD(rpc, auth_timeout_ms)},
        {.section = "rpc", .key = "munge_socket", .kind = k::string,
         .default_value = std::string("/run/munge/munge.socket.2"),
         .meaning = "The socket of this host's munged, which decodes the network listener's "
                    "credentials (at most 64 wait for it).",
         .check = check_socket_path, QRT_FIELD(rpc, munge_socket)},

        // ---------------------------------------------------------------- roles
        {.section = "roles", .key = "reader", .kind = k::string_list,
         .default_value = strings{"group:qrt"},
         .meaning = "Peers allowed to query: agent.status, qpus.list, calibration.get, "
                    "calibration.blocks, slots.query, jobs.status (of their own tenant's jobs), "
                    "telemetry.snapshot, telemetry.outliers, metrics, events.subscribe and "
                    "events.unsubscribe (events of their own tenant's objects, and calibration "
                    "changes and blocks); "
                    "agent.hello needs no role.  Entries are \"user:NAME\", \"group:NAME\", "
                    "\"uid:N\" or \"gid:N\", matched against SO_PEERCRED and the peer's groups.",
         .check = check_principal, QRT_FIELD(roles, reader)},
        {.section = "roles", .key = "scheduler", .kind = k::string_list,
         .default_value = strings{"group:qrt"},
         .meaning = "Peers allowed what readers are, and to reserve slots and submit, cancel "
                    "and fetch jobs, on their own tenant's objects only: slots.reserve, "
                    "slots.heartbeat, slots.release, jobs.submit, jobs.cancel, jobs.result.",
         .check = check_principal, QRT_FIELD(roles, scheduler)},
        {.section = "roles", .key = "calibration", .kind = k::string_list,
         .default_value = strings{},
         .meaning = "Peers allowed what readers are, and to push calibration windows and ask "
                    "for calibration blocks: calibration.update, calibration.request, "
                    "calibration.cancel.  A calibration service that runs its own experiments in "
                    "its blocks (block_id) holds the scheduler role too.",
         .check = check_principal, QRT_FIELD(roles, calibration)},
        {.section = "roles", .key = "admin", .kind = k::string_list,
         .default_value = strings{"uid:0"},
         .meaning = "Peers allowed everything, on every tenant's objects.",
         .check = check_principal, QRT_FIELD(roles, admin)},

        // -------------------------------------------------------------- tenants
        {.section = "tenants", .key = "scheduler_max_priority", .kind = k::integer,
         .default_value = std::int64_t{0}, .min = INT32_MIN, .max = INT32_MAX,
         .meaning = "Highest request priority a scheduler may ask for; a request above it is "
                    "refused with quota_exceeded (quota \"priority\").  Under priority-preempt "
                    "only a higher priority displaces, so the default 0 lets no tenant displace "
                    "another unless granted more by tenants.priority_ceilings.",
         QRT_FIELD(tenants, scheduler_max_priority)},
        {.section = "tenants", .key = "admin_max_priority", .kind = k::integer,
         .default_value = std::int64_t{INT32_MAX}, .min = INT32_MIN, .max = INT32_MAX,
         .meaning = "Highest request priority an admin may ask for.",
         QRT_FIELD(tenants, admin_max_priority)},
        {.section = "tenants", .key = "priority_ceilings", .kind = k::string_list,
         .default_value = strings{},
         .meaning = "Per-tenant priority ceilings, \"PRINCIPAL=N\" (\"user:alice=50\", "
                    "\"group:physics=10\", \"uid:1001=-5\").  When entries match the peer, "
                    "the highest of them is its ceiling instead of its role's.",
         .check = check_priority_ceiling, QRT_FIELD(tenants, priority_ceilings)},
        {.section = "tenants", .key = "max_reservations", .kind = k::integer,
         .default_value = std::int64_t{1000}, .min = 1, .max = 1'000'000,
         .meaning = "Reservations one tenant may hold at once (held, committed or dispatched, "
                    "gang members counted one by one); one more is refused with "
                    "quota_exceeded (quota \"reservations\").  Admins are exempt.",
         QRT_FIELD(tenants, max_reservations)},
        {.section = "tenants", .key = "max_booked_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{1 * hour}, .min = 1 * ms, .max = 30 * 24 * hour,
         .meaning = "QPU time one tenant may have booked ahead at once (the durations of its "
                    "held, committed and dispatched reservations, within timeline.horizon_ns); "
                    "more is refused with quota_exceeded (quota \"booked_time\").  Admins are "
                    "exempt.",
         QRT_FIELD(tenants, max_booked_ns)},
        {.section = "tenants", .key = "near_term_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{600 * sec}, .min = 1 * sec, .max = 30 * 24 * hour,
         .meaning = "The near term: from now, this far ahead.  Of it, one tenant may hold "
                    "only tenants.max_near_term_ns, so that one tenant booking as fast as it "
                    "can (within its other quotas) cannot take every slot soon to come.",
         QRT_FIELD(tenants, near_term_ns)},
        {.section = "tenants", .key = "max_near_term_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{120 * sec}, .min = 1 * ms, .max = 30 * 24 * hour,
         .meaning = "QPU time one tenant may have booked within the next tenants.near_term_ns "
                    "(its held, committed and dispatched reservations' time inside it, summed "
                    "over the QPUs), counted when it books.  A reserve or one-shot submit that "
                    "may start sooner (not_before_ns before now + near_term_ns) and would pass "
                    "it is refused with quota_exceeded (quota \"near_term\"), whose "
                    "data.not_before_ns is the earliest start the tenant may ask for instead.  "
                    "Admins are exempt.",
         QRT_FIELD(tenants, max_near_term_ns)},
        {.section = "tenants", .key = "max_payload_bytes", .kind = k::integer,
         .default_value = std::int64_t{64} * 1024 * 1024, .min = 1024,
         .max = std::int64_t{64} * 1024 * 1024 * 1024,
         .meaning = "Payload bytes one tenant's committed and dispatched jobs may hold at once "
                    "(each payload is also limited by dispatch.max_payload_bytes); more is "
                    "refused with quota_exceeded (quota \"payload_bytes\").  Admins are exempt.",
         QRT_FIELD(tenants, max_payload_bytes)},
        {.section = "tenants", .key = "max_requests_per_s", .kind = k::integer,
         .default_value = std::int64_t{2000}, .min = 0, .max = 1'000'000,
         .meaning = "Requests per second one tenant may send over all its connections "
                    "(a token bucket of tenants.request_burst).  Every line is charged before "
                    "it is parsed -- unknown methods, denied calls and malformed lines "
                    "included -- one request per started tenants.request_bytes bytes, and a "
                    "batch at least one per request it holds; a line beyond the rate is "
                    "refused whole with quota_exceeded (quota \"requests\") without being "
                    "run.  Admins are exempt.  0: unlimited.",
         QRT_FIELD(tenants, max_requests_per_s)},
        {.section = "tenants", .key = "request_burst", .kind = k::integer,
         .default_value = std::int64_t{4000}, .min = 1, .max = 1'000'000,
         .meaning = "Requests a tenant may send at once after being idle (the bucket size).",
         QRT_FIELD(tenants, request_burst)},
        {.section = "tenants", .key = "request_bytes", .kind = k::integer,
         .default_value = std::int64_t{16384}, .min = 256, .max = 16 * 1024 * 1024,
         .meaning = "What one request of tenants.max_requests_per_s is worth in bytes: a "
                    "request line costs one request per started request_bytes bytes, so a "
                    "long line (a large payload) uses up the rate like the many short ones "
                    "it costs as much to read and parse as.",
         QRT_FIELD(tenants, request_bytes)},
        {.section = "tenants", .key = "delegates", .kind = k::string_list,
         .default_value = strings{},
         .meaning = "Peers (PRINCIPAL as in [roles]) that may pass on_behalf_of=NAME to "
                    "slots.query, slots.reserve, slots.heartbeat, slots.release and the jobs.* "
                    "methods: the call then acts as tenant \"DELEGATE/NAME\" (the delegate's own "
                    "tenant, a slash, NAME: 1 to 63 of [a-z0-9-], as a Kubernetes namespace), "
                    "with the delegate's roles less admin, so every quota and the scheduler's "
                    "priority ceiling apply to NAME, not to the delegate.  The delegate still "
                    "needs the scheduler role.  A delegate may also take those tenants' events "
                    "(events.subscribe with delegated: true).  For qrt-dra-driver (tools/integrations/k8s).",
         .check = check_principal, QRT_FIELD(tenants, delegates)},
        {.section = "tenants", .key = "max_delegated_tenants", .kind = k::integer,
         .default_value = std::int64_t{256}, .min = 1, .max = 65536,
         .meaning = "Tenants one delegate may hold reservations for at once (each with its own "
                    "quotas); a booking for one more is refused with quota_exceeded (quota "
                    "\"delegated_tenants\"), so a delegate cannot multiply its quota by "
                    "inventing names.",
         QRT_FIELD(tenants, max_delegated_tenants)},
        {.section = "tenants", .key = "delegated_max_priority", .kind = k::integer,
         .default_value = std::int64_t{0}, .min = INT32_MIN, .max = INT32_MAX,
         .meaning = "Highest request priority of a tenant a delegate books for "
                    "(on_behalf_of=NAME, tenants.delegates): its own ceiling, the same for "
                    "every such tenant.  Neither tenants.scheduler_max_priority nor a "
                    "tenants.priority_ceilings entry matching the delegate's principal applies "
                    "to them: those are the delegate's own calls' ceiling.",
         QRT_FIELD(tenants, delegated_max_priority)},

        // --------------------------------------------------------------- probes
        {.section = "probes", .key = "enabled", .kind = k::boolean, .default_value = true,
         .meaning = "Load the eBPF probes (wakeup latency of the dispatch threads, intrusions "
                    "on the isolated CPUs).  Without BTF or CAP_BPF/CAP_PERFMON the agent "
                    "runs on and reports the probes unavailable.",
         QRT_FIELD(probes, enabled)},
        {.section = "probes", .key = "outlier_threshold_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{50 * us}, .min = 1 * us, .max = 1 * sec,
         .meaning = "Wakeup latencies and intrusions longer than this are reported one by "
                    "one, with their cause.",
         QRT_FIELD(probes, outlier_threshold_ns)},
        {.section = "probes", .key = "flavour", .kind = k::enumeration,
         .default_value = std::string("auto"), .allowed = names_of<probe_flavour>(),
         .meaning = "Which BPF programs attach to the tracepoints.  \"auto\": each handler is "
                    "loaded as tp_btf (BTF-typed, cheaper), and one the kernel's verifier "
                    "rejects (Debian 12's 6.1 kernels reject some) falls back to raw_tp alone; "
                    "the log names what loaded and quotes the verifier's reason.  \"raw_tp\": "
                    "raw_tp programs only.",
         QRT_FIELD(probes, flavour)},

        // ---------------------------------------------------------------- [[qpu]]
        {.section = "qpu", .key = "name", .kind = k::string, .default_value = std::string("qpu0"),
         .required = true,
         .meaning = "Name of the QPU in the API.  Required, unique.",
         .check = check_qpu_name, QRT_QPU_FIELD(name)},
        {.section = "qpu", .key = "endpoint", .kind = k::string,
         .default_value = std::string("unix:///run/qrtd/qpu0.sock"), .required = true,
         .meaning = "Where jobs are sent: \"unix:///path\", \"tcp://127.0.0.1:port\" (an "
                    "address literal; [::1] for IPv6) or \"file:///dev/...\" (a character device, "
                    "or a FIFO, which is write-only: its jobs end sent; qrtd check-config refuses "
                    "any other file type).  Required.",
         .check = check_endpoint, QRT_QPU_FIELD(target)},
        {.section = "qpu", .key = "dispatch_cpu", .kind = k::integer,
         .default_value = std::int64_t{-1}, .min = -1, .max = 4095,
         .meaning = "CPU of this QPU's dispatch thread; its core is isolated.  -1: chosen by "
                    "the partition plan.",
         QRT_QPU_FIELD(dispatch_cpu)},
        {.section = "qpu", .key = "locality_device", .kind = k::string,
         .default_value = std::string(""),
         .meaning = "PCI bus id or network interface of this QPU's endpoint; empty inherits "
                    "host.locality_device.",
         .check = check_device_name, QRT_QPU_FIELD(locality_device)},
        {.section = "qpu", .key = "calibration", .kind = k::enumeration,
         .default_value = std::string("periodic"), .allowed = names_of<calibration_source>(),
         .meaning = "\"periodic\": calibration windows follow period_ns, blackout_ns and "
                    "phase_ns.  \"pushed\": the calibration stack pushes windows over the "
                    "socket (calibration role).",
         QRT_QPU_FIELD(calibration)},
        {.section = "qpu", .key = "period_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{60 * sec}, .min = 1 * ms, .max = 7 * 24 * hour,
         .meaning = "Periodic calibration: time from one window start to the next, blackout "
                    "included.",
         QRT_QPU_FIELD(period_ns)},
        {.section = "qpu", .key = "blackout_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{5 * sec}, .min = 0, .max = 7 * 24 * hour,
         .meaning = "Periodic calibration: the calibration run at the start of each period, "
                    "when no job may run.  Less than period_ns.",
         QRT_QPU_FIELD(blackout_ns)},
        {.section = "qpu", .key = "phase_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{0}, .min = 0, .max = 7 * 24 * hour,
         .meaning = "Periodic calibration: offset of the first period from the Unix epoch, "
                    "modulo period_ns.  Less than period_ns.",
         QRT_QPU_FIELD(phase_ns)},
        {.section = "qpu", .key = "fidelity_f0", .kind = k::real,
         .default_value = 0.99, .min_real = 0.0, .max_real = 1.0,
         .meaning = "Fidelity right after calibration; the prediction at t is "
                    "f0 * exp(-(t - valid_from) / tau).",
         QRT_QPU_FIELD(fidelity_f0)},
        {.section = "qpu", .key = "fidelity_tau_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{3600 * sec}, .min = 0, .max = 365 * 24 * hour,
         .meaning = "Drift time constant of the fidelity prediction.  0: no drift.",
         QRT_QPU_FIELD(fidelity_tau_ns)},
        {.section = "qpu", .key = "job_tolerance_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{-1}, .min = -1, .max = 10 * sec,
         .meaning = "Lateness after which this QPU's jobs are marked missed instead of sent.  "
                    "-1 inherits dispatch.miss_tolerance_ns.",
         QRT_QPU_FIELD(job_tolerance_ns)},
        {.section = "qpu", .key = "wire", .kind = k::integer,
         .default_value = std::int64_t{1}, .min = 1, .max = 2,
         .meaning = "The endpoint wire's version (README.md, \"The QPU endpoint wire format\").  1: the "
                    "dispatch thread sends the whole job (header and program) at its start; the "
                    "endpoint prepares it then, so the job starts late by its upload.  2: the QPU "
                    "link sends the program in ARM ahead of the start (at least arm_lead_ns ahead, "
                    "within the endpoint's max_armed and horizon), the dispatch thread sends a "
                    "128-byte FIRE at the start, and only for a job the endpoint answered ARMED "
                    "(otherwise the job ends not_armed); its frame pool holds FIRE headers only.  "
                    "2 needs a unix:// or tcp:// endpoint that speaks version 2 (qpu-sim, "
                    "qrt-endpoint's stacks); a version-1 endpoint is refused "
                    "(endpoint_protocol_error) and retried.",
         QRT_QPU_FIELD(wire)},
        {.section = "qpu", .key = "arm_lead_ns", .kind = k::duration_ns,
         .default_value = std::int64_t{0}, .min = 0, .max = 60 * sec,
         .meaning = "wire = 2: how long before its start a job's ARM must go out: at least the "
                    "endpoint's prepare (compile, upload, arm) of the largest program, plus a "
                    "margin.  It adds to the minimum lead (no start is accepted sooner than it "
                    "from now; refusals carry next_start_ns) and to the hand-over horizon.  The "
                    "arm lead learned from the endpoint (agent.status qpus[].arm.lead_ns) raises "
                    "both for this QPU when it is larger, never lowers them.  0 with wire = 1.",
         QRT_QPU_FIELD(arm_lead_ns)},
    };
}

#undef QRT_FIELD
#undef QRT_QPU_FIELD

}  // namespace

std::string config_option::full_name() const {
    return fmt::format("{}.{}", section, key);
}

const std::vector<config_option>& config_table() {
    static const std::vector<config_option> table = build_table();
    return table;
}

const std::vector<device_option>& device_table() {
    static const std::vector<device_option> table{
        {.key = "qubits", .type = "integer, 1..1024", .example = "3", .required = true,
         .meaning = "How many qubits the QPU has.  A job whose envelope asks for more is refused at "
                    "jobs.submit."},
        {.key = "technology", .type = "string, at most 64 characters", .example = "\"superconducting\"",
         .meaning = "What the qubits are made of (\"superconducting\", \"ion-trap\", "
                    "\"neutral-atom\", ...), for the SDKs to show."},
        {.key = "basis_gates", .type = "array of at most 64 gate names ([A-Za-z0-9_], 1..32 characters)",
         .example = "[\"rz\", \"sx\", \"x\", \"cx\", \"measure\"]",
         .meaning = "The native operations, in OpenQASM 3 / Qiskit spelling; the SDK backends "
                    "transpile to them."},
        {.key = "coupling_map", .type = "array of at most 4096 [control, target] pairs of qubit indices",
         .example = "[[0, 1], [1, 0], [1, 2], [2, 1]]",
         .meaning = "Which qubit pairs a two-qubit basis gate may act on, directed.  Every index "
                    "is less than qubits.  Empty or absent: all pairs."},
        {.key = "gate_durations_ns", .type = "table of gate name = integer nanoseconds (0..3600 s)",
         .example = "{ cx = 300, sx = 35, x = 35, rz = 0, measure = 1000 }",
         .meaning = "How long each basis gate takes, for the SDKs' schedulers.  Every name is in "
                    "basis_gates.  Optional."},
        {.key = "max_shots", .type = "integer, 1..1000000", .example = "100000",
         .meaning = "The most shots one circuit may ask for; a job whose envelope asks for more is "
                    "refused at jobs.submit.  Default 100000."},
    };
    return table;
}

std::string_view device_section_meaning() {
    return "Optional sub-table of a [[qpu]]: what the QPU is, for quantum SDKs (the Qiskit "
           "backend builds its target from it, the QDMI device library its sites and "
           "operations).  qpus.list serves it as \"device\" (null when absent).";
}

const std::vector<std::string_view>& section_order() {
    static const std::vector<std::string_view> order{
        "agent", "host", "dispatch", "timeline", "rpc", "roles", "tenants", "probes", "qpu"};
    return order;
}

std::string_view section_meaning(std::string_view section) {
    if (section == "agent") {
        return "The daemon itself.";
    }
    if (section == "host") {
        return "Host partitioning: isolated and housekeeping CPUs, runtime isolation, IRQs "
               "(`qrtd host plan|apply|restore|verify`).";
    }
    if (section == "dispatch") {
        return "The real-time dispatch threads, one per QPU.";
    }
    if (section == "timeline") {
        return "Calibration windows, reservations and their placement.";
    }
    if (section == "rpc") {
        return "The JSON-RPC socket served to cluster schedulers.";
    }
    if (section == "roles") {
        return "Who may do what over the socket.";
    }
    if (section == "tenants") {
        return "What one tenant (a peer's user name, or uid:N) may do, so that tenants cannot "
               "hurt each other: priority ceilings and quotas.";
    }
    if (section == "probes") {
        return "eBPF self-measurement.";
    }
    if (section == "qpu") {
        return "One [[qpu]] table per QPU served by this host; at least one.";
    }
    return {};
}

const config_option* find_option(std::string_view section, std::string_view key) {
    for (const auto& opt : config_table()) {
        if (opt.section == section && opt.key == key) {
            return &opt;
        }
    }
    return nullptr;
}

}  // namespace qrt
