// `qrtd run`: startup order, main loop, shutdown.  See daemon::run().

#include "qrt/daemon.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <exception>
#include <utility>

#include <systemd/sd-daemon.h>

#include "qrt/config_table.hpp"
#include "qrt/proto/endpoint.hpp"
#include "qrt/event_loop.hpp"
#include "qrt/log.hpp"
#include "qrt/sd_notify.hpp"
#include "restore_helper.hpp"
#include "services.hpp"
#include "rtcore/capabilities.hpp"
#include "rtcore/kernel_probe.hpp"
#include "rtcore/memory_lock.hpp"
#include "rtcore/secure_dir.hpp"
#include "rtcore/task_ops.hpp"
#include "rtcore/unique_fd.hpp"
#include "rtcore/user_switch.hpp"

namespace qrt {
namespace {

using rtcore::unique_fd;

// The capabilities `qrtd run` keeps: SCHED_FIFO and affinity, the eBPF
// probes, and CAP_IPC_LOCK only where RLIMIT_MEMLOCK cannot be made
// unlimited (memlock_unlimited): a container without CAP_SYS_RESOURCE.
constexpr rtcore::capability kept_caps[] = {CAP_SYS_NICE, CAP_IPC_LOCK, CAP_BPF, CAP_PERFMON};

// The dispatch paths lock their memory (frame pools, code, stacks, rings)
// within RLIMIT_MEMLOCK, or beyond it with CAP_IPC_LOCK.  qrtd.service sets
// LimitMEMLOCK=infinity; `qrtd run` started otherwise raises its own limit
// to the same while it may (the soft limit up to a hard one that is
// unlimited, or both as root), so that it need not keep CAP_IPC_LOCK, which
// would also let it lock any amount and other users' SysV segments.  True
// when the limit is unlimited now.
bool memlock_unlimited() {
    rlimit rl{};
    if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
        return false;
    }
    if (rl.rlim_cur == RLIM_INFINITY) {
        return true;
    }
    // Up to an unlimited hard limit anyone may; a finite hard limit only
    // with CAP_SYS_RESOURCE (root, not in most containers).
    const rlimit unlimited{RLIM_INFINITY, RLIM_INFINITY};
    if (::setrlimit(RLIMIT_MEMLOCK, &unlimited) != 0) {
        log::info("caps", "RLIMIT_MEMLOCK stays {} (raising it: {}; no CAP_SYS_RESOURCE): CAP_IPC_LOCK is kept, "
                          "if permitted, for the locked dispatch paths",
                  rtcore::mib_text(static_cast<std::uint64_t>(rl.rlim_cur)), std::strerror(errno));
        return false;
    }
    log::info("caps", "RLIMIT_MEMLOCK raised from {} to unlimited (as qrtd.service's LimitMEMLOCK=infinity)",
              rtcore::mib_text(static_cast<std::uint64_t>(rl.rlim_cur)));
    return true;
}

// Blocks the shutdown signals in this thread (and so in every thread created
// later) for as long as it lives; they are read from a signalfd instead.
class blocked_signals {
public:
    blocked_signals() {
        sigemptyset(&_set);
        sigaddset(&_set, SIGTERM);
        sigaddset(&_set, SIGINT);
        sigaddset(&_set, SIGHUP);
        pthread_sigmask(SIG_BLOCK, &_set, &_old);
    }
    ~blocked_signals() { pthread_sigmask(SIG_SETMASK, &_old, nullptr); }
    blocked_signals(const blocked_signals&) = delete;
    blocked_signals& operator=(const blocked_signals&) = delete;
    const sigset_t& set() const { return _set; }

private:
    sigset_t _set{};
    sigset_t _old{};
};

// Who `qrtd run` becomes after its root-only setup.
struct run_identity {
    bool switch_user = false;           // started as root and agent.user is not root
    std::optional<rtcore::user_ids> ids;
};

const char* signal_name(std::uint32_t sig) {
    switch (sig) {
        case SIGTERM: return "SIGTERM";
        case SIGINT: return "SIGINT";
        case SIGHUP: return "SIGHUP";
        default: return "signal";
    }
}

// SIGHUP: re-read the config and say what changed.  Only log_level takes
// effect at once; every other option is read at startup.
void reload_config(const run_options& opts, config& current, const rtcore::host_fs& fs) {
    auto loaded = load_config_file(opts.config_path, {read_online_cpus(fs)});
    if (!loaded.ok()) {
        for (const auto& e : loaded.errors) {
            log::error("config", "reload: {}", e.to_string());
        }
        log::warn("config", "reload: {} keeps running with the configuration it started with",
                  opts.config_path.string());
        return;
    }
    config next = std::move(loaded.cfg);
    if (opts.state_dir) {
        next.agent.state_dir = opts.state_dir->string();
    }
    if (opts.journal_dir) {
        next.host.journal_dir = opts.journal_dir->string();
    }
    if (opts.level) {
        next.agent.level = *opts.level;
    }
    unsigned changed = 0;
    static const qpu_config no_qpu;
    for (const auto& opt : config_table()) {
        if (opt.section == "qpu") {
            continue;
        }
        const auto before = render_value(opt, opt.load(current, no_qpu));
        const auto after = render_value(opt, opt.load(next, no_qpu));
        if (before == after) {
            continue;
        }
        ++changed;
        if (opt.section == "agent" && opt.key == "log_level") {
            log::set_level(next.agent.level);
            current.agent.level = next.agent.level;
            log::info("config", "reload: agent.log_level = {} (was {})", after, before);
        } else {
            log::warn("config", "reload: {} = {} (was {}) takes effect at the next start",
                      opt.full_name(), after, before);
        }
    }
    if (next.qpus != current.qpus) {
        ++changed;
        log::warn("config", "reload: the [[qpu]] tables changed; they take effect at the next start");
    }
    log::info("config", "reload: {} read, {} change{}", opts.config_path.string(), changed,
              changed == 1 ? "" : "s");
}

// ---- the start-up steps, in the order daemon::run() calls them -------------

// Step 1: the config, with the command line's overrides.
std::optional<config> load_run_config(const run_options& opts, const rtcore::host_fs& fs) {
    auto loaded = load_config_file(opts.config_path, {read_online_cpus(fs)});
    if (!loaded.ok()) {
        for (const auto& e : loaded.errors) {
            log::error("config", "{}", e.to_string());
        }
        return std::nullopt;
    }
    config cfg = std::move(loaded.cfg);
    if (opts.state_dir) {
        cfg.agent.state_dir = opts.state_dir->string();
    }
    if (opts.journal_dir) {
        cfg.host.journal_dir = opts.journal_dir->string();
    }
    if (opts.level) {
        cfg.agent.level = *opts.level;
    }
    if (auto why = journal_dir_apart(cfg.host.journal_dir, cfg.agent.state_dir)) {
        log::error("config", "{}", *why);
        return std::nullopt;
    }
    return cfg;
}

// Step 2: who to become.  Checked before anything changes, so a missing
// user costs nothing on the host.
rtcore::result<run_identity> resolve_identity(const config& cfg) {
    run_identity id;
    if (::geteuid() != 0) {
        return id;  // nothing to drop but capabilities
    }
    if (cfg.agent.user == "root") {
        log::warn("daemon", "agent.user = \"root\": the daemon keeps uid 0 after setup (only its capabilities "
                            "are dropped); any bug in the socket server would run as root.  Set agent.user = "
                            "\"qrtd\" (systemd-sysusers creates it) to drop it");
        return id;
    }
    auto ids = rtcore::lookup_user(cfg.agent.user, cfg.agent.group);
    if (!ids) {
        return rtcore::error{ids.err().code,
                             fmt::format("agent.user = \"{}\", agent.group = \"{}\": {}.  `qrtd run` started as "
                                         "root drops to that user after its setup; create it with "
                                         "`systemd-sysusers /usr/lib/sysusers.d/qrtd.conf` (the package's "
                                         "sysusers.d file), or set agent.user = \"root\" to keep root (not "
                                         "recommended)",
                                         cfg.agent.user, cfg.agent.group, ids.err().message)};
    }
    id.switch_user = true;
    id.ids = std::move(*ids);
    return id;
}

// Step 3a, not root: a missing state directory is created (mode 0750) when
// its parent belongs to this user, as `--state-dir $d/state` under a
// `mktemp -d` of theirs (README, "From Qiskit"); in anyone else's directory
// (/var/lib, a shared /tmp) it is not, and the refusal says whose the parent
// is and what to do.  An existing one is checked by the lock (step 3b).
rtcore::status prepare_own_state_dir(const std::filesystem::path& state_dir, bool named_by_option) {
    struct stat st {};
    if (::lstat(state_dir.c_str(), &st) == 0) {
        return rtcore::ok();
    }
    if (const int err = errno; err != ENOENT) {
        return rtcore::error::from_errno(err, "state directory " + state_dir.string());
    }
    const uid_t me = ::geteuid();
    const std::string elsewhere =
        named_by_option ? "or pass --state-dir a path in a directory of yours" : "or pass --state-dir";
    const std::filesystem::path parent =
        state_dir.has_parent_path() ? state_dir.parent_path() : std::filesystem::path(".");
    struct stat pst {};
    if (::lstat(parent.c_str(), &pst) < 0) {
        const int err = errno;
        return rtcore::error{err, fmt::format("state directory {} does not exist, nor does its parent {} ({}): "
                                              "create them (mkdir -p -m 0750 {}) {}",
                                              state_dir.string(), parent.string(), std::strerror(err),
                                              state_dir.string(), elsewhere)};
    }
    if (!S_ISDIR(pst.st_mode) || pst.st_uid != me) {
        return rtcore::error{ENOENT, fmt::format("state directory {} does not exist, and qrtd (uid {}) creates one "
                                                 "only in a directory of its user's; {} {}: create it as a user "
                                                 "who may (mkdir -m 0750 {} && chown {} {}) {}",
                                                 state_dir.string(), me, parent.string(),
                                                 S_ISDIR(pst.st_mode)
                                                     ? "belongs to " + rtcore::secure_dir::describe_owner(pst.st_uid)
                                                     : std::string("is not a directory"),
                                                 state_dir.string(), me, state_dir.string(), elsewhere)};
    }
    if (::mkdir(state_dir.c_str(), 0750) < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "mkdir " + state_dir.string() + " (state directory)");
    }
    log::info("daemon", "state directory {} created (mode 0750)", state_dir.string());
    return rtcore::ok();
}

