#include "qrt/slurm_plan.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace qrt {

namespace {

// "0-3,8": consecutive runs folded, as slurm.conf and the kernel write lists.
std::string fold(const std::vector<unsigned>& ids) {
    std::string out;
    for (std::size_t i = 0; i < ids.size();) {
        std::size_t j = i;
        while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) {
            ++j;
        }
        out += (out.empty() ? "" : ",") +
               (j > i ? fmt::format("{}-{}", ids[i], ids[j]) : fmt::format("{}", ids[i]));
        i = j + 1;
    }
    return out;
}

}  // namespace

std::string short_hostname() {
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) != 0) {
        return "NODE";
    }
    std::string s(name);
    return s.substr(0, s.find('.'));
}

slurm_plan plan_slurm(const rtcore::topology& topo, const rtcore::partition_plan& plan,
                      const config& cfg, const slurm_plan_options& opts) {
    slurm_plan p;
    p.node_name = opts.node_name.empty() ? "NODE" : opts.node_name;
    p.isolated_os_cpus = plan.isolated.to_list();
    p.qpus = static_cast<unsigned>(cfg.qpus.size());

    // Slurm's abstract ids: the PUs in topology order, the threads of one
    // core together (each core's PUs ascending by kernel number).
    std::vector<unsigned> abstract;
    unsigned next = 0;
    std::set<std::size_t> threads_per_core;
    std::vector<unsigned> cores_per_package(topo.packages().size(), 0);
    for (const auto& core : topo.cores()) {
        threads_per_core.insert(core.cpus.count());
        if (core.package < cores_per_package.size()) {
            ++cores_per_package[core.package];
        }
        for (const unsigned cpu : core.cpus.cpus()) {
            if (plan.isolated.test(cpu)) {
                abstract.push_back(next);
            }
            ++next;
        }
    }
    p.isolated_abstract_cpus = fold(abstract);
    const bool uniform = threads_per_core.size() == 1 &&
                         std::adjacent_find(cores_per_package.begin(), cores_per_package.end(),
                                            std::not_equal_to<>()) == cores_per_package.end() &&
                         !cores_per_package.empty();

    std::string node = fmt::format("NodeName={} CPUs={}", p.node_name, next);
    if (uniform) {
        node += fmt::format(" Sockets={} CoresPerSocket={} ThreadsPerCore={}",
                            cores_per_package.size(), cores_per_package.front(),
                            *threads_per_core.begin());
    } else {
        p.notes.push_back("the cores are not uniform across packages: give Sockets, "
                          "CoresPerSocket and ThreadsPerCore as `slurmd -C` prints them, and "
                          "check that its CPU order matches the CpuSpecList here");
    }
    if (!abstract.empty()) {
        node += " CpuSpecList=" + p.isolated_abstract_cpus;
    }
    if (p.qpus > 0) {
        node += fmt::format(" Gres=qpu:{}", p.qpus);
    }
    node += " State=UNKNOWN";

    p.slurm_conf = {
        "# Keep tasks off the CPUs qrtd isolates for QPU dispatch: CpuSpecList",
        "# reserves them (Slurm's abstract CPU ids), task/cgroup confines every",
        "# task to the rest, SlurmdOffSpec keeps slurmd and slurmstepd off them too.",
        "TaskPlugin=task/affinity,task/cgroup",
        "TaskPluginParam=SlurmdOffSpec",
        "ProctrackType=proctrack/cgroup",
        "GresTypes=qpu",
        "HealthCheckProgram=" + opts.healthcheck_path,
        "HealthCheckInterval=30",
        "HealthCheckNodeState=ANY",
        node,
    };
    p.cgroup_conf = {"ConstrainCores=yes"};
    if (p.qpus > 0) {
        p.gres_conf = {fmt::format("NodeName={} Name=qpu Count={}", p.node_name, p.qpus)};
    }
    std::string plug = "required " + opts.plugin_path;
    if (cfg.rpc.socket_path != "/run/qrtd/qrtd.sock") {
        plug += " socket=" + cfg.rpc.socket_path;
    }
    p.plugstack_conf = {std::move(plug)};

    if (abstract.empty()) {
        p.notes.push_back("this plan isolates no CPU: nothing to keep Slurm away from, and "
                          "qrtd reports itself degraded");
    } else {
        p.notes.push_back(fmt::format(
            "CpuSpecList={} names kernel CPU{} {} (Slurm counts the threads of a core together)",
            p.isolated_abstract_cpus, plan.isolated.count() == 1 ? "" : "s", p.isolated_os_cpus));
        p.notes.push_back("CoreSpecCount is not used: Slurm picks those cores itself, which "
                          "need not be the ones qrtd isolates");
        p.notes.push_back("leave AllowSpecResourcesUsage at its default (no), or a job can ask "
                          "for the isolated CPUs");
    }
    if (cfg.host.isolation == isolation_mode::automatic ||
        cfg.host.isolation == isolation_mode::cgroup1) {
        p.notes.push_back(
            "where the cpuset controller is on cgroup v1, set host.isolation = \"fence\" in "
            "qrtd.toml: with a v1 cpuset qrtd's exclusive isolated cpuset keeps slurmd from "
            "making its own (qrtd started first), or slurmd, moved into qrt-housekeeping, "
            "re-registers with fewer CPUs and is drained (slurmd started first); Slurm's "
            "task/cgroup with CpuSpecList confines the jobs either way");
    }
    p.notes.push_back("restart slurmd after changing CpuSpecList (scontrol reconfigure does "
                      "not move it); spank_qrt refuses any step whose cpuset still reaches "
                      "an isolated CPU");
    return p;
}

std::string format_slurm_plan(const slurm_plan& p) {
    std::string out;
    const auto section = [&out](std::string_view file, const std::vector<std::string>& lines) {
        out += fmt::format("# ---- {} ----\n", file);
        for (const auto& l : lines) {
            out += l + '\n';
        }
        out += '\n';
    };
    section("slurm.conf", p.slurm_conf);
    section("cgroup.conf", p.cgroup_conf);
    if (!p.gres_conf.empty()) {
        section("gres.conf", p.gres_conf);
    }
    section("plugstack.conf", p.plugstack_conf);
    out += "# notes:\n";
    for (const auto& n : p.notes) {
        out += "#   " + n + '\n';
    }
    return out;
}

nlohmann::json to_json(const slurm_plan& p) {
    return nlohmann::json{{"node_name", p.node_name},
                          {"isolated_os_cpus", p.isolated_os_cpus},
                          {"isolated_abstract_cpus", p.isolated_abstract_cpus},
                          {"qpus", p.qpus},
                          {"slurm_conf", p.slurm_conf},
                          {"cgroup_conf", p.cgroup_conf},
                          {"gres_conf", p.gres_conf},
                          {"plugstack_conf", p.plugstack_conf},
                          {"notes", p.notes}};
}

}  // namespace qrt
