#pragma once
// The QPU timeline ledger: calibration windows, reservations and jobs of every
// QPU of the host, placed by one policy and kept durable by an optional store.
//
// Single-threaded: the daemon's housekeeping event loop owns it.  No clock is
// read here: every operation that depends on time takes now_ns.
//
// Reservation states:
//
//   held --commit--> committed --mark_dispatched--> dispatched --> completed
//     |                 |                                   +---> failed
//     |                 |                                   \---> sent (write-only
//     |                 |                                          endpoint: no result)
//     |                 +--cancel--> cancelled
//     |                 +--mark_missed--> missed   (start passed undispatched)
//     |                 +--> displaced  (preemption / calibration change, no
//     |                                  other slot, or policy "fail")
//     +--expire_leases--> expired
//     +--release--> released
//     +--> displaced (as for committed)
//
// A re-placed reservation keeps its id, state and fencing token; only its
// start and calibration_id change, and a "replaced" event says why.
//
// Gangs: reserve_gang places k reservations with one start on k QPUs, all or
// nothing.  They share a gang_id and a fencing token; heartbeat, release,
// commit and cancel on any member apply to every member, and a gang is moved
// or displaced as one until the dispatcher takes its members, which then go
// on per QPU (dispatched, completed, failed, missed).
//
// Every operation either succeeds or returns an error with a stable reason
// and leaves the ledger unchanged (periodic windows are still generated as
// time passes).  With a store, every change gets the next sequence number
// (latest_seq()) and is durable once durable_seq() reaches it (the ledger's
// durability tracker, durability.hpp, keeps that record: the store, the
// writer, the sequences, the changes in flight and the undurable set):
//   - without a writer (tests, benches, commit_group_max = 1): the change is
//     committed to SQLite before the call returns, so durable_seq() ==
//     latest_seq() on return and the caller may acknowledge on success;
//   - with start_writer() (the daemon): the change is in memory at once and
//     queued to the writer thread, which commits groups of changes with one
//     fsync each (commit_writer.hpp).  The caller acknowledges once
//     durable_seq() reached the change's sequence (the commit listener says
//     when).  Events and due_jobs() show only durable changes; reads
//     (query, status, calibration) see every change at once.  A group that
//     fails to commit is undone: the ledger reloads what is on disk and the
//     listener names the sequences that failed; the agent's own transitions
//     among them (mark_dispatched, complete, fail, mark_sent, miss) record
//     what happened on the wire and are applied again.  A job whose commit
//     became durable too late for its start is taken back before its
//     acknowledgement goes out (withdraw_late), and placement counts the
//     commit backlog (commit_lead_ns): an acknowledged job is dispatchable.
//
// Use from the daemon (housekeeping loop):
//
//   auto l = ledger::open(specs, opts, state_dir + "/ledger.db", now_ns);
//   // RPC:        l->reserve(tenant, req, key, lease_ns, now_ns) ...
//   // every tick: l->expire_leases(now); l->mark_missed(now, tolerance_ns);
//   //             for each QPU: l->due_jobs(qpu, now + lookahead_ns) -> dispatcher ring
//   //             l->drain_events() -> subscribers
//   //             now and then: l->forget_terminal(now - retention_ns)
//   // dispatcher: l->mark_dispatched(id, sent_ns); l->complete(id, blob, now) / l->fail(...)

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "qrt/timeline/booked_time.hpp"
#include "qrt/timeline/commit_writer.hpp"
#include "qrt/timeline/durability.hpp"
#include "qrt/timeline/gap_index.hpp"
#include "qrt/timeline/policy.hpp"
#include "qrt/timeline/store.hpp"
#include "qrt/timeline/types.hpp"
#include "rtcore/histogram.hpp"