// Step 3a: as root, the state directory is made ready for agent.user, as
// systemd's StateDirectory= does: created (mode 0750) when missing, or, when
// root owns it (an earlier run by hand), handed over with the files in it.
// Another user's directory is refused.  Not root: prepare_own_state_dir.
rtcore::status prepare_state_dir(const std::filesystem::path& state_dir, const run_identity& id,
                                 bool named_by_option) {
    if (::geteuid() != 0) {
        return prepare_own_state_dir(state_dir, named_by_option);
    }
    struct stat st {};
    if (::lstat(state_dir.c_str(), &st) < 0) {
        const int err = errno;
        if (err != ENOENT) {
            return rtcore::error::from_errno(err, "state directory " + state_dir.string());
        }
        if (::mkdir(state_dir.c_str(), 0750) < 0) {
            const int e2 = errno;
            return rtcore::error::from_errno(e2, "mkdir " + state_dir.string() + " (state directory)");
        }
        if (::lstat(state_dir.c_str(), &st) < 0) {
            const int e3 = errno;
            return rtcore::error::from_errno(e3, "state directory " + state_dir.string());
        }
    }
    if (!id.switch_user) {
        return rtcore::ok();
    }
    const auto& ids = *id.ids;
    if (!S_ISDIR(st.st_mode)) {
        return rtcore::error{ENOTDIR, "state directory " + state_dir.string() + " is not a directory (or is a symlink)"};
    }
    if (st.st_uid == ids.uid) {
        return rtcore::ok();
    }
    if (st.st_uid != 0) {
        return rtcore::error{EPERM, fmt::format("state directory {} belongs to {}, not {} (agent.user): chown it "
                                                "to {}:{} or pass --state-dir",
                                                state_dir.string(), rtcore::secure_dir::describe_owner(st.st_uid),
                                                ids.user, ids.user, ids.group)};
    }
    auto dir = rtcore::secure_dir::open(state_dir, rtcore::dir_policy::any_owner, "state directory");
    if (!dir) {
        return dir.err();
    }
    auto names = dir->list();
    if (!names) {
        return names.err();
    }
    for (const auto& n : *names) {
        struct stat fst {};
        if (::fstatat(dir->fd(), n.c_str(), &fst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(fst.st_mode) && fst.st_nlink == 1 &&
            n != partition_summary_name &&
            ::fchownat(dir->fd(), n.c_str(), ids.uid, ids.gid, AT_SYMLINK_NOFOLLOW) < 0) {
            const int err = errno;
            return rtcore::error::from_errno(err, "chown " + (state_dir / n).string());
        }
    }
    if (::fchown(dir->fd(), ids.uid, ids.gid) < 0 || ::fchmod(dir->fd(), 0750) < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "chown/chmod " + state_dir.string());
    }
    log::info("daemon", "state directory {} handed over to {}:{} (mode 0750)", state_dir.string(), ids.user,
              ids.group);
    return rtcore::ok();
}

