#pragma once
// What the ledger's source files share (not a public header): the small
// helpers and the private structs of qrt::timeline::ledger.  The ledger is
// one class split by subject:
//   ledger.cpp              construction, reload, lookups, the one ownership check
//   ledger_placement.cpp    windows, occupancy, search and placement, slots.query
//   ledger_calibration.cpp  calibration.get and calibration.update
//   ledger_blocks.cpp       calibration blocks: request, placement, yield, settle
//   ledger_persist.cpp      durability (persist, the change sets) and withdraw_late
//   ledger_transitions.cpp  every state change, and its durability (persist)
//   ledger_invariants.cpp   check_invariants

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>

#include "qrt/timeline/ledger.hpp"

namespace qrt::timeline::detail {

inline constexpr double k_fidelity_slack = 1e-12;

inline std::string n2s(std::int64_t v) { return std::to_string(v); }
inline std::string u2s(std::uint64_t v) { return std::to_string(v); }

inline std::string idem_key(std::string_view tenant, std::string_view key) {
    std::string k;
    k.reserve(tenant.size() + key.size() + 1);
    k.append(tenant);
    k.push_back('\0');
    k.append(key);
    return k;
}

inline std::int64_t floor_div(std::int64_t a, std::int64_t b) {
    std::int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) {
        --q;
    }
    return q;
}

// a + b, held at INT64_MAX (b >= 0).
inline std::int64_t sat_add(std::int64_t a, std::int64_t b) {
    return a > std::numeric_limits<std::int64_t>::max() - b ? std::numeric_limits<std::int64_t>::max()
                                                            : a + b;
}

inline std::string fmt_double(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

}  // namespace qrt::timeline::detail

namespace qrt::timeline {

struct ledger::qpu_state {
    qpu_spec spec;
    bool periodic = false;
    periodic_calibration per;
    std::int64_t next_cycle = 0;  // periodic: first cycle not generated yet
    std::int64_t first_cycle = 0;  // periodic: first cycle generated
    std::map<std::int64_t, calibration_window> windows;  // by valid_from
    // Pushed: calibration_id -> valid_from of its window, and the lengths of
    // all windows (validate()'s longest window), kept by add_window and
    // drop_window so no lookup walks the window history.
    std::unordered_map<std::uint64_t, std::int64_t> window_ids;
    std::multiset<std::int64_t> window_lengths;
    gap_index gaps;
    std::map<std::int64_t, std::uint64_t> busy;     // active reservations by start
    std::map<std::int64_t, std::uint64_t> pending;  // committed jobs by start
    std::map<std::int64_t, std::uint64_t> blocks;   // live calibration blocks by start
    std::int64_t pruned_before_ns = std::numeric_limits<std::int64_t>::min();
    endpoint_state endpoint;
    // No placement starts earlier (now + endpoint_down_horizon_ns while the
    // endpoint is down; set by advance() and set_endpoint_state()).
    std::int64_t placeable_from_ns = std::numeric_limits<std::int64_t>::min();
    // The hand-over's lead on this QPU beyond min_lead_ns (set_extra_lead):
    // placeable_from_ns is at least now + min_lead_ns + this + the commit
    // backlog while it is above 0.
    std::int64_t extra_lead_ns = 0;
};

struct ledger::slot {
    std::size_t q = 0;
    std::int64_t start_ns = 0;
    calibration_window window;
};

// Where a calibration block goes: its start and window, and the held
// reservations in its time (empty: the time is free).
struct ledger::block_place {
    std::int64_t start_ns = 0;
    calibration_window window;
    std::vector<std::uint64_t> yielders;
};

struct ledger::preempt_plan {
    slot s;
    std::vector<std::uint64_t> victims;
};

}  // namespace qrt::timeline
