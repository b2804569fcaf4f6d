#pragma once
// The ledger's durability tracker: what of the ledger's changes is on disk.
//
// Owns:
//   - the SQLite store (store.hpp), until start_writer() hands it to
//   - the commit writer (commit_writer.hpp), the group commit's thread;
//   - the sequence numbers: latest_seq() (the last one given to a change)
//     and durable_seq() (the last one resolved on disk: committed, or
//     failed and undone);
//   - the in-flight changes (queued to the writer, in order, each with its
//     reservations, its events and the jobs it committed) and the undurable
//     set (id -> seq of its last change not yet durable, change_seq_of):
//     the group commit's own record, before a job is planned at all.  It
//     tracks changes to rows, not jobs on their way to a QPU, so it is not
//     in the hand-over table (qrt/handover/handover_table.hpp);
//   - the dispatch mark (ledger::dispatch_mark_ns): the durable one, the
//     highest asked for, and one to write with the next change;
//   - the commit latency histogram, the recent commit times behind
//     commit_lead_ns(), and the failed commits.
// It knows nothing of placement or reservation states: the ledger builds
// each change_set (the rows an operation changed) and hands it to
// persist(); what the tracker does back to the ledger goes through the
// durability_hooks it was made with.
//
// Threads: the event loop makes every call, and runs the hooks and the
// commit listener.  The writer thread owns the store once started and
// talks to the tracker only by posting on_group_done / the mark's outcome
// to the loop (commit_writer::post_fn); a callback posted after the
// tracker is gone does nothing.
//
// Invariants:
//   - durable_seq() <= latest_seq(); sequences are given in order, one per
//     change that changed a row, and resolved in order;
//   - every in-flight change has a sequence > durable_seq(), in increasing
//     order; change_seq_of(id) != 0 only for an id of an in-flight change,
//     and is the sequence of its last one;
//   - without a writer nothing is in flight: persist() commits before it
//     returns, so durable_seq() == latest_seq() on return;
//   - stopped() (a failed group whose reload failed too: memory may hold
//     changes the disk does not, and nothing tells which): every id those
//     changes touched, and every id changed after, stays in the undurable
//     set for good, so no job of them is ever planned; persist() writes
//     nothing more and refuses; the writer stays parked.  The owner stops
//     (the daemon exits, commit_notice::stopped) and the next start
//     reloads what is on disk.  Fail-stop: a ledger that cannot read its
//     store back cannot tell an acknowledged change from a refused one;
//   - an event is published (hooks.publish) only once the change that made
//     it is durable; a failed group publishes none of its events.

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "qrt/timeline/commit_writer.hpp"
#include "qrt/timeline/store.hpp"
#include "qrt/timeline/types.hpp"
#include "rtcore/histogram.hpp"

namespace qrt::timeline {

// What the commit listener hears, on the loop thread, after each group.
struct commit_notice {
    std::uint64_t durable_seq = 0;  // every change <= this is resolved
    // Changes [failed_from, failed_to] did not happen (the ledger reloaded
    // what is on disk); both 0 when the group committed.
    std::uint64_t failed_from = 0;
    std::uint64_t failed_to = 0;
    std::string why;                // the failure, when failed_to != 0
    std::size_t changes = 0;        // in the group
    std::int64_t commit_ns = 0;     // the group's transaction, fsync included
    // The jobs that became committed (jobs.submit) in the changes this group
    // made durable, by the sequence of that change: what withdraw_late()
    // checks against the time the acknowledgement is about to go out.
    struct durable_job {
        std::uint64_t seq = 0;
        std::uint64_t id = 0;
    };
    std::vector<durable_job> committed;
    // The group failed and so did reloading what is on disk: the ledger
    // stopped (durability::stopped()); the owner must stop too.
    bool stopped = false;
};

struct durability_options {
    std::size_t group_max = 256;                // changes per transaction (<= 1: no writer)
    std::chrono::microseconds group_wait{0};
    std::function<status(std::size_t changes)> commit_hook;  // writer_options::before_commit
    std::function<status()> reload_hook;                      // writer_options::before_reload
};

// What the tracker does to its owner, on the loop thread.
struct durability_hooks {
    // Events of changes now durable (or of an operation that changed no
    // row, once what is in flight before it is durable), in order.
    std::function<void(std::vector<event>& evs)> publish;
    // Changes up to seq are durable, or the durable dispatch mark moved.
    std::function<void(std::uint64_t durable_seq)> durable;
    // Changes failed to commit: drop the operation's unpublished state and,
    // when disk is given, make memory again what the store holds.
    std::function<void(stored_state* disk)> undo;
    // After a failed group, once its sequences are resolved: the owner's
    // transitions that must not be lost are applied again (new changes).
    std::function<void()> redo;
};

class durability {
public:
    durability(durability_options opts, durability_hooks hooks);
    // Stops the writer (it commits what is queued, then joins); the
    // dispatch mark is left, as after a crash.
    ~durability();
    durability(const durability&) = delete;
    durability& operator=(const durability&) = delete;

