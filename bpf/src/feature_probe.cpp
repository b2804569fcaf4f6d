#include "feature_probe.hpp"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <sys/capability.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "rtcore/capabilities.hpp"
#include "rtcore/unique_fd.hpp"

namespace qrt_bpf::detail {

namespace {

constexpr std::string_view tp_btf_prefix = "tp_btf_";
constexpr std::string_view raw_tp_prefix = "raw_tp_";

// Per kept program, room for the verifier's log when its load fails
// (libbpf asks for the log only then, at log_level 1).  1 MiB holds the
// whole level-1 log of these programs; the pages are touched only when
// the kernel writes them.  A kernel before 6.4 that fills it returns
// ENOSPC (the message says so).
constexpr std::size_t log_buf_size = 1U << 20;

}  // namespace

bool kernel_has_tp_btf(const char* tp_name) noexcept {
    const int btf_id = libbpf_find_vmlinux_btf_id(tp_name, BPF_TRACE_RAW_TP);
    if (btf_id <= 0) {
        return false;
    }
    // r0 = 0; exit
    bpf_insn insns[2] = {};
    insns[0].code = static_cast<__u8>(BPF_ALU64 | BPF_MOV | BPF_K);
    insns[0].dst_reg = BPF_REG_0;
    insns[0].imm = 0;
    insns[1].code = static_cast<__u8>(BPF_JMP | BPF_EXIT);

    bpf_prog_load_opts opts{};
    opts.sz = sizeof(opts);
    opts.expected_attach_type = BPF_TRACE_RAW_TP;
    opts.attach_btf_id = static_cast<__u32>(btf_id);
    const rtcore::unique_fd prog(bpf_prog_load(BPF_PROG_TYPE_TRACING, nullptr, "GPL", insns, 2, &opts));
    return prog.valid();  // loaded, and closed again: only the answer was wanted
}

std::string flavour_plan::describe() const {
    if (all_raw) {
        return "raw_tp";
    }
    if (raw.empty()) {
        return "tp_btf";
    }
    std::string out = "tp_btf, raw_tp for ";
    bool first = true;
    for (const auto& tp : raw) {
        out += (first ? "" : ",") + tp;
        first = false;
    }
    return out;
}

rtcore::status apply_plan(bpf_object* obj, const flavour_plan& plan) {
    bpf_program* prog = nullptr;
    bpf_object__for_each_program(prog, obj) {
        const std::string_view name = bpf_program__name(prog);
        bool raw = false;
        if (name.starts_with(raw_tp_prefix)) {
            raw = true;
        } else if (!name.starts_with(tp_btf_prefix)) {
            return rtcore::error::invalid("bpf: program " + std::string(name) +
                                          " is neither tp_btf_ nor raw_tp_");
        }
        const std::string_view tp = name.substr(raw ? raw_tp_prefix.size() : tp_btf_prefix.size());
        if (const int err = bpf_program__set_autoload(prog, plan.is_raw(tp) == raw); err != 0) {
            return libbpf_error("bpf_program__set_autoload " + std::string(name), err);
        }
    }
    return rtcore::ok();
}

std::string log_tail(std::string_view log, unsigned max_lines) {
    std::vector<std::string_view> lines;
    while (!log.empty()) {
        const auto nl = log.find('\n');
        std::string_view line = log.substr(0, nl);
        while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) {
            line.remove_suffix(1);
        }
        if (!line.empty()) {
            lines.push_back(line);
        }
        if (nl == std::string_view::npos) {
            break;
        }
        log.remove_prefix(nl + 1);
    }
    std::string out;
    const std::size_t from = lines.size() > max_lines ? lines.size() - max_lines : 0;
    for (std::size_t i = from; i < lines.size(); ++i) {
        out += (i == from ? "" : " | ") + std::string(lines[i]);
    }
    return out;
}

