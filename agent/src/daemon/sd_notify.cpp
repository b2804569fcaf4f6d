#include "qrt/sd_notify.hpp"

#include <systemd/sd-daemon.h>

#include <cstdlib>

#include "qrt/log.hpp"

namespace qrt {

sd_notifier::~sd_notifier() {
    stop_watchdog();
}

bool sd_notifier::available() {
    const char* s = std::getenv("NOTIFY_SOCKET");
    return s != nullptr && *s != '\0';
}

std::optional<std::chrono::microseconds> sd_notifier::watchdog_interval() {
    std::uint64_t usec = 0;
    const int r = sd_watchdog_enabled(0, &usec);
    if (r <= 0 || usec == 0) {
        return std::nullopt;
    }
    return std::chrono::microseconds(static_cast<std::int64_t>(usec));
}

rtcore::status sd_notifier::notify(const std::string& state) {
    const int r = sd_notify(0, state.c_str());
    if (r < 0) {
        return rtcore::error::from_errno(-r, "sd_notify(\"" + state.substr(0, state.find('\n')) + "\")");
    }
    return rtcore::ok();
}

rtcore::status sd_notifier::ready(std::string_view status_text) {
    return notify("READY=1\nSTATUS=" + std::string(status_text));
}

rtcore::status sd_notifier::status(std::string_view status_text) {
    return notify("STATUS=" + std::string(status_text));
}

rtcore::status sd_notifier::watchdog_ping() {
    ++_pings;
    return notify("WATCHDOG=1");
}

rtcore::status sd_notifier::stopping(std::string_view status_text) {
    return notify("STOPPING=1\nSTATUS=" + std::string(status_text));
}

rtcore::result<std::optional<std::chrono::microseconds>> sd_notifier::start_watchdog(event_loop& loop) {
    stop_watchdog();
    const auto interval = watchdog_interval();
    if (!interval) {
        return std::optional<std::chrono::microseconds>{};
    }
    const auto half = std::chrono::duration_cast<std::chrono::nanoseconds>(*interval) / 2;
    auto id = loop.add_timer(half, half, [this] {
        if (auto st = watchdog_ping(); !st) {
            static log::rate_limiter rl{std::chrono::seconds(60)};
            log::warn_rl(rl, "systemd", "{}", st.err().message);
        }
    });
    if (!id) {
        return std::move(id).err();
    }
    _loop = &loop;
    _timer = *id;
    return std::optional<std::chrono::microseconds>{*interval};
}

void sd_notifier::stop_watchdog() noexcept {
    if (_loop != nullptr && _timer) {
        _loop->cancel_timer(*_timer);
    }
    _loop = nullptr;
    _timer.reset();
}

}  // namespace qrt
