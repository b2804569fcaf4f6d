// The restore allow-list: see restore_allow.hpp.

#include "rtcore/restore_allow.hpp"

#include <algorithm>
#include <cerrno>

#include "rtcore/cgroup_mounts.hpp"
#include "rtcore/knob_catalogue.hpp"
#include "rtcore/text.hpp"

namespace rtcore {

namespace {

constexpr std::string_view irq_prefix = "/proc/irq/";
constexpr std::string_view default_affinity = "/proc/irq/default_smp_affinity";

// The cpuset files qrtd writes inside the cgroups it creates.
constexpr std::array<std::string_view, 6> cgroup_files = {
    "cpuset.cpus",           "cpuset.mems",           "cpuset.cpu_exclusive",
    "cpuset.sched_load_balance", "cpuset.cpus.partition", "cpuset.cpus.exclusive",
};

// "/proc/irq/36/smp_affinity_list" and "/proc/irq/36/smp_affinity".
bool irq_affinity_file(std::string_view p) {
    if (p.substr(0, irq_prefix.size()) != irq_prefix) {
        return false;
    }
    p.remove_prefix(irq_prefix.size());
    const auto slash = p.find('/');
    if (slash == std::string_view::npos || !decimal_id(p.substr(0, slash))) {
        return false;
    }
    const auto leaf = p.substr(slash + 1);
    return leaf == "smp_affinity" || leaf == "smp_affinity_list";
}

std::pair<std::string_view, std::string_view> split_leaf(std::string_view p) {
    const auto slash = p.rfind('/');
    if (slash == std::string_view::npos) {
        return {"", p};
    }
    return {p.substr(0, slash == 0 ? 1 : slash), p.substr(slash + 1)};
}

error refused(const std::string& why) { return error{EPERM, why}; }

}  // namespace

restore_allow_list restore_allow_list::for_host(const host_fs& fs, std::string cgroup_prefix) {
    restore_allow_list a;
    a.cgroup_prefix = std::move(cgroup_prefix);
    const auto m = find_cgroup_mounts(fs);
    for (const auto& r : {m.v2_root, m.v1_cpuset_root}) {
        if (!r.empty() && canonical_path(r)) {
            a.cgroup_roots.push_back(r);
        }
    }
    return a;
}

bool restore_allow_list::is_qrt_cgroup(std::string_view dir) const {
    if (cgroup_prefix.empty()) {
        return false;
    }
    const auto [parent, leaf] = split_leaf(dir);
    const bool ours = leaf == cgroup_prefix + "-isolated" || leaf == cgroup_prefix + "-housekeeping";
    return ours && std::find(cgroup_roots.begin(), cgroup_roots.end(), parent) != cgroup_roots.end();
}

bool restore_allow_list::is_cgroup(std::string_view dir) const {
    return is_qrt_cgroup(dir) || std::find(cgroup_roots.begin(), cgroup_roots.end(), dir) != cgroup_roots.end();
}

bool restore_allow_list::allows_file(std::string_view p) const {
    if (p == default_affinity || irq_affinity_file(p)) {
        return true;
    }
    const auto [dir, leaf] = split_leaf(p);
    if (is_qrt_cgroup(dir) && std::find(cgroup_files.begin(), cgroup_files.end(), leaf) != cgroup_files.end()) {
        return true;
    }
    if (leaf == "cpuset.sched_load_balance" &&
        std::find(cgroup_roots.begin(), cgroup_roots.end(), dir) != cgroup_roots.end()) {
        return true;
    }
    if (workqueue_cpumasks &&
        std::find(workqueue_cpumask_paths.begin(), workqueue_cpumask_paths.end(), p) != workqueue_cpumask_paths.end()) {
        return true;
    }
    return false;
}

std::string restore_allow_list::summary() const {
    std::string s = "/proc/irq/<n>/smp_affinity[_list], /proc/irq/default_smp_affinity";
    if (cgroup_roots.empty()) {
        s += ", no cgroup (none is mounted)";
    }
    for (const auto& r : cgroup_roots) {
        s += ", " + join_path(r, cgroup_prefix + "-{isolated,housekeeping}") + " and the cpuset files of " + r;
    }
    if (workqueue_cpumasks) {
        for (const auto& w : workqueue_cpumask_paths) {
            s += ", " + std::string(w);
        }
    }
    if (runtime_knobs) {
        s += ", and for knob records the runtime knobs of host_knobs.hpp";
    }
    return s;
}

// One rule per record kind: a kind without one does not compile.
namespace {

error not_listed(const restore_allow_list& a, std::string_view what, std::string_view path) {
    return refused(std::string(what) + " " + std::string(path) + " is not on the restore allow-list (" +
                   a.summary() + ")");
}

status allowed(const restore_allow_list& /*a*/, const rec::header& /*r*/) { return ok(); }
status allowed(const restore_allow_list& /*a*/, const rec::apply& /*r*/) { return ok(); }
status allowed(const restore_allow_list& /*a*/, const rec::method& /*r*/) { return ok(); }
status allowed(const restore_allow_list& /*a*/, const rec::managed& /*r*/) { return ok(); }
status allowed(const restore_allow_list& /*a*/, const rec::aff& /*r*/) { return ok(); }
status allowed(const restore_allow_list& /*a*/, const rec::nomove& /*r*/) { return ok(); }

status allowed(const restore_allow_list& a, const rec::knob& r) {
    if (!a.runtime_knobs || !knob_at(r.path)) {
        return not_listed(a, "knob", r.path);
    }
    return ok();
}

status allowed(const restore_allow_list& a, const rec::file& r) {
    if (!a.allows_file(r.path)) {
        return not_listed(a, "path", r.path);
    }
    return ok();
}

status allowed(const restore_allow_list& a, const rec::ctl& r) {
    const auto [dir, leaf] = split_leaf(r.path);
    if (leaf != "cgroup.subtree_control" || !a.is_cgroup(dir)) {
        return not_listed(a, "path", r.path);
    }
    if (r.controller != "cpuset") {
        return refused("controller \"" + r.controller + "\" of " + r.path + " is not one qrtd enables (only cpuset)");
    }
    return ok();
}

status allowed(const restore_allow_list& a, const rec::mkcg& r) {
    if (!a.is_qrt_cgroup(r.dir)) {
        return not_listed(a, "cgroup", r.dir);
    }
    if (split_leaf(r.dir).first != r.parent) {
        return refused("cgroup " + r.dir + " is not directly under " + r.parent);
    }
    return ok();
}

status allowed(const restore_allow_list& a, const rec::cg& r) {
    if (!a.is_cgroup(r.from)) {
        return not_listed(a, "cgroup", r.from);
    }
    return ok();
}

}  // namespace

status restore_allow_list::check(const journal_record& r) const {
    return std::visit([this](const auto& x) { return allowed(*this, x); }, r);
}

}  // namespace rtcore
