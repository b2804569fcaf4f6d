#pragma once
// The per-QPU dispatcher: one real-time thread that sends each job's frame at
// its start time T (README.md, "Threads and cores" and "The path of a job").
//
// Housekeeping thread (one, the owner)            dispatch thread (RT)
// -------------------------------------           ----------------------------
// submit(job, payload): take a slot from the      peek the next job
//   free list, encode the frame into the slot's    sleep (clock_nanosleep ABS) to
//   pre-registered buffer, convert T to            T - lead, spin to T
//   monotonic, push {slot} on the job ring  -->    guard: missed / calibration /
// on_realtime_step(): re-convert the deadline      window / endpoint
//   of every queued slot (one atomic store each)   stamp sent_ns, io_uring
// set_endpoint_fd()/clear_endpoint(): update the     WRITE_FIXED (registered file
//   registered file                                 0, fixed buffer)
// set_calibration_id(): the guard's atomic         reap completions (never waits)
// drain_records(): records back, slot freed <--    push a record per job
//
// - Two housekeeping threads share the producer side: the daemon's job pump
//   submits (the only producer of the job ring), the event loop drains
//   records and withdraws, restores and re-converts.  The slot bookkeeping
//   they share (free list, each slot's queued/job id/start, the time base)
//   is under one priority-inheriting mutex held for a few hundred
//   instructions at most (no I/O, no callback); the dispatch thread never
//   takes it.
// - The slot pool, both rings, the io_uring ring, its registered buffer and
//   file table are all created in the constructor, before the thread starts
//   and before it turns real-time; the loop never allocates, locks, logs or
//   throws (the loop and its steps are noexcept) and only counts.
// - Deadlines: each slot's monotonic deadline is one std::atomic<int64_t>;
//   the window end and tolerance are kept relative to it, so a step
//   re-conversion can never be seen half-done.
// - Jobs may be submitted in any start order: a job placed later into a gap
//   before one already handed over (backfill, preemption) still goes out
//   first.  The dispatch thread moves what the job ring brings into its own
//   pending array, kept sorted by deadline on insert (2 x slots entries,
//   allocated in the constructor; an in-order job is appended in O(1), an
//   earlier one shifts the later ones, at most slots; no allocation, no
//   lock).  A realtime step moves every deadline by the
//   same amount, so the order holds across re-conversions.  A submit that
//   lands before a job already queued wakes the thread, which then looks at
//   the new head instead of sleeping to the old one.  Submit at least
//   lead + the thread's loop latency before T (daemon: dispatch.min_lead,
//   see services.cpp).
// - Realtime steps (both directions) are followed twice: the housekeeping
//   side re-converts every queued deadline when its step watch fires
//   (on_realtime_step, which wakes the thread), and the dispatch thread
//   itself checks the clock's offset against its head job's conversion
//   each time it looks at that job and again when it wakes before T (one
//   monotonic/realtime/monotonic bracket, no syscall beyond the vDSO
//   reads), and a job the ring brings when it pulls it.  When they differ
//   by more than step_follow_ns it re-converts every pending deadline from
//   the jobs' realtime starts itself and sorts them again.  So a
//   step the housekeeping side has not seen yet (its loop is busy, or the
//   step landed before its watch was armed) neither sends a job early (a
//   backward step) nor late (a forward step: the thread notices at its
//   next wake, at most max_sleep_chunk_ns later, or is woken by the watch).
//   A step inside the last spin (at most the lead) is left to the watch.
// - Tuned mode (the default): SCHED_FIFO on dispatch_cpu, the dispatch
//   path mlocked and prefaulted (its stack, code, this object, the rings,
//   the frame pool and the io_uring: rtcore/memory_lock.hpp; not
//   mlockall(MCL_FUTURE), which would lock every client's buffers too),
//   timer slack 1 ns, /dev/cpu_dma_latency held at 0, sleep to
//   T - lead then spin.  Untuned mode (comparison only): SCHED_OTHER, no
//   pinning, default timer slack, plain sleep to T, no spin.
// - Submission (submit_mode): `syscall` (the default) publishes the SQE and
//   calls io_uring_enter from the RT thread.  `sqpoll` sets the ring up with
//   IORING_SETUP_SQPOLL: the RT thread only writes the SQE and the SQ tail,
//   a kernel thread (iou-sqp-<pid>) polling the ring issues the write.  Its
//   CPU is sqpoll_cpu; -1 puts it on the dispatch CPU itself, where it runs
//   (SCHED_OTHER) whenever the RT thread sleeps, so it never competes with
//   the RT thread and keeps that CPU out of idle.  After sqpoll_idle_ms
//   without work it sleeps and sets IORING_SQ_NEED_WAKEUP; the RT thread
//   then wakes it before its last sleep ahead of T (a syscall before T,
//   not at T; counted in sqpoll_prewakes).  When the next job is too close
//   for the thread to sleep in between, it waits (bounded,
//   io_uring_wait_cqe_timeout) for the poller to take the write, which
//   otherwise could not run until that next spin ended (sqpoll_yields).
//   When the SQPOLL setup is refused (EPERM, EINVAL, ...) the ring falls
//   back to `syscall` and submit_fallback_reason() says why.
// - Writes to a socket, FIFO or character device carry RWF_NOWAIT: one the
//   endpoint cannot
//   take at T (its buffer is full) fails at once with -EAGAIN instead of
//   being queued by io_uring and sent whenever the buffer drains (late).
//   (A linked IORING_OP_LINK_TIMEOUT at T + tolerance would allow the
//   tolerance, but arming and cancelling its hrtimer cost 11 us per send on
//   this VM, against 0 for RWF_NOWAIT; see bench/README.md.)
// - A failed io_uring_enter leaves the SQEs it did not consume in the SQ
//   ring; the thread turns them into NOPs (syscall mode: only it submits),
//   so a frame is never sent later by the next submit.
// - The registered file is only updated by the dispatch thread itself (at a
//   point where it is not about to send): io_uring_register takes the ring's
//   lock, and a housekeeping thread holding it would stall the RT thread's
//   next submit (priority inversion).  set_endpoint_fd() hands the fd over
//   and waits for the thread to apply it.
// - The dispatch thread and its loop have one owner, dispatch_group
//   (dispatch_group.hpp): start() makes a group of this one dispatcher.
//   Several tuned QPUs on one CPU (dispatch.qpus_per_cpu) share one group:
//   its thread runs this class's RT steps for each member and sends the
//   earliest start among them next.  A member of a group of several is not
//   start()ed itself; the housekeeping side is the same either way: it
//   wakes the group's word (_wakeup).
// - Sleeps are futex waits with an absolute CLOCK_MONOTONIC timeout on a
//   wake word: a realtime step, a new job on an idle thread, an endpoint
//   change or stop() cut them short, so a deadline re-converted earlier is
//   seen at once, not when the old wake-up time comes.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <sys/types.h>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "qrt/dispatch/job.hpp"
#include "qrt/dispatch/lead_controller.hpp"
#include "rtcore/clock.hpp"
#include "rtcore/error.hpp"
#include "rtcore/memory_lock.hpp"
#include "rtcore/pi_mutex.hpp"
#include "rtcore/spsc_ring.hpp"

