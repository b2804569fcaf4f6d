#pragma once
// Decoding of the raw BPF records (shared_abi.hpp) into the public C++ types.
// Pure functions: unit tests feed them hand-made records.

#include <cstddef>
#include <cstring>
#include <optional>
#include <string>

#include "qrt_bpf/histogram.hpp"
#include "qrt_bpf/intrusion.hpp"
#include "qrt_bpf/outlier.hpp"
#include "shared_abi.hpp"

namespace qrt_bpf::detail {

// A fixed-size name field of a record (a task's comm, an IRQ's name): the
// bytes up to the first NUL, each byte outside printable ASCII as '?'.  Any
// task may name itself anything (prctl PR_SET_NAME), and these names go into
// log lines, events and reports: a newline in one must not forge a line.
inline std::string field_name(const char* field, std::size_t size) {
    std::string s(field, ::strnlen(field, size));
    for (char& c : s) {
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
            c = '?';
        }
    }
    return s;
}

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
