#include "qrt/host_cmd.hpp"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <ostream>
#include <variant>

#include "qrt/dispatch/dispatcher.hpp"
#include "qrt/log.hpp"
#include "qrt/slurm_plan.hpp"
#include "rtcore/kernel_probe.hpp"
#include "rtcore/task_ops.hpp"
#include "rtcore/user_switch.hpp"

namespace qrt {
namespace {

using json = nlohmann::json;

json to_json(const rtcore::partition_plan& p) {
    return json{{"online", p.online.to_list()},
                {"isolated", p.isolated.to_list()},
                {"housekeeping", p.housekeeping.to_list()},
                {"dispatch_cpus", p.rt_cpus},
                {"near_device_cpus", p.near_device_cpus.to_list()},
                {"reasons", p.reasons},
                {"kernel_cmdline",
                 {{"args", p.kernel_cmdline.args}, {"needs_reboot", p.kernel_cmdline.needs_reboot}}}};
}

json to_json(const rtcore::kernel_report& k) {
    json warnings = json::array();
    for (const auto& w : k.warnings) {
        warnings.push_back({{"subsystem", w.subsystem},
                            {"message", w.message},
                            {"fix", w.fix},
                            {"needs_reboot", w.needs_reboot}});
    }
    auto opt = [](const auto& o) -> json { return o ? json(*o) : json(nullptr); };
    return json{{"release", opt(k.release)},
                {"version", opt(k.version)},
                {"preempt_rt", rtcore::to_string(k.preempt_rt)},
                {"preempt_model", k.preempt_model},
                {"online", k.online ? json(k.online->to_list()) : json(nullptr)},
                {"cmdline", opt(k.cmdline)},
                {"sched_rt_runtime_us", opt(k.sched_rt_runtime_us)},
                {"cgroup_v1_cpuset_mount", opt(k.cgroup_v1_cpuset_mount)},
                {"cgroup_v2_mount", opt(k.cgroup_v2_mount)},
                {"cgroup_v2_cpuset", rtcore::to_string(k.cgroup_v2_cpuset)},
                {"btf", rtcore::to_string(k.btf)},
                {"io_uring", rtcore::to_string(k.io_uring)},
                {"hypervisor", rtcore::to_string(k.hypervisor)},
                {"steal_fraction", opt(k.steal_fraction)},
                {"irqbalance", rtcore::to_string(k.irqbalance)},
                {"warnings", std::move(warnings)}};
}

json to_json(const rtcore::irq_report& r) {
    json irqs = json::array();
    for (const auto& o : r.irqs) {
        irqs.push_back({{"irq", o.irq},
                        {"name", o.name},
                        {"action", rtcore::to_string(o.act)},
                        {"before", o.before},
                        {"after", o.after},
                        {"detail", o.detail}});
    }
    return json{{"irqs", std::move(irqs)},
                {"default_before", r.default_before},
                {"default_after", r.default_after},
                {"irqbalance", r.irqbalance.line()},
                {"lines", r.lines}};
}

json to_json(const rtcore::isolation_report& r) {
    return json{{"method", rtcore::to_string(r.method)},
                {"not_used", r.not_used},
                {"isolated_cgroup", r.isolated_cgroup},
                {"housekeeping_cgroup", r.housekeeping_cgroup},
                {"tasks_moved", r.tasks_moved},
                {"tasks_refused", r.tasks_refused},
                {"tasks_gone", r.tasks_gone},
                {"drift", r.drift},
                {"lines", r.lines}};
}

json to_json(const rtcore::knob_report& r) {
    json knobs = json::array();
    for (const auto& k : r.knobs) {
        knobs.push_back({{"name", k.name},
                         {"path", k.path},
                         {"action", rtcore::to_string(k.act)},
                         {"before", k.before},
                         {"after", k.after},
                         {"detail", k.detail},
                         {"why", k.why}});
    }
    json kthreads = nullptr;
    if (r.enabled_kthreads) {
        const auto& t = r.kthreads;
        kthreads = json{{"moved", t.moved},
                        {"not_movable", t.not_movable},
                        {"gone", t.gone},
                        {"failed", t.failed},
                        {"moved_names", t.moved_names},
                        {"not_movable_names", t.not_movable_names},
                        {"failure", t.failure}};
    }
    return json{{"knobs", std::move(knobs)}, {"kthreads", std::move(kthreads)}, {"off", r.off},
                {"drift", r.drift}, {"lines", r.lines}};
}

json to_json(const rtcore::host_partition::apply_report& r) {
    json writes = json::array();
    for (const auto& w : r.planned_writes) {
        writes.push_back({{"path", w.path}, {"data", w.data}});
    }
    return json{{"isolated", r.isolated.to_list()},
                {"housekeeping", r.housekeeping.to_list()},
                {"dry_run", r.dry_run},
                {"journal", r.journal_path},
                {"continued_journal", r.continued_journal},
                {"rebuilt", r.rebuilt},
                {"journal_by", rtcore::rec::to_string(r.journal_by)},
                {"drift", r.drift},
                {"irqs", to_json(r.irqs)},
                {"isolation", to_json(r.isolation)},
                {"knobs", to_json(r.knobs)},
                {"planned_writes", std::move(writes)},
                {"lines", r.lines}};
}

void print_lines(std::ostream& out, const std::vector<std::string>& lines) {
    for (const auto& l : lines) {
        out << l << '\n';
    }
}

exit_code fail(std::string_view subsystem, const rtcore::error& e) {
    log::error(subsystem, "{}", e.message);
    return exit_code::failure;
}

}  // namespace

std::optional<rtcore::cpu_set> read_online_cpus(const rtcore::host_fs& fs) {
    auto text = fs.read_line("/sys/devices/system/cpu/online");
    if (!text) {
        return std::nullopt;
    }
    auto set = rtcore::cpu_set::parse_list(*text);
    if (!set) {
        return std::nullopt;
    }
    return *set;
}

rtcore::result<rtcore::topology> load_topology(const host_context& ctx, const rtcore::host_fs& fs,
                                               std::string* note) {
    const std::string& t = ctx.topology;
    if (t == "system" || (t.empty() && fs.is_system())) {
        return rtcore::topology::from_system();
    }
    if (t.rfind("synthetic:", 0) == 0) {
        return rtcore::topology::from_synthetic(t.substr(10));
    }
    if (t.rfind("xml:", 0) == 0) {
        return rtcore::topology::from_xml(t.substr(4));
    }
    if (!t.empty()) {
        return rtcore::error::invalid(
            fmt::format("--topology \"{}\": expected system, synthetic:<description> or xml:<path>", t));
    }
    // A fake tree without a topology: hwloc would read the real /sys, so
    // describe the tree's online CPUs as single-thread cores instead.
    auto online = read_online_cpus(fs);
    if (!online || online->empty()) {
        return rtcore::error::invalid(fmt::format(
            "{}: cannot read /sys/devices/system/cpu/online; give --topology",
            fs.root().string()));
    }
    if (static_cast<std::size_t>(online->last() + 1) != online->count()) {
        return rtcore::error::invalid(fmt::format(
            "{}: online CPUs {} are not 0..n-1; give --topology xml:<lstopo export>",
            fs.root().string(), online->to_list()));
    }
    if (note != nullptr) {
        *note = fmt::format("no --topology for root {}: assuming {} single-thread cores (CPUs {})",
                            fs.root().string(), online->count(), online->to_list());
    }
    return rtcore::topology::from_synthetic(fmt::format("core:{} pu:1", online->count()));
}

rtcore::result<rtcore::partition_plan> plan_for(const config& cfg, const rtcore::topology& topo) {
    rtcore::plan_request req;
    req.isolated = cfg.host.isolated_cpus;
    // One RT thread per QPU, its dispatch thread, in [[qpu]] order.
    req.rt_cpu_count = static_cast<unsigned>(std::max<std::size_t>(1, cfg.qpus.size()));
    req.min_housekeeping_cores = cfg.host.housekeeping_min_cores;
    std::size_t explicit_cpus = 0;
    for (const auto& q : cfg.qpus) {
        if (q.dispatch_cpu >= 0) {
            ++explicit_cpus;
        }
    }
    if (explicit_cpus == cfg.qpus.size() && explicit_cpus > 0) {
        for (const auto& q : cfg.qpus) {
            req.rt_cpus.push_back(static_cast<unsigned>(q.dispatch_cpu));
        }
    } else if (explicit_cpus > 0) {
        return rtcore::error::invalid(
            "qpu.dispatch_cpu is set for some QPUs and -1 (auto) for others: set it for every "
            "[[qpu]] or for none");
    }
    std::string device = cfg.host.locality_device;
    for (const auto& q : cfg.qpus) {
        if (!q.locality_device.empty()) {
            device = q.locality_device;
            break;
        }
    }
    if (!device.empty()) {
        req.near_device = device;
    }
    auto plan = rtcore::plan_partition(topo, req);
    // Untuned dispatch threads are plain threads, and isolation = "none"
    // isolates nothing: there a QPU needs no isolated CPU of its own.  When
    // the host cannot spare one per QPU, they share as many as it can
    // (QPU i on dispatch CPU i mod n), so that a small lab host, or one node
    // of a test cluster, runs more QPUs than it has spare cores.  Tuned
    // QPUs share only with dispatch.qpus_per_cpu > 1, at most that many on
    // one isolated CPU, where one dispatch thread serves them in start
    // order (services.cpp, qrt/dispatch/dispatch_group.hpp).
    const bool needs_none = cfg.dispatch.mode == dispatch_mode::untuned || cfg.host.isolation == isolation_mode::none;
    const unsigned per_cpu = needs_none ? 0U : std::max<unsigned>(1U, cfg.dispatch.qpus_per_cpu);
    const bool may_share = needs_none || per_cpu > 1;
    if (!plan && may_share && req.rt_cpus.empty() && !req.isolated && req.rt_cpu_count > 1) {
        const unsigned wanted = req.rt_cpu_count;
        const unsigned fewest = needs_none ? 1U : (wanted + per_cpu - 1) / per_cpu;
        for (unsigned n = wanted - 1; n >= fewest && n >= 1 && !plan; --n) {
            req.rt_cpu_count = n;
            plan = rtcore::plan_partition(topo, req);
        }
        if (plan && needs_none) {
            plan->reasons.push_back(fmt::format(
                "{} QPUs share {} dispatch CPU{} ({}): the host cannot spare a core per QPU, and "
                "{} needs none of its own",
                wanted, plan->rt_cpus.size(), plan->rt_cpus.size() == 1 ? "" : "s", plan->isolated.to_list(),
                cfg.dispatch.mode == dispatch_mode::untuned ? "dispatch.mode = \"untuned\""
                                                            : "host.isolation = \"none\""));
        } else if (plan) {
            const std::size_t n = plan->rt_cpus.size();
            plan->reasons.push_back(fmt::format(
                "{} QPUs share {} isolated dispatch CPU{} ({}), up to {} on each (dispatch.qpus_per_cpu = {}; "
                "QPU i on the plan's CPU i mod {}): the host cannot spare a core per QPU; the QPUs on one "
                "CPU are served by one SCHED_FIFO dispatch thread, which sends their jobs in start order",
                wanted, n, n == 1 ? "" : "s", plan->isolated.to_list(), (wanted + n - 1) / n, per_cpu, n));
        } else {
            req.rt_cpu_count = wanted;
            plan = rtcore::plan_partition(topo, req);  // the error for one CPU per QPU
            if (!plan) {
                plan = rtcore::error{plan.err().code,
                                     plan.err().message + fmt::format(" (even with {} QPUs on each isolated CPU, "
                                                                      "dispatch.qpus_per_cpu = {})",
                                                                      per_cpu, per_cpu)};
            }
        }
    }
    if (!plan && plan.err().message.find("RT thread") != std::string::npos) {
        // rtcore numbers the RT threads; the operator knows them as QPUs.
        return rtcore::error{plan.err().code,
                             plan.err().message + " (RT thread N is the dispatch thread of [[qpu]] N, counting from 0; "
                                                  "its CPU is qpu.dispatch_cpu)"};
    }
    return plan;
}

rtcore::host_partition::apply_options apply_options_for(const config& cfg, const rtcore::host_fs* fs) {
    rtcore::host_partition::apply_options o;
    o.pin_irqs = cfg.host.pin_irqs;
    o.isolation.rt_threads = cfg.dispatch.mode == dispatch_mode::tuned && !cfg.qpus.empty();
    o.isolation.restore_hint = "run `qrtd host restore`";
    if (fs != nullptr) {
        if (auto text = fs->read("/proc/self/cgroup")) {
            o.isolation.rt_cgroup = rtcore::v2_cgroup_of(*text);
        }
    }
    switch (cfg.host.isolation) {
        case isolation_mode::automatic: o.isolation.force.reset(); break;
        case isolation_mode::cgroup2: o.isolation.force = rtcore::isolation_method::cgroup_v2_partition; break;
        case isolation_mode::cgroup1: o.isolation.force = rtcore::isolation_method::cgroup_v1_cpuset; break;
        case isolation_mode::fence: o.isolation.force = rtcore::isolation_method::affinity_fence; break;
        case isolation_mode::none: o.isolation.force = rtcore::isolation_method::none; break;
    }
    o.knobs = rtcore::knob_options{false, false, false, false, false, false, cfg.host.disable_rt_throttling};
    for (const auto& name : cfg.host.runtime_knobs) {
        (void)rtcore::enable_knob(o.knobs, name);  // the option table checked the names
    }
    return o;
}

rtcore::rt_exemption own_dispatch_threads(const config& cfg, const rtcore::partition_plan& plan) {
    rtcore::rt_exemption own;
    if (cfg.dispatch.mode != dispatch_mode::tuned || cfg.qpus.empty()) {
        return own;
    }
    for (std::size_t i = 0; i < cfg.qpus.size(); ++i) {
        const int cpu = cfg.qpus[i].dispatch_cpu >= 0  ? cfg.qpus[i].dispatch_cpu
                        // QPUs sharing a CPU (plan_for) share one thread
                        // there: the fence exempts "qrt-dispatch" per CPU.
                        : !plan.rt_cpus.empty()        ? static_cast<int>(plan.rt_cpus[i % plan.rt_cpus.size()])
                                                       : -1;
        if (cpu >= 0) {
            own.cpus.set(static_cast<unsigned>(cpu));
        }
    }
    // Root reads /etc/passwd through NSS here, never a file of the daemon's.
    std::array<char, 4096> buf{};
    passwd pw{};
    passwd* found = nullptr;
    if (::getpwnam_r(cfg.agent.user.c_str(), &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
        own.uid = found->pw_uid;
    }
    return own;
}

std::string frame_pool_memlock_note(const config& cfg, const rtcore::memlock_allowance& allowance) {
    if (cfg.qpus.empty()) {
        return "";
    }
    const std::string why = dispatch::frame_pool_shortfall(frame_pool_bytes(cfg), cfg.qpus.size(), allowance);
    if (why.empty()) {
        return "";
    }
    const std::string who = "uid " + std::to_string(::geteuid());
    if (cfg.dispatch.mode == dispatch_mode::untuned) {
        return "dispatch: started as this process is (" + who +
               "), qrtd run would write from unregistered frame buffers (untuned mode): " + why;
    }
    return "dispatch: started as this process is (" + who +
           "), qrtd run would refuse to start: tuned mode cannot lock its frame buffers: " + why +
           "; or run dispatch.mode = \"untuned\"";
}

bool require_rt_for(const config& cfg, std::string* why) {
    const auto set = [&](bool v, std::string text) {
        if (why != nullptr) {
            *why = std::move(text);
        }
        return v;
    };
    switch (cfg.dispatch.require_rt) {
        case require_rt_mode::always: return set(true, "dispatch.require_rt = \"always\"");
        case require_rt_mode::never: return set(false, "dispatch.require_rt = \"never\"");
        case require_rt_mode::automatic: break;
    }
    const char* inv = std::getenv("INVOCATION_ID");
    if (inv != nullptr && *inv != '\0') {
        return set(true, "dispatch.require_rt = \"auto\": started by systemd (INVOCATION_ID is set)");
    }
    return set(false, "dispatch.require_rt = \"auto\": not started by systemd");
}

void delegate_to_agent_user(const config& cfg, rtcore::host_fs& fs, const rtcore::isolation_report& rep,
                            std::vector<std::string>& lines) {
    if (rep.method != rtcore::isolation_method::cgroup_v1_cpuset || cfg.agent.user == "root") {
        return;
    }
    auto ids = rtcore::lookup_user(cfg.agent.user, cfg.agent.group);
    if (!ids) {
        lines.push_back(fmt::format("isolation: warning: agent.user = \"{}\": {}; {}/tasks stays root's, so the "
                                    "dispatch threads of a daemon running as that user cannot join the isolated "
                                    "cpuset",
                                    cfg.agent.user, ids.err().message, rep.isolated_cgroup));
        return;
    }
    if (auto st = rtcore::delegate_rt_cgroup(fs, rep, ids->uid, ids->gid, ids->user, lines); !st) {
        lines.push_back("isolation: warning: " + st.err().message);
    }
}

// ---- the journal directory and the locks ----------------------------------

namespace {

// The fix an operator needs for a journal directory error, by its errno.
std::string journal_dir_hint(const host_context& ctx, int code) {
    if (code == EACCES) {
        return "; it is root's: run this as root";
    }
    if (code == EWOULDBLOCK) {
        return fmt::format(" (host.lock_wait_s = {}): another qrtd is changing the host; wait for it to finish or "
                           "stop it",
                           ctx.lock_wait.count());
    }
    return "";
}

std::string holder_text(const std::string& what) { return fmt::format("pid {}: {}", ::getpid(), what); }

}  // namespace

rtcore::result<rtcore::journal_dir> open_journal_dir(const host_context& ctx, const std::string& holder,
                                                     bool create) {
    rtcore::journal_dir::options o;
    o.create = create;
    o.lock = true;
    o.wait.max = std::chrono::duration_cast<std::chrono::milliseconds>(ctx.lock_wait);
    o.wait.progress = [](const std::string& line) { log::info("host", "{}", line); };
    o.holder = holder_text(holder);
    auto d = rtcore::journal_dir::open(ctx.journal_dir, o);
    if (!d) {
        return rtcore::error{d.err().code, d.err().message + journal_dir_hint(ctx, d.err().code)};
    }
    if (const auto* l = d->lock(); l != nullptr && !l->waited_for().empty()) {
        log::info("host", "waited {:.1f} s for {} (held by {})", static_cast<double>(l->waited().count()) / 1000.0,
                  l->path().string(), l->waited_for());
    }
    return d;
}

rtcore::result<std::optional<rtcore::journal_dir>> open_journal_dir_read_only(const host_context& ctx) {
    rtcore::journal_dir::options o;
    o.create = false;
    o.lock = false;
    auto d = rtcore::journal_dir::open(ctx.journal_dir, o);
    if (!d) {
        if (d.err().code == ENOENT) {
            return std::optional<rtcore::journal_dir>();
        }
        return rtcore::error{d.err().code, d.err().message + journal_dir_hint(ctx, d.err().code)};
    }
    return std::optional<rtcore::journal_dir>(std::move(*d));
}

namespace {

// The host seam for a command: writes only recorded in a dry run.
rtcore::host_fs host_fs_for(const host_context& ctx) {
    return rtcore::host_fs(ctx.root, ctx.dry_run ? rtcore::host_fs::mode::dry_run : rtcore::host_fs::mode::real);
}

// The journal directory of restore and verify, never created: none when
// nothing was ever applied here; checked read-only first, then (not in a dry
// run) opened again and locked for `holder`.
rtcore::result<std::optional<rtcore::journal_dir>> existing_journal_dir(const host_context& ctx,
                                                                        const std::string& holder) {
    auto ro = open_journal_dir_read_only(ctx);
    if (!ro || !*ro || ctx.dry_run) {
        return ro;
    }
    ro->reset();
    auto d = open_journal_dir(ctx, holder, false);
    if (!d) {
        return std::move(d).err();
    }
    return std::optional<rtcore::journal_dir>(std::move(*d));
}

// verify with nothing applied: a failure, except for the re-pin timer.
exit_code not_applied(const host_context& ctx) {
    if (ctx.repin) {
        log::info("host", "not applied: no journal in {}; nothing to re-pin", ctx.journal_dir.string());
        return exit_code::ok;
    }
    log::warn("host", "not applied: no journal in {}", ctx.journal_dir.string());
    return exit_code::failure;
}

}  // namespace

rtcore::result<state_dir_lock> lock_state_dir(const std::filesystem::path& state_dir) {
    rtcore::locked_dir_options o;
    o.what = "state directory";
    // qrtd.lock may belong to root (a run by hand) or to the daemon's user:
    // opened read-only, without following a symlink or blocking on a FIFO.
    o.policy = rtcore::dir_policy::any_owner;
    o.must_write = true;  // the ledger's database lives there
    o.lock_name = "qrtd.lock";
    o.if_missing = "; create it (installed systems: StateDirectory=qrtd; `qrtd run` as root creates it) or pass "
                   "--state-dir";
    o.if_not_writable = "; it must belong to the daemon's user (agent.user; installed systems: StateDirectory=qrtd; "
                        "`qrtd run` as root hands it over) or pass --state-dir";
    o.if_held = ": another qrtd runs on this state directory";
    return rtcore::open_locked_dir(state_dir, o);
}

// ---- what root leaves for the daemon ---------------------------------------

nlohmann::json partition_summary(const rtcore::host_partition::apply_report& rep, const std::string& boot_id,
                                 const std::string& applied_by) {
    json irq_counts = json::object();
    for (const auto a : {rtcore::irq_outcome::action::pinned, rtcore::irq_outcome::action::already_ok,
                         rtcore::irq_outcome::action::managed, rtcore::irq_outcome::action::refused,
                         rtcore::irq_outcome::action::gone, rtcore::irq_outcome::action::repinned,
                         rtcore::irq_outcome::action::new_pinned}) {
        if (const auto n = rep.irqs.count(a); n > 0) {
            irq_counts[rtcore::to_string(a)] = n;
        }
    }
    json managed = json::array();
    for (const auto& o : rep.irqs.irqs) {
        if (o.act == rtcore::irq_outcome::action::managed) {
            managed.push_back(o.lands_on_isolated.empty()
                                  ? fmt::format("{} ({})", o.irq, o.name)
                                  : fmt::format("{} ({}) on isolated CPU {}", o.irq, o.name, o.lands_on_isolated));
        }
    }
    return json{{"boot_id", boot_id},
                {"applied_by", applied_by},
                {"isolated", rep.isolated.to_list()},
                {"housekeeping", rep.housekeeping.to_list()},
                {"isolation", rtcore::to_string(rep.isolation.method)},
                {"isolation_not_used", rep.isolation.not_used},
                {"isolated_cgroup", rep.isolation.isolated_cgroup},
                {"housekeeping_cgroup", rep.isolation.housekeeping_cgroup},
                {"irq_counts", std::move(irq_counts)},
                {"managed_irqs", std::move(managed)},
                {"irqbalance", rep.irqs.irqbalance.line()},
                {"drift", rep.drift}};
}

void write_partition_summary(const std::filesystem::path& state_dir, const nlohmann::json& summary) {
    auto dir = rtcore::secure_dir::open(state_dir, rtcore::dir_policy::any_owner, "state directory");
    if (!dir) {
        log::info("host", "no partition summary for agent.status: {}", dir.err().message);
        return;
    }
    if (auto st = dir->replace_file(partition_summary_name, summary.dump(2) + "\n", 0644); !st) {
        log::warn("host", "partition summary for agent.status: {}", st.err().message);
    }
}

void remove_partition_summary(const std::filesystem::path& state_dir) {
    auto dir = rtcore::secure_dir::open(state_dir, rtcore::dir_policy::any_owner, "state directory");
    if (!dir) {
        return;
    }
    if (auto st = dir->remove_file(partition_summary_name); !st) {
        log::warn("host", "{}", st.err().message);
    }
}

std::optional<nlohmann::json> read_partition_summary(const std::filesystem::path& state_dir,
                                                     const std::string& boot_id) {
    auto dir = rtcore::secure_dir::open(state_dir, rtcore::dir_policy::any_owner, "state directory");
    if (!dir) {
        return std::nullopt;
    }
    auto text = dir->read_file(partition_summary_name, 1U << 20);
    if (!text) {
        return std::nullopt;
    }
    auto j = json::parse(*text, nullptr, false);
    if (!j.is_object() || j.value("boot_id", std::string()) != boot_id) {
        return std::nullopt;
    }
    return j;
}

void write_restore_report(const rtcore::journal_dir& dir, const std::string& who, const std::string& boot_id,
                          const rtcore::host_partition::restore_report& rep) {
    const auto now = std::chrono::system_clock::now();
    std::string text = fmt::format("restored by {} at {:%Y-%m-%dT%H:%M:%S}Z in boot {}\n", who,
                                   fmt::gmtime(std::chrono::system_clock::to_time_t(now)), boot_id);
    text += rep.summary() + "; " + (rep.complete ? "complete" : "INCOMPLETE") + "; journal " +
            (rep.journal_removed ? "removed" : "kept") + "\n";
    for (const auto& it : rep.items) {
        text += it.line() + "\n";
    }
    for (const auto& p : rep.problems) {
        text += "problem: " + p + "\n";
    }
    if (auto st = dir.write_report(text); !st) {
        log::warn("host", "restore report: {}", st.err().message);
    }
}

std::vector<std::string> last_restore_lines(const rtcore::journal_dir& dir) {
    std::vector<std::string> out;
    auto text = dir.read_report();
    if (!text || !*text) {
        return out;
    }
    std::size_t pos = 0;
    const std::string& t = **text;
    while (pos < t.size() && out.size() < 2) {
        const auto nl = t.find('\n', pos);
        std::string line = t.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
        for (auto& c : line) {
            if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
                c = '?';
            }
        }
        out.push_back(std::move(line));
        if (nl == std::string::npos) {
            break;
        }
        pos = nl + 1;
    }
    return out;
}

// ---- the commands ---------------------------------------------------------

namespace {

struct planned_host {
    rtcore::topology topo;
    rtcore::partition_plan plan;
};

// The host's topology and the plan made on it; a failure is logged and
// becomes the command's exit status.
std::variant<planned_host, exit_code> plan_host(const config& cfg, const host_context& ctx,
                                                const rtcore::host_fs& fs) {
    std::string note;
    auto topo = load_topology(ctx, fs, &note);
    if (!topo) {
        return fail("topology", topo.err());
    }
    if (!note.empty()) {
        log::info("topology", "{}", note);
    }
    auto plan = plan_for(cfg, *topo);
    if (!plan) {
        return fail("plan", plan.err());
    }
    return planned_host{std::move(*topo), std::move(*plan)};
}

}  // namespace

exit_code host_plan(const config& cfg, const host_context& ctx, std::ostream& out) {
    // Planning reads only: a dry-run host_fs makes sure of it.
    rtcore::host_fs fs(ctx.root, rtcore::host_fs::mode::dry_run);
    auto planned = plan_host(cfg, ctx, fs);
    if (auto* failed = std::get_if<exit_code>(&planned)) {
        return *failed;
    }
    auto& [topo, plan] = std::get<planned_host>(planned);
    if (ctx.slurm) {
        slurm_plan_options so;
        so.node_name = short_hostname();
        const auto sp = plan_slurm(topo, plan, cfg, so);
        out << (ctx.json ? to_json(sp).dump(2) + "\n" : format_slurm_plan(sp));
        return exit_code::ok;
    }
    const auto kernel = rtcore::probe_kernel(fs, plan.isolated);
    // The runtime knobs, before -> after, as apply would set them (read only:
    // the fs is a dry run and the journal lives in memory).
    json knobs_json = nullptr;
    std::vector<std::string> knob_lines;
    {
        rtcore::real_task_ops tasks;
        auto journal = rtcore::restore_journal::open_dry_run(fs, nullptr, rtcore::restore_allow_list::for_host(fs));
        auto knobs = journal ? rtcore::apply_knobs(fs, tasks, *journal, plan.isolated, plan.housekeeping,
                                                   apply_options_for(cfg).knobs)
                             : rtcore::result<rtcore::knob_report>(journal.err());
        if (knobs) {
            knobs_json = to_json(*knobs);
            knob_lines = knobs->lines;
        } else {
            knob_lines.push_back("knob: cannot list the runtime knobs: " + knobs.err().message);
        }
    }
    // Which isolation method apply would use, and how the dispatch threads
    // would reach their CPUs (read-only).
    const auto iso = rtcore::preview_isolation(fs, nullptr, apply_options_for(cfg, &fs).isolation);
    const auto allowance = rtcore::current_memlock_allowance();
    const std::string memlock = frame_pool_memlock_note(cfg, allowance);
    if (ctx.json) {
        out << json{{"topology", topo.source()},
                    {"plan", to_json(plan)},
                    {"kernel", to_json(kernel)},
                    {"knobs", std::move(knobs_json)},
                    {"isolation",
                     {{"method", rtcore::to_string(iso.method)}, {"not_used", iso.not_used}, {"lines", iso.lines}}},
                    {"memlock",
                     {{"frame_pool_bytes", cfg.qpus.empty() ? 0 : frame_pool_bytes(cfg) * cfg.qpus.size()},
                      {"limit_bytes", allowance.unlimited ? json(nullptr) : json(allowance.limit)},
                      {"cap_ipc_lock", allowance.cap_ipc_lock},
                      {"ok", memlock.empty()},
                      {"message", memlock}}}}
                   .dump(2)
            << '\n';
    } else {
        out << "topology: " << topo.source() << '\n'
            << topo.describe() << '\n'
            << rtcore::format_plan(plan,
                                   [&](std::size_t q) {
                                       // QPUs sharing a CPU (plan_for): QPU i is on CPU i mod n.
                                       std::string who = fmt::format("qpu {}", q);
                                       for (std::size_t i = q + plan.rt_cpus.size(); i < cfg.qpus.size();
                                            i += plan.rt_cpus.size()) {
                                           who += fmt::format("+{}", i);
                                       }
                                       return who + " dispatch cpu";
                                   })
            << '\n';
        const std::string report = rtcore::format_kernel_report(kernel);
        out << report << (report.empty() || report.back() == '\n' ? "" : "\n");
        out << "runtime knobs (host.runtime_knobs; before -> after as apply sets them):\n";
        for (const auto& l : knob_lines) {
            out << "  " << l << '\n';
        }
        print_lines(out, iso.lines);
        if (!memlock.empty()) {
            out << memlock << '\n';
        }
    }
    return exit_code::ok;
}

exit_code host_apply(const config& cfg, const host_context& ctx, std::ostream& out) {
    rtcore::host_fs fs = host_fs_for(ctx);
    auto planned = plan_host(cfg, ctx, fs);
    if (auto* failed = std::get_if<exit_code>(&planned)) {
        return *failed;
    }
    auto& [topo, plan] = std::get<planned_host>(planned);
    // The journal directory: created (root:root 0700) when missing, checked,
    // and locked; a dry run only reads it, when it exists.
    std::optional<rtcore::journal_dir> dir;
    if (ctx.dry_run) {
        auto d = open_journal_dir_read_only(ctx);
        if (!d) {
            return fail("host", d.err());
        }
        dir = std::move(*d);
    } else {
        auto d = open_journal_dir(ctx, "qrtd host apply", true);
        if (!d) {
            return fail("host", d.err());
        }
        dir.emplace(std::move(*d));
    }
    rtcore::real_task_ops tasks;
    auto opts = apply_options_for(cfg, &fs);
    opts.by = rtcore::rec::applier::host_apply;
    auto rep = rtcore::host_partition::apply(fs, tasks, dir ? &*dir : nullptr, plan.isolated,
                                             plan.housekeeping, opts);
    if (!rep) {
        return fail("host", rep.err());
    }
    // The unit's ExecStartPre=+: the daemon (agent.user) starts next and
    // its dispatch threads join the isolated cpuset themselves (v1).
    delegate_to_agent_user(cfg, fs, rep->isolation, rep->lines);
    if (!rep->dry_run) {
        write_partition_summary(ctx.state_dir, partition_summary(*rep, rtcore::current_boot_id(fs),
                                                                 rtcore::rec::to_string(rep->journal_by)));
    }
    if (ctx.json) {
        out << json{{"plan", to_json(plan)}, {"apply", to_json(*rep)}}.dump(2) << '\n';
    } else {
        print_lines(out, rep->lines);
        if (rep->dry_run) {
            out << "dry run: " << rep->planned_writes.size() << " writes planned, none made\n";
            for (const auto& w : rep->planned_writes) {
                out << "  write " << w.path << " <- " << w.data << '\n';
            }
        }
    }
    for (const auto& d : rep->drift) {
        log::warn("host", "drift: {}", d);
    }
    for (const auto& k : rep->knobs.knobs) {
        if (k.act == rtcore::knob_outcome::action::failed) {
            log::warn("knob", "{}", k.line().substr(6));
        }
    }
    log::info("host", "{}applied: isolated {}, housekeeping {}, isolation {}{}",
              rep->dry_run ? "(dry run) " : "", rep->isolated.to_list(), rep->housekeeping.to_list(),
              rtcore::to_string(rep->isolation.method),
              rep->continued_journal ? (rep->drift.empty() ? " (already applied; checked against the host: no drift)"
                                                           : " (already applied; drift re-applied)")
                                     : "");
    return exit_code::ok;
}

namespace {

// A journal of an older qrtd, in the daemon's state directory where the
// daemon's user could write it: never replayed, only named.
void warn_legacy_journal(const host_context& ctx) {
    const auto legacy = ctx.state_dir / rtcore::restore_journal::file_name;
    struct stat st {};
    if (!ctx.state_dir.empty() && ::lstat(legacy.c_str(), &st) == 0) {
        log::warn("host", "{} is a journal of an older qrtd, in the daemon's state directory: it is never replayed "
                          "as root (the daemon's user could have written it).  If the host is still partitioned "
                          "from before the upgrade, check it by hand or reboot, then remove the file",
                  legacy.string());
    }
}

}  // namespace

exit_code host_restore(const host_context& ctx, std::ostream& out) {
    rtcore::host_fs fs = host_fs_for(ctx);
    warn_legacy_journal(ctx);
    // Never created here: no directory means nothing was ever applied.
    auto opened = existing_journal_dir(ctx, "qrtd host restore");
    if (!opened) {
        return fail("host", opened.err());
    }
    std::optional<rtcore::journal_dir>& dir = *opened;
    if (!dir) {
        // Never applied here (apply creates the directory).
        if (ctx.json) {
            out << json{{"journal_found", false}, {"complete", true}, {"journal_removed", false},
                        {"other_boot", false}, {"items", json::array()}, {"problems", json::array()},
                        {"stale_journals", json::array()}, {"last_restore", json::array()},
                        {"lines", json::array()}}
                       .dump(2)
                << '\n';
        } else {
            out << "restore: no journal directory " << ctx.journal_dir.string() << ": nothing to restore\n";
        }
        log::info("host", "nothing to restore: no journal directory {}", ctx.journal_dir.string());
        return exit_code::ok;
    }
    rtcore::real_task_ops tasks;
    auto rep = rtcore::host_partition::restore(fs, tasks, &*dir);
    if (!rep) {
        return fail("host", rep.err());
    }
    const std::string boot = rtcore::current_boot_id(fs);
    std::vector<std::string> last;
    if (!ctx.dry_run) {
        if (rep->journal_found) {
            write_restore_report(*dir, fmt::format("qrtd host restore (pid {})", ::getpid()), boot, *rep);
            if (rep->complete) {
                remove_partition_summary(ctx.state_dir);
            }
        } else {
            last = last_restore_lines(*dir);
        }
    }
    // Journals of earlier boots, set aside (the reboot reset what they
    // recorded): nothing to restore from them, but say they are there.
    std::vector<std::string> stale;
    for (const auto& p : dir->stale_journals()) {
        stale.push_back(p.string());
    }
    if (ctx.json) {
        json items = json::array();
        for (const auto& i : rep->items) {
            items.push_back(i.line());
        }
        out << json{{"journal_found", rep->journal_found},
                    {"complete", rep->complete},
                    {"journal_removed", rep->journal_removed},
                    {"other_boot", rep->other_boot},
                    {"items", std::move(items)},
                    {"problems", rep->problems},
                    {"stale_journals", stale},
                    {"last_restore", last},
                    {"lines", rep->lines}}
                   .dump(2)
            << '\n';
    } else {
        print_lines(out, rep->lines);
        print_lines(out, rep->problems);
        if (!last.empty()) {
            out << "last restore: " << last.front() << (last.size() > 1 ? ": " + last[1] : std::string()) << '\n';
        }
        for (const auto& p : stale) {
            out << "set aside from an earlier boot (nothing to restore; remove it when no longer wanted): " << p
                << '\n';
        }
    }
    if (!rep->journal_found) {
        log::info("host", "nothing to restore: no journal in {}{}", ctx.journal_dir.string(),
                  last.empty() ? std::string() : "; the last restore was " + last.front().substr(9));
        return exit_code::ok;
    }
    if (!rep->complete) {
        log::error("host", "restore incomplete: {} items failed; the journal in {} is kept, run "
                           "`qrtd host restore` again after fixing the cause",
                   rep->count(rtcore::restore_item::outcome::failed), ctx.journal_dir.string());
        return exit_code::failure;
    }
    log::info("host", "restored: {}", rep->summary());
    return exit_code::ok;
}

exit_code host_verify(const config& cfg, const host_context& ctx, std::ostream& out) {
    rtcore::host_fs fs = host_fs_for(ctx);
    auto opened = existing_journal_dir(ctx, "qrtd host verify");
    if (!opened) {
        return fail("host", opened.err());
    }
    std::optional<rtcore::journal_dir>& dir = *opened;
    if (!dir) {
        if (ctx.json) {
            out << json{{"applied", false}, {"clean", false}}.dump(2) << '\n';
        } else {
            out << "verify: no journal directory " << ctx.journal_dir.string() << ": the partition is not applied\n";
        }
        return not_applied(ctx);
    }
    // The plan says which CPUs the daemon's dispatch threads pinned
    // themselves to: the fence sweep leaves them there.
    auto planned = plan_host(cfg, ctx, fs);
    if (auto* failed = std::get_if<exit_code>(&planned)) {
        return *failed;
    }
    auto vopts = apply_options_for(cfg);
    vopts.isolation.own_rt = own_dispatch_threads(cfg, std::get<planned_host>(planned).plan);
    rtcore::real_task_ops tasks;
    auto rep = rtcore::host_partition::verify(fs, tasks, *dir, vopts);
    if (!rep) {
        return fail("host", rep.err());
    }
    if (ctx.json) {
        out << json{{"applied", rep->applied},
                    {"clean", rep->clean},
                    {"isolated", rep->isolated.to_list()},
                    {"housekeeping", rep->housekeeping.to_list()},
                    {"method", rtcore::to_string(rep->method)},
                    {"irqs", to_json(rep->irqs)},
                    {"isolation", to_json(rep->isolation)},
                    {"knobs", to_json(rep->knobs)},
                    {"lines", rep->lines}}
                   .dump(2)
            << '\n';
    } else {
        print_lines(out, rep->lines);
    }
    if (!rep->applied) {
        return not_applied(ctx);
    }
    if (ctx.repin && !ctx.dry_run) {
        // What a re-pin cannot fix: irqbalance moving IRQs back, a lost
        // cpuset partition (drift without a task moved).
        using a = rtcore::irq_outcome::action;
        const std::size_t fixed = rep->irqs.count(a::repinned) + rep->irqs.count(a::new_pinned);
        const std::size_t left = rep->irqs.count(a::left_to_irqbalance);
        const bool isolation_left = rep->isolation.drift && rep->isolation.tasks_moved == 0;
        for (const auto& o : rep->irqs.irqs) {
            if (o.act == a::repinned || o.act == a::new_pinned) {
                log::warn("irq", "re-pinned: {}", o.line());
            }
        }
        if (left > 0 || isolation_left) {
            log::error("host", "drift left after the re-pin: {} IRQs left to irqbalance{}; see `qrtd host verify`",
                       left, isolation_left ? ", the isolation itself drifted (restore, then apply)" : "");
            return exit_code::failure;
        }
        if (fixed > 0 || rep->isolation.tasks_moved > 0) {
            log::info("host", "re-pinned {} IRQs and moved {} tasks back; the host is as applied", fixed,
                      rep->isolation.tasks_moved);
        }
        return exit_code::ok;
    }
    if (!rep->clean) {
        log::warn("host", "drift found{}", ctx.dry_run ? " (dry run: nothing re-pinned)" : " and fixed");
        return exit_code::failure;
    }
    return exit_code::ok;
}

}  // namespace qrt
