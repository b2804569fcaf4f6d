#include "rtcore/topology.hpp"

#include <hwloc.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <utility>

namespace rtcore {

namespace {

// RAII owner of a hwloc_topology_t.
struct hwloc_handle {
    hwloc_topology_t topo = nullptr;

    hwloc_handle() = default;
    hwloc_handle(const hwloc_handle&) = delete;
    hwloc_handle& operator=(const hwloc_handle&) = delete;
    ~hwloc_handle() {
        if (topo != nullptr) {
            hwloc_topology_destroy(topo);
        }
    }
};

// hwloc bitmap (PU os indexes) -> cpu_set, with hwloc's own iteration.  CPUs
// beyond cpu_set::max_cpus cannot be represented and are reported.
result<cpu_set> to_cpu_set(hwloc_const_bitmap_t bitmap, const char* what) {
    cpu_set out;
    if (bitmap == nullptr) {
        return out;
    }
    if (hwloc_bitmap_weight(bitmap) < 0) {
        return error::invalid(std::string("hwloc: ") + what + " cpuset is infinite");
    }
    for (int id = hwloc_bitmap_first(bitmap); id >= 0; id = hwloc_bitmap_next(bitmap, id)) {
        const auto cpu = static_cast<unsigned>(id);
        if (cpu >= cpu_set::max_cpus) {
            return error::invalid(std::string("hwloc: ") + what + " has CPU " + std::to_string(cpu) +
                                  ", beyond the supported " + std::to_string(cpu_set::max_cpus));
        }
        out.set(cpu);
    }
    return out;
}

std::string pci_name(hwloc_obj_t obj) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%01x", obj->attr->pcidev.domain,
                  obj->attr->pcidev.bus, obj->attr->pcidev.dev, obj->attr->pcidev.func);
    return buf;
}

bool is_hex(std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return std::isxdigit(static_cast<unsigned char>(c)) != 0;
    });
}

}  // namespace

bool looks_like_pci_bus_id(std::string_view text) {
    // [dddd:]bb:dd.f
    const auto dot = text.rfind('.');
    if (dot == std::string_view::npos || !is_hex(text.substr(dot + 1)) || dot + 2 != text.size()) {
        return false;
    }
    const auto head = text.substr(0, dot);
    const auto c2 = head.rfind(':');
    if (c2 == std::string_view::npos || head.size() - c2 - 1 != 2 || !is_hex(head.substr(c2 + 1))) {
        return false;
    }
    const auto rest = head.substr(0, c2);
    const auto c1 = rest.rfind(':');
    if (c1 == std::string_view::npos) {
        return rest.size() == 2 && is_hex(rest);
    }
    return rest.size() - c1 - 1 == 2 && is_hex(rest.substr(c1 + 1)) && c1 == 4 &&
           is_hex(rest.substr(0, c1));
}

struct topology::impl {
    hwloc_handle handle;
    std::string source;
    std::vector<topo_package> packages;
    std::vector<topo_numa_node> numa_nodes;
    std::vector<topo_core> cores;
    std::vector<topo_io_device> io_devices;
    cpu_set online;

    status load();
    std::string known(const char* kind) const;
};

std::string topology::impl::known(const char* kind) const {
    std::string out;
    for (const auto& d : io_devices) {
        if (d.kind == kind) {
            out += (out.empty() ? "" : ", ") + d.name;
        }
    }
    return out.empty() ? "none" : out;
}

