#pragma once
// Locked memory for the dispatch path only, so that months of running do
// not lock every page the process ever allocates.
//
// mlockall(MCL_CURRENT | MCL_FUTURE) locks every page the process has and
// will ever map: the ledger, SQLite's cache and every client connection's
// buffers too, so the locked set grows with the load.  Instead, what the
// real-time thread touches is locked region by region:
//
//   lock_region(p, n, what)    the pages of [p, p + n): a dispatcher's
//                              rings, slot arrays, frame pool, the
//                              dispatcher object itself
//   lock_current_stack(bytes)  the calling thread's stack from `bytes`
//                              below its stack pointer to its top (glibc
//                              keeps the thread's TLS there too)
//   lock_mapped_code(maps)     the file-backed private mappings of the
//                              executable and its libraries (code, rodata,
//                              data, relro) and the .bss after each: what
//                              the RT thread executes and reads
//
// mlock() does not count, so a page two regions share must stay locked until
// both let go: a process-wide table counts holders per page (setup and
// teardown only: it takes a mutex and allocates), and only a page whose last
// holder goes is munlock'ed.  mlock faults the pages in, so a locked region
// is also prefaulted.  The locked total is bounded by what the dispatch path
// is made of, not by the number of clients.
//
// Errors name the call and the fix: mlock needs CAP_IPC_LOCK or a large
// enough RLIMIT_MEMLOCK.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rtcore/error.hpp"

namespace rtcore {

// RAII: the pages of one region stay locked while it lives.
class locked_region {
public:
    locked_region() = default;
    locked_region(locked_region&& o) noexcept;
    locked_region& operator=(locked_region&& o) noexcept;
    locked_region(const locked_region&) = delete;
    locked_region& operator=(const locked_region&) = delete;
    ~locked_region();

    std::uintptr_t begin() const noexcept { return _begin; }
    std::size_t bytes() const noexcept { return _end - _begin; }
    const std::string& what() const noexcept { return _what; }
    void reset() noexcept;

private:
    friend result<locked_region> lock_region(const void* p, std::size_t n, std::string_view what);
    std::uintptr_t _begin = 0;  // page-aligned
    std::uintptr_t _end = 0;
    std::string _what;
};

// Locks the pages spanning [p, p + n).  n == 0 locks nothing.
result<locked_region> lock_region(const void* p, std::size_t n, std::string_view what);

// The calling thread's stack block, as glibc knows it (pthread_getattr_np):
// its lowest address and its size (the stack grows down from top()), and
// about where the caller's stack pointer is (an address in the frame of
// current_thread_stack, just below the caller's).
struct thread_stack {
    std::uintptr_t low = 0;
    std::size_t size = 0;
    std::uintptr_t sp = 0;
    std::uintptr_t top() const noexcept { return low + size; }
    // Bytes of stack below sp.
    std::size_t room() const noexcept { return sp > low ? static_cast<std::size_t>(sp - low) : 0; }
};
result<thread_stack> current_thread_stack();

// The calling thread's stack, from `below_sp_bytes` below the current stack
// pointer up to the top of the thread's stack block.  Fails (locking
// nothing) when the stack has less room than that.
result<locked_region> lock_current_stack(std::size_t below_sp_bytes);

// One line of /proc/self/maps, parsed.
struct mapping {
    std::uintptr_t start = 0;
    std::uintptr_t end = 0;
    std::string perms;  // "r-xp"
    std::string path;   // "" for anonymous mappings
};
// Parses /proc/self/maps text; lines that do not parse are skipped.
std::vector<mapping> parse_maps(std::string_view text);
// Which of `maps` lock_mapped_code locks: private mappings of a file (a path
// starting with '/', not "(deleted)"), readable, and the anonymous
// read-write mapping right after a file's read-write one (its .bss).  Never
// [heap], [stack], shared mappings, or anon_inode mappings (io_uring, BPF).
std::vector<mapping> code_mappings(const std::vector<mapping>& maps);
// Locks code_mappings() of the current /proc/self/maps.
result<std::vector<locked_region>> lock_mapped_code();

// Bytes locked through this module (the page table's size times the page
// size): what the dispatch path holds locked.
std::size_t locked_bytes() noexcept;

// VmLck and VmPin of /proc/self/status, in bytes (-1 when unreadable).
struct process_locked_memory {
    std::int64_t vm_lck_bytes = -1;  // mlock'ed pages
    std::int64_t vm_pin_bytes = -1;  // pages pinned by the kernel (io_uring registered buffers)
};
process_locked_memory read_process_locked_memory();
// The same, from the text of a status file (for tests).
process_locked_memory parse_process_locked_memory(std::string_view status_text);

// What this process may lock: mlock(2) and io_uring's registered buffers
// (pinned pages) both count against RLIMIT_MEMLOCK, unless CAP_IPC_LOCK is
// effective.  A container or a unit without LimitMEMLOCK= has 8 MiB.
struct memlock_allowance {
    bool cap_ipc_lock = false;
    bool unlimited = false;   // RLIMIT_MEMLOCK is RLIM_INFINITY
    std::uint64_t limit = 0;  // RLIMIT_MEMLOCK soft limit, bytes
    bool covers(std::uint64_t bytes) const noexcept { return cap_ipc_lock || unlimited || bytes <= limit; }
    // "RLIMIT_MEMLOCK = 8 MiB and no CAP_IPC_LOCK", "CAP_IPC_LOCK", ...
    std::string describe() const;
};
memlock_allowance current_memlock_allowance() noexcept;
// Bytes in MiB for messages: "8 MiB", "64.1 MiB".
std::string mib_text(std::uint64_t bytes);

}  // namespace rtcore
