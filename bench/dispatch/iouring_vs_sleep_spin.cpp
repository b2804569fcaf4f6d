// iouring-vs-sleep-spin: how should the dispatch thread leave at T?
//
//   sleep_spin   clock_nanosleep(ABS, T - lead), spin to T, io_uring
//                WRITE_FIXED (registered file + buffer) submitted at T
//                (the dispatcher's path);
//   uring_link   one io_uring_enter: IORING_OP_TIMEOUT (absolute T,
//                IORING_TIMEOUT_ABS | IORING_TIMEOUT_ETIME_SUCCESS) linked
//                (IOSQE_IO_LINK) to the same WRITE_FIXED; the kernel sends
//                when the timer fires, the thread waits for the CQEs;
//   sleep_only   clock_nanosleep(ABS, T) then the write (no spin).
// (IORING_OP_LINK_TIMEOUT bounds how long a linked op may take; it cannot
// delay one, so the "send at T" form is TIMEOUT -> WRITE.)
//
// The frames go over a connected UDP socket on loopback whose receiver has
// SO_TIMESTAMPNS: the kernel stamps each datagram as it enters the receive
// path, which on loopback happens inside the sender's write (so the stamp is
// the send time, whoever runs the receiver and whenever).  lateness = kernel
// stamp - T (T converted to realtime once, rtcore::time_base), the same
// measure for every path.  The sender runs SCHED_FIFO pinned when allowed.  CPU time of
// the sender per dispatch (CLOCK_THREAD_CPUTIME_ID) shows what spinning costs.
// Ends with ONE JSON line.
//
//   build/bench/dispatch/iouring-vs-sleep-spin --cpu 1 --rx-cpu 0 --loops 2000 --interval-us 1000

#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_thread.hpp"
#include "rtcore/clock.hpp"
#include "rtcore/histogram.hpp"

namespace {

struct msg {
    std::uint64_t path = 0;
    std::int64_t t_ns = 0;
};

enum path_id : std::uint64_t { sleep_spin = 0, uring_link = 1, sleep_only = 2, path_count = 3 };
const char* path_names[path_count] = {"sleep_spin", "uring_link", "sleep_only"};

using qrt_bench::pin;
using qrt_bench::relax;

std::int64_t thread_cpu_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return rtcore::to_ns(ts);
}

// An SQE, or abort: the ring has 16 entries and holds at most 2 here.
io_uring_sqe* must_get_sqe(io_uring* ring) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) {
        io_uring_submit(ring);
        sqe = io_uring_get_sqe(ring);
    }
    if (sqe == nullptr) {
        std::abort();
    }
    return sqe;
}

}  // namespace

