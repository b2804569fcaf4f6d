#include "qrt/log.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace qrt::log {
namespace {

// "%*" in the journal pattern: the sd-daemon(3) priority prefix "<N>".
class syslog_priority_flag final : public spdlog::custom_flag_formatter {
public:
    void format(const spdlog::details::log_msg& msg, const std::tm& /*unused*/,
                spdlog::memory_buf_t& dest) override {
        int prio = 6;
        switch (msg.level) {
            case spdlog::level::trace:
            case spdlog::level::debug: prio = 7; break;
            case spdlog::level::info: prio = 6; break;
            case spdlog::level::warn: prio = 4; break;
            case spdlog::level::err: prio = 3; break;
            case spdlog::level::critical: prio = 2; break;
            default: prio = 6; break;
        }
        const char text[3] = {'<', static_cast<char>('0' + prio), '>'};
        dest.append(text, text + 3);
    }
    std::unique_ptr<custom_flag_formatter> clone() const override {
        return std::make_unique<syslog_priority_flag>();
    }
};

}  // namespace

namespace detail {
spdlog::level::level_enum to_spdlog(log_level level) noexcept {
    switch (level) {
        case log_level::trace: return spdlog::level::trace;
        case log_level::debug: return spdlog::level::debug;
        case log_level::info: return spdlog::level::info;
        case log_level::warn: return spdlog::level::warn;
        case log_level::error: return spdlog::level::err;
        case log_level::critical: return spdlog::level::critical;
        case log_level::off: return spdlog::level::off;
    }
    return spdlog::level::info;
}
}  // namespace detail

int syslog_priority(log_level level) noexcept {
    switch (level) {
        case log_level::trace:
        case log_level::debug: return 7;
        case log_level::info: return 6;
        case log_level::warn: return 4;
        case log_level::error: return 3;
        case log_level::critical: return 2;
        case log_level::off: return 6;
    }
    return 6;
}

bool stderr_is_journal() {
    const char* env = std::getenv("JOURNAL_STREAM");
    if (env == nullptr) {
        return false;
    }
    unsigned long long dev = 0;
    unsigned long long ino = 0;
    if (std::sscanf(env, "%llu:%llu", &dev, &ino) != 2) {
        return false;
    }
    struct stat st {};
    if (::fstat(STDERR_FILENO, &st) < 0) {
        return false;
    }
    return st.st_dev == dev && st.st_ino == ino;
}

void init(const options& opts) {
    auto sink = opts.sink ? opts.sink : std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto logger = std::make_shared<spdlog::logger>("qrtd", sink);
    style st = opts.output;
    if (st == style::automatic) {
        st = stderr_is_journal() ? style::journal : opts.fallback;
    }
    const bool journal = st == style::journal;
    auto formatter = std::make_unique<spdlog::pattern_formatter>(
        st == style::brief ? "qrtd: %l: %v" : "%Y-%m-%dT%H:%M:%S.%eZ %l %v",
        spdlog::pattern_time_type::utc);
    if (journal) {
        formatter->add_flag<syslog_priority_flag>('*');
        formatter->set_pattern("%*%v");
    }
    logger->set_formatter(std::move(formatter));
    logger->set_level(detail::to_spdlog(opts.level));
    // Errors must reach the journal even if the process dies right after.
    logger->flush_on(spdlog::level::warn);
    spdlog::set_default_logger(std::move(logger));
}

void set_level(log_level level) {
    spdlog::default_logger_raw()->set_level(detail::to_spdlog(level));
}

bool enabled(log_level level) noexcept {
    return level != log_level::off && spdlog::default_logger_raw()->should_log(detail::to_spdlog(level));
}

std::optional<std::uint64_t> rate_limiter::admit(clock::time_point now) noexcept {
    if (!_window_start || now - *_window_start >= _interval) {
        _window_start = now;
        _in_window = 0;
    }
    if (_in_window >= _burst) {
        ++_suppressed;
        return std::nullopt;
    }
    ++_in_window;
    const std::uint64_t n = _suppressed;
    _suppressed = 0;
    return n;
}

}  // namespace qrt::log
