#pragma once
// Runs a function in a forked child so tests can change process-wide state
// (capabilities, no_new_privs, scheduling) without touching the test runner.
// The child's returned string comes back through a pipe.

#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>

namespace rtcore_test {

struct child_result {
    int exit_code = -1;
    std::string output;
};

inline child_result run_in_child(const std::function<std::string()>& fn) {
    int fds[2];
    if (::pipe(fds) != 0) {
        return {-1, "pipe failed"};
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
        return {-1, "fork failed"};
    }
    if (pid == 0) {
        ::close(fds[0]);
        std::string out = fn();
        const char* p = out.data();
        std::size_t left = out.size();
        while (left > 0) {
            const ssize_t n = ::write(fds[1], p, left);
            if (n <= 0) {
                break;
            }
            p += n;
            left -= static_cast<std::size_t>(n);
        }
        ::_exit(0);
    }
    ::close(fds[1]);
    child_result r;
    char buf[4096];
    ssize_t n = 0;
    while ((n = ::read(fds[0], buf, sizeof buf)) > 0) {
        r.output.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fds[0]);
    int wstatus = 0;
    ::waitpid(pid, &wstatus, 0);
    r.exit_code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
    return r;
}

}  // namespace rtcore_test
