// The dispatch thread's side of the dispatcher: every step the loop takes
// for this dispatcher once the thread is set up.  The thread and its loop
// are dispatch_group.cpp's (one owner: a lone QPU is a group of one), which
// does the setup, which may allocate, before the loop starts.
//
// Everything in this file runs on the real-time dispatch thread, on its
// isolated CPU, between a job's wake-up and its frame on the wire:
//
//     NO ALLOCATION, NO LOCK, NO LOG.
//
// No new, no growing container, no std::string, no exception (every
// function is noexcept); no mutex (the priority-inheriting _hk_mutex is the
// housekeeping threads', never this thread's: it reads their state through
// atomics, the SPSC job ring and seqlocks); no qrt::log, and no system call
// but the io_uring ring's, the futex sleep, the vDSO clock reads and
// check_placement's affinity calls.  What the thread has to say goes out as
// records (the record ring) and relaxed counters (thread_stats()).  A change
// here that needs any of these belongs on the housekeeping side
// (dispatcher.cpp, qpu_link.cpp).

#include <liburing.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <optional>

#include "dispatcher_internal.hpp"
#include "qrt/dispatch/dispatcher.hpp"
#include "qrt/dispatch/guard.hpp"
#include "qrt/proto/wire_codec.hpp"

namespace qrt::dispatch {

using detail::cpu_relax;
using detail::spin_to;
using detail::phase_dropped;
using detail::phase_queued;
using detail::phase_sending;
using detail::phase_withdrawn;

namespace {

constexpr std::uint64_t no_offset = ~std::uint64_t{0};  // -1: current position / stream

}  // namespace

void dispatcher::apply_endpoint_update(std::int64_t now, const queued_job* head) noexcept {
    if (head != nullptr && _endpoint_up.load(std::memory_order_acquire)) {
        const std::int64_t deadline = _slots[head->slot].deadline_ns.load(std::memory_order_acquire);
        if (deadline - now <= _lead.lead_ns() + detail::endpoint_update_guard_ns) {
            return;  // a send is close: after it
        }
    }
    const std::uint32_t want = _fd_req_gen.load(std::memory_order_acquire);
    _fd_update_rc.store(register_endpoint(_pending_fd.load(std::memory_order_relaxed)), std::memory_order_relaxed);
    _registered_gen.store(want, std::memory_order_release);
    _fd_done_gen.store(want, std::memory_order_release);
    _st_endpoint_updates.fetch_add(1, std::memory_order_relaxed);
}

void dispatcher::emit(const queued_job& j, dispatch_status st, std::int64_t deadline, std::int64_t now,
                      std::int64_t wakeup_latency, std::int64_t spin_ns) noexcept {
    dispatch_record r;
    r.job_id = j.job_id;
    r.slot = j.slot;
    r.status = st;
    r.deadline_ns = deadline;
    r.lateness_ns = now - deadline;
    r.wakeup_latency_ns = wakeup_latency;
    r.spin_ns = spin_ns;
    r.lead_ns = _lead_ns_pub.load(std::memory_order_relaxed);
    r.endpoint_gen = _registered_gen.load(std::memory_order_relaxed);
    _records.try_push(r);  // capacity == slots: cannot be full
}

void dispatcher::reap_completions() noexcept {
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&_uring->ring, &cqe) == 0 && cqe != nullptr) {
        const std::uint64_t data = io_uring_cqe_get_data64(cqe);
        if (cqe->res == -EAGAIN) {
            _st_send_blocked.fetch_add(1, std::memory_order_relaxed);  // RWF_NOWAIT: buffer full at T
        } else if (cqe->res == -EOPNOTSUPP && _nowait_writes.load(std::memory_order_relaxed)) {
            // A file without FMODE_NOWAIT refuses RWF_NOWAIT: this job
            // fails, the next writes go without it.
            _nowait_writes.store(false, std::memory_order_relaxed);
        }
        if (const auto slot = static_cast<std::uint32_t>(data); slot < _slot_count) {
            dispatch_record r = _inflight[slot];
            if (r.status == dispatch_status::sent) {
                const std::int32_t expected = r.io_result;
                r.io_result = cqe->res;
                if (cqe->res != expected) {
                    r.status = dispatch_status::send_failed;
                }
            }  // else: voided after a failed submit (a NOP): keep the submit error
            _records.try_push(r);
        }
        io_uring_cqe_seen(&_uring->ring, cqe);
    }
}

