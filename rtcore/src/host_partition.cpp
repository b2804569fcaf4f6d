#include "rtcore/host_partition.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <sys/stat.h>

namespace rtcore::host_partition {

namespace {

// Undoes a failed apply: the whole journal when this apply created it (so the
// journal goes away too), else only this apply's records.
std::string unwind(host_fs& fs, task_ops& tasks, const std::filesystem::path& state_dir,
                   std::optional<restore_journal>& journal, std::size_t mark) {
    if (fs.dry_run()) {
        return "dry run: nothing was changed";
    }
    restore_outcome out;
    if (journal && journal->existed()) {
        out = unwind_since(fs, tasks, *journal, mark);
        journal.reset();
    } else {
        journal.reset();  // releases the lock for restore
        auto r = restore_from_journal(fs, tasks, state_dir);
        if (!r) {
            return "unwinding failed: " + r.err().message + "; run `qrtd host restore`";
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
    if (!out.complete) {
        return "unwound " + std::to_string(restored) + " changes but not all" + failed +
               "; run `qrtd host restore` again";
    }
    return restored == 0 ? std::string("nothing was changed")
                         : "every change was unwound (" + std::to_string(restored) + " values put back)";
}

}  // namespace

std::size_t restore_report::count(restore_item::outcome o) const {
    return static_cast<std::size_t>(
        std::count_if(items.begin(), items.end(), [o](const restore_item& i) { return i.result == o; }));
}

status validate(const host_fs& fs, const std::filesystem::path& state_dir, const cpu_set& isolated,
                const cpu_set& housekeeping, const apply_options& opts) {
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
    struct stat st {};
    if (::stat(state_dir.c_str(), &st) < 0) {
        const int e = errno;
        return error{e, "state directory " + state_dir.string() + ": " + std::generic_category().message(e) +
                            " (create it first; qrtd keeps its restore journal there)"};
    }
    if (!S_ISDIR(st.st_mode)) {
        return error{ENOTDIR, "state directory " + state_dir.string() + " is not a directory"};
    }
    if (!fs.dry_run() && ::access(state_dir.c_str(), W_OK | X_OK) < 0) {
        const int e = errno;
        return error{e, "state directory " + state_dir.string() + " is not writable: " +
                            std::generic_category().message(e)};
    }
    if (opts.pin_irqs && !fs.is_dir("/proc/irq")) {
        return error{ENOENT, "/proc/irq does not exist under " + fs.root().string() + "; cannot pin IRQs"};
    }
    return ok();
}

result<apply_report> apply(host_fs& fs, task_ops& tasks, const std::filesystem::path& state_dir,
                           const cpu_set& isolated, const cpu_set& housekeeping, const apply_options& opts) {
    if (auto st = validate(fs, state_dir, isolated, housekeeping, opts); !st) {
        return error{st.err().code, "apply: " + st.err().message + "; nothing was changed"};
    }
    std::optional<restore_journal> journal;
    {
        auto j = restore_journal::open(fs, state_dir, fs.dry_run());
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
    rep.continued_journal = journal->existed();
    const std::size_t mark = journal->size();
    if (rep.dry_run) {
        rep.lines.push_back("partition: dry run: listing the writes apply would make; nothing is changed");
    }
    if (!journal->set_aside_reason().empty()) {
        rep.lines.push_back("partition: " + journal->set_aside_reason());
    }
    if (rep.continued_journal) {
        rep.lines.push_back("partition: " + rep.journal_path +
                            " holds an earlier apply that was never restored; its originals are kept");
    }
    rep.lines.push_back("partition: isolating CPUs " + isolated.to_list() + ", housekeeping CPUs " +
                        housekeeping.to_list() + "; originals journaled in " + rep.journal_path);
    if (auto st = journal->append(journal_record{"apply", {isolated.to_list(), housekeeping.to_list()}}); !st) {
        const std::string how = unwind(fs, tasks, state_dir, journal, mark);
        return error{st.err().code, "apply: " + st.err().message + "; " + how};
    }

    if (opts.pin_irqs) {
        auto irqs = pin_irqs(fs, *journal, isolated, housekeeping);
        if (!irqs) {
            const std::string how = unwind(fs, tasks, state_dir, journal, mark);
            return error{irqs.err().code, "apply: pinning IRQs: " + irqs.err().message + "; " + how};
        }
        rep.irqs = std::move(*irqs);
        rep.lines.insert(rep.lines.end(), rep.irqs.lines.begin(), rep.irqs.lines.end());
    } else {
        rep.lines.push_back("irq: IRQ pinning disabled by configuration");
    }

    auto iso = apply_isolation(fs, tasks, *journal, isolated, housekeeping, opts.isolation);
    if (!iso) {
        const std::string how = unwind(fs, tasks, state_dir, journal, mark);
        return error{iso.err().code, "apply: " + iso.err().message + "; " + how};
    }
    rep.isolation = std::move(*iso);
    rep.lines.insert(rep.lines.end(), rep.isolation.lines.begin(), rep.isolation.lines.end());
    if (rep.dry_run) {
        rep.planned_writes = fs.planned_writes();
        for (const auto& w : rep.planned_writes) {
            rep.lines.push_back("dry-run: would write " + w.path + " = " + w.data);
        }
    }
    rep.lines.push_back(std::string("partition: applied (") + to_string(rep.isolation.method) +
                        "); `qrtd host restore` puts every value back");
    return rep;
}

result<restore_report> restore(host_fs& fs, task_ops& tasks, const std::filesystem::path& state_dir) {
    auto out = restore_from_journal(fs, tasks, state_dir);
    if (!out) {
        return error{out.err().code, "restore: " + out.err().message + "; nothing was changed"};
    }
    restore_report rep;
    rep.journal_found = out->journal_found;
    rep.complete = out->complete;
    rep.journal_removed = out->journal_removed;
    rep.other_boot = out->other_boot;
    rep.items = std::move(out->items);
    rep.problems = std::move(out->problems);
    if (!rep.journal_found) {
        rep.lines.push_back("restore: no journal in " + state_dir.string() + ": nothing to restore");
        return rep;
    }
    for (const auto& it : rep.items) {
        rep.lines.push_back("restore: " + it.line());
    }
    for (const auto& p : rep.problems) {
        rep.lines.push_back("restore: problem: " + p);
    }
    using o = restore_item::outcome;
    rep.lines.push_back("restore: " + std::to_string(rep.count(o::restored)) + " restored, " +
                        std::to_string(rep.count(o::unchanged)) + " unchanged, " +
                        std::to_string(rep.count(o::gone)) + " gone, " + std::to_string(rep.count(o::skipped)) +
                        " left as changed by others, " + std::to_string(rep.count(o::failed)) + " failed; " +
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

result<verify_report> verify(host_fs& fs, task_ops& tasks, const std::filesystem::path& state_dir,
                             const apply_options& opts) {
    verify_report rep;
    auto recs = restore_journal::load(state_dir);
    if (!recs) {
        return error{recs.err().code, "verify: " + recs.err().message};
    }
    if (recs->empty()) {
        rep.lines.push_back("verify: no journal in " + state_dir.string() + ": the partition is not applied");
        return rep;
    }
    if (auto then_boot = journal_other_boot(fs, *recs)) {
        // Nothing of it holds after the reboot; the next apply sets it aside.
        rep.lines.push_back("verify: the journal in " + state_dir.string() + " was written in boot " + *then_boot +
                            ", before the last reboot: the partition is not applied in this boot");
        return rep;
    }
    rep.applied = true;
    bool have_sets = false;
    std::string prefix = opts.isolation.cgroup_prefix;
    for (const auto& r : *recs) {
        if (r.kind == "apply" && r.fields.size() == 2) {
            auto i = cpu_set::parse_list(r.fields[0]);
            auto h = cpu_set::parse_list(r.fields[1]);
            if (i && h) {
                rep.isolated = *i;
                rep.housekeeping = *h;
                have_sets = true;
            }
        } else if (r.kind == "method" && !r.fields.empty()) {
            rep.method = parse_isolation_method(r.fields[0]).value_or(isolation_method::none);
        } else if (r.kind == "mkcg" && !r.fields.empty()) {
            // The cgroups apply created name the prefix, whatever the caller passes now.
            const std::string base = std::filesystem::path(r.fields[0]).filename().string();
            const std::string suffix = "-isolated";
            if (base.size() > suffix.size() && base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0) {
                prefix = base.substr(0, base.size() - suffix.size());
            }
        }
    }
    if (!have_sets) {
        return error::invalid("verify: the journal in " + state_dir.string() + " names no isolated set");
    }
    auto journal = restore_journal::open(fs, state_dir, fs.dry_run());
    if (!journal) {
        return error{journal.err().code, "verify: " + journal.err().message};
    }
    if (opts.pin_irqs) {
        auto irqs = verify_irqs(fs, *journal, rep.isolated, rep.housekeeping);
        if (!irqs) {
            return error{irqs.err().code, "verify: " + irqs.err().message};
        }
        rep.irqs = std::move(*irqs);
    }
    isolation_options iso_opts = opts.isolation;
    iso_opts.cgroup_prefix = prefix;
    auto iso = verify_isolation(fs, tasks, *journal, rep.isolated, rep.housekeeping, rep.method, iso_opts);
    if (!iso) {
        return error{iso.err().code, "verify: " + iso.err().message};
    }
    rep.isolation = std::move(*iso);
    using a = irq_outcome::action;
    const bool irq_drift = rep.irqs.count(a::repinned) + rep.irqs.count(a::new_pinned) +
                               rep.irqs.count(a::left_to_irqbalance) >
                           0;
    rep.clean = !irq_drift && !rep.isolation.drift;
    rep.lines.insert(rep.lines.end(), rep.irqs.lines.begin(), rep.irqs.lines.end());
    rep.lines.insert(rep.lines.end(), rep.isolation.lines.begin(), rep.isolation.lines.end());
    rep.lines.push_back(std::string("verify: ") + (rep.clean ? "clean" : "drift found (see above)") +
                        "; isolation " + to_string(rep.method) + ", CPUs " + rep.isolated.to_list());
    return rep;
}

}  // namespace rtcore::host_partition
