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
};

struct qpu_link_callbacks {
    std::function<void(std::uint64_t job_id, std::int64_t sent_ns)> on_dispatched;
    std::function<void(const dispatch_outcome&)> on_outcome;
    std::function<void(bool up, const std::string& reason)> on_endpoint_state;
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
    enum class conn_state { idle, connecting, hello, up, stopped };
    enum class job_phase { queued, sent };
    struct pending_job {
        dispatch_job job;
        job_phase phase = job_phase::queued;
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
    std::vector<dispatch_job> _submitted;
    std::vector<dispatch_job> _adopting;  // the loop's side of the swap
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
};

}  // namespace qrt::dispatch