namespace qrt::timeline {

enum class on_calibration_change : std::uint8_t { replace, fail };
// What a held reservation that was asked to yield to a calibration block,
// and did not, comes to at the deadline: never revoked (the block fails),
// or revoked when the block's urgency is above its priority.
enum class calibration_preempt : std::uint8_t { never, held };

struct ledger_options {
    std::string policy = "edf-backfill";
    on_calibration_change calibration_change = on_calibration_change::replace;
    std::int64_t default_lease_ns = 30'000'000'000;          // 30 s
    std::int64_t max_lease_ns = 3'600'000'000'000;           // 1 h
    std::int64_t horizon_ns = 7LL * 24 * 3'600'000'000'000;  // periodic windows ahead of now
    std::size_t max_gang_search_steps = 100'000;
    int store_busy_timeout_ms = 2000;  // wait for a locked database before failing
    // Least time between now and any start the ledger offers or accepts
    // (slots.query, slots.reserve, jobs.submit, re-placement): the time the
    // daemon needs to hand a job to its dispatch thread (services.cpp,
    // handover_timing).  Placement is at max(now + min_lead_ns, not_before).
    std::int64_t min_lead_ns = 0;
    // Calibration windows one QPU holds, in memory and in the store: at most
    // max_windows that end after now (a periodic source generates no further
    // ahead, so its reach is min(horizon_ns, max_windows * period_ns); a
    // pushed update with more is refused), and at most 2 * max_windows in
    // all: past that the oldest ended windows are dropped.  Windows that
    // ended before forget_terminal's cutoff go too.  A window that still
    // holds a live (held, committed, dispatched) reservation is kept.
    std::size_t max_windows = 100'000;
    // Group commit (start_writer): changes per transaction, how long a group
    // may wait to fill, and the changes that may wait for their commit before
    // client changes are refused (accepting_changes()).
    std::size_t commit_group_max = 256;
    std::chrono::microseconds commit_group_wait{0};
    std::size_t commit_queue_max = 4096;
    // A job committed with a start less than this (plus the commit lead)
    // ahead carries the dispatch mark in its own change, so that its
    // hand-over never waits for a separate mark write (the daemon: the
    // hand-over plan horizon).  0: never.
    std::int64_t dispatch_mark_reach_ns = 0;
    // While a QPU's endpoint is not connected (set_endpoint_state), no start
    // on it earlier than now + this is offered, and a reserve, submit or
    // commit asking for one is refused with endpoint_down: a job
    // acknowledged there could not be dispatched.  Further ahead is
    // accepted.  0: endpoint state is ignored.
    std::int64_t endpoint_down_horizon_ns = 30'000'000'000;
    // Calibration blocks (request_block): how long a holder asked to yield
    // has (at most until the block's start), what happens to one that does
    // not (calibration_preempt), and the live blocks one QPU holds (as many
    // again that ended are kept, the oldest dropped first).
    timeline::calibration_preempt calibration_preempt = timeline::calibration_preempt::never;
    std::int64_t calibration_yield_ns = 10'000'000'000;
    std::size_t max_calibration_blocks = 16;
    // Test seams for the writer (commit_writer.hpp, writer_options):
    // before each COMMIT, and before the reload after a failed group.
    std::function<status(std::size_t changes)> commit_hook;
    std::function<status()> reload_hook;
    // Test seam: where fencing tokens come from (empty: getrandom).  The
    // ledger keeps a drawn value's low 63 bits and draws again for 0 or a
    // token a record still holds (draw_token).
    std::function<std::uint64_t()> token_source;
};

// A job withdraw_late() took back: its commit became durable when its start
// was already too close to hand it to the dispatcher, so it is not
// acknowledged.  A one-shot submit is forgotten (its idempotency key is free
// again); a commit of a held reservation leaves it held, without payload.
struct late_job {
    std::uint64_t seq = 0;          // the change that committed it
    std::uint64_t id = 0;
    std::int64_t start_ns = 0;
    std::int64_t next_start_ns = 0; // the earliest start the ledger offers now (0: none fits)
    std::string message;
};

struct ledger_stats {
    std::size_t reservations = 0;  // every record, terminal ones included
    std::size_t active = 0;        // held + committed + dispatched
    std::size_t preemptions = 0;   // reservations displaced or moved by preemption
    std::size_t calibration_pinned = 0;  // committed jobs a calibration update left in place: already going out
    std::size_t blocks = 0;       // calibration blocks held, ended ones included
    std::size_t live_blocks = 0;  // yielding, scheduled, started
    std::size_t windows = 0;
    std::size_t gaps = 0;
    std::size_t reservation_buckets = 0;  // hash buckets behind the records
    // Work counters since open, for tests and benches that check a cost
    // does not grow with history (counts, not timings): calibration windows
    // the ledger read or wrote (placement search, gap rebuilds, updates,
    // pruning), and rows it wrote to or deleted from the store.
    std::uint64_t window_visits = 0;
    std::uint64_t store_rows_written = 0;
};

// What one tenant holds now: its live (held, committed, dispatched)
// reservations, their summed durations and their payload bytes.  Kept up to
// date on every state change, so a quota check costs one hash lookup.
struct tenant_usage {
    std::size_t reservations = 0;
    std::int64_t booked_ns = 0;
    std::uint64_t payload_bytes = 0;
    bool operator==(const tenant_usage&) const = default;
};

class ledger {
public:
    // store_path empty = in memory (tests, benches).  On open with a store,
    // everything is loaded; committed reservations whose start passed become
    // missed ("agent was down at start") -- or failed with dispatch_unknown
    // when the last run did not close the ledger and the job was within its
    // dispatch mark (it may have been sent just before a crash) --, held ones
    // whose lease ran out become expired, dispatched ones without a result
    // become failed.
    static result<std::unique_ptr<ledger>> open(std::vector<qpu_spec> qpus, ledger_options opts,
                                                const std::string& store_path,
                                                std::int64_t now_ns);
    ~ledger();
    // A clean stop, once every dispatch outcome is recorded: commits what is
    // queued, stops the writer and resets the dispatch mark (the next open
    // then knows no job was sent unrecorded).  The ledger must not be used
    // afterwards.  The destructor alone leaves the mark, as a crash does.
    void close();
    ledger(const ledger&) = delete;
    ledger& operator=(const ledger&) = delete;

