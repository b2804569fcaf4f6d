// The sd_notify protocol against a real AF_UNIX datagram socket standing in
// for systemd, and the hints the daemon hands rtcore.  (Logging:
// tests/unit/log.)

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "qrt/config.hpp"
#include "qrt/event_loop.hpp"
#include "qrt/host_cmd.hpp"
#include "qrt/sd_notify.hpp"

namespace {

// A datagram socket playing systemd's notification socket.
class fake_notify_socket {
public:
    fake_notify_socket() {
        _path = std::filesystem::temp_directory_path() /
                ("qrt-notify-" + std::to_string(::getpid()) + ".sock");
        std::filesystem::remove(_path);
        _fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", _path.c_str());
        if (::bind(_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
            ADD_FAILURE() << "bind " << _path << ": " << std::strerror(errno);
        }
        ::setenv("NOTIFY_SOCKET", _path.c_str(), 1);
    }
    ~fake_notify_socket() {
        ::unsetenv("NOTIFY_SOCKET");
        ::unsetenv("WATCHDOG_USEC");
        ::unsetenv("WATCHDOG_PID");
        ::close(_fd);
        std::filesystem::remove(_path);
    }
    // Next datagram, or "" after 2 s.
    std::string receive() {
        timeval tv{2, 0};
        ::setsockopt(_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char buf[512];
        const ssize_t n = ::recv(_fd, buf, sizeof buf, 0);
        return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
    }

private:
    std::filesystem::path _path;
    int _fd = -1;
};

TEST(sd_notify, without_notify_socket_every_call_is_a_quiet_no_op) {
    ::unsetenv("NOTIFY_SOCKET");
    qrt::sd_notifier sd;
    EXPECT_FALSE(qrt::sd_notifier::available());
    EXPECT_TRUE(sd.ready("x"));
    EXPECT_TRUE(sd.stopping("x"));
}

TEST(sd_notify, ready_status_and_stopping_reach_the_manager) {
    fake_notify_socket manager;
    qrt::sd_notifier sd;
    EXPECT_TRUE(qrt::sd_notifier::available());
    ASSERT_TRUE(sd.ready("running: 1 QPU"));
    EXPECT_EQ(manager.receive(), "READY=1\nSTATUS=running: 1 QPU");
    ASSERT_TRUE(sd.status("reloading"));
    EXPECT_EQ(manager.receive(), "STATUS=reloading");
    ASSERT_TRUE(sd.stopping("SIGTERM"));
    EXPECT_EQ(manager.receive(), "STOPPING=1\nSTATUS=SIGTERM");
}

TEST(sd_notify, watchdog_is_off_unless_meant_for_this_process) {
    fake_notify_socket manager;
    ::setenv("WATCHDOG_USEC", "200000", 1);
    ::setenv("WATCHDOG_PID", "1", 1);   // another process's watchdog
    EXPECT_FALSE(qrt::sd_notifier::watchdog_interval());
    ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
    auto interval = qrt::sd_notifier::watchdog_interval();
    ASSERT_TRUE(interval);
    EXPECT_EQ(interval->count(), 200000);
}

TEST(sd_notify, watchdog_timer_pings_from_the_event_loop) {
    fake_notify_socket manager;
    ::setenv("WATCHDOG_USEC", "40000", 1);   // ping every 20 ms
    ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
    qrt::event_loop loop;
    qrt::sd_notifier sd;
    auto started = sd.start_watchdog(loop);
    ASSERT_TRUE(started);
    ASSERT_TRUE(*started);
    // Run the loop until two pings went out (bounded: at most 200 rounds).
    for (int i = 0; i < 200 && sd.watchdog_pings() < 2; ++i) {
        loop.run_once(std::chrono::milliseconds(50));
    }
    EXPECT_GE(sd.watchdog_pings(), 2u);
    EXPECT_EQ(manager.receive(), "WATCHDOG=1");
    sd.stop_watchdog();
    const unsigned after_stop = sd.watchdog_pings();
    loop.run_once(std::chrono::milliseconds(60));
    EXPECT_EQ(sd.watchdog_pings(), after_stop);
}

// rtcore's refusals say "restore the host partition first"; qrtd's name the
// command that does it, as they did when rtcore spelled it itself.
TEST(host_cmd, the_partition_refusals_name_qrtd_host_restore) {
    const auto opts = qrt::apply_options_for(qrt::default_config());
    EXPECT_EQ(opts.isolation.restore_hint, "run `qrtd host restore`");
}

}  // namespace
