#pragma once
// The whole command line of qrt-jitter-report as a function, so tests run it
// in-process.  Exit codes: 0 report made (SLO met or none given), 1 SLO
// violated, 2 error (bad option, agent missing or stale, bad baseline,
// unknown CPU, unwritable output).

#include <atomic>
#include <iosfwd>

namespace qrt::jitter {

inline constexpr int exit_ok = 0;
inline constexpr int exit_slo_violated = 1;
inline constexpr int exit_error = 2;

// stop: set (from a signal handler) to end a standalone run early.
int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
            const std::atomic<bool>* stop = nullptr);

}  // namespace qrt::jitter
