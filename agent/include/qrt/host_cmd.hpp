#pragma once
// `qrtd host plan|apply|restore|verify` and the pieces `qrtd run` shares with
// them: reading the host's online CPUs, loading the topology, turning the
// config into a partition plan and apply options, opening the root-owned
// journal directory with its lock, and the partition summary root leaves for
// the unprivileged daemon.
//
// Commands write their result (text or JSON) to `out` and log problems; they
// return an exit_code and never exit.  Everything reaches the host through
// rtcore::host_fs rooted at host_context::root, so they run unchanged on fake
// trees (--root) and, with dry_run, only list the writes they would make.
//
// The root boundary (qrtd(8), THE ROOT BOUNDARY): what a root helper reads or
// replays lives in host_context::journal_dir (root:root 0700), opened and
// checked by rtcore::journal_dir.  Root writes one file into the daemon's
// state directory, the partition summary, and never reads it back.

#include <chrono>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qrt/config.hpp"
#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/host_partition.hpp"
#include "rtcore/memory_lock.hpp"
#include "rtcore/partition_plan.hpp"
#include "rtcore/restore_journal.hpp"
#include "rtcore/secure_dir.hpp"
#include "rtcore/topology.hpp"

namespace qrt {

// The documented exit codes of qrtd.
enum class exit_code : int {
    ok = 0,        // done; for verify: nothing drifted
    failure = 1,   // a runtime failure (the host refused a change, restore incomplete, drift)
    usage = 2,     // bad command line or configuration; nothing was changed
    not_realtime = 3,  // run: dispatch.require_rt and a dispatch thread cannot be SCHED_FIFO on its isolated CPU
};

struct host_context {
    std::filesystem::path root = "/";   // host_fs root (--root)
    std::filesystem::path state_dir;    // the daemon's state (partition summary goes there)
    std::filesystem::path journal_dir;  // root-owned: journal, host lock, restore report
    std::chrono::seconds lock_wait{30}; // host.lock_wait_s
    bool dry_run = false;
    bool json = false;
    // host plan: print the Slurm configuration lines (slurm_plan.hpp).
    bool slurm = false;
    // host verify --repin (qrtd-repin.service): drift that was put back is
    // success, and so is no partition applied; only drift left fails.
    bool repin = false;
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
// fs given: the caller's own v2 cgroup (/proc/self/cgroup under fs) is
// named as the place the dispatch threads start from (isolation_options::
// rt_cgroup); they are to be placed when dispatch.mode = "tuned" and there
// is a [[qpu]].
rtcore::host_partition::apply_options apply_options_for(const config& cfg, const rtcore::host_fs* fs = nullptr);

// The daemon's dispatch threads as the affinity fence leaves them on their
// CPUs (rtcore::rt_exemption): named "qrt-dispatch", each alone on the CPU
// this plan gives its QPU ([[qpu]].dispatch_cpu, else the plan's RT CPU),
// in a process of agent.user's uid.  Nothing is exempt in untuned mode or
// without a [[qpu]], or when agent.user has no passwd entry.
rtcore::rt_exemption own_dispatch_threads(const config& cfg, const rtcore::partition_plan& plan);

// What `qrtd run` would say at start, in this process, about locking the
// dispatch frame pools (RLIMIT_MEMLOCK, CAP_IPC_LOCK: see
// dispatch::frame_pool_shortfall), or "" when they fit or there is no QPU:
// tuned mode would refuse to start, untuned write from unregistered
// buffers.  `qrtd check-config` and `qrtd host plan` print it.
std::string frame_pool_memlock_note(const config& cfg, const rtcore::memlock_allowance& allowance);

// dispatch.require_rt decided: "auto" is "always" when systemd started this
// process as a service ($INVOCATION_ID set).  why: the sentence for the log.
bool require_rt_for(const config& cfg, std::string* why = nullptr);

// cgroup v1: hands the isolated cpuset's tasks file to agent.user (when it
// is not root and exists), so its dispatch threads can join it; a line per
// action goes to lines.  Never fatal: without it the daemon's
// dispatch.require_rt names the cause.
void delegate_to_agent_user(const config& cfg, rtcore::host_fs& fs, const rtcore::isolation_report& rep,
                            std::vector<std::string>& lines);

// The journal directory for a command that changes the host: checked,
// created when missing (create), and locked, waiting up to ctx.lock_wait
// with progress on stderr.  holder names this process for waiters ("qrtd
// host apply"; the pid is added).  Errors carry the fix.
rtcore::result<rtcore::journal_dir> open_journal_dir(const host_context& ctx, const std::string& holder,
                                                     bool create);
// For a dry run: the directory checked but not locked, or nullopt when it
// does not exist yet.
rtcore::result<std::optional<rtcore::journal_dir>> open_journal_dir_read_only(const host_context& ctx);

// The daemon's state directory, checked (no symlink in its path, writable by
// this process), and its single-instance lock (<state_dir>/qrtd.lock, never
// waited for): rtcore::open_locked_dir with the daemon's remedies.
using state_dir_lock = rtcore::locked_dir;
rtcore::result<state_dir_lock> lock_state_dir(const std::filesystem::path& state_dir);

// ---- what root leaves for the daemon --------------------------------------

// <state_dir>/host-partition.json: written by root (0644, replaced
// atomically, never through a symlink) after apply, removed after restore;
// the unprivileged daemon reads it for agent.status.  Root never reads it.
inline constexpr const char* partition_summary_name = "host-partition.json";
nlohmann::json partition_summary(const rtcore::host_partition::apply_report& rep, const std::string& boot_id,
                                 const std::string& applied_by);
// Best effort: a missing state directory is a note, not an error.
void write_partition_summary(const std::filesystem::path& state_dir, const nlohmann::json& summary);
void remove_partition_summary(const std::filesystem::path& state_dir);
// The summary, when there is one for this boot (boot_id matches).
std::optional<nlohmann::json> read_partition_summary(const std::filesystem::path& state_dir,
                                                     const std::string& boot_id);

// The restore report root keeps in the journal directory (who restored
// what, when), written after every restore that found a journal.
void write_restore_report(const rtcore::journal_dir& dir, const std::string& who, const std::string& boot_id,
                          const rtcore::host_partition::restore_report& rep);
// Its first lines, for "nothing to restore: the last restore was ...".
std::vector<std::string> last_restore_lines(const rtcore::journal_dir& dir);

// The commands.  cfg is validated.  `out` gets the report (JSON with ctx.json).
exit_code host_plan(const config& cfg, const host_context& ctx, std::ostream& out);
exit_code host_apply(const config& cfg, const host_context& ctx, std::ostream& out);
exit_code host_verify(const config& cfg, const host_context& ctx, std::ostream& out);
// restore needs no config: it must work even when the config file is broken.
exit_code host_restore(const host_context& ctx, std::ostream& out);

}  // namespace qrt
