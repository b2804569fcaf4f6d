// Probe 3 loader: ring buffer consumer on the housekeeping side.
#include "qrt_bpf/outlier_probe.hpp"

#include <cerrno>
#include <cstddef>
#include <utility>
#include <vector>

#include "decode.hpp"
#include "qrt_bpf/availability.hpp"

#ifndef QRT_BPF_HAVE_PROBES
#define QRT_BPF_HAVE_PROBES 0
#endif
#if QRT_BPF_HAVE_PROBES
#include "loader_common.hpp"
#include "outliers.skel.h"
#endif

namespace qrt_bpf {

static_assert(sizeof(qrt_outlier_record) == 24 + QRT_OUTLIER_NAME_LEN);
static_assert(offsetof(qrt_outlier_event, comm) == 40);
static_assert(offsetof(qrt_outlier_event, records) == 56);
static_assert(sizeof(qrt_outlier_event) == 56 + QRT_OUTLIER_HISTORY * sizeof(qrt_outlier_record));
static_assert((QRT_OUTLIER_HISTORY & (QRT_OUTLIER_HISTORY - 1)) == 0);

struct outlier_probe::impl {
#if QRT_BPF_HAVE_PROBES
    struct skel_deleter {
        void operator()(qrt_outliers* s) const noexcept { qrt_outliers__destroy(s); }
    };
    struct ring_deleter {
        void operator()(ring_buffer* rb) const noexcept { ring_buffer__free(rb); }
    };
    // Declaration order matters: the ring buffer goes before the skeleton.
    std::unique_ptr<qrt_outliers, skel_deleter> skel;
    std::unique_ptr<ring_buffer, ring_deleter> ring;
    std::vector<outlier> pending;
    bool decode_failed = false;
#endif
    std::string flavour;
};

outlier_probe::outlier_probe(std::unique_ptr<impl> p) : _impl(std::move(p)) {}
outlier_probe::outlier_probe(outlier_probe&&) noexcept = default;
outlier_probe& outlier_probe::operator=(outlier_probe&&) noexcept = default;
outlier_probe::~outlier_probe() = default;

const std::string& outlier_probe::flavour() const { return _impl->flavour; }

#if QRT_BPF_HAVE_PROBES

namespace {

// libbpf calls this from ring_buffer__poll, on our thread.  Nothing may
// unwind through C, so allocation failures are only flagged.
int on_event(void* ctx, void* data, std::size_t size) noexcept {
    auto* p = static_cast<outlier_probe::impl*>(ctx);
    try {
        if (auto o = detail::decode_outlier_record(data, size)) {
            p->pending.push_back(std::move(*o));
        }
    } catch (...) {
        p->decode_failed = true;
    }
    return 0;
}

}  // namespace

rtcore::result<outlier_probe> outlier_probe::load(const outlier_options& options) {
    detail::install_libbpf_logger();
    auto p = std::make_unique<impl>();
    auto loaded = detail::load_with_fallback(
        "outliers", options.force_raw_tp,
        [&]() -> rtcore::result<bpf_object*> {
            p->skel.reset(qrt_outliers__open());
            if (!p->skel) {
                return detail::libbpf_error("outliers: qrt_outliers__open", -errno);
            }
            p->skel->rodata->threshold_ns = options.threshold_ns;
            return p->skel->obj;
        },
        [&] { return qrt_outliers__load(p->skel.get()); });
    if (!loaded) {
        return std::move(loaded).err();
    }
    p->flavour = loaded->flavour;
    if (const int err = qrt_outliers__attach(p->skel.get()); err != 0) {
        return detail::libbpf_error("outliers: attach " + p->flavour + " programs", err);
    }
    p->ring.reset(ring_buffer__new(bpf_map__fd(p->skel->maps.events), on_event, p.get(), nullptr));
    if (!p->ring) {
        return detail::libbpf_error("outliers: ring_buffer__new map events", -errno);
    }
    return outlier_probe(std::move(p));
}

rtcore::status outlier_probe::add_tid(pid_t tid) {
    return detail::tid_map_update(_impl->skel->maps.dispatch_tids, tid, true, "outliers");
}

rtcore::status outlier_probe::remove_tid(pid_t tid) {
    auto st = detail::tid_map_update(_impl->skel->maps.dispatch_tids, tid, false, "outliers");
    if (st && tid > 0) {
        const auto key = static_cast<std::uint32_t>(tid);
        (void)bpf_map__delete_elem(_impl->skel->maps.wakeups, &key, sizeof(key), 0);
    }
    return st;
}

rtcore::result<std::vector<outlier>> outlier_probe::poll(int timeout_ms) {
    const int n = ring_buffer__poll(_impl->ring.get(), timeout_ms);
    if (n < 0 && n != -EINTR) {
        return detail::libbpf_error("outliers: ring_buffer__poll", n);
    }
    if (_impl->decode_failed) {
        _impl->decode_failed = false;
        _impl->pending.clear();
        return rtcore::error{ENOMEM, "outliers: decoding an event failed (out of memory)"};
    }
    std::vector<outlier> out;
    out.swap(_impl->pending);
    return out;
}

rtcore::result<std::uint64_t> outlier_probe::dropped() const {
    const int ncpus = libbpf_num_possible_cpus();
    if (ncpus <= 0) {
        return detail::libbpf_error("outliers: libbpf_num_possible_cpus", ncpus);
    }
    std::vector<std::uint64_t> per_cpu(static_cast<std::size_t>(ncpus));
    const std::uint32_t zero = 0;
    const int err = bpf_map__lookup_elem(_impl->skel->maps.dropped_events, &zero, sizeof(zero),
                                         per_cpu.data(), per_cpu.size() * sizeof(std::uint64_t), 0);
    if (err != 0) {
        return detail::libbpf_error("outliers: lookup map dropped_events", err);
    }
    std::uint64_t total = 0;
    for (std::uint64_t v : per_cpu) {
        total += v;
    }
    return total;
}

int outlier_probe::epoll_fd() const { return ring_buffer__epoll_fd(_impl->ring.get()); }

#else

rtcore::result<outlier_probe> outlier_probe::load(const outlier_options&) {
    return rtcore::error{ENOTSUP, built_without_reason()};
}
rtcore::status outlier_probe::add_tid(pid_t) { return rtcore::error{ENOTSUP, built_without_reason()}; }
rtcore::status outlier_probe::remove_tid(pid_t) { return rtcore::error{ENOTSUP, built_without_reason()}; }
rtcore::result<std::vector<outlier>> outlier_probe::poll(int) {
    return rtcore::error{ENOTSUP, built_without_reason()};
}
rtcore::result<std::uint64_t> outlier_probe::dropped() const {
    return rtcore::error{ENOTSUP, built_without_reason()};
}
int outlier_probe::epoll_fd() const { return -1; }

#endif

}  // namespace qrt_bpf
