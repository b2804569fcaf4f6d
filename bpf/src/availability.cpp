#include "qrt_bpf/availability.hpp"

#include <sys/capability.h>

#include <memory>
#include <string>

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

namespace {

// Effective capability check through libcap; unknown capability numbers
// (old libcap) count as absent.
bool has_effective(cap_t caps, cap_value_t cap) {
    cap_flag_value_t value = CAP_CLEAR;
    if (cap_get_flag(caps, cap, CAP_EFFECTIVE, &value) != 0) {
        return false;
    }
    return value == CAP_SET;
}

}  // namespace

availability preflight(const rtcore::host_fs& fs) {
    if (!built_with_probes()) {
        return availability::unavailable(built_without_reason());
    }
    if (!fs.exists(kernel_btf_path)) {
        return availability::unavailable(std::string("no kernel BTF at ") + kernel_btf_path +
                                         " (kernel built without CONFIG_DEBUG_INFO_BTF)");
    }
    std::unique_ptr<std::remove_pointer_t<cap_t>, int (*)(void*)> caps(cap_get_proc(), cap_free);
    if (!caps) {
        return availability::unavailable("cap_get_proc failed");
    }
    if (has_effective(caps.get(), CAP_SYS_ADMIN)) {
        return availability::ok();
    }
    const bool bpf = has_effective(caps.get(), CAP_BPF);
    const bool perfmon = has_effective(caps.get(), CAP_PERFMON);
    if (!bpf && !perfmon) {
        return availability::unavailable("missing capability CAP_BPF and CAP_PERFMON");
    }
    if (!bpf) {
        return availability::unavailable("missing capability CAP_BPF");
    }
    if (!perfmon) {
        return availability::unavailable("missing capability CAP_PERFMON");
    }
    return availability::ok();
}

}  // namespace qrt_bpf
