#pragma once
// One QPU's housekeeping side: the endpoint connection (connect, HELLO,
// reconnect with exponential backoff, RESULT/ERROR reader) on the event loop,
// plus the dispatcher (its RT thread) and the per-job bookkeeping that turns
// dispatch records and endpoint frames into one terminal outcome per job.
//
//   qrt::dispatch::qpu_link link(loop, clock, cfg, {
//       .on_dispatched = [&](std::uint64_t id, std::int64_t sent_ns) { ledger.mark_dispatched(id); },
//       .on_outcome = [&](const dispatch_outcome& o) { ledger.complete_or_fail(o); },
//   });
//   link.start();
//   link.submit(job, payload);          // from due_jobs()
//   link.set_calibration_id(id);        // calibration stack updates
//   link.on_realtime_step(base);        // from rtcore::realtime_step_watch
//
// Failure reasons (stable): missed, calibration_changed, out_of_window,
// endpoint_down, send_failed, endpoint_timeout, endpoint_disconnected,
// endpoint_protocol_error, endpoint_stalled, qpu_out_of_window,
// qpu_calibration_mismatch, qpu_busy, qpu_error, cancelled.
//
// Nothing here blocks: connects are non-blocking, the reader only reads what
// epoll says is there, and the dispatch thread never waits on the endpoint.
//
// Wire version 2 (wire_version = 2, qpu_link_v2.cpp): the HELLO offers
// wire=2; the endpoint's version-2 HELLO gives its capabilities and a
// session, and a second connection (the fire connection, named by that
// session) becomes the dispatcher's registered file: the dispatch thread
// writes FIRE headers there and nothing else.  The control connection is
// the loop's: ARM (the program, from the link's own payload store) goes out
// when the job is handed over, within the endpoint's max_armed and
// horizon (more wait, never fail); ARMED marks the job armed in the
// dispatcher (set_armed), an ERROR at ARM ends it `arm_refused` (or the
// table's outcome of the status) naming the stage; a job withdrawn before
// FIRE is DISARMed; a job still unarmed at T ends `not_armed`.  When the
// endpoint is lost, armed jobs are re-armed after the reconnect; one whose
// T comes first ends `endpoint_disconnected`.  Never a FIRE for a job that
// is not armed.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "qrt/dispatch/dispatcher.hpp"
#include "qrt/proto/endpoint.hpp"
#include "qrt/dispatch/job.hpp"
#include "qrt/dispatch/telemetry.hpp"
#include "qrt/proto/wire_codec.hpp"
#include "qrt/proto/wire_v2.hpp"
#include "qrt/event_loop.hpp"
#include "rtcore/clock.hpp"
#include "rtcore/pi_mutex.hpp"

namespace qrt::dispatch {

struct qpu_link_config {
    std::string endpoint;  // unix:///path, tcp://127.0.0.1:port, file:///dev/...
    dispatcher_config dispatch{};
    std::chrono::milliseconds backoff_initial{20};
    std::chrono::milliseconds backoff_max{2000};
    std::chrono::milliseconds hello_timeout{1000};
    std::int64_t result_timeout_ns = 1'000'000'000;  // after T + duration
    std::uint32_t stall_timeouts = 3;                 // consecutive timeouts => reconnect
    std::chrono::microseconds poll_interval{500};     // record drain / timeout scan
    std::string identity = "qrtd";
    // Version 2: the arm lead the daemon budgets (qpu.arm_lead_ns): the
    // learned lead's floor, and a warning when the learned one outgrows it.
    std::int64_t arm_lead_ns = 0;
    // Version 2: the arm lead the daemon's minimum lead already includes
    // (the largest qpu.arm_lead_ns of a wire-2 QPU): the learned lead beyond
    // it is this QPU's extra lead (extra_lead_ns, on_extra_lead).
    std::int64_t budgeted_arm_lead_ns = 0;
    // 1: JOB at T.  2: ARM ahead, FIRE at T (dispatch.wire_version must be
    // the same; the daemon sets both from the QPU's `wire` option).
    unsigned wire_version = 1;
};

struct qpu_link_callbacks {
    std::function<void(std::uint64_t job_id, std::int64_t sent_ns)> on_dispatched;
    std::function<void(const dispatch_outcome&)> on_outcome;
    std::function<void(bool up, const std::string& reason)> on_endpoint_state;
    // Version 2: the extra lead changed (the loop, never the dispatch
    // thread): the learned arm lead beyond budgeted_arm_lead_ns, 0 if none.
    std::function<void(std::int64_t extra_lead_ns)> on_extra_lead;
    // Version 2: each step of a job's arming (the loop): its ARM sent,
    // ARMED, armed no more (connection lost), FIRE sent.  The daemon's
    // hand-over table keeps them and refuses a step out of order.
    std::function<void(std::uint64_t job_id, arm_event e)> on_arm;
};

class qpu_link {
public:
    // Throws on a bad endpoint URI or dispatcher setup failure.
    qpu_link(event_loop& loop, rtcore::clock_source& clock, qpu_link_config cfg, qpu_link_callbacks cb);
    ~qpu_link();
    qpu_link(const qpu_link&) = delete;
    qpu_link& operator=(const qpu_link&) = delete;