namespace qrt::dispatch {

class dispatch_group;

// Why a submit was refused, as a code: the job pump's SCHED_FIFO thread
// submits through try_submit() and builds no text; the event loop turns the
// code into words (describe_refusal) when it records the refusal.
enum class submit_refusal : std::uint8_t {
    none,
    payload_too_large,  // over max_payload_bytes
    negative_times,     // negative duration_ns or tolerance_ns
    outside_window,     // [T, T + duration] not inside the window
    no_free_slot,       // every dispatch slot in use
    ring_full,          // cannot happen: the ring holds one entry per slot
    already_queued,     // qpu_link: the id is queued or in flight already
};

enum class dispatch_mode { tuned, untuned };
enum class submit_mode { syscall, sqpoll };

const char* to_string(submit_mode m) noexcept;
// "syscall" / "sqpoll" -> the mode; anything else -> nullopt.
std::optional<submit_mode> parse_submit_mode(std::string_view s) noexcept;

// Why frame pools of pool_bytes each, for qpus QPUs, cannot be registered
// with io_uring (which locks them) under allowance, or "" when they can:
// "RLIMIT_MEMLOCK = 8 MiB and no CAP_IPC_LOCK, 64.1 MiB needed: ...", with
// the options that size the pool and the remedies.  The daemon's start,
// `qrtd check-config` and `qrtd host plan` say the same.
std::string frame_pool_shortfall(std::uint64_t pool_bytes, std::size_t qpus, const rtcore::memlock_allowance& allowance);

struct dispatcher_config {
    std::uint32_t qpu_index = 0;
    dispatch_mode mode = dispatch_mode::tuned;
    int dispatch_cpu = -1;              // tuned: pin here (-1 = do not pin)
    int rt_priority = 80;               // tuned: SCHED_FIFO priority
    bool hold_cpu_dma_latency = true;   // tuned: write 0 to /dev/cpu_dma_latency while running
    bool require_rt = false;            // tuned: fail start() if SCHED_FIFO/mlock cannot be had
    // tuned: run on the dispatch thread, with its TID, before the real-time
    // setup (setup code: may allocate).  The daemon joins the isolated
    // cpuset here (cgroup v1: the thread writes its TID into the cpuset's
    // tasks file), so it may then pin itself to its isolated CPU.  An error
    // is the thread's setup error.
    std::function<rtcore::status(pid_t tid)> before_rt_setup;
    std::size_t slots = 256;            // in-flight jobs (power of two)
    std::size_t max_payload_bytes = 64 * 1024;
    std::uint8_t frame_flags = 0;       // qrt_wire_flag bits set on every JOB frame
    // The wire version the dispatch thread speaks: 1 sends the JOB (header
    // and program) at T; 2 sends only a FIRE header at T for a job the
    // housekeeping side has marked armed (set_armed), and its slots hold
    // headers only (the program goes out in ARM, from the QPU link).
    unsigned wire_version = 1;
    lead_config lead{};
    double max_spin_fraction = 0.25;    // spin at most this share of the gap before T
    std::int64_t max_sleep_chunk_ns = 20'000'000;  // re-check stop/deadline at least this often
    std::int64_t idle_sleep_ns = 1'000'000;        // nothing queued: sleep this long
    submit_mode submit = submit_mode::syscall;    // how the RT thread hands the SQE to the kernel
    int sqpoll_cpu = -1;                // sqpoll: the poller's CPU (-1 = dispatch_cpu; unpinned if that is -1 too)
    std::uint32_t sqpoll_idle_ms = 50;  // sqpoll: poller sleeps after this long without work
    // The dispatch thread re-converts its pending deadlines itself when the
    // realtime clock's offset moved by more than this since they were
    // converted.  Only a step moves it (adjtime slews both clocks alike);
    // above the sampling error of one bracket of reads (<= 25 us).
    std::int64_t step_follow_ns = 200'000;
};

// One record per submitted job, back from the dispatch thread.
struct dispatch_record {
    std::uint64_t job_id = 0;
    std::uint32_t slot = 0;
    dispatch_status status = dispatch_status::sent;
    std::int32_t io_result = 0;             // CQE res (bytes or -errno), sent/send_failed
    std::int32_t submit_error = 0;          // -errno of io_uring_enter when the write never reached the kernel
    std::int64_t deadline_ns = 0;           // T, monotonic, as used
    std::int64_t lateness_ns = 0;           // monotonic after submit - T (sent), or now - T
    std::int64_t sent_ns = 0;               // realtime stamp put in the frame (0 if not sent)
    std::int64_t wakeup_latency_ns = -1;    // timer wake - requested wake (-1: no timed wake)
    std::int64_t spin_ns = 0;               // time spent spinning for this job
    std::int64_t lead_ns = 0;               // lead in force for this job
    // The endpoint registration the frame was written on (endpoint_generation()
    // when it went out): the QPU link fails a job sent on a connection it has
    // since dropped at once, whatever the order its EOF and this record
    // reach the loop in.
    std::uint32_t endpoint_gen = 0;
};

// Counters the dispatch thread keeps (relaxed atomics, read any time).
struct dispatch_thread_stats {
    std::uint64_t loops = 0;
    std::uint64_t sleeps = 0;
    std::uint64_t submit_errors = 0;        // io_uring_submit < 1
    std::uint64_t sqe_exhausted = 0;
    std::uint64_t deadline_reloads = 0;     // re-converted deadlines seen while waiting
    std::uint64_t lead_capped = 0;          // dispatches whose lead the spin budget cut
    std::uint64_t submits = 0;              // io_uring_submit calls on the send path
    std::uint64_t sqpoll_wakeups = 0;       // sqpoll: submits that found the poller asleep (a syscall)
    std::uint64_t sqpoll_prewakes = 0;      // sqpoll: poller woken at T - lead (before T)
    std::uint64_t send_blocked = 0;         // writes refused at T: the endpoint's buffer was full (EAGAIN)
    std::uint64_t voided_sqes = 0;          // SQEs a failed submit left behind, turned into NOPs
    std::uint64_t endpoint_updates = 0;     // registered-file updates applied by the thread
    std::uint64_t early_wakes = 0;          // sleeps cut short by the wake word
    std::uint64_t sqpoll_yields = 0;        // sqpoll: waits for the poller before a back-to-back job
    std::uint64_t steps_followed = 0;       // realtime steps the thread found and re-converted itself
    bool rt_applied = false;                // SCHED_FIFO (+affinity) set up at start
    // The thread's placement as it measures it itself (tuned mode), at
    // start and then at most every placement_check_ns while idle: its
    // affinity is its one dispatch CPU, it runs there, and it is SCHED_FIFO.
    // Something that moved it (a sweep, taskset) is undone by re-pinning.
    std::uint64_t placement_checks = 0;
    bool placement_ok = false;              // as of the last check
    int cpu_seen = -1;                      // sched_getcpu() at the last check
    std::uint64_t placement_lost = 0;       // checks that found it moved or not SCHED_FIFO
    std::uint64_t repinned = 0;             // of those, the ones it re-pinned itself
    bool mlocked = false;                   // the dispatch path is locked in memory
    std::uint64_t locked_bytes = 0;         // bytes this thread locked (shared pages counted once each)
    bool dma_latency_held = false;
    int setup_errno = 0;                    // first failed tuning step's errno (0 = none)
};

namespace detail {
// What the job ring carries (the immutable part of a queued job; the
// deadline lives in the slot, where a realtime step can rewrite it).
struct queued_job {
    std::uint32_t slot = 0;
    std::uint32_t frame_len = 0;
    std::uint64_t job_id = 0;
    std::uint64_t calibration_id = 0;
    std::int64_t scheduled_rt_ns = 0;    // T, realtime: what a step re-conversion starts from
    std::int64_t tolerance_ns = 0;
    std::int64_t window_end_rel_ns = 0;  // window_end - scheduled
    std::int64_t duration_ns = 0;
};
}  // namespace detail

class dispatcher {
public:
    // Bytes of the slot pool a dispatcher with these sizes maps, registers
    // with io_uring and locks: slots frames of header + max_payload_bytes,
    // each rounded up to 64, the whole to a page.  (config checks it too.)
    // Wire version 2: slots of a FIRE header only.
    static constexpr std::uint64_t frame_pool_bytes(std::uint64_t slots, std::uint64_t max_payload_bytes,
                                                    unsigned wire_version = 1) noexcept {
        const std::uint64_t slot = wire_version >= 2 ? (wire_v2_header_bytes + 63) / 64 * 64
                                                     : (wire_header_bytes + max_payload_bytes + 63) / 64 * 64;
        return (slot * slots + 4095) / 4096 * 4096;
    }
    static constexpr std::uint64_t wire_header_bytes = 96;      // == wire::header_len (static_asserted)
    static constexpr std::uint64_t wire_v2_header_bytes = 128;  // == wire::header_len_v2 (static_asserted)

