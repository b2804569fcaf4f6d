#include "rtcore/isolation.hpp"

#include <unistd.h>

#include <cerrno>
#include <set>

#include "rtcore/journal_undo.hpp"
#include "rtcore/text.hpp"

namespace rtcore {

namespace {

status write_checked(host_fs& fs, const std::string& path, const std::string& value,
                     std::vector<std::string>& lines) {
    if (auto st = fs.write(path, value); !st) {
        return st;
    }
    lines.push_back("isolation: write " + path + " = " + (value.empty() ? "(empty)" : value));
    return ok();
}

// Why qrtd may not use dir as its own cgroup, or "" when it may: dir does not
// exist yet, or this boot's journal records that qrtd created it.  A cgroup
// with our name that qrtd did not create is never taken over (its files would
// be overwritten unjournaled and restore would remove it).
std::string restore_hint(const isolation_options& opts) {
    return opts.restore_hint.empty() ? "restore the host partition first" : opts.restore_hint;
}

std::string foreign_cgroup(const host_fs& fs, const restore_journal& journal, const std::string& dir,
                           const isolation_options& opts) {
    if (!fs.exists(dir) || journal.made_dir(dir)) {
        return "";
    }
    return "cgroup " + dir + " already exists (left by another tool or an earlier run that was not restored); "
           "remove it or " + restore_hint(opts);
}

// ------------------------------------------------------------ cgroup v2

// Why the v2 partition cannot be used, or "" when it can.
std::string v2_unavailable(const host_fs& fs, const cgroup_mounts& m) {
    if (m.v2_root.empty()) {
        return "no cgroup2 hierarchy is mounted";
    }
    auto ctl = fs.read(join_path(m.v2_root, "cgroup.controllers"));
    if (!ctl) {
        return "cannot read " + join_path(m.v2_root, "cgroup.controllers") + ": " + ctl.err().message;
    }
    if (!has_word(*ctl, "cpuset")) {
        return "cgroup2 is mounted at " + m.v2_root +
               " but the cpuset controller is not in its cgroup.controllers (it is bound to a v1 "
               "hierarchy, or the kernel lacks it)";
    }
    return "";
}

status apply_v2(host_fs& fs, task_ops& tasks, restore_journal& journal, const cgroup_mounts& m,
                const cpu_set& isolated, const isolation_options& opts, isolation_report& rep) {
    const std::string subtree = join_path(m.v2_root, "cgroup.subtree_control");
    auto sub = fs.read(subtree);
    if (!sub) {
        return sub.err();
    }
    if (!has_word(*sub, "cpuset")) {
        if (auto st = journal.append(rec::ctl{subtree, "cpuset"}); !st) {
            return st;
        }
        if (auto st = write_checked(fs, subtree, "+cpuset", rep.lines); !st) {
            return st;
        }
    }
    const std::string dir = join_path(m.v2_root, opts.cgroup_prefix + "-isolated");
    if (auto st = journal.append(rec::mkcg{dir, m.v2_root}); !st) {
        return st;
    }
    if (auto st = tasks.make_cgroup(fs, dir); !st) {
        return st;
    }
    rep.lines.push_back("isolation: mkdir " + dir);
    if (auto st = write_checked(fs, join_path(dir, "cpuset.cpus"), isolated.to_list(), rep.lines); !st) {
        return st;
    }
    // Kernels >= 6.7 want the CPUs claimed exclusively before they become a partition.
    if (fs.exists(join_path(dir, "cpuset.cpus.exclusive"))) {
        if (auto st = write_checked(fs, join_path(dir, "cpuset.cpus.exclusive"), isolated.to_list(), rep.lines); !st) {
            return st;
        }
    }
    const std::string part = join_path(dir, "cpuset.cpus.partition");
    if (!fs.dry_run() && !fs.exists(part)) {
        return error{ENOTSUP, part + " does not exist (the kernel predates cpuset partitions, 5.11)"};
    }
    if (auto st = write_checked(fs, part, "isolated", rep.lines); !st) {
        return st;
    }
    if (!fs.dry_run()) {
        auto back = fs.read_line(part);
        if (!back) {
            return back.err();
        }
        if (*back != "isolated") {
            return error::invalid(part + " reads \"" + *back + "\" after writing isolated");
        }
    }
    rep.isolated_cgroup = dir;
    rep.lines.push_back("isolation: " + dir + " is an isolated partition of CPUs " + isolated.to_list() +
                        "; the kernel keeps every other cgroup and load balancing off them");
    return ok();
}

// ------------------------------------------------------------ cgroup v1

std::string v1_unavailable(const host_fs& fs, const cgroup_mounts& m) {
    if (m.v1_cpuset_root.empty()) {
        return "no cgroup v1 cpuset hierarchy is mounted";
    }
    if (!fs.exists(join_path(m.v1_cpuset_root, "cpuset.cpus"))) {
        return m.v1_cpuset_root + " has no cpuset.cpus (mounted with noprefix?)";
    }
    return "";
}

struct sweep_counts {
    std::size_t moved = 0;
    std::size_t refused = 0;
    std::size_t gone = 0;
    std::string refused_example;
};

// Moves every movable task of the v1 root cpuset into dest, journaling each
// (tid, start time, original cgroup, original affinity) first.
status sweep_v1(host_fs& fs, task_ops& tasks, restore_journal& journal, const std::string& root,
                const std::string& dest, sweep_counts& c, std::vector<std::string>& lines) {
    std::set<pid_t> refused;
    // A few passes: tasks forked in the root while we move are caught next pass.
    for (int pass = 0; pass < 3; ++pass) {
        auto members = tasks.cgroup_tasks(fs, root);
        if (!members) {
            return members.err();
        }
        std::vector<std::pair<task_info, cpu_set>> todo;
        std::vector<journal_record> recs;
        for (pid_t tid : *members) {
            if (refused.count(tid) != 0) {
                continue;
            }
            auto t = tasks.task(fs, tid);
            auto aff = tasks.affinity(tid);
            if (!t || !aff) {
                ++c.gone;
                continue;
            }
            if (!journal.has_task(tid, t->start_ticks)) {
                recs.emplace_back(rec::cg{tid, t->start_ticks, root, *aff});
            }
            todo.emplace_back(std::move(*t), *aff);
        }
        if (todo.empty()) {
            break;
        }
        if (auto st = journal.append(recs); !st) {
            return st;
        }
        for (const auto& [t, aff] : todo) {
            auto st = tasks.attach(fs, dest, t.tid);
            if (st) {
                ++c.moved;
                continue;
            }
            const int e = st.err().code;
            if (e == ESRCH) {
                ++c.gone;
            } else if (e == EINVAL || e == ENOSPC || e == EBUSY) {
                ++c.refused;
                refused.insert(t.tid);
                if (c.refused_example.empty()) {
                    c.refused_example = "task " + std::to_string(t.tid) + " (" + t.comm + "): " + st.err().message;
                }
            } else {
                return st;
            }
        }
        if (fs.dry_run()) {
            break;
        }
    }
    lines.push_back("isolation: moved " + std::to_string(c.moved) + " tasks from " + root + " to " + dest + ", " +
                    std::to_string(c.refused) + " kernel threads refused" +
                    (c.refused_example.empty() ? std::string() : " (e.g. " + c.refused_example + ")") + ", " +
                    std::to_string(c.gone) + " exited meanwhile");
    return ok();
}

status apply_v1(host_fs& fs, task_ops& tasks, restore_journal& journal, const cgroup_mounts& m,
                const cpu_set& isolated, const cpu_set& housekeeping, const isolation_options& opts,
                isolation_report& rep) {
    const std::string& root = m.v1_cpuset_root;
    auto mems = fs.read_line(join_path(root, "cpuset.mems"));
    if (!mems) {
        return mems.err();
    }
    const std::string iso_dir = join_path(root, opts.cgroup_prefix + "-isolated");
    const std::string hk_dir = join_path(root, opts.cgroup_prefix + "-housekeeping");
    // Other cpusets whose CPUs reach the isolated ones keep their tasks there.
    if (auto ents = fs.list(root)) {
        for (const auto& e : *ents) {
            const std::string d = join_path(root, e);
            if (d == iso_dir || d == hk_dir || !fs.is_dir(d)) {
                continue;
            }
            if (auto cpus = fs.read_line(join_path(d, "cpuset.cpus"))) {
                if (auto s = cpu_set::parse_list(*cpus); s && s->intersects(isolated)) {
                    rep.lines.push_back("isolation: warning: cpuset " + d + " (CPUs " + s->to_list() +
                                        ") reaches isolated CPUs; its tasks are not moved");
                }
            }
        }
    }

    if (auto st = journal.append(rec::mkcg{hk_dir, root}); !st) {
        return st;
    }
    if (auto st = tasks.make_cgroup(fs, hk_dir); !st) {
        return st;
    }
    rep.lines.push_back("isolation: mkdir " + hk_dir);
    if (auto st = write_checked(fs, join_path(hk_dir, "cpuset.cpus"), housekeeping.to_list(), rep.lines); !st) {
        return st;
    }
    if (auto st = write_checked(fs, join_path(hk_dir, "cpuset.mems"), *mems, rep.lines); !st) {
        return st;
    }

    if (auto st = journal.append(rec::mkcg{iso_dir, root}); !st) {
        return st;
    }
    if (auto st = tasks.make_cgroup(fs, iso_dir); !st) {
        return st;
    }
    rep.lines.push_back("isolation: mkdir " + iso_dir);
    if (auto st = write_checked(fs, join_path(iso_dir, "cpuset.cpus"), isolated.to_list(), rep.lines); !st) {
        return st;
    }
    if (auto st = write_checked(fs, join_path(iso_dir, "cpuset.mems"), *mems, rep.lines); !st) {
        return st;
    }
    if (auto st = write_checked(fs, join_path(iso_dir, "cpuset.cpu_exclusive"), "1", rep.lines); !st) {
        if (st.err().code != EINVAL) {
            return st;
        }
        rep.lines.push_back("isolation: warning: " + st.err().message +
                            " (another cpuset shares these CPUs); continuing without cpu_exclusive");
    }
    // The isolated CPUs balance nothing: each real-time thread is pinned.
    if (auto st = write_checked(fs, join_path(iso_dir, "cpuset.sched_load_balance"), "0", rep.lines); !st) {
        return st;
    }

    sweep_counts c;
    if (auto st = sweep_v1(fs, tasks, journal, root, hk_dir, c, rep.lines); !st) {
        return st;
    }
    rep.tasks_moved = c.moved;
    rep.tasks_refused = c.refused;
    rep.tasks_gone = c.gone;

    const std::string slb = join_path(root, "cpuset.sched_load_balance");
    if (auto st = journal.save_file(fs, slb); !st) {
        return st;
    }
    if (auto st = write_checked(fs, slb, "0", rep.lines); !st) {
        return st;
    }
    rep.isolated_cgroup = iso_dir;
    rep.housekeeping_cgroup = hk_dir;
    rep.lines.push_back("isolation: root sched_load_balance off: the scheduler balances " + hk_dir + " and " +
                        iso_dir + " as separate domains");
    return ok();
}

// ------------------------------------------------------------ fence

// Whether t is one of the caller's own real-time threads, on the CPU planned
// for it (rt_exemption); claimed holds the CPUs already taken in this sweep.
bool own_rt_thread(const host_fs& fs, task_ops& tasks, const rt_exemption& own, const task_info& t,
                   const cpu_set& aff, cpu_set& claimed) {
    if (!own.any() || t.kernel_thread || t.comm != own.comm || aff.count() != 1) {
        return false;
    }
    const auto cpu = static_cast<unsigned>(aff.first());
    if (!own.cpus.test(cpu) || claimed.test(cpu)) {
        return false;
    }
    if (own.process && t.tgid != *own.process) {
        return false;
    }
    if (own.uid) {
        auto uid = tasks.real_uid(fs, t.tid);
        if (!uid || *uid != *own.uid) {
            return false;
        }
    }
    claimed.set(cpu);
    return true;
}

status sweep_fence(host_fs& fs, task_ops& tasks, restore_journal& journal, const cpu_set& isolated,
                   const cpu_set& housekeeping, const rt_exemption& own, isolation_report& rep) {
    auto all = tasks.list_tasks(fs);
    if (!all) {
        return all.err();
    }
    std::vector<affinity_move> todo;
    std::vector<journal_record> recs;
    cpu_set claimed;
    for (const auto& t : *all) {
        auto aff = tasks.affinity(t.tid);
        if (!aff) {
            ++rep.tasks_gone;
            continue;
        }
        if (!aff->intersects(isolated)) {
            continue;
        }
        if (own_rt_thread(fs, tasks, own, t, *aff, claimed)) {
            rep.rt_threads_left.push_back("tid " + std::to_string(t.tid) + " on CPU " + aff->to_list());
            continue;
        }
        todo.push_back(plan_move_off(journal, t, *aff, isolated, housekeeping, recs));
    }
    if (!rep.rt_threads_left.empty()) {
        std::string which;
        for (const auto& l : rep.rt_threads_left) {
            which += (which.empty() ? "" : ", ") + l;
        }
        rep.lines.push_back("isolation: left " + std::to_string(rep.rt_threads_left.size()) + " " + own.comm +
                            " thread(s) on their planned CPUs: " + which);
    }
    if (auto st = journal.append(recs); !st) {
        return st;
    }
    std::string refused_example;
    for (const auto& c : todo) {
        error why;
        switch (make_move(fs, tasks, c, why)) {
            case move_outcome::moved:
                if (fs.dry_run()) {
                    rep.lines.push_back("isolation: would set affinity of task " + std::to_string(c.task.tid) +
                                        " (" + c.task.comm + ") " + c.from.to_list() + " -> " + c.to.to_list());
                }
                ++rep.tasks_moved;
                break;
            case move_outcome::gone:
                ++rep.tasks_gone;
                break;
            case move_outcome::refused:
                ++rep.tasks_refused;
                if (refused_example.empty()) {
                    refused_example = "task " + std::to_string(c.task.tid) + " (" + c.task.comm + "): " + why.message;
                }
                break;
            case move_outcome::failed:
                return error{why.code, why.message + " (fencing task " + c.task.comm + ")"};
        }
    }
    rep.lines.push_back("isolation: fenced " + std::to_string(rep.tasks_moved) + " tasks off CPUs " +
                        isolated.to_list() + ", " + std::to_string(rep.tasks_refused) + " kernel threads refused" +
                        (refused_example.empty() ? std::string() : " (e.g. " + refused_example + ")") + ", " +
                        std::to_string(rep.tasks_gone) + " exited meanwhile");
    return ok();
}

status apply_fence(host_fs& fs, task_ops& tasks, restore_journal& journal, const cpu_set& isolated,
                   const cpu_set& housekeeping, const rt_exemption& own, isolation_report& rep) {
    if (auto st = sweep_fence(fs, tasks, journal, isolated, housekeeping, own, rep); !st) {
        return st;
    }
    rep.lines.push_back("isolation: the fence is advisory: a task that sets its own affinity later can "
                        "reach the isolated CPUs again (verify re-fences it)");
    return ok();
}


// Why the v2 partition is out of reach of the caller's real-time threads
// (see DESIGN in isolation.hpp), or "" when no such threads are to be placed.
std::string v2_unreachable(const host_fs& fs, const cgroup_mounts& m, const isolation_options& opts) {
    if (!opts.rt_threads) {
        return "";
    }
    const std::string where = opts.rt_cgroup.empty() ? std::string("its cgroup") : "cgroup " + opts.rt_cgroup;
    std::string why = "the dispatch threads could not run in it: a partition takes its CPUs from every other "
                      "cgroup, a thread may join only a cgroup of its own process's threaded subtree (" +
                      where +
                      "), and a partition's parent must be a partition root owning its CPUs exclusively, so "
                      "every ancestor would take the housekeeping CPUs from the rest of the system";
    const std::string own = opts.rt_cgroup.empty()
                                ? std::string()
                                : join_path(join_path(m.v2_root, opts.rt_cgroup), "cpuset.cpus.exclusive");
    if (!own.empty() && opts.rt_cgroup != "/" && fs.exists(own)) {
        why += " (this kernel has remote partitions, cpuset.cpus.exclusive, but qrtd does not build them yet)";
    } else {
        why += " (remote partitions, cpuset.cpus.exclusive, need Linux 6.7)";
    }
    return why;
}

// Why method m cannot be used here, or "" when it can.  journal null: a
// cgroup of ours that exists counts as another tool's.
std::string why_unavailable(const host_fs& fs, const restore_journal* journal, const cgroup_mounts& mounts,
                            isolation_method m, const isolation_options& opts) {
    auto foreign = [&](const std::string& dir) -> std::string {
        if (journal != nullptr) {
            return foreign_cgroup(fs, *journal, dir, opts);
        }
        return fs.exists(dir) ? "cgroup " + dir + " already exists (a partition is applied, or an earlier "
                                              "run was not restored; " + restore_hint(opts) + ")"
                              : "";
    };
    std::string why_not;
    if (m == isolation_method::cgroup_v2_partition) {
        why_not = v2_unavailable(fs, mounts);
        if (why_not.empty() && !opts.force) {
            why_not = v2_unreachable(fs, mounts, opts);
        }
        if (why_not.empty()) {
            why_not = foreign(join_path(mounts.v2_root, opts.cgroup_prefix + "-isolated"));
        }
    } else if (m == isolation_method::cgroup_v1_cpuset) {
        why_not = v1_unavailable(fs, mounts);
        for (const char* suffix : {"-housekeeping", "-isolated"}) {
            if (why_not.empty()) {
                why_not = foreign(join_path(mounts.v1_cpuset_root, opts.cgroup_prefix + suffix));
            }
        }
    }
    return why_not;
}

}  // namespace

result<isolation_report> apply_isolation(host_fs& fs, task_ops& tasks, restore_journal& journal,
                                         const cpu_set& isolated, const cpu_set& housekeeping,
                                         const isolation_options& opts) {
    isolation_report rep;
    const auto mounts = find_cgroup_mounts(fs);
    const isolation_method order[] = {isolation_method::cgroup_v2_partition, isolation_method::cgroup_v1_cpuset,
                                      isolation_method::affinity_fence};
    if (opts.force && *opts.force == isolation_method::none) {
        rep.lines.push_back("isolation: none (disabled by configuration)");
        return rep;
    }
    for (auto m : order) {
        if (opts.force && *opts.force != m) {
            continue;
        }
        const std::string why_not = why_unavailable(fs, &journal, mounts, m, opts);
        if (!why_not.empty()) {
            if (opts.force) {
                return error{ENOTSUP, std::string("isolation ") + to_string(m) + " was asked for but " + why_not};
            }
            rep.not_used.push_back(std::string(to_string(m)) + ": " + why_not);
            continue;
        }
        const std::size_t mark = journal.size();
        isolation_report attempt;
        status st = ok();
        if (m == isolation_method::cgroup_v2_partition) {
            st = apply_v2(fs, tasks, journal, mounts, isolated, opts, attempt);
        } else if (m == isolation_method::cgroup_v1_cpuset) {
            st = apply_v1(fs, tasks, journal, mounts, isolated, housekeeping, opts, attempt);
        } else {
            st = apply_fence(fs, tasks, journal, isolated, housekeeping, opts.own_rt, attempt);
        }
        if (!st) {
            // Put back what this method changed, then try the next one.
            auto undone = unwind_since(fs, tasks, journal, mark);
            std::string reason = st.err().message;
            if (!undone.complete) {
                return error{st.err().code, std::string("isolation ") + to_string(m) + " failed (" + reason +
                                                ") and could not be fully unwound"};
            }
            if (opts.force || m == isolation_method::affinity_fence) {
                return error{st.err().code, std::string("isolation ") + to_string(m) + ": " + reason};
            }
            rep.not_used.push_back(std::string(to_string(m)) + ": tried and unwound: " + reason);
            continue;
        }
        if (auto a = journal.append(rec::method{m}); !a) {
            return a.err();
        }
        attempt.method = m;
        attempt.not_used = rep.not_used;
        std::vector<std::string> lines;
        for (const auto& n : attempt.not_used) {
            lines.push_back("isolation: not used: " + n);
        }
        lines.insert(lines.end(), attempt.lines.begin(), attempt.lines.end());
        lines.push_back(std::string("isolation: using ") + to_string(m) + " for CPUs " + isolated.to_list());
        if (opts.rt_threads) {
            lines.push_back("isolation: " + rt_reach_for(fs, m, opts).how);
        }
        attempt.lines = std::move(lines);
        return attempt;
    }
    return error{ENOTSUP, "isolation: no method is available"};
}

result<isolation_report> verify_isolation(host_fs& fs, task_ops& tasks, restore_journal& journal,
                                          const cpu_set& isolated, const cpu_set& housekeeping,
                                          isolation_method method, const isolation_options& opts) {
    isolation_report rep;
    rep.method = method;
    // Each sweep journals the new threads it moves; those that exited since
    // the last one leave records restore would only skip.  Dropped first, so
    // the journal stays the size of the threads still running.
    if (auto st = journal.compact(fs, tasks); !st) {
        return st.err();
    }
    const auto mounts = find_cgroup_mounts(fs);
    if (method == isolation_method::cgroup_v2_partition) {
        const std::string dir = join_path(mounts.v2_root, opts.cgroup_prefix + "-isolated");
        rep.isolated_cgroup = dir;
        auto part = fs.read_line(join_path(dir, "cpuset.cpus.partition"));
        if (!part || *part != "isolated") {
            rep.drift = true;
            rep.lines.push_back("isolation: DRIFT: " + dir + " partition is " +
                                (part ? "\"" + *part + "\"" : part.err().message) +
                                "; run restore then apply to rebuild it");
        } else {
            rep.lines.push_back("isolation: " + dir + " is still an isolated partition");
        }
        return rep;
    }
    if (method == isolation_method::cgroup_v1_cpuset) {
        const std::string& root = mounts.v1_cpuset_root;
        const std::string iso_dir = join_path(root, opts.cgroup_prefix + "-isolated");
        const std::string hk_dir = join_path(root, opts.cgroup_prefix + "-housekeeping");
        rep.isolated_cgroup = iso_dir;
        rep.housekeeping_cgroup = hk_dir;
        auto cpus = fs.read_line(join_path(iso_dir, "cpuset.cpus"));
        auto slb = fs.read_line(join_path(root, "cpuset.sched_load_balance"));
        if (!cpus || *cpus != isolated.to_list() || !slb || *slb != "0") {
            rep.drift = true;
            rep.lines.push_back("isolation: DRIFT: " + iso_dir + " cpus " + (cpus ? *cpus : cpus.err().message) +
                                ", root sched_load_balance " + (slb ? *slb : slb.err().message) +
                                "; run restore then apply to rebuild it");
            return rep;
        }
        sweep_counts c;
        if (auto st = sweep_v1(fs, tasks, journal, root, hk_dir, c, rep.lines); !st) {
            return st.err();
        }
        rep.tasks_moved = c.moved;
        rep.tasks_refused = c.refused;
        rep.tasks_gone = c.gone;
        rep.drift = c.moved > 0;
        return rep;
    }
    if (method == isolation_method::affinity_fence) {
        if (auto st = sweep_fence(fs, tasks, journal, isolated, housekeeping, opts.own_rt, rep); !st) {
            return st.err();
        }
        rep.drift = rep.tasks_moved > 0;
        return rep;
    }
    rep.lines.push_back("isolation: none in use");
    return rep;
}


isolation_report preview_isolation(const host_fs& fs, const restore_journal* journal, const isolation_options& opts) {
    isolation_report rep;
    const auto mounts = find_cgroup_mounts(fs);
    if (opts.force && *opts.force == isolation_method::none) {
        rep.lines.push_back("isolation: none (disabled by configuration)");
        return rep;
    }
    for (auto m : {isolation_method::cgroup_v2_partition, isolation_method::cgroup_v1_cpuset,
                   isolation_method::affinity_fence}) {
        if (opts.force && *opts.force != m) {
            continue;
        }
        const std::string why_not = why_unavailable(fs, journal, mounts, m, opts);
        if (!why_not.empty()) {
            rep.not_used.push_back(std::string(to_string(m)) + ": " + why_not);
            rep.lines.push_back("isolation: not used: " + rep.not_used.back());
            if (opts.force) {
                rep.lines.push_back(std::string("isolation: ") + to_string(m) + " was asked for (host.isolation) " +
                                    "but cannot be used: apply will fail");
                return rep;
            }
            continue;
        }
        rep.method = m;
        rep.lines.push_back(std::string("isolation: apply will use ") + to_string(m) +
                            " (unless the kernel refuses a write; then the next method, and apply says why)");
        if (opts.rt_threads) {
            rep.lines.push_back("isolation: " + rt_reach_for(fs, m, opts).how);
        }
        return rep;
    }
    return rep;
}

rt_reach rt_reach_for(const host_fs& fs, isolation_method m, const isolation_options& opts) {
    rt_reach r;
    const auto mounts = find_cgroup_mounts(fs);
    switch (m) {
        case isolation_method::cgroup_v1_cpuset:
            r.reachable = true;
            r.tasks_file = join_path(join_path(mounts.v1_cpuset_root, opts.cgroup_prefix + "-isolated"), "tasks");
            r.how = "dispatch threads: each writes its TID into " + r.tasks_file +
                    " (handed to the daemon's user by the root helper), then pins itself to its CPU";
            break;
        case isolation_method::affinity_fence:
            r.reachable = true;
            r.how = "dispatch threads: each pins itself to its CPU with sched_setaffinity (the fence leaves the "
                    "isolated CPUs in every cpuset and moves every movable task off them)";
            break;
        case isolation_method::cgroup_v2_partition: {
            std::string why = v2_unreachable(fs, mounts, [&] {
                isolation_options o = opts;
                o.rt_threads = true;
                return o;
            }());
            r.how = "dispatch threads: cannot reach the isolated CPUs: " + why +
                    "; use host.isolation = \"auto\" (the fence) or \"fence\"";
            break;
        }
        case isolation_method::none:
            r.how = "dispatch threads: no CPU is isolated (host.isolation = \"none\"); they pin themselves to CPUs "
                    "every other task shares";
            break;
    }
    return r;
}

std::string v2_cgroup_of(std::string_view text) {
    std::size_t pos = 0;
    while (pos < text.size()) {
        const auto nl = text.find('\n', pos);
        const auto line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
        if (line.substr(0, 3) == "0::") {
            return std::string(line.substr(3));
        }
        if (nl == std::string_view::npos) {
            break;
        }
        pos = nl + 1;
    }
    return "";
}

status delegate_rt_cgroup(host_fs& fs, const isolation_report& rep, uid_t uid, gid_t gid, const std::string& user,
                          std::vector<std::string>& lines) {
    if (rep.method != isolation_method::cgroup_v1_cpuset || rep.isolated_cgroup.empty()) {
        return ok();
    }
    const std::string file = join_path(rep.isolated_cgroup, "tasks");
    const std::string who = user + " (uid " + std::to_string(uid) + ", gid " + std::to_string(gid) + ")";
    if (fs.dry_run()) {
        lines.push_back("isolation: would hand " + file + " to " + who);
        return ok();
    }
    const auto p = fs.resolve(file);
    if (::lchown(p.c_str(), uid, gid) < 0) {
        const int err = errno;
        return error::from_errno(err, "isolation: lchown " + file + " to " + who);
    }
    lines.push_back("isolation: handed " + file + " to " + who +
                    ": its dispatch threads join the isolated cpuset themselves");
    return ok();
}

}  // namespace rtcore