// How the dispatch threads reach their isolated CPUs under the method in
// use (rtcore::rt_reach_for; the DESIGN comment in rtcore/isolation.hpp),
// for services, agent.status and the log.
void place_dispatch_threads(const rtcore::host_fs& fs, rtcore::isolation_method method,
                            const rtcore::isolation_options& iso, host_facts& facts) {
    const auto reach = rtcore::rt_reach_for(fs, method, iso);
    facts.rt_reachable = reach.reachable;
    facts.rt_tasks_file = reach.tasks_file;
    facts.rt_reach = reach.how;
    if (method == rtcore::isolation_method::cgroup_v1_cpuset && !reach.tasks_file.empty()) {
        facts.isolated_cgroup = reach.tasks_file.substr(0, reach.tasks_file.rfind('/'));
    }
    log::info("isolation", "{} ({})", reach.how, rtcore::to_string(method));
}

// Step 5, as root: apply the partition (or check the one a journal of this
// boot holds against the host), and fork the root helper that restores it
// when this process owns it.
struct partition_step {
    bool ok = false;
    std::string isolation_used = "not applied";
};

partition_step take_partition(const config& cfg, const run_options& opts, rtcore::host_fs& fs,
                              const rtcore::partition_plan& plan, const run_identity& id, host_facts& facts,
                              owned_partition& partition, const state_dir_lock& state_lock, sd_notifier& sd) {
    partition_step out;
    (void)sd.status("starting: applying host partition");
    host_context ctx;
    ctx.root = opts.root;
    ctx.state_dir = cfg.agent.state_dir;
    ctx.journal_dir = cfg.host.journal_dir;
    ctx.lock_wait = std::chrono::seconds(cfg.host.lock_wait_s);
    auto dir = open_journal_dir(ctx, "qrtd run", true);
    if (!dir) {
        log::error("host", "{}", dir.err().message);
        return out;
    }
    if (dir->lock() != nullptr && !dir->lock()->waited_for().empty()) {
        for (const auto& l : last_restore_lines(*dir)) {
            log::info("host", "last restore: {}", l);
        }
    }
    rtcore::real_task_ops tasks;
    auto aopts = apply_options_for(cfg, &fs);
    aopts.by = rtcore::rec::applier::run;
    // The root helper's drift watch leaves this process's dispatch threads
    // on their planned CPUs (the fence would move them off otherwise).
    aopts.isolation.own_rt = own_dispatch_threads(cfg, plan);
    aopts.isolation.own_rt.process = ::getpid();
    auto rep = rtcore::host_partition::apply(fs, tasks, &*dir, plan.isolated, plan.housekeeping, aopts);
    if (!rep) {
        log::error("host", "{}", rep.err().message);
        return out;
    }
    for (const auto& l : rep->lines) {
        log::debug("host", "{}", l);
    }
    for (const auto& d : rep->drift) {
        log::warn("host", "drift: {}", d);
    }
    const bool owns = rep->journal_by == rtcore::rec::applier::run;
    if (owns) {
        helper_settings hs{opts.root, cfg.agent.state_dir, aopts,
                           cfg.host.pin_irqs ? cfg.host.irq_verify_interval_s : 0U};
        if (auto st = partition.start_helper(*dir, hs, {state_lock.lock.fd()}); !st) {
            // Without the helper nobody could restore after the drop: undo
            // now, while still root, and give up.
            log::error("host", "{}", st.err().message);
            auto undo = rtcore::host_partition::restore(fs, tasks, &*dir, {aopts.isolation.cgroup_prefix});
            if (!undo || !undo->complete) {
                log::error("host", "undo incomplete; run `qrtd host restore`");
            }
            return out;
        }
    } else {
        log::info("host", "partition applied by qrtd host apply (journal in {}); checked against the host{}; "
                          "`qrtd host restore` undoes it, not this process",
                  cfg.host.journal_dir, rep->drift.empty() ? ", no drift" : ", drift re-applied");
    }
    write_partition_summary(cfg.agent.state_dir,
                            partition_summary(*rep, rtcore::current_boot_id(fs), rtcore::rec::to_string(rep->journal_by)));
    log::info("irq", "{} IRQs pinned, {} already on housekeeping CPUs, {} managed by the kernel (left alone)",
              rep->irqs.count(rtcore::irq_outcome::action::pinned) +
                  rep->irqs.count(rtcore::irq_outcome::action::repinned),
              rep->irqs.count(rtcore::irq_outcome::action::already_ok),
              rep->irqs.count(rtcore::irq_outcome::action::managed));
    for (const auto& o : rep->irqs.irqs) {
        if (o.act == rtcore::irq_outcome::action::managed && !o.lands_on_isolated.empty()) {
            log::warn("irq", "IRQ {} ({}) is kernel-managed and delivered to isolated CPU {}: every interrupt of "
                             "that device (for a disk, every completion of the ledger's fsyncs) interrupts "
                             "dispatch there; fix: add isolcpus=managed_irq,domain,{} to the kernel command line "
                             "(needs reboot)",
                      o.irq, o.name.empty() ? "?" : o.name, o.lands_on_isolated, plan.isolated.to_list());
        }
    }
    for (const auto& why : rep->isolation.not_used) {
        log::info("isolation", "not used: {}", why);
    }
    out.isolation_used = rtcore::to_string(rep->isolation.method);
    facts.partition_applied = true;
    place_dispatch_threads(fs, rep->isolation.method, aopts.isolation, facts);
    facts.isolation_not_used = rep->isolation.not_used;
    if (id.switch_user) {
        // Delegate the isolated cpuset's tasks file (only that) to
        // agent.user, as `qrtd host apply` does for the unit: the dispatch
        // threads join it themselves after the drop.  It goes away with the
        // cgroup at restore.
        std::vector<std::string> lines;
        delegate_to_agent_user(cfg, fs, rep->isolation, lines);
        for (const auto& l : lines) {
            log::info("isolation", "{}", l.substr(l.find(": ") + 2));
        }
    }
    for (const auto a : {rtcore::irq_outcome::action::pinned, rtcore::irq_outcome::action::already_ok,
                         rtcore::irq_outcome::action::managed, rtcore::irq_outcome::action::refused,
                         rtcore::irq_outcome::action::gone}) {
        facts.irq_counts[rtcore::to_string(a)] = rep->irqs.count(a);
    }
    for (const auto& o : rep->irqs.irqs) {
        if (o.act == rtcore::irq_outcome::action::managed) {
            facts.managed_irqs.push_back(
                o.lands_on_isolated.empty()
                    ? fmt::format("{} ({})", o.irq, o.name)
                    : fmt::format("{} ({}) on isolated CPU {}", o.irq, o.name, o.lands_on_isolated));
        }
    }
    facts.irqbalance = rep->irqs.irqbalance.line();
    log::info("isolation", "{}: {} tasks moved off CPUs {}", out.isolation_used, rep->isolation.tasks_moved,
              plan.isolated.to_list());
    out.ok = true;
    return out;
}

