#pragma once
// Adaptive spin lead.  The dispatch thread sleeps to T - lead and spins to T;
// the lead should cover the timer wake-up latency almost always (so the
// thread is spinning before T) without burning more CPU than needed.
//
// Rule: lead = clamp(q(wakeup latency over the last window) + margin,
// [lead_min_ns, lead_max_ns]).  Up fast: a single wake-up later than the
// current lead raises it at once (to that sample + margin).  Down slowly:
// only at the end of each window of `window` samples, from that window's
// quantile.  Allocation-free and noexcept after construction: the dispatch
// thread owns it.

#include <algorithm>
#include <cstdint>

#include "rtcore/histogram.hpp"

namespace qrt::dispatch {

struct lead_config {
    std::int64_t initial_ns = 100'000;
    std::int64_t min_ns = 5'000;
    std::int64_t max_ns = 500'000;
    std::int64_t margin_ns = 10'000;
    double quantile = 0.999;
    std::uint32_t window = 256;  // samples per adaptation step
};

class lead_controller {
public:
    explicit lead_controller(const lead_config& cfg) noexcept
        : _cfg(cfg), _lead_ns(std::clamp(cfg.initial_ns, cfg.min_ns, cfg.max_ns)) {}

    std::int64_t lead_ns() const noexcept { return _lead_ns; }
    const lead_config& config() const noexcept { return _cfg; }

    // One observed wake-up latency (actual wake - requested wake).
    void observe(std::int64_t wakeup_latency_ns) noexcept {
        _window.record(wakeup_latency_ns);
        if (wakeup_latency_ns + _cfg.margin_ns > _lead_ns) {
            _lead_ns = clamp(wakeup_latency_ns + _cfg.margin_ns);
        }
        if (_window.count() >= _cfg.window) {
            _lead_ns = clamp(_window.quantile(_cfg.quantile) + _cfg.margin_ns);
            _window.reset();
            ++_adaptations;
        }
    }

    std::uint64_t adaptations() const noexcept { return _adaptations; }

private:
    std::int64_t clamp(std::int64_t v) const noexcept { return std::clamp(v, _cfg.min_ns, _cfg.max_ns); }

    lead_config _cfg;
    std::int64_t _lead_ns;
    std::uint64_t _adaptations = 0;
    rtcore::histogram _window;
};

}  // namespace qrt::dispatch
