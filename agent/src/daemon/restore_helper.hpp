#pragma once
// The root restore helper of `qrtd run` (`qrtd-restore`): the privileged
// process that runs beside the unprivileged daemon and puts the host back.
// daemon.cpp's step 5 starts it (take_partition); daemon::run() owns it.

#include <sys/types.h>

#include <filesystem>
#include <vector>

#include "rtcore/error.hpp"
#include "rtcore/host_partition.hpp"
#include "rtcore/restore_journal.hpp"
#include "rtcore/unique_fd.hpp"

namespace qrt {

// What the restore helper needs, copied before the fork.
struct helper_settings {
    std::filesystem::path root;
    std::filesystem::path state_dir;
    rtcore::host_partition::apply_options opts;
    unsigned verify_interval_s = 0;  // re-pin drifted IRQs this often (0: never)
};

// The host partition this process owns, and the root helper that restores
// it.
//
// Restoring needs root (rmdir of a cgroup v1 cpuset needs CAP_SYS_ADMIN, and
// the journal directory is root's), and `qrtd run` drops to agent.user, so
// right after the apply, while still root and single-threaded, the daemon
// forks a helper that keeps root and does nothing but wait on a pipe: it
// inherits the journal directory and its lock (so no other qrtd changes the
// host until it is done, and a command that wants the lock waits for it),
// and the daemon closes its own copies.  Every irq_verify_interval_s it
// re-pins IRQs that drifted.  When the pipe closes -- restore() at shutdown,
// an early return, or the daemon dying by SIGKILL -- it restores from the
// journal, leaves a report of what it restored in the journal directory,
// removes the partition summary, and exits 0 when everything was put back.
// It reads nothing the daemon's user can write.  It inherits the blocked
// signals (a terminal's Ctrl-C does not kill it before it has restored), and
// a daemon running as agent.user cannot signal or trace it.
class owned_partition {
public:
    ~owned_partition();
    owned_partition() = default;
    owned_partition(const owned_partition&) = delete;
    owned_partition& operator=(const owned_partition&) = delete;

    // Call right after a successful apply, before dropping privileges.
    // dir is released here (the helper keeps it); close_in_child are fds
    // the helper must not keep (the state directory's lock).
    rtcore::status start_helper(rtcore::journal_dir& dir, helper_settings hs, std::vector<int> close_in_child);
    bool running() const { return _pid > 0; }

    // Tells the helper to restore and waits for it.  true when everything
    // was put back.
    bool restore();

private:
    // The helper: wait for EOF on the pipe (re-pinning drifted IRQs on the
    // way), restore, report, exit.  Never returns to the daemon's code (the
    // caller _exit()s with the result).
    static int helper_main(int pipe_fd, rtcore::journal_dir& dir, const helper_settings& hs, pid_t parent);

    pid_t _pid = -1;
    rtcore::unique_fd _pipe;
};

}  // namespace qrt
