#include "qrt/dispatch/qpu_link.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "qrt/log.hpp"

namespace qrt::dispatch {

namespace {

proto::endpoint_address parse_or_throw(const std::string& uri) {
    auto a = proto::parse_endpoint(uri);
    if (!a) {
        throw std::invalid_argument(a.err().message);
    }
    return *a;
}

qpu_link_config with_wire(qpu_link_config cfg) {
    if (cfg.wire_version != 1 && cfg.wire_version != 2) {
        throw std::invalid_argument("qpu link: wire version " + std::to_string(cfg.wire_version) + "; give 1 or 2");
    }
    cfg.dispatch.wire_version = cfg.wire_version;
    return cfg;
}

}  // namespace

qpu_link::qpu_link(event_loop& loop, rtcore::clock_source& clock, qpu_link_config cfg, qpu_link_callbacks cb)
    : _loop(loop),
      _clock(clock),
      _cfg(with_wire(std::move(cfg))),
      _cb(std::move(cb)),
      _addr(parse_or_throw(_cfg.endpoint)),
      _dispatcher(_cfg.dispatch, clock),
      _backoff(_cfg.backoff_initial),
      _hist(std::make_unique<dispatch_histograms>()) {
    _submitted.reserve(_dispatcher.slot_count());
    _adopting.reserve(_dispatcher.slot_count());
    _ids_in_flight.reserve(_dispatcher.slot_count());
    if (two_phase()) {
        _arm_lead_pub.store(_cfg.arm_lead_ns, std::memory_order_relaxed);
        if (_addr.kind == proto::endpoint_kind::file) {
            throw std::invalid_argument("qpu link: " + _addr.uri + ": wire version 2 needs a unix:// or tcp:// "
                                        "endpoint (two connections); a file:// endpoint speaks version 1");
        }
        // Not touched until used: the kernel backs only what programs fill.
        _payload_store = std::make_unique_for_overwrite<std::uint8_t[]>(_dispatcher.slot_count() *
                                                                         _cfg.dispatch.max_payload_bytes);
        _payload_free.reserve(_dispatcher.slot_count());
        for (std::size_t i = _dispatcher.slot_count(); i-- > 0;) {
            _payload_free.push_back(static_cast<std::uint32_t>(i));
        }
    }
}

qpu_link::~qpu_link() { stop(); }

rtcore::status qpu_link::start() {
    // A dispatcher in a group is run by the group's thread (dispatch_group.hpp).
    if (auto st = _dispatcher.group() != nullptr ? rtcore::ok() : _dispatcher.start(); !st) {
        return st;
    }
    auto t = _loop.add_timer(_cfg.poll_interval, _cfg.poll_interval, [this] { poll(); });
    if (!t) {
        _dispatcher.stop();
        return t.err();
    }
    _poll_timer = *t;
    _state = conn_state::idle;
    try_connect();
    return rtcore::ok();
}

void qpu_link::stop() {
    if (_state == conn_state::stopped) {
        return;
    }
    _dispatcher.stop();
    poll();  // records of what was sent or cancelled
    if (_poll_timer) {
        _loop.cancel_timer(*_poll_timer);
        _poll_timer.reset();
    }
    if (_connect_timer) {
        _loop.cancel_timer(*_connect_timer);
        _connect_timer.reset();
    }
    if (_hello_timer) {
        _loop.cancel_timer(*_hello_timer);
        _hello_timer.reset();
    }
    if (_fd_watched) {
        _loop.remove_fd(_fd.get());
        _fd_watched = false;
    }
    _dispatcher.clear_endpoint();
    _fd.reset();
    if (_fire_watched) {
        _loop.remove_fd(_fire_fd.get());
        _fire_watched = false;
    }
    _fire_fd.reset();
    _state = conn_state::stopped;
    adopt_submitted();
    std::vector<std::uint64_t> ids;
    for (const auto& [id, p] : _pending) {
        ids.push_back(id);
    }
    for (auto id : ids) {
        finish(id, job_state::failed, std::string(outcome::cancelled), "dispatcher stopped before the job finished");
    }
}

// ---- connection -----------------------------------------------------------

void qpu_link::schedule_connect() {
    if (_state == conn_state::stopped) {
        return;
    }
    _state = conn_state::idle;
    const auto delay = _backoff;
    _backoff = std::min(_backoff * 2, _cfg.backoff_max);
    auto t = _loop.add_timer(delay, std::chrono::nanoseconds{0}, [this] {
        _connect_timer.reset();
        try_connect();
    });
    if (t) {
        _connect_timer = *t;
    }
}

void qpu_link::try_connect() {
    if (_state == conn_state::stopped) {
        return;
    }
    auto att = proto::start_connect(_addr);
    if (!att) {
        if (_last_error != att.err().message) {
            log::warn("dispatch", "qpu {}: {} (retrying with backoff)", _cfg.dispatch.qpu_index,
                         att.err().message);
        }
        _last_error = att.err().message;
        report_down(att.err().message);
        schedule_connect();
        return;
    }
    _fd = std::move(att->fd);
    _reader.reset();
    // A FIFO only carries frames to the QPU side: no HELLO, no results (and
    // reading it back would return our own frames).
    _write_only = _addr.kind == proto::endpoint_kind::file && att->file_type == proto::file_endpoint_type::fifo;
    // Bound what a QPU that stops reading can leave queued to two full
    // frames: past that a frame fails at its T (RWF_NOWAIT, EAGAIN)
    // instead of waiting in a large buffer and reaching the QPU late.  Two,
    // so that a frame never fails half-written on a healthy connection (a
    // QPU runs one job at a time and reads the next long before its T).
    const int two_frames = static_cast<int>(2 * (wire::header_len + _cfg.dispatch.max_payload_bytes));
    if (_addr.kind == proto::endpoint_kind::tcp) {
        // Unsent bytes only: what is in flight to a live peer is not bounded.
        ::setsockopt(_fd.get(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &two_frames, sizeof(two_frames));
    } else if (_addr.kind == proto::endpoint_kind::unix_stream) {
        // A unix stream charges queued, unread frames to the sender's buffer.
        ::setsockopt(_fd.get(), SOL_SOCKET, SO_SNDBUF, &two_frames, sizeof(two_frames));
    }
    if (att->in_progress) {
        _state = conn_state::connecting;
        auto st = _loop.add_fd(_fd.get(), EPOLLOUT, [this](std::uint32_t) { on_connect_writable(); });
        if (!st) {
            drop_connection(std::string(outcome::endpoint_down), st.err().message);
            return;
        }
        _fd_watched = true;
        return;
    }
    send_hello();
}

void qpu_link::on_connect_writable() {
    if (auto st = proto::finish_connect(_fd.get(), _addr); !st) {
        drop_connection(std::string(outcome::endpoint_down), st.err().message);
        return;
    }
    _loop.remove_fd(_fd.get());
    _fd_watched = false;
    send_hello();
}

void qpu_link::send_hello() {
    _state = conn_state::hello;
    const int fd = _fd.get();
    if (two_phase()) {
        // Version 2: the control connection is the loop's alone (the
        // dispatch thread writes on the fire connection): non-blocking.
    } else if (_addr.kind != proto::endpoint_kind::file) {
        // The dispatch thread's io_uring writes need a blocking-mode socket
        // (O_NONBLOCK makes io_uring return -EAGAIN instead of waiting in
        // the kernel); this side reads with MSG_DONTWAIT.
        if (auto st = proto::set_nonblocking(fd, false); !st) {
            drop_connection(std::string(outcome::endpoint_down), st.err().message);
            return;
        }
    } else if (_write_only) {
        // A FIFO: io_uring refuses RWF_NOWAIT on a pipe, so the fd itself is
        // O_NONBLOCK; a write the reader's side cannot take at T fails with
        // -EAGAIN then (send_failed), never goes out late.
        if (auto st = proto::set_nonblocking(fd, true); !st) {
            drop_connection(std::string(outcome::endpoint_down), st.err().message);
            return;
        }
    }
    if (!_write_only) {  // a FIFO has nothing to watch
        auto st = _loop.add_fd(fd, EPOLLIN | EPOLLRDHUP, [this](std::uint32_t ev) { on_readable(ev); });
        if (!st) {
            if (_addr.kind == proto::endpoint_kind::file && st.err().code == EPERM) {
                // A character device that cannot be polled (like /dev/null):
                // write-only; no HELLO and no results.
                _write_only = true;
            } else {
                drop_connection(std::string(outcome::endpoint_down), st.err().message);
                return;
            }
        } else {
            _fd_watched = true;
        }
    }
    if (_write_only) {
        if (auto up = _dispatcher.set_endpoint_fd(fd); !up) {
            drop_connection(std::string(outcome::endpoint_down), up.err().message);
            return;
        }
        _state = conn_state::up;
        _live_gen = _dispatcher.endpoint_generation();
        _reported_down = false;
        _backoff = _cfg.backoff_initial;
        log::info("dispatch", "qpu {}: endpoint {} open (write-only: no results, its jobs end `sent`)", _cfg.dispatch.qpu_index,
                     _addr.uri);
        if (_cb.on_endpoint_state) {
            _cb.on_endpoint_state(true, "write_only");
        }
        return;
    }
    const auto hello = wire::encode_frame(wire::make_header(wire::frame_type::hello),
                                          _cfg.identity + " qpu=" + std::to_string(_cfg.dispatch.qpu_index) +
                                              (two_phase() ? " wire=2" : ""));
    const ssize_t n = _addr.kind == proto::endpoint_kind::file
                          ? ::write(fd, hello.data(), hello.size())
                          : ::send(fd, hello.data(), hello.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(hello.size())) {
        drop_connection(std::string(outcome::endpoint_down), std::string("send HELLO to ") + _addr.uri + ": " +
                                             (n < 0 ? std::strerror(errno) : "short write"));
        return;
    }
    auto t = _loop.add_timer(_cfg.hello_timeout, std::chrono::nanoseconds{0}, [this] {
        _hello_timer.reset();
        if (_state == conn_state::hello || _state == conn_state::fire_connecting ||
            _state == conn_state::fire_hello) {
            drop_connection(std::string(outcome::endpoint_down), "no HELLO from " + _addr.uri + " within " +
                                                 std::to_string(_cfg.hello_timeout.count()) + " ms");
        }
    });
    if (t) {
        _hello_timer = *t;
    }
}

void qpu_link::on_readable(std::uint32_t events) {
    if ((events & EPOLLOUT) != 0) {
        flush_control();
        if (!_fd.valid()) {
            return;
        }
    }
    std::uint8_t buf[16384];
    // Read what is there (bounded: a peer flooding us cannot starve the loop).
    for (int round = 0; round < 16; ++round) {
        ssize_t n = 0;
        if (_addr.kind == proto::endpoint_kind::file) {
            n = round == 0 ? ::read(_fd.get(), buf, sizeof(buf)) : -1;
            if (round != 0) {
                errno = EAGAIN;
            }
        } else {
            n = ::recv(_fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
        }
        if (n == 0) {
            drop_connection(std::string(outcome::endpoint_disconnected), _addr.uri + " closed the connection");
            return;
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                break;
            }
            drop_connection(std::string(outcome::endpoint_disconnected), std::string("read ") + _addr.uri + ": " + std::strerror(errno));
            return;
        }
        _reader.feed({buf, static_cast<std::size_t>(n)});
        while (auto f = _reader.next()) {
            handle_frame(std::move(*f));
            if (_state == conn_state::idle || _state == conn_state::stopped || !_fd.valid()) {
                return;  // handle_frame dropped the connection
            }
        }
        if (_reader.error() != wire::decode_status::ok) {
            ++_counters.endpoint_protocol_errors;
            drop_connection(std::string(outcome::endpoint_protocol_error),
                            std::string("bad frame from ") + _addr.uri + ": " + wire::to_string(_reader.error()));
            return;
        }
    }
    if ((events & (EPOLLHUP | EPOLLERR)) != 0 && _state != conn_state::idle) {
        drop_connection(std::string(outcome::endpoint_disconnected), _addr.uri + " hung up");
    }
}

void qpu_link::handle_frame(wire::frame&& f) {
    const auto type = static_cast<wire::frame_type>(f.hdr.type);
    if (_state == conn_state::hello) {
        if (type != wire::frame_type::hello) {
            ++_counters.endpoint_protocol_errors;
            drop_connection(std::string(outcome::endpoint_protocol_error),
                            std::string("expected HELLO from ") + _addr.uri + ", got " + wire::to_string(type));
            return;
        }
        if (f.hdr.version >= 2) {
            on_hello_v2(f);
            return;
        }
        if (two_phase()) {
            ++_counters.endpoint_protocol_errors;
            drop_connection(std::string(outcome::endpoint_protocol_error),
                            _addr.uri + " answered wire=2 with a version-1 HELLO (\"" + std::string(f.payload_text()) +
                                "\"): it speaks only version 1; set this QPU's wire = 1");
            return;
        }
        if (_hello_timer) {
            _loop.cancel_timer(*_hello_timer);
            _hello_timer.reset();
        }
        if (auto st = _dispatcher.set_endpoint_fd(_fd.get()); !st) {
            drop_connection(std::string(outcome::endpoint_down), st.err().message);
            return;
        }
        _state = conn_state::up;
        _live_gen = _dispatcher.endpoint_generation();
        _reported_down = false;
        _backoff = _cfg.backoff_initial;
        _consecutive_timeouts = 0;
        _last_error.clear();
        log::info("dispatch", "qpu {}: endpoint {} up ({})", _cfg.dispatch.qpu_index, _addr.uri,
                     std::string(f.payload_text()));
        if (_cb.on_endpoint_state) {
            _cb.on_endpoint_state(true, std::string(f.payload_text()));
        }
        return;
    }
    if (type == wire::frame_type::hello) {
        return;
    }
    if (two_phase() && handle_v2_frame(f)) {
        return;
    }
    if (type == wire::frame_type::job) {
        ++_counters.endpoint_protocol_errors;
        drop_connection(std::string(outcome::endpoint_protocol_error), _addr.uri + " sent a JOB frame");
        return;
    }
    if (type == wire::frame_type::error && f.hdr.job_id == 0) {
        ++_counters.endpoint_protocol_errors;
        drop_connection(std::string(outcome::endpoint_protocol_error),
                        _addr.uri + " reported a protocol error: " + std::string(f.payload_text()));
        return;
    }
    auto it = _pending.find(f.hdr.job_id);
    if (it == _pending.end()) {
        adopt_submitted();
        it = _pending.find(f.hdr.job_id);
    }
    if (it == _pending.end()) {
        ++_counters.stray_frames;  // e.g. a RESULT after its job timed out
        return;
    }
    if (it->second.phase == job_phase::queued) {
        it->second.early_answer = std::move(f);  // the record is still on its way
        return;
    }
    answer(it->second, std::move(f));
}

void qpu_link::answer(pending_job& p, wire::frame&& f) {
    _consecutive_timeouts = 0;
    const std::uint64_t id = p.job.job_id;
    if (f.hdr.arrival_ns != 0) {
        _hist->arrival_lateness.record(f.hdr.arrival_ns - p.job.scheduled_ns);
    }
    if ((f.hdr.flags & QRT_WIRE_FLAG_OUT_OF_WINDOW) != 0 || f.hdr.status == QRT_WIRE_ERR_OUT_OF_WINDOW) {
        ++_counters.qpu_out_of_window;
    }
    if (static_cast<wire::frame_type>(f.hdr.type) == wire::frame_type::result) {
        ++_counters.completed;
        if (f.hdr.version >= 2 && f.v2.started_ns != 0) {
            _hist->start_lateness.record(f.v2.started_ns - p.job.scheduled_ns);
        }
        finish(id, job_state::completed, "ok", "", &f.hdr, std::move(f.payload));
        return;
    }
    ++_counters.endpoint_errors;
    std::string detail(f.payload_text());
    if (f.hdr.version >= 2 && f.v2.stage != QRT_WIRE_STAGE_NONE && f.v2.stage < proto::wire_stages.size()) {
        detail = "stage " + std::string(proto::wire_stages[f.v2.stage]) + ": " + detail;
    }
    finish(id, job_state::failed, std::string(outcome_for_wire_error(f.hdr.status)), std::move(detail), &f.hdr);
}

void qpu_link::report_down(const std::string& why) {
    if (_reported_down) {
        return;
    }
    _reported_down = true;
    if (_cb.on_endpoint_state) {
        _cb.on_endpoint_state(false, why);
    }
}

void qpu_link::drop_connection(const std::string& reason, const std::string& detail) {
    const bool was_up = _state == conn_state::up;
    _dispatcher.clear_endpoint();
    _live_gen = 0;
    // Frames the dispatch thread sent before this point went to the old
    // connection: their records may still be in the ring, so remember when
    // and why the connection went (on_record fails them on arrival).
    _last_drop_reason = reason;
    _last_drop_detail = detail;
    if (_fd.valid()) {
        if (_addr.kind != proto::endpoint_kind::file) {
            ::shutdown(_fd.get(), SHUT_RDWR);  // completes any write the kernel still holds
        }
        if (_fd_watched) {
            _loop.remove_fd(_fd.get());
            _fd_watched = false;
        }
        _fd.reset();
    }
    if (_hello_timer) {
        _loop.cancel_timer(*_hello_timer);
        _hello_timer.reset();
    }
    if (_fire_fd.valid()) {
        ::shutdown(_fire_fd.get(), SHUT_RDWR);
        if (_fire_watched) {
            _loop.remove_fd(_fire_fd.get());
            _fire_watched = false;
        }
        _fire_fd.reset();
    }
    _out.clear();
    _out_off = 0;
    _out_watched = false;
    _arms_out = 0;
    // What was armed on the lost connection is armed no more: re-armed
    // after the reconnect if its T allows, never fired meanwhile.
    for (auto& [id, p] : _pending) {
        if (p.phase == job_phase::queued && p.arm != arm_phase::none) {
            p.was_armed = p.was_armed || p.arm == arm_phase::armed;
            p.arm = arm_phase::none;
            _dispatcher.set_armed(id, false);
            tell_arm(id, arm_event::unarmed);
        }
    }
    _last_error = detail;
    if (was_up) {
        ++_counters.endpoint_disconnects;
        log::warn("dispatch", "qpu {}: endpoint {} lost: {} ({})", _cfg.dispatch.qpu_index, _addr.uri, reason,
                     detail);
    }
    report_down(reason + ": " + detail);
    // Jobs already on the wire cannot be answered on a new connection.
    std::vector<std::uint64_t> lost;
    for (const auto& [id, p] : _pending) {
        if (p.phase == job_phase::sent) {
            lost.push_back(id);
        }
    }
    for (auto id : lost) {
        finish(id, job_state::failed, reason, detail);
    }
    if (_state != conn_state::stopped) {
        if (was_up) {
            ++_counters.reconnects;
        }
        schedule_connect();
    }
}

// ---- jobs -----------------------------------------------------------------

rtcore::status qpu_link::submit(const dispatch_job& job, std::span<const std::uint8_t> payload) {
    const submit_refusal r = try_submit(job, payload);
    if (r == submit_refusal::none) {
        return rtcore::ok();
    }
    const bool busy = r == submit_refusal::no_free_slot || r == submit_refusal::ring_full;
    return rtcore::error{busy ? EBUSY : EINVAL, describe_refusal(r, job, payload.size())};
}

submit_refusal qpu_link::try_submit(const dispatch_job& job, std::span<const std::uint8_t> payload) noexcept {
    std::lock_guard<rtcore::pi_mutex> lk(_submit_mutex);
    // Queued or in flight: adopted (the set, filled by the loop) or not yet
    // (at most a slot count of entries to look through).
    const bool queued_already =
        _ids_in_flight.count(job.job_id) != 0 ||
        std::any_of(_submitted.begin(), _submitted.end(),
                    [&](const submitted_job& j) { return j.job.job_id == job.job_id; });
    if (queued_already) {
        _rejected_submits.fetch_add(1, std::memory_order_relaxed);
        return submit_refusal::already_queued;
    }
    if (_submitted.size() == _submitted.capacity()) {  // cannot happen: one entry per slot
        _rejected_submits.fetch_add(1, std::memory_order_relaxed);
        return submit_refusal::no_free_slot;
    }
    if (two_phase() && (_payload_free.empty() || payload.size() > _cfg.dispatch.max_payload_bytes)) {
        _rejected_submits.fetch_add(1, std::memory_order_relaxed);
        return _payload_free.empty() ? submit_refusal::no_free_slot : submit_refusal::payload_too_large;
    }
    // Under the lock, so the loop cannot see this job's record (or its
    // RESULT) before the job itself: adopt_submitted() waits for us.
    if (const auto r = _dispatcher.try_submit(job, payload); r != submit_refusal::none) {
        _rejected_submits.fetch_add(1, std::memory_order_relaxed);
        return r;
    }
    _submitted_total.fetch_add(1, std::memory_order_relaxed);
    submitted_job s;
    s.job = job;
    if (two_phase()) {  // the program goes out in ARM, from the link's store
        s.payload_buf = _payload_free.back();
        _payload_free.pop_back();
        s.payload_len = static_cast<std::uint32_t>(payload.size());
        if (!payload.empty()) {
            std::memcpy(_payload_store.get() + std::size_t{s.payload_buf} * _cfg.dispatch.max_payload_bytes,
                        payload.data(), payload.size());
        }
    }
    _submitted.push_back(s);  // within the capacity reserved at construction
    return submit_refusal::none;
}

void qpu_link::adopt_submitted() {
    {
        std::lock_guard<rtcore::pi_mutex> lk(_submit_mutex);
        if (_submitted.empty()) {
            return;
        }
        _adopting.swap(_submitted);  // both keep their capacity
        // In the set before the lock is let go: a repeat submit of these
        // ids is refused from now on.
        for (const auto& j : _adopting) {
            _ids_in_flight.insert(j.job.job_id);
        }
    }
    for (const auto& j : _adopting) {
        pending_job p;
        p.job = j.job;
        p.payload_buf = j.payload_buf;
        p.payload_len = j.payload_len;
        _pending.emplace(j.job.job_id, std::move(p));
    }
    _adopting.clear();
}

void qpu_link::poll() {
    adopt_submitted();
    _dispatcher.drain_records([this](const dispatch_record& r) { on_record(r); });
    expire_timeouts();
    if (two_phase()) {
        arm_due();
    }
}

void qpu_link::on_record(const dispatch_record& r) {
    if (r.wakeup_latency_ns >= 0) {
        _hist->wakeup_latency.record(r.wakeup_latency_ns);
    }
    _spin_ns_total += static_cast<std::uint64_t>(std::max<std::int64_t>(r.spin_ns, 0));
    auto it = _pending.find(r.job_id);
    if (it == _pending.end()) {
        adopt_submitted();  // submitted since this poll began
        it = _pending.find(r.job_id);
    }
    if (it == _pending.end()) {
        return;
    }
    pending_job& p = it->second;
    switch (r.status) {
    case dispatch_status::sent: {
        ++_sent_total;
        _hist->dispatch_lateness.record(r.lateness_ns);
        if (r.lateness_ns <= p.job.tolerance_ns) {
            ++_counters.on_time;
        } else {
            ++_counters.late;
        }
        p.phase = job_phase::sent;
        p.sent_ns = r.sent_ns;
        if (p.arm != arm_phase::none) {
            p.arm = arm_phase::none;  // fired: no longer held armed
            if (_arms_out > 0) {
                --_arms_out;
            }
            tell_arm(p.job.job_id, arm_event::fired);
        }
        p.lateness_ns = r.lateness_ns;
        if (r.endpoint_gen != _live_gen && !p.early_answer) {
            // Sent on a connection that has since been dropped (the loop may
            // have handled its EOF before this record): no answer can come.
            if (_cb.on_dispatched) {
                _cb.on_dispatched(p.job.job_id, r.sent_ns);
            }
            finish(r.job_id, job_state::failed, _last_drop_reason, _last_drop_detail);
            return;
        }
        p.result_due_mono_ns = r.deadline_ns + p.job.duration_ns + _cfg.result_timeout_ns;
        if (_cb.on_dispatched) {
            _cb.on_dispatched(p.job.job_id, r.sent_ns);
        }
        if (_write_only) {
            // Nobody can say that it ran: `sent`, never `completed`.
            ++_counters.sent;
            finish(r.job_id, job_state::sent, "sent",
                   "written on time to " + _addr.uri + ", a write-only endpoint: no result comes back");
            return;
        }
        if (p.early_answer) {
            wire::frame f = std::move(*p.early_answer);
            p.early_answer.reset();
            answer(p, std::move(f));
        }
        return;
    }
    case dispatch_status::missed:
        ++_counters.missed;
        finish(r.job_id, job_state::missed, std::string(outcome::missed),
               "start passed by " + std::to_string(r.lateness_ns) + " ns, more than the tolerance of " +
                   std::to_string(p.job.tolerance_ns) + " ns; not sent");
        return;
    case dispatch_status::calibration_changed:
        ++_counters.calibration_changed;
        finish(r.job_id, job_state::failed, std::string(outcome::calibration_changed),
               "calibration_id " + std::to_string(p.job.calibration_id) + " is no longer current (" +
                   std::to_string(_dispatcher.calibration_id()) + "); not sent");
        return;
    case dispatch_status::out_of_window:
        ++_counters.out_of_window;
        finish(r.job_id, job_state::failed, std::string(outcome::out_of_window),
               "sending at T+" + std::to_string(r.lateness_ns) + " ns would not end inside the window; not sent");
        return;
    case dispatch_status::endpoint_down:
        ++_counters.endpoint_down;
        if (p.was_armed) {
            finish(r.job_id, job_state::failed, std::string(outcome::endpoint_disconnected),
                   "armed on a connection to " + _addr.uri + " that was lost, and not armed again by T" +
                       (_last_error.empty() ? std::string() : " (" + _last_error + ")") + "; never fired");
            return;
        }
        finish(r.job_id, job_state::failed, std::string(outcome::endpoint_down),
               "endpoint " + _addr.uri + " was not connected at T" +
                   (_last_error.empty() ? std::string() : " (" + _last_error + ")") + "; not sent");
        return;
    case dispatch_status::send_failed: {
        ++_counters.send_failed;
        std::string detail;
        // Nothing of the frame was written in these two cases: the stream
        // is still in sync and the connection stays up.
        bool stream_intact = false;
        if (r.submit_error != 0) {
            detail = std::string("io_uring_enter failed (") + std::strerror(-r.submit_error) +
                     "): the write never reached the kernel; not sent";
            stream_intact = true;
        } else if (r.io_result == -EAGAIN) {
            // RWF_NOWAIT: the endpoint's buffer was full at T.
            detail = "endpoint " + _addr.uri + " could not take the frame at T (its socket buffer is full: " +
                     "the QPU side is not reading); not sent, and never sent late";
            stream_intact = true;
        } else if (r.io_result == -EOPNOTSUPP) {
            detail = "endpoint " + _addr.uri + " does not take non-blocking writes (RWF_NOWAIT); not sent, the "
                     "next frames go without it";
            stream_intact = true;
        } else if (r.io_result < 0) {
            detail = std::string("io_uring write: ") + std::strerror(-r.io_result);
        } else {
            detail = "io_uring write: short write of " + std::to_string(r.io_result) + " bytes";
        }
        finish(r.job_id, job_state::failed, std::string(outcome::send_failed), detail);
        // Drop the connection only when the failed write went to the current
        // one (a write to a connection dropped since then fails with EPIPE).
        if (!stream_intact && _state == conn_state::up && r.endpoint_gen == _live_gen) {
            drop_connection(std::string(outcome::send_failed), detail);  // the stream may be out of sync
        }
        return;
    }
    case dispatch_status::cancelled:
        if (p.arm != arm_phase::none) {
            send_disarm(p);  // withdrawn before FIRE: the endpoint lets go of it
        }
        finish(r.job_id, job_state::failed, std::string(outcome::cancelled), "withdrawn, or the dispatcher stopped, before T; not sent");
        return;
    case dispatch_status::not_armed:
        ++_not_armed;
        if (p.arm == arm_phase::arming) {
            // It took at least this long and did not make it: the lead rises.
            observe_arm(_clock.now_monotonic_ns() - p.arm_sent_mono_ns);
        }
        finish(r.job_id, job_state::missed, std::string(outcome::not_armed),
               std::string(p.arm == arm_phase::arming ? "ARM sent, no ARMED from " : "no ARM could be sent to ") +
                   _addr.uri + " by T; never fired");
        return;
    }
}

void qpu_link::expire_timeouts() {
    if (_pending.empty()) {
        return;
    }
    const std::int64_t now = _clock.now_monotonic_ns();
    std::vector<std::uint64_t> expired;
    for (const auto& [id, p] : _pending) {
        if (p.phase == job_phase::sent && now > p.result_due_mono_ns) {
            expired.push_back(id);
        }
    }
    for (auto id : expired) {
        ++_counters.endpoint_timeouts;
        ++_consecutive_timeouts;
        finish(id, job_state::failed, std::string(outcome::endpoint_timeout),
               "no RESULT from " + _addr.uri + " within " + std::to_string(_cfg.result_timeout_ns / 1'000'000) +
                   " ms after the job's end");
    }
    if (_cfg.stall_timeouts != 0 && _consecutive_timeouts >= _cfg.stall_timeouts && _state == conn_state::up) {
        _consecutive_timeouts = 0;
        drop_connection(std::string(outcome::endpoint_stalled), _addr.uri + " answered none of the last " +
                                                std::to_string(_cfg.stall_timeouts) + " jobs");
    }
}

void qpu_link::finish(std::uint64_t job_id, job_state st, std::string reason, std::string detail,
                      const wire::header* hdr, std::vector<std::uint8_t> result) {
    auto it = _pending.find(job_id);
    if (it == _pending.end()) {
        return;
    }
    dispatch_outcome o;
    o.job_id = job_id;
    o.qpu_index = _cfg.dispatch.qpu_index;
    o.state = st;
    o.reason = std::move(reason);
    o.detail = std::move(detail);
    o.scheduled_ns = it->second.job.scheduled_ns;
    o.sent_ns = it->second.sent_ns;
    o.dispatch_lateness_ns = it->second.lateness_ns;
    if (hdr != nullptr && hdr->arrival_ns != 0) {
        o.arrival_ns = hdr->arrival_ns;
        o.arrival_lateness_ns = hdr->arrival_ns - o.scheduled_ns;
    }
    o.result = std::move(result);
    if (st == job_state::failed) {
        ++_counters.failed;
    }
    if (it->second.arm != arm_phase::none && _arms_out > 0) {
        --_arms_out;  // its place at the endpoint is free
    }
    const std::uint32_t buf = it->second.payload_buf;
    _pending.erase(it);
    {
        std::lock_guard<rtcore::pi_mutex> lk(_submit_mutex);
        _ids_in_flight.erase(job_id);
        if (buf != no_payload_buf) {
            _payload_free.push_back(buf);  // capacity: one per slot
        }
    }
    if (_cb.on_outcome) {
        _cb.on_outcome(o);
    }
}

dispatch_telemetry qpu_link::telemetry() const {
    dispatch_telemetry t;
    t.qpu_index = _cfg.dispatch.qpu_index;
    t.tuned = _cfg.dispatch.mode == dispatch_mode::tuned;
    t.endpoint_up = _state == conn_state::up;
    t.lead_ns = _dispatcher.lead_ns();
    t.lead_min_ns = _cfg.dispatch.lead.min_ns;
    t.lead_max_ns = _cfg.dispatch.lead.max_ns;
    t.lead_capped = _dispatcher.thread_stats().lead_capped;
    t.spin_ns_total = _spin_ns_total;
    t.spin_ns_per_dispatch =
        _sent_total == 0 ? 0.0 : static_cast<double>(_spin_ns_total) / static_cast<double>(_sent_total);
    t.counters = _counters;
    t.counters.submitted = _submitted_total.load(std::memory_order_relaxed);
    t.counters.rejected_submits = _rejected_submits.load(std::memory_order_relaxed);
    t.dispatch_lateness = _hist->dispatch_lateness.summary();
    t.arrival_lateness = _hist->arrival_lateness.summary();
    t.wakeup_latency = _hist->wakeup_latency.summary();
    t.wire_version = _cfg.wire_version;
    t.arm_lead_ns = arm_lead_ns();
    t.arm_lead_floor_ns = _arm_lead_floor_ns;
    t.arms_sent = _arms_sent;
    t.armed = _armed_total;
    t.arm_refused = _arm_refused;
    t.not_armed = _not_armed;
    t.disarms_sent = _disarms_sent;
    t.arm_latency = _hist->arm_latency.summary();
    t.arm_cost = _hist->arm_cost.summary();
    t.start_lateness = _hist->start_lateness.summary();
    return t;
}

}  // namespace qrt::dispatch
