#pragma once
// Runs a function in a forked child with a reduced capability set, and
// returns its exit code and what it wrote, so that capability tests never
// change the test process itself.

#include <sys/capability.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

namespace qrt_bpf_test {

struct child_result {
    int exit_code = -1;  // -1: did not exit normally
    std::string output;
};

// Keeps exactly `keep` in the effective and permitted sets (inheritable
// cleared).  Returns false when cap_set_proc fails.
inline bool drop_caps_except(std::initializer_list<cap_value_t> keep) {
    cap_t caps = cap_init();
    if (caps == nullptr) {
        return false;
    }
    std::vector<cap_value_t> list(keep);
    bool ok = true;
    if (!list.empty()) {
        ok = cap_set_flag(caps, CAP_EFFECTIVE, static_cast<int>(list.size()), list.data(), CAP_SET) == 0 &&
             cap_set_flag(caps, CAP_PERMITTED, static_cast<int>(list.size()), list.data(), CAP_SET) == 0;
    }
    ok = ok && cap_set_proc(caps) == 0;
    cap_free(caps);
    return ok;
}

// fn(out) runs in the child; its return value is the exit code.
inline child_result run_in_child(const std::function<int(std::string& out)>& fn) {
    int fds[2];
    if (::pipe(fds) != 0) {
        return {};
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(fds[0]);
        ::close(fds[1]);
        return {};
    }
    if (pid == 0) {
        ::close(fds[0]);
        std::string out;
        int code = 99;
        try {
            code = fn(out);
        } catch (...) {
            out += "exception";
        }
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
        ::_exit(code);
    }
    ::close(fds[1]);
    child_result r;
    char buf[4096];
    for (;;) {
        const ssize_t n = ::read(fds[0], buf, sizeof(buf));
        if (n <= 0) {
            break;
        }
        r.output.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fds[0]);
    int status = 0;
    if (::waitpid(pid, &status, 0) == pid && WIFEXITED(status)) {
        r.exit_code = WEXITSTATUS(status);
    }
    return r;
}

}  // namespace qrt_bpf_test
