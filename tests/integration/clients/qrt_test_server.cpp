// qrt-test-server: the agent's socket side (test_agent.hpp) as a process,
// for the client integration tests (qrtctl, the C example, the Python
// client).  Prints "ready <socket>" on stdout once it accepts connections,
// runs until SIGTERM/SIGINT or --duration-s, and exits 0.
//
//   qrt-test-server --socket /tmp/x/qrtd.sock --store /tmp/x/ledger.db
//       --scheduler uid:0 --reader uid:65534 [--health degraded --reason "probe lost"]

#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "test_agent.hpp"

namespace {

// "--name value" pairs, strictly (a test tool: no CLI11, whose templates
// trip -Wnull-dereference at -O2 in this combination).
bool parse(int argc, char** argv, qrt::testing::test_agent_options& o, long& duration_s) {
    for (int i = 1; i < argc; i += 2) {
        const std::string name = argv[i];
        if (i + 1 >= argc) {
            std::cerr << "qrt-test-server: " << name << " needs a value\n";
            return false;
        }
        const std::string v = argv[i + 1];
        if (name == "--socket") {
            o.socket_path = v;
        } else if (name == "--store") {
            o.store_path = v;
        } else if (name == "--periodic-qpu") {
            o.periodic_qpus.push_back(v);
        } else if (name == "--pushed-qpu") {
            o.pushed_qpus.push_back(v);
        } else if (name == "--reader") {
            o.roles.reader.push_back(v);
        } else if (name == "--scheduler") {
            o.roles.scheduler.push_back(v);
        } else if (name == "--calibration") {
            o.roles.calibration.push_back(v);
        } else if (name == "--admin") {
            o.roles.admin.push_back(v);
        } else if (name == "--health") {
            o.health = v;
        } else if (name == "--reason") {
            o.health_reasons.push_back(v);
        } else if (name == "--duration-s") {
            duration_s = std::stol(v);
        } else {
            std::cerr << "qrt-test-server: unknown option " << name << "\n";
            return false;
        }
    }
    if (o.socket_path.empty()) {
        std::cerr << "qrt-test-server: --socket is required\n";
        return false;
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    qrt::testing::test_agent_options o;
    long duration_s = 600;
    if (!parse(argc, argv, o, duration_s)) {
        return 2;
    }
    // stdout carries the ready line only; the agent's log goes to stderr.
    spdlog::set_default_logger(spdlog::stderr_logger_mt("qrt-test-server"));

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, nullptr);
    const int sfd = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        std::perror("qrt-test-server: signalfd");
        return 1;
    }
    try {
        qrt::testing::test_agent agent(o);
        auto& loop = agent.loop();
        (void)loop.add_fd(sfd, EPOLLIN, [&loop](std::uint32_t) { loop.stop(); });
        (void)loop.add_timer(std::chrono::seconds(duration_s), std::chrono::nanoseconds(0),
                             [&loop] { loop.stop(); });
        std::cout << "ready " << o.socket_path << std::endl;
        loop.run();
        loop.remove_fd(sfd);
    } catch (const std::exception& e) {
        std::cerr << "qrt-test-server: " << e.what() << '\n';
        ::close(sfd);
        return 1;
    }
    ::close(sfd);
    return 0;
}
