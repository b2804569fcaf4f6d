// The root restore helper (see restore_helper.hpp): started by `qrtd run`
// while still root and single-threaded; waits on a pipe, re-pins drifted
// IRQs, and restores the host when the pipe closes.

#include "restore_helper.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "qrt/host_cmd.hpp"
#include "qrt/log.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/task_ops.hpp"

namespace qrt {

using rtcore::unique_fd;

owned_partition::~owned_partition() {
    if (_pid > 0) {
        (void)restore();
    }
}

rtcore::status owned_partition::start_helper(rtcore::journal_dir& dir, helper_settings hs,
                                             std::vector<int> close_in_child) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "pipe2");
    }
    unique_fd read_end(fds[0]);
    unique_fd write_end(fds[1]);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, "fork (restore helper)");
    }
    if (pid == 0) {
        // The child leaves by _exit, so no destructor runs: it closes the
        // parent's end now, and by hand its copies of what it must not keep.
        write_end.reset();
        for (int fd : close_in_child) {
            ::close(fd);  // bare close: the child's copy of an fd its owner in the parent keeps
        }
        ::_exit(helper_main(fds[0], dir, hs, parent));
    }
    read_end.reset();
    _pid = pid;
    _pipe = std::move(write_end);
    dir.release_lock();  // the helper holds it now
    log::debug("host", "restore helper is pid {}", pid);
    return rtcore::ok();
}

bool owned_partition::restore() {
    if (_pid <= 0) {
        return true;
    }
    _pipe.reset();
    int wstatus = 0;
    pid_t r = -1;
    do {
        r = ::waitpid(_pid, &wstatus, 0);
    } while (r < 0 && errno == EINTR);
    const int err = errno;
    const pid_t pid = std::exchange(_pid, -1);
    if (r < 0) {
        log::error("host", "waitpid {} (restore helper): {}; run `qrtd host restore`", pid, std::strerror(err));
        return false;
    }
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
        log::error("host", "restore helper {} {} {}; run `qrtd host restore`", pid,
                   WIFEXITED(wstatus) ? "exited with" : "killed by signal",
                   WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : WTERMSIG(wstatus));
        return false;
    }
    return true;
}

int owned_partition::helper_main(int pipe_fd, rtcore::journal_dir& dir, const helper_settings& hs, pid_t parent) {
    ::prctl(PR_SET_NAME, "qrtd-restore", 0, 0, 0);
    const std::string who =
        fmt::format("qrtd-restore (pid {}), the restore helper of qrtd run pid {}", ::getpid(), parent);
    if (const auto* l = dir.lock()) {
        l->set_holder(fmt::format("pid {}: {}", ::getpid(), who));
    }
    rtcore::host_fs fs(hs.root);
    rtcore::real_task_ops tasks;
    const int timeout_ms = hs.verify_interval_s > 0 ? static_cast<int>(hs.verify_interval_s) * 1000 : -1;
    for (;;) {
        pollfd p{pipe_fd, POLLIN, 0};
        const int n = ::poll(&p, 1, timeout_ms);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n == 0) {
            // The IRQ drift watch: root's, like the journal it writes.
            static log::rate_limiter rl{std::chrono::minutes(1)};
            auto rep = rtcore::host_partition::verify(fs, tasks, dir, hs.opts);
            if (!rep) {
                log::warn_rl(rl, "irq", "verify: {}", rep.err().message);
            } else if (!rep->clean) {
                for (const auto& l : rep->irqs.lines) {
                    log::warn("irq", "verify: {}", l);
                }
                for (const auto& k : rep->knobs.knobs) {
                    if (k.act == rtcore::knob_outcome::action::reset ||
                        k.act == rtcore::knob_outcome::action::set) {
                        log::warn("knob", "verify: {}", k.line().substr(6));
                    }
                }
                if (rep->knobs.kthreads.moved > 0) {
                    log::warn("knob", "verify: {} kernel threads had reached the isolated CPUs: moved off",
                              rep->knobs.kthreads.moved);
                }
            }
            continue;
        }
        char buf[64];
        const ssize_t r = ::read(pipe_fd, buf, sizeof buf);
        if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
            break;
        }
    }
    rtcore::host_partition::restore_options ro;
    ro.cgroup_prefix = hs.opts.isolation.cgroup_prefix;
    auto rep = rtcore::host_partition::restore(fs, tasks, &dir, ro);
    if (!rep) {
        log::error("host", "restore failed: {}; run `qrtd host restore`", rep.err().message);
        return 1;
    }
    write_restore_report(dir, who, rtcore::current_boot_id(fs), *rep);
    for (const auto& l : rep->lines) {
        log::debug("host", "{}", l);
    }
    for (const auto& p : rep->problems) {
        log::error("host", "{}", p);
    }
    if (!rep->complete) {
        log::error("host", "restore incomplete ({} failed); the journal in {} is kept: run `qrtd host restore`",
                   rep->count(rtcore::restore_item::outcome::failed), dir.path().string());
        return 1;
    }
    remove_partition_summary(hs.state_dir);
    log::info("host", "restored: {}", rep->summary());
    return 0;
}

}  // namespace qrt
