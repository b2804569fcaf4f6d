#pragma once
// A mutex with priority inheritance (PTHREAD_PRIO_INHERIT), for state that a
// real-time housekeeping thread (the daemon's job pump, SCHED_FIFO) shares
// with a SCHED_OTHER one (the event loop): while the pump waits for it, the
// holder runs at the pump's priority, so no SCHED_OTHER load on that CPU can
// stretch the wait beyond the holder's own critical section.  Never taken on
// a dispatch thread.  Meets Lockable (std::lock_guard, std::unique_lock).
//
//   rtcore::pi_mutex mu;
//   { std::lock_guard lk(mu); ... }  // short, bounded, no I/O

#include <pthread.h>

#include <cerrno>
#include <system_error>

namespace rtcore {

class pi_mutex {
public:
    pi_mutex() {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setprotocol(&a, PTHREAD_PRIO_INHERIT);
        const int rc = pthread_mutex_init(&_m, &a);
        pthread_mutexattr_destroy(&a);
        if (rc != 0) {
            throw std::system_error(rc, std::generic_category(), "pthread_mutex_init(PTHREAD_PRIO_INHERIT)");
        }
    }
    ~pi_mutex() { pthread_mutex_destroy(&_m); }
    pi_mutex(const pi_mutex&) = delete;
    pi_mutex& operator=(const pi_mutex&) = delete;

    // EDEADLK and friends are programming errors here: the lock is never
    // taken recursively.
    void lock() noexcept { (void)pthread_mutex_lock(&_m); }
    bool try_lock() noexcept { return pthread_mutex_trylock(&_m) == 0; }
    void unlock() noexcept { (void)pthread_mutex_unlock(&_m); }

private:
    pthread_mutex_t _m{};
};

}  // namespace rtcore