    // Creates the slot pool, rings and the io_uring (with registered buffer
    // and a one-entry sparse file table).  Throws std::system_error /
    // std::invalid_argument on setup failure (setup code may throw).
    dispatcher(const dispatcher_config& cfg, rtcore::clock_source& clock);
    ~dispatcher();
    dispatcher(const dispatcher&) = delete;
    dispatcher& operator=(const dispatcher&) = delete;

    // Starts the dispatch thread: a dispatch group of this one dispatcher
    // (dispatch_group.hpp runs every dispatch thread; sqpoll stays possible
    // in a group of one).  Tuned mode applies the RT setup on the thread;
    // when require_rt is set and it fails, start() returns the error.  A
    // dispatcher in a group of several is started with its group.
    rtcore::status start();
    // Stops and joins the thread start() made; queued jobs come back as
    // `cancelled`.  Nothing for a dispatcher in a group of several.
    void stop() noexcept;
    // The thread start() made runs.
    bool running() const noexcept;

    // ---- housekeeping threads (see the header comment) ----
    // Converts T with the current time base, encodes the JOB frame into a
    // free slot and queues it, in any start order.  Errors: payload too
    // large, pool full, window/duration inconsistent.
    rtcore::status submit(const dispatch_job& job, std::span<const std::uint8_t> payload);
    // The same without building text (no allocation): the job pump's call.
    submit_refusal try_submit(const dispatch_job& job, std::span<const std::uint8_t> payload) noexcept;
    // The words for a refusal of job with payload_bytes of payload.
    std::string describe_refusal(submit_refusal r, const dispatch_job& job, std::size_t payload_bytes) const;
    // Re-sample the time base (after a realtime step) and re-convert every
    // queued deadline.  Returns the number of deadlines rewritten.
    std::size_t on_realtime_step(const rtcore::time_base& base);
    const rtcore::time_base& base() const noexcept { return _base; }
    // The endpoint's connected fd (not owned) goes into registered file 0.
    rtcore::status set_endpoint_fd(int fd);
    void clear_endpoint() noexcept;
    // The registration now in force: after a successful set_endpoint_fd(),
    // that fd's generation (each set and clear makes a new one; never 0).
    std::uint32_t endpoint_generation() const noexcept {
        return _registered_gen.load(std::memory_order_acquire);
    }
    // Calls f(const dispatch_record&) for each record and frees the slots.
    template <typename F>
    std::size_t drain_records(F&& f) {
        std::size_t n = 0;
        while (const dispatch_record* r = _records.peek()) {  // one consumer: the loop
            const dispatch_record rec = *r;
            _records.pop_front();
            release_slot(rec.slot);
            f(rec);
            ++n;
        }
        return n;
    }
    std::size_t queued() const noexcept;
    std::size_t slot_count() const noexcept { return _slot_count; }
    // Withdraw a queued job (cancelled, displaced or moved in the ledger after
    // it was handed over).  A compare-and-swap against the dispatch thread's
    // own just before it sends: either the withdrawal wins (the job is never
    // sent; its record says `cancelled`) or the send does (withdrawn() says
    // too_late, the frame is out or going out, and its record is the truth:
    // the caller must not record the job as cancelled or displaced).
    enum class withdraw_result : std::uint8_t { withdrawn, too_late, not_queued };
    withdraw_result withdraw(std::uint64_t job_id) noexcept;
    // Undo a withdraw() whose change was abandoned (a preemption that could
    // not take every victim): true when the job is queued to be sent again,
    // false when the dispatch thread already dropped it (its record says
    // `cancelled`, sent_ns 0).
    bool restore(std::uint64_t job_id) noexcept;
    // Wake the dispatch thread so it reports the jobs withdrawn so far as
    // `cancelled` now (otherwise at its next look, within
    // max_sleep_chunk_ns).  Call it once the withdrawals are final: a job
    // reported cannot be restored.
    void report_withdrawn() noexcept { rtcore::wake_sleepers(*_wakeup); }
    // Wire version 2: the endpoint answered ARMED for job_id (true), or the
    // job is no longer armed (false: a DISARM, a lost connection).  The
    // dispatch thread fires only a job marked armed.  false when job_id is
    // not queued.
    bool set_armed(std::uint64_t job_id, bool armed) noexcept;
    // The monotonic deadline a queued (or in-flight) job will be sent at.
    std::optional<std::int64_t> queued_deadline_ns(std::uint64_t job_id) const noexcept;

