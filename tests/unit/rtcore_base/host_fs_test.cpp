#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "rtcore/host_fs.hpp"

namespace fs = std::filesystem;

namespace {
fs::path make_tree() {
    auto root = fs::temp_directory_path() / ("qrt-hostfs-" + std::to_string(::getpid()) + "-" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root);
    fs::create_directories(root / "proc/irq/36");
    std::ofstream(root / "proc/irq/36/smp_affinity_list") << "0-1\n";
    return root;
}
}  // namespace

TEST(host_fs, resolves_host_paths_under_its_root) {
    rtcore::host_fs h("/tmp/tree");
    EXPECT_EQ(h.resolve("/proc/irq/1/smp_affinity"), fs::path("/tmp/tree/proc/irq/1/smp_affinity"));
    EXPECT_TRUE(rtcore::host_fs::system().is_system());
}

TEST(host_fs, reads_writes_and_lists_a_fake_tree) {
    const auto root = make_tree();
    rtcore::host_fs h(root);
    EXPECT_EQ(*h.read_line("/proc/irq/36/smp_affinity_list"), "0-1");
    ASSERT_TRUE(h.write("/proc/irq/36/smp_affinity_list", "0"));
    EXPECT_EQ(*h.read("/proc/irq/36/smp_affinity_list"), "0");
    EXPECT_EQ(*h.list("/proc/irq"), std::vector<std::string>{"36"});
    EXPECT_TRUE(h.is_dir("/proc/irq/36"));
    fs::remove_all(root);
}

TEST(host_fs, errors_name_the_call_and_the_path) {
    rtcore::host_fs h("/nonexistent-root");
    auto r = h.read("/proc/irq/7/smp_affinity");
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, ENOENT);
    EXPECT_EQ(r.err().message, "open /proc/irq/7/smp_affinity: No such file or directory");
}

TEST(host_fs, dry_run_records_writes_without_touching_the_tree) {
    const auto root = make_tree();
    rtcore::host_fs h(root, rtcore::host_fs::mode::dry_run);
    ASSERT_TRUE(h.write("/proc/irq/36/smp_affinity_list", "0"));
    EXPECT_EQ(*h.read_line("/proc/irq/36/smp_affinity_list"), "0-1");
    ASSERT_EQ(h.planned_writes().size(), 1U);
    EXPECT_EQ(h.planned_writes()[0].path, "/proc/irq/36/smp_affinity_list");
    fs::remove_all(root);
}

TEST(host_fs, injected_faults_stand_for_managed_irqs) {
    const auto root = make_tree();
    rtcore::host_fs h(root);
    h.inject_write_error("/proc/irq/36/smp_affinity_list", EIO);
    auto st = h.write("/proc/irq/36/smp_affinity_list", "0");
    ASSERT_FALSE(st);
    EXPECT_EQ(st.err().code, EIO);
    EXPECT_EQ(st.err().message, "write /proc/irq/36/smp_affinity_list: Input/output error");
    EXPECT_EQ(*h.read_line("/proc/irq/36/smp_affinity_list"), "0-1");
    fs::remove_all(root);
}
