#pragma once
// Shared fixtures for the timeline tests: a host with two periodic QPUs and
// one pushed QPU, times in whole seconds for readability.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "qrt/timeline/ledger.hpp"

namespace qrt::timeline::test {

inline constexpr std::int64_t s_ns = 1'000'000'000;
// Cycle k of a periodic QPU: blackout [k*100, k*100+10) s, window [k*100+10, (k+1)*100) s.
inline constexpr std::int64_t period_ns = 100 * s_ns;
inline constexpr std::int64_t blackout_ns = 10 * s_ns;
inline constexpr std::int64_t t0_ns = 1'000'000 * s_ns;  // start of cycle 10000

inline qpu_spec periodic_qpu(std::string name, double f0 = 0.99, std::int64_t tau_ns = 1000 * s_ns) {
    return qpu_spec{std::move(name),
                    periodic_calibration{period_ns, blackout_ns, 0, f0, tau_ns}};
}

inline qpu_spec pushed_qpu(std::string name) { return qpu_spec{std::move(name), pushed_calibration{}}; }

inline std::unique_ptr<ledger> make_ledger(std::string policy = "edf-backfill",
                                           std::vector<qpu_spec> qpus = {},
                                           on_calibration_change occ = on_calibration_change::replace,
                                           std::string store_path = "",
                                           std::int64_t now_ns = t0_ns) {
    if (qpus.empty()) {
        qpus = {periodic_qpu("q0"), periodic_qpu("q1")};
    }
    ledger_options o;
    o.policy = std::move(policy);
    o.calibration_change = occ;
    o.horizon_ns = 20 * period_ns;
    auto l = ledger::open(std::move(qpus), o, store_path, now_ns);
    EXPECT_TRUE(l.has_value()) << (l ? "" : l.err().reason + ": " + l.err().message);
    return l ? std::move(*l) : nullptr;
}

inline request req(std::int64_t duration_s, std::int64_t not_before_ns = 0,
                   std::int64_t deadline_ns = 0, std::int32_t priority = 0) {
    request r;
    r.duration_ns = duration_s * s_ns;
    r.not_before_ns = not_before_ns;
    r.deadline_ns = deadline_ns;
    r.priority = priority;
    return r;
}

// Asserts every invariant; prints the violations.
#define EXPECT_INVARIANTS(l)                                              \
    do {                                                                  \
        const auto _bad = (l).check_invariants();                        \
        EXPECT_TRUE(_bad.empty()) << ::testing::PrintToString(_bad);     \
    } while (0)

// The ledger state as comparable values: every reservation, in id order.
inline std::vector<reservation> snapshot(const ledger& l, std::uint64_t max_id = 10'000) {
    std::vector<reservation> out;
    for (std::uint64_t id = 1; id <= max_id; ++id) {
        if (const reservation* r = l.find(id)) {
            out.push_back(*r);
        }
    }
    return out;
}

}  // namespace qrt::timeline::test