    // The guard's calibration: the current id and, when the next window
    // starts exactly where the current one ends, that window's id and the
    // (realtime) switch time.  Housekeeping thread only (single writer of a
    // seqlock the dispatch thread reads without locking).
    void set_calibration(std::uint64_t current_id, std::uint64_t next_id, std::int64_t switch_rt_ns) noexcept;
    void set_calibration_id(std::uint64_t id) noexcept { set_calibration(id, id, INT64_MAX); }

    // ---- any thread ----
    struct calibration_plan {
        std::uint64_t current = 0;
        std::uint64_t next = 0;
        std::int64_t switch_rt_ns = INT64_MAX;  // realtime, as the ledger placed the windows
        bool consistent = true;  // false: no clean read within max_tries
    };
    // max_tries bounds the seqlock retries (the RT thread must not spin on
    // a writer that was preempted mid-update); the default waits for it.
    calibration_plan calibration(unsigned max_tries = ~0U) const noexcept;
    std::uint64_t calibration_id() const noexcept { return calibration().current; }
    bool endpoint_up() const noexcept { return _endpoint_up.load(std::memory_order_acquire); }
    std::int64_t lead_ns() const noexcept { return _lead_ns_pub.load(std::memory_order_relaxed); }
    dispatch_thread_stats thread_stats() const noexcept;
    const dispatcher_config& config() const noexcept { return _cfg; }
    // Why the RT setup failed (empty when it did not); valid after start().
    const std::string& setup_error() const noexcept { return _setup_error; }
    // The submission mode in force (config().submit, or syscall after a
    // refused SQPOLL setup) and why SQPOLL was not used (empty if it was,
    // or was not asked for).
    submit_mode effective_submit_mode() const noexcept { return _submit_mode; }
    const std::string& submit_fallback_reason() const noexcept { return _submit_fallback_reason; }
    // The frame pool is registered with io_uring (writes are WRITE_FIXED).
    // Untuned mode does without when the pool cannot be locked (RLIMIT_MEMLOCK
    // without CAP_IPC_LOCK: a container, a unit without LimitMEMLOCK=): plain
    // writes from the same buffers, and buffers_fallback_reason() says why.
    // Tuned mode refuses instead: the constructor throws, naming the limit,
    // what is needed and the remedy (frame_pool_shortfall).
    bool fixed_buffers() const noexcept { return _fixed_buffers; }
    const std::string& buffers_fallback_reason() const noexcept { return _buffers_fallback_reason; }
    // The io_uring fd (for /proc/self/fdinfo: SqThread, SqTotalTime...).
    int ring_fd() const noexcept;
    // The SQPOLL kernel thread's TID (sqpoll mode; 0 otherwise or unknown):
    // not an intrusion on the dispatch CPU.
    pid_t sqpoll_tid() const noexcept { return _sqpoll_tid; }

