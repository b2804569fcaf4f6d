#pragma once
// The housekeeping event loop: one epoll instance, run by the daemon's main
// thread on the housekeeping cores.  The RPC server, the endpoint readers,
// signal handling (signalfd), the systemd watchdog, BPF map polling and the
// realtime-clock step watch all register here; nothing in qrtd creates a
// thread per connection.
//
// Callbacks run on the loop thread.  A callback may add or remove any fd or
// timer, including its own.  post() and stop() are the only calls that are
// safe from other threads.
//
// A callback that throws does not end the loop (one bad request or endpoint
// must not take the daemon down): the exception is logged with the fd it
// came from and counted in callback_errors().  An fd (not a timer) whose
// callback throws max_consecutive_throws times in a row is removed from the
// loop, so a level-triggered fd cannot spin the loop on the same failure.
// A callback that threw may have left its own object half-updated: the
// count is exported (agent.status, metrics) for that reason.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "qrt/log.hpp"
#include "rtcore/error.hpp"
#include "rtcore/unique_fd.hpp"

namespace qrt {

class event_loop {
public:
    using fd_callback = std::function<void(std::uint32_t epoll_events)>;
    using task = std::function<void()>;
    using timer_id = std::uint64_t;

    event_loop();  // throws std::system_error when epoll or eventfd fails
    ~event_loop();
    event_loop(const event_loop&) = delete;
    event_loop& operator=(const event_loop&) = delete;

    // Watch fd for epoll_events (EPOLLIN, EPOLLOUT, ...).  The loop does not
    // own fd; remove it before closing it.
    rtcore::status add_fd(int fd, std::uint32_t epoll_events, fd_callback cb);
    rtcore::status modify_fd(int fd, std::uint32_t epoll_events);
    void remove_fd(int fd) noexcept;
    bool watching(int fd) const { return _fds.count(fd) != 0; }

    // A timerfd on CLOCK_MONOTONIC: fires after `first`, then every
    // `interval` (zero interval = once).
    rtcore::result<timer_id> add_timer(std::chrono::nanoseconds first,
                                       std::chrono::nanoseconds interval, task cb);
    void cancel_timer(timer_id id) noexcept;

    // Run cb on the loop thread soon.  Thread-safe.
    void post(task cb);

    // Run until stop().  Returns the number of loop iterations.
    std::uint64_t run();
    // One epoll_wait of at most timeout, then its callbacks.  -1 = block.
    void run_once(std::chrono::milliseconds timeout);
    void stop() noexcept;  // thread-safe
    bool stopping() const noexcept { return _stop_requested.load(std::memory_order_acquire); }

    static constexpr unsigned max_consecutive_throws = 100;
    // Exceptions caught from callbacks since the loop was made.
    std::uint64_t callback_errors() const noexcept { return _callback_errors; }

private:
    struct fd_entry {
        std::shared_ptr<fd_callback> cb;
        unsigned consecutive_throws = 0;
    };
    struct timer_entry {
        rtcore::unique_fd fd;
        bool periodic = false;
        std::shared_ptr<task> cb;
    };
    void drain_posted();
    void dispatch_fd(int fd, std::uint32_t events);

    rtcore::unique_fd _epfd;
    rtcore::unique_fd _wakefd;
    std::map<int, fd_entry> _fds;
    std::map<timer_id, timer_entry> _timers;
    timer_id _next_timer = 1;
    std::mutex _posted_mu;
    std::vector<task> _posted;
    std::atomic<bool> _stop_requested{false};
    std::uint64_t _callback_errors = 0;
    log::rate_limiter _throw_log{std::chrono::seconds(1)};  // a callback throwing on every tick
};

}  // namespace qrt
