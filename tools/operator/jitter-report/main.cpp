// qrt-jitter-report: the command line lives in run_cli (tested in-process);
// main only routes SIGINT/SIGTERM to an early, still reported, end of a run.
#include <signal.h>

#include <atomic>
#include <iostream>

#include "jitter_report/cli.hpp"

namespace {
std::atomic<bool> stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_signal(int) { stop_requested.store(true); }
}  // namespace

int main(int argc, char** argv) {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    return qrt::jitter::run_cli(argc, argv, std::cout, std::cerr, &stop_requested);
}
