// Locking the dispatch path region by region: the page table that keeps a
// shared page locked until its last holder goes, the choice of mappings,
// and the VmLck parser.  Locking needs CAP_IPC_LOCK or RLIMIT_MEMLOCK room
// for a few pages (the default 8 MiB is enough).

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "rtcore/memory_lock.hpp"
#include "qrt_test/memory_lock.hpp"

namespace {

std::int64_t vm_lck() { return rtcore::read_process_locked_memory().vm_lck_bytes; }

bool may_lock_pages(std::size_t bytes) {
    rlimit rl{};
    ::getrlimit(RLIMIT_MEMLOCK, &rl);
    return ::geteuid() == 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= bytes + (1U << 20);
}

}  // namespace


TEST(memory_lock, a_page_two_regions_share_stays_locked_until_both_let_go) {
    if (!qrt::testing::mlock_really_locks()) {
        GTEST_SKIP() << qrt::testing::mlock_locks_nothing;
    }
    const auto ps = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    if (!may_lock_pages(3 * ps)) {
        GTEST_SKIP() << "RLIMIT_MEMLOCK leaves no room to lock 3 pages";
    }
    void* p = ::mmap(nullptr, 3 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    auto* base = static_cast<char*>(p);
    const std::int64_t before = vm_lck();
    ASSERT_GE(before, 0);
    {
        // a: pages 0-1 (a range ending inside page 1); b: pages 1-2.
        auto a = rtcore::lock_region(base + 10, 2 * ps - 20, "a");
        ASSERT_TRUE(a) << a.err().message;
        auto b = rtcore::lock_region(base + ps, 2 * ps, "b");
        ASSERT_TRUE(b) << b.err().message;
        EXPECT_EQ(a->bytes(), 2 * ps);
        EXPECT_EQ(vm_lck() - before, static_cast<std::int64_t>(3 * ps));
        a->reset();
        // Page 1 is b's too: still locked.
        EXPECT_EQ(vm_lck() - before, static_cast<std::int64_t>(2 * ps));
    }
    EXPECT_EQ(vm_lck(), before);
    ::munmap(p, 3 * ps);
}

TEST(memory_lock, the_stack_of_the_calling_thread_is_locked_down_from_below_its_pointer) {
    if (!qrt::testing::mlock_really_locks()) {
        GTEST_SKIP() << qrt::testing::mlock_locks_nothing;
    }
    if (!may_lock_pages(512 * 1024)) {
        GTEST_SKIP() << "RLIMIT_MEMLOCK leaves no room to lock 256 KiB of stack";
    }
    // On a thread of its own, as the dispatch threads are (the main thread's
    // stack is mapped only as far as it has grown).
    std::thread([] {
        const std::int64_t before = vm_lck();
        auto s = rtcore::lock_current_stack(256 * 1024);
        ASSERT_TRUE(s) << s.err().message;
        EXPECT_GE(s->bytes(), 256U * 1024U);
        EXPECT_GE(vm_lck() - before, 256 * 1024);
        s->reset();
        EXPECT_EQ(vm_lck(), before);
        auto huge = rtcore::lock_current_stack(std::size_t{1} << 40);
        ASSERT_FALSE(huge);
        EXPECT_NE(huge.err().message.find("lock stack"), std::string::npos) << huge.err().message;
    }).join();
}

TEST(memory_lock, code_mappings_are_files_and_their_bss_never_heap_stack_shared_or_anon_inodes) {
    const std::string maps =
        "55d0a0000000-55d0a0100000 r--p 00000000 fd:01 100 /usr/sbin/qrtd\n"
        "55d0a0100000-55d0a0500000 r-xp 00100000 fd:01 100 /usr/sbin/qrtd\n"
        "55d0a0500000-55d0a0510000 rw-p 00500000 fd:01 100 /usr/sbin/qrtd\n"
        "55d0a0510000-55d0a0520000 rw-p 00000000 00:00 0 \n"
        "55d0a1000000-55d0a9000000 rw-p 00000000 00:00 0                          [heap]\n"
        "7f0000000000-7f0004000000 rw-p 00000000 00:00 0 \n"
        "7f1000000000-7f1000200000 r-xp 00000000 fd:01 200 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f1000200000-7f1000201000 ---p 00200000 fd:01 200 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f2000000000-7f2000008000 rw-s 00000000 fd:01 300 /var/lib/qrtd/ledger.sqlite-shm\n"
        "7f3000000000-7f3000001000 rw-s 00000000 00:0e 400 anon_inode:[io_uring]\n"
        "7f4000000000-7f4000001000 r-xp 00000000 fd:01 500 /tmp/old.so (deleted)\n"
        "7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]\n"
        "not a mapping line\n";
    const auto parsed = rtcore::parse_maps(maps);
    ASSERT_EQ(parsed.size(), 12U);
    EXPECT_EQ(parsed[4].path, "[heap]");
    EXPECT_EQ(parsed[3].path, "");
    const auto chosen = rtcore::code_mappings(parsed);
    std::vector<std::string> got;
    for (const auto& m : chosen) {
        got.push_back(m.perms + " " + (m.path.empty() ? "bss" : m.path));
    }
    EXPECT_EQ(got, (std::vector<std::string>{"r--p /usr/sbin/qrtd", "r-xp /usr/sbin/qrtd", "rw-p /usr/sbin/qrtd",
                                             "rw-p bss", "r-xp /usr/lib/x86_64-linux-gnu/libc.so.6"}));
}

TEST(memory_lock, vmlck_and_vmpin_are_read_in_bytes) {
    const auto m = rtcore::parse_process_locked_memory(
        "Name:\tqrtd\nVmLck:\t    2048 kB\nVmPin:\t      16 kB\nVmHWM:\t 1 kB\n");
    EXPECT_EQ(m.vm_lck_bytes, 2048 * 1024);
    EXPECT_EQ(m.vm_pin_bytes, 16 * 1024);
    EXPECT_EQ(rtcore::parse_process_locked_memory("Name:\tx\n").vm_lck_bytes, -1);
    EXPECT_GE(rtcore::read_process_locked_memory().vm_lck_bytes, 0);
}