void dispatcher::void_unsubmitted() noexcept {
    // Syscall mode only: nobody but this thread makes the kernel consume
    // SQEs, so the ones between the kernel's head and our tail stay put
    // while we rewrite them.  Each becomes a NOP with the same user_data:
    // its CQE still arrives (and frees the slot), the frame is never sent.
    io_uring_sq* sq = &_uring->ring.sq;
    const unsigned head = io_uring_smp_load_acquire(sq->khead);
    const unsigned tail = *sq->ktail;
    for (unsigned pos = head; pos != tail; ++pos) {
        io_uring_sqe* sqe = &sq->sqes[sq->array[pos & sq->ring_mask]];
        if (sqe->opcode == IORING_OP_NOP) {
            continue;  // voided by an earlier failure
        }
        const std::uint64_t data = sqe->user_data;
        io_uring_prep_nop(sqe);
        sqe->user_data = data;
        _st_voided.fetch_add(1, std::memory_order_relaxed);
    }
}

void dispatcher::pull_jobs() noexcept {
    const std::size_t capacity = 2 * _slot_count;
    std::optional<std::int64_t> offset;  // sampled once, for the first job the ring brings
    bool sampled = false;
    while (const queued_job* q = _jobs.peek()) {
        if (_pending_tail == capacity) {
            // At most slots jobs are pending (each holds a slot), so the
            // head has moved by at least slots: compact, rarely.
            std::copy(&_pending[_pending_head], &_pending[_pending_tail], &_pending[0]);
            _pending_tail -= _pending_head;
            _pending_head = 0;
        }
        std::int64_t d = _slots[q->slot].deadline_ns.load(std::memory_order_acquire);
        // Converted with a time base older than a step (the housekeeping
        // side has not re-sampled yet): convert it with the clocks as they
        // are, so it is sorted where it belongs.
        if (!sampled) {
            offset = sample_offset();
            sampled = true;
        }
        if (offset) {
            const std::int64_t now_conv = q->scheduled_rt_ns - *offset;
            if (d - now_conv > _cfg.step_follow_ns || now_conv - d > _cfg.step_follow_ns) {
                d = now_conv;
                _slots[q->slot].deadline_ns.store(d, std::memory_order_release);
            }
        }
        // After every job with the same or an earlier deadline: equal starts
        // keep submit order.
        std::size_t i = _pending_tail;
        while (i > _pending_head && _slots[_pending[i - 1].slot].deadline_ns.load(std::memory_order_relaxed) > d) {
            _pending[i] = _pending[i - 1];
            --i;
        }
        _pending[i] = *q;
        ++_pending_tail;
        _jobs.pop_front();
    }
}

std::optional<std::int64_t> dispatcher::sample_offset() const noexcept {
    // One monotonic/realtime/monotonic bracket (vDSO reads); one preempted
    // between its reads is not trusted (the caller looks again later).
    constexpr std::int64_t max_bracket_ns = 50'000;
    const std::int64_t m1 = _clock.now_monotonic_ns();
    const std::int64_t r = _clock.now_realtime_ns();
    const std::int64_t m2 = _clock.now_monotonic_ns();
    if (m2 - m1 < 0 || m2 - m1 > max_bracket_ns) {
        return std::nullopt;
    }
    return r - (m1 + (m2 - m1) / 2);
}

bool dispatcher::follow_realtime_step(const queued_job& j, std::int64_t deadline) noexcept {
    const std::optional<std::int64_t> offset = sample_offset();
    if (!offset) {
        return false;
    }
    const std::int64_t converted = j.scheduled_rt_ns - deadline;  // the offset j's deadline was made with
    if (*offset - converted <= _cfg.step_follow_ns && converted - *offset <= _cfg.step_follow_ns) {
        return false;
    }
    // A step nobody has re-converted for yet.  Every pending job is
    // converted again with the clocks as they are (one atomic store each;
    // the housekeeping side's re-conversion, when it comes, writes the same
    // deadlines within its sampling error), then the pending array is
    // sorted again: jobs converted with different stale bases may have been
    // out of order.  Insertion sort in place: nearly sorted, no allocation.
    for (std::size_t i = _pending_head; i < _pending_tail; ++i) {
        const queued_job& p = _pending[i];
        _slots[p.slot].deadline_ns.store(p.scheduled_rt_ns - *offset, std::memory_order_release);
    }
    const auto deadline_of = [this](const queued_job& q) noexcept {
        return _slots[q.slot].deadline_ns.load(std::memory_order_relaxed);
    };
    for (std::size_t i = _pending_head + 1; i < _pending_tail; ++i) {
        const queued_job q = _pending[i];
        const std::int64_t d = deadline_of(q);
        std::size_t k = i;
        while (k > _pending_head && deadline_of(_pending[k - 1]) > d) {
            _pending[k] = _pending[k - 1];
            --k;
        }
        _pending[k] = q;
    }
    _st_steps_followed.fetch_add(1, std::memory_order_relaxed);
    return true;
}

