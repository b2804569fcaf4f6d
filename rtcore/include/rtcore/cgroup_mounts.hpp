#pragma once
// Where the cgroup hierarchies are mounted: what isolation chooses its
// method by, and what the journal's allow-list admits cgroup paths under
// (restore_allow.cpp).  Read-only and journal-free, so the journal does not
// depend on the isolation that journals into it.

#include <string>

#include "rtcore/host_fs.hpp"

namespace rtcore {

struct cgroup_mounts {
    std::string v2_root;         // "" when no cgroup2 mount
    std::string v1_cpuset_root;  // "" when no v1 cpuset mount
};
// From /proc/mounts, or the usual places when it cannot be read.
cgroup_mounts find_cgroup_mounts(const host_fs& fs);

}  // namespace rtcore
