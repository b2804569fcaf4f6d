#pragma once
// `qrtd host plan|apply|restore|verify` and the pieces `qrtd run` shares with
// them: reading the host's online CPUs, loading the topology, turning the
// config into a partition plan and apply options.
//
// Commands write their result (text or JSON) to `out` and log problems; they
// return an exit_code and never exit.  Everything reaches the host through
// rtcore::host_fs rooted at host_context::root, so they run unchanged on fake
// trees (--root) and, with dry_run, only list the writes they would make.

#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>

#include "qrt/config.hpp"
#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/host_partition.hpp"
#include "rtcore/partition_plan.hpp"
#include "rtcore/topology.hpp"

namespace qrt {

// The documented exit codes of qrtd.
enum class exit_code : int {
    ok = 0,        // done; for verify: nothing drifted
    failure = 1,   // a runtime failure (the host refused a change, restore incomplete, drift)
    usage = 2,     // bad command line or configuration; nothing was changed
};

struct host_context {
    std::filesystem::path root = "/";   // host_fs root (--root)
    std::filesystem::path state_dir;    // restore journal directory
    bool dry_run = false;
    bool json = false;
    // host plan: print the Slurm configuration lines (slurm_plan.hpp).
    bool slurm = false;
    // "" picks: the running host when root is "/", else a flat topology of
    // the tree's online CPUs.  Or "system", "synthetic:<hwloc description>",
    // "xml:<path>".
    std::string topology;
};

// /sys/devices/system/cpu/online under fs, or nullopt when unreadable.
std::optional<rtcore::cpu_set> read_online_cpus(const rtcore::host_fs& fs);

// The topology named by ctx.topology (see above).  `note` receives a
// sentence when an assumption was made.
rtcore::result<rtcore::topology> load_topology(const host_context& ctx, const rtcore::host_fs& fs,
                                               std::string* note = nullptr);

// The plan the config asks for on this topology.
rtcore::result<rtcore::partition_plan> plan_for(const config& cfg, const rtcore::topology& topo);
rtcore::host_partition::apply_options apply_options_for(const config& cfg);

// ok when state_dir is a directory; otherwise an error saying how to get one.
rtcore::status check_state_dir(const std::filesystem::path& state_dir);

// Exclusive lock on <state_dir>/qrtd.lock, so one qrtd at a time changes
// the host.  Released when the object dies (or the process does).
class state_dir_lock {
public:
    static rtcore::result<state_dir_lock> acquire(const std::filesystem::path& state_dir);
    state_dir_lock(state_dir_lock&& o) noexcept : _fd(o._fd) { o._fd = -1; }
    state_dir_lock& operator=(state_dir_lock&& o) noexcept;
    state_dir_lock(const state_dir_lock&) = delete;
    state_dir_lock& operator=(const state_dir_lock&) = delete;
    ~state_dir_lock();

private:
    explicit state_dir_lock(int fd) : _fd(fd) {}
    int _fd = -1;
};

// The commands.  cfg is validated.  `out` gets the report (JSON with ctx.json).
exit_code host_plan(const config& cfg, const host_context& ctx, std::ostream& out);
exit_code host_apply(const config& cfg, const host_context& ctx, std::ostream& out);
exit_code host_verify(const config& cfg, const host_context& ctx, std::ostream& out);
// restore needs no config: it must work even when the config file is broken.
exit_code host_restore(const host_context& ctx, std::ostream& out);

}  // namespace qrt
