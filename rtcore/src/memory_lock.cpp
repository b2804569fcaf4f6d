#include "rtcore/memory_lock.hpp"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "rtcore/capabilities.hpp"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

namespace rtcore {

namespace {

std::uintptr_t page_size() noexcept {
    static const auto p = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    return p;
}

// Holders per locked page, process-wide.  Setup and teardown only.
struct page_table {
    std::mutex mu;
    std::map<std::uintptr_t, unsigned> holders;  // page address -> regions holding it
};

page_table& pages() {
    static page_table* t = new page_table();  // never destroyed: regions may outlive statics
    return *t;
}

std::string limit_text(rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v); }

error mlock_error(const int err, std::uintptr_t begin, std::uintptr_t end, std::string_view what) {
    error e = error::from_errno(err, "mlock " + std::string(what) + " (" + std::to_string(end - begin) + " bytes)");
    rlimit rl{};
    ::getrlimit(RLIMIT_MEMLOCK, &rl);
    if (err == EPERM || err == ENOMEM || err == EAGAIN) {
        e.message += ": needs CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK (now " + limit_text(rl.rlim_cur) +
                     " bytes; LimitMEMLOCK= in the unit)";
    }
    return e;
}

// Drop one holder from each page of [begin, end); munlock the pages left
// without one.  Caller holds the table's mutex.
void release_pages(page_table& t, std::uintptr_t begin, std::uintptr_t end) noexcept {
    const std::uintptr_t ps = page_size();
    std::uintptr_t run = 0;  // start of a run of pages to munlock
    const auto flush = [&](std::uintptr_t upto) {
        if (run != 0) {
            ::munlock(reinterpret_cast<void*>(run), upto - run);
            run = 0;
        }
    };
    for (std::uintptr_t p = begin; p < end; p += ps) {
        auto it = t.holders.find(p);
        if (it == t.holders.end()) {
            flush(p);
            continue;
        }
        if (--it->second == 0) {
            t.holders.erase(it);
            if (run == 0) {
                run = p;
            }
        } else {
            flush(p);
        }
    }
    flush(end);
}

}  // namespace

locked_region::locked_region(locked_region&& o) noexcept
    : _begin(std::exchange(o._begin, 0)), _end(std::exchange(o._end, 0)), _what(std::move(o._what)) {}

locked_region& locked_region::operator=(locked_region&& o) noexcept {
    if (this != &o) {
        reset();
        _begin = std::exchange(o._begin, 0);
        _end = std::exchange(o._end, 0);
        _what = std::move(o._what);
    }
    return *this;
}

locked_region::~locked_region() { reset(); }

void locked_region::reset() noexcept {
    if (_end > _begin) {
        page_table& t = pages();
        const std::lock_guard<std::mutex> lock(t.mu);
        release_pages(t, _begin, _end);
    }
    _begin = _end = 0;
}

result<locked_region> lock_region(const void* p, std::size_t n, std::string_view what) {
    locked_region r;
    r._what = std::string(what);
    if (p == nullptr || n == 0) {
        return r;
    }
    const std::uintptr_t ps = page_size();
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t begin = addr / ps * ps;
    const std::uintptr_t end = (addr + n + ps - 1) / ps * ps;
    page_table& t = pages();
    const std::lock_guard<std::mutex> lock(t.mu);
    // mlock the whole range (cheap for pages already locked: it only
    // re-checks them), then count a holder on each page.
    if (::mlock(reinterpret_cast<void*>(begin), end - begin) != 0) {
        const int err = errno;
        // Pages this call may have locked before failing and that nobody
        // held: give them back.
        for (std::uintptr_t q = begin; q < end; q += ps) {
            if (t.holders.count(q) == 0) {
                ::munlock(reinterpret_cast<void*>(q), ps);
            }
        }
        return mlock_error(err, begin, end, what);
    }
    for (std::uintptr_t q = begin; q < end; q += ps) {
        ++t.holders[q];
    }
    r._begin = begin;
    r._end = end;
    return r;
}

result<thread_stack> current_thread_stack() {
    pthread_attr_t attr;
    if (const int rc = ::pthread_getattr_np(::pthread_self(), &attr); rc != 0) {
        return error::from_errno(rc, "pthread_getattr_np");
    }
    void* stack_addr = nullptr;
    std::size_t stack_size = 0;
    const int rc = ::pthread_attr_getstack(&attr, &stack_addr, &stack_size);
    ::pthread_attr_destroy(&attr);
    if (rc != 0) {
        return error::from_errno(rc, "pthread_attr_getstack");
    }
    volatile char marker = 0;
    return thread_stack{reinterpret_cast<std::uintptr_t>(stack_addr), stack_size,
                        reinterpret_cast<std::uintptr_t>(&marker)};
}

result<locked_region> lock_current_stack(std::size_t below_sp_bytes) {
    const auto stack = current_thread_stack();
    if (!stack) {
        return stack.err();
    }
    const std::uintptr_t sp = stack->sp;
    const std::uintptr_t top = stack->top();
    if (sp < stack->low || sp > top || stack->room() < below_sp_bytes) {
        return error{ENOMEM, "lock stack: " + std::to_string(below_sp_bytes) +
                                 " bytes below the stack pointer requested but this thread has " +
                                 std::to_string(stack->room()) + " (stack size " +
                                 std::to_string(stack->size) + ")"};
    }
    const std::uintptr_t from = sp - below_sp_bytes;
    return lock_region(reinterpret_cast<const void*>(from), top - from, "thread stack");
}

