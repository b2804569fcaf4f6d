// submit-cost: what the send at T costs the dispatch thread, piece by piece.
//
// On one pinned SCHED_FIFO thread, round-robin (so drift and steal hit every
// variant alike), each variant once per round, N rounds:
//
//   clock_pair        two clock_gettime(CLOCK_MONOTONIC): the measuring floor
//   uring_nop         io_uring_submit of one IORING_OP_NOP: the system call
//   write_busy_rx     WRITE_FIXED (registered file + buffer, 96-byte frame)
//                     to a unix stream socket whose reader spins on another
//                     CPU (no wakeup inside the write): the dispatcher's send
//   write_nowait      the same with RWF_NOWAIT (what qrtd sends with)
//   write_link_to     the same linked to an IORING_OP_LINK_TIMEOUT (absolute,
//                     T + 1 ms): the alternative to RWF_NOWAIT, not taken
//   write_sleeping_rx the same write to a socket whose reader sleeps in
//                     read(2) on another CPU: the wakeup happens in the write
//
// Each figure is monotonic time around the submission (the dispatcher's
// "after submit" measure), p50/p99/max in us, and each variant's p50 and p99
// as a ratio of uring_nop's (the system call that any syscall submission
// pays).  With --cyclictest-p99-us, it also prints the floor against the 0.1x
// goal of dispatch-vs-cyclictest.  Ends with ONE JSON line.
//
//   build/bench/dispatch/submit-cost --cpu 1 --rx-cpu 0 --rounds 4000

#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_thread.hpp"
#include "rtcore/clock.hpp"

