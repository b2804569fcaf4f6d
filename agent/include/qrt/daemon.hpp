#pragma once
// `qrtd run`: the daemon's startup order, main loop and shutdown.
//
//   qrt::run_options opts;
//   opts.config_path = "/etc/qrtd/qrtd.toml";
//   qrt::daemon d(std::move(opts));
//   return static_cast<int>(d.run());   // only main exits
//
// The order of the steps, and why each sits where it does, is written out
// once in daemon::run() (agent/src/daemon/daemon.cpp).

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include "qrt/config.hpp"
#include "qrt/host_cmd.hpp"

namespace qrt {

struct run_options {
    std::filesystem::path config_path = QRT_DEFAULT_CONFIG_PATH;
    std::filesystem::path root = "/";                      // host_fs root (--root)
    std::optional<std::filesystem::path> state_dir;        // overrides agent.state_dir
    std::optional<std::filesystem::path> journal_dir;      // overrides host.journal_dir
    std::optional<log_level> level;                        // overrides agent.log_level
    std::string topology;                                  // see host_context::topology
    std::optional<std::chrono::seconds> duration;          // --duration-s: stop by itself
};

class daemon {
public:
    explicit daemon(run_options opts);
    ~daemon();
    daemon(const daemon&) = delete;
    daemon& operator=(const daemon&) = delete;

    // Runs until SIGTERM/SIGINT (or the duration), then shuts down, restoring
    // what it applied.  exit_code::usage for a bad config (nothing changed),
    // exit_code::failure for a runtime failure.
    exit_code run();

    struct impl;

private:
    run_options _opts;
};

}  // namespace qrt
