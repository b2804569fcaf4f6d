// Probe 2 loader.  The isolated CPU set is rodata (a 1024-bit mask), so a new
// partition means a new load.
#include "qrt_bpf/intrusion_probe.hpp"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstddef>
#include <map>
#include <tuple>
#include <vector>

#include "decode.hpp"
#include "qrt_bpf/availability.hpp"
#include "rtcore/clock.hpp"

#ifndef QRT_BPF_HAVE_PROBES
#define QRT_BPF_HAVE_PROBES 0
#endif
#if QRT_BPF_HAVE_PROBES
#include "intrusions.skel.h"
#include "loader_common.hpp"
#endif

namespace qrt_bpf {

static_assert(sizeof(qrt_intrusion_key) == 16 + QRT_INTRUSION_NAME_LEN);
static_assert(offsetof(qrt_intrusion_key, name) == 16);
static_assert(sizeof(qrt_intrusion_value) == 4 * sizeof(__u64));
static_assert(sizeof(qrt_intrusion_stats) == 2 * sizeof(__u64));
static_assert(QRT_INTRUSION_MAX_CPUS <= rtcore::cpu_set::max_cpus);
static_assert(intrusion_probe::max_keys == QRT_INTRUSION_MAX_KEYS);

struct intrusion_probe::impl {
#if QRT_BPF_HAVE_PROBES
    struct skel_deleter {
        void operator()(qrt_intrusions* s) const noexcept { qrt_intrusions__destroy(s); }
    };
    std::unique_ptr<qrt_intrusions, skel_deleter> skel;
#endif
    std::string flavour;
    // Totals of exited threads, by (cpu, command): prune_exited_tasks().
    std::map<std::tuple<unsigned, std::string>, intrusion> exited;
};

#if QRT_BPF_HAVE_PROBES
namespace {

// True when /proc/<tid>/comm exists and names `comm`.
bool task_alive(const rtcore::host_fs& fs, std::uint32_t tid, const std::string& comm) {
    auto text = fs.read("/proc/" + std::to_string(tid) + "/comm");
    if (!text) {
        return false;
    }
    std::string s = *text;
    while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) {
        s.pop_back();
    }
    return s == comm;
}

void add_into(intrusion& into, const intrusion& from) {
    into.count += from.count;
    into.total_ns += from.total_ns;
    into.max_ns = std::max(into.max_ns, from.max_ns);
    into.last_ns = std::max(into.last_ns, from.last_ns);
}

}  // namespace
#endif

intrusion_probe::intrusion_probe(std::unique_ptr<impl> p) : _impl(std::move(p)) {}
intrusion_probe::intrusion_probe(intrusion_probe&&) noexcept = default;
intrusion_probe& intrusion_probe::operator=(intrusion_probe&&) noexcept = default;
intrusion_probe::~intrusion_probe() = default;

const std::string& intrusion_probe::flavour() const { return _impl->flavour; }

#if QRT_BPF_HAVE_PROBES

rtcore::result<intrusion_probe> intrusion_probe::load(const intrusion_options& options) {
    if (options.isolated_cpus.empty()) {
        return rtcore::error::invalid("intrusions: no isolated CPUs to watch");
    }
    if (options.isolated_cpus.last() >= QRT_INTRUSION_MAX_CPUS) {
        return rtcore::error::invalid("intrusions: CPU " +
                                      std::to_string(options.isolated_cpus.last()) +
                                      " beyond the probe's limit of " +
                                      std::to_string(QRT_INTRUSION_MAX_CPUS) + " CPUs");
    }
    detail::install_libbpf_logger();
    auto p = std::make_unique<impl>();
    auto loaded = detail::load_with_fallback(
        "intrusions", options.force_raw_tp,
        [&]() -> rtcore::result<bpf_object*> {
            p->skel.reset(qrt_intrusions__open());
            if (!p->skel) {
                return detail::libbpf_error("intrusions: qrt_intrusions__open", -errno);
            }
            for (unsigned cpu : options.isolated_cpus.cpus()) {
                p->skel->rodata->isolated_mask[cpu / 64] |= 1ULL << (cpu % 64);
            }
            return p->skel->obj;
        },
        [&] { return qrt_intrusions__load(p->skel.get()); });
    if (!loaded) {
        return std::move(loaded).err();
    }
    p->flavour = loaded->flavour;
    if (auto st = detail::check_value_size(p->skel->maps.intrusions, sizeof(qrt_intrusion_value),
                                           "intrusions: map intrusions");
        !st) {
        return std::move(st).err();
    }
    for (const pid_t tid : options.exempt_tids) {
        if (auto st = detail::tid_map_update(p->skel->maps.dispatch_tids, tid, true, "intrusions"); !st) {
            return std::move(st).err();
        }
    }
    if (const int err = qrt_intrusions__attach(p->skel.get()); err != 0) {
        return detail::libbpf_error("intrusions: attach " + p->flavour + " programs", err);
    }
    return intrusion_probe(std::move(p));
}

rtcore::status intrusion_probe::add_tid(pid_t tid) {
    return detail::tid_map_update(_impl->skel->maps.dispatch_tids, tid, true, "intrusions");
}

rtcore::status intrusion_probe::remove_tid(pid_t tid) {
    return detail::tid_map_update(_impl->skel->maps.dispatch_tids, tid, false, "intrusions");
}

rtcore::result<std::vector<intrusion>> intrusion_probe::read() const {
    auto out = read_map();
    if (!out) {
        return out;
    }
    for (const auto& [key, row] : _impl->exited) {
        out->push_back(row);
    }
    sort_by_total(*out);
    return out;
}

