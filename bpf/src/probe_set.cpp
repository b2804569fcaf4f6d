#include "qrt_bpf/probe_set.hpp"

#include <exception>

namespace qrt_bpf {

namespace {

template <typename Probe, typename Options>
void start_one(const char* name, const Options& options, std::optional<Probe>& slot,
               std::string& state, std::string& first_failure) {
    auto loaded = Probe::load(options);
    if (loaded) {
        slot.emplace(std::move(*loaded));
        state = "available (" + slot->flavour() + ")";
        return;
    }
    state = "unavailable (" + loaded.err().message + ")";
    if (first_failure.empty()) {
        first_failure = std::string(name) + ": " + loaded.err().message;
    }
}

}  // namespace

probe_set probe_set::none(std::string reason) {
    probe_set s;
    s._availability = availability::unavailable(reason);
    return s;
}

probe_set probe_set::start(const probe_config& config, const rtcore::host_fs& fs) noexcept {
    try {
        probe_set s;
        const qrt_bpf::availability pre = preflight(fs);
        if (!pre.available()) {
            s._availability = pre;
            const std::string state = pre.to_string();
            s._wakeup_state = config.wakeup ? state : "disabled";
            s._intrusions_state = config.intrusions ? state : "disabled";
            s._outliers_state = config.outliers ? state : "disabled";
            return s;
        }
        std::string failure;
        if (config.wakeup) {
            start_one("wakeup", wakeup_options{config.count_preempted, config.force_raw_tp}, s._wakeup, s._wakeup_state,
                      failure);
        }
        if (config.intrusions) {
            start_one("intrusions",
                      intrusion_options{config.isolated_cpus, config.force_raw_tp, config.intrusion_exempt_tids},
                      s._intrusions, s._intrusions_state, failure);
        }
        if (config.outliers) {
            start_one("outliers", outlier_options{config.outlier_threshold_ns, config.force_raw_tp}, s._outliers,
                      s._outliers_state, failure);
        }
        s._availability = failure.empty() ? availability::ok() : availability::unavailable(failure);
        return s;
    } catch (const std::exception& e) {
        try {
            return none(std::string("probe start failed: ") + e.what());
        } catch (...) {
        }
    } catch (...) {
    }
    return probe_set();
}

std::string probe_set::describe() const {
    return "wakeup: " + _wakeup_state + "; intrusions: " + _intrusions_state +
           "; outliers: " + _outliers_state;
}

rtcore::status probe_set::add_tid(pid_t tid) {
    rtcore::status first;
    auto note = [&first](rtcore::status st) {
        if (!st && first) {
            first = std::move(st);
        }
    };
    if (_wakeup) {
        note(_wakeup->add_tid(tid));
    }
    if (_intrusions) {
        note(_intrusions->add_tid(tid));
    }
    if (_outliers) {
        note(_outliers->add_tid(tid));
    }
    return first;
}

rtcore::status probe_set::remove_tid(pid_t tid) {
    rtcore::status first;
    auto note = [&first](rtcore::status st) {
        if (!st && first) {
            first = std::move(st);
        }
    };
    if (_wakeup) {
        note(_wakeup->remove_tid(tid));
    }
    if (_intrusions) {
        note(_intrusions->remove_tid(tid));
    }
    if (_outliers) {
        note(_outliers->remove_tid(tid));
    }
    return first;
}

}  // namespace qrt_bpf
