#pragma once
// What dispatcher.cpp (setup and the housekeeping side) and dispatcher_rt.cpp
// (the dispatch thread's loop) share inside qrt_dispatch: the io_uring state
// and the phases of a slot.  Not installed; nothing outside this folder
// includes it.

#include <liburing.h>

#include <cstdint>

#include "qrt/dispatch/dispatcher.hpp"

namespace qrt::dispatch::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

// slot_state::phase values.
constexpr std::uint8_t phase_queued = 0;
constexpr std::uint8_t phase_withdrawn = 1;
constexpr std::uint8_t phase_sending = 2;
constexpr std::uint8_t phase_dropped = 3;

}  // namespace qrt::dispatch::detail

namespace qrt::dispatch {

struct dispatcher::uring {
    io_uring ring{};
    bool inited = false;
    ~uring() {
        if (inited) {
            io_uring_queue_exit(&ring);
        }
    }
};

}  // namespace qrt::dispatch