    const placement_policy& policy() const noexcept { return *_policy; }
    const ledger_options& options() const noexcept { return _opts; }
    std::vector<std::string> qpu_names() const;
    // Committed jobs of a QPU waiting for their start (its queue: what
    // qpus.list serves as queued_jobs); 0 for an unknown QPU.
    std::size_t queued_jobs(std::string_view qpu) const;

    // slots.query: the best max_candidates slots, or the next window that
    // could hold the request when none fits.  With req.gang_size k > 1: the
    // k members of the gang reserve_gang would place now (one start on k
    // QPUs), or none.
    result<query_result> query(const request& req, std::int64_t now_ns);

    // slots.reserve: a held reservation with a lease and a fencing token.
    // The same idempotency key from the same tenant returns the same
    // reservation (in its current state); reused with a different request
    // it is an error (duplicate).  lease_ns 0 = default.
    result<reservation> reserve(std::string_view tenant, const request& req,
                                std::string_view idempotency_key, std::int64_t lease_ns,
                                std::int64_t now_ns);
    // k reservations with one start on k distinct QPUs, all or nothing.
    result<std::vector<reservation>> reserve_gang(std::string_view tenant, const request& req,
                                                  std::size_t k, std::string_view idempotency_key,
                                                  std::int64_t lease_ns, std::int64_t now_ns);

    result<reservation> heartbeat(std::string_view tenant, std::uint64_t id,
                                  std::uint64_t fencing_token, std::int64_t now_ns);
    result<reservation> release(std::string_view tenant, std::uint64_t id,
                                std::uint64_t fencing_token, std::int64_t now_ns);
    // jobs.submit on a held reservation: attach the payload (and the shot
    // count the request states, 0: none), held -> committed.
    result<reservation> commit(std::string_view tenant, std::uint64_t id,
                               std::uint64_t fencing_token, blob payload, std::int64_t now_ns,
                               std::uint32_t shots = 0);
    // jobs.submit one-shot: place and commit in one step.
    result<reservation> submit(std::string_view tenant, const request& req,
                               std::string_view idempotency_key, blob payload,
                               std::int64_t now_ns);
    // jobs.cancel: committed -> cancelled.  With a fencing token, a token
    // that is not the job's is refused (bad_fencing_token), as for release.
    result<reservation> cancel(std::string_view tenant, std::uint64_t id, std::int64_t now_ns,
                               std::optional<std::uint64_t> fencing_token = std::nullopt);
    // jobs.status: only the owner sees a reservation.
    result<reservation> status(std::string_view tenant, std::uint64_t id) const;
    // jobs.result: completed or failed jobs only (not_ready before).
    result<job_result> job_result_of(std::string_view tenant, std::uint64_t id) const;

    // calibration.get: windows ending after now_ns, in order.  With until_ns:
    // only those starting before until_ns, and the first one starting at or
    // after it (what a caller looking ahead to until_ns needs, at a cost
    // that does not depend on how far ahead windows reach).
    result<std::vector<calibration_window>> calibration(
        std::string_view qpu, std::int64_t now_ns,
        std::int64_t until_ns = std::numeric_limits<std::int64_t>::max());
    // calibration.update on a pushed QPU: the windows replace every window
    // ending after now_ns.  Reservations whose window changed are re-placed
    // or displaced (options().calibration_change).  With block_id, the
    // tenant's live block on that QPU is then completed (checked first:
    // nothing changes when it is not).
    result<calibration_report> update_calibration(std::string_view qpu,
                                                  std::vector<calibration_window> windows,
                                                  std::int64_t now_ns, std::uint64_t block_id = 0,
                                                  std::string_view tenant = {});