std::vector<mapping> parse_maps(std::string_view text) {
    std::vector<mapping> out;
    std::size_t pos = 0;
    while (pos < text.size()) {
        std::size_t nl = text.find('\n', pos);
        if (nl == std::string_view::npos) {
            nl = text.size();
        }
        const std::string_view line = text.substr(pos, nl - pos);
        pos = nl + 1;
        // start-end perms offset dev inode [path]
        mapping m;
        const auto dash = line.find('-');
        const auto sp1 = line.find(' ');
        if (dash == std::string_view::npos || sp1 == std::string_view::npos || dash > sp1) {
            continue;
        }
        const auto hex = [](std::string_view s, std::uintptr_t& v) {
            const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
            return ec == std::errc{} && p == s.data() + s.size();
        };
        if (!hex(line.substr(0, dash), m.start) || !hex(line.substr(dash + 1, sp1 - dash - 1), m.end)) {
            continue;
        }
        const auto sp2 = line.find(' ', sp1 + 1);
        if (sp2 == std::string_view::npos) {
            continue;
        }
        m.perms = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
        // Skip offset, dev and inode: the path starts after them.
        std::size_t field = sp2;
        for (int i = 0; i < 3 && field != std::string_view::npos; ++i) {
            field = line.find_first_not_of(' ', field);
            field = field == std::string_view::npos ? field : line.find(' ', field);
        }
        if (field != std::string_view::npos) {
            const auto path_at = line.find_first_not_of(' ', field);
            if (path_at != std::string_view::npos) {
                m.path = std::string(line.substr(path_at));
            }
        }
        if (m.perms.size() == 4 && m.end > m.start) {
            out.push_back(std::move(m));
        }
    }
    return out;
}

std::vector<mapping> code_mappings(const std::vector<mapping>& maps) {
    std::vector<mapping> out;
    const auto is_file = [](const mapping& m) {
        constexpr std::string_view deleted = " (deleted)";
        return !m.path.empty() && m.path.front() == '/' &&
               !(m.path.size() > deleted.size() &&
                 m.path.compare(m.path.size() - deleted.size(), deleted.size(), deleted) == 0);
    };
    for (std::size_t i = 0; i < maps.size(); ++i) {
        const mapping& m = maps[i];
        const bool priv = m.perms[3] == 'p';
        const bool readable = m.perms[0] == 'r';
        if (!priv || !readable) {
            continue;
        }
        if (is_file(m)) {
            out.push_back(m);
            continue;
        }
        // The .bss: anonymous, read-write, right after a file's rw mapping.
        if (m.path.empty() && m.perms[1] == 'w' && i > 0) {
            const mapping& prev = maps[i - 1];
            if (is_file(prev) && prev.perms[1] == 'w' && prev.end == m.start) {
                out.push_back(m);
            }
        }
    }
    return out;
}

result<std::vector<locked_region>> lock_mapped_code() {
    std::ifstream in("/proc/self/maps");
    if (!in) {
        const int err = errno;
        return error::from_errno(err != 0 ? err : ENOENT, "open /proc/self/maps");
    }
    std::ostringstream text;
    text << in.rdbuf();
    std::vector<locked_region> out;
    for (const auto& m : code_mappings(parse_maps(text.str()))) {
        auto r = lock_region(reinterpret_cast<const void*>(m.start), m.end - m.start,
                             m.path.empty() ? std::string("bss") : m.path);
        if (!r) {
            return std::move(r).err();  // out's regions unlock as it goes
        }
        out.push_back(std::move(*r));
    }
    return out;
}

std::size_t locked_bytes() noexcept {
    page_table& t = pages();
    const std::lock_guard<std::mutex> lock(t.mu);
    return t.holders.size() * page_size();
}

process_locked_memory parse_process_locked_memory(std::string_view status_text) {
    process_locked_memory out;
    const auto field = [&](std::string_view key) -> std::int64_t {
        const auto at = status_text.find(key);
        if (at == std::string_view::npos || (at > 0 && status_text[at - 1] != '\n')) {
            return -1;
        }
        std::size_t p = at + key.size();
        while (p < status_text.size() && (status_text[p] == ' ' || status_text[p] == '\t')) {
            ++p;
        }
        std::int64_t kb = 0;
        const auto [end, ec] = std::from_chars(status_text.data() + p, status_text.data() + status_text.size(), kb);
        if (ec != std::errc{}) {
            return -1;
        }
        return kb * 1024;
    };
    out.vm_lck_bytes = field("VmLck:");
    out.vm_pin_bytes = field("VmPin:");
    return out;
}

process_locked_memory read_process_locked_memory() {
    std::ifstream in("/proc/self/status");
    if (!in) {
        return {};
    }
    std::ostringstream text;
    text << in.rdbuf();
    return parse_process_locked_memory(text.str());
}

memlock_allowance current_memlock_allowance() noexcept {
    memlock_allowance a;
    a.cap_ipc_lock = has_capability(CAP_IPC_LOCK);
    rlimit rl{};
    if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        a.unlimited = rl.rlim_cur == RLIM_INFINITY;
        a.limit = a.unlimited ? 0 : static_cast<std::uint64_t>(rl.rlim_cur);
    }
    return a;
}

std::string mib_text(std::uint64_t bytes) {
    const std::uint64_t mib = std::uint64_t{1} << 20;
    char buf[48];
    if (bytes % mib == 0) {
        std::snprintf(buf, sizeof buf, "%llu MiB", static_cast<unsigned long long>(bytes / mib));
    } else {
        std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / static_cast<double>(mib));
    }
    return buf;
}

std::string memlock_allowance::describe() const {
    const std::string lim = unlimited ? std::string("unlimited") : mib_text(limit);
    return "RLIMIT_MEMLOCK = " + lim + (cap_ipc_lock ? " and CAP_IPC_LOCK" : " and no CAP_IPC_LOCK");
}

}  // namespace rtcore
