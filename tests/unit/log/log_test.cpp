// Logging (styles, subsystem prefix, levels, rate limits): qrt_log alone,
// the bottom of agent/ (this test links nothing else of the agent).

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>

#include "qrt/log.hpp"

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

TEST(log_rate_limiter, a_burst_limiter_admits_n_per_interval_and_counts_the_rest) {
    using namespace std::chrono_literals;
    qrt::log::rate_limiter rl(1s, 3);
    const auto t0 = qrt::log::rate_limiter::clock::time_point{} + 1000s;
    EXPECT_EQ(rl.admit(t0), 0u);
    EXPECT_EQ(rl.admit(t0 + 100ms), 0u);
    EXPECT_EQ(rl.admit(t0 + 200ms), 0u);
    EXPECT_FALSE(rl.admit(t0 + 300ms));
    EXPECT_FALSE(rl.admit(t0 + 999ms));
    EXPECT_EQ(rl.suppressed(), 2u);
    // A new interval: the first message says how many were held back.
    EXPECT_EQ(rl.admit(t0 + 1s), 2u);
    EXPECT_EQ(rl.admit(t0 + 1100ms), 0u);
}

TEST(log_rate_limiter, a_burst_of_warnings_is_cut_and_the_next_one_says_how_many_were_cut) {
    captured_log cap(qrt::log::style::journal);
    qrt::log::rate_limiter rl(std::chrono::hours(1), 2);
    for (int i = 0; i < 5; ++i) {
        qrt::log::warn_rl(rl, "rpc", "denied call {}", i);
    }
    EXPECT_EQ(cap.text.str(), "<4>rpc: denied call 0\n<4>rpc: denied call 1\n");
    EXPECT_EQ(rl.suppressed(), 3u);
}

}  // namespace
