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
// thread owns it.  observe() is the cheap part (the thread calls it between
// its wake-up and T); the window's quantile is computed by adapt(), which
// the thread calls after the send, off the critical path.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace qrt::dispatch {

struct lead_config {
    std::int64_t initial_ns = 100'000;
    std::int64_t min_ns = 5'000;
    std::int64_t max_ns = 500'000;
    std::int64_t margin_ns = 10'000;
    double quantile = 0.999;
    std::uint32_t window = 256;  // samples per adaptation step (at most max_window)
};

class lead_controller {
public:
    static constexpr std::size_t max_window = 1024;

    explicit lead_controller(const lead_config& cfg) noexcept
        : _cfg(cfg),
          _lead_ns(std::clamp(cfg.initial_ns, cfg.min_ns, cfg.max_ns)),
          _window_len(std::clamp<std::size_t>(cfg.window, 1, max_window)) {}

    std::int64_t lead_ns() const noexcept { return _lead_ns; }
    const lead_config& config() const noexcept { return _cfg; }

    // One observed wake-up latency (actual wake - requested wake): O(1).
    void observe(std::int64_t wakeup_latency_ns) noexcept {
        if (_filled < _window_len) {
            _samples[_filled++] = wakeup_latency_ns;
        }
        if (wakeup_latency_ns + _cfg.margin_ns > _lead_ns) {
            _lead_ns = clamp(wakeup_latency_ns + _cfg.margin_ns);
        }
    }

    // At the end of a window, set the lead from its quantile and start the
    // next one.  O(window) (nth_element in place).  Returns true if it did.
    bool adapt() noexcept {
        if (_filled < _window_len) {
            return false;
        }
        const double q = std::clamp(_cfg.quantile, 0.0, 1.0);
        auto k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(_filled)));
        k = std::clamp<std::size_t>(k, 1, _filled) - 1;
        const auto first = _samples.begin();
        std::nth_element(first, first + static_cast<std::ptrdiff_t>(k), first + static_cast<std::ptrdiff_t>(_filled));
        _lead_ns = clamp(_samples[k] + _cfg.margin_ns);
        _filled = 0;
        ++_adaptations;
        return true;
    }

    std::uint64_t adaptations() const noexcept { return _adaptations; }

private:
    std::int64_t clamp(std::int64_t v) const noexcept { return std::clamp(v, _cfg.min_ns, _cfg.max_ns); }

    lead_config _cfg;
    std::int64_t _lead_ns;
    std::size_t _window_len;
    std::size_t _filled = 0;
    std::uint64_t _adaptations = 0;
    std::array<std::int64_t, max_window> _samples{};
};

}  // namespace qrt::dispatch