// Step 5, not root: what root's `qrtd host apply` left in the summary.
std::string partition_from_summary(const config& cfg, const rtcore::host_fs& fs, host_facts& facts) {
    auto sum = read_partition_summary(cfg.agent.state_dir, rtcore::current_boot_id(fs));
    if (!sum) {
        return "not applied";
    }
    facts.partition_applied = true;
    if ((*sum)["irq_counts"].is_object()) {
        for (const auto& [k, v] : (*sum)["irq_counts"].items()) {
            if (v.is_number_unsigned()) {
                facts.irq_counts[k] = v.get<std::size_t>();
            }
        }
    }
    if ((*sum)["managed_irqs"].is_array()) {
        for (const auto& m : (*sum)["managed_irqs"]) {
            if (m.is_string()) {
                facts.managed_irqs.push_back(m.get<std::string>());
                if (m.get_ref<const std::string&>().find(" on isolated CPU ") != std::string::npos) {
                    log::warn("irq", "IRQ {} is kernel-managed (qrtd host apply could not move it): every "
                                     "interrupt of that device interrupts dispatch there; fix: boot with "
                                     "isolcpus=managed_irq (qrtd host plan prints the line)",
                              m.get<std::string>());
                }
            }
        }
    }
    facts.irqbalance = sum->value("irqbalance", std::string());
    if ((*sum)["isolation_not_used"].is_array()) {
        for (const auto& n : (*sum)["isolation_not_used"]) {
            if (n.is_string()) {
                facts.isolation_not_used.push_back(n.get<std::string>());
            }
        }
    }
    const auto method = rtcore::parse_isolation_method(sum->value("isolation", std::string()));
    place_dispatch_threads(fs, method.value_or(rtcore::isolation_method::none),
                           apply_options_for(cfg, &fs).isolation, facts);
    const std::string iso = sum->value("isolated", std::string());
    if (iso != facts.isolated.to_list()) {
        log::warn("host", "the applied partition isolates CPUs {}, the config plans {}: restart the unit (or run "
                          "`qrtd host restore` and `qrtd host apply`) to bring them together",
                  iso, facts.isolated.to_list());
    }
    const std::string by = sum->value("applied_by", std::string());
    return sum->value("isolation", std::string("unknown")) + " (applied by " +
           (by == "run" ? "qrtd run" : "qrtd host apply") + ")";
}

