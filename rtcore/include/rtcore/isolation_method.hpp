#pragma once
// The runtime isolation methods (see isolation.hpp), by name.  A header of
// its own so the journal parser can name them without the isolation code.

#include <optional>
#include <string_view>

namespace rtcore {

enum class isolation_method { none, cgroup_v2_partition, cgroup_v1_cpuset, affinity_fence };

constexpr const char* to_string(isolation_method m) {
    switch (m) {
        case isolation_method::none: return "none";
        case isolation_method::cgroup_v2_partition: return "cgroup-v2-partition";
        case isolation_method::cgroup_v1_cpuset: return "cgroup-v1-cpuset";
        case isolation_method::affinity_fence: return "affinity-fence";
    }
    return "?";
}

constexpr std::optional<isolation_method> parse_isolation_method(std::string_view name) {
    for (auto m : {isolation_method::none, isolation_method::cgroup_v2_partition, isolation_method::cgroup_v1_cpuset,
                   isolation_method::affinity_fence}) {
        if (name == to_string(m)) {
            return m;
        }
    }
    return std::nullopt;
}

}  // namespace rtcore