// Copy everything out of the loaded hwloc topology into plain values.
status topology::impl::load() {
    hwloc_topology_t topo = handle.topo;
    if (hwloc_topology_load(topo) != 0) {
        const int err = errno;
        return error::from_errno(err, "hwloc_topology_load (" + source + ")");
    }

    auto all = to_cpu_set(hwloc_topology_get_topology_cpuset(topo), "topology");
    if (!all) {
        return std::move(all).err();
    }
    online = *all;
    if (online.empty()) {
        return error::invalid("hwloc: topology " + source + " has no CPUs");
    }

    const int npkg = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    for (int i = 0; i < npkg; ++i) {
        hwloc_obj_t obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, static_cast<unsigned>(i));
        auto cpus = to_cpu_set(obj->cpuset, "package");
        if (!cpus) {
            return std::move(cpus).err();
        }
        packages.push_back(topo_package{obj->logical_index, *cpus});
    }
    if (packages.empty()) {
        packages.push_back(topo_package{0, online});
    }

    const int nnuma = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < nnuma; ++i) {
        hwloc_obj_t obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
        auto cpus = to_cpu_set(obj->cpuset, "numa node");
        if (!cpus) {
            return std::move(cpus).err();
        }
        numa_nodes.push_back(topo_numa_node{obj->os_index, *cpus});
    }

    // Cores; a topology without Core objects gets one core per PU.
    hwloc_obj_type_t core_type = HWLOC_OBJ_CORE;
    if (hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) <= 0) {
        core_type = HWLOC_OBJ_PU;
    }
    const int ncores = hwloc_get_nbobjs_by_type(topo, core_type);
    for (int i = 0; i < ncores; ++i) {
        hwloc_obj_t obj = hwloc_get_obj_by_type(topo, core_type, static_cast<unsigned>(i));
        auto cpus = to_cpu_set(obj->cpuset, "core");
        if (!cpus) {
            return std::move(cpus).err();
        }
        if (cpus->empty()) {
            continue;   // a core whose PUs are all offline
        }
        topo_core core;
        core.index = static_cast<unsigned>(cores.size());
        core.cpus = *cpus;
        if (hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, obj)) {
            core.package = pkg->logical_index;
        }
        for (const auto& node : numa_nodes) {
            if (core.cpus.is_subset_of(node.cpus)) {
                core.numa_node = static_cast<int>(node.index);
                break;
            }
        }
        cores.push_back(std::move(core));
    }
    std::sort(cores.begin(), cores.end(),
              [](const topo_core& a, const topo_core& b) { return a.cpus.first() < b.cpus.first(); });
    for (std::size_t i = 0; i < cores.size(); ++i) {
        cores[i].index = static_cast<unsigned>(i);
    }

    for (hwloc_obj_t obj = hwloc_get_next_pcidev(topo, nullptr); obj != nullptr;
         obj = hwloc_get_next_pcidev(topo, obj)) {
        auto cpus = to_cpu_set(hwloc_get_non_io_ancestor_obj(topo, obj)->cpuset, "pci device");
        if (!cpus) {
            return std::move(cpus).err();
        }
        io_devices.push_back(topo_io_device{"pci", pci_name(obj), *cpus});
    }
    for (hwloc_obj_t obj = hwloc_get_next_osdev(topo, nullptr); obj != nullptr;
         obj = hwloc_get_next_osdev(topo, obj)) {
        if (obj->attr->osdev.type != HWLOC_OBJ_OSDEV_NETWORK || obj->name == nullptr) {
            continue;
        }
        auto cpus = to_cpu_set(hwloc_get_non_io_ancestor_obj(topo, obj)->cpuset, "network interface");
        if (!cpus) {
            return std::move(cpus).err();
        }
        io_devices.push_back(topo_io_device{"netif", obj->name, *cpus});
    }
    return ok();
}

namespace {

enum class source_kind { system, synthetic, xml };

result<std::unique_ptr<topology::impl>> make_impl(source_kind kind, const std::string& arg, std::string source) {
    auto p = std::make_unique<topology::impl>();
    p->source = std::move(source);
    if (hwloc_topology_init(&p->handle.topo) != 0) {
        const int err = errno;
        return error::from_errno(err, "hwloc_topology_init");
    }
    hwloc_topology_t topo = p->handle.topo;
    switch (kind) {
    case source_kind::system:
        // See CPUs this process may not use too: the plan is for the machine.
        if (hwloc_topology_set_flags(topo, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED) != 0) {
            const int err = errno;
            return error::from_errno(err, "hwloc_topology_set_flags(INCLUDE_DISALLOWED)");
        }
        if (hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0) {
            const int err = errno;
            return error::from_errno(err, "hwloc_topology_set_io_types_filter");
        }
        // Locality needs PCI devices and network interfaces only, which the
        // linux component reads from sysfs.  The libpciaccess plugin ("pci")
        // leaks on every load and the GPU plugins are slow to load: skip them
        // (a name hwloc does not have is ignored).
        for (const char* plugin : {"pci", "opencl", "gl", "cuda", "nvml", "rsmi", "levelzero"}) {
            (void)hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, plugin);
        }
        break;
    case source_kind::synthetic:
        if (hwloc_topology_set_synthetic(topo, arg.c_str()) != 0) {
            return error::from_errno(EINVAL, "hwloc_topology_set_synthetic(\"" + arg +
                                                 "\"): invalid synthetic description");
        }
        break;
    case source_kind::xml:
        if (hwloc_topology_set_xml(topo, arg.c_str()) != 0) {
            const int err = errno;
            return error::from_errno(err, "hwloc_topology_set_xml " + arg);
        }
        if (hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL) != 0) {
            const int err = errno;
            return error::from_errno(err, "hwloc_topology_set_io_types_filter");
        }
        break;
    }
    if (auto st = p->load(); !st) {
        return std::move(st).err();
    }
    return p;
}

}  // namespace

