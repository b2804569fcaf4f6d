#pragma once
// Follows CLOCK_REALTIME steps (PTP, chrony, date -s) on the housekeeping
// event loop and re-converts the queued deadlines of every dispatcher.
//
//   auto follower = qrt::dispatch::realtime_step_follower::open(loop, clock);
//   (*follower)->follow([&](const rtcore::time_base& b) { return link.on_realtime_step(b); });
//
// The watch is rtcore::realtime_step_watch (a TFD_TIMER_CANCEL_ON_SET
// timerfd); on a step it re-samples the time base and every follower
// rewrites its queued slots' monotonic deadlines (one atomic store each, so
// the dispatch thread never sees a half-updated deadline).

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "qrt/event_loop.hpp"
#include "rtcore/clock.hpp"
#include "rtcore/error.hpp"

namespace qrt::dispatch {

class realtime_step_follower {
public:
    // Returns the number of deadlines it re-converted.
    using target = std::function<std::size_t(const rtcore::time_base&)>;

    static rtcore::result<std::unique_ptr<realtime_step_follower>> open(event_loop& loop,
                                                                        const rtcore::clock_source& clock);
    ~realtime_step_follower();
    realtime_step_follower(const realtime_step_follower&) = delete;
    realtime_step_follower& operator=(const realtime_step_follower&) = delete;

    void follow(target t) { _targets.push_back(std::move(t)); }

    // Re-sample now and re-convert (what a detected step does).  Public so
    // tests drive it with a fake clock without stepping the host's clock.
    rtcore::result<rtcore::realtime_step> resample_now();

    std::uint64_t steps() const noexcept { return _steps; }
    std::uint64_t reconverted() const noexcept { return _reconverted; }
    const rtcore::time_base& current() const noexcept { return _watch.current(); }

private:
    realtime_step_follower(event_loop& loop, rtcore::realtime_step_watch watch)
        : _loop(loop), _watch(std::move(watch)) {}
    void apply(const rtcore::realtime_step& step);
    void on_readable();

    event_loop& _loop;
    rtcore::realtime_step_watch _watch;
    std::vector<target> _targets;
    std::uint64_t _steps = 0;
    std::uint64_t _reconverted = 0;
};

}  // namespace qrt::dispatch
