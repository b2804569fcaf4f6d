#include "rtcore/host_partition.hpp"

#include <algorithm>
#include <cerrno>
#include <optional>

#include "rtcore/text.hpp"

namespace rtcore::host_partition {

namespace {

// Undoes a failed apply: the whole journal when this apply created it (so the
// journal goes away too), else only this apply's records.
std::string unwind(host_fs& fs, task_ops& tasks, const journal_dir* dir, std::optional<restore_journal>& journal,
                   std::size_t mark, const restore_allow_list& allow) {
    if (fs.dry_run()) {
        return "dry run: nothing was changed";
    }
    restore_outcome out;
    if (journal && journal->existed()) {
        out = unwind_since(fs, tasks, *journal, mark);
        journal.reset();
    } else {
        journal.reset();
        auto r = restore_from_journal(fs, tasks, *dir, allow);
        if (!r) {
            return "unwinding failed: " + r.err().message + "; restore again";
        }
        out = std::move(*r);
    }
    std::size_t restored = 0;
    std::string failed;
    for (const auto& it : out.items) {
        if (it.result == restore_item::outcome::restored) {
            ++restored;
        } else if (it.result == restore_item::outcome::failed) {
            failed += "; " + it.line();
        }
    }
    for (const auto& p : out.problems) {
        failed += "; " + p;
    }
    if (!out.complete) {
        return "unwound " + std::to_string(restored) + " changes but not all" + failed + "; restore again";
    }
    return restored == 0 ? std::string("nothing was changed")
                         : "every change was unwound (" + std::to_string(restored) + " values put back)";
}

// Why the partition an existing journal of this boot records cannot be kept
// as it is on the host (it must be restored and applied afresh), or "" when
// it can: only drift that apply fixes in place (IRQs, task placement) left.
std::string needs_rebuild(const host_fs& fs, const restore_journal& j, const cpu_set& isolated,
                          const cpu_set& housekeeping, const apply_options& opts) {
    const rec::apply* p = j.partition();
    if (p == nullptr) {
        return "it records no partition (the apply that started it did not get far)";
    }
    if (!(p->isolated == isolated) || !(p->housekeeping == housekeeping)) {
        return "it isolates CPUs " + p->isolated.to_list() + " (housekeeping " + p->housekeeping.to_list() +
               ") and this apply asks for " + isolated.to_list() + " (housekeeping " + housekeeping.to_list() + ")";
    }
    const auto m = j.method();
    if (!m) {
        return "the apply that wrote it did not finish (no isolation method recorded)";
    }
    if (opts.isolation.force && *opts.isolation.force != *m) {
        return std::string("it used isolation ") + to_string(*m) + " and this apply asks for " +
               to_string(*opts.isolation.force);
    }
    const auto mounts = find_cgroup_mounts(fs);
    const std::string& prefix = opts.isolation.cgroup_prefix;
    // A cgroup of the partition: made by qrtd (journaled), there, and with the CPUs it should have.
    auto cgroup_wrong = [&](const std::string& root, const std::string& suffix, const cpu_set& cpus) -> std::string {
        const std::string dir = join_path(root, prefix + suffix);
        if (root.empty() || !j.made_dir(dir)) {
            return "it records no cgroup " + dir;
        }
        if (!fs.is_dir(dir)) {
            return "its cgroup " + dir + " is gone";
        }
        auto now = fs.read_line(join_path(dir, "cpuset.cpus"));
        if (!now || *now != cpus.to_list()) {
            return "its cgroup " + dir + " has CPUs " + (now ? "\"" + *now + "\"" : now.err().message) +
                   ", not " + cpus.to_list();
        }
        return "";
    };
    if (*m == isolation_method::cgroup_v2_partition) {
        if (auto why = cgroup_wrong(mounts.v2_root, "-isolated", isolated); !why.empty()) {
            return why;
        }
        const std::string part = join_path(join_path(mounts.v2_root, prefix + "-isolated"), "cpuset.cpus.partition");
        auto now = fs.read_line(part);
        if (!now || *now != "isolated") {
            return part + " reads " + (now ? "\"" + *now + "\"" : now.err().message) + ", not \"isolated\"";
        }
    } else if (*m == isolation_method::cgroup_v1_cpuset) {
        if (auto why = cgroup_wrong(mounts.v1_cpuset_root, "-isolated", isolated); !why.empty()) {
            return why;
        }
        if (auto why = cgroup_wrong(mounts.v1_cpuset_root, "-housekeeping", housekeeping); !why.empty()) {
            return why;
        }
        const std::string slb = join_path(mounts.v1_cpuset_root, "cpuset.sched_load_balance");
        auto now = fs.read_line(slb);
        if (!now || *now != "0") {
            return slb + " reads " + (now ? "\"" + *now + "\"" : now.err().message) + ", not 0";
        }
    }
    return "";
}

// The journal of this boot checked against the host, and what drifted
// re-applied in place (journaling first).
status reconcile_in_place(host_fs& fs, task_ops& tasks, restore_journal& journal, const cpu_set& isolated,
                          const cpu_set& housekeeping, const apply_options& opts, apply_report& rep) {
    if (opts.pin_irqs) {
        // As apply pins them: also the IRQs an unconfigured irqbalance moved.
        auto irqs = verify_irqs(fs, journal, isolated, housekeeping, true);
        if (!irqs) {
            return irqs.err();
        }
        rep.irqs = std::move(*irqs);
        using a = irq_outcome::action;
        const auto repinned = rep.irqs.count(a::repinned);
        const auto fresh = rep.irqs.count(a::new_pinned);
        if (repinned + fresh > 0) {
            rep.drift.push_back(std::to_string(repinned) + " IRQs had drifted back onto CPUs " + isolated.to_list() +
                                " and " + std::to_string(fresh) + " new ones reached them: pinned to CPUs " +
                                housekeeping.to_list());
        }
        if (rep.irqs.default_before != rep.irqs.default_after) {
            rep.drift.push_back("default_smp_affinity was " + rep.irqs.default_before + ": set to " +
                                rep.irqs.default_after);
        }
    }
    const isolation_method m = journal.method().value_or(isolation_method::none);
    auto iso = verify_isolation(fs, tasks, journal, isolated, housekeeping, m, opts.isolation);
    if (!iso) {
        return iso.err();
    }
    rep.isolation = std::move(*iso);
    if (rep.isolation.tasks_moved > 0) {
        rep.drift.push_back(std::to_string(rep.isolation.tasks_moved) + " tasks had reached CPUs " +
                            isolated.to_list() + ": moved off them again");
    }
    auto knobs = apply_knobs(fs, tasks, journal, isolated, housekeeping, opts.knobs, knob_pass::verify);
    if (!knobs) {
        return knobs.err();
    }
    rep.knobs = std::move(*knobs);
    for (const auto& k : rep.knobs.knobs) {
        if (k.act == knob_outcome::action::reset || (k.act == knob_outcome::action::set)) {
            rep.drift.push_back("knob " + k.name + " read " + k.before + ": set to " + k.after + " again");
        }
    }
    if (rep.knobs.kthreads.moved > 0) {
        rep.drift.push_back(std::to_string(rep.knobs.kthreads.moved) + " kernel threads had reached CPUs " +
                            isolated.to_list() + ": moved off them again");
    }
    return ok();
}

}  // namespace

std::size_t restore_report::count(restore_item::outcome o) const {
    return static_cast<std::size_t>(
        std::count_if(items.begin(), items.end(), [o](const restore_item& i) { return i.result == o; }));
}

std::string restore_report::summary() const {
    using o = restore_item::outcome;
    return std::to_string(count(o::restored)) + " restored, " + std::to_string(count(o::unchanged)) +
           " unchanged, " + std::to_string(count(o::gone)) + " gone, " + std::to_string(count(o::skipped)) +
           " left as changed by others, " + std::to_string(count(o::failed)) + " failed";
}

status validate(const host_fs& fs, const cpu_set& isolated, const cpu_set& housekeeping, const apply_options& opts) {
    const std::string online_path = "/sys/devices/system/cpu/online";
    auto online_text = fs.read_line(online_path);
    if (!online_text) {
        return online_text.err();
    }
    auto online = cpu_set::parse_list(*online_text);
    if (!online) {
        return error::invalid("read " + online_path + ": " + online.err().message);
    }
    if (isolated.empty()) {
        return error::invalid("the isolated CPU set is empty: nothing to isolate");
    }
    if (!isolated.is_subset_of(*online)) {
        return error::invalid("isolated CPUs " + (isolated - *online).to_list() +
                              " do not exist or are offline (online CPUs: " + online->to_list() + ")");
    }
    if (!housekeeping.is_subset_of(*online)) {
        return error::invalid("housekeeping CPUs " + (housekeeping - *online).to_list() +
                              " do not exist or are offline (online CPUs: " + online->to_list() + ")");
    }
    if (online->is_subset_of(isolated)) {
        return error::invalid("the isolated set " + isolated.to_list() + " covers every online CPU (" +
                              online->to_list() + "); keep at least one housekeeping CPU");
    }
    if (housekeeping.empty()) {
        return error::invalid("the housekeeping CPU set is empty; keep at least one CPU for the system");
    }
    if (isolated.intersects(housekeeping)) {
        return error::invalid("CPUs " + (isolated & housekeeping).to_list() +
                              " are in both the isolated and the housekeeping set");
    }
    if (opts.pin_irqs && !fs.is_dir("/proc/irq")) {
        return error{ENOENT, "/proc/irq does not exist under " + fs.root().string() + "; cannot pin IRQs"};
    }
    return ok();
}

result<apply_report> apply(host_fs& fs, task_ops& tasks, const journal_dir* dir, const cpu_set& isolated,
                           const cpu_set& housekeeping, const apply_options& opts) {
    if (auto st = validate(fs, isolated, housekeeping, opts); !st) {
        return error{st.err().code, "apply: " + st.err().message + "; nothing was changed"};
    }
    if (dir == nullptr && !fs.dry_run()) {
        return error::invalid("apply: no journal directory; nothing was changed");
    }
    const auto allow = restore_allow_list::for_host(fs, opts.isolation.cgroup_prefix);
    auto open_journal = [&]() {
        return fs.dry_run() ? restore_journal::open_dry_run(fs, dir, allow) : restore_journal::open(fs, *dir, allow);
    };
    std::optional<restore_journal> journal;
    {
        auto j = open_journal();
        if (!j) {
            return error{j.err().code, "apply: " + j.err().message + "; nothing was changed"};
        }
        journal.emplace(std::move(*j));
    }
    apply_report rep;
    rep.isolated = isolated;
    rep.housekeeping = housekeeping;
    rep.dry_run = fs.dry_run();
    rep.journal_path = journal->path().string();
    rep.journal_by = opts.by;
    if (rep.dry_run) {
        rep.lines.push_back("partition: dry run: listing the writes apply would make; nothing is changed");
    }
    if (!journal->set_aside_reason().empty()) {
        rep.lines.push_back("partition: " + journal->set_aside_reason());
    }

    if (journal->existed()) {
        // A journal of this boot: never trusted blindly.
        rep.continued_journal = true;
        if (const auto* p = journal->partition()) {
            rep.journal_by = p->by;
        }
        const std::string why = needs_rebuild(fs, *journal, isolated, housekeeping, opts);
        if (why.empty()) {
            rep.lines.push_back("partition: " + rep.journal_path + " holds this boot's partition (CPUs " +
                                isolated.to_list() + ", by " + rec::to_string(rep.journal_by) +
                                "); checking it against the host");
            if (auto st = reconcile_in_place(fs, tasks, *journal, isolated, housekeeping, opts, rep); !st) {
                return error{st.err().code, "apply: checking the partition in " + rep.journal_path +
                                                " against the host: " + st.err().message};
            }
            rep.lines.insert(rep.lines.end(), rep.irqs.lines.begin(), rep.irqs.lines.end());
            rep.lines.insert(rep.lines.end(), rep.isolation.lines.begin(), rep.isolation.lines.end());
            rep.lines.insert(rep.lines.end(), rep.knobs.lines.begin(), rep.knobs.lines.end());
            for (const auto& d : rep.drift) {
                rep.lines.push_back("partition: drift: " + d);
            }
            if (rep.dry_run) {
                rep.planned_writes = fs.planned_writes();
                for (const auto& w : rep.planned_writes) {
                    rep.lines.push_back("dry-run: would write " + w.path + " = " + w.data);
                }
            }
            rep.lines.push_back(std::string("partition: applied (") + to_string(rep.isolation.method) + "); " +
                                (rep.drift.empty() ? "the host matched the journal"
                                                   : "what had drifted was re-applied") +
                                "; restore puts every value back");
            return rep;
        }
        rep.rebuilt = true;
        rep.drift.push_back("the partition in " + rep.journal_path + " cannot be kept as it is: " + why +
                            "; it is restored and applied afresh");
        rep.lines.push_back("partition: " + rep.drift.back());
        if (rep.dry_run) {
            rep.lines.push_back("partition: dry run: would restore " + rep.journal_path +
                                " first; the writes below assume a fresh journal");
            journal.emplace(std::move(restore_journal::open_dry_run(fs, nullptr, allow).value()));
        } else {
            journal.reset();
            auto back = restore_from_journal(fs, tasks, *dir, allow);
            if (!back) {
                return error{back.err().code, "apply: restoring the stale partition: " + back.err().message};
            }
            for (const auto& it : back->items) {
                rep.lines.push_back("partition: restore: " + it.line());
            }
            if (!back->complete) {
                std::string first = back->problems.empty() ? std::string() : back->problems.front();
                for (const auto& it : back->items) {
                    if (first.empty() && it.result == restore_item::outcome::failed) {
                        first = it.line();
                    }
                }
                return error{EBUSY, "apply: the partition in " + rep.journal_path + " could not be fully restored (" +
                                        first + "); the journal is kept and nothing new was applied"};
            }
            auto j = open_journal();
            if (!j) {
                return error{j.err().code, "apply: " + j.err().message};
            }
            journal.emplace(std::move(*j));
        }
        rep.journal_by = opts.by;
    }

    const std::size_t mark = journal->size();
    rep.lines.push_back("partition: isolating CPUs " + isolated.to_list() + ", housekeeping CPUs " +
                        housekeeping.to_list() + "; originals journaled in " + rep.journal_path);
    if (auto st = journal->append(rec::apply{isolated, housekeeping, opts.by}); !st) {
        const std::string how = unwind(fs, tasks, dir, journal, mark, allow);
        return error{st.err().code, "apply: " + st.err().message + "; " + how};
    }

    if (opts.pin_irqs) {
        auto irqs = pin_irqs(fs, *journal, isolated, housekeeping);
        if (!irqs) {
            const std::string how = unwind(fs, tasks, dir, journal, mark, allow);
            return error{irqs.err().code, "apply: pinning IRQs: " + irqs.err().message + "; " + how};
        }
        rep.irqs = std::move(*irqs);
        rep.lines.insert(rep.lines.end(), rep.irqs.lines.begin(), rep.irqs.lines.end());
    } else {
        rep.lines.push_back("irq: IRQ pinning disabled by configuration");
    }

    auto iso = apply_isolation(fs, tasks, *journal, isolated, housekeeping, opts.isolation);
    if (!iso) {
        const std::string how = unwind(fs, tasks, dir, journal, mark, allow);
        return error{iso.err().code, "apply: " + iso.err().message + "; " + how};
    }
    rep.isolation = std::move(*iso);
    rep.lines.insert(rep.lines.end(), rep.isolation.lines.begin(), rep.isolation.lines.end());

    auto knobs = apply_knobs(fs, tasks, *journal, isolated, housekeeping, opts.knobs, knob_pass::apply);
    if (!knobs) {
        const std::string how = unwind(fs, tasks, dir, journal, mark, allow);
        return error{knobs.err().code, "apply: " + knobs.err().message + "; " + how};
    }
    rep.knobs = std::move(*knobs);
    rep.lines.insert(rep.lines.end(), rep.knobs.lines.begin(), rep.knobs.lines.end());
    if (rep.dry_run) {
        rep.planned_writes = fs.planned_writes();
        for (const auto& w : rep.planned_writes) {
            rep.lines.push_back("dry-run: would write " + w.path + " = " + w.data);
        }
    }
    rep.lines.push_back(std::string("partition: applied (") + to_string(rep.isolation.method) +
                        "); restore puts every value back");
    return rep;
}

result<restore_report> restore(host_fs& fs, task_ops& tasks, const journal_dir* dir, const restore_options& opts) {
    restore_report rep;
    if (dir == nullptr) {
        if (!fs.dry_run()) {
            return error::invalid("restore: no journal directory; nothing was changed");
        }
        rep.lines.push_back("restore: no journal directory: nothing to restore");
        return rep;
    }
    const auto allow = restore_allow_list::for_host(fs, opts.cgroup_prefix);
    auto out = restore_from_journal(fs, tasks, *dir, allow);
    if (!out) {
        return error{out.err().code, "restore: " + out.err().message};
    }
    rep.journal_found = out->journal_found;
    rep.complete = out->complete;
    rep.journal_removed = out->journal_removed;
    rep.other_boot = out->other_boot;
    rep.items = std::move(out->items);
    rep.problems = std::move(out->problems);
    if (!rep.journal_found) {
        rep.lines.push_back("restore: no journal in " + dir->path().string() + ": nothing to restore");
        return rep;
    }
    for (const auto& it : rep.items) {
        rep.lines.push_back("restore: " + it.line());
    }
    for (const auto& p : rep.problems) {
        rep.lines.push_back("restore: problem: " + p);
    }
    rep.lines.push_back("restore: " + rep.summary() + "; " +
                        (rep.journal_removed ? "journal removed"
                         : fs.dry_run()      ? "journal kept (dry run)"
                                             : "journal kept (run restore again after fixing the failures)"));
    if (fs.dry_run()) {
        for (const auto& w : fs.planned_writes()) {
            rep.lines.push_back("dry-run: would write " + w.path + " = " + w.data);
        }
        rep.lines.push_back("restore: dry run: nothing was changed and the journal is kept");
    }
    return rep;
}

result<verify_report> verify(host_fs& fs, task_ops& tasks, const journal_dir& dir, const apply_options& opts) {
    verify_report rep;
    const auto allow = restore_allow_list::for_host(fs, opts.isolation.cgroup_prefix);
    auto loaded = restore_journal::load(fs, dir, allow);
    if (!loaded) {
        return error{loaded.err().code, "verify: " + loaded.err().message};
    }
    if (loaded->records.empty()) {
        rep.lines.push_back("verify: no journal in " + dir.path().string() + ": the partition is not applied");
        return rep;
    }
    if (auto then_boot = journal_other_boot(fs, loaded->records)) {
        // Nothing of it holds after the reboot; the next apply sets it aside.
        rep.lines.push_back("verify: the journal in " + dir.path().string() + " was written in boot " + *then_boot +
                            ", before the last reboot: the partition is not applied in this boot");
        return rep;
    }
    // Re-pinning journals first: a real fs needs the journal open for writing.
    auto journal = fs.dry_run() ? restore_journal::open_dry_run(fs, &dir, allow) : restore_journal::open(fs, dir, allow);
    if (!journal) {
        return error{journal.err().code, "verify: " + journal.err().message};
    }
    const rec::apply* p = journal->partition();
    if (p == nullptr) {
        return error::invalid("verify: the journal in " + dir.path().string() + " names no isolated set");
    }
    rep.applied = true;
    rep.isolated = p->isolated;
    rep.housekeeping = p->housekeeping;
    rep.method = journal->method().value_or(isolation_method::none);
    if (opts.pin_irqs) {
        auto irqs = verify_irqs(fs, *journal, rep.isolated, rep.housekeeping);
        if (!irqs) {
            return error{irqs.err().code, "verify: " + irqs.err().message};
        }
        rep.irqs = std::move(*irqs);
    }
    auto iso = verify_isolation(fs, tasks, *journal, rep.isolated, rep.housekeeping, rep.method, opts.isolation);
    if (!iso) {
        return error{iso.err().code, "verify: " + iso.err().message};
    }
    rep.isolation = std::move(*iso);
    auto knobs = apply_knobs(fs, tasks, *journal, rep.isolated, rep.housekeeping, opts.knobs, knob_pass::verify);
    if (!knobs) {
        return error{knobs.err().code, "verify: " + knobs.err().message};
    }
    rep.knobs = std::move(*knobs);
    using a = irq_outcome::action;
    const bool irq_drift = rep.irqs.count(a::repinned) + rep.irqs.count(a::new_pinned) +
                               rep.irqs.count(a::left_to_irqbalance) >
                           0;
    rep.clean = !irq_drift && !rep.isolation.drift && !rep.knobs.drift;
    rep.lines.insert(rep.lines.end(), rep.irqs.lines.begin(), rep.irqs.lines.end());
    rep.lines.insert(rep.lines.end(), rep.isolation.lines.begin(), rep.isolation.lines.end());
    rep.lines.insert(rep.lines.end(), rep.knobs.lines.begin(), rep.knobs.lines.end());
    rep.lines.push_back(std::string("verify: ") + (rep.clean ? "clean" : "drift found (see above)") +
                        "; isolation " + to_string(rep.method) + ", CPUs " + rep.isolated.to_list());
    return rep;
}

}  // namespace rtcore::host_partition
