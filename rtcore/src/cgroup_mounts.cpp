// Where the cgroup hierarchies are mounted: see cgroup_mounts.hpp.

#include "rtcore/cgroup_mounts.hpp"

#include <string_view>
#include <vector>

#include "rtcore/text.hpp"

namespace rtcore {

cgroup_mounts find_cgroup_mounts(const host_fs& fs) {
    cgroup_mounts m;
    if (auto text = fs.read("/proc/mounts")) {
        std::string_view rest = *text;
        while (!rest.empty()) {
            const auto nl = rest.find('\n');
            const auto line = rest.substr(0, nl);
            rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
            // device mountpoint type options dump pass
            std::vector<std::string_view> f;
            std::size_t pos = 0;
            while (pos < line.size() && f.size() < 4) {
                const auto sp = line.find(' ', pos);
                f.push_back(line.substr(pos, sp == std::string_view::npos ? std::string_view::npos : sp - pos));
                if (sp == std::string_view::npos) {
                    break;
                }
                pos = sp + 1;
            }
            if (f.size() < 4) {
                continue;
            }
            if (f[2] == "cgroup2" && m.v2_root.empty()) {
                m.v2_root = std::string(f[1]);
            } else if (f[2] == "cgroup" && m.v1_cpuset_root.empty()) {
                std::string opts(f[3]);
                for (auto& ch : opts) {
                    if (ch == ',') {
                        ch = ' ';
                    }
                }
                if (has_word(opts, "cpuset")) {
                    m.v1_cpuset_root = std::string(f[1]);
                }
            }
        }
        return m;
    }
    if (fs.exists("/sys/fs/cgroup/cgroup.controllers")) {
        m.v2_root = "/sys/fs/cgroup";
    } else if (fs.exists("/sys/fs/cgroup/unified/cgroup.controllers")) {
        m.v2_root = "/sys/fs/cgroup/unified";
    }
    if (fs.exists("/sys/fs/cgroup/cpuset/cpuset.cpus")) {
        m.v1_cpuset_root = "/sys/fs/cgroup/cpuset";
    }
    return m;
}

}  // namespace rtcore