    // ------------------------------------------------ calibration blocks
    //
    // calibration.request: time on one QPU for a calibration, ending by
    // req.needed_by_ns, placed at the latest start that does so: in free
    // time (scheduled), else where only held reservations stand in the way
    // (yielding: their holders get a yield_requested event and have until
    // the block's yield_deadline_ns).  A committed or dispatched job is
    // never moved for a block.  A live block is a blackout: no other job is
    // placed in its time (only the block's tenant's, with request::block_id).
    // Errors, with nothing changed: unknown_qpu, deadline_passed (needed_by
    // not after now), invalid_argument (a duration longer than every window,
    // a bad step), overloaded (max_calibration_blocks live on the QPU),
    // duplicate (the key with another request), no_fit (no block ends by
    // needed_by: earliest_block() and predicted_fidelity() say what the
    // caller may want instead).  The same idempotency key with the same
    // request returns the same block.
    result<calibration_block> request_block(std::string_view tenant, const block_request& req,
                                            std::string_view idempotency_key, std::int64_t now_ns);
    // calibration.cancel: a live block is given back (cancelled); committed
    // jobs in it stay.  Only its tenant.
    result<calibration_block> cancel_block(std::string_view tenant, std::uint64_t id,
                                           std::int64_t now_ns);
    // Every block held (of one QPU; empty: all), by start.
    std::vector<calibration_block> blocks(std::string_view qpu = {}) const;
    const calibration_block* find_block(std::uint64_t id) const;
    // The held reservations a yielding block waits for (empty otherwise).
    std::vector<std::uint64_t> yielders(std::uint64_t block_id) const;
    // The live block on a QPU in force at now, else the next to start.
    std::optional<calibration_block> next_block(std::string_view qpu, std::int64_t now_ns) const;
    // Housekeeping: yielding blocks whose time cleared become scheduled,
    // those past their yield deadline are cleared by revocation (policy) or
    // fail; scheduled blocks whose start passed start, started ones whose
    // end passed end.  Returns how many changed.
    result<std::size_t> settle_blocks(std::int64_t now_ns);
    // The earliest block of duration_ns on qpu that fits anywhere from now
    // (free time inside one window), as a slot; nullopt when none fits.
    std::optional<candidate> earliest_block(std::string_view qpu, std::int64_t duration_ns,
                                            std::int64_t now_ns);
    // The calibration in force at t on qpu: the model of the last window
    // starting at or before t, carried past its end; nullopt when none.
    std::optional<double> predicted_fidelity(std::string_view qpu, std::int64_t t_ns) const;

    // A QPU's endpoint connection, as the daemon's QPU link sees it.  While
    // it is down, placement on that QPU starts no earlier than now +
    // options().endpoint_down_horizon_ns, and a reserve, submit or commit
    // whose start the client asked within that horizon is refused with
    // endpoint_down (error.qpu names the QPU; endpoint_down() says since
    // when, why and what to do).  Each change emits an endpoint_down or
    // endpoint_up event.  Not persisted: the link reports again after a
    // restart.  False for an unknown QPU.
    struct endpoint_state {
        bool up = true;
        std::int64_t since_ns = 0;  // CLOCK_REALTIME of the last change
        std::string error;          // the connection's last error ("connect: Permission denied")
        std::string remedy;         // what the operator can do about it
    };
    bool set_endpoint_state(std::string_view qpu, bool up, std::string error, std::string remedy,
                            std::int64_t now_ns);
    // The state of a QPU whose endpoint is down; nullptr when it is up (or
    // the QPU is unknown).
    const endpoint_state* endpoint_down(std::string_view qpu) const;
    // How much longer than min_lead_ns the hand-over needs on this QPU
    // (the daemon: the arm lead learned from a wire-2 endpoint beyond the
    // one min_lead_ns includes; 0 or less: none).  No start on it earlier
    // than now + min_lead_ns + this (+ the commit backlog) is offered,
    // placed or acknowledged; a commit durable later than that is withdrawn
    // (withdraw_late).  False for an unknown QPU.
    bool set_extra_lead(std::string_view qpu, std::int64_t ns, std::int64_t now_ns);
    std::int64_t extra_lead_ns(std::string_view qpu) const;

    // Housekeeping.  Return how many reservations changed.
    result<std::size_t> expire_leases(std::int64_t now_ns);
    // Committed jobs with start + tolerance < now_ns become missed.
    result<std::size_t> mark_missed(std::int64_t now_ns, std::int64_t tolerance_ns = 0);
    // Group commit, from the commit listener before the acknowledgements go
    // out: every job of n.committed still committed whose start is earlier
    // than now_ns + handover_ns (the time the hand-over still needs from
    // here: the daemon's pump period + dispatch lead, min_lead_ns without
    // its margin) is withdrawn and returned, and its "committed" event is
    // not published.  The caller answers its request with a retryable
    // error naming next_start_ns instead of the acknowledgement.
    std::vector<late_job> withdraw_late(const commit_notice& n, std::int64_t now_ns,
                                        std::int64_t handover_ns);

