// Probe 1 loader.  open -> configure rodata -> pick tp_btf/raw_tp -> load ->
// attach, with the skeleton (and the links it owns) released by RAII.
#include "qrt_bpf/wakeup_probe.hpp"

#include <cerrno>
#include <cstddef>
#include <vector>

#include "decode.hpp"
#include "qrt_bpf/availability.hpp"

#ifndef QRT_BPF_HAVE_PROBES
#define QRT_BPF_HAVE_PROBES 0
#endif
#if QRT_BPF_HAVE_PROBES
#include "loader_common.hpp"
#include "wakeup.skel.h"
#endif

namespace qrt_bpf {

// The shared layout, checked at compile time (and the map's value size at
// load time, against a stale object).
static_assert(sizeof(qrt_wakeup_hist) == (QRT_WAKEUP_BUCKETS + 3) * sizeof(__u64));
static_assert(offsetof(qrt_wakeup_hist, count) == QRT_WAKEUP_BUCKETS * sizeof(__u64));
static_assert(offsetof(qrt_wakeup_hist, max_ns) == (QRT_WAKEUP_BUCKETS + 2) * sizeof(__u64));

struct wakeup_probe::impl {
#if QRT_BPF_HAVE_PROBES
    struct skel_deleter {
        void operator()(qrt_wakeup* s) const noexcept { qrt_wakeup__destroy(s); }
    };
    std::unique_ptr<qrt_wakeup, skel_deleter> skel;
#endif
    std::string flavour;
};

wakeup_probe::wakeup_probe(std::unique_ptr<impl> p) : _impl(std::move(p)) {}
wakeup_probe::wakeup_probe(wakeup_probe&&) noexcept = default;
wakeup_probe& wakeup_probe::operator=(wakeup_probe&&) noexcept = default;
wakeup_probe::~wakeup_probe() = default;

const std::string& wakeup_probe::flavour() const { return _impl->flavour; }

#if QRT_BPF_HAVE_PROBES

rtcore::result<wakeup_probe> wakeup_probe::load(const wakeup_options& options) {
    detail::install_libbpf_logger();
    auto p = std::make_unique<impl>();
    auto loaded = detail::load_with_fallback(
        "wakeup", options.force_raw_tp,
        [&]() -> rtcore::result<bpf_object*> {
            p->skel.reset(qrt_wakeup__open());
            if (!p->skel) {
                return detail::libbpf_error("wakeup: qrt_wakeup__open", -errno);
            }
            p->skel->rodata->count_preempted = options.count_preempted;
            return p->skel->obj;
        },
        [&] { return qrt_wakeup__load(p->skel.get()); });
    if (!loaded) {
        return std::move(loaded).err();
    }
    p->flavour = loaded->flavour;
    if (auto st = detail::check_value_size(p->skel->maps.wakeup_hist, sizeof(qrt_wakeup_hist),
                                           "wakeup: map wakeup_hist");
        !st) {
        return std::move(st).err();
    }
    if (const int err = qrt_wakeup__attach(p->skel.get()); err != 0) {
        return detail::libbpf_error("wakeup: attach " + p->flavour + " programs", err);
    }
    return wakeup_probe(std::move(p));
}

rtcore::status wakeup_probe::add_tid(pid_t tid) {
    return detail::tid_map_update(_impl->skel->maps.dispatch_tids, tid, true, "wakeup");
}

rtcore::status wakeup_probe::remove_tid(pid_t tid) {
    auto st = detail::tid_map_update(_impl->skel->maps.dispatch_tids, tid, false, "wakeup");
    if (st && tid > 0) {
        // A pending wakeup of a removed thread would otherwise stay forever.
        const auto key = static_cast<std::uint32_t>(tid);
        (void)bpf_map__delete_elem(_impl->skel->maps.wakeup_start_ns, &key, sizeof(key), 0);
    }
    return st;
}

rtcore::result<wakeup_histogram> wakeup_probe::read() const {
    const int ncpus = libbpf_num_possible_cpus();
    if (ncpus <= 0) {
        return detail::libbpf_error("wakeup: libbpf_num_possible_cpus", ncpus);
    }
    std::vector<qrt_wakeup_hist> per_cpu(static_cast<std::size_t>(ncpus));
    const std::uint32_t zero = 0;
    const int err = bpf_map__lookup_elem(_impl->skel->maps.wakeup_hist, &zero, sizeof(zero),
                                         per_cpu.data(), per_cpu.size() * sizeof(qrt_wakeup_hist), 0);
    if (err != 0) {
        return detail::libbpf_error("wakeup: lookup map wakeup_hist", err);
    }
    return detail::sum_cpus(per_cpu.data(), per_cpu.size());
}

rtcore::result<std::vector<wakeup_histogram>> wakeup_probe::read_per_cpu() const {
    const int ncpus = libbpf_num_possible_cpus();
    if (ncpus <= 0) {
        return detail::libbpf_error("wakeup: libbpf_num_possible_cpus", ncpus);
    }
    std::vector<qrt_wakeup_hist> per_cpu(static_cast<std::size_t>(ncpus));
    const std::uint32_t zero = 0;
    const int err = bpf_map__lookup_elem(_impl->skel->maps.wakeup_hist, &zero, sizeof(zero),
                                         per_cpu.data(), per_cpu.size() * sizeof(qrt_wakeup_hist), 0);
    if (err != 0) {
        return detail::libbpf_error("wakeup: lookup map wakeup_hist", err);
    }
    std::vector<wakeup_histogram> out;
    out.reserve(per_cpu.size());
    for (const qrt_wakeup_hist& h : per_cpu) {
        out.push_back(detail::sum_cpus(&h, 1));
    }
    return out;
}

#else  // built without probes: load() reports why; no instance ever exists.

rtcore::result<wakeup_probe> wakeup_probe::load(const wakeup_options&) {
    return rtcore::error{ENOTSUP, built_without_reason()};
}
rtcore::status wakeup_probe::add_tid(pid_t) { return rtcore::error{ENOTSUP, built_without_reason()}; }
rtcore::status wakeup_probe::remove_tid(pid_t) { return rtcore::error{ENOTSUP, built_without_reason()}; }
rtcore::result<wakeup_histogram> wakeup_probe::read() const {
    return rtcore::error{ENOTSUP, built_without_reason()};
}
rtcore::result<std::vector<wakeup_histogram>> wakeup_probe::read_per_cpu() const {
    return rtcore::error{ENOTSUP, built_without_reason()};
}

#endif

}  // namespace qrt_bpf