void dispatcher::drop_withdrawn(std::int64_t now) noexcept {
    std::size_t kept = _pending_head;
    for (std::size_t i = _pending_head; i < _pending_tail; ++i) {
        const queued_job j = _pending[i];
        slot_state& s = _slots[j.slot];
        std::uint8_t expected = phase_withdrawn;
        if (s.phase.compare_exchange_strong(expected, phase_dropped, std::memory_order_acq_rel)) {
            emit(j, dispatch_status::cancelled, s.deadline_ns.load(std::memory_order_relaxed), now, -1, 0);
            continue;
        }
        _pending[kept++] = j;  // order kept
    }
    _pending_tail = kept;
    if (_pending_head == _pending_tail) {
        _pending_head = _pending_tail = 0;
    }
}

void dispatcher::check_placement(std::int64_t now, bool force) noexcept {
    if (!_st_rt.load(std::memory_order_relaxed) || _cfg.dispatch_cpu < 0 ||
        _cfg.dispatch_cpu >= CPU_SETSIZE) {
        return;
    }
    if (!force && now - _placement_checked_ns < placement_check_ns) {
        return;
    }
    _placement_checked_ns = now;
    const int want = _cfg.dispatch_cpu;
    const auto want_bit = static_cast<std::size_t>(want);
    cpu_set_t cur;
    CPU_ZERO(&cur);
    const bool pinned = ::sched_getaffinity(0, sizeof cur, &cur) == 0 && CPU_COUNT(&cur) == 1 && CPU_ISSET(want_bit, &cur);
    bool fixed = pinned;
    if (!pinned) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(want_bit, &one);
        fixed = ::sched_setaffinity(0, sizeof one, &one) == 0;  // migrates this thread before it returns
        if (fixed) {
            _st_repinned.fetch_add(1, std::memory_order_relaxed);
        }
    }
    const int on = ::sched_getcpu();
    const bool fifo = (::sched_getscheduler(0) & ~SCHED_RESET_ON_FORK) == SCHED_FIFO;
    if (!pinned || !fifo) {
        _st_placement_lost.fetch_add(1, std::memory_order_relaxed);
    }
    _st_cpu_seen.store(on, std::memory_order_relaxed);
    _st_placement_ok.store(fixed && fifo && on == want, std::memory_order_relaxed);
    _st_placement_checks.fetch_add(1, std::memory_order_relaxed);
}