topology::topology(std::unique_ptr<impl> p) : _impl(std::move(p)) {}
topology::topology(topology&&) noexcept = default;
topology& topology::operator=(topology&&) noexcept = default;
topology::~topology() = default;

result<topology> topology::from_system() {
    auto r = make_impl(source_kind::system, "", "system");
    if (!r) {
        return std::move(r).err();
    }
    return topology(std::move(*r));
}

result<topology> topology::from_synthetic(std::string_view description) {
    const std::string d(description);
    auto r = make_impl(source_kind::synthetic, d, "synthetic:" + d);
    if (!r) {
        return std::move(r).err();
    }
    return topology(std::move(*r));
}

result<topology> topology::from_xml(const std::filesystem::path& path) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
        return error::from_errno(ec ? ec.value() : ENOENT, "hwloc xml " + path.string());
    }
    auto r = make_impl(source_kind::xml, path.string(), "xml:" + path.string());
    if (!r) {
        return std::move(r).err();
    }
    return topology(std::move(*r));
}

const std::string& topology::source() const { return _impl->source; }
const std::vector<topo_package>& topology::packages() const { return _impl->packages; }
const std::vector<topo_numa_node>& topology::numa_nodes() const { return _impl->numa_nodes; }
const std::vector<topo_core>& topology::cores() const { return _impl->cores; }
const cpu_set& topology::online_cpus() const { return _impl->online; }
const std::vector<topo_io_device>& topology::io_devices() const { return _impl->io_devices; }

const topo_core* topology::core_of(unsigned cpu) const {
    for (const auto& c : _impl->cores) {
        if (c.cpus.test(cpu)) {
            return &c;
        }
    }
    return nullptr;
}

cpu_set topology::siblings_of(unsigned cpu) const {
    const topo_core* c = core_of(cpu);
    return c != nullptr ? c->cpus : cpu_set{};
}

bool topology::has_smt() const {
    return std::any_of(_impl->cores.begin(), _impl->cores.end(),
                       [](const topo_core& c) { return c.cpus.count() > 1; });
}

result<cpu_set> topology::cpus_near_pci(std::string_view bus_id) const {
    const std::string id(bus_id);
    if (!looks_like_pci_bus_id(id)) {
        return error::invalid("pci device \"" + id +
                              "\": not a PCI bus id (expected dddd:bb:dd.f, e.g. 0000:00:04.0)");
    }
    hwloc_obj_t obj = hwloc_get_pcidev_by_busidstring(_impl->handle.topo, id.c_str());
    if (obj == nullptr) {
        return error{ENODEV, "pci device " + id + " not found in topology " + _impl->source +
                                 " (pci devices: " + _impl->known("pci") + ")"};
    }
    return to_cpu_set(hwloc_get_non_io_ancestor_obj(_impl->handle.topo, obj)->cpuset, "pci device");
}

result<cpu_set> topology::cpus_near_netif(std::string_view name) const {
    for (const auto& d : _impl->io_devices) {
        if (d.kind == "netif" && d.name == name) {
            return d.near_cpus;
        }
    }
    return error{ENODEV, "network interface " + std::string(name) + " not found in topology " +
                             _impl->source + " (network interfaces: " + _impl->known("netif") + ")"};
}

result<cpu_set> topology::cpus_near_device(std::string_view device) const {
    if (looks_like_pci_bus_id(device)) {
        return cpus_near_pci(device);
    }
    return cpus_near_netif(device);
}

std::string topology::describe() const {
    std::string out;
    out += "topology " + _impl->source + ": " + std::to_string(_impl->packages.size()) +
           " package(s), " + std::to_string(_impl->numa_nodes.size()) + " numa node(s), " +
           std::to_string(_impl->cores.size()) + " core(s), cpus " + _impl->online.to_list() + "\n";
    for (const auto& c : _impl->cores) {
        out += "core " + std::to_string(c.index) + " (package " + std::to_string(c.package) +
               ", numa " + (c.numa_node < 0 ? std::string("?") : std::to_string(c.numa_node)) +
               "): cpus " + c.cpus.to_list() + "\n";
    }
    for (const auto& d : _impl->io_devices) {
        out += d.kind + " " + d.name + ": near cpus " + d.near_cpus.to_list() + "\n";
    }
    return out;
}

}  // namespace rtcore