    // Starts the dispatch thread and the first connection attempt.
    rtcore::status start();
    // Stops the thread, closes the endpoint; every unfinished job gets an
    // outcome (cancelled).
    void stop();

    // The one call of the job pump's thread (the only producer of the
    // dispatcher's job ring); everything else here is the event loop's.  The
    // job is queued for its dispatch thread at once; the loop adopts it into
    // the per-job bookkeeping before it looks at any record or frame of it
    // (adopt_submitted).  A job id already queued or in flight is refused.
    rtcore::status submit(const dispatch_job& job, std::span<const std::uint8_t> payload);
    // The same as a code, building no text and allocating nothing (the
    // pump's SCHED_FIFO thread); describe_refusal() gives the words.
    submit_refusal try_submit(const dispatch_job& job, std::span<const std::uint8_t> payload) noexcept;
    std::string describe_refusal(submit_refusal r, const dispatch_job& job, std::size_t payload_bytes) const {
        return _dispatcher.describe_refusal(r, job, payload_bytes);
    }
    void set_calibration_id(std::uint64_t id) noexcept { _dispatcher.set_calibration_id(id); }
    void set_calibration(std::uint64_t current_id, std::uint64_t next_id, std::int64_t switch_rt_ns) noexcept {
        _dispatcher.set_calibration(current_id, next_id, switch_rt_ns);
    }
    // See dispatcher::withdraw and restore: a compare-and-swap with the send.
    dispatcher::withdraw_result withdraw(std::uint64_t job_id) noexcept { return _dispatcher.withdraw(job_id); }
    bool restore(std::uint64_t job_id) noexcept { return _dispatcher.restore(job_id); }
    void report_withdrawn() noexcept { _dispatcher.report_withdrawn(); }
    std::size_t on_realtime_step(const rtcore::time_base& base) { return _dispatcher.on_realtime_step(base); }

    bool endpoint_up() const noexcept { return _state == conn_state::up; }
    // Version 2: the arm lead learned from this endpoint's ARMED answers
    // (any thread).
    std::int64_t arm_lead_ns() const noexcept { return _arm_lead_pub.load(std::memory_order_relaxed); }
    // How much longer than the daemon's minimum lead a job needs on this
    // QPU: max(0, arm_lead_ns() - budgeted_arm_lead_ns); 0 on wire 1 (any
    // thread: the pump hands jobs over this much earlier).
    std::int64_t extra_lead_ns() const noexcept {
        return two_phase() ? std::max<std::int64_t>(arm_lead_ns() - _cfg.budgeted_arm_lead_ns, 0) : 0;
    }
    const std::string& last_endpoint_error() const noexcept { return _last_error; }
    std::size_t pending() const noexcept { return _pending.size(); }
    dispatch_telemetry telemetry() const;
    const dispatch_histograms& histograms() const noexcept { return *_hist; }
    const dispatcher& dispatch() const noexcept { return _dispatcher; }
    // For a dispatch_group to serve (before start(); the group then runs
    // the dispatch thread and start() leaves it alone).
    dispatcher& dispatch_for_group() noexcept { return _dispatcher; }

    // Drain records and expire timeouts now (the loop timer does this too).
    void poll();

private:
    enum class conn_state { idle, connecting, hello, fire_connecting, fire_hello, up, stopped };
    enum class job_phase { queued, sent };
    // Version 2: where the job's ARM stands on the current connection.
    enum class arm_phase { none, arming, armed };
    static constexpr std::uint32_t no_payload_buf = UINT32_MAX;
    struct submitted_job {
        dispatch_job job;
        std::uint32_t payload_buf = no_payload_buf;  // version 2: index into the payload store
        std::uint32_t payload_len = 0;
    };
    struct pending_job {
        dispatch_job job;
        job_phase phase = job_phase::queued;
        arm_phase arm = arm_phase::none;
        bool was_armed = false;          // armed on a connection since lost
        std::int64_t arm_sent_mono_ns = 0;
        std::uint32_t payload_buf = no_payload_buf;
        std::uint32_t payload_len = 0;
        std::int64_t sent_ns = 0;
        std::int64_t lateness_ns = 0;
        std::int64_t result_due_mono_ns = 0;
        std::optional<wire::frame> early_answer;  // RESULT/ERROR before the record
    };

    void schedule_connect();
    void try_connect();
    void on_connect_writable();
    void send_hello();
    void on_readable(std::uint32_t events);
    void handle_frame(wire::frame&& f);
    void drop_connection(const std::string& reason, const std::string& detail);
    void on_record(const dispatch_record& r);
    void answer(pending_job& p, wire::frame&& f);
    void finish(std::uint64_t job_id, job_state st, std::string reason, std::string detail,
                const wire::header* hdr = nullptr, std::vector<std::uint8_t> result = {});
    void expire_timeouts();
    // Loop: move what submit() queued into _pending.
    void adopt_submitted();