    // The group of several whose one thread serves this dispatcher
    // (dispatch_group.hpp), or nullptr: then start() runs a group of one.
    const dispatch_group* group() const noexcept { return _own ? nullptr : _group; }

private:
    // A dispatch group runs this dispatcher's RT state on its thread
    // (dispatch_group.cpp), through the private steps below.
    friend class dispatch_group;
    using queued_job = detail::queued_job;
    struct alignas(64) slot_state {
        std::atomic<std::int64_t> deadline_ns{0};  // monotonic T; rewritten on steps
        // slot_phase: queued -> withdrawn (withdraw) or -> sending (the
        // dispatch thread, just before the write); withdrawn -> queued
        // (restore) or -> dropped (the dispatch thread: reported cancelled).
        std::atomic<std::uint8_t> phase{0};
        std::atomic<bool> armed{false};            // version 2: ARMED answered (set_armed)
        std::int64_t scheduled_rt_ns = 0;          // housekeeping only
        std::uint64_t job_id = 0;                  // housekeeping only
        bool queued = false;                       // housekeeping only
    };
    struct uring;  // liburing state (pimpl keeps liburing.h out of this header)

    // Dispatch thread, setup: lock what the loop touches (memory_lock.hpp).
    rtcore::status lock_dispatch_path(std::size_t stack_bytes);
    // Measures the thread's own placement (see dispatch_thread_stats) and
    // re-pins it to its CPU when it was moved.  Two or three syscalls and
    // relaxed stores: no allocation, no lock, no log.
    void check_placement(std::int64_t now, bool force) noexcept;
    void reap_completions() noexcept;
    void apply_endpoint_update(std::int64_t now, const queued_job* head) noexcept;
    void void_unsubmitted() noexcept;
    // The send, in steps (dispatcher_rt.cpp), all on the dispatch thread:
    // claim_send: the guard, then the send/withdraw compare-and-swap;
    //   dispatch_status::sent when this thread now owns the slot's frame.
    dispatch_status claim_send(const queued_job& j, std::int64_t deadline, std::int64_t now) noexcept;
    // prep_write: the write's SQE (fixed buffer, registered file, RWF_NOWAIT
    //   where chosen) with sent_ns stamped into the frame; false (counted)
    //   when the ring has no SQE.
    bool prep_write(const queued_job& j, std::int64_t& sent_rt) noexcept;
    // sent_record: the record of a submitted write; settle_submit marks it
    //   send_failed (voiding what the kernel did not consume) when the
    //   enter failed or stopped short of write_pos.
    dispatch_record sent_record(const queued_job& j, std::int64_t deadline, std::int64_t after,
                                std::int64_t sent_rt, std::int64_t wakeup_latency, std::int64_t spin_ns,
                                std::int64_t lead) const noexcept;
    void settle_submit(dispatch_record& r, int rc, unsigned write_pos, bool sqpoll) noexcept;
    // The send at T of the pending head j (the loop in dispatch_group.cpp):
    // guard, the withdraw race, the write, the record; pops j and reaps.
    // sqpoll: a plain store to the SQ tail unless the poller sleeps, and a
    // bounded wait for the poller when the next job is too close to sleep.
    void send_head(const queued_job& j, std::int64_t deadline, std::int64_t now, std::int64_t wakeup_latency,
                   std::int64_t spin_ns, std::int64_t lead) noexcept;
    // sqpoll: the kernel's poller sleeps (a submit would enter to wake it).
    bool poller_asleep() const noexcept;
    // SQEs a failed submit left: submitted (sqpoll: when the poller sleeps).
    void submit_leftovers() noexcept;
    // sqpoll: wake the poller before the last sleep before a send.
    void prewake_poller() noexcept;
    // The loop ended: queued jobs come back cancelled, in-flight writes get
    // a bounded wait.
    void finish_on_stop() noexcept;
    // Registered file 0 := fd (-1 empties it) and the RWF_NOWAIT choice for
    // it; 0 or -errno.  The dispatch thread's, or anyone's while it is not
    // running.
    int register_endpoint(int fd) noexcept;
    // Hand fd to the running dispatch thread; returns the request's generation.
    std::uint32_t request_endpoint(int fd) noexcept;
    void emit(const queued_job& j, dispatch_status st, std::int64_t deadline, std::int64_t now,
              std::int64_t wakeup_latency, std::int64_t spin_ns) noexcept;
    void release_slot(std::uint32_t slot) noexcept;
    // The dispatch thread's pending jobs: _pending[_pending_head, _pending_tail)
    // sorted by deadline, earliest first.  A job later than all (the usual
    // hand-over) is appended in O(1); an earlier one shifts the later ones
    // up.  Capacity 2 x slots: the live part is compacted to the front only
    // when the tail reaches the end, after at least `slots` pops.
    void pull_jobs() noexcept;
    const queued_job* pending_head() const noexcept {
        return _pending_head == _pending_tail ? nullptr : &_pending[_pending_head];
    }
    void pending_pop() noexcept {
        if (++_pending_head == _pending_tail) {
            _pending_head = _pending_tail = 0;
        }
    }
    // Report every withdrawn pending job `cancelled` now, not at its T, so
    // the housekeeping side learns at once that it was never sent.
    void drop_withdrawn(std::int64_t now) noexcept;
    // The dispatch thread's own step check (see the header comment): true
    // when the clock's offset no longer matches j's conversion and every
    // pending deadline was re-converted (the caller looks again).
    bool follow_realtime_step(const queued_job& j, std::int64_t deadline) noexcept;
    // realtime - monotonic now, or nullopt when the bracket of reads was
    // too wide to trust (preempted between them).
    std::optional<std::int64_t> sample_offset() const noexcept;
    std::uint8_t* slot_buffer(std::uint32_t slot) const noexcept;
    // Ring setup (setup code: allocates, may fail).  init_sqpoll_ring:
    // 0 or -errno of io_uring_queue_init_params.
    int init_sqpoll_ring(uring& u) const;
    std::string sqpoll_failure(int rc) const;
    rtcore::status register_ring(uring& u);
    // On the dispatch thread, after before_rt_setup, before SCHED_FIFO.
    void retry_sqpoll_on_this_thread();

