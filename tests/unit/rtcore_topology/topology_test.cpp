#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "rtcore/topology.hpp"

using rtcore::cpu_set;
using rtcore::topology;

namespace {
const std::string xml_dual = std::string(QRT_TEST_DATA_DIR) + "/topology/dual-socket-16cpu-nics.xml";

topology synthetic(const char* desc) {
    auto t = topology::from_synthetic(desc);
    EXPECT_TRUE(t) << (t ? "" : t.err().message);
    return std::move(t).value();
}
}  // namespace

TEST(topology, synthetic_two_packages_of_sixteen_smt_cores_has_64_cpus_in_sibling_pairs) {
    const auto t = synthetic("package:2 core:16 pu:2");
    EXPECT_EQ(t.packages().size(), 2U);
    ASSERT_EQ(t.cores().size(), 32U);
    EXPECT_EQ(t.online_cpus(), cpu_set::first_n(64));
    EXPECT_TRUE(t.has_smt());
    for (const auto& c : t.cores()) {
        ASSERT_EQ(c.cpus.count(), 2U) << "core " << c.index;
        EXPECT_EQ(c.package, c.index < 16 ? 0U : 1U) << "core " << c.index;
        EXPECT_GE(c.numa_node, 0) << "core " << c.index;
    }
    EXPECT_EQ(t.cores()[5].cpus, (cpu_set{10, 11}));
    EXPECT_EQ(t.siblings_of(11), (cpu_set{10, 11}));
    EXPECT_EQ(t.core_of(63)->index, 31U);
    EXPECT_EQ(t.core_of(64), nullptr);
    EXPECT_TRUE(t.siblings_of(64).empty());
    EXPECT_EQ(t.source(), "synthetic:package:2 core:16 pu:2");
}

TEST(topology, intel_style_sibling_numbering_pairs_cpu_n_with_n_plus_half) {
    const auto t = synthetic("package:1 core:4 pu:2(indexes=0,4,1,5,2,6,3,7)");
    ASSERT_EQ(t.cores().size(), 4U);
    EXPECT_EQ(t.siblings_of(1), (cpu_set{1, 5}));
    EXPECT_EQ(t.siblings_of(7), (cpu_set{3, 7}));
    EXPECT_EQ(t.cores()[0].cpus, (cpu_set{0, 4}));
}

TEST(topology, numa_nodes_come_from_the_description) {
    const auto t = synthetic("package:2 numa:1 core:4 pu:2");
    ASSERT_EQ(t.numa_nodes().size(), 2U);
    EXPECT_EQ(t.numa_nodes()[1].cpus, cpu_set::parse_list("8-15").value());
    EXPECT_EQ(t.core_of(9)->numa_node, 1);
    EXPECT_EQ(t.core_of(2)->numa_node, 0);
}

TEST(topology, a_topology_without_smt_has_one_cpu_per_core) {
    const auto t = synthetic("package:1 core:2 pu:1");
    EXPECT_FALSE(t.has_smt());
    EXPECT_EQ(t.cores().size(), 2U);
}

TEST(topology, invalid_synthetic_description_is_an_error_naming_it) {
    auto t = topology::from_synthetic("package:two");
    ASSERT_FALSE(t);
    EXPECT_NE(t.err().message.find("hwloc_topology_set_synthetic(\"package:two\")"), std::string::npos)
        << t.err().message;
}

TEST(topology, missing_xml_file_is_an_error_naming_the_path) {
    auto t = topology::from_xml("/nonexistent/topo.xml");
    ASSERT_FALSE(t);
    EXPECT_EQ(t.err().message, "hwloc xml /nonexistent/topo.xml: No such file or directory");
}

TEST(topology, xml_export_gives_cpus_near_each_pci_device_and_netif) {
    auto t = topology::from_xml(xml_dual);
    ASSERT_TRUE(t) << t.err().message;
    EXPECT_EQ(t->packages().size(), 2U);
    EXPECT_EQ(t->cores().size(), 8U);
    const cpu_set pkg0 = cpu_set::parse_list("0-7").value();
    const cpu_set pkg1 = cpu_set::parse_list("8-15").value();
    auto nic1 = t->cpus_near_pci("0000:81:00.0");
    ASSERT_TRUE(nic1) << nic1.err().message;
    EXPECT_EQ(*nic1, pkg1);
    auto short_form = t->cpus_near_pci("81:00.0");
    ASSERT_TRUE(short_form) << short_form.err().message;
    EXPECT_EQ(*short_form, pkg1);
    auto eno1 = t->cpus_near_netif("eno1");
    ASSERT_TRUE(eno1) << eno1.err().message;
    EXPECT_EQ(*eno1, pkg0);
    auto by_guess = t->cpus_near_device("ens1f0");
    ASSERT_TRUE(by_guess) << by_guess.err().message;
    EXPECT_EQ(*by_guess, pkg1);
    EXPECT_EQ(t->io_devices().size(), 4U);
}

