// Logging (styles, subsystem prefix, rate limit) and the sd_notify protocol
// against a real AF_UNIX datagram socket standing in for systemd.

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>

#include "qrt/event_loop.hpp"
#include "qrt/log.hpp"
#include "qrt/sd_notify.hpp"

namespace {

struct captured_log {
    std::ostringstream text;
    explicit captured_log(qrt::log::style st, qrt::log_level level = qrt::log_level::info) {
        qrt::log::options o;
        o.level = level;
        o.output = st;
        o.sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text);
        qrt::log::init(o);
    }
    ~captured_log() { qrt::log::init({}); }
};

TEST(log, journal_style_has_syslog_priority_and_no_timestamp) {
    captured_log cap(qrt::log::style::journal);
    qrt::log::warn("irq", "IRQ {} is managed", 36);
    qrt::log::info("config", "loaded");
    qrt::log::error("host", "restore incomplete");
    EXPECT_EQ(cap.text.str(),
              "<4>irq: IRQ 36 is managed\n<6>config: loaded\n<3>host: restore incomplete\n");
}

TEST(log, plain_style_starts_with_a_utc_timestamp_and_the_level) {
    captured_log cap(qrt::log::style::plain);
    qrt::log::info("daemon", "ready");
    const std::string line = cap.text.str();
    // 2026-11-29T18:00:00.123Z info daemon: ready
    ASSERT_GE(line.size(), 25u) << line;
    EXPECT_EQ(line[4], '-');
    EXPECT_EQ(line[10], 'T');
    EXPECT_EQ(line[23], 'Z');
    EXPECT_EQ(line.substr(24), " info daemon: ready\n");
}

TEST(log, messages_below_the_level_are_neither_formatted_nor_written) {
    captured_log cap(qrt::log::style::journal, qrt::log_level::warn);
    qrt::log::info("x", "{}", "below the level");
    EXPECT_FALSE(qrt::log::enabled(qrt::log_level::info));
    EXPECT_TRUE(qrt::log::enabled(qrt::log_level::error));
    EXPECT_EQ(cap.text.str(), "");
    qrt::log::set_level(qrt::log_level::debug);
    qrt::log::debug("x", "now {}", "visible");
    EXPECT_EQ(cap.text.str(), "<7>x: now visible\n");
}

TEST(log, journal_detection_needs_journal_stream_to_match_stderr) {
    ::unsetenv("JOURNAL_STREAM");
    EXPECT_FALSE(qrt::log::stderr_is_journal());
    ::setenv("JOURNAL_STREAM", "1:2", 1);
    EXPECT_FALSE(qrt::log::stderr_is_journal());
    struct stat st {};
    ASSERT_EQ(::fstat(STDERR_FILENO, &st), 0);
    const std::string match = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
    ::setenv("JOURNAL_STREAM", match.c_str(), 1);
    EXPECT_TRUE(qrt::log::stderr_is_journal());
    ::unsetenv("JOURNAL_STREAM");
}

TEST(log_rate_limiter, admits_one_message_per_interval_and_counts_the_rest) {
    using namespace std::chrono_literals;
    qrt::log::rate_limiter rl(10s);
    const auto t0 = qrt::log::rate_limiter::clock::time_point{} + 1000s;
    EXPECT_EQ(rl.admit(t0), 0u);
    EXPECT_FALSE(rl.admit(t0 + 1s));
    EXPECT_FALSE(rl.admit(t0 + 9s));
    EXPECT_EQ(rl.suppressed(), 2u);
    EXPECT_EQ(rl.admit(t0 + 10s), 2u);
    EXPECT_EQ(rl.suppressed(), 0u);
}

TEST(log_rate_limiter, rate_limited_log_says_how_many_were_suppressed) {
    captured_log cap(qrt::log::style::journal);
    qrt::log::rate_limiter rl(std::chrono::hours(1));
    for (int i = 0; i < 5; ++i) {
        qrt::log::warn_rl(rl, "irq", "IRQ {} drifted", i);
    }
    EXPECT_EQ(cap.text.str(), "<4>irq: IRQ 0 drifted\n");
    EXPECT_EQ(rl.suppressed(), 4u);
}

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

}  // namespace
