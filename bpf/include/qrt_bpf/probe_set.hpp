#pragma once
// The three probes as the agent uses them.  start() never throws and never
// fails: what could not load is reported by availability(), and the agent
// keeps running ("probes: unavailable (missing capability CAP_BPF)").
//
//   qrt_bpf::probe_config cfg;
//   cfg.isolated_cpus = partition.isolated;
//   auto probes = qrt_bpf::probe_set::start(cfg);
//   status["probes"] = probes.availability().to_string();
//   probes.add_tid(dispatch_tid);
//   ... housekeeping loop: probes.wakeup(), probes.intrusions(), probes.poll_outliers(0)

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qrt_bpf/availability.hpp"
#include "qrt_bpf/intrusion_probe.hpp"
#include "qrt_bpf/outlier_probe.hpp"
#include "qrt_bpf/wakeup_probe.hpp"
#include "rtcore/cpu_set.hpp"
#include "rtcore/host_fs.hpp"

namespace qrt_bpf {

struct probe_config {
    bool wakeup = true;
    bool intrusions = true;  // needs isolated_cpus
    bool outliers = true;
    rtcore::cpu_set isolated_cpus;
    std::uint64_t outlier_threshold_ns = 100'000;
    bool count_preempted = true;
    bool force_raw_tp = false;  // skip the tp_btf feature probe
    // Tasks that are not intrusions on the isolated CPUs (dispatch threads,
    // their SQPOLL pollers), known before the probes attach.
    std::vector<pid_t> intrusion_exempt_tids;
};

class probe_set {
public:
    // Preflight (build, BTF through fs, capabilities), then each enabled probe.
    static probe_set start(const probe_config& config,
                           const rtcore::host_fs& fs = rtcore::host_fs::system()) noexcept;
    // A set with nothing loaded, reporting why.
    static probe_set none(std::string reason);

    // available only when every enabled probe loaded; otherwise the first
    // reason ("wakeup: load: Operation not permitted ...").
    const qrt_bpf::availability& availability() const noexcept { return _availability; }
    // Per probe: "available", "unavailable (...)" or "disabled".
    std::string describe() const;

    // Forwarded to every loaded probe; the first error is returned.
    rtcore::status add_tid(pid_t tid);
    rtcore::status remove_tid(pid_t tid);

    wakeup_probe* wakeup() noexcept { return _wakeup ? &*_wakeup : nullptr; }
    intrusion_probe* intrusions() noexcept { return _intrusions ? &*_intrusions : nullptr; }
    outlier_probe* outliers() noexcept { return _outliers ? &*_outliers : nullptr; }

private:
    probe_set() : _availability(availability::unavailable("not started")) {}
    qrt_bpf::availability _availability;
    std::string _wakeup_state = "disabled";
    std::string _intrusions_state = "disabled";
    std::string _outliers_state = "disabled";
    std::optional<wakeup_probe> _wakeup;
    std::optional<intrusion_probe> _intrusions;
    std::optional<outlier_probe> _outliers;
};

}  // namespace qrt_bpf