rtcore::result<intrusion_prune_result> intrusion_probe::prune_exited_tasks(const rtcore::host_fs& fs,
                                                                          std::uint64_t min_idle_ns) {
    bpf_map* map = _impl->skel->maps.intrusions;
    auto list = read_map();
    if (!list) {
        return std::move(list).err();
    }
    const auto now_ns = static_cast<std::uint64_t>(rtcore::monotonic_now_ns());
    intrusion_prune_result r;
    r.live_keys = list->size();
    for (const intrusion& i : *list) {
        if (i.kind != intrusion_kind::task || i.id == 0 || now_ns - std::min(now_ns, i.last_ns) < min_idle_ns ||
            task_alive(fs, i.id, i.name)) {
            continue;
        }
        qrt_intrusion_key key{};
        key.kind = static_cast<__u32>(i.kind);
        key.cpu = i.cpu;
        key.id = i.id;
        std::memcpy(key.name, i.name.data(), std::min(i.name.size(), sizeof(key.name)));
        // Read again right before the delete: what the map holds is what moves.
        qrt_intrusion_value value{};
        if (bpf_map__lookup_elem(map, &key, sizeof(key), &value, sizeof(value), 0) != 0) {
            continue;
        }
        if (const int err = bpf_map__delete_elem(map, &key, sizeof(key), 0); err != 0 && err != -ENOENT) {
            return detail::libbpf_error("intrusions: delete exited tid " + std::to_string(i.id) +
                                            " from map intrusions",
                                        err);
        }
        intrusion row = detail::decode_intrusion(key, value);
        row.id = 0;
        auto k = std::make_tuple(row.cpu, row.name);
        auto it = _impl->exited.find(k);
        if (it == _impl->exited.end() && _impl->exited.size() >= max_exited_rows) {
            row.name = "(other)";
            k = std::make_tuple(row.cpu, row.name);
            it = _impl->exited.find(k);
        }
        if (it == _impl->exited.end()) {
            _impl->exited.emplace(k, row);
        } else {
            add_into(it->second, row);
        }
        ++r.pruned;
        --r.live_keys;
    }
    r.exited_rows = _impl->exited.size();
    return r;
}

rtcore::result<std::vector<intrusion>> intrusion_probe::read_map() const {
    bpf_map* map = _impl->skel->maps.intrusions;
    std::vector<intrusion> out;
    qrt_intrusion_key key{};
    qrt_intrusion_key next{};
    const void* prev = nullptr;
    // Bounded: the map never holds more than max_entries keys.
    for (unsigned n = 0; n <= QRT_INTRUSION_MAX_KEYS; ++n) {
        const int err = bpf_map__get_next_key(map, prev, &next, sizeof(next));
        if (err == -ENOENT) {
            break;
        }
        if (err != 0) {
            return detail::libbpf_error("intrusions: get_next_key map intrusions", err);
        }
        key = next;
        prev = &key;
        qrt_intrusion_value value{};
        const int lerr = bpf_map__lookup_elem(map, &key, sizeof(key), &value, sizeof(value), 0);
        if (lerr == -ENOENT) {
            continue;  // deleted meanwhile
        }
        if (lerr != 0) {
            return detail::libbpf_error("intrusions: lookup map intrusions", lerr);
        }
        out.push_back(detail::decode_intrusion(key, value));
    }
    sort_by_total(out);
    return out;
}

rtcore::result<intrusion_counters> intrusion_probe::counters() const {
    const int ncpus = libbpf_num_possible_cpus();
    if (ncpus <= 0) {
        return detail::libbpf_error("intrusions: libbpf_num_possible_cpus", ncpus);
    }
    std::vector<qrt_intrusion_stats> per_cpu(static_cast<std::size_t>(ncpus));
    const std::uint32_t zero = 0;
    const int err = bpf_map__lookup_elem(_impl->skel->maps.intrusion_stats, &zero, sizeof(zero),
                                         per_cpu.data(), per_cpu.size() * sizeof(per_cpu[0]), 0);
    if (err != 0) {
        return detail::libbpf_error("intrusions: lookup map intrusion_stats", err);
    }
    intrusion_counters c;
    for (const auto& s : per_cpu) {
        c.map_full += s.map_full;
        c.unmatched_exit += s.unmatched_exit;
    }
    c.recursion_misses = detail::recursion_misses(_impl->skel->obj);
    return c;
}

#else

rtcore::result<intrusion_probe> intrusion_probe::load(const intrusion_options&) {
    return rtcore::error{ENOTSUP, built_without_reason()};
}
rtcore::status intrusion_probe::add_tid(pid_t) { return rtcore::error{ENOTSUP, built_without_reason()}; }
rtcore::status intrusion_probe::remove_tid(pid_t) { return rtcore::error{ENOTSUP, built_without_reason()}; }
rtcore::result<std::vector<intrusion>> intrusion_probe::read() const {
    return rtcore::error{ENOTSUP, built_without_reason()};
}
rtcore::result<std::vector<intrusion>> intrusion_probe::read_map() const {
    return rtcore::error{ENOTSUP, built_without_reason()};
}
rtcore::result<intrusion_prune_result> intrusion_probe::prune_exited_tasks(const rtcore::host_fs&,
                                                                          std::uint64_t) {
    return rtcore::error{ENOTSUP, built_without_reason()};
}
rtcore::result<intrusion_counters> intrusion_probe::counters() const {
    return rtcore::error{ENOTSUP, built_without_reason()};
}

#endif

}  // namespace qrt_bpf
