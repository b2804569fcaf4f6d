#pragma once
// Logging for the housekeeping side of qrtd (never the real-time path: the
// dispatch threads count, and the housekeeping thread reports).
//
//   qrt::log::init({.level = qrt::log_level::info});
//   qrt::log::info("irq", "pinned {} IRQs to CPUs {}", n, hk.to_list());
//        -> "irq: pinned 24 IRQs to CPUs 0"
//
// Every message starts with its subsystem ("irq: ", "config: ").  Output
// goes to stderr.  Under systemd (JOURNAL_STREAM names our stderr) lines
// carry no timestamp and start with the syslog priority "<N>", which journald
// turns into the entry's level; elsewhere they start with a UTC timestamp and
// the level name.  The level is checked before anything is formatted.
//
// Anything that can repeat goes through a rate_limiter:
//   static qrt::log::rate_limiter rl{std::chrono::seconds(30)};
//   qrt::log::warn_rl(rl, "irq", "IRQ {} drifted back onto CPU {}", irq, cpu);
// logs at most once per interval (or a burst of N: rate_limiter{1s, N}) and
// says how many were suppressed.
//
// This is the bottom of agent/ (qrt_log): it knows nothing of the config.
// The daemon applies agent.log_level from qrtd.toml (set_level) on top.

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string_view>

#include "qrt/log_level.hpp"

namespace qrt::log {

enum class style {
    automatic,   // journal when JOURNAL_STREAM matches stderr, else plain
    plain,       // "2026-11-29T18:00:00.123Z info irq: ..."
    journal,     // "<6>irq: ..."
    brief,       // "qrtd: warning: irq: ..." for interactive commands
};

struct options {
    log_level level = log_level::info;
    style output = style::automatic;
    // What automatic means when stderr is not the journal.
    style fallback = style::plain;
    // Tests: write here instead of stderr.
    std::shared_ptr<spdlog::sinks::sink> sink;
};

// Replaces the default logger.  Safe to call again (e.g. after the config is
// loaded or --log-level is parsed).
void init(const options& opts);
void set_level(log_level level);
bool enabled(log_level level) noexcept;

// true when stderr is connected to the journal: JOURNAL_STREAM ("dev:ino")
// equals fstat(2)'s device and inode.
bool stderr_is_journal();

// The syslog priority journald gets for a level (<3> error, <4> warning, ...).
int syslog_priority(log_level level) noexcept;

namespace detail {
spdlog::level::level_enum to_spdlog(log_level level) noexcept;

template <typename... Args>
void emit(log_level level, std::string_view subsystem, fmt::format_string<Args...> fmt,
          Args&&... args) {
    if (!enabled(level)) {
        return;
    }
    fmt::memory_buffer buf;
    fmt::format_to(std::back_inserter(buf), "{}: ", subsystem);
    fmt::format_to(std::back_inserter(buf), fmt, std::forward<Args>(args)...);
    spdlog::default_logger_raw()->log(to_spdlog(level),
                                      std::string_view(buf.data(), buf.size()));
}
}  // namespace detail

template <typename... Args>
void trace(std::string_view subsystem, fmt::format_string<Args...> fmt, Args&&... args) {
    detail::emit(log_level::trace, subsystem, fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(std::string_view subsystem, fmt::format_string<Args...> fmt, Args&&... args) {
    detail::emit(log_level::debug, subsystem, fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void info(std::string_view subsystem, fmt::format_string<Args...> fmt, Args&&... args) {
    detail::emit(log_level::info, subsystem, fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(std::string_view subsystem, fmt::format_string<Args...> fmt, Args&&... args) {
    detail::emit(log_level::warn, subsystem, fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void error(std::string_view subsystem, fmt::format_string<Args...> fmt, Args&&... args) {
    detail::emit(log_level::error, subsystem, fmt, std::forward<Args>(args)...);
}

// At most `burst` messages per interval, one by default (linuxptp's
// pr_*_rl); the next message let through says how many were held back.
// Not thread-safe: one limiter per call site per thread.
class rate_limiter {
public:
    using clock = std::chrono::steady_clock;
    explicit rate_limiter(std::chrono::nanoseconds interval, unsigned burst = 1)
        : _interval(interval), _burst(burst == 0 ? 1 : burst) {}

    // nullopt: suppress this one.  Otherwise how many were suppressed since
    // the last message that went out.
    std::optional<std::uint64_t> admit(clock::time_point now = clock::now()) noexcept;
    std::uint64_t suppressed() const noexcept { return _suppressed; }

private:
    std::chrono::nanoseconds _interval;
    unsigned _burst;
    std::optional<clock::time_point> _window_start;
    unsigned _in_window = 0;
    std::uint64_t _suppressed = 0;
};

template <typename... Args>
void log_rl(rate_limiter& rl, log_level level, std::string_view subsystem,
            fmt::format_string<Args...> fmt, Args&&... args) {
    if (!enabled(level)) {
        return;
    }
    const auto admitted = rl.admit();
    if (!admitted) {
        return;
    }
    fmt::memory_buffer buf;
    fmt::format_to(std::back_inserter(buf), "{}: ", subsystem);
    fmt::format_to(std::back_inserter(buf), fmt, std::forward<Args>(args)...);
    if (*admitted > 0) {
        fmt::format_to(std::back_inserter(buf), " ({} similar messages suppressed)", *admitted);
    }
    spdlog::default_logger_raw()->log(detail::to_spdlog(level),
                                      std::string_view(buf.data(), buf.size()));
}
template <typename... Args>
void warn_rl(rate_limiter& rl, std::string_view subsystem, fmt::format_string<Args...> fmt,
             Args&&... args) {
    log_rl(rl, log_level::warn, subsystem, fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void info_rl(rate_limiter& rl, std::string_view subsystem, fmt::format_string<Args...> fmt,
             Args&&... args) {
    log_rl(rl, log_level::info, subsystem, fmt, std::forward<Args>(args)...);
}

}  // namespace qrt::log