    // Dispatcher side (no tenant check: the agent itself calls these).
    // due_jobs: committed jobs starting before horizon_end_ns whose last
    // change is durable (change_seq_of(id) == 0).
    std::vector<reservation> due_jobs(std::string_view qpu, std::int64_t horizon_end_ns) const;
    result<reservation> mark_dispatched(std::uint64_t id, std::int64_t sent_ns);
    result<reservation> complete(std::uint64_t id, blob result_blob, std::int64_t now_ns);
    result<reservation> fail(std::uint64_t id, std::string_view why, std::int64_t now_ns);
    // dispatched -> sent: the frame went to a write-only endpoint, which
    // gives no result back; why says where it went.
    result<reservation> mark_sent(std::uint64_t id, std::string_view why, std::int64_t now_ns);
    // A committed job the dispatcher never sent (start passed, calibration
    // guard, endpoint down, refused): committed -> missed with that reason.
    result<reservation> miss(std::uint64_t id, std::string_view why, std::int64_t now_ns);
    // A committed job the endpoint refused at ARM (wire 2): never sent, and
    // not for lack of time or of the host -- the program cannot run there.
    // committed -> failed with the endpoint's stage and reason.
    result<reservation> fail_unsent(std::uint64_t id, std::string_view why, std::int64_t now_ns);

    // The hand-over's promise to the next open (dispatch_unknown): the
    // daemon hands a job to a dispatch thread only when its start is at
    // most dispatch_mark_ns(), which is durable.  extend_dispatch_mark(to)
    // records a later mark (a change, durable with its group) and returns
    // the durable one.  On open, a committed job whose start passed is
    // failed with dispatch_unknown when it starts at or before the mark
    // (it may have been sent just before a crash), else missed.  Without a
    // store every start is covered (INT64_MAX).
    std::int64_t dispatch_mark_ns() const noexcept {
        return _durable.has_store() ? _durable.mark_ns() : std::numeric_limits<std::int64_t>::max();
    }
    std::int64_t extend_dispatch_mark(std::int64_t to_ns);

    std::vector<event> drain_events();
    // Bumped by every operation that changed a reservation or a window (a
    // cheap "anything new to hand over?" for the daemon).
    std::uint64_t generation() const noexcept { return _generation; }
    // Bumped by every change of a QPU's calibration windows (an update, a
    // reload after a failed group): the hand-over room re-reads the windows
    // its plan and the dispatch guards follow before it plans again, so a
    // job the change re-placed is never judged against windows it no longer
    // has.  The calibration events come later (after the acknowledgements)
    // and are no substitute.
    std::uint64_t calibration_generation() const noexcept { return _calibration_generation; }

    // The dispatcher's say in changing a committed job it may hold (cancel,
    // displacement by a preempting request, a calibration update).
    // withdraw(id) pulls the job back from the dispatcher (a compare-and-swap
    // with its send) and returns false when the frame is already out or
    // going out: the job is then not changed, and what happened on the wire
    // decides its outcome (mark_dispatched, complete, fail).  restore(id)
    // undoes a withdraw whose change was abandoned.  The same verb pair runs
    // down to the dispatcher (handover::room, job_pump, dispatcher).  Unset:
    // every committed job may be changed.
    struct dispatch_gate {
        std::function<bool(std::uint64_t id)> withdraw;
        std::function<void(std::uint64_t id)> restore;
    };
    void set_dispatch_gate(dispatch_gate g) { _gate = std::move(g); }

    // Quotas: what a tenant holds now (zeros for an unknown tenant), and
    // whether a reserve/submit with this key would return an existing
    // reservation (or fail as a duplicate) rather than place a new one.
    tenant_usage usage_of(std::string_view tenant) const;
    // How many tenants whose name starts with prefix hold live
    // reservations (tenants.max_delegated_tenants; O(tenants)).
    std::size_t tenants_with_prefix(std::string_view prefix) const;
    bool has_idempotency_key(std::string_view tenant, std::string_view key) const;
    // The tenant's live (held, committed, dispatched) reservations' time
    // inside [from_ns, until_ns), summed over the QPUs (the near-term share
    // of [tenants]).  O(log n) of the tenant's reservations (booked_time.hpp).
    std::int64_t booked_within(std::string_view tenant, std::int64_t from_ns,
                               std::int64_t until_ns) const;

    // Admin / tests.
    const reservation* find(std::uint64_t id) const;
    ledger_stats stats() const;
    // Every invariant, checked from scratch; empty when all hold.
    std::vector<std::string> check_invariants() const;
    // Drop terminal reservations that ended before before_ns, and the
    // calibration windows that ended before before_ns and hold no live
    // reservation (memory and store).  Returns the reservations dropped.
    result<std::size_t> forget_terminal(std::int64_t before_ns);
    // Truncate the store's WAL (no-op without a store; with a writer it is
    // done on the writer thread after its next group).
    timeline::status checkpoint();