rtcore::result<load_report> load_with_fallback(const std::string& probe, bool force_raw_tp,
                                               const std::function<rtcore::result<bpf_object*>()>& open,
                                               const std::function<int()>& load) {
    flavour_plan plan;
    plan.all_raw = force_raw_tp || !kernel_has_tp_btf("sched_switch");
    load_report report;
    struct kept {
        std::string name;
        std::unique_ptr<char[]> log;
    };
    // Bounded: each round moves one more handler to raw_tp, or all of them,
    // and an object has far fewer than 64 handlers.
    for (unsigned round = 0; round < 64; ++round) {
        auto obj = open();
        if (!obj) {
            return std::move(obj).err();
        }
        if (auto st = apply_plan(*obj, plan); !st) {
            return std::move(st).err();
        }
        std::vector<kept> programs;
        bpf_program* prog = nullptr;
        bpf_object__for_each_program(prog, *obj) {
            if (!bpf_program__autoload(prog)) {
                continue;
            }
            kept k{bpf_program__name(prog), std::unique_ptr<char[]>(new char[log_buf_size])};
            k.log[0] = '\0';
            if (const int err = bpf_program__set_log_buf(prog, k.log.get(), log_buf_size); err != 0) {
                return libbpf_error(probe + ": bpf_program__set_log_buf " + k.name, err);
            }
            programs.push_back(std::move(k));
        }
        const int err = load();
        if (err == 0) {
            report.flavour = plan.describe();
            return report;
        }
        const kept* failed = nullptr;
        for (const auto& k : programs) {
            if (k.log[0] != '\0') {
                failed = &k;
                break;
            }
        }
        const int code = err < 0 ? -err : err;
        if (failed == nullptr) {
            // Refused before the verifier ran (libbpf found no BTF target for
            // a tp_btf program, for one): every handler to raw_tp, once.
            if (!plan.all_raw) {
                report.tp_btf_rejections += (report.tp_btf_rejections.empty() ? "" : "; ") +
                                            std::string("load of the tp_btf programs: ") +
                                            std::strerror(code) + " before verification";
                std::fprintf(stderr, "bpf: %s: tp_btf programs refused (%s), using raw_tp\n",
                             probe.c_str(), std::strerror(code));
                plan.all_raw = true;
                continue;
            }
            return libbpf_error(probe + ": load " + plan.describe() + " programs", err);
        }
        const std::string_view log(failed->log.get(), ::strnlen(failed->log.get(), log_buf_size));
        if (!plan.all_raw && failed->name.starts_with(tp_btf_prefix)) {
            const std::string tp = failed->name.substr(tp_btf_prefix.size());
            const std::string why = failed->name + ": " + std::strerror(code) + ": " + log_tail(log);
            report.tp_btf_rejections += (report.tp_btf_rejections.empty() ? "" : "; ") + why;
            std::fprintf(stderr, "bpf: %s: the kernel rejected %s, using raw_tp_%s\n", probe.c_str(),
                         why.c_str(), tp.c_str());
            plan.raw.insert(tp);
            continue;
        }
        auto e = libbpf_error(probe + ": load program " + failed->name, err, log);
        if (!report.tp_btf_rejections.empty()) {
            e.message += " (after tp_btf was rejected: " + report.tp_btf_rejections + ")";
        }
        return e;
    }
    return rtcore::error::invalid(probe + ": tp_btf/raw_tp fallback did not converge");
}

std::uint64_t recursion_misses(bpf_object* obj) noexcept {
    std::uint64_t total = 0;
    bpf_program* prog = nullptr;
    bpf_object__for_each_program(prog, obj) {
        const int fd = bpf_program__fd(prog);
        if (fd < 0) {
            continue;  // not loaded (the other flavour)
        }
        bpf_prog_info info{};
        __u32 len = sizeof(info);
        if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0) {
            total += info.recursion_misses;
        }
    }
    return total;
}

namespace {

int libbpf_print(enum libbpf_print_level level, const char* format, va_list args) {
    if (level == LIBBPF_DEBUG) {
        return 0;
    }
    std::fputs("bpf: ", stderr);  // libbpf adds its own "libbpf: "
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    return std::vfprintf(stderr, format, args);
#pragma GCC diagnostic pop
}

}  // namespace

void install_libbpf_logger() noexcept {
    static std::once_flag once;
    std::call_once(once, [] { libbpf_set_print(libbpf_print); });
}

std::string missing_bpf_capabilities() {
    // rtcore::has_capability: the effective set through libcap; a number
    // libcap does not know (an old libcap) counts as absent.
    if (rtcore::has_capability(CAP_SYS_ADMIN)) {
        return "";
    }
    const bool bpf = rtcore::has_capability(CAP_BPF);
    const bool perfmon = rtcore::has_capability(CAP_PERFMON);
    if (!bpf && !perfmon) {
        return "CAP_BPF and CAP_PERFMON";
    }
    return !bpf ? "CAP_BPF" : (!perfmon ? "CAP_PERFMON" : "");
}

rtcore::error libbpf_error(const std::string& what, int err, std::string_view verifier_log) {
    const int code = err < 0 ? -err : (err > 0 ? err : (errno != 0 ? errno : EINVAL));
    rtcore::error e = rtcore::error::from_errno(code, what);
    if (code == EPERM) {
        const std::string missing = missing_bpf_capabilities();
        e.message += missing.empty()
                         ? " (CAP_BPF and CAP_PERFMON are held: a kernel lockdown, an LSM or a "
                           "seccomp filter refused it)"
                         : " (missing capability " + missing + ")";
    }
    if (code == ENOSPC && !verifier_log.empty()) {
        e.message += " (the verifier log did not fit its 1 MiB buffer)";
    }
    if (const std::string tail = log_tail(verifier_log); !tail.empty()) {
        e.message += "; verifier: " + tail;
    }
    return e;
}

}  // namespace qrt_bpf::detail
