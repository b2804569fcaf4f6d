#include "qrt/host_cmd.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <filesystem>
#include <ostream>

#include "qrt/log.hpp"
#include "qrt/slurm_plan.hpp"
#include "rtcore/kernel_probe.hpp"
#include "rtcore/task_ops.hpp"

namespace qrt {
namespace {

using json = nlohmann::json;

json to_json(const rtcore::partition_plan& p) {
    return json{{"online", p.online.to_list()},
                {"isolated", p.isolated.to_list()},
                {"housekeeping", p.housekeeping.to_list()},
                {"dispatch_cpus", p.dispatch_cpus},
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
                {"irqs", to_json(r.irqs)},
                {"isolation", to_json(r.isolation)},
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
    req.qpu_count = static_cast<unsigned>(std::max<std::size_t>(1, cfg.qpus.size()));
    req.min_housekeeping_cores = cfg.host.housekeeping_min_cores;
    std::size_t explicit_cpus = 0;
    for (const auto& q : cfg.qpus) {
        if (q.dispatch_cpu >= 0) {
            ++explicit_cpus;
        }
    }
    if (explicit_cpus == cfg.qpus.size() && explicit_cpus > 0) {
        for (const auto& q : cfg.qpus) {
            req.dispatch_cpus.push_back(static_cast<unsigned>(q.dispatch_cpu));
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
    return rtcore::plan_partition(topo, req);
}

rtcore::host_partition::apply_options apply_options_for(const config& cfg) {
    rtcore::host_partition::apply_options o;
    o.pin_irqs = cfg.host.pin_irqs;
    switch (cfg.host.isolation) {
        case isolation_mode::automatic: o.isolation.force.reset(); break;
        case isolation_mode::cgroup2: o.isolation.force = rtcore::isolation_method::cgroup_v2_partition; break;
        case isolation_mode::cgroup1: o.isolation.force = rtcore::isolation_method::cgroup_v1_cpuset; break;
        case isolation_mode::fence: o.isolation.force = rtcore::isolation_method::affinity_fence; break;
        case isolation_mode::none: o.isolation.force = rtcore::isolation_method::none; break;
    }
    return o;
}

rtcore::status check_state_dir(const std::filesystem::path& state_dir) {
    std::error_code ec;
    if (std::filesystem::is_directory(state_dir, ec)) {
        return rtcore::ok();
    }
    return rtcore::error{ec ? ec.value() : ENOENT,
                         fmt::format("state directory {}: {}; create it (installed systems: "
                                     "tmpfiles.d/qrtd.conf and StateDirectory=qrtd do) or pass "
                                     "--state-dir",
                                     state_dir.string(),
                                     ec ? ec.message() : std::string("does not exist or is not a directory"))};
}

// ---- state_dir_lock -------------------------------------------------------

rtcore::result<state_dir_lock> state_dir_lock::acquire(const std::filesystem::path& state_dir) {
    const std::string path = (state_dir / "qrtd.lock").string();
    // O_RDONLY is enough for flock and works on a lock file another user
    // (root's ExecStartPre, or the qrtd user) created.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        return rtcore::error::from_errno("open " + path);
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) < 0) {
        const int err = errno;
        ::close(fd);
        if (err == EWOULDBLOCK) {
            return rtcore::error{err, "flock " + path +
                                          ": another qrtd holds it (a running daemon, or a host "
                                          "command in progress)"};
        }
        return rtcore::error::from_errno(err, "flock " + path);
    }
    return state_dir_lock(fd);
}

state_dir_lock& state_dir_lock::operator=(state_dir_lock&& o) noexcept {
    if (this != &o) {
        if (_fd >= 0) {
            ::close(_fd);
        }
        _fd = o._fd;
        o._fd = -1;
    }
    return *this;
}

state_dir_lock::~state_dir_lock() {
    if (_fd >= 0) {
        ::close(_fd);
    }
}

// ---- the commands ---------------------------------------------------------

exit_code host_plan(const config& cfg, const host_context& ctx, std::ostream& out) {
    // Planning reads only: a dry-run host_fs makes sure of it.
    rtcore::host_fs fs(ctx.root, rtcore::host_fs::mode::dry_run);
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
    if (ctx.slurm) {
        slurm_plan_options so;
        so.node_name = short_hostname();
        const auto sp = plan_slurm(*topo, *plan, cfg, so);
        out << (ctx.json ? to_json(sp).dump(2) + "\n" : format_slurm_plan(sp));
        return exit_code::ok;
    }
    const auto kernel = rtcore::probe_kernel(fs, plan->isolated);
    if (ctx.json) {
        out << json{{"topology", topo->source()},
                    {"plan", to_json(*plan)},
                    {"kernel", to_json(kernel)}}
                   .dump(2)
            << '\n';
    } else {
        out << "topology: " << topo->source() << '\n'
            << topo->describe() << '\n'
            << rtcore::format_plan(*plan) << '\n';
        const std::string report = rtcore::format_kernel_report(kernel);
        out << report << (report.empty() || report.back() == '\n' ? "" : "\n");
    }
    return exit_code::ok;
}

exit_code host_apply(const config& cfg, const host_context& ctx, std::ostream& out) {
    rtcore::host_fs fs(ctx.root, ctx.dry_run ? rtcore::host_fs::mode::dry_run
                                             : rtcore::host_fs::mode::real);
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
    std::optional<state_dir_lock> lock;
    if (!ctx.dry_run) {
        if (auto st = check_state_dir(ctx.state_dir); !st) {
            return fail("host", st.err());
        }
        auto l = state_dir_lock::acquire(ctx.state_dir);
        if (!l) {
            return fail("host", l.err());
        }
        lock.emplace(std::move(*l));
    }
    rtcore::real_task_ops tasks;
    auto rep = rtcore::host_partition::apply(fs, tasks, ctx.state_dir, plan->isolated,
                                             plan->housekeeping, apply_options_for(cfg));
    if (!rep) {
        return fail("host", rep.err());
    }
    if (ctx.json) {
        out << json{{"plan", to_json(*plan)}, {"apply", to_json(*rep)}}.dump(2) << '\n';
    } else {
        print_lines(out, rep->lines);
        if (rep->dry_run) {
            out << "dry run: " << rep->planned_writes.size() << " writes planned, none made\n";
            for (const auto& w : rep->planned_writes) {
                out << "  write " << w.path << " <- " << w.data << '\n';
            }
        }
    }
    log::info("host", "{}applied: isolated {}, housekeeping {}, isolation {}",
              rep->dry_run ? "(dry run) " : "", rep->isolated.to_list(),
              rep->housekeeping.to_list(), rtcore::to_string(rep->isolation.method));
    return exit_code::ok;
}

exit_code host_restore(const host_context& ctx, std::ostream& out) {
    rtcore::host_fs fs(ctx.root, ctx.dry_run ? rtcore::host_fs::mode::dry_run
                                             : rtcore::host_fs::mode::real);
    std::optional<state_dir_lock> lock;
    if (!ctx.dry_run) {
        if (auto st = check_state_dir(ctx.state_dir); !st) {
            return fail("host", st.err());
        }
        auto l = state_dir_lock::acquire(ctx.state_dir);
        if (!l) {
            return fail("host", l.err());
        }
        lock.emplace(std::move(*l));
    }
    rtcore::real_task_ops tasks;
    auto rep = rtcore::host_partition::restore(fs, tasks, ctx.state_dir);
    if (!rep) {
        return fail("host", rep.err());
    }
    // Journals of earlier boots, set aside (the reboot reset what they
    // recorded): nothing to restore from them, but say they are there.
    std::vector<std::string> stale;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(ctx.state_dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind(std::string(rtcore::restore_journal::file_name) + ".", 0) == 0 && name.size() > 6 && name.compare(name.size() - 6, 6, ".stale") == 0) {
            stale.push_back(e.path().string());
        }
    }
    std::sort(stale.begin(), stale.end());
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
                    {"lines", rep->lines}}
                   .dump(2)
            << '\n';
    } else {
        print_lines(out, rep->lines);
        print_lines(out, rep->problems);
        for (const auto& p : stale) {
            out << "set aside from an earlier boot (nothing to restore; remove it when no longer wanted): " << p
                << '\n';
        }
    }
    if (!rep->journal_found) {
        log::info("host", "nothing to restore: no journal in {}", ctx.state_dir.string());
        return exit_code::ok;
    }
    if (!rep->complete) {
        log::error("host", "restore incomplete: {} items failed; the journal in {} is kept, run "
                           "`qrtd host restore` again after fixing the cause",
                   rep->count(rtcore::restore_item::outcome::failed), ctx.state_dir.string());
        return exit_code::failure;
    }
    log::info("host", "restored: {} values put back, {} unchanged, {} gone",
              rep->count(rtcore::restore_item::outcome::restored),
              rep->count(rtcore::restore_item::outcome::unchanged),
              rep->count(rtcore::restore_item::outcome::gone));
    return exit_code::ok;
}

exit_code host_verify(const config& cfg, const host_context& ctx, std::ostream& out) {
    rtcore::host_fs fs(ctx.root, ctx.dry_run ? rtcore::host_fs::mode::dry_run
                                             : rtcore::host_fs::mode::real);
    if (auto st = check_state_dir(ctx.state_dir); !st) {
        return fail("host", st.err());
    }
    rtcore::real_task_ops tasks;
    auto rep = rtcore::host_partition::verify(fs, tasks, ctx.state_dir, apply_options_for(cfg));
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
                    {"lines", rep->lines}}
                   .dump(2)
            << '\n';
    } else {
        print_lines(out, rep->lines);
    }
    if (!rep->applied) {
        log::warn("host", "not applied: no journal in {}", ctx.state_dir.string());
        return exit_code::failure;
    }
    if (!rep->clean) {
        log::warn("host", "drift found{}", ctx.dry_run ? " (dry run: nothing re-pinned)" : " and fixed");
        return exit_code::failure;
    }
    return exit_code::ok;
}

}  // namespace qrt