namespace {

constexpr std::size_t frame_len = 96;

enum variant : std::size_t {
    clock_pair,
    uring_nop,
    write_busy_rx,
    write_nowait,
    write_link_to,
    write_sleeping_rx,
    variant_count
};
const std::array<const char*, variant_count> names = {"clock_pair",   "uring_nop",     "write_busy_rx",
                                                      "write_nowait", "write_link_to", "write_sleeping_rx"};

using qrt_bench::pin;
using qrt_bench::relax;

struct stats {
    double p50_us = 0, p99_us = 0, max_us = 0;
};

stats summarize(std::vector<std::int64_t> v) {
    stats s;
    if (v.empty()) {
        return s;
    }
    std::sort(v.begin(), v.end());
    const auto at = [&](double q) {
        const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
        return static_cast<double>(v[i]) / 1e3;
    };
    s.p50_us = at(0.50);
    s.p99_us = at(0.99);
    s.max_us = static_cast<double>(v.back()) / 1e3;
    return s;
}

// Reads everything from fd until stop: spinning (non-blocking) or sleeping.
void reader(int fd, int cpu, bool spin, const std::atomic<bool>& stop) {
    pin(cpu);
    if (spin) {
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    std::array<char, 8192> buf{};
    while (!stop.load(std::memory_order_relaxed)) {
        [[maybe_unused]] const ssize_t n = ::read(fd, buf.data(), buf.size());
    }
}

// Reaps every CQE; returns false if a write did not write the whole frame.
bool reap(io_uring* ring) {
    bool ok = true;
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(ring, &cqe) == 0 && cqe != nullptr) {
        if (cqe->user_data == 1 && cqe->res != static_cast<int>(frame_len)) {
            ok = false;
        }
        io_uring_cqe_seen(ring, cqe);
    }
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    int cpu = 1;
    int rx_cpu = 0;
    int prio = 80;
    int rounds = 4000;
    int gap_us = 200;
    double cyclictest_p99_us = 0;
    CLI::App app{"Cost of the dispatch thread's submission at T, piece by piece (round-robin, one JSON line)"};
    app.footer("Example:\n  build/bench/dispatch/submit-cost --cpu 1 --rx-cpu 0 --rounds 4000 --cyclictest-p99-us 21");
    app.add_option("--cpu", cpu, "sender CPU (SCHED_FIFO when allowed)");
    app.add_option("--rx-cpu", rx_cpu, "CPU of the two readers");
    app.add_option("--prio", prio, "sender SCHED_FIFO priority")->check(CLI::Range(1, 99));
    app.add_option("--rounds", rounds, "rounds (each variant once per round)")->check(CLI::Range(10, 1000000));
    app.add_option("--gap-us", gap_us, "spin between two measurements")->check(CLI::Range(10, 100000));
    app.add_option("--cyclictest-p99-us", cyclictest_p99_us,
                   "cyclictest p99 measured on this CPU (e.g. by dispatch-vs-cyclictest): print the 0.1x goal");
    CLI11_PARSE(app, argc, argv);

    int busy_sp[2] = {-1, -1};
    int sleep_sp[2] = {-1, -1};
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, busy_sp) != 0 ||
        ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sleep_sp) != 0) {
        std::fprintf(stderr, "submit-cost: socketpair: %s\n", std::strerror(errno));
        return 1;
    }
    std::atomic<bool> stop{false};
    std::thread busy_rx(reader, busy_sp[1], rx_cpu, true, std::cref(stop));
    std::thread sleep_rx(reader, sleep_sp[1], rx_cpu, false, std::cref(stop));

    io_uring ring{};
    if (const int rc = io_uring_queue_init(16, &ring, 0); rc < 0) {
        std::fprintf(stderr, "submit-cost: io_uring_queue_init: %s\n", std::strerror(-rc));
        return 1;
    }
    const int files[2] = {busy_sp[0], sleep_sp[0]};
    alignas(64) static std::array<std::uint8_t, frame_len> frame{};
    iovec iov{frame.data(), frame.size()};
    if (io_uring_register_files(&ring, files, 2) < 0 || io_uring_register_buffers(&ring, &iov, 1) < 0) {
        std::fprintf(stderr, "submit-cost: io_uring_register: failed\n");
        return 1;
    }

    pin(cpu);
    sched_param sp{};
    sp.sched_priority = prio;
    const bool rt = ::sched_setscheduler(0, SCHED_FIFO, &sp) == 0;

    std::array<std::vector<std::int64_t>, variant_count> samples;
    for (auto& s : samples) {
        s.reserve(static_cast<std::size_t>(rounds));
    }
    bool writes_ok = true;
    __kernel_timespec limit{};
    for (int r = 0; r < rounds; ++r) {
        for (std::size_t v = 0; v < variant_count; ++v) {
            // A quiet gap before each measurement (the receivers drain).
            const std::int64_t until = rtcore::monotonic_now_ns() + std::int64_t{gap_us} * 1000;
            while (rtcore::monotonic_now_ns() < until) {
                relax();
            }
            io_uring_sqe* sqe = v == clock_pair ? nullptr : io_uring_get_sqe(&ring);
            if (v != clock_pair && sqe == nullptr) {
                std::fprintf(stderr, "submit-cost: no SQE\n");
                return 1;
            }
            const std::int64_t t0 = rtcore::monotonic_now_ns();
            switch (v) {
                case clock_pair:
                    break;
                case uring_nop:
                    io_uring_prep_nop(sqe);
                    sqe->user_data = 0;
                    io_uring_submit(&ring);
                    break;
                case write_busy_rx:
                case write_nowait:
                case write_link_to:
                case write_sleeping_rx: {
                    io_uring_prep_write_fixed(sqe, v == write_sleeping_rx ? 1 : 0, frame.data(), frame_len,
                                              ~std::uint64_t{0}, 0);
                    sqe->flags |= IOSQE_FIXED_FILE;
                    sqe->user_data = 1;
                    if (v == write_nowait) {
                        sqe->rw_flags = RWF_NOWAIT;
                    }
                    if (v == write_link_to) {
                        sqe->flags |= IOSQE_IO_LINK;
                        const std::int64_t lim = t0 + 1'000'000;
                        limit.tv_sec = lim / 1'000'000'000;
                        limit.tv_nsec = lim % 1'000'000'000;
                        io_uring_sqe* lt = io_uring_get_sqe(&ring);
                        if (lt == nullptr) {
                            std::fprintf(stderr, "submit-cost: no SQE\n");
                            return 1;
                        }
                        io_uring_prep_link_timeout(lt, &limit, IORING_TIMEOUT_ABS);
                        lt->user_data = 2;
                    }
                    io_uring_submit(&ring);
                    break;
                }
                default:
                    break;
            }
            const std::int64_t t1 = rtcore::monotonic_now_ns();
            samples[v].push_back(t1 - t0);
            writes_ok = reap(&ring) && writes_ok;
        }
    }
    stop.store(true);
    ::shutdown(busy_sp[0], SHUT_WR);
    ::shutdown(sleep_sp[0], SHUT_WR);
    busy_rx.join();
    sleep_rx.join();
    io_uring_queue_exit(&ring);

    std::array<stats, variant_count> st;
    for (std::size_t v = 0; v < variant_count; ++v) {
        st[v] = summarize(samples[v]);
    }
    const stats& nop = st[uring_nop];
    std::printf("submit-cost: CPU %d (%s), readers on CPU %d, %d rounds, %d us gap\n\n", cpu,
                rt ? "SCHED_FIFO" : "SCHED_OTHER: not root?", rx_cpu, rounds, gap_us);
    std::printf("%-18s %9s %9s %9s %11s %11s\n", "variant (us)", "p50", "p99", "max", "p50/nop", "p99/nop");
    nlohmann::json jv = nlohmann::json::object();
    for (std::size_t v = 0; v < variant_count; ++v) {
        const double r50 = nop.p50_us > 0 ? st[v].p50_us / nop.p50_us : 0;
        const double r99 = nop.p99_us > 0 ? st[v].p99_us / nop.p99_us : 0;
        std::printf("%-18s %9.2f %9.2f %9.2f %11.2f %11.2f\n", names[v], st[v].p50_us, st[v].p99_us, st[v].max_us,
                    r50, r99);
        jv[names[v]] = {{"p50_us", st[v].p50_us},
                        {"p99_us", st[v].p99_us},
                        {"max_us", st[v].max_us},
                        {"p50_over_nop", r50},
                        {"p99_over_nop", r99}};
    }
    nlohmann::json j = {{"bench", "submit-cost"}, {"cpu", cpu},      {"rx_cpu", rx_cpu}, {"rounds", rounds},
                        {"sched_fifo", rt},       {"variants", jv}, {"writes_ok", writes_ok}};
    if (cyclictest_p99_us > 0) {
        const double goal = 0.1 * cyclictest_p99_us;
        std::printf("\n0.1 x cyclictest p99 = %.2f us: the system call alone (uring_nop p99 %.2f us) is %.2fx that; "
                    "the send (write_nowait p99 %.2f us) %.2fx\n",
                    goal, nop.p99_us, nop.p99_us / goal, st[write_nowait].p99_us, st[write_nowait].p99_us / goal);
        j["cyclictest_p99_us"] = cyclictest_p99_us;
        j["nop_p99_over_goal"] = nop.p99_us / goal;
        j["send_p99_over_goal"] = st[write_nowait].p99_us / goal;
    }
    if (!writes_ok) {
        std::printf("\nwarning: a write did not complete in full (see writes_ok)\n");
    }
    std::printf("note: 2-vCPU VM, not PREEMPT_RT, hypervisor steal applies; compare ratios, not absolutes.\n");
    std::printf("%s\n", j.dump().c_str());
    return writes_ok ? 0 : 1;
}
