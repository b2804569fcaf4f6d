#pragma once
// Child processes for tests: run a program, a shell line or a function to
// completion with its stdout, stderr and exit status captured (bounded by a
// timeout), or keep a server running until the test ends.  Every child is
// ended by its pid.  A function run in a child may change process-wide state
// (capabilities, scheduling, no_new_privs) without touching the test runner.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qrt::testing {

struct ran {
    int exit_code = -1;  // -1: killed (timeout or signal)
    int signal = 0;      // the signal that ended it, 0 when it exited
    std::string out;     // stdout
    std::string err;     // stderr
    std::string reply;   // run_in_child: what fn left in its `reply` string
};

struct run_options {
    std::vector<std::string> env;  // extra NAME=value
    std::string stdin_text;
    std::optional<uid_t> as_uid;  // setuid before exec (needs root)
    std::optional<gid_t> as_gid;
    std::chrono::milliseconds timeout{20000};
};

// Runs argv[0] (a path) to completion.
ran run(std::vector<std::string> argv, const run_options& o = {});

// Runs a command line with /bin/sh -c.
ran run_shell(const std::string& command_line, const run_options& o = {});

// Runs fn in a forked child: its return value is the exit status, and what
// it leaves in `reply` comes back in ran::reply, through a pipe of its own
// (apart from what the code it calls prints).  An exception ends the child
// with status 99 and "exception: <what>" in reply.  Only env, stdin_text and
// timeout of the options apply.
ran run_in_child(const std::function<int(std::string& reply)>& fn, const run_options& o = {});

// The same for a function whose result is its reply (exit status 0).
ran run_in_child(const std::function<std::string()>& fn, const run_options& o = {});

// A long-running child whose first stdout line is awaited; SIGTERM (then
// SIGKILL) by pid on destruction.
class background {
public:
    background(std::vector<std::string> argv, std::string_view ready_prefix,
               std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
               const run_options& o = {});
    ~background() { stop(); }
    background(const background&) = delete;
    background& operator=(const background&) = delete;

    pid_t pid() const noexcept { return _pid; }
    // Everything the child printed so far (the ready line included).
    const std::string& output() const noexcept { return _first_line; }

    // Read stdout to EOF and reap the child (killed after timeout).
    // Returns its exit status (-1 when killed).
    int finish(std::chrono::milliseconds timeout);

    // SIGTERM, wait up to 5 s, then SIGKILL.  Returns the exit status (-1
    // when killed by a signal).
    int stop();

private:
    pid_t _pid = -1;
    int _out = -1;
    int _status = -1;
    std::string _first_line;
};

}  // namespace qrt::testing
