#pragma once
// Value types of the QPU timeline: calibration windows, requests,
// reservations, candidates, events and the error/result type.
//
// Every time is int64 nanoseconds since the Unix epoch (UTC); every duration
// is int64 nanoseconds.  Nothing here reads a clock: callers pass now_ns.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "qrt/proto/protocol.hpp"
#include "rtcore/error.hpp"

namespace qrt::timeline {

inline constexpr std::int64_t k_no_deadline_ns = std::numeric_limits<std::int64_t>::max();

// ---------------------------------------------------------------- errors

// Stable reason strings: the protocol's one table (qrt/proto/protocol.hpp);
// the socket layer copies them into data.reason.
namespace reason = proto::reason;

struct error {
    std::string reason;   // one of qrt::proto::reason::*
    std::string message;  // names the field and the value
    std::string qpu;      // the QPU it is about, when one (endpoint_down)
    // A start refused as too soon for the hand-over: no start before this
    // can be acknowledged now (0: none given; the RPC error's data).
    std::int64_t next_start_ns = 0;
};

inline error make_error(std::string_view why, std::string message) {
    return error{std::string(why), std::move(message), {}};
}

// rtcore's result storage, with the timeline's error (it carries a stable
// reason where rtcore's carries an errno).
template <typename T>
using result = rtcore::basic_result<T, error>;

using status = result<void>;

// ---------------------------------------------------------- calibration

struct calibration_window {
    std::uint64_t calibration_id = 0;
    std::int64_t valid_from_ns = 0;
    std::int64_t valid_until_ns = 0;  // exclusive
    double f0 = 1.0;                  // predicted fidelity at valid_from
    std::int64_t tau_ns = 0;          // drift time constant; 0 = no drift

    std::int64_t length_ns() const noexcept { return valid_until_ns - valid_from_ns; }
    bool contains(std::int64_t t_ns) const noexcept {
        return t_ns >= valid_from_ns && t_ns < valid_until_ns;
    }
    // f0 * exp(-(t - valid_from) / tau)
    double predicted_fidelity(std::int64_t t_ns) const noexcept {
        if (tau_ns <= 0) {
            return f0;
        }
        const double age = static_cast<double>(t_ns - valid_from_ns);
        return f0 * std::exp(-age / static_cast<double>(tau_ns));
    }
    bool operator==(const calibration_window&) const = default;
};

struct periodic_calibration {
    std::int64_t period_ns = 0;   // one calibration cycle
    std::int64_t blackout_ns = 0; // calibration runs at the start of each cycle
    std::int64_t phase_ns = 0;    // cycle k starts at phase + k * period
    double f0 = 1.0;
    std::int64_t tau_ns = 0;
};

// Windows are pushed later through ledger::update_calibration.
struct pushed_calibration {};

struct qpu_spec {
    std::string name;
    std::variant<periodic_calibration, pushed_calibration> calibration = pushed_calibration{};
};

// --------------------------------------------------------- reservations

// A reservation's state (and its job's): the protocol's table, with its
// columns (active: held, committed and dispatched occupy QPU time) and the
// transitions it allows (qrt/proto/protocol.hpp).
using res_state = proto::state;
using proto::finishes_job;
using proto::is_active;
using proto::is_terminal;
using proto::to_string;
using proto::transition_allowed;
inline std::optional<res_state> res_state_from_string(std::string_view s) noexcept {
    return proto::state_from_string(s);
}

struct request {
    std::int64_t duration_ns = 0;
    std::int64_t not_before_ns = 0;  // 0 or in the past = as soon as possible
    std::int64_t deadline_ns = 0;    // latest end; 0 = none
    std::int32_t priority = 0;       // higher wins under priority-preempt
    double min_fidelity = 0.0;       // 0 = no requirement
    std::vector<std::string> qpus;   // empty = any QPU
    std::size_t max_candidates = 4;  // query only
    // query only: > 1 asks for a gang, one start on gang_size distinct QPUs
    // (what reserve_gang would take now); the candidates are its members.
    std::size_t gang_size = 1;
    // submit only: the shot count the hand-over sends in the frame header
    // (jobs.submit's "shots", or its envelope's); 0: not stated (the
    // hand-over's default, 1000).
    std::uint32_t shots = 0;
    // reserve and submit only: place it inside this calibration block (the
    // block's own service; 0: outside every block, as every other job).
    std::uint64_t block_id = 0;
};

// An immutable byte buffer that copies share.  A reservation is copied
// often (the job pump looks at every due job each 2 ms, events and RPC
// answers take copies) and its payload or result can be large; copying a
// blob costs one reference count, never the bytes.
class blob {
public:
    using value_type = std::uint8_t;
    using const_iterator = const std::uint8_t*;
    using iterator = const_iterator;
    using size_type = std::size_t;

