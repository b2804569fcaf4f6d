// qrt-wakeup-trace: run a command (or sleep) with wakeup_trace.bpf.o attached
// and print who woke whom across CPUs, the IPIs each (CPU, task) sent, the
// wake-ups that needed none, the time in try_to_wake_up and the IPIs and
// NET_RX softirq time each CPU received.  One JSON object on stdout.
//
//   qrt-wakeup-trace [--seconds N] [--top K] [-- command args...]
//
// Needs root (CAP_BPF + CAP_PERFMON).  The fentry/fexit programs are left
// out, and said so, where the kernel has no BPF trampolines.
#include <bpf/libbpf.h>
#include <bpf/bpf.h>
#include <linux/types.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "wakeup_trace.h"

namespace {

struct row {
    qrt_wt_key key;
    qrt_wt_sender v;
};

bpf_object* open_and_load(const char* path, bool with_ttwu, std::string& err) {
    bpf_object* obj = bpf_object__open_file(path, nullptr);
    if (obj == nullptr) {
        err = std::string("bpf_object__open_file ") + path + ": " + std::strerror(errno);
        return nullptr;
    }
    if (!with_ttwu) {
        for (const char* name : {"wt_ttwu_in", "wt_ttwu_out"}) {
            if (bpf_program* p = bpf_object__find_program_by_name(obj, name)) {
                bpf_program__set_autoload(p, false);
            }
        }
    }
    if (const int rc = bpf_object__load(obj); rc != 0) {
        err = std::string("bpf_object__load: ") + std::strerror(-rc);
        bpf_object__close(obj);
        return nullptr;
    }
    return obj;
}

}  // namespace

int main(int argc, char** argv) {
    double seconds = 5;
    std::size_t top = 24;
    int cmd_at = -1;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--seconds" && i + 1 < argc) {
            seconds = std::stod(argv[++i]);
        } else if (a == "--top" && i + 1 < argc) {
            top = std::stoul(argv[++i]);
        } else if (a == "--") {
            cmd_at = i + 1;
            break;
        } else {
            std::fprintf(stderr, "usage: qrt-wakeup-trace [--seconds N] [--top K] [-- command args...]\n");
            return 2;
        }
    }
    libbpf_set_print([](libbpf_print_level, const char*, va_list) { return 0; });
    std::string err;
    std::string ttwu_note = "timed with fentry/fexit";
    bpf_object* obj = open_and_load(WAKEUP_TRACE_BPF_O, true, err);
    if (obj == nullptr) {
        ttwu_note = "try_to_wake_up not timed (" + err + ")";
        obj = open_and_load(WAKEUP_TRACE_BPF_O, false, err);
    }
    if (obj == nullptr) {
        std::fprintf(stderr, "qrt-wakeup-trace: %s (needs root, kernel BTF)\n", err.c_str());
        return 77;
    }
    std::vector<bpf_link*> links;
    bpf_program* prog = nullptr;
    bpf_object__for_each_program(prog, obj) {
        if (!bpf_program__autoload(prog)) {
            continue;
        }
        bpf_link* l = bpf_program__attach(prog);
        if (l == nullptr) {
            std::fprintf(stderr, "qrt-wakeup-trace: attach %s: %s\n", bpf_program__name(prog), std::strerror(errno));
            return 77;
        }
        links.push_back(l);
    }
    const auto t0 = std::chrono::steady_clock::now();
    int cmd_status = 0;
    if (cmd_at > 0 && cmd_at < argc) {
        const pid_t pid = ::fork();
        if (pid == 0) {
            ::dup2(2, 1);  // our stdout is the JSON
            ::execvp(argv[cmd_at], argv + cmd_at);
            ::_exit(127);
        }
        int st = 0;
        ::waitpid(pid, &st, 0);
        cmd_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    } else {
        std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    const int senders_fd = bpf_object__find_map_fd_by_name(obj, "senders");
    const int receivers_fd = bpf_object__find_map_fd_by_name(obj, "receivers");
    std::vector<row> rows;
    qrt_wt_key k{};
    qrt_wt_key next{};
    bool first = true;
    while (bpf_map_get_next_key(senders_fd, first ? nullptr : &k, &next) == 0) {
        first = false;
        row r{next, {}};
        if (bpf_map_lookup_elem(senders_fd, &next, &r.v) == 0) {
            rows.push_back(r);
        }
        k = next;
    }
    std::sort(rows.begin(), rows.end(), [](const row& a, const row& b) {
        return a.v.ipi_sent + a.v.waking_remote > b.v.ipi_sent + b.v.waking_remote;
    });
    nlohmann::json out;
    out["tool"] = "qrt-wakeup-trace";
    out["seconds"] = elapsed;
    out["ttwu"] = ttwu_note;
    out["command_status"] = cmd_status;
    nlohmann::json s = nlohmann::json::array();
    for (std::size_t i = 0; i < rows.size() && i < top; ++i) {
        const auto& r = rows[i];
        s.push_back({{"cpu", r.key.cpu},
                     {"comm", std::string(r.key.comm, strnlen(r.key.comm, sizeof r.key.comm))},
                     {"waking_remote", r.v.waking_remote},
                     {"waking_local", r.v.waking_local},
                     {"wake_idle_no_ipi", r.v.wake_idle_no_ipi},
                     {"ipi_sent", r.v.ipi_sent},
                     {"ttwu_count", r.v.ttwu_count},
                     {"ttwu_mean_ns", r.v.ttwu_count ? r.v.ttwu_total_ns / r.v.ttwu_count : 0},
                     {"ttwu_max_ns", r.v.ttwu_max_ns},
                     {"ttwu_ge_2us", r.v.ttwu_ge_2us}});
    }
    out["senders"] = s;
    nlohmann::json recv = nlohmann::json::array();
    const long ncpu = std::min<long>(::sysconf(_SC_NPROCESSORS_CONF), QRT_WT_MAX_CPUS);
    for (__u32 c = 0; c < static_cast<__u32>(ncpu); ++c) {
        qrt_wt_receiver r{};
        if (bpf_map_lookup_elem(receivers_fd, &c, &r) == 0) {
            recv.push_back({{"cpu", c},
                            {"resched_ipi", r.resched_ipi},
                            {"call_function_ipi", r.call_function_ipi},
                            {"net_rx", r.net_rx},
                            {"net_rx_ns", r.net_rx_ns}});
        }
    }
    out["receivers"] = recv;
    for (bpf_link* l : links) {
        bpf_link__destroy(l);
    }
    bpf_object__close(obj);
    std::printf("%s\n", out.dump().c_str());
    return cmd_status;
}