TEST(topology, unknown_pci_device_error_names_it_and_the_known_devices) {
    auto t = topology::from_xml(xml_dual);
    ASSERT_TRUE(t) << t.err().message;
    auto r = t->cpus_near_pci("0000:00:04.0");
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().message, "pci device 0000:00:04.0 not found in topology xml:" + xml_dual +
                                   " (pci devices: 0000:00:03.0, 0000:81:00.0)");
    auto bad = t->cpus_near_pci("eth0");
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.err().message, "pci device \"eth0\": not a PCI bus id (expected dddd:bb:dd.f, e.g. 0000:00:04.0)");
}

TEST(topology, unknown_network_interface_error_names_it_and_the_known_ones) {
    auto t = topology::from_xml(xml_dual);
    ASSERT_TRUE(t) << t.err().message;
    auto r = t->cpus_near_netif("eth7");
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().message, "network interface eth7 not found in topology xml:" + xml_dual +
                                   " (network interfaces: eno1, ens1f0)");
}

TEST(topology, synthetic_topologies_have_no_io_devices_so_locality_lookups_fail_clearly) {
    const auto t = synthetic("package:1 core:2 pu:1");
    auto r = t.cpus_near_netif("eth0");
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().message,
              "network interface eth0 not found in topology synthetic:package:1 core:2 pu:1 (network interfaces: none)");
}

TEST(topology, pci_bus_id_recognition_accepts_both_kernel_forms_only) {
    EXPECT_TRUE(rtcore::looks_like_pci_bus_id("0000:00:04.0"));
    EXPECT_TRUE(rtcore::looks_like_pci_bus_id("00:04.0"));
    EXPECT_TRUE(rtcore::looks_like_pci_bus_id("0000:af:00.1"));
    EXPECT_FALSE(rtcore::looks_like_pci_bus_id("eth0"));
    EXPECT_FALSE(rtcore::looks_like_pci_bus_id("0000:00:04"));
    EXPECT_FALSE(rtcore::looks_like_pci_bus_id("000:00:04.0"));
    EXPECT_FALSE(rtcore::looks_like_pci_bus_id("0000:00:04.10"));
    EXPECT_FALSE(rtcore::looks_like_pci_bus_id("ens1f0"));
}

TEST(topology, this_host_loads_with_every_online_cpu_in_exactly_one_core) {
    auto t = topology::from_system();
    ASSERT_TRUE(t) << t.err().message;
    const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
    ASSERT_GT(n, 0);
    EXPECT_EQ(t->online_cpus().count(), static_cast<std::size_t>(n));
    cpu_set seen;
    for (const auto& c : t->cores()) {
        EXPECT_FALSE(c.cpus.empty());
        EXPECT_FALSE(c.cpus.intersects(seen)) << "core " << c.index << " overlaps another core";
        seen |= c.cpus;
    }
    EXPECT_EQ(seen, t->online_cpus());
    for (const auto& d : t->io_devices()) {
        EXPECT_TRUE(d.near_cpus.is_subset_of(t->online_cpus())) << d.kind << " " << d.name;
        auto near = t->cpus_near_device(d.name);
        ASSERT_TRUE(near) << near.err().message;
        EXPECT_EQ(*near, d.near_cpus) << d.name;
    }
}

TEST(topology, every_pci_backed_network_interface_of_this_host_has_a_locality) {
    auto t = topology::from_system();
    ASSERT_TRUE(t) << t.err().message;
    std::error_code ec;
    int checked = 0;
    for (const auto& ent : std::filesystem::directory_iterator("/sys/class/net", ec)) {
        // /sys/class/net/eth0/device -> .../0000:00:03.0[/virtio2]: the
        // innermost PCI bus id on the canonical path is the NIC's function.
        const auto dev = std::filesystem::canonical(ent.path() / "device", ec);
        if (ec) {
            ec.clear();
            continue;
        }
        std::string bus_id;
        for (const auto& part : dev) {
            if (rtcore::looks_like_pci_bus_id(part.string())) {
                bus_id = part.string();
            }
        }
        if (bus_id.empty()) {
            continue;
        }
        const std::string name = ent.path().filename().string();
        auto near = t->cpus_near_netif(name);
        ASSERT_TRUE(near) << near.err().message;
        EXPECT_FALSE(near->empty()) << name;
        EXPECT_TRUE(near->is_subset_of(t->online_cpus())) << name;
        auto by_pci = t->cpus_near_pci(bus_id);
        ASSERT_TRUE(by_pci) << by_pci.err().message;
        EXPECT_EQ(*by_pci, *near) << name << " at " << bus_id;
        ++checked;
    }
    if (checked == 0) {
        GTEST_SKIP() << "this host has no PCI-backed network interface";
    }
}
