// The dispatcher: construction, start/stop (a dispatch group of one:
// dispatch_group.cpp owns every dispatch thread, its setup and its loop),
// lock_dispatch_path and the housekeeping side (submit, withdraw/restore,
// calibration, endpoint hand-over, stats).  The thread's steps for this
// dispatcher -- no allocation, no lock, no log -- are dispatcher_rt.cpp.

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

#include "dispatcher_internal.hpp"
#include "qrt/dispatch/dispatch_group.hpp"
#include "qrt/dispatch/guard.hpp"
#include "qrt/proto/wire_codec.hpp"
#include "qrt/log.hpp"
#include "rtcore/cpu_dma_latency.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/memory_lock.hpp"
#include "rtcore/rt_thread.hpp"

namespace qrt::dispatch {

using detail::cpu_relax;
using detail::phase_queued;
using detail::phase_sending;
using detail::phase_withdrawn;

namespace {

constexpr unsigned uring_entries = 64;
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

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }
static_assert(dispatcher::wire_header_bytes == wire::header_len, "frame_pool_bytes assumes the wire header size");
static_assert(dispatcher::wire_v2_header_bytes == wire::header_len_v2, "frame_pool_bytes assumes the v2 header size");

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
           "locks it.  Raise the limit (qrtd.service has LimitMEMLOCK=infinity; the container's memlock limit, "
           "ulimit -l; `qrtd run` started as root raises its own) or grant CAP_IPC_LOCK (a container without "
           "CAP_SYS_RESOURCE), or lower dispatch.ring_capacity or dispatch.max_payload_bytes";
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
    if (cfg.wire_version != 1 && cfg.wire_version != 2) {
        throw std::invalid_argument("dispatch: wire_version " + std::to_string(cfg.wire_version) + "; 1 or 2");
    }
    _slot_bytes = cfg.wire_version >= 2 ? round_up(wire::header_len_v2, 64)
                                        : round_up(wire::header_len + cfg.max_payload_bytes, 64);
    _pool_bytes = frame_pool_bytes(_slot_count, cfg.max_payload_bytes, cfg.wire_version);
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
            e.message += ": raise LimitMEMLOCK= or grant CAP_IPC_LOCK, or lower dispatch.ring_capacity or "
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
                                      (_own ? ": already running" : ": served by a dispatch group: start the group"));
    }
    // A lone QPU is a group of one: the one owner of a dispatch thread.
    try {
        _own = std::make_unique<dispatch_group>(std::vector<dispatcher*>{this});
    } catch (const std::exception& e) {
        return rtcore::error::invalid("dispatch: qpu " + std::to_string(_cfg.qpu_index) + ": " + e.what());
    }
    if (auto st = _own->start(); !st) {
        _own.reset();
        return st;
    }
    return rtcore::ok();
}

void dispatcher::stop() noexcept {
    if (_own) {
        _own->stop();
        _own.reset();  // back to no group: _wakeup is _wake again
    }
}

bool dispatcher::running() const noexcept { return _own != nullptr && _own->running(); }

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

    std::uint8_t* buf = slot_buffer(slot);
    std::uint32_t frame_len = 0;
    if (_cfg.wire_version >= 2) {
        // FIRE: the header only, naming the armed job (no flags: they went
        // out with its ARM).
        const wire::header_v2 f = wire::header_v2_for(job, wire::frame_type::fire);
        wire::encode_header(f, buf);
        frame_len = static_cast<std::uint32_t>(wire::header_len_v2);
    } else {
        wire::header h = wire::header_for(job);
        h.flags = _cfg.frame_flags;
        h.payload_len = static_cast<std::uint32_t>(payload.size());
        wire::encode_header(h, buf);
        if (!payload.empty()) {
            std::memcpy(buf + wire::header_len, payload.data(), payload.size());
        }
        frame_len = static_cast<std::uint32_t>(wire::header_len + payload.size());
    }

    slot_state& s = _slots[slot];
    s.scheduled_rt_ns = job.scheduled_ns;
    s.job_id = job.job_id;
    s.queued = true;
    s.armed.store(_cfg.wire_version < 2, std::memory_order_relaxed);  // version 1: the JOB carries the program
    s.phase.store(phase_queued, std::memory_order_relaxed);  // published by the ring push
    s.deadline_ns.store(_base.to_monotonic_ns(job.scheduled_ns), std::memory_order_release);

    queued_job q;
    q.slot = slot;
    q.frame_len = frame_len;
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
    const std::uint32_t seq = _cal_seq.load(std::memory_order_relaxed);
    _cal_seq.store(seq + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    _cal_current.store(current_id, std::memory_order_relaxed);
    _cal_next.store(next_id, std::memory_order_relaxed);
    _cal_switch_rt_ns.store(switch_rt_ns, std::memory_order_relaxed);
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
        p.switch_rt_ns = _cal_switch_rt_ns.load(std::memory_order_relaxed);
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

bool dispatcher::set_armed(std::uint64_t job_id, bool armed) noexcept {
    std::lock_guard<rtcore::pi_mutex> lk(_hk_mutex);
    for (std::size_t i = 0; i < _slot_count; ++i) {
        if (_slots[i].queued && _slots[i].job_id == job_id) {
            _slots[i].armed.store(armed || _cfg.wire_version < 2, std::memory_order_release);
            return true;
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

}  // namespace qrt::dispatch
