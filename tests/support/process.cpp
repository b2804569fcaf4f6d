#include "qrt_test/process.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>

namespace qrt::testing {

namespace {

std::runtime_error sys_error(const char* call) {
    const int err = errno;
    return std::runtime_error(std::string(call) + ": " + std::strerror(err));
}

std::vector<char*> c_argv(std::vector<std::string>& v) {
    std::vector<char*> out;
    for (auto& s : v) {
        out.push_back(s.data());
    }
    out.push_back(nullptr);
    return out;
}

void put_env(const run_options& o) {
    for (const auto& e : o.env) {
        ::putenv(const_cast<char*>(e.c_str()));
    }
}

[[noreturn]] void child_exec(std::vector<std::string> argv, const run_options& o) {
    put_env(o);
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

void write_all(int fd, std::string_view bytes) {
    while (!bytes.empty()) {
        const ssize_t n = ::write(fd, bytes.data(), bytes.size());
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return;
        }
        bytes.remove_prefix(static_cast<std::size_t>(n));
    }
}

// The three pipes of a child: stdin (written at once, then closed: small
// inputs only), stdout and stderr.
struct pipes {
    int in[2] = {-1, -1};
    int out[2] = {-1, -1};
    int err[2] = {-1, -1};

    pipes() {
        if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 ||
            ::pipe2(err, O_CLOEXEC) != 0) {
            throw sys_error("pipe2");
        }
    }
    // In the child: the pipes become fds 0, 1 and 2.
    void become_stdio() const {
        ::dup2(in[0], STDIN_FILENO);
        ::dup2(out[1], STDOUT_FILENO);
        ::dup2(err[1], STDERR_FILENO);
    }
};

pid_t fork_or_throw() {
    const pid_t pid = ::fork();
    if (pid < 0) {
        throw sys_error("fork");
    }
    return pid;
}

// In the parent: feeds stdin, reads stdout, stderr (and the reply pipe,
// when there is one) until all close or the timeout (then SIGKILL), and
// reaps the child.
ran collect(pid_t pid, pipes& p, const run_options& o, int reply_fd = -1) {
    ::close(p.in[0]);
    ::close(p.out[1]);
    ::close(p.err[1]);
    write_all(p.in[1], o.stdin_text);
    ::close(p.in[1]);
    ran r;
    std::string* into[3] = {&r.out, &r.err, &r.reply};
    pollfd fds[3] = {{p.out[0], POLLIN, 0}, {p.err[0], POLLIN, 0}, {reply_fd, POLLIN, 0}};
    int open_fds = reply_fd >= 0 ? 3 : 2;
    const auto deadline = std::chrono::steady_clock::now() + o.timeout;
    bool killed = false;
    while (open_fds > 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            ::kill(pid, SIGKILL);
            killed = true;
            break;
        }
        if (::poll(fds, 3, static_cast<int>(left.count())) < 0 && errno != EINTR) {
            break;
        }
        for (int i = 0; i < 3; ++i) {
            if (fds[i].fd < 0 || fds[i].revents == 0) {
                continue;
            }
            char buf[65536];
            const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
            if (n > 0) {
                into[i]->append(buf, static_cast<std::size_t>(n));
            } else if (n == 0 || errno != EINTR) {
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
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(status)) {
        r.signal = WTERMSIG(status);
    }
    r.exit_code = !killed && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

}  // namespace

ran run(std::vector<std::string> argv, const run_options& o) {
    pipes p;
    const pid_t pid = fork_or_throw();
    if (pid == 0) {
        p.become_stdio();
        child_exec(std::move(argv), o);
    }
    return collect(pid, p, o);
}

ran run_shell(const std::string& command_line, const run_options& o) {
    return run({"/bin/sh", "-c", command_line}, o);
}

ran run_in_child(const std::function<int(std::string& reply)>& fn, const run_options& o) {
    pipes p;
    int reply[2];
    if (::pipe2(reply, O_CLOEXEC) != 0) {
        throw sys_error("pipe2");
    }
    const pid_t pid = fork_or_throw();
    if (pid == 0) {
        p.become_stdio();
        ::close(reply[0]);
        put_env(o);
        std::string text;
        int code = 99;
        try {
            code = fn(text);
        } catch (const std::exception& e) {
            text += std::string("exception: ") + e.what();
        } catch (...) {
            text += "exception";
        }
        std::fflush(nullptr);
        write_all(reply[1], text);
        ::_exit(code);
    }
    ::close(reply[1]);
    return collect(pid, p, o, reply[0]);
}

ran run_in_child(const std::function<std::string()>& fn, const run_options& o) {
    return run_in_child(
        [&fn](std::string& reply) {
            reply = fn();
            return 0;
        },
        o);
}

background::background(std::vector<std::string> argv, std::string_view ready_prefix,
                       std::chrono::milliseconds timeout, const run_options& o) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) {
        throw sys_error("pipe2");
    }
    _pid = fork_or_throw();
    if (_pid == 0) {
        ::dup2(out[1], STDOUT_FILENO);
        child_exec(std::move(argv), o);
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

int background::finish(std::chrono::milliseconds timeout) {
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

int background::stop() {
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

}  // namespace qrt::testing
