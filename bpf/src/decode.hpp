#pragma once
// Decoding of the raw BPF records (shared_abi.hpp) into the public C++ types.
// Pure functions: unit tests feed them hand-made records.

#include <cstddef>

#include "qrt_bpf/histogram.hpp"
#include "qrt_bpf/intrusion.hpp"
#include "qrt_bpf/outlier.hpp"
#include "shared_abi.hpp"

namespace qrt_bpf::detail {

// Sum of the per-CPU copies of the histogram (a PERCPU_ARRAY lookup returns
// one value per possible CPU, back to back).
wakeup_histogram sum_cpus(const qrt_wakeup_hist* per_cpu, std::size_t ncpus) noexcept;

intrusion decode_intrusion(const qrt_intrusion_key& key, const qrt_intrusion_value& value);

// Records ordered by start_ns, empty slots dropped, overlap with the
// [wakeup_ns, switch_ns] window computed.
outlier decode_outlier(const qrt_outlier_event& event);

}  // namespace qrt_bpf::detail
