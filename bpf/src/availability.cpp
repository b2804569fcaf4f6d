#include "qrt_bpf/availability.hpp"

#include <string>

#include "feature_probe.hpp"

#ifndef QRT_BPF_HAVE_PROBES
#define QRT_BPF_HAVE_PROBES 0
#endif

namespace qrt_bpf {

std::string availability::to_string() const {
    return _available ? std::string("available") : "unavailable (" + _reason + ")";
}

bool built_with_probes() noexcept { return QRT_BPF_HAVE_PROBES != 0; }

const char* built_without_reason() noexcept {
#if QRT_BPF_HAVE_PROBES
    return "";
#else
    return "built without probes: " QRT_BPF_BUILT_WITHOUT_REASON;
#endif
}

availability preflight(const rtcore::host_fs& fs) {
    if (!built_with_probes()) {
        return availability::unavailable(built_without_reason());
    }
    if (!fs.exists(kernel_btf_path)) {
        return availability::unavailable(std::string("no kernel BTF at ") + kernel_btf_path +
                                         " (kernel built without CONFIG_DEBUG_INFO_BTF)");
    }
    if (const std::string missing = detail::missing_bpf_capabilities(); !missing.empty()) {
        return availability::unavailable("missing capability " + missing);
    }
    return availability::ok();
}

}  // namespace qrt_bpf