    blob() = default;
    blob(std::vector<std::uint8_t> bytes)  // NOLINT(google-explicit-constructor): a vector is a blob
        : _bytes(bytes.empty() ? nullptr : std::make_shared<const std::vector<std::uint8_t>>(std::move(bytes))) {}
    blob(std::initializer_list<std::uint8_t> bytes) : blob(std::vector<std::uint8_t>(bytes)) {}
    template <typename It>
    blob(It first, It last) : blob(std::vector<std::uint8_t>(first, last)) {}

    const std::uint8_t* data() const noexcept { return _bytes ? _bytes->data() : nullptr; }
    std::size_t size() const noexcept { return _bytes ? _bytes->size() : 0; }
    bool empty() const noexcept { return size() == 0; }
    const_iterator begin() const noexcept { return data(); }
    const_iterator end() const noexcept { return data() + size(); }
    // The first byte; 0 for an empty blob.
    std::uint8_t front() const noexcept {
        const std::vector<std::uint8_t>* b = _bytes.get();
        return b != nullptr && !b->empty() ? b->front() : std::uint8_t{0};
    }
    operator std::span<const std::uint8_t>() const noexcept { return {data(), size()}; }  // NOLINT

    friend bool operator==(const blob& a, const blob& b) noexcept {
        return std::equal(a.begin(), a.end(), b.begin(), b.end());
    }

private:
    std::shared_ptr<const std::vector<std::uint8_t>> _bytes;
};

struct reservation {
    std::uint64_t id = 0;
    std::string tenant;
    std::string qpu;
    std::int64_t start_ns = 0;
    std::int64_t duration_ns = 0;
    std::int64_t not_before_ns = 0;
    std::int64_t deadline_ns = k_no_deadline_ns;
    std::int32_t priority = 0;
    double min_fidelity = 0.0;
    std::uint64_t calibration_id = 0;
    std::string idempotency_key;
    std::int64_t lease_ns = 0;
    std::int64_t lease_expires_ns = 0;
    std::uint64_t fencing_token = 0;
    res_state state = res_state::held;
    std::string reason;          // why it is in its state (missed, displaced, failed ...)
    std::uint64_t gang_id = 0;   // 0 = not part of a gang
    blob payload;
    std::uint32_t shots = 0;     // from the request (request::shots); 0: not stated
    blob result;
    std::int64_t sent_ns = 0;
    std::int64_t created_ns = 0;
    std::int64_t updated_ns = 0;
    std::uint64_t block_id = 0;  // the calibration block it was placed in (0: none)

    std::int64_t end_ns() const noexcept { return start_ns + duration_ns; }
    bool operator==(const reservation&) const = default;
};

// ---------------------------------------------------- calibration blocks

// A calibration block's state: the protocol's table (qrt/proto/protocol.hpp;
// yielding, scheduled and started are live: a blackout in the timeline).
using proto::block_state;
using proto::is_live;
inline std::optional<block_state> block_state_from_string(std::string_view s) noexcept {
    return proto::block_state_from_string(s);
}

// calibration.request: time on one QPU for a calibration step, ending by
// needed_by_ns (when the parameters in force go stale).
struct block_request {
    std::string qpu;
    std::string step;
    std::int64_t duration_ns = 0;
    std::int64_t needed_by_ns = 0;
    std::int32_t urgency = 0;  // above a held reservation's priority: it may be revoked (policy)
};

struct calibration_block {
    std::uint64_t id = 0;
    std::string tenant;  // the calibration service that asked
    std::string qpu;
    std::string step;
    std::int64_t start_ns = 0;
    std::int64_t duration_ns = 0;
    std::int64_t needed_by_ns = 0;
    std::int32_t urgency = 0;
    std::uint64_t calibration_id = 0;  // the window it lies in
    block_state state = block_state::scheduled;
    std::string reason;
    std::int64_t yield_deadline_ns = 0;  // yielding: when the holders' time is up
    std::string idempotency_key;
    std::int64_t created_ns = 0;
    std::int64_t updated_ns = 0;

