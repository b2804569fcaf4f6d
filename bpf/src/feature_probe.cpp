#include "feature_probe.hpp"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string_view>

namespace qrt_bpf::detail {

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
    const int fd = bpf_prog_load(BPF_PROG_TYPE_TRACING, nullptr, "GPL", insns, 2, &opts);
    if (fd < 0) {
        return false;
    }
    ::close(fd);
    return true;
}

rtcore::result<std::string> select_flavour(bpf_object* obj, const char* probe_tp,
                                           bool force_raw_tp) {
    const bool use_btf = !force_raw_tp && kernel_has_tp_btf(probe_tp);
    const std::string_view keep = use_btf ? "tp_btf_" : "raw_tp_";
    const std::string_view drop = use_btf ? "raw_tp_" : "tp_btf_";
    bpf_program* prog = nullptr;
    bpf_object__for_each_program(prog, obj) {
        const std::string_view name = bpf_program__name(prog);
        if (name.starts_with(drop)) {
            if (const int err = bpf_program__set_autoload(prog, false); err != 0) {
                return libbpf_error("bpf_program__set_autoload " + std::string(name), err);
            }
        } else if (!name.starts_with(keep)) {
            return rtcore::error::invalid("bpf: program " + std::string(name) +
                                          " is neither tp_btf_ nor raw_tp_");
        }
    }
    return std::string(use_btf ? "tp_btf" : "raw_tp");
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

rtcore::error libbpf_error(const std::string& what, int err) {
    const int code = err < 0 ? -err : (err > 0 ? err : (errno != 0 ? errno : EINVAL));
    rtcore::error e = rtcore::error::from_errno(code, what);
    if (code == EPERM || code == EACCES) {
        e.message += " (missing capability CAP_BPF/CAP_PERFMON?)";
    }
    return e;
}

}  // namespace qrt_bpf::detail
