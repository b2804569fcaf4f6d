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
#include <vector>

#include "qrt/config.hpp"
#include "qrt/host_cmd.hpp"

namespace qrt {

// What `qrtd check-config` checks on this host beyond the file itself: each
// file:// endpoint must be a character device or a FIFO.  One of another
// type (a regular file, a directory, a socket) is an error naming the QPU,
// the path, its type and what is accepted; a missing one only a warning (a
// device may appear later, and the file may be checked on another host;
// `qrtd run` keeps retrying it with the same message).  Paths are looked up
// under root (--root).
struct host_config_check {
    std::vector<config_diagnostic> errors;
    std::vector<std::string> warnings;
};
host_config_check check_config_on_host(const config& cfg, const std::string& file,
                                       const std::filesystem::path& root);

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