    // ---- version 2 (qpu_link_v2.cpp) ----
    bool two_phase() const noexcept { return _cfg.wire_version >= 2; }
    // The endpoint's version-2 HELLO on the control connection: its
    // capabilities, then the fire connection.
    void on_hello_v2(const wire::frame& f);
    void start_fire_connection();
    void send_fire_hello();
    void on_fire_event(std::uint32_t events);
    void fire_up();
    // Frames only version 2 has, or a version-2 answer to an ARM; true when handled.
    bool handle_v2_frame(wire::frame& f);
    void queue_control(const std::vector<std::uint8_t>& bytes);
    void flush_control();
    // ARM every handed-over job not armed on this connection, within
    // max_armed and the horizon.
    void arm_due();
    void send_disarm(const pending_job& p);
    void tell_arm(std::uint64_t job_id, arm_event e);  // _cb.on_arm, if set
    std::span<const std::uint8_t> payload_of(const pending_job& p) const noexcept;

    event_loop& _loop;
    rtcore::clock_source& _clock;
    qpu_link_config _cfg;
    qpu_link_callbacks _cb;
    proto::endpoint_address _addr;
    dispatcher _dispatcher;

    conn_state _state = conn_state::idle;
    rtcore::unique_fd _fd;
    bool _fd_watched = false;
    bool _write_only = false;
    // The dispatcher's endpoint generation of the connection that is up (0:
    // none): a record of a frame written on another one was sent on a
    // connection since dropped (dispatch_record::endpoint_gen).
    std::uint32_t _live_gen = 0;
    // on_endpoint_state(false) said once per outage, also when the first
    // connect never succeeded.
    bool _reported_down = false;
    void report_down(const std::string& why);
    wire::frame_reader _reader;
    std::chrono::milliseconds _backoff;
    std::optional<event_loop::timer_id> _connect_timer;
    std::optional<event_loop::timer_id> _hello_timer;
    std::optional<event_loop::timer_id> _poll_timer;
    std::string _last_error;
    std::uint32_t _consecutive_timeouts = 0;
    std::string _last_drop_reason;
    std::string _last_drop_detail;

    std::map<std::uint64_t, pending_job> _pending;
    // submit() (pump thread) -> the loop: jobs queued, not adopted yet, and
    // every id queued or in flight (the duplicate check), under _submit_mutex.
    rtcore::pi_mutex _submit_mutex;
    // Submitted, not adopted yet: at most one per dispatch slot (a slot is
    // freed only by the loop, which adopts first), so both vectors keep a
    // slot count of capacity and the pump's push never allocates.
    std::vector<submitted_job> _submitted;
    std::vector<submitted_job> _adopting;  // the loop's side of the swap
    // The ring's duplicate guard, for whoever submits: the link's own
    // invariant (a job id is in the ring or the dispatcher at most once),
    // checked on the submit path under _submit_mutex and cleared by the
    // loop when the record comes back.  The hand-over table
    // (qrt/handover/handover_table.hpp) says where a job stands; this says
    // only that the link holds it, and a link used without the pump (its
    // tests, tools) needs it too.
    std::unordered_set<std::uint64_t> _ids_in_flight;
    std::atomic<std::uint64_t> _submitted_total{0};
    std::atomic<std::uint64_t> _rejected_submits{0};
    dispatch_counters _counters;
    std::unique_ptr<dispatch_histograms> _hist;
    std::uint64_t _spin_ns_total = 0;
    std::uint64_t _sent_total = 0;

    // Version 2.  The payload store: one max_payload buffer per dispatch
    // slot, allocated (not touched) at construction; the pump copies a
    // job's program into a free one under _submit_mutex (no allocation),
    // the loop sends it in ARM and frees it when the job ends.
    std::unique_ptr<std::uint8_t[]> _payload_store;
    std::vector<std::uint32_t> _payload_free;  // under _submit_mutex
    wire::capabilities _caps;
    rtcore::unique_fd _fire_fd;
    bool _fire_watched = false;
    wire::frame_reader _fire_reader;
    std::vector<std::uint8_t> _out;  // control connection: bytes not yet written
    std::size_t _out_off = 0;
    bool _out_watched = false;       // EPOLLOUT asked for
    std::uint32_t _arms_out = 0;     // jobs arming or armed on this connection
    std::uint64_t _arms_sent = 0, _armed_total = 0, _arm_refused = 0, _disarms_sent = 0, _not_armed = 0;
    // The learned arm lead (lead_controller's rule over ARM -> ARMED
    // times: up at once, down a window at a time), never below the floor:
    // max(arm_lead_ns, the endpoint's HELLO min_lead_ns).
    std::unique_ptr<lead_controller> _arm_lead;
    std::int64_t _arm_lead_floor_ns = 0;
    std::atomic<std::int64_t> _arm_lead_pub{0};
    bool _warned_arm_lead = false;
    void observe_arm(std::int64_t took_ns);
    // Stores the learned lead and tells on_extra_lead when the extra changed.
    void publish_arm_lead(std::int64_t lead_ns);
    std::int64_t _extra_lead_told = 0;
};

}  // namespace qrt::dispatch