    // Before start_writer: the store the changes go to (none: in memory,
    // persist() then records nothing).
    void attach(std::unique_ptr<store> st) { _store = std::move(st); }
    bool has_store() const noexcept { return _store != nullptr || _writer != nullptr; }
    bool has_writer() const noexcept { return _writer != nullptr; }
    // Load the attached store (before start_writer); adopts its dispatch mark.
    result<stored_state> load();
    // A clean stop: commits what is queued, stops the writer and resets
    // the dispatch mark.  Nothing may be persisted afterwards.
    void close();
    // Hand the store to a writer thread (no-op without a store, with one
    // running, or with group_max <= 1).
    void start_writer(commit_writer::post_fn post);
    void set_listener(std::function<void(const commit_notice&)> fn) { _listener = std::move(fn); }

    // The next sequence number, taken by the change being built.
    std::uint64_t next_seq() noexcept { return ++_latest_seq; }
    // A change's rows (c.seq from next_seq()), the events it made and the
    // jobs it committed.  With a writer: queued, in flight until
    // on_group_done.  Without: committed now; on failure the store is
    // rolled back, hooks.undo reloads memory, and the error is returned.
    status persist(change_set c, std::vector<event>& events, std::vector<std::uint64_t>& commits);
    // An operation that changed no row: its events follow what is in
    // flight, or are published now.
    void follow(std::vector<event>& events);

    std::uint64_t latest_seq() const noexcept { return _latest_seq; }
    std::uint64_t durable_seq() const noexcept { return _durable_seq; }
    std::uint64_t change_seq_of(std::uint64_t id) const;
    bool all_durable() const noexcept { return _undurable.empty(); }
    // Why the ledger stopped (empty: it did not): see the invariants above.
    const std::string& stopped() const noexcept { return _stopped; }
    std::size_t backlog() const { return _writer ? _writer->queued() : 0; }
    std::int64_t commit_lead_ns() const;
    const rtcore::histogram& commit_latency() const noexcept { return _commit_ns; }
    std::uint64_t commits_failed() const noexcept { return _commits_failed; }
    // Truncate the WAL (on the writer thread after its next group).
    status checkpoint();

    // The dispatch mark.  mark_ns(): the durable one (0 without a store).
    std::int64_t mark_ns() const noexcept { return _dispatch_mark_ns; }
    std::int64_t mark_requested_ns() const noexcept { return _mark_requested_ns; }
    // Ask for a later mark: with a writer in a transaction of its own
    // (returns false), without one written with the next change (returns
    // true: the caller persists).
    bool request_mark(std::int64_t to_ns);
    // Write the mark (at least mark_ns) with the next change.
    void mark_with_next(std::int64_t mark_ns);
    bool mark_pending() const noexcept { return _mark_dirty.has_value(); }
    std::optional<std::int64_t> take_mark() { return std::exchange(_mark_dirty, std::nullopt); }
    // Reset the durable mark to 0 now (before start_writer); best effort.
    void reset_mark();

    // Loop thread, after each group (posted by the writer).  Public for
    // tests that drive the tracker without the loop.
    void on_group_done(const group_outcome& g);

private:
    void advance_durable(std::uint64_t seq);
    void on_mark(std::int64_t mark_ns, bool ok);
    void adopt_mark(std::int64_t mark_ns);

    durability_options _opts;
    durability_hooks _hooks;
    std::unique_ptr<store> _store;  // until start_writer
    std::unique_ptr<commit_writer> _writer;
    std::function<void(const commit_notice&)> _listener;
    std::uint64_t _latest_seq = 0;
    std::uint64_t _durable_seq = 0;
    // Changes queued to the writer, in order: their reservations and events.
    struct in_flight {
        std::uint64_t seq = 0;
        std::vector<std::uint64_t> ids;
        std::vector<event> events;
        std::vector<std::uint64_t> commits;  // jobs that became committed
        std::optional<std::int64_t> dispatch_mark;
    };
    std::deque<in_flight> _in_flight;
    // id -> seq of its last change not yet durable (change_seq_of).
    std::unordered_map<std::uint64_t, std::uint64_t> _undurable;
    // The jobs made durable by the group being resolved (to the listener).
    std::vector<commit_notice::durable_job> _durable_commits;
    // The durable dispatch mark, the highest one asked for, and one to
    // write with the next change.
    std::int64_t _dispatch_mark_ns = 0;
    std::int64_t _mark_requested_ns = 0;
    std::optional<std::int64_t> _mark_dirty;
    // The last groups' commit times (commit_lead_ns), a ring.
    std::array<std::int64_t, 8> _recent_commit_ns{};
    std::size_t _recent_commit_next = 0;
    rtcore::histogram _commit_ns;
    std::uint64_t _commits_failed = 0;
    std::string _stopped;  // stopped(): why
    // Shared with the writer's posted callbacks: false once the tracker is gone.
    std::shared_ptr<bool> _alive = std::make_shared<bool>(true);
};

}  // namespace qrt::timeline