    // Group commit.  start_writer hands the store to a writer thread
    // (no-op without a store or with commit_group_max <= 1: every change
    // then commits before its call returns).  post runs a callback on the
    // loop thread (event_loop::post); the listener runs there after every
    // group, once durable_seq() moved.
    void start_writer(commit_writer::post_fn post);
    bool has_writer() const noexcept { return _durable.has_writer(); }
    void set_commit_listener(std::function<void(const commit_notice&)> fn) {
        _durable.set_listener(std::move(fn));
    }
    // The last sequence given to a change, and the last one resolved on disk.
    std::uint64_t latest_seq() const noexcept { return _durable.latest_seq(); }
    std::uint64_t durable_seq() const noexcept { return _durable.durable_seq(); }
    // The sequence of a reservation's last change not yet durable (0: what
    // the ledger holds of it is on disk).
    std::uint64_t change_seq_of(std::uint64_t id) const;
    // Changes waiting for their commit, and whether a client change may be
    // made now (false past commit_queue_max: backpressure).
    std::size_t commit_backlog() const;
    bool accepting_changes() const {
        return stopped().empty() && commit_backlog() < _opts.commit_queue_max;
    }
    // Why the ledger stopped (empty: it did not): a group failed and so did
    // reloading what is on disk.  Every change is then refused and none is
    // planned; the daemon exits and its next start reloads the store
    // (durability.hpp, fail-stop).
    const std::string& stopped() const noexcept { return _durable.stopped(); }
    // How long a change made now is expected to wait for its commit: the
    // groups queued ahead of it (and its own) times the slowest of the last
    // groups' commits.  0 without a writer.  Placement adds it to
    // min_lead_ns, so the earliest start offered includes the observed
    // commit backlog.
    std::int64_t commit_lead_ns() const;
    // Each commit's transaction, fsync included (a group with a writer, one
    // change without), and the commits that failed.
    const rtcore::histogram& commit_latency() const noexcept { return _durable.commit_latency(); }
    std::uint64_t commits_failed() const noexcept { return _durable.commits_failed(); }

private:
    struct qpu_state;
    struct slot;
    struct preempt_plan;
    ledger(std::vector<qpu_spec> qpus, ledger_options opts,
           std::unique_ptr<placement_policy> policy);

    result<reservation> reserve_impl(std::string_view tenant, const request& req,
                                     std::string_view idempotency_key, std::int64_t lease_ns,
                                     blob* payload, std::int64_t now_ns);

    // search (const, no mutation)
    result<std::vector<std::size_t>> resolve_qpus(const request& req) const;
    timeline::status validate(const request& req, std::int64_t now_ns) const;
    timeline::status check_booking(std::string_view tenant, const request& req, std::int64_t lease_ns,
                                   std::int64_t now_ns) const;
    std::int64_t earliest_start(const request& req, std::int64_t now_ns) const;
    // endpoint_down for a request the client asked to start before now +
    // the horizon when its placement is none, or on a QPU whose endpoint is
    // down; `placed` are the chosen QPUs.
    timeline::status check_endpoints(const request& req, const std::vector<std::size_t>& qs,
                                     const std::vector<std::size_t>& placed, std::int64_t now_ns) const;
    error endpoint_down_error(std::size_t q, std::string_view what, std::int64_t now_ns) const;
    std::int64_t deadline_of(const request& req) const;
    std::optional<slot> earliest_fit(std::size_t q, std::int64_t from_ns, const request& req,
                                     bool backfill) const;
    std::vector<candidate> candidates_for(const request& req, const std::vector<std::size_t>& qs,
                                          std::int64_t now_ns, std::size_t per_qpu) const;
    std::optional<std::vector<slot>> gang_fit(const request& req,
                                              const std::vector<std::size_t>& qs, std::size_t k,
                                              std::int64_t from_ns) const;
    std::optional<preempt_plan> preemption_fit(const request& req,
                                               const std::vector<std::size_t>& qs,
                                               std::int64_t now_ns,
                                               const std::set<std::uint64_t>& pinned) const;
    // withdraw() every id through the gate, all or nothing: on a refusal the
    // ones withdrawn are restored and the refused id is returned.
    std::optional<std::uint64_t> withdraw_all(const std::vector<std::uint64_t>& ids);
    std::optional<calibration_window> window_at(std::size_t q, std::int64_t t_ns) const;
    candidate to_candidate(const slot& s, const request& req, std::int64_t earliest_ns) const;
    result<const reservation*> owned(std::string_view tenant, std::uint64_t id) const;
    // owned(), then the fencing token (when given) and the lease (when the
    // change needs a live one): the one check of heartbeat, release, commit
    // and cancel.
    enum class lease_check : std::uint8_t { none, must_be_live };
    result<reservation*> checked(std::string_view tenant, std::uint64_t id,
                                 std::optional<std::uint64_t> fencing_token, lease_check lease,
                                 std::int64_t now_ns);
    std::vector<std::uint64_t> members(const reservation& r) const;
    bool gang_movable(const reservation& r) const;
    error no_fit_error(const request& req, const std::vector<std::size_t>& qs,
                       std::int64_t now_ns) const;

