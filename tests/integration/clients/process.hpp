#pragma once
// Child processes for the client integration tests: run a command to
// completion with captured output (bounded by a timeout), or keep a server
// running until the test ends.  Every child is ended by its pid.

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace qrt::testing {

struct ran {
    int exit_code = -1;  // -1: killed (timeout or signal)
    std::string out;
    std::string err;
};

struct run_options {
    std::vector<std::string> env;  // extra NAME=value
    std::string stdin_text;
    std::optional<uid_t> as_uid;   // setuid before exec (needs root)
    std::optional<gid_t> as_gid;
    std::chrono::milliseconds timeout{20000};
};

namespace detail {

inline std::vector<char*> c_argv(std::vector<std::string>& v) {
    std::vector<char*> out;
    for (auto& s : v) {
        out.push_back(s.data());
    }
    out.push_back(nullptr);
    return out;
}

inline void child_exec(std::vector<std::string> argv, const run_options& o) {
    for (const auto& e : o.env) {
        ::putenv(const_cast<char*>(e.c_str()));
    }
    if (o.as_gid && ::setgid(*o.as_gid) != 0) {
        ::_exit(126);
    }
    if (o.as_gid && ::setgroups(0, nullptr) != 0) {
        ::_exit(126);
    }
    if (o.as_uid && ::setuid(*o.as_uid) != 0) {
        ::_exit(126);
    }
    auto args = c_argv(argv);
    ::execv(args[0], args.data());
    ::_exit(127);
}

}  // namespace detail

// Runs argv[0] (a path) to completion.
inline ran run(std::vector<std::string> argv, const run_options& o = {}) {
    int in[2];
    int out[2];
    int err[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 ||
        ::pipe2(err, O_CLOEXEC) != 0) {
        throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
        throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    }
    if (pid == 0) {
        ::dup2(in[0], 0);
        ::dup2(out[1], 1);
        ::dup2(err[1], 2);
        detail::child_exec(std::move(argv), o);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    // Small inputs only: written at once, then closed (EOF for the child).
    if (!o.stdin_text.empty()) {
        [[maybe_unused]] const auto n = ::write(in[1], o.stdin_text.data(), o.stdin_text.size());
    }
    ::close(in[1]);
    ran r;
    const auto deadline = std::chrono::steady_clock::now() + o.timeout;
    pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    int open_fds = 2;
    bool killed = false;
    while (open_fds > 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            ::kill(pid, SIGKILL);
            killed = true;
            break;
        }
        if (::poll(fds, 2, static_cast<int>(left.count())) < 0 && errno != EINTR) {
            break;
        }
        for (int i = 0; i < 2; ++i) {
            if (fds[i].fd < 0 || fds[i].revents == 0) {
                continue;
            }
            char buf[65536];
            const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
            if (n > 0) {
                (i == 0 ? r.out : r.err).append(buf, static_cast<std::size_t>(n));
            } else {
                ::close(fds[i].fd);
                fds[i].fd = -1;
                --open_fds;
            }
        }
    }
    for (auto& f : fds) {
        if (f.fd >= 0) {
            ::close(f.fd);
        }
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    r.exit_code = !killed && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

// A long-running child whose first stdout line is awaited; SIGTERM (then
// SIGKILL) by pid on destruction.
class background {
public:
    background(std::vector<std::string> argv, std::string_view ready_prefix,
               std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
               const run_options& o = {}) {
        int out[2];
        if (::pipe2(out, O_CLOEXEC) != 0) {
            throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
        }
        _pid = ::fork();
        if (_pid < 0) {
            throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
        }
        if (_pid == 0) {
            ::dup2(out[1], 1);
            detail::child_exec(std::move(argv), o);
        }
        ::close(out[1]);
        _out = out[0];
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (_first_line.find('\n') == std::string::npos) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            pollfd p{_out, POLLIN, 0};
            if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
                stop();
                throw std::runtime_error("child did not print its ready line in time");
            }
            char buf[512];
            const ssize_t n = ::read(_out, buf, sizeof(buf));
            if (n <= 0) {
                stop();
                throw std::runtime_error("child exited before its ready line");
            }
            _first_line.append(buf, static_cast<std::size_t>(n));
        }
        if (_first_line.rfind(ready_prefix, 0) != 0) {
            stop();
            throw std::runtime_error("unexpected first line: " + _first_line);
        }
    }
    ~background() { stop(); }
    background(const background&) = delete;
    background& operator=(const background&) = delete;

    pid_t pid() const noexcept { return _pid; }
    // Everything the child printed so far (the ready line included).
    const std::string& output() const noexcept { return _first_line; }

    // Read stdout to EOF and reap the child (killed after timeout).
    // Returns its exit status (-1 when killed).
    int finish(std::chrono::milliseconds timeout) {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (_out >= 0) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            pollfd p{_out, POLLIN, 0};
            if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
                break;
            }
            char buf[4096];
            const ssize_t n = ::read(_out, buf, sizeof(buf));
            if (n <= 0) {
                break;
            }
            _first_line.append(buf, static_cast<std::size_t>(n));
        }
        int st = 0;
        if (_pid > 0 && ::waitpid(_pid, &st, WNOHANG) == 0) {
            const auto left = deadline - std::chrono::steady_clock::now();
            for (auto waited = std::chrono::nanoseconds(0); waited < left;
                 waited += std::chrono::milliseconds(10)) {
                if (::waitpid(_pid, &st, WNOHANG) == _pid) {
                    _status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
                    _pid = -1;
                    break;
                }
                ::usleep(10000);
            }
        } else if (_pid > 0) {
            _status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            _pid = -1;
        }
        return stop();
    }

    // SIGTERM, wait up to 5 s, then SIGKILL.  Returns the exit status (-1
    // when killed by a signal).
    int stop() {
        if (_pid <= 0) {
            return _status;
        }
        ::kill(_pid, SIGTERM);
        int st = 0;
        for (int i = 0; i < 500; ++i) {
            if (::waitpid(_pid, &st, WNOHANG) == _pid) {
                _status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
                _pid = -1;
                break;
            }
            ::usleep(10000);
        }
        if (_pid > 0) {
            ::kill(_pid, SIGKILL);
            ::waitpid(_pid, &st, 0);
            _pid = -1;
        }
        if (_out >= 0) {
            ::close(_out);
            _out = -1;
        }
        return _status;
    }

private:
    pid_t _pid = -1;
    int _out = -1;
    int _status = -1;
    std::string _first_line;
};

}  // namespace qrt::testing
