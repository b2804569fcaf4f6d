#pragma once
// Whether mlock() really locks pages in this process: under ThreadSanitizer
// it is intercepted and locks nothing, so VmLck cannot show what is locked.
// Header-only (it needs rtcore, which every test that asks links anyway).

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>

#include "rtcore/memory_lock.hpp"

namespace qrt::testing {

inline bool mlock_really_locks() {
    const long ps = ::sysconf(_SC_PAGESIZE);
    void* p = ::mmap(nullptr, static_cast<std::size_t>(ps), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return false;
    }
    const auto before = rtcore::read_process_locked_memory().vm_lck_bytes;
    bool grew = false;
    if (::mlock(p, static_cast<std::size_t>(ps)) == 0) {
        grew = rtcore::read_process_locked_memory().vm_lck_bytes > before;
        ::munlock(p, static_cast<std::size_t>(ps));
    }
    ::munmap(p, static_cast<std::size_t>(ps));
    return grew;
}

// The reason a test that needs it skips with.
inline constexpr const char* mlock_locks_nothing =
    "mlock() locks nothing in this process (ThreadSanitizer intercepts it), so VmLck cannot show what the "
    "dispatch path locks";

}  // namespace qrt::testing
