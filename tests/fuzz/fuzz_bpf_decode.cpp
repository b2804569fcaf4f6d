// libFuzzer target for the userspace decoders of what the eBPF probes hand
// over (bpf/src/decode.hpp), fed arbitrary bytes as a buggy or newer BPF side
// (or a corrupted map) could produce them.  The first byte picks the record:
//   0: a probe-3 ring buffer record, through decode_outlier_record(), the
//      function the ring buffer callback calls (any size);
//   1: probe-2 map entries (key, value pairs), through decode_intrusion(),
//      then sort_by_total() and merge_cpus() as `qrtd intrusions` does;
//   2: probe-1 per-CPU histograms, through sum_cpus(), then the quantiles.
// Checked on every input:
//   - a short ring record is dropped, never read past;
//   - an outlier's causes are the non-empty slots, oldest first, each overlap
//     within both its own duration and the latency window; main_cause() is
//     the largest overlap; summary() is one line naming the thread;
//   - names are bounded by their fixed-size fields, with or without a NUL;
//   - merging per-CPU intrusions conserves counts and totals (mod 2^64) and
//     keeps one entry per source; the sort puts the largest total first;
//   - a summed histogram's quantiles are finite, monotonic in q, and never
//     above max_ns.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "decode.hpp"

namespace {

using namespace qrt_bpf;

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
    std::fprintf(stderr, "fuzz_bpf_decode: %s %s\n", what, detail.c_str());
    std::abort();
}

// Names from records go into log lines, events and reports.
bool printable(const std::string& s) {
    for (const char c : s) {
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
            return false;
        }
    }
    return true;
}

void check_outlier(const std::uint8_t* data, std::size_t size) {
    const auto o = detail::decode_outlier_record(data, size);
    if (size < sizeof(qrt_outlier_event)) {
        if (o) {
            fail("a short ring record was decoded");
        }
        return;
    }
    if (!o) {
        fail("a full-size ring record was dropped");
    }
    qrt_outlier_event ev;
    std::memcpy(&ev, data, sizeof(ev));
    std::size_t nonempty = 0;
    for (const auto& r : ev.records) {
        nonempty += r.kind != 0 ? 1 : 0;
    }
    if (o->causes.size() != nonempty) {
        fail("causes are not exactly the non-empty slots");
    }
    if (o->comm.size() > sizeof(ev.comm) || o->comm.find('\0') != std::string::npos) {
        fail("comm is not bounded by its field", o->comm);
    }
    if (!printable(o->comm)) {
        fail("comm is not printable (it goes into log lines and events)", o->comm);
    }
    const std::uint64_t window = ev.switch_ns > ev.wakeup_ns ? ev.switch_ns - ev.wakeup_ns : 0;
    std::uint64_t best = 0;
    for (std::size_t i = 0; i < o->causes.size(); ++i) {
        const outlier_cause& c = o->causes[i];
        if (i > 0 && c.start_ns < o->causes[i - 1].start_ns) {
            fail("causes are not oldest first");
        }
        if (c.overlap_ns > c.duration_ns || c.overlap_ns > window) {
            fail("an overlap is larger than its run or the latency window");
        }
        if (c.name.size() > QRT_OUTLIER_NAME_LEN || c.name.find('\0') != std::string::npos ||
            !printable(c.name)) {
            fail("a cause name is not bounded by its field", c.name);
        }
        if (c.source().empty()) {
            fail("a cause without a description");
        }
        best = std::max(best, c.overlap_ns);
    }
    const auto main = o->main_cause();
    if ((best == 0) != !main.has_value() || (main && main->overlap_ns != best)) {
        fail("main_cause() is not the largest overlap");
    }
    const std::string s = o->summary();
    if (s.find('\n') != std::string::npos || s.rfind("tid " + std::to_string(ev.tid) + " (", 0) != 0) {
        fail("summary() is not one line naming the thread", s);
    }
}

void check_intrusions(const std::uint8_t* data, std::size_t size) {
    constexpr std::size_t entry = sizeof(qrt_intrusion_key) + sizeof(qrt_intrusion_value);
    std::vector<intrusion> list;
    for (std::size_t off = 0; off + entry <= size && list.size() < 256; off += entry) {
        qrt_intrusion_key k;
        qrt_intrusion_value v;
        std::memcpy(&k, data + off, sizeof(k));
        std::memcpy(&v, data + off + sizeof(k), sizeof(v));
        intrusion i = detail::decode_intrusion(k, v);
        if (i.name.size() > QRT_INTRUSION_NAME_LEN || i.name.find('\0') != std::string::npos ||
            !printable(i.name)) {
            fail("an intrusion name is not bounded by its field", i.name);
        }
        if (i.cpu != k.cpu || i.id != k.id || i.count != v.count || i.total_ns != v.total_ns) {
            fail("an intrusion does not carry its key and value");
        }
        if (describe_source(i.kind, i.id, i.name).empty()) {
            fail("an intrusion without a description");
        }
        list.push_back(std::move(i));
    }
    sort_by_total(list);
    for (std::size_t i = 1; i < list.size(); ++i) {
        if (list[i].total_ns > list[i - 1].total_ns) {
            fail("sort_by_total() does not put the largest total first");
        }
    }
    const std::vector<intrusion> merged = merge_cpus(list);
    std::uint64_t count = 0;
    std::uint64_t total = 0;
    std::set<std::tuple<intrusion_kind, std::uint32_t, std::string>> sources;
    for (const auto& i : list) {
        count += i.count;
        total += i.total_ns;
        sources.emplace(i.kind, i.id, i.name);
    }
    std::uint64_t mcount = 0;
    std::uint64_t mtotal = 0;
    for (const auto& i : merged) {
        mcount += i.count;
        mtotal += i.total_ns;
    }
    if (merged.size() != sources.size() || mcount != count || mtotal != total) {
        fail("merge_cpus() lost or invented intrusions");
    }
}

void check_histograms(const std::uint8_t* data, std::size_t size) {
    const std::size_t ncpus = std::min<std::size_t>(size / sizeof(qrt_wakeup_hist), 8);
    std::vector<qrt_wakeup_hist> per_cpu(ncpus);
    if (ncpus > 0) {
        std::memcpy(per_cpu.data(), data, ncpus * sizeof(qrt_wakeup_hist));
    }
    const wakeup_histogram h = detail::sum_cpus(per_cpu.data(), per_cpu.size());
    double last = 0.0;
    for (const double q : {0.0, 0.5, 0.9, 0.99, 0.999, 1.0}) {
        const double v = h.quantile_ns(q);
        if (!std::isfinite(v) || v < 0.0 || v > static_cast<double>(h.max_ns) || v < last) {
            fail("a quantile is not finite, monotonic and within max_ns");
        }
        last = v;
    }
    if (!std::isfinite(h.mean_ns())) {
        fail("the mean is not finite");
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) {
        return 0;
    }
    switch (data[0] % 3) {
    case 0: check_outlier(data + 1, size - 1); break;
    case 1: check_intrusions(data + 1, size - 1); break;
    default: check_histograms(data + 1, size - 1); break;
    }
    return 0;
}