// Step 7: the control socket, bound while still root (chown to
// rpc.socket_group needs CAP_CHOWN unless the process is in that group) --
// unless systemd passes one (qrtd.socket).  Its directory, when this creates
// it, is given to agent.user, as systemd's RuntimeDirectory= would be.
rtcore::result<rpc::prebound_socket> bind_control_socket(const config& cfg, const run_identity& id) {
    if (::sd_listen_fds(0) > 0) {
        return rpc::prebound_socket{};
    }
    const auto so = control_socket_options(cfg);
    if (const auto dir = std::filesystem::path(so.socket_path).parent_path(); !dir.empty()) {
        std::error_code ec;
        const bool made = std::filesystem::create_directories(dir, ec);
        if (ec) {
            return rtcore::error{ec.value(), fmt::format("rpc: create_directories {}: {}", dir.string(), ec.message())};
        }
        if (made && id.switch_user) {
            if (::chown(dir.c_str(), id.ids->uid, id.ids->gid) < 0 || ::chmod(dir.c_str(), 0750) < 0) {
                const int err = errno;
                return rtcore::error::from_errno(err, "rpc: chown/chmod " + dir.string());
            }
        }
    }
    auto bound = rpc::server::bind_socket(so);
    if (!bound) {
        return rtcore::error{bound.err().code, "rpc: " + bound.err().message};
    }
    return *bound;
}

// Step 8: drop privileges, before any thread exists (capability sets are
// per thread).  As root with agent.user: setgroups/setgid/setuid keeping
// exactly the kept capabilities.  Otherwise (not root, or agent.user =
// "root"): every capability but the kept ones.  The bounding set goes too,
// and no_new_privs is set.  Caps this process never had are skipped.
bool drop_privileges(const run_identity& id, host_facts& facts) {
    std::vector<rtcore::capability> keep;
    const bool unlimited = memlock_unlimited();
    for (const auto cap : kept_caps) {
        if (cap == CAP_IPC_LOCK && unlimited) {
            continue;  // not needed: every lock fits the limit
        }
        if (rtcore::has_permitted_capability(cap)) {
            keep.push_back(cap);
        } else {
            const char* why = cap == CAP_SYS_NICE || cap == CAP_IPC_LOCK
                                  ? "dispatch threads cannot run SCHED_FIFO/mlocked (untuned)"
                                  : "the eBPF probes will be unavailable";
            log::warn("caps", "{} is not permitted: {}", rtcore::capability_name(cap), why);
            facts.capability_notes.push_back(fmt::format("{} not permitted: {}", rtcore::capability_name(cap), why));
        }
    }
    rtcore::drop_report dropped;
    std::string as;
    if (id.switch_user) {
        auto sw = rtcore::switch_user(*id.ids, keep);
        if (!sw) {
            log::error("caps", "{}; the daemon does not run on as root: fix the cause, or set agent.user = \"root\"",
                       sw.err().message);
            return false;
        }
        dropped = std::move(sw->caps);
        as = "; running as " + sw->ids;
    } else {
        auto d = rtcore::drop_capabilities_except(keep);
        if (!d) {
            log::error("caps", "{}", d.err().message);
            return false;
        }
        dropped = std::move(*d);
        as = fmt::format("; running as uid {}", ::geteuid());
    }
    log::info("caps", "kept {}; dropped {} others{}{}",
              dropped.kept.empty() ? std::string("none") : fmt::format("{}", fmt::join(dropped.kept, ",")),
              dropped.dropped.size(), dropped.bounding_set_dropped ? " (bounding set too)" : "", as);
    for (const auto& n : dropped.notes) {
        log::debug("caps", "{}", n);
    }
    return true;
}

// Step 4: topology, partition plan and kernel probe, read-only, and the
// facts services report from them.  EINVAL: the config cannot be planned on
// this host (exit_code::usage); any other error code: a runtime failure.
struct host_survey {
    rtcore::partition_plan plan;
    host_facts facts;
};

