#pragma once
// Load what actually loads: every handler exists as tp_btf_<tp> and
// raw_tp_<tp>; each is tried as tp_btf first, and a handler whose tp_btf
// program the kernel rejects falls back to raw_tp alone.  Errors name the
// real cause: the errno, the verifier log's last lines, and a capability
// only when one is actually missing.

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>

#include "rtcore/error.hpp"

struct bpf_object;

namespace qrt_bpf::detail {

// True when a BPF_PROG_TYPE_TRACING program attached to the raw tracepoint
// tp_name ("sched_switch") loads on this kernel (after libbpf-tools'
// probe_tp_btf()).  False means no tp_btf at all: every handler is raw_tp.
bool kernel_has_tp_btf(const char* tp_name) noexcept;

// Which handlers run as raw_tp.  all_raw: every one (forced, or no tp_btf
// on this kernel); otherwise those in raw, by tracepoint name.
struct flavour_plan {
    bool all_raw = false;
    std::set<std::string, std::less<>> raw;

    bool is_raw(std::string_view tp) const { return all_raw || raw.contains(tp); }
    // "tp_btf", "raw_tp", or "tp_btf, raw_tp for irq_handler_entry,sched_switch".
    std::string describe() const;
};

// Turns autoload on for the chosen flavour of each handler and off for the
// other.  A program named neither tp_btf_* nor raw_tp_* is an error.
rtcore::status apply_plan(bpf_object* obj, const flavour_plan& plan);

// The last max_lines non-empty lines of a verifier log, joined with " | ".
std::string log_tail(std::string_view log, unsigned max_lines = 3);

// Opens a fresh object (open() also sets its rodata) and loads it (load())
// by plan: all tp_btf unless force_raw_tp or the kernel has no tp_btf.  When
// the kernel rejects a tp_btf program, that handler alone moves to raw_tp,
// a line on stderr says so with the verifier's reason, and the object is
// opened and loaded again (at most once per handler).  A raw_tp program the
// kernel rejects is the error, naming the program, the errno and the log.
struct load_report {
    std::string flavour;            // flavour_plan::describe()
    std::string tp_btf_rejections;  // "tp_btf_x: <errno>: <log tail>; ...", or empty
};
rtcore::result<load_report> load_with_fallback(const std::string& probe, bool force_raw_tp,
                                               const std::function<rtcore::result<bpf_object*>()>& open,
                                               const std::function<int()>& load);

// Sum of bpf_prog_info.recursion_misses over the loaded programs of obj.
std::uint64_t recursion_misses(bpf_object* obj) noexcept;

// Routes libbpf's messages: debug dropped, the rest to stderr with a
// "bpf: " prefix.  Idempotent.
void install_libbpf_logger() noexcept;

// True when this thread holds what loading BPF tracing programs needs:
// CAP_SYS_ADMIN, or CAP_BPF and CAP_PERFMON.  Empty when it does; else the
// missing capabilities ("CAP_PERFMON").
std::string missing_bpf_capabilities();

// rtcore::error for a libbpf call that failed with -err (or errno).  EPERM
// blames a capability only when missing_bpf_capabilities() names one;
// with every capability held it says what else denies it.  verifier_log,
// when given, is quoted by its last lines.
rtcore::error libbpf_error(const std::string& what, int err, std::string_view verifier_log = {});

}  // namespace qrt_bpf::detail
