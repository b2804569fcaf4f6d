#pragma once
// `qrtd host plan --slurm`: the slurm.conf, cgroup.conf, gres.conf and
// plugstack.conf lines that keep Slurm's tasks off the CPUs this node's
// plan isolates for QPU dispatch, advertise its QPUs as the `qpu` GRES and
// load spank_qrt.so.  A pure function of the topology, the plan and the
// config, so it is tested on synthetic topologies.
//
// CPU numbers: slurm.conf's CpuSpecList takes Slurm's *abstract* CPU ids,
// which number the PUs package by package, core by core, the SMT threads
// of a core together: hwloc's topology order.  They differ from the
// kernel's numbers whenever the kernel interleaves SMT siblings (cpu0 and
// cpu4 on one core), so both are printed.

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "qrt/config.hpp"
#include "rtcore/partition_plan.hpp"
#include "rtcore/topology.hpp"

namespace qrt {

struct slurm_plan {
    std::string node_name;
    std::string isolated_os_cpus;         // kernel numbering, "2-3"
    std::string isolated_abstract_cpus;   // Slurm's numbering, CpuSpecList
    unsigned qpus = 0;
    std::vector<std::string> slurm_conf;
    std::vector<std::string> cgroup_conf;
    std::vector<std::string> gres_conf;
    std::vector<std::string> plugstack_conf;
    std::vector<std::string> notes;       // one sentence per caveat
};

struct slurm_plan_options {
    std::string node_name;  // slurm.conf NodeName (the short host name)
    std::string plugin_path = "/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_qrt.so";
    std::string healthcheck_path = "/usr/sbin/qrt-slurm-healthcheck";
};

slurm_plan plan_slurm(const rtcore::topology& topo, const rtcore::partition_plan& plan,
                      const config& cfg, const slurm_plan_options& opts);

// This host's name up to the first dot (slurm.conf's NodeName by default).
std::string short_hostname();

// The four files' lines under a heading each, with the notes as comments.
std::string format_slurm_plan(const slurm_plan& p);
nlohmann::json to_json(const slurm_plan& p);

}  // namespace qrt
