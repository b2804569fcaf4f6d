#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "qrt_test/process.hpp"
#include "rtcore/cpu_dma_latency.hpp"

namespace fs = std::filesystem;

namespace {

fs::path make_tree(bool with_device) {
    auto root = fs::temp_directory_path() /
                ("qrt-dma-" + std::to_string(::getpid()) + "-" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root);
    fs::create_directories(root / "dev");
    if (with_device) {
        std::ofstream(root / "dev/cpu_dma_latency");
    }
    return root;
}

std::string file_bytes(const fs::path& p) {
    auto data = rtcore::host_fs("/").read(p.string());
    return data ? *data : std::string("<unreadable>");
}

}  // namespace

TEST(cpu_dma_latency, writes_a_binary_int32_and_holds_the_fd_open) {
    const auto root = make_tree(true);
    rtcore::host_fs hfs(root);
    {
        auto hold = rtcore::cpu_dma_latency_hold::acquire(hfs);
        ASSERT_TRUE(hold) << hold.err().message;
        EXPECT_TRUE(hold->active());
        EXPECT_EQ(hold->latency_us(), 0);
        EXPECT_EQ(::fcntl(hold->fd(), F_GETFD), FD_CLOEXEC);
        EXPECT_EQ(file_bytes(root / "dev/cpu_dma_latency"), std::string(4, '\0'));
        EXPECT_EQ(*rtcore::read_cpu_dma_latency_us(hfs), 0);

        // Moving keeps one owner; the moved-from holder is empty.
        rtcore::cpu_dma_latency_hold moved(std::move(*hold));
        EXPECT_TRUE(moved.active());
        EXPECT_FALSE(hold->active());
        const int fd = moved.fd();
        moved.release();
        EXPECT_FALSE(moved.active());
        EXPECT_EQ(::fcntl(fd, F_GETFD), -1) << "fd still open after release";
    }
    fs::remove_all(root);
}

TEST(cpu_dma_latency, a_nonzero_target_is_written_little_endian) {
    const auto root = make_tree(true);
    rtcore::host_fs hfs(root);
    auto hold = rtcore::cpu_dma_latency_hold::acquire(hfs, 0x01020304);
    ASSERT_TRUE(hold) << hold.err().message;
    EXPECT_EQ(file_bytes(root / "dev/cpu_dma_latency"), std::string("\x04\x03\x02\x01", 4));
    EXPECT_EQ(*rtcore::read_cpu_dma_latency_us(hfs), 0x01020304);
    fs::remove_all(root);
}

TEST(cpu_dma_latency, a_missing_device_is_a_clear_error) {
    const auto root = make_tree(false);
    rtcore::host_fs hfs(root);
    auto hold = rtcore::cpu_dma_latency_hold::acquire(hfs);
    ASSERT_FALSE(hold);
    EXPECT_EQ(hold.err().code, ENOENT);
    EXPECT_EQ(hold.err().message,
              "open /dev/cpu_dma_latency: No such file or directory "
              "(kernel without PM QoS support: CPU idle states cannot be held off)");
    fs::remove_all(root);
}

TEST(cpu_dma_latency, a_negative_target_is_refused) {
    const auto root = make_tree(true);
    rtcore::host_fs hfs(root);
    auto hold = rtcore::cpu_dma_latency_hold::acquire(hfs, -1);
    ASSERT_FALSE(hold);
    EXPECT_EQ(hold.err().message, "cpu_dma_latency: latency -1 us is negative");
    fs::remove_all(root);
}

TEST(cpu_dma_latency, dry_run_records_the_write_and_opens_nothing) {
    const auto root = make_tree(true);
    rtcore::host_fs hfs(root, rtcore::host_fs::mode::dry_run);
    auto hold = rtcore::cpu_dma_latency_hold::acquire(hfs);
    ASSERT_TRUE(hold) << hold.err().message;
    EXPECT_FALSE(hold->active());
    ASSERT_EQ(hfs.planned_writes().size(), 1u);
    EXPECT_EQ(hfs.planned_writes()[0].path, "/dev/cpu_dma_latency");
    EXPECT_EQ(hfs.planned_writes()[0].data, std::string(4, '\0'));
    EXPECT_EQ(file_bytes(root / "dev/cpu_dma_latency"), "");
    fs::remove_all(root);
}

TEST(cpu_dma_latency, permission_denied_says_the_device_is_root_only) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to create a root-only device stand-in and drop to another user";
    }
    const auto root = make_tree(true);
    fs::permissions(root / "dev/cpu_dma_latency", fs::perms::owner_read | fs::perms::owner_write);
    const auto r = qrt::testing::run_in_child([&]() -> std::string {
        if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) {
            return "setresuid failed";
        }
        rtcore::host_fs hfs(root);
        auto hold = rtcore::cpu_dma_latency_hold::acquire(hfs);
        return hold ? std::string("opened a root-only device") : hold.err().message;
    });
    EXPECT_EQ(r.reply,
              "open /dev/cpu_dma_latency: Permission denied (the device is root-only: run as root, "
              "or give user qrtd alone write access, as the package's tmpfiles.d does with an ACL: "
              "systemd-tmpfiles --create qrtd.conf)");
    fs::remove_all(root);
}

TEST(cpu_dma_latency, the_real_device_honours_the_request_while_held) {
    rtcore::host_fs sys = rtcore::host_fs::system();
    if (::geteuid() != 0 || !sys.exists(rtcore::cpu_dma_latency_path)) {
        GTEST_SKIP() << "needs root and /dev/cpu_dma_latency";
    }
    constexpr std::int32_t ours_us = 1234;
    const auto before = rtcore::read_cpu_dma_latency_us(sys);
    ASSERT_TRUE(before) << before.err().message;
    {
        auto hold = rtcore::cpu_dma_latency_hold::acquire(sys, ours_us);
        ASSERT_TRUE(hold) << hold.err().message;
        const auto during = rtcore::read_cpu_dma_latency_us(sys);
        ASSERT_TRUE(during);
        // The system target is the minimum of all requests: ours or lower.
        EXPECT_LE(*during, ours_us);
    }
    const auto after = rtcore::read_cpu_dma_latency_us(sys);
    ASSERT_TRUE(after);
    if (*before != ours_us) {
        EXPECT_NE(*after, ours_us) << "request still in effect after the holder was destroyed";
    }
}
