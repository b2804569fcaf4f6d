#pragma once
// Small helpers the dispatch harnesses share (bench code only).

#include <pthread.h>
#include <sched.h>

namespace qrt_bench {

// Pin the calling thread to one CPU (-1: leave it where it is).
inline void pin(int cpu) {
    if (cpu < 0) {
        return;
    }
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(static_cast<unsigned>(cpu), &s);
    ::pthread_setaffinity_np(::pthread_self(), sizeof(s), &s);
}

// The spin-wait hint.
inline void relax() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

}  // namespace qrt_bench