    dispatcher_config _cfg;
    rtcore::clock_source& _clock;
    rtcore::time_base _base;
    std::size_t _slot_count = 0;
    std::size_t _slot_bytes = 0;
    std::uint8_t* _pool = nullptr;  // mmap'ed, registered with io_uring
    std::size_t _pool_bytes = 0;
    std::unique_ptr<slot_state[]> _slots;
    // The housekeeping side's bookkeeping: _free, each slot's housekeeping
    // fields, _base, _last_deadline_rt_ns.
    mutable rtcore::pi_mutex _hk_mutex;
    std::vector<std::uint32_t> _free;  // housekeeping only
    std::int64_t _last_deadline_rt_ns = INT64_MIN;
    rtcore::spsc_ring<queued_job> _jobs;
    std::unique_ptr<queued_job[]> _pending;  // dispatch thread only (see pull_jobs)
    std::size_t _pending_head = 0;
    std::size_t _pending_tail = 0;
    std::atomic<std::uint32_t> _withdrawals{0};  // bumped by each successful withdraw()
    rtcore::spsc_ring<dispatch_record> _records;
    std::unique_ptr<uring> _uring;
    submit_mode _submit_mode = submit_mode::syscall;
    std::string _submit_fallback_reason;
    bool _fixed_buffers = true;
    std::string _buffers_fallback_reason;
    bool _sqpoll_retry_on_thread = false;  // SQ_AFF refused here: the dispatch thread retries in its cpuset
    lead_controller _lead;

