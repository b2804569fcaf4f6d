#pragma once
// The systemd service manager protocol, through libsystemd (sd_notify(3),
// sd_watchdog_enabled(3)).  Without NOTIFY_SOCKET (run by hand) every call
// is a cheap no-op, so the daemon calls them unconditionally.
//
//   qrt::sd_notifier sd;
//   sd.status("applying host partition");
//   ...
//   sd.ready("serving 1 QPU");                  // READY=1 + STATUS=
//   sd.start_watchdog(loop);                    // WATCHDOG=1 at half WatchdogSec=
//   ...
//   sd.stopping("SIGTERM");                     // STOPPING=1 + STATUS=

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "qrt/event_loop.hpp"
#include "rtcore/error.hpp"

namespace qrt {

class sd_notifier {
public:
    sd_notifier() = default;
    ~sd_notifier();
    sd_notifier(const sd_notifier&) = delete;
    sd_notifier& operator=(const sd_notifier&) = delete;

    // NOTIFY_SOCKET is set: a service manager listens.
    static bool available();
    // The watchdog interval systemd expects pings within (WatchdogSec=), when
    // it is enabled for this process (WATCHDOG_USEC, WATCHDOG_PID).
    static std::optional<std::chrono::microseconds> watchdog_interval();

    // Each returns the first error from sd_notify(3), or ok (also when no
    // manager listens).
    rtcore::status ready(std::string_view status_text);
    rtcore::status status(std::string_view status_text);
    rtcore::status watchdog_ping();
    rtcore::status stopping(std::string_view status_text);
    // Raw assignments, one per line ("EXTEND_TIMEOUT_USEC=...").
    rtcore::status notify(const std::string& state);

    // Ping WATCHDOG=1 from a timer on loop at half the watchdog interval.
    // Returns the interval used, or nullopt when the watchdog is not enabled
    // for this process.  The loop thread being alive is what the ping proves.
    rtcore::result<std::optional<std::chrono::microseconds>> start_watchdog(event_loop& loop);
    void stop_watchdog() noexcept;
    unsigned watchdog_pings() const noexcept { return _pings; }

private:
    event_loop* _loop = nullptr;
    std::optional<event_loop::timer_id> _timer;
    unsigned _pings = 0;
};

}  // namespace qrt