    // calibration blocks (ledger_blocks.cpp)
    struct block_place;
    std::optional<block_place> place_block(std::size_t q, std::int64_t d, std::int64_t from_ns,
                                           std::int64_t until_ns) const;
    // The first start in block b (live) that fits req, at or after from_ns.
    std::optional<slot> block_fit(const calibration_block& b, std::int64_t from_ns,
                                  const request& req) const;
    result<const calibration_block*> block_for_job(std::string_view tenant, const request& req) const;
    // The live block of q that holds t (start <= t < end), or nullptr.
    const calibration_block* live_block_at(std::size_t q, std::int64_t t_ns) const;
    // The first live block of q that overlaps [s, e), or nullptr.
    const calibration_block* live_block_over(std::size_t q, std::int64_t s, std::int64_t e) const;
    // Active reservations on q overlapping [s, e) that are not block b's own.
    std::vector<std::uint64_t> overlapping(std::size_t q, std::int64_t s, std::int64_t e,
                                           std::uint64_t block_id) const;
    void set_block_state(calibration_block& b, block_state to, std::string_view why,
                         std::int64_t now_ns);
    void emit_block(std::string_view type, const calibration_block& b, std::int64_t now_ns);
    // A block leaves the timeline (completed, cancelled, ended, failed): its
    // time left is free again.
    void end_block(calibration_block& b, block_state to, std::string_view why, std::int64_t now_ns);
    // A held reservation in a yielding block's time was committed: the
    // block cannot clear, it fails now.
    void fail_blocks_of(const reservation& r, std::int64_t now_ns);
    std::string earliest_block_text(std::size_t q, std::int64_t d, std::int64_t now_ns);
    // A no_fit's words about the live blocks in the request's way.
    std::string blocks_in_the_way(const request& req, const std::vector<std::size_t>& qs,
                                  std::int64_t now_ns) const;
    void touch_block(std::uint64_t id) { _dirty_blocks.push_back(id); }
    void forget_blocks(std::int64_t before_ns);

    // mutation helpers (never fail)
    void advance(std::int64_t now_ns);
    // qpu_state::placeable_from_ns from the endpoint's state and the extra lead.
    void update_placeable(qpu_state& qs, std::int64_t now_ns) const;
    void extend_periodic(qpu_state& qs, std::int64_t until_ns, std::int64_t now_ns);
    // Every change of a QPU's window set goes through these two, which keep
    // the id and length indexes and the store's dirty list.
    void add_window(std::size_t q, const calibration_window& w, bool durable);
    std::map<std::int64_t, calibration_window>::iterator drop_window(
        std::size_t q, std::map<std::int64_t, calibration_window>::iterator it);
    // Drop windows that ended before before_ns, and (over 2 * max_windows)
    // the oldest ended by now_ns; never one holding a live reservation.
    std::size_t prune_windows(std::size_t q, std::int64_t before_ns, std::int64_t now_ns);
    bool holds_live(std::size_t q, const calibration_window& w) const;
    void occupy(std::size_t q, const reservation& r);
    void vacate(std::size_t q, const reservation& r);
    // Free time: [s, e) leaves the gaps (occupy, a block placed); the free
    // part of [s, e) -- inside windows, outside reservations and live
    // blocks -- becomes gaps, merged with their neighbours in the same
    // window (vacate, a block ended); and a new gap minus live blocks
    // (rebuild_gaps, extend_periodic).
    void carve(std::size_t q, std::int64_t s, std::int64_t e);
    void free_interval(std::size_t q, std::int64_t s, std::int64_t e);
    void add_free(std::size_t q, std::int64_t s, std::int64_t e);
    void rebuild_gaps(std::size_t q);
    void set_state(reservation& r, res_state to, std::string_view why, std::int64_t now_ns,
                   std::string_view ev_type);
    void place(reservation& r, const slot& s);
    result<reservation> dispatch_transition(std::uint64_t id, std::string_view verb, res_state from,
                                            res_state to, std::string_view why, std::int64_t now_ns,
                                            std::string_view ev_type,
                                            const std::function<void(reservation&)>& change);
    void emit(std::string_view type, const reservation& r, std::string_view why,
              std::int64_t now_ns);
    reservation& insert_new(reservation r);
    // Re-place displaced reservations (already vacated) or mark them displaced.
    std::size_t replace_or_displace(std::vector<std::uint64_t> ids, bool try_replace,
                                    std::string_view why, std::int64_t now_ns,
                                    std::size_t* replaced);
    void touch(std::uint64_t id) { _dirty.push_back(id); }
    // The usage a live reservation adds to its tenant (sign +1 or -1).
    void account(const reservation& r, int sign);