void dispatcher::send_head(const queued_job& j, std::int64_t deadline, std::int64_t now,
                           std::int64_t wakeup_latency, std::int64_t spin_ns, std::int64_t lead) noexcept {
    if (const dispatch_status verdict = claim_send(j, deadline, now); verdict != dispatch_status::sent) {
        emit(j, verdict, deadline, now, wakeup_latency, spin_ns);
        pending_pop();
        return;
    }
    std::int64_t sent_rt = 0;
    if (!prep_write(j, sent_rt)) {
        emit(j, dispatch_status::send_failed, deadline, now, wakeup_latency, spin_ns);
        pending_pop();
        return;
    }
    io_uring* ring = &_uring->ring;
    const bool sqpoll = _submit_mode == submit_mode::sqpoll;
    if (sqpoll && poller_asleep()) {
        _st_sqpoll_wakeups.fetch_add(1, std::memory_order_relaxed);  // io_uring_submit will enter
    }
    // Where this write sits in the SQ ring: after the submit, the kernel
    // has consumed it iff its head moved past this position.
    const unsigned write_pos = ring->sq.sqe_tail - 1;
    // syscall mode: io_uring_enter.  sqpoll mode: publish the tail, no
    // syscall unless the poller sleeps.
    const int rc = io_uring_submit(ring);
    _st_submits.fetch_add(1, std::memory_order_relaxed);
    const std::int64_t after = _clock.now_monotonic_ns();
    dispatch_record r = sent_record(j, deadline, after, sent_rt, wakeup_latency, spin_ns, lead);
    settle_submit(r, rc, write_pos, sqpoll);
    _inflight[j.slot] = r;
    pending_pop();
    if (sqpoll && rc >= 0) {
        // The poller (on this CPU by default) only runs while this thread
        // sleeps.  When the next job is too close for a sleep, block until
        // the poller has taken this write (bounded), or the frame would
        // wait for that next job's spin to end.
        if (const queued_job* nx = pending_head(); nx != nullptr) {
            const std::int64_t gap =
                _slots[nx->slot].deadline_ns.load(std::memory_order_relaxed) - _lead.lead_ns() - after;
            if (gap < detail::sqpoll_yield_below_ns) {
                __kernel_timespec ts{};
                ts.tv_nsec = std::clamp<std::int64_t>(gap, 10'000, detail::sqpoll_yield_below_ns);
                io_uring_cqe* cqe = nullptr;
                io_uring_wait_cqe_timeout(ring, &cqe, &ts);  // leaves the CQE for reap
                _st_sqpoll_yields.fetch_add(1, std::memory_order_relaxed);
            }
        }
    }
    reap_completions();  // inline completions (the usual case on a socket)
}

bool dispatcher::poller_asleep() const noexcept {
    const io_uring* ring = &_uring->ring;
    return (io_uring_smp_load_acquire(ring->sq.kflags) & IORING_SQ_NEED_WAKEUP) != 0;
}

void dispatcher::submit_leftovers() noexcept {
    io_uring* ring = &_uring->ring;
    if (io_uring_sq_ready(ring) != 0) {
        // SQEs a failed submit left (voided NOPs, or, in sqpoll mode,
        // entries a failed poller wake-up left waiting).
        if (_submit_mode != submit_mode::sqpoll || poller_asleep()) {
            io_uring_submit(ring);
        }
    }
}

void dispatcher::prewake_poller() noexcept {
    // Wake the poller before the last sleep, not at T: it runs (and clears
    // NEED_WAKEUP) while this thread sleeps, even on the same CPU, so the
    // send at T is a plain store to the SQ tail.  The sleep is <=
    // max_sleep_chunk_ns, below any sensible sqpoll_idle_ms, so it is still
    // awake at T.
    if (_submit_mode == submit_mode::sqpoll && poller_asleep()) {
        io_uring_enter(static_cast<unsigned>(_uring->ring.ring_fd), 0, 0, IORING_ENTER_SQ_WAKEUP, nullptr);
        _st_sqpoll_prewakes.fetch_add(1, std::memory_order_relaxed);
    }
}

void dispatcher::finish_on_stop() noexcept {
    // Stopping: queued jobs are cancelled; in-flight writes get a bounded
    // wait, then the ring teardown cancels them.
    pull_jobs();
    while (const queued_job* j = pending_head()) {
        emit(*j, dispatch_status::cancelled, _slots[j->slot].deadline_ns.load(std::memory_order_relaxed),
             _clock.now_monotonic_ns(), -1, 0);
        pending_pop();
    }
    io_uring* ring = &_uring->ring;
    io_uring_submit(ring);  // voided NOPs still in the SQ ring complete too
    __kernel_timespec ts{0, 200'000'000};
    io_uring_cqe* cqe = nullptr;
    while (io_uring_wait_cqe_timeout(ring, &cqe, &ts) == 0) {
        reap_completions();
    }
}

dispatch_status dispatcher::claim_send(const queued_job& j, std::int64_t deadline, std::int64_t now) noexcept {
    slot_state& s = _slots[j.slot];
    guard_input g;
    g.now_ns = now;
    g.deadline_ns = deadline;
    g.window_end_ns = deadline + j.window_end_rel_ns;
    g.duration_ns = j.duration_ns;
    g.tolerance_ns = j.tolerance_ns;
    g.job_calibration_id = j.calibration_id;
    // Bounded: a housekeeping writer preempted inside set_calibration()
    // must not hold the send; without a clean read the job is refused
    // as a calibration change (it cannot be proven current).
    const calibration_plan cal = calibration(64);
    g.current_calibration_id = cal.consistent ? cal.current : no_window_calibration_id;
    g.next_calibration_id = cal.consistent ? cal.next : no_window_calibration_id;
    g.scheduled_rt_ns = j.scheduled_rt_ns;
    g.calibration_switch_rt_ns = cal.switch_rt_ns;
    g.endpoint_up = _endpoint_up.load(std::memory_order_acquire);
    g.armed = s.armed.load(std::memory_order_acquire);
    dispatch_status verdict = check_before_send(g);
    if (verdict != dispatch_status::sent) {
        return verdict;
    }
    // The send and a withdraw() race through one compare-and-swap:
    // whichever wins decides, and the loser can tell.  (A restore()
    // flipping withdrawn back may make the first exchange fail
    // spuriously: bounded retries, then the job counts as withdrawn.)
    for (int tries = 0; tries < 4; ++tries) {
        std::uint8_t expected = phase_queued;
        if (s.phase.compare_exchange_strong(expected, phase_sending, std::memory_order_acq_rel)) {
            return dispatch_status::sent;
        }
        if (expected == phase_withdrawn &&
            s.phase.compare_exchange_strong(expected, phase_dropped, std::memory_order_acq_rel)) {
            break;  // withdrawn by the housekeeping side
        }
        if (expected == phase_dropped) {
            break;
        }
    }
    s.phase.store(phase_dropped, std::memory_order_release);
    return dispatch_status::cancelled;
}

bool dispatcher::prep_write(const queued_job& j, std::int64_t& sent_rt) noexcept {
    // The ring has 64 SQEs and at most one is ever unconsumed, so this
    // cannot fail; counted if it does.
    io_uring_sqe* sqe = io_uring_get_sqe(&_uring->ring);
    if (sqe == nullptr) {
        _st_sqe_exhausted.fetch_add(1, std::memory_order_relaxed);
        return false;
    }
    std::uint8_t* buf = slot_buffer(j.slot);
    sent_rt = _clock.now_realtime_ns();
    wire::patch_sent_ns(buf, sent_rt);
    if (_fixed_buffers) {
        io_uring_prep_write_fixed(sqe, 0, buf, j.frame_len, no_offset, 0);
    } else {
        io_uring_prep_write(sqe, 0, buf, j.frame_len, no_offset);  // untuned without locked memory
    }
    sqe->flags |= IOSQE_FIXED_FILE;
    if (_nowait_writes.load(std::memory_order_relaxed)) {
        sqe->rw_flags = RWF_NOWAIT;  // a full endpoint buffer fails now, never later
    }
    io_uring_sqe_set_data64(sqe, j.slot);
    return true;
}

dispatch_record dispatcher::sent_record(const queued_job& j, std::int64_t deadline, std::int64_t after,
                                        std::int64_t sent_rt, std::int64_t wakeup_latency, std::int64_t spin_ns,
                                        std::int64_t lead) const noexcept {
    dispatch_record r;
    r.job_id = j.job_id;
    r.slot = j.slot;
    r.status = dispatch_status::sent;
    r.io_result = static_cast<std::int32_t>(j.frame_len);  // expected, until the CQE
    r.deadline_ns = deadline;
    r.lateness_ns = after - deadline;
    r.sent_ns = sent_rt;
    r.wakeup_latency_ns = wakeup_latency;
    r.spin_ns = spin_ns;
    r.lead_ns = lead;
    r.endpoint_gen = _registered_gen.load(std::memory_order_relaxed);
    return r;
}

void dispatcher::settle_submit(dispatch_record& r, int rc, unsigned write_pos, bool sqpoll) noexcept {
    io_uring* ring = &_uring->ring;
    const auto consumed = [&]() noexcept {
        const unsigned head = io_uring_smp_load_acquire(ring->sq.khead);
        return static_cast<int>(head - write_pos) > 0;
    };
    if (!sqpoll && (rc < 0 || !consumed())) {
        // The enter failed or stopped short of this write (it may have
        // consumed older voided NOPs first): whatever it did not consume
        // must never go out with a later submit.
        _st_submit_errors.fetch_add(1, std::memory_order_relaxed);
        if (!consumed()) {
            void_unsubmitted();
            r.status = dispatch_status::send_failed;
            r.submit_error = rc < 0 ? rc : -EBUSY;
            r.io_result = r.submit_error;
        }
    } else if (rc < 0) {
        // sqpoll: the SQEs are published but the poller could not be
        // woken; the loop retries the wake-up.
        _st_submit_errors.fetch_add(1, std::memory_order_relaxed);
    }
}

}  // namespace qrt::dispatch
