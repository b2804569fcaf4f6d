#pragma once
// Probe, then choose, then say so: pick tp_btf programs when the kernel can
// load them, raw_tp otherwise (after libbpf-tools' probe_tp_btf()).

#include <cstdint>
#include <string>

#include "rtcore/error.hpp"

struct bpf_object;

namespace qrt_bpf::detail {

// True when a BPF_PROG_TYPE_TRACING program attached to the raw tracepoint
// tp_name ("sched_switch") loads on this kernel.
bool kernel_has_tp_btf(const char* tp_name) noexcept;

// Turns autoload off for the flavour not chosen: programs are named
// tp_btf_<tp> and raw_tp_<tp>.  Returns the chosen flavour name.
// force_raw_tp skips the probe (tests of the fallback).
rtcore::result<std::string> select_flavour(bpf_object* obj, const char* probe_tp,
                                           bool force_raw_tp);

// Sum of bpf_prog_info.recursion_misses over the loaded programs of obj.
std::uint64_t recursion_misses(bpf_object* obj) noexcept;

// Routes libbpf's messages: debug dropped, the rest to stderr with a
// "bpf: " prefix.  Idempotent.
void install_libbpf_logger() noexcept;

// rtcore::error for a libbpf call that failed with -err (or errno), with a
// hint when it is a permission problem.
rtcore::error libbpf_error(const std::string& what, int err);

}  // namespace qrt_bpf::detail