    // durability: every public mutating operation ends with persist(),
    // which hands the rows it changed to _durable (durability.hpp).
    timeline::status persist();
    change_set take_changes();
    void release_events(std::vector<event>& evs);
    durability_hooks durability_side();
    timeline::status reload();
    timeline::status reload_from(stored_state loaded);

    std::vector<qpu_state> _qpus;
    // Committed jobs a calibration update left in place because their
    // frame was already going out (the dispatch gate refused the take).
    std::uint64_t _calibration_pinned = 0;
    // Those jobs, until they leave `committed` (their start may lie in no
    // window now; check_invariants knows why).  At most the jobs in flight.
    std::unordered_set<std::uint64_t> _going_out;
    std::unordered_map<std::string, std::size_t> _qpu_index;
    ledger_options _opts;
    std::unique_ptr<placement_policy> _policy;
    // Jobs that became committed in the operation under way (persist()
    // hands them to _durable with its change).
    std::vector<std::uint64_t> _new_commits;
    // The agent's own transitions (mark_dispatched, complete, fail,
    // mark_sent, miss) not yet durable: a failed group undoes them with
    // every other change in its range, and after the reload they are
    // applied again, since they record what happened on the wire.
    struct agent_op {
        std::uint64_t seq = 0;
        std::uint64_t id = 0;
        std::string verb;
        res_state from = res_state::committed;
        res_state to = res_state::committed;
        std::string why;
        std::int64_t at_ns = 0;
        std::string ev_type;
        std::int64_t sent_ns = 0;
        blob result;
    };
    std::deque<agent_op> _agent_ops;
    void replay_agent_ops();
    // A job committed now that starts within dispatch_mark_reach_ns: the
    // mark rides with its change.
    void mark_with_commit(const reservation& r, std::int64_t now_ns);

    std::unordered_map<std::uint64_t, reservation> _res;
    std::unordered_map<std::string, std::uint64_t> _idem;  // tenant '\0' key -> id
    std::unordered_map<std::string, tenant_usage> _usage;  // tenants holding live reservations
    booked_time _booked;  // each tenant's placed reservations, as the busy maps hold them
    std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> _gangs;
    std::set<std::pair<std::int64_t, std::uint64_t>> _leases;  // held: (lease expiry, id)
    std::uint64_t _next_id = 1;
    std::uint64_t _next_gang = 1;
    // Calibration blocks, live and ended (until forgotten), their
    // idempotency keys (tenant '\0' key -> id), and the ones changed by the
    // operation under way (persist writes them).
    std::unordered_map<std::uint64_t, calibration_block> _blocks;
    std::unordered_map<std::string, std::uint64_t> _block_idem;
    std::uint64_t _next_block = 1;
    std::vector<std::uint64_t> _dirty_blocks;
    // Fencing tokens: drawn at random (draw_token), so that no tenant can
    // work one out from its own; a token is unique among the records held
    // (the value: how many hold it, the members of a gang share one).
    std::unordered_map<std::uint64_t, std::uint32_t> _tokens;
    std::uint64_t draw_token() const;
    void hold_token(std::uint64_t token);
    void drop_token(std::uint64_t token);
    std::size_t _preemptions = 0;
    std::uint64_t _generation = 0;
    std::uint64_t _calibration_generation = 0;

    dispatch_gate _gate;
    std::vector<std::uint64_t> _dirty;
    // Window rows to write, in order: a put (window set) or a delete.
    struct window_change {
        std::size_t q = 0;
        std::uint64_t calibration_id = 0;
        std::optional<calibration_window> put;
    };
    std::vector<window_change> _dirty_windows;
    mutable std::uint64_t _window_visits = 0;
    std::uint64_t _store_rows = 0;
    std::vector<event> _pending_events;
    std::vector<event> _events;
    // What of all this is on disk: the store, the writer, the sequence
    // numbers, the changes in flight and the undurable set, the dispatch
    // mark (durability.hpp).  Last, so that it goes first: its destructor
    // stops the writer before the state its hooks touch is gone.
    durability _durable;
};

}  // namespace qrt::timeline