rtcore::result<host_survey> survey_host(const config& cfg, const run_options& opts, const rtcore::host_fs& fs,
                                        const std::filesystem::path& state_dir) {
    host_context hctx;
    hctx.root = opts.root;
    hctx.state_dir = state_dir;
    hctx.topology = opts.topology;
    std::string note;
    auto topo = load_topology(hctx, fs, &note);
    if (!topo) {
        log::error("topology", "{}", topo.err().message);
        return rtcore::error{EIO, topo.err().message};
    }
    if (!note.empty()) {
        log::info("topology", "{}", note);
    }
    auto plan = plan_for(cfg, *topo);
    if (!plan) {
        log::error("plan", "{}", plan.err().message);
        return rtcore::error::invalid(plan.err().message);
    }
    for (const auto& r : plan->reasons) {
        log::debug("plan", "{}", r);
    }
    log::info("plan", "isolated CPUs {}, housekeeping CPUs {}", plan->isolated.to_list(),
              plan->housekeeping.to_list());
    const auto kernel = rtcore::probe_kernel(fs, plan->isolated);
    log::info("kernel", "release {}, preemption {}", kernel.release.value_or("unknown"), kernel.preempt_model);
    for (const auto& w : kernel.warnings) {
        log::warn(w.subsystem, "{}; fix: {}{}", w.message, w.fix, w.needs_reboot ? " (needs reboot)" : "");
    }
    host_survey out;
    host_facts& facts = out.facts;
    facts.state_dir = state_dir;
    facts.root = opts.root;
    facts.isolated = plan->isolated;
    facts.housekeeping = plan->housekeeping;
    facts.dispatch_cpus = plan->rt_cpus;
    facts.kernel_release = kernel.release;
    facts.preempt_model = kernel.preempt_model;
    facts.kernel_warnings = kernel.warnings;
    facts.require_rt = cfg.dispatch.mode == dispatch_mode::tuned && require_rt_for(cfg, &facts.require_rt_why);
    if (cfg.dispatch.mode == dispatch_mode::tuned) {
        log::info("dispatch", "{}: {}", facts.require_rt_why,
                  facts.require_rt ? "a dispatch thread that cannot be SCHED_FIFO on its isolated CPU stops "
                                     "the start (exit status 3)"
                                   : "a dispatch thread that cannot be real-time runs degraded");
    }
    out.plan = std::move(*plan);
    return out;
}

// Step 5: the partition this run uses -- applied here (root, or a --root
// tree), read from the summary root's `qrtd host apply` left (not root), or
// left alone (host.apply_on_run = false).  Returns how isolation is done, for
// agent.status; nullopt when applying failed (the host is as it was).
std::optional<std::string> partition_for_run(const config& cfg, const run_options& opts, rtcore::host_fs& fs,
                                             const rtcore::partition_plan& plan, const run_identity& id,
                                             host_facts& facts, owned_partition& partition,
                                             const state_dir_lock& state_lock, sd_notifier& sd) {
    if (!cfg.host.apply_on_run) {
        log::info("host", "host.apply_on_run = false: the partition is left alone");
        return std::string("not applied");
    }
    const bool privileged = ::geteuid() == 0 || !fs.is_system();
    if (!privileged) {
        std::string used = partition_from_summary(cfg, fs, facts);
        if (!facts.partition_applied) {
            log::warn("host", "not root: partition not applied; run `qrtd host apply` as root "
                              "(under systemd, ExecStartPre=+ does)");
        }
        return used;
    }
    auto step = take_partition(cfg, opts, fs, plan, id, facts, partition, state_lock, sd);
    if (!step.ok) {
        return std::nullopt;
    }
    return step.isolation_used;
}

// Step 6: SIGTERM/SIGINT (shutdown) and SIGHUP (reload) from a signalfd the
// loop watches; they have been blocked since step 0.  The fd lives as long
// as the returned handle.
rtcore::result<unique_fd> watch_signals(event_loop& loop, const blocked_signals& signals,
                                        std::function<void()> reload,
                                        std::function<void(std::string)> shutdown) {
    unique_fd sigfd(::signalfd(-1, &signals.set(), SFD_NONBLOCK | SFD_CLOEXEC));
    if (sigfd.get() < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "signalfd");
    }
    const int fd = sigfd.get();
    auto added = loop.add_fd(fd, EPOLLIN, [fd, reload = std::move(reload), shutdown = std::move(shutdown)](std::uint32_t) {
        signalfd_siginfo si{};
        while (::read(fd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
            if (si.ssi_signo == SIGHUP) {
                log::info("signal", "SIGHUP from pid {}: reloading the config", si.ssi_pid);
                reload();
                continue;
            }
            log::info("signal", "{} from pid {}: shutting down", signal_name(si.ssi_signo), si.ssi_pid);
            shutdown(signal_name(si.ssi_signo));
        }
    });
    if (!added) {
        return std::move(added).err();
    }
    return sigfd;
}

// Step 6: --duration-s, a one-shot timer that asks for the shutdown.
rtcore::status stop_after(event_loop& loop, std::optional<std::chrono::seconds> duration,
                          const std::function<void(std::string)>& shutdown) {
    if (!duration) {
        return rtcore::ok();
    }
    const auto d = *duration;
    auto t = loop.add_timer(d, std::chrono::nanoseconds(0), [shutdown, d] {
        log::info("daemon", "--duration-s {} elapsed: shutting down", d.count());
        shutdown("duration elapsed");
    });
    if (!t) {
        return std::move(t).err();
    }
    return rtcore::ok();
}

