#include "qrt/event_loop.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <exception>
#include <optional>
#include <string>
#include <system_error>

#include "qrt/log.hpp"

namespace qrt {

namespace {

// Runs f; what it threw, or nullopt.
template <typename F>
std::optional<std::string> run_caught(F&& f) {
    try {
        f();
        return std::nullopt;
    } catch (const std::exception& e) {
        return std::string(e.what());
    } catch (...) {
        return std::string("a non-standard exception");
    }
}
constexpr std::uint32_t timer_tag_events = EPOLLIN;

timespec to_timespec(std::chrono::nanoseconds d) {
    const auto ns = d.count();
    return timespec{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
}
}  // namespace

event_loop::event_loop() {
    _epfd.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!_epfd) {
        const int e = errno;
        throw std::system_error(e, std::generic_category(), "epoll_create1");
    }
    _wakefd.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!_wakefd) {
        const int e = errno;
        throw std::system_error(e, std::generic_category(), "eventfd");
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = _wakefd.get();
    if (::epoll_ctl(_epfd.get(), EPOLL_CTL_ADD, _wakefd.get(), &ev) < 0) {
        const int e = errno;
        throw std::system_error(e, std::generic_category(), "epoll_ctl ADD eventfd");
    }
}

// The timers' fds, then the wake-up eventfd and the epoll fd, close with
// their members (in that order: reverse declaration).
event_loop::~event_loop() = default;

rtcore::status event_loop::add_fd(int fd, std::uint32_t epoll_events, fd_callback cb) {
    epoll_event ev{};
    ev.events = epoll_events;
    ev.data.fd = fd;
    if (::epoll_ctl(_epfd.get(), EPOLL_CTL_ADD, fd, &ev) < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "epoll_ctl ADD fd " + std::to_string(fd));
    }
    _fds[fd] = fd_entry{std::make_shared<fd_callback>(std::move(cb))};
    return rtcore::ok();
}

rtcore::status event_loop::modify_fd(int fd, std::uint32_t epoll_events) {
    epoll_event ev{};
    ev.events = epoll_events;
    ev.data.fd = fd;
    if (::epoll_ctl(_epfd.get(), EPOLL_CTL_MOD, fd, &ev) < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "epoll_ctl MOD fd " + std::to_string(fd));
    }
    return rtcore::ok();
}

void event_loop::remove_fd(int fd) noexcept {
    if (_fds.erase(fd) != 0) {
        ::epoll_ctl(_epfd.get(), EPOLL_CTL_DEL, fd, nullptr);
    }
}

rtcore::result<event_loop::timer_id> event_loop::add_timer(std::chrono::nanoseconds first,
                                                           std::chrono::nanoseconds interval,
                                                           task cb) {
    rtcore::unique_fd timer(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
    const int tfd = timer.get();
    if (!timer) {
        const int err = errno;
        return rtcore::error::from_errno(err, "timerfd_create CLOCK_MONOTONIC");
    }
    itimerspec its{};
    // A zero it_value disarms a timerfd; the earliest expiry is 1 ns.
    its.it_value = to_timespec(first.count() > 0 ? first : std::chrono::nanoseconds(1));
    its.it_interval = to_timespec(interval);
    if (::timerfd_settime(tfd, 0, &its, nullptr) < 0) {
        const int e = errno;
        return rtcore::error::from_errno(e, "timerfd_settime");
    }
    const timer_id id = _next_timer++;
    const bool periodic = interval.count() > 0;
    auto shared_cb = std::make_shared<task>(std::move(cb));
    _timers[id] = timer_entry{std::move(timer), periodic, shared_cb};
    auto st = add_fd(tfd, timer_tag_events, [this, id, tfd](std::uint32_t) {
        std::uint64_t expirations = 0;
        if (::read(tfd, &expirations, sizeof expirations) < 0) {
            return;  // EAGAIN: spurious wakeup
        }
        auto it = _timers.find(id);
        if (it == _timers.end()) {
            return;
        }
        auto keep = it->second.cb;  // callback may cancel its own timer
        if (!it->second.periodic) {
            cancel_timer(id);
        }
        (*keep)();
    });
    if (!st) {
        _timers.erase(id);  // closes tfd
        return std::move(st).err();
    }
    return id;
}

void event_loop::cancel_timer(timer_id id) noexcept {
    auto it = _timers.find(id);
    if (it == _timers.end()) {
        return;
    }
    remove_fd(it->second.fd.get());
    _timers.erase(it);  // closes the timerfd
}

void event_loop::post(task cb) {
    {
        std::lock_guard lock(_posted_mu);
        _posted.push_back(std::move(cb));
    }
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(_wakefd.get(), &one, sizeof one);
}

void event_loop::stop() noexcept {
    _stop_requested.store(true, std::memory_order_release);
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(_wakefd.get(), &one, sizeof one);
}

void event_loop::drain_posted() {
    std::uint64_t v = 0;
    [[maybe_unused]] auto n = ::read(_wakefd.get(), &v, sizeof v);
    std::vector<task> batch;
    {
        std::lock_guard lock(_posted_mu);
        batch.swap(_posted);
    }
    for (auto& t : batch) {
        if (const auto what = run_caught(t)) {
            ++_callback_errors;
            log::log_rl(_throw_log, log_level::error, "event loop", "a posted task threw: {}; continuing", *what);
        }
    }
}

void event_loop::dispatch_fd(int fd, std::uint32_t events) {
    auto it = _fds.find(fd);
    if (it == _fds.end()) {
        return;  // removed by an earlier callback in this batch
    }
    auto keep = it->second.cb;
    const auto what = run_caught([&] { (*keep)(events); });
    auto again = _fds.find(fd);
    const bool same = again != _fds.end() && again->second.cb == keep;
    if (!what) {
        if (same) {
            again->second.consecutive_throws = 0;
        }
        return;
    }
    ++_callback_errors;
    if (!same) {
        log::log_rl(_throw_log, log_level::error, "event loop", "callback for fd {} threw: {}; continuing", fd, *what);
        return;
    }
    // Timers are never dropped: their fd is read before the callback, so a
    // throwing timer cannot spin the loop, and dropping one (the job pump,
    // an endpoint poll) would silently stop the daemon's work.
    const bool is_timer = std::any_of(_timers.begin(), _timers.end(),
                                      [fd](const auto& t) { return t.second.fd.get() == fd; });
    if (!is_timer && ++again->second.consecutive_throws >= max_consecutive_throws) {
        log::error("event loop", "callback for fd {} threw {} times in a row (last: {}); no longer watching fd {}", fd,
                   again->second.consecutive_throws, *what, fd);
        remove_fd(fd);
        return;
    }
    log::log_rl(_throw_log, log_level::error, "event loop", "callback for fd {} threw: {}; continuing", fd, *what);
}

void event_loop::run_once(std::chrono::milliseconds timeout) {
    std::array<epoll_event, 64> events{};
    const int n = ::epoll_wait(_epfd.get(), events.data(), static_cast<int>(events.size()),
                               static_cast<int>(timeout.count()));
    if (n < 0) {
        return;  // EINTR: the caller loops
    }
    for (int i = 0; i < n; ++i) {
        const auto& ev = events[static_cast<std::size_t>(i)];
        if (ev.data.fd == _wakefd.get()) {
            drain_posted();
            continue;
        }
        dispatch_fd(ev.data.fd, ev.events);
    }
}

std::uint64_t event_loop::run() {
    std::uint64_t iterations = 0;
    while (!stopping()) {
        run_once(std::chrono::milliseconds(-1));
        ++iterations;
    }
    return iterations;
}

}  // namespace qrt