    // per-slot send-time info kept by the RT thread until the CQE arrives
    std::unique_ptr<dispatch_record[]> _inflight;

    pid_t _sqpoll_tid = 0;
    // The registered endpoint is a socket or FIFO: writes go RWF_NOWAIT.
    // Written by whoever updates the registered file, read by the RT thread.
    std::atomic<bool> _nowait_writes{false};

    std::atomic<bool> _endpoint_up{false};
    std::atomic<bool> _loop_running{false};
    std::atomic<bool> _idle{false};  // the thread sleeps with nothing queued
    rtcore::wake_word _wake{0};  // bumped while no group serves this dispatcher (nobody sleeps on it)
    // The word the housekeeping side bumps to wake the thread serving this
    // dispatcher: its group's (dispatch_group), else _wake.
    rtcore::wake_word* _wakeup = &_wake;
    dispatch_group* _group = nullptr;
    // The group of one start() made (nullptr in a group of several).
    std::unique_ptr<dispatch_group> _own;
    // Endpoint hand-over to the RT thread (it alone calls register_files_update).
    std::atomic<int> _pending_fd{-1};
    std::atomic<std::uint32_t> _fd_req_gen{0};
    std::atomic<std::uint32_t> _fd_done_gen{0};
    // The generation of what registered file 0 holds (written by whoever
    // registers: the dispatch thread, or any thread while it is not running).
    std::atomic<std::uint32_t> _registered_gen{0};
    std::atomic<int> _fd_update_rc{0};
    // Seqlock over the calibration plan (odd sequence = write in progress).
    std::atomic<std::uint32_t> _cal_seq{0};
    std::atomic<std::uint64_t> _cal_current{0};
    std::atomic<std::uint64_t> _cal_next{0};
    std::atomic<std::int64_t> _cal_switch_rt_ns{INT64_MAX};
    std::atomic<std::int64_t> _lead_ns_pub{0};
    std::string _setup_error;  // written by the group's thread before its setup is reported

