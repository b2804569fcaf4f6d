// The runtime knobs of tuned's cpu-partitioning profile: see host_knobs.hpp.

#include "rtcore/host_knobs.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <set>
#include <utility>

#include "rtcore/irq.hpp"
#include "rtcore/task_move.hpp"
#include "rtcore/text.hpp"

namespace rtcore {

namespace {

using namespace knob_path;

constexpr std::size_t max_names = 16;

// One knob file to set: what it is, where, the value isolation wants.
struct instance {
    std::string name;
    std::string path;
    knob_form form = knob_form::integer;
    std::string want;
    std::string why;
    bool report_only = false;
    std::string meaning;  // for reported values: what the value read means
};

std::string rt_meaning(std::string_view value, const host_fs& fs) {
    long long v = 0;
    const auto t = trim(value);
    if (std::from_chars(t.data(), t.data() + t.size(), v).ec != std::errc{}) {
        return "";
    }
    if (v < 0) {
        return "no RT throttling: a SCHED_FIFO thread may use its CPU fully";
    }
    long long period = 1000000;
    if (auto p = fs.read_line("/proc/sys/kernel/sched_rt_period_us")) {
        (void)std::from_chars(p->data(), p->data() + p->size(), period);
    }
    return "RT tasks may run " + std::to_string(v) + " us of every " + std::to_string(period) +
           " us; host.disable_rt_throttling = true sets -1";
}

std::vector<instance> instances(const host_fs& fs, const cpu_set& isolated, const cpu_set& housekeeping,
                                const knob_options& o, knob_report& rep) {
    std::vector<instance> out;
    const std::string mask = housekeeping.to_mask(cpumask_bits(fs));
    if (o.workqueues) {
        out.push_back({"workqueue cpumask", std::string(wq_global), knob_form::cpumask, mask,
                       "unbound kworkers (kworker/uN:M) run on housekeeping CPUs only", false, ""});
        if (auto ents = fs.list(wq_dir)) {
            for (const auto& e : *ents) {
                const std::string f = join_path(join_path(wq_dir, e), "cpumask");
                if (workqueue_name(e) && fs.is_dir(join_path(wq_dir, e)) && fs.exists(f)) {
                    out.push_back({"workqueue " + e + " cpumask", f, knob_form::cpumask, mask,
                                   "its unbound workers run on housekeeping CPUs only", false, ""});
                }
            }
        }
    } else {
        rep.off.emplace_back("workqueues");
    }
    if (o.vm_stat_interval) {
        out.push_back({"vm.stat_interval", std::string(stat_interval), knob_form::integer, "10",
                       "the per-CPU vmstat_update work wakes the isolated CPUs every 10 s, not every second",
                       false, ""});
    } else {
        rep.off.emplace_back("vm_stat_interval");
    }
    if (o.timer_migration) {
        out.push_back({"kernel.timer_migration", std::string(timer_migration), knob_form::integer, "0",
                       "timers stay on the CPU that armed them: idle CPUs no longer send theirs to a busy "
                       "isolated CPU",
                       false, ""});
    } else {
        rep.off.emplace_back("timer_migration");
    }
    if (o.watchdog_cpumask) {
        out.push_back({"kernel.watchdog_cpumask", std::string(watchdog_cpumask), knob_form::cpulist,
                       housekeeping.to_list(),
                       "the lockup watchdog's timer, stopper work and NMI stay off the isolated CPUs; it "
                       "keeps watching the others",
                       false, ""});
    } else {
        rep.off.emplace_back("watchdog_cpumask");
    }
    if (o.mce_ignore_ce) {
        if (auto ents = fs.list(mce_dir)) {
            for (const auto& e : *ents) {
                if (e.rfind("machinecheck", 0) == 0 && decimal_id(std::string_view(e).substr(12))) {
                    out.push_back({e + " ignore_ce", join_path(join_path(mce_dir, e), "ignore_ce"), knob_form::integer,
                                   "1",
                                   "no corrected-error poll timer (every 5 min); corrected errors go unreported",
                                   false, ""});
                }
            }
        } else {
            out.push_back({"machinecheck ignore_ce", join_path(mce_dir, "machinecheck0/ignore_ce"), knob_form::integer,
                           "1", "", false, ""});
        }
    } else {
        rep.off.emplace_back("mce_ignore_ce");
    }
    // RT throttling: always shown; changed only when asked.
    const bool off = o.rt_throttling_off;
    out.push_back({"kernel.sched_rt_runtime_us", std::string(rt_runtime), knob_form::integer, "-1",
                   "no RT throttling: the dispatch thread is never paused for normal tasks", !off, ""});
    if (fs.is_dir(fair_server_dir)) {
        for (unsigned cpu : isolated.cpus()) {
            out.push_back({"fair server cpu" + std::to_string(cpu) + " runtime",
                           join_path(join_path(fair_server_dir, "cpu" + std::to_string(cpu)), "runtime"),
                           knob_form::integer, "0", "the fair server no longer preempts the dispatch thread for normal tasks", !off,
                           "ns of every period reserved for normal tasks; host.disable_rt_throttling = true "
                           "sets 0"});
        }
    } else {
        out.push_back({"fair server runtime", join_path(fair_server_dir, "cpuN/runtime"), knob_form::integer, "0", "",
                       !off, ""});
    }
    return out;
}

bool is_fair_server_placeholder(const instance& k) { return k.path.find("/cpuN/") != std::string::npos; }

status append_batch(restore_journal& journal, std::vector<journal_record>& recs) {
    if (recs.empty()) {
        return ok();
    }
    auto st = journal.append(recs);
    recs.clear();
    return st;
}

std::string name_of(const task_info& t) { return t.comm + " (" + std::to_string(t.tid) + ")"; }

void add_name(std::vector<std::string>& names, const task_info& t) {
    if (names.size() < max_names) {
        names.push_back(name_of(t));
    }
}

std::string names_line(const std::vector<std::string>& names, std::size_t total) {
    std::string s;
    for (const auto& n : names) {
        s += (s.empty() ? "" : ", ") + n;
    }
    if (total > names.size()) {
        s += ", and " + std::to_string(total - names.size()) + " more";
    }
    return s;
}

// Kernel threads on the isolated CPUs: movable ones to housekeeping
// (journaled as aff), per-CPU ones recorded (nomove) and never retried.
status move_kthreads(host_fs& fs, task_ops& tasks, restore_journal& journal, const cpu_set& isolated,
                     const cpu_set& housekeeping, knob_pass pass, kthread_outcome& out) {
    std::set<std::pair<pid_t, std::uint64_t>> fixed;
    for (const auto& r : journal.records()) {
        if (const auto* n = std::get_if<rec::nomove>(&r)) {
            fixed.emplace(n->tid, n->start);
        }
    }
    auto all = tasks.list_tasks(fs);
    if (!all) {
        return all.err();
    }
    std::vector<affinity_move> todo;
    std::vector<journal_record> recs;
    for (const auto& t : *all) {
        if (!t.kernel_thread) {
            continue;
        }
        auto aff = tasks.affinity(t.tid);
        if (!aff) {
            ++out.gone;
            continue;
        }
        if (!aff->intersects(isolated)) {
            continue;
        }
        if (fixed.count({t.tid, t.start_ticks}) != 0) {
            ++out.not_movable;
            add_name(out.not_movable_names, t);
            continue;
        }
        if (t.per_cpu) {
            // Bound by the kernel: recorded once at apply; at verify only
            // counted (bound kworkers come and go: the journal stays small).
            ++out.not_movable;
            add_name(out.not_movable_names, t);
            if (pass == knob_pass::apply) {
                recs.emplace_back(rec::nomove{t.tid, t.start_ticks});
            }
            continue;
        }
        todo.push_back(plan_move_off(journal, t, *aff, isolated, housekeeping, recs));
    }
    if (auto st = append_batch(journal, recs); !st) {
        return st;
    }
    for (const auto& c : todo) {
        error why;
        switch (make_move(fs, tasks, c, why)) {
            case move_outcome::moved:
                ++out.moved;
                add_name(out.moved_names, c.task);
                break;
            case move_outcome::gone:
                ++out.gone;
                break;
            case move_outcome::refused:
                // The kernel fixed it although its flags did not say so: never again.
                ++out.not_movable;
                add_name(out.not_movable_names, c.task);
                recs.emplace_back(rec::nomove{c.task.tid, c.task.start_ticks});
                break;
            case move_outcome::failed:
                ++out.failed;
                if (out.failure.empty()) {
                    out.failure = why.message + " (" + name_of(c.task) + ")";
                }
                break;
        }
    }
    return append_batch(journal, recs);
}

}  // namespace

const char* to_string(knob_outcome::action a) {
    switch (a) {
        case knob_outcome::action::set: return "set";
        case knob_outcome::action::already: return "already";
        case knob_outcome::action::absent: return "absent";
        case knob_outcome::action::failed: return "failed";
        case knob_outcome::action::reported: return "reported";
        case knob_outcome::action::reset: return "reset";
    }
    return "?";
}

std::string knob_outcome::line() const {
    using a = action;
    std::string s = "knob: " + name + ": ";
    switch (act) {
        case a::set: s += before + " -> " + after + " (" + path + ")" + (why.empty() ? "" : ": " + why); break;
        case a::already: s += "already " + before + " (" + path + ")"; break;
        case a::absent: s += "absent (" + path + ")" + (detail.empty() ? "" : ": " + detail) + "; skipped"; break;
        case a::failed: s += "FAILED (" + path + "): " + detail + "; left at " + before; break;
        case a::reported: s += before + " (" + path + ")" + (detail.empty() ? "" : ": " + detail); break;
        case a::reset: s += "DRIFT: read " + before + ", qrtd had set it: " + after + " again (" + path + ")"; break;
    }
    return s;
}

std::size_t knob_report::count(knob_outcome::action a) const {
    return static_cast<std::size_t>(
        std::count_if(knobs.begin(), knobs.end(), [a](const knob_outcome& k) { return k.act == a; }));
}

result<knob_report> apply_knobs(host_fs& fs, task_ops& tasks, restore_journal& journal, const cpu_set& isolated,
                                const cpu_set& housekeeping, const knob_options& opts, knob_pass pass) {
    knob_report rep;
    // Paths whose original is journaled already: the first one is kept.
    std::set<std::string, std::less<>> recorded;
    for (const auto& r : journal.records()) {
        if (const auto* k = std::get_if<rec::knob>(&r)) {
            recorded.insert(k->path);
        }
    }
    using a = knob_outcome::action;
    for (auto& k : instances(fs, isolated, housekeeping, opts, rep)) {
        knob_outcome o{k.name, k.path, a::set, "", "", "", k.why};
        if (is_fair_server_placeholder(k)) {
            o.act = a::absent;
            o.detail = std::string(fair_server_dir) +
                       " is not there (a kernel before 6.12 has no fair server; on a newer one debugfs is not "
                       "mounted: mount -t debugfs none /sys/kernel/debug to see it)";
            rep.knobs.push_back(std::move(o));
            continue;
        }
        auto cur = fs.read(k.path);
        if (!cur) {
            if (cur.err().code == ENOENT) {
                o.act = a::absent;
                o.detail = "the kernel has no such file";
            } else {
                o.act = a::failed;
                o.detail = cur.err().message;
                o.before = "(unread)";
            }
            rep.knobs.push_back(std::move(o));
            continue;
        }
        o.before = one_line(*cur);
        if (k.report_only) {
            o.act = a::reported;
            o.after = o.before;
            o.detail = k.path == rt_runtime ? rt_meaning(*cur, fs) : k.meaning;
            rep.knobs.push_back(std::move(o));
            continue;
        }
        const auto known = recorded.find(k.path);
        if (same_knob_value(k.form, *cur, k.want)) {
            o.act = a::already;
            o.after = o.before;
            rep.knobs.push_back(std::move(o));
            continue;
        }
        if (known == recorded.end()) {
            if (auto st = journal.append(rec::knob{k.path, *cur, k.want}); !st) {
                return error{st.err().code, "knob " + k.name + ": journaling " + k.path + ": " + st.err().message};
            }
        }
        if (auto st = fs.write(k.path, k.want); !st) {
            o.act = a::failed;
            o.detail = st.err().message;
            rep.knobs.push_back(std::move(o));
            continue;
        }
        if (fs.dry_run()) {
            o.after = k.want;
        } else if (auto back = fs.read(k.path)) {
            o.after = one_line(*back);
        } else {
            o.after = "(unread: " + back.err().message + ")";
        }
        if (known != recorded.end() || pass == knob_pass::verify) {
            rep.drift = true;
        }
        if (known != recorded.end()) {
            o.act = a::reset;
        }
        rep.knobs.push_back(std::move(o));
    }
    for (const auto& o : rep.knobs) {
        rep.lines.push_back(o.line());
    }
    if (!rep.off.empty()) {
        std::string s;
        for (const auto& n : rep.off) {
            s += (s.empty() ? "" : ", ") + n;
        }
        rep.lines.push_back("knob: not in host.runtime_knobs, left alone: " + s);
    }

    rep.enabled_kthreads = opts.kthreads;
    if (opts.kthreads) {
        auto& kt = rep.kthreads;
        if (auto st = move_kthreads(fs, tasks, journal, isolated, housekeeping, pass, kt); !st) {
            return error{st.err().code, "knob kthreads: " + st.err().message};
        }
        if (pass == knob_pass::verify && kt.moved > 0) {
            rep.drift = true;
        }
        std::string l = "knob: kthreads: " + std::string(fs.dry_run() ? "would move " : "moved ") +
                        std::to_string(kt.moved) + " kernel threads off CPUs " + isolated.to_list() + " to " +
                        housekeeping.to_list();
        if (kt.moved > 0) {
            l += " (" + names_line(kt.moved_names, kt.moved) + ")";
        }
        rep.lines.push_back(l);
        if (kt.not_movable > 0) {
            rep.lines.push_back("knob: kthreads: " + std::to_string(kt.not_movable) +
                                " per-CPU kernel threads on CPUs " + isolated.to_list() +
                                " are bound by the kernel, recorded and never retried (" +
                                names_line(kt.not_movable_names, kt.not_movable) +
                                "); unbound kworkers among them follow the workqueue cpumask");
        }
        if (kt.failed > 0) {
            rep.lines.push_back("knob: kthreads: " + std::to_string(kt.failed) + " could not be moved (first: " +
                                kt.failure + ")");
        }
    } else {
        rep.lines.push_back("knob: kthreads: not in host.runtime_knobs, left alone");
    }
    return rep;
}

}  // namespace rtcore
