#include "qrt/dispatch/dispatcher.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <tuple>

#include "dispatcher_uring.hpp"
#include "qrt/dispatch/guard.hpp"
#include "qrt/dispatch/wire_codec.hpp"
#include "qrt/log.hpp"
#include "rtcore/cpu_dma_latency.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/memory_lock.hpp"
#include "rtcore/rt_thread.hpp"

namespace qrt::dispatch {

namespace {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

constexpr unsigned uring_entries = 64;
constexpr std::uint64_t no_offset = ~std::uint64_t{0};  // -1: current position / stream
// sqpoll: after a send, wait for the poller to take the write when the next
// job's wake-up is closer than this (the thread would not sleep before it).
constexpr std::int64_t sqpoll_yield_below_ns = 200'000;
// The lead's window quantile is taken after a send only when the next job's
// wake-up is at least this far away.
constexpr std::int64_t adapt_guard_ns = 50'000;
// The thread applies an endpoint update only when its next send is further
// away than lead + this (the io_uring_register call takes microseconds).
constexpr std::int64_t endpoint_update_guard_ns = 200'000;
// How long set_endpoint_fd() waits for the dispatch thread to apply it.
constexpr auto endpoint_update_wait = std::chrono::milliseconds(500);

// "SqThread:\t<tid>" from /proc/self/fdinfo/<ring fd>; 0 if absent.  Until
// the poller has run, the kernel reports the creating task there: wait
// (bounded) for the poller's own TID.
pid_t read_sqpoll_tid(int ring_fd) {
    const auto read_once = [ring_fd]() -> pid_t {
        std::ifstream in("/proc/self/fdinfo/" + std::to_string(ring_fd));
        std::string line;
        while (std::getline(in, line)) {
            if (line.rfind("SqThread:", 0) == 0) {
                try {
                    return static_cast<pid_t>(std::stol(line.substr(9)));
                } catch (...) {
                    return 0;
                }
            }
        }
        return 0;
    };
    const pid_t self = ::gettid();
    for (int i = 0; i < 500; ++i) {
        const pid_t tid = read_once();
        if (tid > 0 && tid != self) {
            return tid;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return 0;
}

// RWF_NOWAIT is useful for sockets and character devices: a full buffer
// fails the write with -EAGAIN instead of parking it (io-wq or poll) and
// sending it late.  A file without FMODE_NOWAIT answers -EOPNOTSUPP once;
// the writes after it go without the flag (reap_completions).  An fd opened
// O_NONBLOCK (qpu_link's FIFOs: a pipe refuses RWF_NOWAIT from io_uring)
// already fails a full write with -EAGAIN, and needs no flag.
bool nowait_capable(int fd) noexcept {
    struct stat st {};
    const int fl = fd >= 0 ? ::fcntl(fd, F_GETFL) : -1;
    return fl >= 0 && (fl & O_NONBLOCK) == 0 && ::fstat(fd, &st) == 0 &&
           (S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode));
}

// slot_state::phase values.
constexpr std::uint8_t phase_queued = 0;
constexpr std::uint8_t phase_withdrawn = 1;
constexpr std::uint8_t phase_sending = 2;
constexpr std::uint8_t phase_dropped = 3;

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }
static_assert(dispatcher::wire_header_bytes == wire::header_len, "frame_pool_bytes assumes the wire header size");

}  // namespace

const char* to_string(submit_mode m) noexcept {
    switch (m) {
        case submit_mode::syscall:
            return "syscall";
        case submit_mode::sqpoll:
            return "sqpoll";
    }
    return "?";
}

std::string frame_pool_shortfall(std::uint64_t pool_bytes, std::size_t qpus,
                                 const rtcore::memlock_allowance& allowance) {
    const std::uint64_t need = pool_bytes * std::max<std::size_t>(qpus, 1);
    if (allowance.covers(need)) {
        return "";
    }
    return allowance.describe() + ", " + rtcore::mib_text(need) + " needed: the dispatch frame pool (" +
           rtcore::mib_text(pool_bytes) + (qpus > 1 ? " for each of " + std::to_string(qpus) + " QPUs" : "") +
           ", sized by dispatch.ring_capacity and dispatch.max_payload_bytes) is registered with io_uring, which "
           "locks it.  Grant CAP_IPC_LOCK (qrtd.service has AmbientCapabilities=CAP_IPC_LOCK; a container must "
           "keep it) or raise the limit (LimitMEMLOCK=infinity in the unit, the container's memlock limit, "
           "ulimit -l), or lower dispatch.ring_capacity or dispatch.max_payload_bytes";
}

std::optional<submit_mode> parse_submit_mode(std::string_view s) noexcept {
    if (s == "syscall") {
        return submit_mode::syscall;
    }
    if (s == "sqpoll") {
        return submit_mode::sqpoll;
    }
    return std::nullopt;
}

dispatcher::dispatcher(const dispatcher_config& cfg, rtcore::clock_source& clock)
    : _cfg(cfg),
      _clock(clock),
      _base(rtcore::time_base::sample(clock)),
      _slot_count(cfg.slots),
      _jobs(cfg.slots),
      _records(cfg.slots),
      _lead(cfg.lead) {
    if (cfg.max_payload_bytes > wire::max_payload) {
        throw std::invalid_argument("dispatch: max_payload_bytes " + std::to_string(cfg.max_payload_bytes) +
                                    " exceeds the wire limit " + std::to_string(wire::max_payload));
    }
    _slot_bytes = round_up(wire::header_len + cfg.max_payload_bytes, 64);
    _pool_bytes = frame_pool_bytes(_slot_count, cfg.max_payload_bytes);
    // Registering the pool locks it: without CAP_IPC_LOCK it must fit
    // RLIMIT_MEMLOCK.  Tuned mode refuses (locked memory is what it
    // promises); untuned writes from unregistered buffers.
    if (auto why = frame_pool_shortfall(_pool_bytes, 1, rtcore::current_memlock_allowance()); !why.empty()) {
        if (cfg.mode == dispatch_mode::tuned) {
            throw std::runtime_error("dispatch: qpu " + std::to_string(cfg.qpu_index) +
                                     ": tuned mode cannot lock its frame pool: " + why +
                                     "; or run dispatch.mode = \"untuned\"");
        }
        _fixed_buffers = false;
        _buffers_fallback_reason = "frame buffers not registered with io_uring (plain writes): " + why;
    }
    void* p = ::mmap(nullptr, _pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
        const int err = errno;
        throw std::system_error(err, std::generic_category(),
                                "dispatch: mmap slot pool of " + std::to_string(_pool_bytes) + " bytes");
    }
    _pool = static_cast<std::uint8_t*>(p);
    _slots = std::make_unique<slot_state[]>(_slot_count);
    _inflight = std::make_unique<dispatch_record[]>(_slot_count);
    _pending = std::make_unique<queued_job[]>(2 * _slot_count);
    _free.reserve(_slot_count);
    for (std::size_t i = _slot_count; i-- > 0;) {
        _free.push_back(static_cast<std::uint32_t>(i));
    }
    _uring = std::make_unique<uring>();
    if (cfg.submit == submit_mode::sqpoll) {
        // The kernel poller thread is created here, on the housekeeping
        // thread, so it inherits SCHED_OTHER and never competes at RT
        // priority.  SQ_AFF pins it to sqpoll_cpu, or with -1 to the
        // dispatch CPU (it runs there while the RT thread sleeps).
        if (const int rc = init_sqpoll_ring(*_uring); rc == 0) {
            _submit_mode = submit_mode::sqpoll;
            _sqpoll_tid = read_sqpoll_tid(_uring->ring.ring_fd);
        } else {
            _submit_fallback_reason = sqpoll_failure(rc);
            // The kernel refuses an SQ_AFF CPU outside the creator's cpuset
            // (EINVAL), and a cgroup v1 partition keeps this thread out of
            // the isolated one.  The dispatch thread joins it first
            // (before_rt_setup) and tries again there, still SCHED_OTHER;
            // the daemon logs the reason if that fails too.
            _sqpoll_retry_on_thread = rc == -EINVAL && cfg.mode == dispatch_mode::tuned &&
                                      static_cast<bool>(cfg.before_rt_setup);
            if (!_sqpoll_retry_on_thread) {
                log::warn("dispatch", "qpu {}: {}", cfg.qpu_index, _submit_fallback_reason);
            }
        }
    }
    if (!_uring->inited) {
        if (int rc = io_uring_queue_init(uring_entries, &_uring->ring, 0); rc < 0) {
            ::munmap(_pool, _pool_bytes);
            throw std::system_error(-rc, std::generic_category(), "dispatch: io_uring_queue_init");
        }
        _uring->inited = true;
        _submit_mode = submit_mode::syscall;
    }
    if (auto st = register_ring(*_uring); !st) {
        _uring.reset();
        ::munmap(_pool, _pool_bytes);
        throw std::runtime_error("dispatch: " + st.err().message);  // the message names the errno already
    }
    _lead_ns_pub.store(_cfg.mode == dispatch_mode::tuned ? _lead.lead_ns() : 0, std::memory_order_relaxed);
}

dispatcher::~dispatcher() {
    stop();
    _uring.reset();  // waits for the kernel to drop the buffers
    if (_pool != nullptr) {
        ::munmap(_pool, _pool_bytes);
    }
}

int dispatcher::ring_fd() const noexcept { return _uring->ring.ring_fd; }

int dispatcher::init_sqpoll_ring(uring& u) const {
    const int poller_cpu = _cfg.sqpoll_cpu >= 0 ? _cfg.sqpoll_cpu : _cfg.dispatch_cpu;
    io_uring_params params{};
    params.flags = IORING_SETUP_SQPOLL;
    params.sq_thread_idle = _cfg.sqpoll_idle_ms;
    if (poller_cpu >= 0) {
        params.flags |= IORING_SETUP_SQ_AFF;
        params.sq_thread_cpu = static_cast<std::uint32_t>(poller_cpu);
    }
    const int rc = io_uring_queue_init_params(uring_entries, &u.ring, &params);
    u.inited = rc == 0;
    return rc;
}

std::string dispatcher::sqpoll_failure(int rc) const {
    const int poller_cpu = _cfg.sqpoll_cpu >= 0 ? _cfg.sqpoll_cpu : _cfg.dispatch_cpu;
    return "io_uring_queue_init_params(IORING_SETUP_SQPOLL" +
           std::string(poller_cpu >= 0 ? "|IORING_SETUP_SQ_AFF, sq_thread_cpu " + std::to_string(poller_cpu) : "") +
           ", sq_thread_idle " + std::to_string(_cfg.sqpoll_idle_ms) + " ms): " + std::strerror(-rc) +
           "; using syscall submission";
}

rtcore::status dispatcher::register_ring(uring& u) {
    iovec iov{_pool, _pool_bytes};
    if (int rc = _fixed_buffers ? io_uring_register_buffers(&u.ring, &iov, 1) : 0; rc < 0) {
        auto e = rtcore::error::from_errno(-rc, "io_uring_register_buffers (" + std::to_string(_pool_bytes) + " bytes)");
        if (rc != -ENOMEM && rc != -EPERM) {
            return e;
        }
        // The limit counts the locked memory of every process of this user,
        // so a pool that fits it alone can still be refused.
        const auto a = rtcore::current_memlock_allowance();
        e.message += " (" + a.describe() + ", shared by every process of this user; " +
                     rtcore::mib_text(_pool_bytes) + " needed)";
        if (_cfg.mode == dispatch_mode::tuned) {
            e.message += ": grant CAP_IPC_LOCK or raise LimitMEMLOCK=, or lower dispatch.ring_capacity or "
                         "dispatch.max_payload_bytes; or run dispatch.mode = \"untuned\"";
            return e;
        }
        _fixed_buffers = false;
        _buffers_fallback_reason = "frame buffers not registered with io_uring (plain writes): " + e.message;
    }
    if (int rc = io_uring_register_files_sparse(&u.ring, 1); rc < 0) {
        return rtcore::error::from_errno(-rc, "io_uring_register_files_sparse");
    }
    return rtcore::ok();
}

void dispatcher::retry_sqpoll_on_this_thread() {
    auto u = std::make_unique<uring>();
    const int rc = init_sqpoll_ring(*u);
    if (rc != 0) {
        _submit_fallback_reason += "; on the dispatch thread in its cpuset too: " + sqpoll_failure(rc);
        return;
    }
    if (auto st = register_ring(*u); !st) {
        _submit_fallback_reason += "; on the dispatch thread: " + st.err().message;
        return;
    }
    // No endpoint is registered yet: set_endpoint_fd() comes after start().
    _uring = std::move(u);
    _submit_mode = submit_mode::sqpoll;
    _sqpoll_tid = read_sqpoll_tid(_uring->ring.ring_fd);
    _submit_fallback_reason.clear();
}

std::uint8_t* dispatcher::slot_buffer(std::uint32_t slot) const noexcept {
    return _pool + static_cast<std::size_t>(slot) * _slot_bytes;
}

rtcore::status dispatcher::start() {
    if (_group != nullptr) {
        return rtcore::error::invalid("dispatch: qpu " + std::to_string(_cfg.qpu_index) +
                                      ": served by a dispatch group: start the group");
    }
    if (_thread.joinable()) {
        return rtcore::error::invalid("dispatch: qpu " + std::to_string(_cfg.qpu_index) + ": already running");
    }
    _stop.store(false, std::memory_order_release);
    _setup_done.store(0, std::memory_order_release);
    _thread = std::thread([this] { thread_main(); });
    // Wait (bounded) for the thread to report its setup.
    for (int i = 0; i < 5000 && _setup_done.load(std::memory_order_acquire) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const int st = _setup_done.load(std::memory_order_acquire);
    if (st < 0 && _cfg.require_rt) {
        stop();
        return rtcore::error{-st, "dispatch: qpu " + std::to_string(_cfg.qpu_index) +
                                      ": real-time setup of the dispatch thread: " + _setup_error};
    }
    return rtcore::ok();
}

void dispatcher::stop() noexcept {
    if (!_thread.joinable()) {
        return;
    }
    _stop.store(true, std::memory_order_release);
    rtcore::wake_sleepers(*_wakeup);
    _thread.join();
}

std::string dispatcher::describe_refusal(submit_refusal r, const dispatch_job& job, std::size_t payload_bytes) const {
    const std::string who = "dispatch: qpu " + std::to_string(_cfg.qpu_index) + ": job " + std::to_string(job.job_id);
    switch (r) {
        case submit_refusal::none: return who + ": queued";
        case submit_refusal::payload_too_large:
            return who + ": payload of " + std::to_string(payload_bytes) + " bytes exceeds max_payload_bytes " +
                   std::to_string(_cfg.max_payload_bytes);
        case submit_refusal::negative_times: return who + ": negative duration_ns or tolerance_ns";
        case submit_refusal::outside_window:
            return who + ": slot [" + std::to_string(job.scheduled_ns) + ", +" + std::to_string(job.duration_ns) +
                   "] is not inside its window [" + std::to_string(job.window_start_ns) + ", " +
                   std::to_string(job.window_end_ns) + "]";
        case submit_refusal::no_free_slot:
            return who + ": all " + std::to_string(_slot_count) + " dispatch slots are in use";
        case submit_refusal::ring_full: return who + ": job ring full";
        case submit_refusal::already_queued: return who + " is already queued";
    }
    return who + ": refused";
}

rtcore::status dispatcher::submit(const dispatch_job& job, std::span<const std::uint8_t> payload) {
    const submit_refusal r = try_submit(job, payload);
    if (r == submit_refusal::none) {
        return rtcore::ok();
    }
    const bool busy = r == submit_refusal::no_free_slot || r == submit_refusal::ring_full;
    return rtcore::error{busy ? EBUSY : EINVAL, describe_refusal(r, job, payload.size())};
}

submit_refusal dispatcher::try_submit(const dispatch_job& job, std::span<const std::uint8_t> payload) noexcept {
    if (payload.size() > _cfg.max_payload_bytes) {
        return submit_refusal::payload_too_large;
    }
    if (job.duration_ns < 0 || job.tolerance_ns < 0) {
        return submit_refusal::negative_times;
    }
    if (job.scheduled_ns < job.window_start_ns || job.scheduled_ns + job.duration_ns > job.window_end_ns) {
        return submit_refusal::outside_window;
    }
    std::lock_guard<rtcore::pi_mutex> lk(_hk_mutex);
    if (_free.empty()) {
        return submit_refusal::no_free_slot;
    }
    const std::uint32_t slot = _free.back();
    _free.pop_back();

    wire::header h = wire::header_for(job);
    h.flags = _cfg.frame_flags;
    h.payload_len = static_cast<std::uint32_t>(payload.size());
    std::uint8_t* buf = slot_buffer(slot);
    wire::encode_header(h, buf);
    if (!payload.empty()) {
        std::memcpy(buf + wire::header_len, payload.data(), payload.size());
    }

    slot_state& s = _slots[slot];
    s.scheduled_rt_ns = job.scheduled_ns;
    s.job_id = job.job_id;
    s.queued = true;
    s.phase.store(phase_queued, std::memory_order_relaxed);  // published by the ring push
    s.deadline_ns.store(_base.to_monotonic_ns(job.scheduled_ns), std::memory_order_release);

    queued_job q;
    q.slot = slot;
    q.frame_len = static_cast<std::uint32_t>(wire::header_len + payload.size());
    q.job_id = job.job_id;
    q.calibration_id = job.calibration_id;
    q.scheduled_rt_ns = job.scheduled_ns;
    q.tolerance_ns = job.tolerance_ns;
    q.window_end_rel_ns = job.window_end_ns - job.scheduled_ns;
    q.duration_ns = job.duration_ns;
    if (!_jobs.try_push(q)) {  // cannot happen: ring capacity == slot count
        s.queued = false;
        _free.push_back(slot);  // back where it was taken from: capacity is there
        return submit_refusal::ring_full;
    }
    // Before a job already queued: the thread may be asleep until that
    // one's wake-up, later than this one's.
    const std::size_t queued_now = _slot_count - _free.size();
    const bool before_queued = queued_now > 1 && job.scheduled_ns < _last_deadline_rt_ns;
    if (queued_now == 1 || job.scheduled_ns > _last_deadline_rt_ns) {
        _last_deadline_rt_ns = job.scheduled_ns;  // the latest queued start
    }
    // An idle thread looks at the ring once per idle_sleep_ns: wake it now
    // (the wake word makes this race-free against it going to sleep).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (before_queued || _idle.load(std::memory_order_relaxed)) {
        rtcore::wake_sleepers(*_wakeup);
    }
    return submit_refusal::none;
}

std::size_t dispatcher::queued() const noexcept {
    std::lock_guard<rtcore::pi_mutex> lk(_hk_mutex);
    return _slot_count - _free.size();
}

std::size_t dispatcher::on_realtime_step(const rtcore::time_base& base) {
    std::lock_guard<rtcore::pi_mutex> lk(_hk_mutex);
    _base = base;
    std::size_t n = 0;
    for (std::size_t i = 0; i < _slot_count; ++i) {
        slot_state& s = _slots[i];
        if (s.queued) {
            // One 64-bit atomic store: the RT thread sees the old or the new
            // deadline, never a mix.
            s.deadline_ns.store(base.to_monotonic_ns(s.scheduled_rt_ns), std::memory_order_release);
            ++n;
        }
    }
    if (n != 0) {
        rtcore::wake_sleepers(*_wakeup);  // a deadline may now be earlier than the thread's wake-up
    }
    return n;
}

void dispatcher::set_calibration(std::uint64_t current_id, std::uint64_t next_id,
                                 std::int64_t switch_rt_ns) noexcept {
    std::int64_t switch_mono = INT64_MAX;
    if (switch_rt_ns != INT64_MAX) {
        std::lock_guard<rtcore::pi_mutex> lk(_hk_mutex);
        switch_mono = _base.to_monotonic_ns(switch_rt_ns);
    }
    const std::uint32_t seq = _cal_seq.load(std::memory_order_relaxed);
    _cal_seq.store(seq + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    _cal_current.store(current_id, std::memory_order_relaxed);
    _cal_next.store(next_id, std::memory_order_relaxed);
    _cal_switch_mono_ns.store(switch_mono, std::memory_order_relaxed);
    _cal_seq.store(seq + 2, std::memory_order_release);
}

dispatcher::calibration_plan dispatcher::calibration(unsigned max_tries) const noexcept {
    calibration_plan p;
    for (unsigned tries = 0;; ++tries) {
        if (tries == max_tries) {
            p.consistent = false;
            return p;
        }
        const std::uint32_t before = _cal_seq.load(std::memory_order_acquire);
        if ((before & 1U) != 0) {
            cpu_relax();
            continue;
        }
        p.current = _cal_current.load(std::memory_order_relaxed);
        p.next = _cal_next.load(std::memory_order_relaxed);
        p.switch_mono_ns = _cal_switch_mono_ns.load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (_cal_seq.load(std::memory_order_relaxed) == before) {
            return p;
        }
    }
}

dispatcher::withdraw_result dispatcher::withdraw(std::uint64_t job_id) noexcept {
    std::lock_guard<rtcore::pi_mutex> lk(_hk_mutex);
    for (std::size_t i = 0; i < _slot_count; ++i) {
        if (_slots[i].queued && _slots[i].job_id == job_id) {
            std::uint8_t expected = phase_queued;
            if (_slots[i].phase.compare_exchange_strong(expected, phase_withdrawn, std::memory_order_acq_rel)) {
                // Seen at the thread's next look (report_withdrawn() makes
                // that now): it reports the job then, not at its T.
                _withdrawals.fetch_add(1, std::memory_order_release);
                return withdraw_result::withdrawn;
            }
            // Withdrawn or dropped before: never sent.  Sending: the frame is out.
            return expected == phase_sending ? withdraw_result::too_late : withdraw_result::withdrawn;
        }
    }
    return withdraw_result::not_queued;
}

bool dispatcher::restore(std::uint64_t job_id) noexcept {
    std::lock_guard<rtcore::pi_mutex> lk(_hk_mutex);
    for (std::size_t i = 0; i < _slot_count; ++i) {
        if (_slots[i].queued && _slots[i].job_id == job_id) {
            std::uint8_t expected = phase_withdrawn;
            return _slots[i].phase.compare_exchange_strong(expected, phase_queued, std::memory_order_acq_rel);
        }
    }
    return false;
}

std::optional<std::int64_t> dispatcher::queued_deadline_ns(std::uint64_t job_id) const noexcept {
    std::lock_guard<rtcore::pi_mutex> lk(_hk_mutex);
    for (std::size_t i = 0; i < _slot_count; ++i) {
        if (_slots[i].queued && _slots[i].job_id == job_id) {
            return _slots[i].deadline_ns.load(std::memory_order_acquire);
        }
    }
    return std::nullopt;
}

int dispatcher::register_endpoint(int fd) noexcept {
    int fds[1] = {fd};
    const int rc = io_uring_register_files_update(&_uring->ring, 0, fds, 1);
    _nowait_writes.store(rc >= 0 && nowait_capable(fd), std::memory_order_relaxed);
    return rc < 0 ? rc : 0;
}

std::uint32_t dispatcher::request_endpoint(int fd) noexcept {
    _pending_fd.store(fd, std::memory_order_relaxed);
    const std::uint32_t gen = _fd_req_gen.fetch_add(1, std::memory_order_acq_rel) + 1;
    rtcore::wake_sleepers(*_wakeup);
    return gen;
}

rtcore::status dispatcher::set_endpoint_fd(int fd) {
    const auto failed = [&](const int err, const std::string& what) {
        return rtcore::error::from_errno(err, "dispatch: qpu " + std::to_string(_cfg.qpu_index) + ": " + what +
                                                  " (endpoint fd " + std::to_string(fd) + ")");
    };
    if (!_loop_running.load(std::memory_order_acquire)) {
        const std::uint32_t gen = _fd_req_gen.fetch_add(1, std::memory_order_acq_rel) + 1;
        if (const int rc = register_endpoint(fd); rc < 0) {
            return failed(-rc, "io_uring_register_files_update");
        }
        _fd_done_gen.store(gen, std::memory_order_release);
        _registered_gen.store(gen, std::memory_order_release);
        _endpoint_up.store(true, std::memory_order_release);
        return rtcore::ok();
    }
    // The dispatch thread applies it (see the header: no ring lock taken
    // from here while it may be about to submit).
    const std::uint32_t gen = request_endpoint(fd);
    const auto give_up = std::chrono::steady_clock::now() + endpoint_update_wait;
    while (static_cast<std::int32_t>(_fd_done_gen.load(std::memory_order_acquire) - gen) < 0) {
        if (!_loop_running.load(std::memory_order_acquire)) {
            return set_endpoint_fd(fd);  // the thread stopped meanwhile: apply it here
        }
        if (std::chrono::steady_clock::now() > give_up) {
            // Withdraw the request: the thread must not register this fd
            // later, behind the caller's back.
            request_endpoint(-1);
            return failed(ETIMEDOUT, "the dispatch thread did not take the new endpoint within " +
                                         std::to_string(endpoint_update_wait.count()) + " ms");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (const int rc = _fd_update_rc.load(std::memory_order_relaxed); rc < 0) {
        return failed(-rc, "io_uring_register_files_update");
    }
    _endpoint_up.store(true, std::memory_order_release);
    return rtcore::ok();
}

void dispatcher::clear_endpoint() noexcept {
    _endpoint_up.store(false, std::memory_order_release);  // the guard sends nothing from now on
    if (!_loop_running.load(std::memory_order_acquire)) {
        const std::uint32_t gen = _fd_req_gen.fetch_add(1, std::memory_order_acq_rel) + 1;
        (void)register_endpoint(-1);
        _fd_done_gen.store(gen, std::memory_order_release);
        _registered_gen.store(gen, std::memory_order_release);
        return;
    }
    request_endpoint(-1);  // applied at once: nothing is sent while the endpoint is down
}

void dispatcher::apply_endpoint_update(std::int64_t now, const queued_job* head) noexcept {
    if (head != nullptr && _endpoint_up.load(std::memory_order_acquire)) {
        const std::int64_t deadline = _slots[head->slot].deadline_ns.load(std::memory_order_acquire);
        if (deadline - now <= _lead.lead_ns() + endpoint_update_guard_ns) {
            return;  // a send is close: after it
        }
    }
    const std::uint32_t want = _fd_req_gen.load(std::memory_order_acquire);
    _fd_update_rc.store(register_endpoint(_pending_fd.load(std::memory_order_relaxed)), std::memory_order_relaxed);
    _registered_gen.store(want, std::memory_order_release);
    _fd_done_gen.store(want, std::memory_order_release);
    _st_endpoint_updates.fetch_add(1, std::memory_order_relaxed);
}

void dispatcher::release_slot(std::uint32_t slot) noexcept {
    std::lock_guard<rtcore::pi_mutex> lk(_hk_mutex);
    if (slot < _slot_count && _slots[slot].queued) {
        _slots[slot].queued = false;
        _free.push_back(slot);  // capacity reserved: never reallocates
    }
}

dispatch_thread_stats dispatcher::thread_stats() const noexcept {
    dispatch_thread_stats s;
    s.loops = _st_loops.load(std::memory_order_relaxed);
    s.sleeps = _st_sleeps.load(std::memory_order_relaxed);
    s.submit_errors = _st_submit_errors.load(std::memory_order_relaxed);
    s.sqe_exhausted = _st_sqe_exhausted.load(std::memory_order_relaxed);
    s.deadline_reloads = _st_reloads.load(std::memory_order_relaxed);
    s.lead_capped = _st_lead_capped.load(std::memory_order_relaxed);
    s.submits = _st_submits.load(std::memory_order_relaxed);
    s.sqpoll_wakeups = _st_sqpoll_wakeups.load(std::memory_order_relaxed);
    s.sqpoll_prewakes = _st_sqpoll_prewakes.load(std::memory_order_relaxed);
    s.send_blocked = _st_send_blocked.load(std::memory_order_relaxed);
    s.voided_sqes = _st_voided.load(std::memory_order_relaxed);
    s.endpoint_updates = _st_endpoint_updates.load(std::memory_order_relaxed);
    s.early_wakes = _st_early_wakes.load(std::memory_order_relaxed);
    s.sqpoll_yields = _st_sqpoll_yields.load(std::memory_order_relaxed);
    s.steps_followed = _st_steps_followed.load(std::memory_order_relaxed);
    s.rt_applied = _st_rt.load(std::memory_order_relaxed);
    s.placement_checks = _st_placement_checks.load(std::memory_order_relaxed);
    s.placement_ok = _st_placement_ok.load(std::memory_order_relaxed);
    s.cpu_seen = _st_cpu_seen.load(std::memory_order_relaxed);
    s.placement_lost = _st_placement_lost.load(std::memory_order_relaxed);
    s.repinned = _st_repinned.load(std::memory_order_relaxed);
    s.mlocked = _st_mlocked.load(std::memory_order_relaxed);
    s.locked_bytes = _st_locked_bytes.load(std::memory_order_relaxed);
    s.dma_latency_held = _st_dma.load(std::memory_order_relaxed);
    s.setup_errno = _st_setup_errno.load(std::memory_order_relaxed);
    return s;
}

void dispatcher::thread_main() noexcept {
    // Setup (may allocate: it runs before the loop).  Failures are counted
    // and reported through thread_stats(); start() turns them into an error
    // when require_rt is set.
    // A write to an endpoint whose peer has gone raises SIGPIPE in the
    // thread that issues it (this one, for inline io_uring writes); keep it
    // blocked here so the write just completes with -EPIPE (send_failed).
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, nullptr);
    // A name the probes, ps and qrt-wakeup-trace can tell from the event loop.
    ::pthread_setname_np(::pthread_self(), "qrt-dispatch");
    std::optional<rtcore::scoped_rt_thread> rt;
    rtcore::cpu_dma_latency_hold dma;
    int setup_err = 0;
    try {
        if (_cfg.mode == dispatch_mode::tuned) {
            rtcore::rt_thread_config rc;
            rc.cpu = _cfg.dispatch_cpu;
            rc.policy = rtcore::sched_policy::fifo;
            rc.priority = _cfg.rt_priority;
            rc.timer_slack_ns = 1;
            // Not mlockall(MCL_FUTURE): that would lock every client
            // connection's buffers too.  The dispatch path is locked region
            // by region below (lock_dispatch_path).
            rc.lock_memory = false;
            auto entered = [&]() -> rtcore::result<rtcore::scoped_rt_thread> {
                if (_cfg.before_rt_setup) {
                    if (auto joined = _cfg.before_rt_setup(static_cast<pid_t>(::gettid())); !joined) {
                        return std::move(joined).err();
                    }
                }
                if (_sqpoll_retry_on_thread) {  // in the isolated cpuset now, still SCHED_OTHER
                    retry_sqpoll_on_this_thread();
                }
                return rtcore::scoped_rt_thread::enter(rc);
            }();
            if (entered) {
                rt.emplace(std::move(*entered));
                _st_rt.store(true, std::memory_order_relaxed);
                if (auto st = lock_dispatch_path(rc.prefault_stack_bytes); st) {
                    _st_mlocked.store(true, std::memory_order_relaxed);
                } else {
                    setup_err = st.err().code != 0 ? st.err().code : EPERM;
                    _setup_error = st.err().message;
                }
            } else {
                setup_err = entered.err().code != 0 ? entered.err().code : EPERM;
                _setup_error = entered.err().message;
            }
            if (_cfg.hold_cpu_dma_latency) {
                rtcore::host_fs fs = rtcore::host_fs::system();
                auto h = rtcore::cpu_dma_latency_hold::acquire(fs, 0);
                if (h) {
                    dma = std::move(*h);
                    _st_dma.store(dma.active(), std::memory_order_relaxed);
                } else if (setup_err == 0 && !_cfg.require_rt) {
                    // Reported (thread_stats, setup_error) but never fatal:
                    // require_rt is about SCHED_FIFO on the CPU, and a
                    // missing cpu_dma_latency hold only lets C-states deepen
                    // (agent.status shows cpu_dma_latency_held = false).
                    setup_err = h.err().code != 0 ? h.err().code : EPERM;
                    _setup_error = h.err().message;
                }
            }
        }
    } catch (...) {
        setup_err = ENOMEM;
    }
    _st_setup_errno.store(setup_err, std::memory_order_relaxed);
    const bool will_run = setup_err == 0 || !_cfg.require_rt;
    // Running before start() returns: a set_endpoint_fd() right after it
    // must hand the fd over, not take the ring lock itself.
    _loop_running.store(will_run, std::memory_order_release);
    _setup_done.store(setup_err == 0 ? 1 : -setup_err, std::memory_order_release);
    if (!will_run) {
        return;
    }
    check_placement(_clock.now_monotonic_ns(), true);
    run_loop();
    _loop_running.store(false, std::memory_order_release);
    _locked.clear();  // munlock what no other dispatcher holds
    _st_locked_bytes.store(0, std::memory_order_relaxed);
}

rtcore::status dispatcher::lock_dispatch_path(std::size_t stack_bytes) {
    // What the RT thread touches from here on, and nothing else: its stack
    // (and TLS), the code and static data it runs, this object (atomics,
    // the lead window, the wake word), its arrays, both rings' storage, the
    // frame pool and the io_uring rings.  Taken on this thread, after it
    // turned real-time; released when it ends.
    std::vector<rtcore::locked_region> held;
    std::size_t bytes = 0;
    const auto lock = [&](const void* p, std::size_t n, const char* what) -> rtcore::status {
        auto r = rtcore::lock_region(p, n, what);
        if (!r) {
            return std::move(r).err();
        }
        bytes += r->bytes();
        held.push_back(std::move(*r));
        return rtcore::ok();
    };
    auto stack = rtcore::lock_current_stack(stack_bytes);
    if (!stack) {
        return std::move(stack).err();
    }
    bytes += stack->bytes();
    held.push_back(std::move(*stack));
    auto code = rtcore::lock_mapped_code();
    if (!code) {
        return std::move(code).err();
    }
    for (auto& r : *code) {
        bytes += r.bytes();
        held.push_back(std::move(r));
    }
    const io_uring& ring = _uring->ring;
    for (const auto& [p, n, what] : std::initializer_list<std::tuple<const void*, std::size_t, const char*>>{
             {this, sizeof *this, "dispatcher"},
             {&_clock, sizeof _clock, "clock"},
             {_uring.get(), sizeof *_uring, "io_uring state"},
             {_pool, _pool_bytes, "frame pool"},
             {_slots.get(), _slot_count * sizeof(slot_state), "slots"},
             {_inflight.get(), _slot_count * sizeof(dispatch_record), "in-flight records"},
             {_pending.get(), 2 * _slot_count * sizeof(queued_job), "pending jobs"},
             {_jobs.storage(), _jobs.storage_bytes(), "job ring"},
             {_records.storage(), _records.storage_bytes(), "record ring"},
             {ring.sq.ring_ptr, ring.sq.ring_sz, "io_uring SQ ring"},
             {ring.cq.ring_ptr, ring.cq.ring_sz, "io_uring CQ ring"},
             {ring.sq.sqes, ring.sq.ring_entries * sizeof(io_uring_sqe), "io_uring SQEs"},
         }) {
        if (auto st = lock(p, n, what); !st) {
            return st;
        }
    }
    _locked = std::move(held);
    _st_locked_bytes.store(bytes, std::memory_order_relaxed);
    return rtcore::ok();
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

void dispatcher::run_loop() noexcept {
    const bool tuned = _cfg.mode == dispatch_mode::tuned;
    io_uring* ring = &_uring->ring;
    const bool sqpoll = _submit_mode == submit_mode::sqpoll;
    const auto poller_asleep = [ring]() noexcept {
        return (io_uring_smp_load_acquire(ring->sq.kflags) & IORING_SQ_NEED_WAKEUP) != 0;
    };
    std::uint32_t cur_slot = UINT32_MAX;
    std::int64_t first_seen = 0;
    std::uint32_t withdrawals_seen = 0;
    while (true) {
        // Read before looking at any state, _stop included: a change after
        // this makes the next sleep return at once.
        const std::uint32_t seen = _wake.load(std::memory_order_acquire);
        if (_stop.load(std::memory_order_acquire)) {
            break;
        }
        _st_loops.fetch_add(1, std::memory_order_relaxed);
        reap_completions();
        if (io_uring_sq_ready(ring) != 0) {
            // SQEs a failed submit left (voided NOPs, or, in sqpoll mode,
            // entries a failed poller wake-up left waiting).
            if (!sqpoll || poller_asleep()) {
                io_uring_submit(ring);
            }
        }
        // The count first: a job withdrawn by then was pushed before, so
        // pull_jobs() brings it into the pending array that is scanned.
        const std::uint32_t withdrawals = _withdrawals.load(std::memory_order_acquire);
        pull_jobs();
        std::int64_t now = _clock.now_monotonic_ns();
        if (withdrawals != withdrawals_seen) {
            withdrawals_seen = withdrawals;
            drop_withdrawn(now);
        }
        const queued_job* j = pending_head();
        if (_fd_req_gen.load(std::memory_order_acquire) != _fd_done_gen.load(std::memory_order_relaxed)) {
            apply_endpoint_update(now, j);
        }
        if (j == nullptr) {
            check_placement(now, false);
            _idle.store(true, std::memory_order_relaxed);
            std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with submit()'s fence
            if (_jobs.peek() == nullptr &&
                _clock.sleep_until_or_woken(now + _cfg.idle_sleep_ns, _wake, seen) == -EAGAIN) {
                _st_early_wakes.fetch_add(1, std::memory_order_relaxed);
            }
            _idle.store(false, std::memory_order_relaxed);
            continue;
        }
        slot_state& s = _slots[j->slot];
        const std::int64_t deadline = s.deadline_ns.load(std::memory_order_acquire);
        // Before the missed check: a time base older than a step makes a
        // job look missed (or not) by the size of the step.
        if (follow_realtime_step(*j, deadline)) {
            continue;
        }
        if (now - deadline > j->tolerance_ns) {
            emit(*j, dispatch_status::missed, deadline, now, -1, 0);
            pending_pop();
            continue;
        }
        if (j->slot != cur_slot) {  // first look at this job: the gap it leaves to T
            cur_slot = j->slot;
            first_seen = now;
        }
        std::int64_t lead = tuned ? _lead.lead_ns() : 0;
        // Spin budget: never spin more than max_spin_fraction of the gap
        // before T, so the thread always sleeps between jobs (a SCHED_FIFO
        // spin that never sleeps runs into RT throttling and starves the CPU).
        const auto budget = static_cast<std::int64_t>(static_cast<double>(deadline - first_seen) * _cfg.max_spin_fraction);
        if (lead > budget) {
            lead = std::max<std::int64_t>(budget, 0);
            _st_lead_capped.fetch_add(1, std::memory_order_relaxed);
        }
        const std::int64_t wake = deadline - lead;
        std::int64_t wakeup_latency = -1;
        if (now < wake) {
            const bool chunk = wake - now > _cfg.max_sleep_chunk_ns;
            const std::int64_t target = chunk ? now + _cfg.max_sleep_chunk_ns : wake;
            if (!chunk && sqpoll && poller_asleep()) {
                // Wake the poller before the last sleep, not at T: it runs
                // (and clears NEED_WAKEUP) while this thread sleeps, even on
                // the same CPU, so the send at T is a plain store to the SQ
                // tail.  The sleep is <= max_sleep_chunk_ns, below any
                // sensible sqpoll_idle_ms, so it is still awake at T.
                io_uring_enter(static_cast<unsigned>(ring->ring_fd), 0, 0, IORING_ENTER_SQ_WAKEUP, nullptr);
                _st_sqpoll_prewakes.fetch_add(1, std::memory_order_relaxed);
            }
            const int rc = _clock.sleep_until_or_woken(target, _wake, seen);
            _st_sleeps.fetch_add(1, std::memory_order_relaxed);
            if (rc == -EAGAIN) {  // a step, an endpoint change or stop(): look again
                _st_early_wakes.fetch_add(1, std::memory_order_relaxed);
                continue;
            }
            if (chunk) {
                continue;  // re-check stop, completions and the deadline
            }
            now = _clock.now_monotonic_ns();
            if (s.deadline_ns.load(std::memory_order_acquire) != deadline) {
                _st_reloads.fetch_add(1, std::memory_order_relaxed);
                continue;  // re-converted while asleep (realtime step)
            }
            if (follow_realtime_step(*j, deadline)) {
                continue;  // stepped while asleep, and nobody re-converted it yet
            }
            wakeup_latency = now - target;
            if (tuned) {
                _lead.observe(wakeup_latency);  // O(1); the quantile is taken after the send
                _lead_ns_pub.store(_lead.lead_ns(), std::memory_order_relaxed);
            }
        }
        std::int64_t spin_ns = 0;
        if (tuned && now < deadline) {
            const std::int64_t spin_start = now;
            bool moved = false;
            while (now < deadline) {
                cpu_relax();
                now = _clock.now_monotonic_ns();
                if (s.deadline_ns.load(std::memory_order_relaxed) != deadline) {
                    moved = true;
                    break;
                }
            }
            spin_ns = now - spin_start;
            if (moved) {
                _st_reloads.fetch_add(1, std::memory_order_relaxed);
                continue;
            }
        }
        guard_input g;
        g.now_ns = now;
        g.deadline_ns = deadline;
        g.window_end_ns = deadline + j->window_end_rel_ns;
        g.duration_ns = j->duration_ns;
        g.tolerance_ns = j->tolerance_ns;
        g.job_calibration_id = j->calibration_id;
        // Bounded: a housekeeping writer preempted inside set_calibration()
        // must not hold the send; without a clean read the job is refused
        // as a calibration change (it cannot be proven current).
        const calibration_plan cal = calibration(64);
        g.current_calibration_id = cal.consistent ? cal.current : no_window_calibration_id;
        g.next_calibration_id = cal.consistent ? cal.next : no_window_calibration_id;
        g.calibration_switch_ns = cal.switch_mono_ns;
        g.endpoint_up = _endpoint_up.load(std::memory_order_acquire);
        dispatch_status verdict = check_before_send(g);
        if (verdict == dispatch_status::sent) {
            // The send and a withdraw() race through one compare-and-swap:
            // whichever wins decides, and the loser can tell.  (A restore()
            // flipping withdrawn back may make the first exchange fail
            // spuriously: bounded retries, then the job counts as withdrawn.)
            verdict = dispatch_status::cancelled;
            for (int tries = 0; tries < 4; ++tries) {
                std::uint8_t expected = phase_queued;
                if (s.phase.compare_exchange_strong(expected, phase_sending, std::memory_order_acq_rel)) {
                    verdict = dispatch_status::sent;
                    break;
                }
                if (expected == phase_withdrawn &&
                    s.phase.compare_exchange_strong(expected, phase_dropped, std::memory_order_acq_rel)) {
                    break;  // withdrawn by the housekeeping side
                }
                if (expected == phase_dropped) {
                    break;
                }
            }
            if (verdict != dispatch_status::sent) {
                s.phase.store(phase_dropped, std::memory_order_release);
            }
        }
        if (verdict != dispatch_status::sent) {
            emit(*j, verdict, deadline, now, wakeup_latency, spin_ns);
            pending_pop();
            continue;
        }
        // The ring has 64 SQEs and at most one is ever unconsumed, so this
        // cannot fail; counted if it does.
        io_uring_sqe* sqe = io_uring_get_sqe(ring);
        if (sqe == nullptr) {
            _st_sqe_exhausted.fetch_add(1, std::memory_order_relaxed);
            emit(*j, dispatch_status::send_failed, deadline, now, wakeup_latency, spin_ns);
            pending_pop();
            continue;
        }
        std::uint8_t* buf = slot_buffer(j->slot);
        const std::int64_t sent_rt = _clock.now_realtime_ns();
        wire::patch_sent_ns(buf, sent_rt);
        if (_fixed_buffers) {
            io_uring_prep_write_fixed(sqe, 0, buf, j->frame_len, no_offset, 0);
        } else {
            io_uring_prep_write(sqe, 0, buf, j->frame_len, no_offset);  // untuned without locked memory
        }
        sqe->flags |= IOSQE_FIXED_FILE;
        if (_nowait_writes.load(std::memory_order_relaxed)) {
            sqe->rw_flags = RWF_NOWAIT;  // a full endpoint buffer fails now, never later
        }
        io_uring_sqe_set_data64(sqe, j->slot);
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
        dispatch_record r;
        r.job_id = j->job_id;
        r.slot = j->slot;
        r.status = dispatch_status::sent;
        r.io_result = static_cast<std::int32_t>(j->frame_len);  // expected, until the CQE
        r.deadline_ns = deadline;
        r.lateness_ns = after - deadline;
        r.sent_ns = sent_rt;
        r.wakeup_latency_ns = wakeup_latency;
        r.spin_ns = spin_ns;
        r.lead_ns = lead;
        r.endpoint_gen = _registered_gen.load(std::memory_order_relaxed);
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
        _inflight[j->slot] = r;
        pending_pop();
        if (sqpoll && rc >= 0) {
            // The poller (on this CPU by default) only runs while this
            // thread sleeps.  When the next job is too close for a sleep,
            // block until the poller has taken this write (bounded), or the
            // frame would wait for that next job's spin to end.
            if (const queued_job* nx = pending_head(); nx != nullptr) {
                const std::int64_t gap = _slots[nx->slot].deadline_ns.load(std::memory_order_relaxed) -
                                         _lead.lead_ns() - after;
                if (gap < sqpoll_yield_below_ns) {
                    __kernel_timespec ts{};
                    ts.tv_nsec = std::clamp<std::int64_t>(gap, 10'000, sqpoll_yield_below_ns);
                    io_uring_cqe* cqe = nullptr;
                    io_uring_wait_cqe_timeout(ring, &cqe, &ts);  // leaves the CQE for reap
                    _st_sqpoll_yields.fetch_add(1, std::memory_order_relaxed);
                }
            }
        }
        reap_completions();  // inline completions (the usual case on a socket)
        // The window's quantile (a few us of nth_element) only when the next
        // job leaves time for it, never just before a back-to-back T.
        const queued_job* next = pending_head();
        if (tuned && (next == nullptr || _slots[next->slot].deadline_ns.load(std::memory_order_relaxed) - after >
                                             _lead.lead_ns() + adapt_guard_ns)) {
            if (_lead.adapt()) {
                _lead_ns_pub.store(_lead.lead_ns(), std::memory_order_relaxed);
            }
        }
    }
    // Stopping: queued jobs are cancelled; in-flight writes get a bounded
    // wait, then the ring teardown cancels them.
    pull_jobs();
    while (const queued_job* j = pending_head()) {
        const std::int64_t now = _clock.now_monotonic_ns();
        emit(*j, dispatch_status::cancelled, _slots[j->slot].deadline_ns.load(std::memory_order_relaxed), now, -1,
             0);
        pending_pop();
    }
    io_uring_submit(ring);  // voided NOPs still in the SQ ring complete too
    __kernel_timespec ts{0, 200'000'000};
    io_uring_cqe* cqe = nullptr;
    while (io_uring_wait_cqe_timeout(ring, &cqe, &ts) == 0) {
        reap_completions();
    }
}

}  // namespace qrt::dispatch
