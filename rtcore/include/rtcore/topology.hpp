#pragma once
// CPU topology from hwloc: packages, NUMA nodes, cores with their SMT
// siblings, the online CPUs, and which CPUs are near a PCI device or a network
// interface.
//
// Three sources, so plans can be tested on machines this one is not:
//   topology::from_system()                         the running host (sysfs)
//   topology::from_synthetic("package:2 core:16 pu:2")   hwloc synthetic
//   topology::from_xml("tests/data/topology/x.xml")       an lstopo XML export
//
// hwloc itself stays behind this header (it is a private dependency of
// rtcore): the hwloc_topology_t is owned by the topology object and destroyed
// with it.  Everything else is copied out into plain values at load time, so
// the accessors are cheap and never fail.
//
// CPU numbers are the kernel's logical CPU numbers (hwloc PU os_index), the
// same numbers /proc/irq/*/smp_affinity_list and cpuset.cpus use.

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"

namespace rtcore {

struct topo_package {
    unsigned index = 0;   // hwloc logical index, 0..n-1
    cpu_set cpus;
};

struct topo_numa_node {
    unsigned index = 0;   // OS NUMA node number (node0, node1, ...)
    cpu_set cpus;
};

struct topo_core {
    unsigned index = 0;    // logical index, 0..n-1, in topology order
    unsigned package = 0;  // topo_package::index of its package
    int numa_node = -1;    // topo_numa_node::index, -1 when hwloc shows none
    cpu_set cpus;          // its PUs: one CPU, or the SMT siblings together
};

// A PCI device or network interface hwloc knows, for error messages and
// for `qrtd host plan` to list what a locality hint can name.
struct topo_io_device {
    std::string kind;    // "pci" or "netif"
    std::string name;    // "0000:00:03.0" or "eth0"
    cpu_set near_cpus;   // CPUs of its closest non-I/O ancestor
};

class topology {
public:
    // The running host.  Includes CPUs the calling process is not allowed to
    // use (cgroup or affinity restrictions), so a plan sees the whole machine.
    static result<topology> from_system();
    // hwloc synthetic description, e.g. "package:2 core:16 pu:2" or
    // "package:2 numa:1 core:4 pu:2".  Synthetic topologies have no I/O
    // devices.
    static result<topology> from_synthetic(std::string_view description);
    // An XML export (lstopo --of xml), I/O devices included.
    static result<topology> from_xml(const std::filesystem::path& path);

    topology(topology&&) noexcept;
    topology& operator=(topology&&) noexcept;
    topology(const topology&) = delete;
    topology& operator=(const topology&) = delete;
    ~topology();

    // "system", "synthetic:<description>" or "xml:<path>".
    const std::string& source() const;

    const std::vector<topo_package>& packages() const;
    const std::vector<topo_numa_node>& numa_nodes() const;
    // In topology order, which is ascending by first CPU on Linux.
    const std::vector<topo_core>& cores() const;
    // Every online CPU.
    const cpu_set& online_cpus() const;
    // The PCI devices and network interfaces seen by hwloc (empty for
    // synthetic topologies).
    const std::vector<topo_io_device>& io_devices() const;

    // The core holding cpu, or nullptr when cpu is not online.
    const topo_core* core_of(unsigned cpu) const;
    // All SMT siblings of cpu, cpu included; empty when cpu is not online.
    cpu_set siblings_of(unsigned cpu) const;
    // true when some core has more than one PU.
    bool has_smt() const;

    // CPUs local to a PCI device ("0000:00:04.0"; "00:04.0" means domain 0).
    // Error names the device and the PCI devices hwloc does know.
    result<cpu_set> cpus_near_pci(std::string_view bus_id) const;
    // CPUs local to a network interface ("eth0").  Error names the interface
    // and the interfaces hwloc does know.
    result<cpu_set> cpus_near_netif(std::string_view name) const;
    // cpus_near_pci when device looks like a PCI bus id, else cpus_near_netif.
    result<cpu_set> cpus_near_device(std::string_view device) const;

    // One line per core, e.g. "core 3 (package 1, numa 1): cpus 6-7".
    std::string describe() const;

    struct impl;

private:
    explicit topology(std::unique_ptr<impl> p);
    std::unique_ptr<impl> _impl;
};

// "0000:00:04.0" or "00:04.0" (hex digits, domain optional).
bool looks_like_pci_bus_id(std::string_view text);

}  // namespace rtcore