    std::int64_t end_ns() const noexcept { return start_ns + duration_ns; }
    bool overlaps(std::int64_t s, std::int64_t e) const noexcept { return start_ns < e && s < end_ns(); }
    bool operator==(const calibration_block&) const = default;
};

struct candidate {
    std::string qpu;
    std::int64_t start_ns = 0;
    std::int64_t end_ns = 0;
    std::uint64_t calibration_id = 0;
    std::int64_t calibration_age_ns = 0;  // start - window valid_from
    double predicted_fidelity = 1.0;
    std::int64_t window_until_ns = 0;
    std::int64_t window_tau_ns = 0;  // the window's drift time constant
    double score = 0.0;  // the policy's score; lower is better
};

struct next_window {
    std::string qpu;
    calibration_window window;
};

struct query_result {
    std::vector<candidate> candidates;  // best first
    std::optional<next_window> next;    // set when no candidate fits
    std::string why_none;               // set when no candidate fits
};

struct job_result {
    std::uint64_t id = 0;
    res_state state = res_state::completed;
    blob result;
    std::string reason;
    std::int64_t sent_ns = 0;
    std::int64_t updated_ns = 0;
};

struct calibration_report {
    std::size_t windows = 0;
    std::size_t replaced = 0;   // reservations moved to a new slot
    std::size_t displaced = 0;  // reservations that could not be kept
};

// -------------------------------------------------------------- events

namespace event_type {
inline constexpr std::string_view reserved = "reserved";
inline constexpr std::string_view committed = "committed";
inline constexpr std::string_view released = "released";
inline constexpr std::string_view cancelled = "cancelled";
inline constexpr std::string_view expired = "expired";
inline constexpr std::string_view missed = "missed";
inline constexpr std::string_view replaced = "replaced";    // moved to a new slot
inline constexpr std::string_view displaced = "displaced";  // could not be re-placed
inline constexpr std::string_view dispatched = "dispatched";
inline constexpr std::string_view completed = "completed";
inline constexpr std::string_view sent = "sent";  // written to a write-only endpoint, no result
inline constexpr std::string_view failed = "failed";
inline constexpr std::string_view calibration = "calibration";  // windows changed
// A QPU's endpoint went down or came back (qpu set, reservation_id 0,
// reason: the connection's last error).
inline constexpr std::string_view endpoint_down = "endpoint_down";
inline constexpr std::string_view endpoint_up = "endpoint_up";
// A calibration block was placed or cleared, started, ended (event::block
// set, reservation_id 0); a held reservation is asked to yield to one
// (reservation_id, tenant and event::block set).
inline constexpr std::string_view calibration_scheduled = "calibration_scheduled";
inline constexpr std::string_view calibration_started = "calibration_started";
inline constexpr std::string_view calibration_ended = "calibration_ended";
inline constexpr std::string_view yield_requested = "yield_requested";
}  // namespace event_type

struct event {
    std::string type;  // one of event_type::*
    std::uint64_t reservation_id = 0;
    std::string tenant;
    std::string qpu;
    std::string reason;
    std::int64_t time_ns = 0;
    std::int64_t start_ns = 0;  // the reservation's start after the change
    res_state state = res_state::held;
    // Calibration block events: the block as the change left it.  A yield
    // request adds when the holder's time is up, the nearest free start
    // for its reservation (0: none) and what happens at the deadline
    // ("revoke" or "keep").
    std::optional<calibration_block> block;
    std::int64_t deadline_ns = 0;
    std::int64_t free_start_ns = 0;
    std::string at_deadline;
};

}  // namespace qrt::timeline
