#pragma once
// Whether the eBPF probes can run here, and if not, why.  Rendered as
// "available" or "unavailable (<reason>)" in agent.status and by the tools.
// Nothing in qrt_bpf throws to say a probe cannot load: it reports.

#include <string>

#include "rtcore/host_fs.hpp"

namespace qrt_bpf {

class availability {
public:
    static availability ok() { return availability(true, {}); }
    static availability unavailable(std::string reason) {
        return availability(false, std::move(reason));
    }

    bool available() const noexcept { return _available; }
    const std::string& reason() const noexcept { return _reason; }
    // "available" or "unavailable (<reason>)".
    std::string to_string() const;

private:
    availability(bool available, std::string reason)
        : _reason(std::move(reason)), _available(available) {}
    std::string _reason;
    bool _available;
};

// True when qrt_bpf was built with the BPF programs (clang, bpftool and
// kernel BTF were present at build time).
bool built_with_probes() noexcept;
// Why the build has no probes; empty when it has them.
const char* built_without_reason() noexcept;

// The kernel BTF file CO-RE relocations and tp_btf programs need.
inline constexpr const char* kernel_btf_path = "/sys/kernel/btf/vmlinux";

// Checks done before touching the bpf() syscall: the build has probes, the
// kernel exposes BTF (through fs, so tests use fake trees), and the process
// holds CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) in its effective set.
availability preflight(const rtcore::host_fs& fs);

}  // namespace qrt_bpf
