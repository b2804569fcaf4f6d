#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "decode.hpp"
#include "qrt_bpf/outlier.hpp"

namespace qrt_bpf {

namespace {

std::string format_us(std::uint64_t ns) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f us", static_cast<double>(ns) / 1000.0);
    return buf;
}

}  // namespace

std::optional<outlier_cause> outlier::main_cause() const {
    const outlier_cause* best = nullptr;
    for (const outlier_cause& c : causes) {
        if (c.overlap_ns > 0 && (best == nullptr || c.overlap_ns > best->overlap_ns)) {
            best = &c;
        }
    }
    if (best == nullptr) {
        return std::nullopt;
    }
    return *best;
}

std::string outlier::summary() const {
    std::string s = "tid " + std::to_string(tid) + " (" + comm + ") on cpu " +
                    std::to_string(cpu) + ": " + format_us(latency_ns) + " after wakeup";
    std::string during;
    for (const outlier_cause& c : causes) {
        if (c.overlap_ns == 0) {
            continue;
        }
        during += (during.empty() ? "" : ", ") + c.source() + " " + format_us(c.overlap_ns);
    }
    s += during.empty() ? "; nothing recorded ran in the window (wakeup path / hypervisor?)"
                        : "; during it: " + during;
    return s;
}

namespace detail {

outlier decode_outlier(const qrt_outlier_event& ev) {
    outlier o;
    o.tid = ev.tid;
    o.comm = field_name(ev.comm, sizeof(ev.comm));
    o.cpu = ev.cpu;
    o.waker_cpu = ev.waker_cpu;
    o.wakeup_ns = ev.wakeup_ns;
    o.switch_ns = ev.switch_ns;
    o.latency_ns = ev.latency_ns;
    for (const qrt_outlier_record& r : ev.records) {
        if (r.kind == 0) {
            continue;
        }
        outlier_cause c;
        c.kind = static_cast<intrusion_kind>(r.kind);
        c.id = r.id;
        c.name = field_name(r.name, sizeof(r.name));
        c.start_ns = r.start_ns;
        c.duration_ns = r.duration_ns;
        const std::uint64_t end_ns = r.start_ns + r.duration_ns;
        const std::uint64_t lo = std::max<std::uint64_t>(r.start_ns, ev.wakeup_ns);
        const std::uint64_t hi = std::min<std::uint64_t>(end_ns, ev.switch_ns);
        c.overlap_ns = hi > lo ? hi - lo : 0;
        o.causes.push_back(std::move(c));
    }
    std::sort(o.causes.begin(), o.causes.end(),
              [](const outlier_cause& a, const outlier_cause& b) { return a.start_ns < b.start_ns; });
    return o;
}

std::optional<outlier> decode_outlier_record(const void* data, std::size_t size) {
    if (data == nullptr || size < sizeof(qrt_outlier_event)) {
        return std::nullopt;
    }
    qrt_outlier_event ev;
    std::memcpy(&ev, data, sizeof(ev));
    return decode_outlier(ev);
}

}  // namespace detail
}  // namespace qrt_bpf