    std::atomic<std::uint64_t> _st_loops{0};
    std::atomic<std::uint64_t> _st_sleeps{0};
    std::atomic<std::uint64_t> _st_submit_errors{0};
    std::atomic<std::uint64_t> _st_sqe_exhausted{0};
    std::atomic<std::uint64_t> _st_reloads{0};
    std::atomic<std::uint64_t> _st_lead_capped{0};
    std::atomic<std::uint64_t> _st_submits{0};
    std::atomic<std::uint64_t> _st_sqpoll_wakeups{0};
    std::atomic<std::uint64_t> _st_sqpoll_prewakes{0};
    std::atomic<std::uint64_t> _st_send_blocked{0};
    std::atomic<std::uint64_t> _st_voided{0};
    std::atomic<std::uint64_t> _st_endpoint_updates{0};
    std::atomic<std::uint64_t> _st_early_wakes{0};
    std::atomic<std::uint64_t> _st_sqpoll_yields{0};
    std::atomic<std::uint64_t> _st_steps_followed{0};
    std::atomic<bool> _st_rt{false};
    // Placement (dispatch thread writes; thread_stats() reads).
    static constexpr std::int64_t placement_check_ns = 100'000'000;
    std::int64_t _placement_checked_ns = 0;  // dispatch thread only
    std::atomic<std::uint64_t> _st_placement_checks{0};
    std::atomic<bool> _st_placement_ok{false};
    std::atomic<int> _st_cpu_seen{-1};
    std::atomic<std::uint64_t> _st_placement_lost{0};
    std::atomic<std::uint64_t> _st_repinned{0};
    std::atomic<bool> _st_mlocked{false};
    std::atomic<std::uint64_t> _st_locked_bytes{0};
    std::vector<rtcore::locked_region> _locked;  // dispatch thread, setup and exit only
    std::atomic<bool> _st_dma{false};
    std::atomic<int> _st_setup_errno{0};
};

}  // namespace qrt::dispatch
