// runqlat-crosscheck: probe 1 (qrt wakeup histogram) against libbpf-tools
// runqlat on the same thread, in the same run.
//
//   sudo build/bench/bpf/bpf_runqlat_crosscheck [--cpu 1] [--loops 3000]
//        [--period-us 1000] [--fifo 0] [--load] [--runqlat /usr/sbin/runqlat]
//
// A child process (one thread) wakes periodically on --cpu; runqlat -p <pid>
// and probe 1 (TID filter) watch it concurrently.  runqlat only prints a log2
// histogram in microseconds, so the probe's histogram is also re-binned into
// runqlat's buckets and both medians are computed the same way (linear
// interpolation inside the bucket).  Goal: medians within 25%.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include "harness.hpp"
#include "qrt_bpf/availability.hpp"
#include "qrt_bpf/wakeup_probe.hpp"

namespace {

constexpr int slots = 32;
using log2_hist = std::array<double, slots>;  // runqlat's usecs slots

int slot_of_us(std::uint64_t us) {
    if (us <= 1) {
        return 0;
    }
    int s = 0;
    while (us > 1 && s < slots - 1) {
        us >>= 1;
        ++s;
    }
    return s;
}

double log2_median_us(const log2_hist& h) {
    double total = 0;
    for (double n : h) {
        total += n;
    }
    if (total <= 0) {
        return 0;
    }
    double seen = 0;
    for (int s = 0; s < slots; ++s) {
        if (h[static_cast<std::size_t>(s)] <= 0) {
            continue;
        }
        const double n = h[static_cast<std::size_t>(s)];
        if (seen + n >= total / 2) {
            const double lo = s == 0 ? 0.0 : std::ldexp(1.0, s);
            const double hi = std::ldexp(1.0, s + 1);
            return lo + (hi - lo) * (total / 2 - seen) / n;
        }
        seen += n;
    }
    return 0;
}

// runqlat slot k holds integer microseconds [2^k, 2^(k+1)) (slot 0: [0, 2)),
// i.e. nanoseconds [2^k * 1000, 2^(k+1) * 1000).  Each fine bucket's count is
// split across the slots it overlaps, in proportion to the overlap (samples
// assumed uniform inside a bucket, whose width is <= 1/8 of its value).
log2_hist rebin(const qrt_bpf::wakeup_histogram& h) {
    log2_hist out{};
    for (unsigned i = 0; i < qrt_bpf::wakeup_histogram::bucket_count; ++i) {
        if (h.buckets[i] == 0) {
            continue;
        }
        const double lo = static_cast<double>(qrt_bpf::wakeup_histogram::bucket_lower_ns(i));
        const double hi = i + 1 < qrt_bpf::wakeup_histogram::bucket_count
                              ? static_cast<double>(qrt_bpf::wakeup_histogram::bucket_upper_ns(i))
                              : static_cast<double>(h.max_ns) + 1;
        const double n = static_cast<double>(h.buckets[i]);
        for (int k = 0; k < slots; ++k) {
            const double slot_lo = k == 0 ? 0.0 : std::ldexp(1000.0, k);
            const double slot_hi = k == slots - 1 ? 1e300 : std::ldexp(1000.0, k + 1);
            const double overlap = std::min(hi, slot_hi) - std::max(lo, slot_lo);
            if (overlap > 0) {
                out[static_cast<std::size_t>(k)] += n * overlap / (hi - lo);
            }
        }
    }
    return out;
}

// Reads fd until text appears or timeout; returns everything read.
std::string read_until(int fd, const std::string& text, int timeout_ms) {
    std::string got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (got.find(text) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) {
            continue;
        }
        char buf[4096];
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n <= 0) {
            break;
        }
        got.append(buf, static_cast<std::size_t>(n));
    }
    return got;
}

std::string read_all(int fd) {
    std::string got;
    char buf[4096];
    ssize_t n = 0;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) {
        got.append(buf, static_cast<std::size_t>(n));
    }
    return got;
}

}  // namespace