// Step 10: READY=1 with the status line, and the watchdog when the unit
// asks for one (WatchdogSec=, agent.watchdog).
bool announce_ready(const config& cfg, const rtcore::partition_plan& plan, const std::string& isolation_used,
                    event_loop& loop, sd_notifier& sd) {
    const std::string status_text =
        fmt::format("running: {} QPU{}, isolated CPUs {} ({}), housekeeping CPUs {}", cfg.qpus.size(),
                    cfg.qpus.size() == 1 ? "" : "s", plan.isolated.to_list(), isolation_used,
                    plan.housekeeping.to_list());
    if (auto st = sd.ready(status_text); !st) {
        log::warn("systemd", "{}", st.err().message);
    }
    if (cfg.agent.watchdog) {
        auto wd = sd.start_watchdog(loop);
        if (!wd) {
            log::error("systemd", "watchdog: {}", wd.err().message);
            return false;
        }
        if (*wd) {
            log::info("systemd", "watchdog: pinging every {} ms", (*wd)->count() / 2000);
        }
    }
    log::info("daemon", "{}", status_text);
    return true;
}

}  // namespace

daemon::daemon(run_options opts) : _opts(std::move(opts)) {}
daemon::~daemon() = default;

exit_code daemon::run() {
    try {
        // 0. Block SIGTERM, SIGINT and SIGHUP before anything else.  Every
        //    thread created later inherits the mask, and a SIGTERM that
        //    arrives while the partition is being applied waits in the
        //    signalfd (step 6) instead of killing us between apply and
        //    restore.
        blocked_signals signals;
        sd_notifier sd;

        // 1. Load and validate the config.  First, because every later
        //    step reads it, and because a bad config must change nothing on
        //    the host.  The host's online CPUs are read (read-only) so an
        //    isolated set naming unknown CPUs is a config error here.
        rtcore::host_fs fs(_opts.root);
        auto loaded = load_run_config(_opts, fs);
        if (!loaded) {
            return exit_code::usage;
        }
        config cfg = std::move(*loaded);
        log::set_level(cfg.agent.level);
        log::info("daemon", "qrtd {} starting with {} ({} QPU{})", QRT_VERSION,
                  _opts.config_path.string(), cfg.qpus.size(), cfg.qpus.size() == 1 ? "" : "s");
        (void)sd.status("starting: config loaded");

        // 2. Who this process becomes after its root-only setup (agent.user).
        //    Resolved now, so a missing user fails before the host changes.
        auto identity = resolve_identity(cfg);
        if (!identity) {
            log::error("daemon", "{}", identity.err().message);
            return exit_code::failure;
        }

        // 3. The daemon's state directory (ledger, summary), ready for that
        //    user, and its single-instance lock: a second `qrtd run` on it
        //    stops here.  Nothing root replays lives there.
        const std::filesystem::path state_dir = cfg.agent.state_dir;
        if (auto st = prepare_state_dir(state_dir, *identity, _opts.state_dir.has_value()); !st) {
            log::error("daemon", "agent.state_dir: {}", st.err().message);
            return exit_code::failure;
        }
        auto state_lock = lock_state_dir(state_dir);
        if (!state_lock) {
            log::error("daemon", "{}", state_lock.err().message);
            return exit_code::failure;
        }

        // 4. Topology, partition plan and kernel probe.  All read-only; the
        //    plan names the isolated and dispatch CPUs every later step uses,
        //    and each kernel risk is logged now, so the journal of this start
        //    says why latency may be poor.
        auto surveyed = survey_host(cfg, _opts, fs, state_dir);
        if (!surveyed) {
            return surveyed.err().code == EINVAL ? exit_code::usage : exit_code::failure;
        }
        const rtcore::partition_plan& plan = surveyed->plan;
        host_facts facts = std::move(surveyed->facts);

        // 5. The partition, when running as root (or on a --root tree) and
        //    host.apply_on_run says so, before the privilege drop: writing
        //    /proc/irq and cgroup files, moving other users' tasks and the
        //    journal directory need root.  It waits (host.lock_wait_s) for a
        //    restore helper still at work, checks a journal of this boot
        //    against the host instead of trusting it, and forks the root
        //    helper that restores at exit (see owned_partition) when this
        //    process owns the partition; one `qrtd host apply` made
        //    (systemd's ExecStartPre) is `qrtd host restore`'s to undo.  Not
        //    root: the summary root's apply left says what is applied.
        owned_partition partition;
        const auto isolation_used =
            partition_for_run(cfg, _opts, fs, plan, *identity, facts, partition, *state_lock, sd);
        if (!isolation_used) {
            return exit_code::failure;
        }

        // 6. The event loop and the signals it reads.  Set up after the
        //    apply, so nothing here can fail half way through a partition
        //    change; the signals have been blocked since step 0.
        event_loop loop;
        std::string stop_reason;
        auto shutdown = [&](std::string reason) {
            if (stop_reason.empty()) {
                stop_reason = std::move(reason);
                (void)sd.stopping("stopping: " + stop_reason);
                loop.stop();
            }
        };
        auto sigfd = watch_signals(loop, signals, [&] { reload_config(_opts, cfg, fs); }, shutdown);
        if (!sigfd) {
            log::error("daemon", "{}", sigfd.err().message);
            return exit_code::failure;
        }
        if (auto st = stop_after(loop, _opts.duration, shutdown); !st) {
            log::error("daemon", "{}", st.err().message);
            return exit_code::failure;
        }

        // 7. The control socket, bound (and chown'ed to rpc.socket_group)
        //    while this process may still do that; clients queue until the
        //    server starts accepting in step 9e.
        auto listener = bind_control_socket(cfg, *identity);
        if (!listener) {
            log::error("daemon", "{}", listener.err().message);
            return exit_code::failure;
        }
        // A prebound socket is a plain value (rpc/server.hpp): owned here
        // until the services take it in step 9.
        rtcore::unique_fd listener_fd(std::exchange(listener->fd, -1));

        // 8. Drop privileges: become agent.user (when started as root) with
        //    only CAP_SYS_NICE (SCHED_FIFO, affinity), CAP_BPF and
        //    CAP_PERFMON (probes), RLIMIT_MEMLOCK unlimited for the locked
        //    dispatch paths (CAP_IPC_LOCK kept instead only where the limit
        //    cannot be raised).  After everything above that needed root,
        //    and BEFORE any thread is created.
        if (!drop_privileges(*identity, facts)) {
            return exit_code::failure;
        }

        // 9. The services, on the housekeeping loop, in this order (see
        //    services::start):
        //    a. the ledger with its SQLite store in the state directory,
        //       recovering reservations before anything may be dispatched
        //       (committed jobs whose start passed become missed, with why);
        //    b. one qpu_link per QPU: the endpoint connection and its
        //       dispatch thread on plan->rt_cpus (SCHED_FIFO needs
        //       CAP_SYS_NICE, kept above), configured from [dispatch];
        //    c. the job pump on its own thread (SCHED_FIFO 1, housekeeping
        //       CPUs: due jobs within a horizon > lead_max go to their link
        //       once, from a plan the loop builds from the ledger; outcomes
        //       come back to the ledger on the loop), lease expiry and
        //       missed marking, calibration switches into each link's
        //       guard, and the realtime-step watch;
        //    d. the eBPF probes (never fatal: "probes: unavailable (...)");
        //    e. the RPC server on the socket of step 7 (or systemd's), last,
        //       so no client is answered before the state it queries exists.
        facts.isolation = *isolation_used;
        services svc(loop, cfg, std::move(facts));
        listener->fd = listener_fd.release();
        svc.use_prebound_socket(*listener);
        bool fatal = false;
        svc.on_fatal([&](std::string why) {
            fatal = true;
            shutdown(std::move(why));
        });
        if (auto st = svc.start(); !st) {
            log::error("daemon", "{}", st.err().message);
            if (svc.refused_not_realtime()) {
                log::error("daemon", "refusing to run degraded (exit status {}); the partition is restored",
                           static_cast<int>(exit_code::not_realtime));
                svc.stop();
                (void)partition.restore();
                return exit_code::not_realtime;
            }
            return exit_code::failure;
        }

        // 10. READY=1 only now: systemd starts dependent units, and a socket
        //     client may be served, once everything above is in place.
        if (!announce_ready(cfg, plan, *isolation_used, loop, sd)) {
            return exit_code::failure;
        }

        // 11. The loop, until SIGTERM/SIGINT or --duration-s.
        loop.run();

        // 12. Shutdown: STOPPING=1 was sent when the stop was asked for.
        //     Stop the watchdog, then have the root helper put the host back.
        sd.stop_watchdog();
        log::info("daemon", "stopping ({})", stop_reason.empty() ? "loop ended" : stop_reason);
        // Reverse order: the server closes, the links stop (every
        // unfinished job gets its outcome in the ledger), the ledger closes.
        svc.stop();
        const bool restored = partition.restore();
        log::info("daemon", "stopped");
        return restored && !fatal ? exit_code::ok : exit_code::failure;
    } catch (const std::exception& e) {
        // Setup code may throw (std::system_error from epoll, bad_alloc);
        // the partition guard has restored the host on the way out.
        log::error("daemon", "{}", e.what());
        return exit_code::failure;
    }
}

