#pragma once
// Group commit: the ledger's writer thread.
//
// Threading (README.md, "Durability: group commit"):
//   event loop   owns the ledger.  A mutating operation changes memory at
//                once (so validation and errors are immediate), gets the
//                next sequence number and queues its rows here as one
//                change_set; the RPC reply is deferred until that sequence
//                is durable.  Reads are answered from memory at once.
//   writer       owns the SQLite connection once started.  It takes what is
//                queued -- at most group_max changes, and when group_wait is
//                set it waits that long for a group to fill -- writes it in
//                ONE transaction with ONE fsync (WAL, synchronous=FULL), and
//                posts the outcome back to the loop ("durable up to seq S",
//                or "group failed").  The loop then sends the deferred
//                replies in order.
//
// Group policy: no group waits for company by default (group_wait 0):
// changes that arrive while a commit's fsync runs form the next group, so
// the group size follows the load by itself -- one change per fsync when
// idle, up to group_max under a burst.  group_wait trades latency for fewer
// fsyncs at a low rate.
//
// A failed group (SQLite error, disk full, a database locked past the busy
// timeout) is rolled back and the writer loads what is on disk, on its own
// thread (the loop never waits for SQLite); it then parks and drops nothing
// until the loop calls recover(), which discards every change still queued
// (they were made on top of the failed ones) and lets the writer go on.  The
// ledger reloads from the state the outcome carries: memory again equals
// what is on disk, and every client whose change was in the failed range
// gets an error.  When that load fails too, the loop never calls recover():
// the writer stays parked and the ledger stops (durability.hpp, fail-stop).
//
// Bounds: queued() counts the changes not yet durable; the ledger refuses
// new client changes past queue_max (backpressure, see ledger.hpp).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "qrt/timeline/store.hpp"
#include "qrt/timeline/types.hpp"

namespace qrt::timeline {

// The rows one ledger operation changed, in the order they must be written.
struct change_set {
    std::uint64_t seq = 0;
    std::vector<reservation> puts;
    std::vector<std::uint64_t> erases;
    struct window_row {
        std::string qpu;
        std::uint64_t calibration_id = 0;
        std::optional<calibration_window> put;  // nullopt: delete the row
    };
    std::vector<window_row> windows;
    std::vector<calibration_block> block_puts;
    std::vector<std::uint64_t> block_erases;
    std::uint64_t next_id = 1;
    std::uint64_t next_gang = 1;
    std::uint64_t next_block = 1;
    std::optional<std::int64_t> dispatch_mark;  // set: write meta dispatch_mark

    std::size_t rows() const noexcept {
        return puts.size() + erases.size() + windows.size() + block_puts.size() + block_erases.size() + 1;
    }
};

// Write one change set into the open transaction of `st`.
status write_change(store& st, const change_set& c);

struct group_outcome {
    std::uint64_t first_seq = 0;
    std::uint64_t last_seq = 0;
    std::size_t changes = 0;
    bool ok = true;
    error failure;              // when !ok
    std::int64_t commit_ns = 0; // BEGIN .. COMMIT (the fsync included)
    // When !ok: what the store holds after the rollback, loaded by the
    // writer thread before it parked.
    std::shared_ptr<result<stored_state>> reloaded;
};

struct writer_options {
    std::size_t group_max = 256;               // changes per transaction
    std::chrono::microseconds group_wait{0};   // wait for a group to fill (0: never)
    // Test seam, called on the writer thread before each COMMIT with the
    // group's size: it may block (a group in flight) or fail the group.
    std::function<status(std::size_t changes)> before_commit;
    // Test seam, called on the writer thread after a failed group, before
    // it loads what is on disk: an error fails that reload.
    std::function<status()> before_reload;
    // Runs on the loop thread after a request_mark() transaction.
    std::function<void(std::int64_t mark_ns, bool ok)> on_mark;
};

class commit_writer {
public:
    // Runs a callback on the loop thread (event_loop::post); safe from any
    // thread.
    using post_fn = std::function<void(std::function<void()>)>;
    // on_done runs on the loop thread, once per group, in commit order.
    commit_writer(std::unique_ptr<store> st, writer_options opts, post_fn post,
                  std::function<void(const group_outcome&)> on_done);
    // Commits what is still queued (unless parked after a failure), then
    // joins the thread.  Outcomes not yet run on the loop are dropped.
    ~commit_writer();
    commit_writer(const commit_writer&) = delete;
    commit_writer& operator=(const commit_writer&) = delete;

    void enqueue(change_set c);
    // Changes queued or in the transaction under way.
    std::size_t queued() const;
    // Truncate the WAL after the next group (or now, when idle).
    void request_checkpoint();
    // Raise meta dispatch_mark to mark_ns in a transaction of its own,
    // ahead of the changes queued (it waits only for the group under way):
    // the hand-over waits for it, and must not wait behind a backlog of
    // client changes.  writer_options::on_mark says when it is durable.
    void request_mark(std::int64_t mark_ns);

    // Loop thread, after a failed group's outcome: drop every queued change
    // (last_dropped: the highest seq dropped, 0 if none) and let the writer
    // go on.  The store was already reloaded (group_outcome::reloaded).
    struct recovered {
        std::uint64_t last_dropped = 0;
    };
    recovered recover();
    // Commits what is queued (unless parked), joins the thread and hands the
    // store back (nullptr when parked after a failure: what the store holds
    // is then not what the ledger holds).
    std::unique_ptr<store> stop();

    const std::string& path() const noexcept { return _path; }
    std::uint64_t groups() const noexcept { return _groups.load(std::memory_order_relaxed); }

private:
    void run();

    std::unique_ptr<store> _store;
    writer_options _opts;
    post_fn _post;
    std::function<void(const group_outcome&)> _on_done;
    std::string _path;

    mutable std::mutex _mu;
    std::condition_variable _cv;
    std::deque<change_set> _queue;  // guarded by _mu
    std::size_t _in_transaction = 0; // guarded by _mu
    bool _parked = false;            // after a failure, until recover()
    bool _stopping = false;
    bool _checkpoint = false;
    std::optional<std::int64_t> _mark;  // guarded by _mu: request_mark
    std::atomic<std::uint64_t> _groups{0};  // groups committed
    // Shared with posted callbacks: false once the writer is gone.
    std::shared_ptr<bool> _alive = std::make_shared<bool>(true);
    std::thread _thread;
};

}  // namespace qrt::timeline