int main(int argc, char** argv) {
    int cpu = 1;
    int rx_cpu = 0;
    int prio = 80;
    int loops = 2000;
    int interval_us = 1000;
    int lead_us = 30;
    CLI::App app{"iouring-vs-sleep-spin: io_uring linked timeout->write vs clock_nanosleep+spin, side by side"};
    app.footer("Example:\n  build/bench/dispatch/iouring-vs-sleep-spin --cpu 1 --rx-cpu 0 --loops 2000 --interval-us 1000");
    app.add_option("--cpu", cpu, "sender CPU");
    app.add_option("--rx-cpu", rx_cpu, "receiver CPU");
    app.add_option("--prio", prio, "sender SCHED_FIFO priority")->check(CLI::Range(1, 99));
    app.add_option("--loops", loops, "dispatches per path")->check(CLI::Range(10, 1000000));
    app.add_option("--interval-us", interval_us, "interval")->check(CLI::Range(100, 1000000));
    app.add_option("--lead-us", lead_us, "spin lead of sleep_spin");
    CLI11_PARSE(app, argc, argv);

    // sp[0]: sender (connected), sp[1]: receiver (bound, SO_TIMESTAMPNS).
    int sp[2] = {::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)};
    {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof(a);
        const int one = 1;
        timeval tv{0, 200'000};
        if (sp[0] < 0 || sp[1] < 0 || ::bind(sp[1], reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
            ::getsockname(sp[1], reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
            ::connect(sp[0], reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
            ::setsockopt(sp[1], SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one)) != 0 ||
            ::setsockopt(sp[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
            std::perror("udp loopback setup");
            return 1;
        }
    }
    const rtcore::real_clock clk;
    const rtcore::time_base base = rtcore::time_base::sample(clk);
    io_uring ring{};
    if (int rc = io_uring_queue_init(16, &ring, 0); rc < 0) {
        std::fprintf(stderr, "io_uring_queue_init: %s\n", std::strerror(-rc));
        return 1;
    }
    static msg buf[4];
    iovec iov{buf, sizeof(buf)};
    if (int rc = io_uring_register_buffers(&ring, &iov, 1); rc < 0) {
        std::fprintf(stderr, "io_uring_register_buffers: %s\n", std::strerror(-rc));
        return 1;
    }
    if (int rc = io_uring_register_files(&ring, &sp[0], 1); rc < 0) {
        std::fprintf(stderr, "io_uring_register_files: %s\n", std::strerror(-rc));
        return 1;
    }

    std::vector<rtcore::histogram> hist(path_count);
    std::atomic<bool> rx_stop{false};
    std::atomic<std::uint64_t> received{0};
    std::thread rx([&] {
        pin(rx_cpu);
        while (!rx_stop.load(std::memory_order_relaxed)) {
            msg m;
            iovec v{&m, sizeof(m)};
            alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec))];
            msghdr mh{};
            mh.msg_iov = &v;
            mh.msg_iovlen = 1;
            mh.msg_control = control;
            mh.msg_controllen = sizeof(control);
            const ssize_t n = ::recvmsg(sp[1], &mh, 0);
            if (n != static_cast<ssize_t>(sizeof(m))) {
                continue;  // timeout (to see rx_stop) or a short datagram
            }
            for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS && m.path < path_count) {
                    timespec ts{};
                    std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
                    hist[m.path].record(rtcore::to_ns(ts) - base.to_realtime_ns(m.t_ns));
                }
            }
            received.fetch_add(1, std::memory_order_release);
        }
    });

    std::string rt_note = "SCHED_FIFO";
    std::int64_t cpu_ns[path_count] = {0, 0, 0};
    std::uint64_t write_errors = 0;
    std::thread tx([&] {
        pin(cpu);
        ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
        sched_param spm{};
        spm.sched_priority = prio;
        if (::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &spm) != 0) {
            rt_note = "SCHED_OTHER (SCHED_FIFO refused: not root?)";
        }
        const std::int64_t interval = static_cast<std::int64_t>(interval_us) * 1000;
        const std::int64_t lead = static_cast<std::int64_t>(lead_us) * 1000;
        for (std::uint64_t path = 0; path < path_count; ++path) {
            std::int64_t t = rtcore::monotonic_now_ns() + 20'000'000;
            const std::int64_t cpu0 = thread_cpu_ns();
            for (int i = 0; i < loops; ++i, t += interval) {
                buf[0] = msg{path, t};
                io_uring_sqe* sqe = nullptr;
                if (path == uring_link) {
                    __kernel_timespec ts{t / rtcore::ns_per_s, t % rtcore::ns_per_s};
                    sqe = must_get_sqe(&ring);
                    io_uring_prep_timeout(sqe, &ts, 0, IORING_TIMEOUT_ABS | IORING_TIMEOUT_ETIME_SUCCESS);
                    sqe->flags |= IOSQE_IO_LINK;
                    io_uring_sqe_set_data64(sqe, 1);
                    sqe = must_get_sqe(&ring);
                    io_uring_prep_write_fixed(sqe, 0, &buf[0], sizeof(msg), ~0ULL, 0);
                    sqe->flags |= IOSQE_FIXED_FILE;
                    io_uring_sqe_set_data64(sqe, 2);
                    io_uring_submit_and_wait(&ring, 2);
                } else {
                    const timespec wake = rtcore::to_timespec(path == sleep_spin ? t - lead : t);
                    while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &wake, nullptr) == EINTR) {
                    }
                    if (path == sleep_spin) {
                        while (rtcore::monotonic_now_ns() < t) {
                            relax();
                        }
                    }
                    sqe = must_get_sqe(&ring);
                    io_uring_prep_write_fixed(sqe, 0, &buf[0], sizeof(msg), ~0ULL, 0);
                    sqe->flags |= IOSQE_FIXED_FILE;
                    io_uring_sqe_set_data64(sqe, 2);
                    io_uring_submit_and_wait(&ring, 1);
                }
                // Reap until the write's CQE is in (the timeout's may come first).
                bool write_done = false;
                while (!write_done) {
                    io_uring_cqe* cqe = nullptr;
                    if (io_uring_wait_cqe(&ring, &cqe) != 0 || cqe == nullptr) {
                        ++write_errors;
                        break;
                    }
                    if (io_uring_cqe_get_data64(cqe) == 2) {
                        write_done = true;
                        if (cqe->res != static_cast<int>(sizeof(msg))) {
                            ++write_errors;
                        }
                    }
                    io_uring_cqe_seen(&ring, cqe);
                }
            }
            cpu_ns[path] = thread_cpu_ns() - cpu0;
        }
    });
    tx.join();
    const std::uint64_t expect = static_cast<std::uint64_t>(loops) * path_count;
    for (int i = 0; i < 2000 && received.load(std::memory_order_acquire) < expect; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    rx_stop.store(true);
    rx.join();
    io_uring_queue_exit(&ring);

    std::printf("iouring-vs-sleep-spin: sender cpu %d (%s), receiver cpu %d, interval %d us, %d loops, lead %d us\n",
                cpu, rt_note.c_str(), rx_cpu, interval_us, loops, lead_us);
    std::printf("\narrival lateness (us)  count       p50       p95       p99       max    stddev   cpu us/dispatch\n");
    nlohmann::json paths = nlohmann::json::object();
    for (std::uint64_t p = 0; p < path_count; ++p) {
        const auto s = hist[p].summary();
        const double cpu_us = static_cast<double>(cpu_ns[p]) / 1e3 / loops;
        std::printf("%-20s %7llu %9.2f %9.2f %9.2f %9.2f %9.2f %12.2f\n", path_names[p],
                    static_cast<unsigned long long>(s.count), static_cast<double>(s.p50_ns) / 1e3,
                    static_cast<double>(s.p95_ns) / 1e3, static_cast<double>(s.p99_ns) / 1e3,
                    static_cast<double>(s.max_ns) / 1e3, s.stddev_ns / 1e3, cpu_us);
        paths[path_names[p]] = {{"count", s.count},
                                {"p50_us", static_cast<double>(s.p50_ns) / 1e3},
                                {"p95_us", static_cast<double>(s.p95_ns) / 1e3},
                                {"p99_us", static_cast<double>(s.p99_ns) / 1e3},
                                {"max_us", static_cast<double>(s.max_ns) / 1e3},
                                {"stddev_us", s.stddev_ns / 1e3},
                                {"cpu_us_per_dispatch", cpu_us}};
    }
    const auto a = hist[sleep_spin].summary();
    const auto b = hist[uring_link].summary();
    const double r99 = a.p99_ns > 0 ? static_cast<double>(b.p99_ns) / static_cast<double>(a.p99_ns) : 0.0;
    const double r50 = a.p50_ns > 0 ? static_cast<double>(b.p50_ns) / static_cast<double>(a.p50_ns) : 0.0;
    const char* better = b.p99_ns < a.p99_ns ? "uring_link" : "sleep_spin";
    std::printf("\nuring_link / sleep_spin: p50 x%.2f, p99 x%.2f -> better path: %s\n", r50, r99, better);
    std::printf("note: 2-vCPU VM, hypervisor steal time applies; compare ratios within this run.\n");
    nlohmann::json j = {{"bench", "iouring-vs-sleep-spin"},
                        {"cpu", cpu},
                        {"rx_cpu", rx_cpu},
                        {"sched", rt_note},
                        {"interval_us", interval_us},
                        {"loops", loops},
                        {"lead_us", lead_us},
                        {"write_errors", write_errors},
                        {"paths", paths},
                        {"ratios", {{"uring_link_over_sleep_spin_p50", r50}, {"uring_link_over_sleep_spin_p99", r99}}},
                        {"better", better}};
    std::printf("%s\n", j.dump().c_str());
    ::close(sp[0]);
    ::close(sp[1]);
    return write_errors == 0 ? 0 : 1;
}
