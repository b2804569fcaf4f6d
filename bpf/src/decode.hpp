#pragma once
// Decoding of the raw BPF records (shared_abi.hpp) into the public C++ types.
// Pure functions: unit tests feed them hand-made records.

#include <cstddef>
#include <optional>

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

// One probe-3 ring buffer record as libbpf hands it to the callback: size
// bytes at data.  A record shorter than qrt_outlier_event is nullopt (a
// longer one is a newer BPF side: its extra bytes are ignored).  Copies the
// record out first, so nothing depends on its alignment.  fuzz_bpf_decode
// feeds it arbitrary bytes.
std::optional<outlier> decode_outlier_record(const void* data, std::size_t size);

}  // namespace qrt_bpf::detail
