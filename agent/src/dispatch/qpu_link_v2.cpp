// The QPU link's wire version 2 (qpu_link.hpp): the capabilities HELLO, the
// fire connection, ARM / ARMED / DISARM on the control connection.  All on
// the event loop.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "qrt/dispatch/qpu_link.hpp"
#include "qrt/log.hpp"

namespace qrt::dispatch {

void qpu_link::on_hello_v2(const wire::frame& f) {
    if (!two_phase()) {
        ++_counters.endpoint_protocol_errors;
        drop_connection(std::string(outcome::endpoint_protocol_error),
                        _addr.uri + " answered a version-1 HELLO with version 2");
        return;
    }
    auto caps = wire::parse_capabilities(f.payload_text());
    if (!caps || !caps->two_phase) {
        ++_counters.endpoint_protocol_errors;
        drop_connection(std::string(outcome::endpoint_protocol_error),
                        _addr.uri + ": " + (caps ? std::string("its HELLO says two_phase false") : caps.err().message));
        return;
    }
    _caps = std::move(*caps);
    // The floor: what the daemon budgets and what the endpoint says it
    // needs; what was learned on an earlier connection is kept above it.
    _arm_lead_floor_ns = std::max(_cfg.arm_lead_ns, _caps.min_lead_ns);
    lead_config lc;
    lc.min_ns = _arm_lead_floor_ns;
    lc.max_ns = std::max<std::int64_t>(_arm_lead_floor_ns, 600'000'000'000);
    lc.initial_ns = std::max(_arm_lead_floor_ns, arm_lead_ns());
    lc.margin_ns = std::max<std::int64_t>(_arm_lead_floor_ns / 10, 5'000'000);
    lc.quantile = 0.99;
    lc.window = 32;
    _arm_lead = std::make_unique<lead_controller>(lc);
    publish_arm_lead(_arm_lead->lead_ns());
    start_fire_connection();
}

void qpu_link::start_fire_connection() {
    auto att = proto::start_connect(_addr);
    if (!att) {
        drop_connection(std::string(outcome::endpoint_down), "fire connection: " + att.err().message);
        return;
    }
    _fire_fd = std::move(att->fd);
    _fire_reader.reset();
    // FIREs are headers: bound what a stalled endpoint can leave queued to
    // a few of them, so a FIRE fails at its T instead of leaving late.
    const int few = static_cast<int>(8 * wire::header_len_v2);
    if (_addr.kind == proto::endpoint_kind::tcp) {
        ::setsockopt(_fire_fd.get(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &few, sizeof(few));
        const int one = 1;
        ::setsockopt(_fire_fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    } else {
        ::setsockopt(_fire_fd.get(), SOL_SOCKET, SO_SNDBUF, &few, sizeof(few));
    }
    _state = conn_state::fire_connecting;
    auto st = _loop.add_fd(_fire_fd.get(), att->in_progress ? EPOLLOUT : (EPOLLIN | EPOLLRDHUP),
                           [this](std::uint32_t ev) { on_fire_event(ev); });
    if (!st) {
        drop_connection(std::string(outcome::endpoint_down), "fire connection: " + st.err().message);
        return;
    }
    _fire_watched = true;
    if (!att->in_progress) {
        send_fire_hello();
    }
}

void qpu_link::send_fire_hello() {
    _state = conn_state::fire_hello;
    // The dispatch thread's io_uring writes need a blocking-mode socket
    // (RWF_NOWAIT makes a full buffer fail at T); this side reads with
    // MSG_DONTWAIT.
    if (auto st = proto::set_nonblocking(_fire_fd.get(), false); !st) {
        drop_connection(std::string(outcome::endpoint_down), "fire connection: " + st.err().message);
        return;
    }
    const auto hello =
        wire::encode_frame(wire::make_header_v2(wire::frame_type::hello), wire::fire_hello_json(_caps.session));
    const ssize_t n = ::send(_fire_fd.get(), hello.data(), hello.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(hello.size())) {
        drop_connection(std::string(outcome::endpoint_down), "send the fire connection's HELLO to " + _addr.uri + ": " +
                                                                 (n < 0 ? std::strerror(errno) : "short write"));
    }
}

void qpu_link::on_fire_event(std::uint32_t events) {
    if (_state == conn_state::fire_connecting) {
        if (auto st = proto::finish_connect(_fire_fd.get(), _addr); !st) {
            drop_connection(std::string(outcome::endpoint_down), "fire connection: " + st.err().message);
            return;
        }
        if (auto st = _loop.modify_fd(_fire_fd.get(), EPOLLIN | EPOLLRDHUP); !st) {
            drop_connection(std::string(outcome::endpoint_down), "fire connection: " + st.err().message);
            return;
        }
        send_fire_hello();
        return;
    }
    std::uint8_t buf[4096];
    const ssize_t n = ::recv(_fire_fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        drop_connection(std::string(outcome::endpoint_disconnected), _addr.uri + " closed the fire connection");
        return;
    }
    if (n > 0) {
        _fire_reader.feed({buf, static_cast<std::size_t>(n)});
        while (auto f = _fire_reader.next()) {
            if (_state != conn_state::fire_hello || f->hdr.type != QRT_WIRE_HELLO || f->hdr.version != 2) {
                ++_counters.endpoint_protocol_errors;
                drop_connection(std::string(outcome::endpoint_protocol_error),
                                _addr.uri + " sent " + wire::to_string(static_cast<wire::frame_type>(f->hdr.type)) +
                                    " on the fire connection, where only its HELLO comes back");
                return;
            }
            fire_up();
            if (_state != conn_state::up) {
                return;
            }
        }
        if (_fire_reader.error() != wire::decode_status::ok) {
            ++_counters.endpoint_protocol_errors;
            drop_connection(std::string(outcome::endpoint_protocol_error),
                            std::string("bad frame on the fire connection from ") + _addr.uri + ": " +
                                wire::to_string(_fire_reader.error()));
            return;
        }
    }
    if ((events & (EPOLLHUP | EPOLLERR)) != 0 && _fire_fd.valid()) {
        drop_connection(std::string(outcome::endpoint_disconnected), _addr.uri + " hung up the fire connection");
    }
}

void qpu_link::fire_up() {
    if (_hello_timer) {
        _loop.cancel_timer(*_hello_timer);
        _hello_timer.reset();
    }
    if (auto st = _dispatcher.set_endpoint_fd(_fire_fd.get()); !st) {
        drop_connection(std::string(outcome::endpoint_down), st.err().message);
        return;
    }
    _state = conn_state::up;
    _live_gen = _dispatcher.endpoint_generation();
    _reported_down = false;
    _backoff = _cfg.backoff_initial;
    _consecutive_timeouts = 0;
    _last_error.clear();
    log::info("dispatch", "qpu {}: endpoint {} up, wire version 2 ({}; max_armed {}, horizon {} ms, min lead {} ms)",
              _cfg.dispatch.qpu_index, _addr.uri, _caps.identity, _caps.max_armed, _caps.horizon_ns / 1'000'000,
              _caps.min_lead_ns / 1'000'000);
    if (_cb.on_endpoint_state) {
        _cb.on_endpoint_state(true, _caps.identity);
    }
    arm_due();
}

std::span<const std::uint8_t> qpu_link::payload_of(const pending_job& p) const noexcept {
    if (p.payload_buf == no_payload_buf) {
        return {};
    }
    return {_payload_store.get() + std::size_t{p.payload_buf} * _cfg.dispatch.max_payload_bytes, p.payload_len};
}

void qpu_link::arm_due() {
    if (_state != conn_state::up) {
        return;
    }
    adopt_submitted();
    const std::uint32_t max_armed = std::max<std::uint32_t>(_caps.max_armed, 1);
    const std::int64_t now_rt = _clock.now_realtime_ns();
    const std::int64_t now_mono = _clock.now_monotonic_ns();
    // Earliest start first: a burst beyond max_armed waits for places, the
    // soonest jobs take them.
    std::vector<pending_job*> due;
    for (auto& [id, p] : _pending) {
        if (p.phase == job_phase::queued && p.arm == arm_phase::none &&
            (_caps.horizon_ns <= 0 || p.job.scheduled_ns - now_rt <= _caps.horizon_ns)) {
            due.push_back(&p);
        }
    }
    std::sort(due.begin(), due.end(),
              [](const pending_job* a, const pending_job* b) { return a->job.scheduled_ns < b->job.scheduled_ns; });
    for (pending_job* p : due) {
        if (_arms_out >= max_armed) {
            break;
        }
        wire::header_v2 h = wire::header_v2_for(p->job, wire::frame_type::arm);
        h.v1.flags = _cfg.dispatch.frame_flags;
        h.v1.sent_ns = now_rt;
        queue_control(wire::encode_frame(h, payload_of(*p)));
        if (!_fd.valid()) {
            return;  // the write failed and dropped the connection
        }
        p->arm = arm_phase::arming;
        p->arm_sent_mono_ns = now_mono;
        ++_arms_out;
        ++_arms_sent;
        tell_arm(p->job.job_id, arm_event::arm_sent);
    }
}

void qpu_link::publish_arm_lead(std::int64_t lead_ns) {
    _arm_lead_pub.store(lead_ns, std::memory_order_relaxed);
    const std::int64_t extra = extra_lead_ns();
    if (extra != _extra_lead_told) {
        _extra_lead_told = extra;
        if (_cb.on_extra_lead) {
            _cb.on_extra_lead(extra);
        }
    }
}

void qpu_link::observe_arm(std::int64_t took_ns) {
    if (!_arm_lead) {
        return;
    }
    _arm_lead->observe(took_ns);
    _arm_lead->adapt();
    const std::int64_t lead = _arm_lead->lead_ns();
    publish_arm_lead(lead);
    if (lead > _cfg.arm_lead_ns && !_warned_arm_lead) {
        _warned_arm_lead = true;
        log::warn("dispatch", "qpu {}: endpoint {} needs an arm lead of {} ms (ARM -> ARMED, 99th percentile + "
                              "margin), more than this QPU's arm_lead_ns ({} ms): jobs handed over later than that "
                              "end not_armed; raise arm_lead_ns",
                  _cfg.dispatch.qpu_index, _addr.uri, lead / 1'000'000, _cfg.arm_lead_ns / 1'000'000);
    }
}

void qpu_link::tell_arm(std::uint64_t job_id, arm_event e) {
    if (_cb.on_arm) {
        _cb.on_arm(job_id, e);
    }
}

void qpu_link::send_disarm(const pending_job& p) {
    if (_state != conn_state::up) {
        return;
    }
    wire::header_v2 h = wire::header_v2_for(p.job, wire::frame_type::disarm);
    h.v1.sent_ns = _clock.now_realtime_ns();
    ++_disarms_sent;
    queue_control(wire::encode_frame(h, std::string_view{}));
}

void qpu_link::queue_control(const std::vector<std::uint8_t>& bytes) {
    if (_out_off == _out.size()) {
        _out.clear();
        _out_off = 0;
    }
    _out.insert(_out.end(), bytes.begin(), bytes.end());
    flush_control();
}

void qpu_link::flush_control() {
    while (_out_off < _out.size()) {
        const ssize_t n = ::send(_fd.get(), _out.data() + _out_off, _out.size() - _out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                break;
            }
            drop_connection(std::string(outcome::endpoint_disconnected),
                            std::string("write ") + _addr.uri + ": " + std::strerror(errno));
            return;
        }
        _out_off += static_cast<std::size_t>(n);
    }
    const bool want = _out_off < _out.size();
    if (want != _out_watched && _fd_watched) {
        if (auto st = _loop.modify_fd(_fd.get(), EPOLLIN | EPOLLRDHUP | (want ? EPOLLOUT : 0U)); !st) {
            drop_connection(std::string(outcome::endpoint_down), st.err().message);
            return;
        }
        _out_watched = want;
    }
    if (!want) {
        _out.clear();
        _out_off = 0;
    }
}

bool qpu_link::handle_v2_frame(wire::frame& f) {
    const auto type = static_cast<wire::frame_type>(f.hdr.type);
    if (type != wire::frame_type::armed && type != wire::frame_type::disarmed && type != wire::frame_type::error) {
        return false;
    }
    auto it = _pending.find(f.hdr.job_id);
    if (it == _pending.end()) {
        adopt_submitted();
        it = _pending.find(f.hdr.job_id);
    }
    if (type == wire::frame_type::disarmed) {
        return true;  // the job ended as withdrawn already
    }
    if (it == _pending.end()) {
        if (type == wire::frame_type::armed) {
            ++_counters.stray_frames;  // armed after it ended (withdrawn meanwhile): let it go
            wire::header_v2 h = wire::header_v2_for(f.hdr, wire::frame_type::disarm);
            h.v1.sent_ns = _clock.now_realtime_ns();
            ++_disarms_sent;
            queue_control(wire::encode_frame(h, std::string_view{}));
            return true;
        }
        return f.hdr.job_id != 0 && f.hdr.status == QRT_WIRE_ERR_NOT_ARMED;  // an answer to a DISARM
    }
    pending_job& p = it->second;
    if (type == wire::frame_type::armed) {
        if (p.arm != arm_phase::arming) {
            return true;
        }
        const std::int64_t waited = _clock.now_monotonic_ns() - p.arm_sent_mono_ns;
        _hist->arm_latency.record(waited);
        if (auto cost = wire::parse_armed(f.payload_text()); cost) {
            _hist->arm_cost.record(cost->total_ns());
            for (std::size_t i = 0; i < dispatch_histograms::arm_stages; ++i) {
                if (const std::int64_t v = cost->by_stage[QRT_WIRE_STAGE_PARSE + i]; v > 0) {
                    _hist->arm_stage_cost[i].record(v);
                }
            }
        }
        observe_arm(waited);
        if (_dispatcher.set_armed(p.job.job_id, true)) {
            p.arm = arm_phase::armed;
            ++_armed_total;
            tell_arm(p.job.job_id, arm_event::armed);
        }
        return true;
    }
    // ERROR: an answer to the ARM (the job not fired yet, and not a FIRE's
    // stage), else the FIRE's (answer(), as in version 1).
    const bool about_fire = f.v2.stage == QRT_WIRE_STAGE_FIRE || f.v2.stage == QRT_WIRE_STAGE_RUN;
    if (p.phase != job_phase::queued || p.arm != arm_phase::arming || about_fire) {
        return false;
    }
    ++_arm_refused;
    const auto w = _dispatcher.withdraw(p.job.job_id);
    std::string stage = f.v2.stage < proto::wire_stages.size() ? std::string(proto::wire_stages[f.v2.stage]) : "?";
    std::string detail = "refused at ARM by " + _addr.uri + ", stage " + stage + ": " + std::string(f.payload_text());
    if (w == dispatcher::withdraw_result::too_late) {
        return true;  // claimed for sending: not armed, so its record says not_armed
    }
    _dispatcher.report_withdrawn();
    ++_counters.endpoint_errors;
    finish(p.job.job_id, job_state::failed, std::string(outcome_for_wire_error(f.hdr.status)), std::move(detail), &f.hdr);
    return true;
}

}  // namespace qrt::dispatch
