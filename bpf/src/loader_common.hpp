#pragma once
// Small pieces every loader uses (private to qrt_bpf).

#include <bpf/libbpf.h>
#include <sys/types.h>

#include <cstdint>
#include <string>

#include "feature_probe.hpp"
#include "rtcore/error.hpp"

namespace qrt_bpf::detail {

inline rtcore::status tid_map_update(bpf_map* map, pid_t tid, bool add, const char* probe) {
    if (tid <= 0) {
        return rtcore::error::invalid(std::string(probe) + ": invalid tid " + std::to_string(tid));
    }
    const auto key = static_cast<std::uint32_t>(tid);
    const std::uint8_t one = 1;
    const int err = add ? bpf_map__update_elem(map, &key, sizeof(key), &one, sizeof(one), BPF_ANY)
                        : bpf_map__delete_elem(map, &key, sizeof(key), 0);
    if (err != 0 && !(err == -ENOENT && !add)) {
        return libbpf_error(std::string(probe) + ": " + (add ? "add" : "remove") + " tid " +
                                std::to_string(tid) + " in map dispatch_tids",
                            err);
    }
    return rtcore::ok();
}

inline rtcore::status check_value_size(const bpf_map* map, std::size_t expected, const char* what) {
    if (bpf_map__value_size(map) != expected) {
        return rtcore::error::invalid(std::string(what) + ": BPF value size " +
                                      std::to_string(bpf_map__value_size(map)) +
                                      " != C++ size " + std::to_string(expected) +
                                      " (stale build?)");
    }
    return rtcore::ok();
}


}  // namespace qrt_bpf::detail
