#include "qrt/timeline/policy.hpp"

#include <cmath>
#include <string>

namespace qrt::timeline {

namespace {

constexpr double k_ns_per_s = 1e9;

double wait_s(const candidate& c, std::int64_t earliest_ns) noexcept {
    return static_cast<double>(c.start_ns - earliest_ns) / k_ns_per_s;
}

bool by_deadline(const pending_request& a, const pending_request& b) noexcept {
    const std::int64_t da = a.req.deadline_ns > 0 ? a.req.deadline_ns : k_no_deadline_ns;
    const std::int64_t db = b.req.deadline_ns > 0 ? b.req.deadline_ns : k_no_deadline_ns;
    if (da != db) {
        return da < db;
    }
    return a.seq < b.seq;
}

class fifo final : public placement_policy {
public:
    std::string_view name() const noexcept override { return "fifo"; }
    bool backfill() const noexcept override { return false; }
    double score(const candidate& c, std::int64_t earliest_ns) const noexcept override {
        return wait_s(c, earliest_ns);
    }
    bool before(const pending_request& a, const pending_request& b) const noexcept override {
        return a.seq < b.seq;
    }
};

class edf_backfill final : public placement_policy {
public:
    std::string_view name() const noexcept override { return "edf-backfill"; }
    bool backfill() const noexcept override { return true; }
    double score(const candidate& c, std::int64_t earliest_ns) const noexcept override {
        return wait_s(c, earliest_ns);
    }
    bool before(const pending_request& a, const pending_request& b) const noexcept override {
        return by_deadline(a, b);
    }
};

class priority_preempt final : public placement_policy {
public:
    std::string_view name() const noexcept override { return "priority-preempt"; }
    bool backfill() const noexcept override { return true; }
    bool preempts() const noexcept override { return true; }
    double score(const candidate& c, std::int64_t earliest_ns) const noexcept override {
        return wait_s(c, earliest_ns);
    }
    bool before(const pending_request& a, const pending_request& b) const noexcept override {
        if (a.req.priority != b.req.priority) {
            return a.req.priority > b.req.priority;
        }
        return by_deadline(a, b);
    }
};

// Cost in e-folds of fidelity: -ln f(start) + wait / tau.  Waiting one tau
// for a fresh window costs as much as starting one tau into an old one, so a
// fresh window wins exactly when it is nearer than the age it saves.
class fidelity_aware final : public placement_policy {
public:
    std::string_view name() const noexcept override { return "fidelity-aware"; }
    bool backfill() const noexcept override { return true; }
    std::size_t windows_considered() const noexcept override { return 4; }
    double score(const candidate& c, std::int64_t earliest_ns) const noexcept override {
        constexpr double k_default_tau_s = 3600.0;
        const double tau_s = c.window_tau_ns > 0
                                 ? static_cast<double>(c.window_tau_ns) / k_ns_per_s
                                 : k_default_tau_s;
        const double f = c.predicted_fidelity > 1e-300 ? c.predicted_fidelity : 1e-300;
        return -std::log(f) + wait_s(c, earliest_ns) / tau_s;
    }
    bool before(const pending_request& a, const pending_request& b) const noexcept override {
        return by_deadline(a, b);
    }
};

}  // namespace

const std::vector<std::string_view>& policy_names() {
    static const std::vector<std::string_view> names = {"fifo", "edf-backfill",
                                                        "priority-preempt", "fidelity-aware"};
    return names;
}

result<std::unique_ptr<placement_policy>> make_policy(std::string_view name) {
    if (name == "fifo") {
        return std::unique_ptr<placement_policy>(std::make_unique<fifo>());
    }
    if (name == "edf-backfill") {
        return std::unique_ptr<placement_policy>(std::make_unique<edf_backfill>());
    }
    if (name == "priority-preempt") {
        return std::unique_ptr<placement_policy>(std::make_unique<priority_preempt>());
    }
    if (name == "fidelity-aware") {
        return std::unique_ptr<placement_policy>(std::make_unique<fidelity_aware>());
    }
    return make_error(reason::invalid_argument,
                      "policy \"" + std::string(name) +
                          "\" is unknown (fifo, edf-backfill, priority-preempt, fidelity-aware)");
}

}  // namespace qrt::timeline
