// Undoing the restore journal's records: see journal_undo.hpp.

#include "rtcore/journal_undo.hpp"

#include "rtcore/knob_catalogue.hpp"
#include "rtcore/text.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

namespace rtcore {

namespace {

using outcome = restore_item::outcome;

// An rmdir of a cgroup whose tasks are still leaving fails with EBUSY for a
// moment: retried this often, this far apart, moving stragglers each time.
constexpr int rmdir_busy_tries = 40;
constexpr auto rmdir_busy_pause = std::chrono::milliseconds(50);

// The task named by a record, or nullopt when it exited (or the tid was reused).
std::optional<task_info> same_task(host_fs& fs, task_ops& tasks, pid_t tid, std::uint64_t start) {
    auto t = tasks.task(fs, tid);
    if (!t || t->start_ticks != start) {
        return std::nullopt;
    }
    return *t;
}

// The item of a task record, "task 812 (sshd)"; gone when the task exited
// (or its tid names another task now): then the item says so.
struct task_item {
    restore_item item;
    bool gone = false;
};
task_item item_for_task(host_fs& fs, task_ops& tasks, pid_t tid, std::uint64_t start) {
    restore_item it{outcome::restored, "task " + std::to_string(tid), ""};
    auto t = same_task(fs, tasks, tid, start);
    if (!t) {
        it.result = outcome::gone;
        it.detail = "exited; nothing to restore";
        return {std::move(it), true};
    }
    it.what += " (" + t->comm + ")";
    return {std::move(it), false};
}

// ------------------------------------------------------------ one undo per kind
// nullopt for informational records.  A kind without an undo does not compile.

std::optional<restore_item> undo(host_fs& /*fs*/, task_ops& /*tasks*/, const rec::header& /*r*/) { return {}; }
std::optional<restore_item> undo(host_fs& /*fs*/, task_ops& /*tasks*/, const rec::apply& /*r*/) { return {}; }
std::optional<restore_item> undo(host_fs& /*fs*/, task_ops& /*tasks*/, const rec::method& /*r*/) { return {}; }
std::optional<restore_item> undo(host_fs& /*fs*/, task_ops& /*tasks*/, const rec::managed& /*r*/) { return {}; }
std::optional<restore_item> undo(host_fs& /*fs*/, task_ops& /*tasks*/, const rec::nomove& /*r*/) { return {}; }

// A file's original bytes, put back: a file that is gone or already holds
// them is left; otherwise leave(current bytes) may return the item that
// leaves it as it is, else the bytes are written.
template <typename Leave>
restore_item put_back(host_fs& fs, const std::string& path, const std::string& original, Leave leave) {
    restore_item it{outcome::restored, path, ""};
    auto cur = fs.read(path);
    if (!cur) {
        it.result = cur.err().code == ENOENT ? outcome::gone : outcome::failed;
        it.detail = cur.err().code == ENOENT ? "no longer exists; nothing to restore" : cur.err().message;
        return it;
    }
    if (*cur == original) {
        it.result = outcome::unchanged;
        it.detail = "already " + one_line(original);
        return it;
    }
    if (std::optional<restore_item> left = leave(*cur)) {
        return *left;
    }
    if (auto st = fs.write(path, original); !st) {
        it.result = outcome::failed;
        it.detail = st.err().message;
        return it;
    }
    it.detail = one_line(*cur) + " -> " + one_line(original);
    return it;
}

// A runtime knob: the original bytes go back when the file still reads what
// qrtd set; a value someone else set since is left (and said).
std::optional<restore_item> undo(host_fs& fs, task_ops& /*tasks*/, const rec::knob& r) {
    const auto info = knob_at(r.path);
    const knob_form form = info ? info->form : knob_form::integer;
    return put_back(fs, r.path, r.original, [&](const std::string& cur) -> std::optional<restore_item> {
        if (same_knob_value(form, cur, r.set)) {
            return std::nullopt;
        }
        if (same_knob_value(form, cur, r.original)) {
            return restore_item{outcome::unchanged, r.path, "already " + one_line(r.original)};
        }
        return restore_item{outcome::skipped, r.path,
                            "changed by someone else since (now " + one_line(cur) + ", qrtd had set " +
                                one_line(r.set) + "); left as is"};
    });
}

std::optional<restore_item> undo(host_fs& fs, task_ops& /*tasks*/, const rec::file& r) {
    return put_back(fs, r.path, r.original, [](const std::string& /*cur*/) { return std::optional<restore_item>(); });
}

std::optional<restore_item> undo(host_fs& fs, task_ops& /*tasks*/, const rec::ctl& r) {
    restore_item it{outcome::restored, r.path, ""};
    auto cur = fs.read(r.path);
    if (!cur) {
        it.result = cur.err().code == ENOENT ? outcome::gone : outcome::failed;
        it.detail = cur.err().message;
        return it;
    }
    if (!has_word(*cur, r.controller)) {
        it.result = outcome::unchanged;
        it.detail = r.controller + " already disabled";
        return it;
    }
    if (auto st = fs.write(r.path, "-" + r.controller); !st) {
        it.result = outcome::failed;
        it.detail = st.err().message;
        return it;
    }
    it.detail = "disabled the " + r.controller + " controller qrtd had enabled";
    return it;
}

std::optional<restore_item> undo(host_fs& fs, task_ops& tasks, const rec::mkcg& r) {
    restore_item it{outcome::restored, r.dir, ""};
    if (!fs.is_dir(r.dir)) {
        it.result = outcome::gone;
        it.detail = "already removed";
        return it;
    }
    std::size_t moved = 0;
    std::size_t stuck = 0;
    std::string stuck_reason;
    int tries = 0;
    status removed = ok();
    while (true) {
        stuck = 0;
        if (auto members = tasks.cgroup_tasks(fs, r.dir)) {
            for (pid_t tid : *members) {
                auto st = tasks.attach(fs, r.parent, tid);
                if (st) {
                    ++moved;
                } else if (st.err().code != ESRCH) {
                    ++stuck;
                    stuck_reason = st.err().message;
                }
            }
        }
        removed = tasks.remove_cgroup(fs, r.dir);
        // Tasks that just left (or were forked inside while we moved) keep
        // the cgroup busy for a moment.
        if (removed || removed.err().code != EBUSY || fs.dry_run() || ++tries >= rmdir_busy_tries) {
            break;
        }
        std::this_thread::sleep_for(rmdir_busy_pause);
    }
    if (!removed) {
        it.result = outcome::failed;
        it.detail = removed.err().message;
        if (tries > 0) {
            it.detail += " (still busy after " + std::to_string(tries) + " tries over " +
                         std::to_string(tries * rmdir_busy_pause.count()) + " ms)";
        }
        if (stuck > 0) {
            it.detail += " (" + std::to_string(stuck) + " tasks could not be moved out: " + stuck_reason + ")";
        }
        return it;
    }
    it.detail = "removed";
    if (moved > 0) {
        it.detail += " after moving " + std::to_string(moved) + " remaining tasks to " + r.parent;
    }
    if (tries > 0) {
        it.detail += " (busy for " + std::to_string(tries * rmdir_busy_pause.count()) + " ms first)";
    }
    return it;
}

std::optional<restore_item> undo(host_fs& fs, task_ops& tasks, const rec::cg& r) {
    auto [it, gone] = item_for_task(fs, tasks, r.tid, r.start);
    if (gone) {
        return it;
    }
    bool moved = true;
    if (auto st = tasks.attach(fs, r.from, r.tid); !st) {
        if (st.err().code == ESRCH) {
            it.result = outcome::gone;
            it.detail = st.err().message;
            return it;
        }
        // A kernel thread that refused to move never left; anything else failed.
        auto members = tasks.cgroup_tasks(fs, r.from);
        if (!members || std::find(members->begin(), members->end(), r.tid) == members->end()) {
            it.result = outcome::failed;
            it.detail = st.err().message;
            return it;
        }
        moved = false;
    }
    it.detail = moved ? "back in " + r.from : "never left " + r.from;
    if (r.affinity) {
        auto cur = tasks.affinity(r.tid);
        if (cur && *cur == *r.affinity) {
            if (!moved) {
                it.result = outcome::unchanged;
            }
            return it;
        }
        if (fs.dry_run()) {
            it.detail += ", would set affinity " + r.affinity->to_list();
            return it;
        }
        if (auto st = tasks.set_affinity(r.tid, *r.affinity); !st) {
            it.result = st.err().code == ESRCH ? outcome::gone : outcome::failed;
            it.detail += "; " + st.err().message;
            return it;
        }
        it.detail += ", affinity " + r.affinity->to_list();
    }
    return it;
}

std::optional<restore_item> undo(host_fs& fs, task_ops& tasks, const rec::aff& r) {
    auto [it, gone] = item_for_task(fs, tasks, r.tid, r.start);
    if (gone) {
        return it;
    }
    auto cur = tasks.affinity(r.tid);
    if (!cur) {
        it.result = cur.err().code == ESRCH ? outcome::gone : outcome::failed;
        it.detail = cur.err().message;
        return it;
    }
    if (*cur == r.original) {
        it.result = outcome::unchanged;
        it.detail = "affinity already " + r.original.to_list();
        return it;
    }
    if (!(*cur == r.set)) {
        it.result = outcome::skipped;
        it.detail = "affinity changed by someone else since (now " + cur->to_list() + "); left as is";
        return it;
    }
    if (fs.dry_run()) {
        it.detail = "would set affinity " + r.set.to_list() + " -> " + r.original.to_list();
        return it;
    }
    if (auto st = tasks.set_affinity(r.tid, r.original); !st) {
        // A kernel thread the kernel has bound since apply moved it (seen on
        // Debian's 6.1: the writeback workqueue's rescuer once its
        // workqueue's cpumask changed) refuses with EINVAL.  Its affinity is
        // the kernel's now, and follows the workqueue cpumask restored from
        // its own record: left, and said so, not a failed restore.
        if (st.err().code == EINVAL) {
            if (auto now = tasks.task(fs, r.tid); now && now->kernel_thread && now->per_cpu) {
                it.result = outcome::skipped;
                it.detail = "the kernel has bound this kernel thread since (PF_NO_SETAFFINITY, now " +
                            cur->to_list() + "); its affinity is the kernel's; left as is";
                return it;
            }
        }
        it.result = st.err().code == ESRCH ? outcome::gone : outcome::failed;
        it.detail = st.err().message;
        return it;
    }
    it.detail = "affinity " + r.set.to_list() + " -> " + r.original.to_list();
    return it;
}

// ------------------------------------------------------------ the walk

// The paths a record makes restore write to (or under).
std::vector<std::string_view> paths_of(const journal_record& r) {
    if (const auto* f = std::get_if<rec::file>(&r)) {
        return {f->path};
    }
    if (const auto* c = std::get_if<rec::ctl>(&r)) {
        return {c->path};
    }
    if (const auto* m = std::get_if<rec::mkcg>(&r)) {
        return {m->dir, m->parent};
    }
    if (const auto* g = std::get_if<rec::cg>(&r)) {
        return {g->from};
    }
    if (const auto* k = std::get_if<rec::knob>(&r)) {
        return {k->path};
    }
    return {};
}

// Every record of the range on the list, and no symlink on the way to any
// path it names: checked for all before the first write.
status check_all(const host_fs& fs, const std::vector<journal_record>& recs, std::size_t from,
                 const restore_allow_list& allow, const std::string& path,
                 const std::vector<std::size_t>* lines) {
    for (std::size_t i = from; i < recs.size(); ++i) {
        const std::string where =
            path + (lines != nullptr && i < lines->size() ? " line " + std::to_string((*lines)[i]) : "");
        if (auto st = allow.check(recs[i]); !st) {
            return error{st.err().code, where + ": record `" + describe(recs[i]) + "`: " + st.err().message +
                                            "; the whole journal is refused and nothing was written"};
        }
        for (auto p : paths_of(recs[i])) {
            if (auto st = fs.check_no_symlinks(p); !st) {
                return error{st.err().code, where + ": record `" + describe(recs[i]) + "`: " + st.err().message +
                                                "; the whole journal is refused and nothing was written"};
            }
        }
    }
    return ok();
}

restore_outcome undo_range(host_fs& fs, task_ops& tasks, const std::vector<journal_record>& recs,
                           std::size_t from) {
    restore_outcome out;
    for (std::size_t i = recs.size(); i-- > from;) {
        auto item = std::visit([&](const auto& r) { return undo(fs, tasks, r); }, recs[i]);
        if (!item) {
            continue;
        }
        if (item->result == outcome::failed) {
            out.complete = false;
        }
        out.items.push_back(std::move(*item));
    }
    return out;
}

}  // namespace

std::string restore_item::line() const {
    static constexpr const char* names[] = {"restored", "unchanged", "gone", "skipped", "FAILED"};
    return std::string(names[static_cast<int>(result)]) + " " + what + ": " + detail;
}

restore_outcome unwind_since(host_fs& fs, task_ops& tasks, const restore_journal& journal, std::size_t from) {
    if (auto st = check_all(fs, journal.records(), from, journal.allow(), journal.path().string(), nullptr); !st) {
        restore_outcome out;
        out.complete = false;
        out.problems.push_back(st.err().message);
        return out;
    }
    return undo_range(fs, tasks, journal.records(), from);
}

result<restore_outcome> restore_from_journal(host_fs& fs, task_ops& tasks, const journal_dir& dir,
                                             const restore_allow_list& allow) {
    if (!fs.dry_run() && !dir.locked()) {
        return error::invalid("restore from " + dir.path().string() + ": " + journal_dir::lock_name +
                              " is not held");
    }
    const std::string path = (dir.path() / restore_journal::file_name).string();
    auto loaded = restore_journal::load(fs, dir, allow);
    if (!loaded) {
        return loaded.err();
    }
    restore_outcome out;
    if (!loaded->found) {
        return out;  // nothing applied: nothing to restore
    }
    out.journal_found = true;
    if (auto then_boot = journal_other_boot(fs, loaded->records)) {
        out.other_boot = true;
        out.problems.push_back("journal was written in boot " + *then_boot + ", this is boot " +
                               current_boot_id(fs) + ": the reboot already reset every runtime value; nothing restored");
    } else {
        if (auto st = check_all(fs, loaded->records, 0, allow, path, &loaded->lines); !st) {
            return st.err();
        }
        auto undone = undo_range(fs, tasks, loaded->records, 0);
        out.items = std::move(undone.items);
        out.complete = undone.complete;
    }
    out.problems.insert(out.problems.end(), loaded->problems.begin(), loaded->problems.end());
    if (!loaded->problems.empty()) {
        out.complete = false;
    }
    if (out.complete && !fs.dry_run()) {
        if (auto st = dir.dir().remove_file(restore_journal::file_name); !st) {
            out.problems.push_back(st.err().message);
        } else {
            out.journal_removed = true;
        }
    }
    return out;
}

}  // namespace rtcore
