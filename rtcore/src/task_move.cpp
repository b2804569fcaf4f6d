// Moving a task off the isolated CPUs: see task_move.hpp.

#include "rtcore/task_move.hpp"

#include <cerrno>

#include "rtcore/restore_journal.hpp"

namespace rtcore {

affinity_move plan_move_off(const restore_journal& journal, const task_info& t, const cpu_set& from,
                            const cpu_set& isolated, const cpu_set& housekeeping, std::vector<journal_record>& recs) {
    cpu_set to = from - isolated;
    if (to.empty()) {
        to = housekeeping;
    }
    if (!journal.has_task(t.tid, t.start_ticks)) {
        recs.emplace_back(rec::aff{t.tid, t.start_ticks, from, to});
    }
    return affinity_move{t, from, to};
}

move_outcome make_move(const host_fs& fs, task_ops& tasks, const affinity_move& m, error& why) {
    if (fs.dry_run()) {
        return move_outcome::moved;
    }
    auto st = tasks.set_affinity(m.task.tid, m.to);
    if (st) {
        return move_outcome::moved;
    }
    why = st.err();
    if (why.code == ESRCH) {
        return move_outcome::gone;
    }
    if (why.code == EINVAL) {
        return move_outcome::refused;
    }
    return move_outcome::failed;
}

}  // namespace rtcore