int main(int argc, char** argv) {
    unsigned cpu = 1;
    int loops = 3000;
    int period_us = 1000;
    int fifo = 0;
    bool load = false;
    std::string runqlat = "/usr/sbin/runqlat";
    CLI::App app{"Probe 1 (wakeup latency) vs libbpf-tools runqlat on the same thread"};
    app.add_option("--cpu", cpu, "CPU the woken thread is pinned to")->check(CLI::Range(0, 4095));
    app.add_option("--loops", loops, "wakeups")->check(CLI::Range(10, 1000000));
    app.add_option("--period-us", period_us, "wakeup period")->check(CLI::Range(50, 1000000));
    app.add_option("--fifo", fifo, "SCHED_FIFO priority of the thread, 0: SCHED_OTHER")
        ->check(CLI::Range(0, 99));
    app.add_flag("--load", load, "a busy SCHED_OTHER process on the same CPU");
    app.add_option("--runqlat", runqlat, "path of libbpf-tools runqlat");
    CLI11_PARSE(app, argc, argv);

    const auto pre = qrt_bpf::preflight(rtcore::host_fs::system());
    if (!pre.available()) {
        std::cerr << "runqlat-crosscheck: probes " << pre.to_string() << "\n";
        return 2;
    }
    if (::access(runqlat.c_str(), X_OK) != 0) {
        std::cerr << "runqlat-crosscheck: " << runqlat << " not executable (apt install libbpf-tools)\n";
        return 2;
    }
    qrt_bench::steal_meter steal;

    // The woken thread: a one-thread child process, so runqlat -p selects it.
    int go[2];
    if (::pipe(go) != 0) {
        std::perror("pipe");
        return 2;
    }
    const pid_t child = ::fork();
    if (child == 0) {
        ::close(go[1]);
        qrt_bench::pin_to(cpu);
        if (fifo > 0 && !qrt_bench::set_fifo(fifo)) {
            ::_exit(3);
        }
        char c = 0;
        if (::read(go[0], &c, 1) != 1) {
            ::_exit(4);
        }
        qrt_bench::periodic_loop(loops, static_cast<std::int64_t>(period_us) * 1000);
        ::_exit(0);
    }
    ::close(go[0]);

    pid_t hog = -1;
    if (load) {
        hog = ::fork();
        if (hog == 0) {
            qrt_bench::pin_to(cpu);
            const auto end = std::chrono::steady_clock::now() +
                             std::chrono::microseconds(static_cast<std::int64_t>(loops) * period_us) +
                             std::chrono::seconds(5);
            while (std::chrono::steady_clock::now() < end) {
            }
            ::_exit(0);
        }
    }

    // runqlat -p <child> <interval> 1: one histogram after the interval.
    const int interval_s =
        static_cast<int>(std::ceil(static_cast<double>(loops) * period_us / 1e6)) + 3;
    int out[2];
    if (::pipe(out) != 0) {
        std::perror("pipe");
        return 2;
    }
    const pid_t rq = ::fork();
    if (rq == 0) {
        ::dup2(out[1], 1);
        ::close(out[0]);
        ::close(out[1]);
        const std::string pid_s = std::to_string(child);
        const std::string interval = std::to_string(interval_s);
        // Line-buffered, so "Tracing" arrives when runqlat is attached
        // rather than at its exit (stdout is a pipe).
        ::execl("/usr/bin/stdbuf", "stdbuf", "-oL", runqlat.c_str(), "-p", pid_s.c_str(),
                interval.c_str(), "1", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    ::close(out[1]);
    std::string rq_text = read_until(out[0], "Tracing", 15000);
    if (rq_text.find("Tracing") == std::string::npos) {
        std::cerr << "runqlat-crosscheck: runqlat did not start: " << rq_text << "\n";
        ::kill(child, SIGKILL);
        ::kill(rq, SIGKILL);
        if (hog > 0) {
            ::kill(hog, SIGKILL);
        }
        return 2;
    }

    auto probe = qrt_bpf::wakeup_probe::load({});
    if (!probe) {
        std::cerr << "runqlat-crosscheck: " << probe.err().message << "\n";
        ::kill(child, SIGKILL);
        ::kill(rq, SIGKILL);
        return 2;
    }
    if (auto st = probe->add_tid(child); !st) {
        std::cerr << "runqlat-crosscheck: " << st.err().message << "\n";
        return 2;
    }
    auto base = probe->read();

    // Go, and wait for the loop to finish.
    if (::write(go[1], "g", 1) != 1) {
        std::perror("write");
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    auto after = probe->read();
    if (hog > 0) {
        ::kill(hog, SIGKILL);
        ::waitpid(hog, nullptr, 0);
    }
    rq_text += read_all(out[0]);
    ::waitpid(rq, nullptr, 0);
    if (!base || !after || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::cerr << "runqlat-crosscheck: woken child failed (status " << status << ")\n";
        return 2;
    }
    const qrt_bpf::wakeup_histogram ours = after->since(*base);

    log2_hist theirs{};
    double theirs_count = 0;
    const std::regex row(R"(^\s*(\d+)\s*->\s*(\d+)\s*:\s*(\d+))");
    std::istringstream lines(rq_text);
    for (std::string line; std::getline(lines, line);) {
        std::smatch m;
        if (std::regex_search(line, m, row)) {
            const auto lo = std::stoull(m[1]);
            const double n = std::stod(m[3]);
            theirs[static_cast<std::size_t>(slot_of_us(lo))] += n;
            theirs_count += n;
        }
    }
    const log2_hist ours_log2 = rebin(ours);
    const double ours_med_log2 = log2_median_us(ours_log2);
    const double theirs_med_log2 = log2_median_us(theirs);
    const double ratio = theirs_med_log2 > 0 ? ours_med_log2 / theirs_med_log2 : 0;
    const double count_ratio = theirs_count > 0 ? static_cast<double>(ours.count) / theirs_count : 0;
    const double steal_pct = steal.percent();

    std::printf("runqlat-crosscheck: cpu %u, %d wakeups every %d us, %s%s\n", cpu, loops, period_us,
                fifo > 0 ? ("SCHED_FIFO " + std::to_string(fifo)).c_str() : "SCHED_OTHER",
                load ? ", busy process on the same CPU" : "");
    std::printf("%-16s %5s %12s %12s\n", "usecs", "slot", "qrt probe 1", "runqlat");
    for (int s = 0; s < slots; ++s) {
        const auto i = static_cast<std::size_t>(s);
        if (ours_log2[i] == 0 && theirs[i] == 0) {
            continue;
        }
        const std::string range = s == 0 ? "0 -> 1"
                                         : std::to_string(1ULL << s) + " -> " +
                                               std::to_string((1ULL << (s + 1)) - 1);
        std::printf("%-16s %5d %12.0f %12.0f\n", range.c_str(), s, ours_log2[i], theirs[i]);
    }
    std::printf("samples:            qrt %llu, runqlat %.0f (ratio %.3f)\n",
                static_cast<unsigned long long>(ours.count), theirs_count, count_ratio);
    std::printf("median (log2 us):   qrt %.2f us, runqlat %.2f us, ratio %.3f (goal 0.75..1.25)\n",
                ours_med_log2, theirs_med_log2, ratio);
    std::printf("qrt fine buckets:   p50 %.0f ns, p99 %.0f ns, max %llu ns\n", ours.quantile_ns(0.5),
                ours.quantile_ns(0.99), static_cast<unsigned long long>(ours.max_ns));
    std::printf("note: this is a VM with hypervisor steal (%.2f%% during the run); figures are noisy\n",
                steal_pct);
    qrt_bench::json_line j;
    j.str("bench", "runqlat-crosscheck")
        .num("cpu", cpu)
        .num("loops", loops)
        .num("period_us", period_us)
        .num("fifo_prio", fifo)
        .boolean("load", load)
        .num("qrt_samples", static_cast<double>(ours.count))
        .num("runqlat_samples", theirs_count)
        .num("sample_ratio", count_ratio)
        .num("qrt_median_log2_us", ours_med_log2)
        .num("runqlat_median_log2_us", theirs_med_log2)
        .num("median_ratio", ratio)
        .boolean("medians_within_25pct", ratio >= 0.75 && ratio <= 1.25)
        .num("qrt_p50_ns", ours.quantile_ns(0.5))
        .num("qrt_p99_ns", ours.quantile_ns(0.99))
        .num("steal_pct", steal_pct);
    std::printf("%s\n", j.render().c_str());
    return 0;
}