host_config_check check_config_on_host(const config& cfg, const std::string& file,
                                       const std::filesystem::path& root) {
    host_config_check out;
    // A warning, not an error: the daemon's own limit and capabilities are
    // its unit's (LimitMEMLOCK=infinity), not this shell's.
    if (auto note = frame_pool_memlock_note(cfg, rtcore::current_memlock_allowance()); !note.empty()) {
        out.warnings.push_back(std::move(note));
    }
    for (std::size_t i = 0; i < cfg.qpus.size(); ++i) {
        const auto& q = cfg.qpus[i];
        if (q.target.type != endpoint::kind::device_file) {
            continue;
        }
        const std::filesystem::path on_host =
            root == "/" ? std::filesystem::path(q.target.path) : root / std::filesystem::path(q.target.path).relative_path();
        auto t = proto::check_file_endpoint(q.target.uri, on_host.string());
        if (t) {
            continue;
        }
        const std::string msg = "qpu " + q.name + ": " + t.err().message;
        if (t.err().code == ENOENT) {
            out.warnings.push_back(msg);
            continue;
        }
        config_diagnostic d;
        d.file = file;
        d.option = "qpu[" + std::to_string(i) + "].endpoint";
        d.message = msg;
        out.errors.push_back(std::move(d));
    }
    return out;
}

}  // namespace qrt
