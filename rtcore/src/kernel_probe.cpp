#include "rtcore/kernel_probe.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <sstream>
#include <utility>

#include "rtcore/text.hpp"

namespace rtcore {

const char* to_string(tristate t) {
    switch (t) {
    case tristate::no:
        return "no";
    case tristate::yes:
        return "yes";
    case tristate::unknown:
        break;
    }
    return "unknown";
}

cpu_set boot_knob::effective() const {
    if (kernel_cpus) {
        return *kernel_cpus;
    }
    if (cmdline_cpus) {
        return *cmdline_cpus;
    }
    return {};
}

bool kernel_report::has_warning(std::string_view subsystem) const {
    return std::any_of(warnings.begin(), warnings.end(),
                       [&](const warning& w) { return w.subsystem == subsystem; });
}

namespace {

constexpr std::uint64_t default_timer_slack_ns = 50000;
constexpr std::uint64_t deep_idle_latency_us = 10;   // deeper than this is a risk

std::optional<std::string> read_opt(const host_fs& fs, const std::string& path) {
    auto r = fs.read_line(path);
    if (!r) {
        return std::nullopt;
    }
    return std::move(r).value();
}

template <typename T>
std::optional<T> parse_num(std::string_view s) {
    const std::string t(trim(s));
    T v{};
    const char* b = t.data();
    const char* e = t.data() + t.size();
    auto [p, ec] = std::from_chars(b, e, v);
    if (ec != std::errc{} || p != e || t.empty()) {
        return std::nullopt;
    }
    return v;
}

template <typename T>
std::optional<T> read_num(const host_fs& fs, const std::string& path) {
    auto s = read_opt(fs, path);
    if (!s) {
        return std::nullopt;
    }
    return parse_num<T>(*s);
}

std::vector<std::string> split_ws(std::string_view s) {
    std::vector<std::string> out;
    std::istringstream in{std::string(s)};
    std::string tok;
    while (in >> tok) {
        out.push_back(tok);
    }
    return out;
}

// "(null)" is what /sys/devices/system/cpu/nohz_full says when empty.
std::optional<cpu_set> parse_sys_list(const std::optional<std::string>& text) {
    if (!text) {
        return std::nullopt;
    }
    const std::string t(trim(*text));
    if (t.empty() || t == "(null)") {
        return cpu_set{};
    }
    auto r = cpu_set::parse_list(t);
    if (!r) {
        return std::nullopt;
    }
    return *r;
}

std::string list_or_none(const cpu_set& s) { return s.empty() ? std::string("none") : s.to_list(); }

std::string cpus_word(const cpu_set& s) {
    return (s.count() == 1 ? "CPU " : "CPUs ") + s.to_list();
}

std::string percent(double fraction) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f%%", fraction * 100.0);
    return buf;
}

void probe_version(const host_fs& fs, kernel_report& rep) {
    rep.release = read_opt(fs, "/proc/sys/kernel/osrelease");
    rep.version = read_opt(fs, "/proc/sys/kernel/version");
    if (!rep.version) {
        // "Linux version <release> (<builder>) (<compiler>) #1 SMP PREEMPT_DYNAMIC ..."
        if (auto pv = read_opt(fs, "/proc/version")) {
            const auto hash = pv->find(" #");
            if (hash != std::string::npos) {
                rep.version = pv->substr(hash + 1);
            }
        }
    }
    std::vector<std::string> words;
    if (rep.version) {
        words = split_ws(*rep.version);
    }
    auto has_word = [&](std::string_view w) { return std::find(words.begin(), words.end(), w) != words.end(); };

    // /sys/kernel/realtime exists (and reads 1) only on PREEMPT_RT kernels.
    const auto realtime = read_opt(fs, "/sys/kernel/realtime");
    if ((realtime && trim(*realtime) == "1") || has_word("PREEMPT_RT")) {
        rep.preempt_rt = tristate::yes;
    } else if (rep.version || (!realtime && fs.is_dir("/sys/kernel"))) {
        rep.preempt_rt = tristate::no;
    }

    if (rep.preempt_rt == tristate::yes) {
        rep.preempt_model = "PREEMPT_RT";
    } else if (has_word("PREEMPT_DYNAMIC")) {
        rep.preempt_model = "PREEMPT_DYNAMIC";
        // "none voluntary (full) lazy": the bracketed word is the mode.
        if (auto mode = read_opt(fs, "/sys/kernel/debug/sched/preempt")) {
            for (const auto& w : split_ws(*mode)) {
                if (w.size() > 2 && w.front() == '(' && w.back() == ')') {
                    rep.preempt_model += " " + w;
                }
            }
        }
    } else if (has_word("PREEMPT")) {
        rep.preempt_model = "PREEMPT";
    } else if (rep.version) {
        rep.preempt_model = "none or voluntary";
    }
}

struct cmdline_params {
    std::vector<std::pair<std::string, std::optional<std::string>>> params;

    // Last occurrence wins, as for most kernel parameters.
    std::optional<std::optional<std::string>> get(std::string_view key) const {
        std::optional<std::optional<std::string>> out;
        for (const auto& [k, v] : params) {
            if (k == key) {
                out = v;
            }
        }
        return out;
    }
};

cmdline_params parse_cmdline(std::string_view cmdline) {
    cmdline_params out;
    for (const auto& tok : split_ws(cmdline)) {
        if (tok == "--") {
            break;   // the rest belongs to init
        }
        const auto eq = tok.find('=');
        if (eq == std::string::npos) {
            out.params.emplace_back(tok, std::nullopt);
        } else {
            out.params.emplace_back(tok.substr(0, eq), tok.substr(eq + 1));
        }
    }
    return out;
}

// A CPU-list kernel parameter value; "all" means every online CPU.
std::optional<cpu_set> parse_param_cpus(std::string_view value, const std::optional<cpu_set>& online) {
    const std::string v(trim(value));
    if (v == "all") {
        return online;
    }
    if (v.empty()) {
        return cpu_set{};
    }
    auto r = cpu_set::parse_list(v);
    if (!r) {
        return std::nullopt;
    }
    return *r;
}

void probe_boot_knobs(const host_fs& fs, kernel_report& rep) {
    if (auto raw = read_opt(fs, "/proc/cmdline")) {
        // Kernel parameters only: what follows " -- " is for init.
        std::string line(trim(*raw));
        const auto dd = (" " + line + " ").find(" -- ");
        if (dd != std::string::npos) {
            line = std::string(trim(std::string_view(line).substr(0, dd)));
        }
        rep.cmdline = line;
        const auto params = parse_cmdline(line);
        auto fill = [&](boot_knob& knob, std::string_view key) {
            if (auto v = params.get(key)) {
                knob.cmdline_value = v->value_or("");
            }
        };
        fill(rep.isolcpus, "isolcpus");
        fill(rep.nohz_full, "nohz_full");
        fill(rep.rcu_nocbs, "rcu_nocbs");
        fill(rep.irqaffinity, "irqaffinity");

        if (rep.isolcpus.cmdline_value) {
            // isolcpus=[flag,]...<cpu-list>: flags are the leading words.
            std::string_view v = *rep.isolcpus.cmdline_value;
            while (!v.empty() && std::isalpha(static_cast<unsigned char>(v.front())) != 0) {
                const auto comma = v.find(',');
                rep.isolcpus_flags.emplace_back(v.substr(0, comma));
                v = comma == std::string_view::npos ? std::string_view{} : v.substr(comma + 1);
            }
            rep.isolcpus.cmdline_cpus = parse_param_cpus(v, rep.online);
        }
        for (boot_knob* k : {&rep.nohz_full, &rep.rcu_nocbs, &rep.irqaffinity}) {
            if (k->cmdline_value) {
                k->cmdline_cpus = parse_param_cpus(*k->cmdline_value, rep.online);
            }
        }
    }

    // What the kernel itself says is in effect.
    rep.isolcpus.kernel_cpus = parse_sys_list(read_opt(fs, "/sys/devices/system/cpu/isolated"));
    rep.nohz_full.kernel_cpus = parse_sys_list(read_opt(fs, "/sys/devices/system/cpu/nohz_full"));
    if (rep.nohz_full.kernel_cpus) {
        rep.nohz_full_supported = tristate::yes;
    } else if (rep.isolcpus.kernel_cpus && !fs.exists("/sys/devices/system/cpu/nohz_full")) {
        // The cpu directory is there but nohz_full is not: the kernel was
        // built without CONFIG_NO_HZ_FULL, so a cmdline nohz_full= is ignored.
        rep.nohz_full_supported = tristate::no;
        rep.nohz_full.kernel_cpus = cpu_set{};
    }
    // nohz_full CPUs have their RCU callbacks offloaded too.
    if (rep.rcu_nocbs.cmdline_cpus || !rep.nohz_full.effective().empty()) {
        cpu_set eff = rep.rcu_nocbs.cmdline_cpus.value_or(cpu_set{});
        eff |= rep.nohz_full.effective();
        rep.rcu_nocbs.kernel_cpus = eff;
    }
}

void warn_boot_knobs(kernel_report& rep) {
    const cpu_set& iso = rep.isolated_requested;
    if (iso.empty()) {
        return;
    }
    const std::string iso_list = iso.to_list();
    // The fix names the parameter to add, or to change when the command line
    // already has it.
    auto add = [&](std::string message, std::string args, std::string before = {}) {
        const std::string key = args.substr(0, args.find('='));
        const auto present = parse_cmdline(rep.cmdline.value_or("")).get(key);
        std::string fix = std::move(before);
        if (present) {
            fix += "replace " + key + (*present ? "=" + **present : std::string()) +
                   " on the kernel command line with " + args;
        } else {
            fix += "add to the kernel command line: " + args;
        }
        rep.warnings.push_back(warning{"boot", std::move(message), std::move(fix), true});
    };
    // detail says where "in effect" was read, so the message never implies
    // more than the kernel reported.
    auto judge = [&](const boot_knob& knob, const char* name, const std::string& args, const char* effect,
                     const std::string& detail, std::string before = {}) {
        const cpu_set eff = knob.effective();
        if (iso.is_subset_of(eff)) {
            return;
        }
        std::string msg = std::string(name) + " is not in effect on isolated " + cpus_word(iso - eff) + " (" +
                          detail + ")";
        if (knob.cmdline_value) {
            msg += "; the kernel command line has " + std::string(name) + "=" + *knob.cmdline_value;
        }
        add(msg + "; " + effect, args, std::move(before));
    };
    const cpu_set iso_eff = rep.isolcpus.effective();
    judge(rep.isolcpus, "isolcpus", "isolcpus=managed_irq,domain," + iso_list,
          "the scheduler still balances tasks onto those CPUs",
          rep.isolcpus.kernel_cpus ? "/sys/devices/system/cpu/isolated lists " + list_or_none(iso_eff)
                                   : "the kernel command line gives " + list_or_none(iso_eff));
    if (iso.is_subset_of(iso_eff) &&
        std::find(rep.isolcpus_flags.begin(), rep.isolcpus_flags.end(), "managed_irq") ==
            rep.isolcpus_flags.end()) {
        add("isolcpus lacks the managed_irq flag: managed IRQs (NVMe, multiqueue NICs) can still fire on "
            "isolated " + cpus_word(iso),
            "isolcpus=managed_irq,domain," + iso_list);
    }
    const cpu_set nohz_eff = rep.nohz_full.effective();
    const bool no_nohz = rep.nohz_full_supported == tristate::no;
    judge(rep.nohz_full, "nohz_full", "nohz_full=" + iso_list, "the scheduler tick keeps interrupting those CPUs",
          no_nohz                   ? std::string("the kernel is built without CONFIG_NO_HZ_FULL")
          : rep.nohz_full.kernel_cpus ? "/sys/devices/system/cpu/nohz_full lists " + list_or_none(nohz_eff)
                                    : "the kernel command line gives " + list_or_none(nohz_eff),
          no_nohz ? "boot a kernel built with CONFIG_NO_HZ_FULL=y (Debian's stock kernels are) and " : "");
    judge(rep.rcu_nocbs, "rcu_nocbs", "rcu_nocbs=" + iso_list, "RCU callbacks still run on those CPUs",
          "rcu_nocbs= and nohz_full cover " + list_or_none(rep.rcu_nocbs.effective()));

    const cpu_set irq = rep.irqaffinity.effective();
    const cpu_set hk = rep.online ? (*rep.online - iso) : cpu_set{};
    const std::string hk_args = "irqaffinity=" + (hk.empty() ? std::string("<housekeeping CPUs>") : hk.to_list());
    if (irq.empty()) {
        add("irqaffinity is not set: IRQs may start on isolated " + cpus_word(iso) +
                " until they are pinned at runtime",
            hk_args);
    } else if (irq.intersects(iso)) {
        add("irqaffinity=" + irq.to_list() + " includes isolated " + cpus_word(irq & iso), hk_args);
    }
}

void probe_sched(const host_fs& fs, kernel_report& rep, const cpu_set& cpus) {
    rep.sched_rt_runtime_us = read_num<std::int64_t>(fs, "/proc/sys/kernel/sched_rt_runtime_us");
    rep.sched_rt_period_us = read_num<std::int64_t>(fs, "/proc/sys/kernel/sched_rt_period_us");

    const std::string dir = "/sys/kernel/debug/sched/fair_server";
    if (fs.is_dir(dir)) {
        rep.fair_server = tristate::yes;
        if (auto names = fs.list(dir)) {
            for (const auto& n : *names) {
                if (n.rfind("cpu", 0) != 0) {
                    continue;
                }
                auto cpu = parse_num<unsigned>(std::string_view(n).substr(3));
                if (!cpu) {
                    continue;
                }
                fair_server_cpu f;
                f.cpu = *cpu;
                f.runtime_ns = read_num<std::uint64_t>(fs, dir + "/" + n + "/runtime");
                f.period_ns = read_num<std::uint64_t>(fs, dir + "/" + n + "/period");
                rep.fair_server_cpus.push_back(f);
            }
            std::sort(rep.fair_server_cpus.begin(), rep.fair_server_cpus.end(),
                      [](const fair_server_cpu& a, const fair_server_cpu& b) { return a.cpu < b.cpu; });
        }
    } else if (fs.is_dir("/sys/kernel/debug/sched")) {
        rep.fair_server = tristate::no;
    }

    if (rep.fair_server == tristate::yes) {
        // Group CPUs by (runtime, period) among those that matter.
        std::vector<std::pair<std::pair<std::uint64_t, std::uint64_t>, cpu_set>> groups;
        for (const auto& f : rep.fair_server_cpus) {
            if (!cpus.test(f.cpu) || !f.runtime_ns || *f.runtime_ns == 0) {
                continue;
            }
            const auto key = std::make_pair(*f.runtime_ns, f.period_ns.value_or(0));
            auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
            if (it == groups.end()) {
                groups.push_back({key, cpu_set{}});
                it = groups.end() - 1;
            }
            it->second.set(f.cpu);
        }
        for (const auto& [key, set] : groups) {
            const unsigned first = static_cast<unsigned>(set.first());
            rep.warnings.push_back(warning{
                "sched",
                "the fair server (dl_server) reserves " + std::to_string(key.first) + " ns of every " +
                    (key.second != 0 ? std::to_string(key.second) : std::string("?")) +
                    " ns for normal tasks on " + cpus_word(set) +
                    ", preempting a SCHED_FIFO dispatch thread whenever a normal task is runnable there",
                "echo 0 > /sys/kernel/debug/sched/fair_server/cpu" + std::to_string(first) + "/runtime" +
                    (set.count() > 1 ? ", and likewise for every CPU in " + set.to_list() : std::string()) +
                    " (runtime setting, lost at reboot)",
                false});
        }
    } else if (rep.sched_rt_runtime_us && *rep.sched_rt_runtime_us >= 0) {
        const std::int64_t period = rep.sched_rt_period_us.value_or(1000000);
        rep.warnings.push_back(warning{
            "sched",
            "RT throttling is on: SCHED_FIFO tasks may run only " + std::to_string(*rep.sched_rt_runtime_us) +
                " us of every " + std::to_string(period) + " us, so a spinning dispatch thread can be stalled for " +
                std::to_string(period - *rep.sched_rt_runtime_us) + " us",
            "sysctl -w kernel.sched_rt_runtime_us=-1 (persist it in /etc/sysctl.d/)", false});
    }
}

void probe_cgroups(const host_fs& fs, kernel_report& rep) {
    auto mounts = read_opt(fs, "/proc/mounts");
    if (!mounts) {
        return;
    }
    rep.mounts_read = true;
    std::istringstream in(*mounts);
    std::string line;
    while (std::getline(in, line)) {
        const auto f = split_ws(line);
        if (f.size() < 4) {
            continue;
        }
        if (f[2] == "cgroup2" && !rep.cgroup_v2_mount) {
            rep.cgroup_v2_mount = f[1];
        } else if (f[2] == "cgroup" && !rep.cgroup_v1_cpuset_mount) {
            std::istringstream opts(f[3]);
            std::string o;
            while (std::getline(opts, o, ',')) {
                if (o == "cpuset") {
                    rep.cgroup_v1_cpuset_mount = f[1];
                }
            }
        }
    }
    if (!rep.cgroup_v2_mount) {
        rep.cgroup_v2_cpuset = tristate::no;
    } else if (auto ctl = read_opt(fs, *rep.cgroup_v2_mount + "/cgroup.controllers")) {
        const auto words = split_ws(*ctl);
        rep.cgroup_v2_cpuset =
            std::find(words.begin(), words.end(), "cpuset") != words.end() ? tristate::yes : tristate::no;
    }
    if (!rep.cgroup_v1_cpuset_mount && rep.cgroup_v2_cpuset == tristate::no) {
        // cgroup.controllers lists what the v2 root can offer; cpuset missing
        // there means it is bound to a v1 hierarchy or not built in.
        std::string where = rep.cgroup_v2_mount ? "cgroup v2 at " + *rep.cgroup_v2_mount +
                                                      " does not offer cpuset in cgroup.controllers"
                                                : "no cgroup v2 is mounted";
        rep.warnings.push_back(warning{
            "cgroup",
            "no cpuset controller: " + where + " and no cgroup v1 cpuset is mounted; runtime isolation "
                "falls back to an affinity fence, which cannot stop new tasks from landing on isolated CPUs",
            "mkdir -p /sys/fs/cgroup/cpuset && mount -t cgroup -o cpuset cpuset /sys/fs/cgroup/cpuset; if that "
            "fails, boot a kernel built with CONFIG_CPUSETS=y",
            false});
    }
}

void probe_features(const host_fs& fs, kernel_report& rep) {
    if (fs.exists("/sys/kernel/btf/vmlinux")) {
        rep.btf = tristate::yes;
    } else if (fs.is_dir("/sys/kernel")) {
        rep.btf = tristate::no;
        rep.warnings.push_back(warning{
            "bpf",
            "no BTF (/sys/kernel/btf/vmlinux is missing): the eBPF wakeup-latency and intrusion probes "
            "cannot load, so qrtd reports probes: unavailable",
            "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y (Debian's stock kernels are)", true});
    }

    rep.io_uring_disabled = read_num<int>(fs, "/proc/sys/kernel/io_uring_disabled");
    if (rep.io_uring_disabled) {
        switch (*rep.io_uring_disabled) {
        case 0:
            rep.io_uring = tristate::yes;
            break;
        case 1:
            rep.io_uring = tristate::unknown;
            rep.warnings.push_back(warning{
                "io_uring",
                "io_uring is restricted to root and members of kernel.io_uring_group (io_uring_disabled=1); "
                "the dispatcher running as user qrtd cannot create a ring otherwise",
                "add the qrtd user to the group in /proc/sys/kernel/io_uring_group, or sysctl -w "
                "kernel.io_uring_disabled=0",
                false});
            break;
        default:
            rep.io_uring = tristate::no;
            rep.warnings.push_back(warning{
                "io_uring",
                "io_uring is disabled (io_uring_disabled=" + std::to_string(*rep.io_uring_disabled) +
                    "): the dispatcher cannot submit through io_uring",
                "sysctl -w kernel.io_uring_disabled=0 (persist it in /etc/sysctl.d/)", false});
            break;
        }
    }
}

void probe_hypervisor(const host_fs& fs, kernel_report& rep) {
    if (auto cpuinfo = fs.read("/proc/cpuinfo")) {
        std::istringstream in(*cpuinfo);
        std::string line;
        while (std::getline(in, line)) {
            if (line.rfind("flags", 0) != 0) {
                continue;
            }
            const auto colon = line.find(':');
            const auto words = split_ws(colon == std::string::npos ? "" : line.substr(colon + 1));
            rep.hypervisor = std::find(words.begin(), words.end(), "hypervisor") != words.end() ? tristate::yes
                                                                                                : tristate::no;
            break;
        }
    }
    rep.hypervisor_type = read_opt(fs, "/sys/hypervisor/type");
    if (rep.hypervisor_type && !rep.hypervisor_type->empty()) {
        rep.hypervisor = tristate::yes;
    }
    rep.dmi_vendor = read_opt(fs, "/sys/class/dmi/id/sys_vendor");
    rep.dmi_product = read_opt(fs, "/sys/class/dmi/id/product_name");

    if (auto stat = read_opt(fs, "/proc/stat")) {
        std::istringstream in(*stat);
        std::string line;
        while (std::getline(in, line)) {
            const auto f = split_ws(line);
            if (f.empty() || f[0] != "cpu") {
                continue;
            }
            // user nice system idle iowait irq softirq steal (guest is in user)
            if (f.size() < 9) {
                break;
            }
            std::uint64_t total = 0;
            std::optional<std::uint64_t> steal;
            bool ok = true;
            for (std::size_t i = 1; i <= 8; ++i) {
                auto v = parse_num<std::uint64_t>(f[i]);
                if (!v) {
                    ok = false;
                    break;
                }
                total += *v;
                if (i == 8) {
                    steal = *v;
                }
            }
            if (ok && total > 0 && steal) {
                rep.steal_fraction = static_cast<double>(*steal) / static_cast<double>(total);
            }
            break;
        }
    }

    if (rep.hypervisor == tristate::yes) {
        std::string what = rep.hypervisor_type.value_or("");
        for (const auto& s : {rep.dmi_vendor, rep.dmi_product}) {
            if (s && !s->empty()) {
                what += (what.empty() ? "" : " ") + *s;
            }
        }
        std::string msg = "running under a hypervisor" + (what.empty() ? std::string() : " (" + what + ")") +
                          ": the host can deschedule vCPUs, which no guest setting prevents";
        if (rep.steal_fraction) {
            msg += "; steal time since boot is " + percent(*rep.steal_fraction);
        }
        rep.warnings.push_back(warning{
            "hypervisor", msg,
            "pin each vCPU to a dedicated, isolated host core (e.g. libvirt <vcpupin> plus isolcpus on the host), "
            "or run on bare metal",
            false});
    }
}

void probe_process(const host_fs& fs, kernel_report& rep) {
    rep.timer_slack_ns = read_num<std::uint64_t>(fs, "/proc/self/timerslack_ns");
    if (rep.timer_slack_ns && *rep.timer_slack_ns > default_timer_slack_ns) {
        rep.warnings.push_back(warning{
            "timer",
            "timer slack is " + std::to_string(*rep.timer_slack_ns) + " ns, above the " +
                std::to_string(default_timer_slack_ns) + " ns default: threads that do not set their own "
                "slack wake up late by up to that much",
            "remove TimerSlackNSec= (or the parent's PR_SET_TIMERSLACK) for qrtd; its dispatch threads set "
            "1 ns themselves",
            false});
    }

    auto entries = fs.list("/proc");
    if (!entries) {
        return;
    }
    rep.irqbalance = tristate::no;
    for (const auto& name : *entries) {
        auto pid = parse_num<int>(name);
        if (!pid) {
            continue;
        }
        auto comm = read_opt(fs, "/proc/" + name + "/comm");
        if (comm && trim(*comm) == "irqbalance") {
            rep.irqbalance = tristate::yes;
            rep.irqbalance_pid = *pid;
            break;
        }
    }
    if (rep.irqbalance == tristate::yes) {
        const std::string iso = rep.isolated_requested.empty() ? std::string("<isolated CPUs>")
                                                                : rep.isolated_requested.to_list();
        rep.warnings.push_back(warning{
            "irq",
            "irqbalance is running (pid " + std::to_string(*rep.irqbalance_pid) +
                "): it moves IRQs back onto isolated CPUs unless they are banned",
            "ban the isolated CPUs: IRQBALANCE_BANNED_CPULIST=" + iso +
                " in /etc/default/irqbalance, then restart irqbalance",
            false});
    }
}

void probe_power(const host_fs& fs, kernel_report& rep, const cpu_set& cpus) {
    rep.cpuidle_driver = read_opt(fs, "/sys/devices/system/cpu/cpuidle/current_driver");
    for (unsigned cpu : cpus.cpus()) {
        const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu);
        cpu_power_state p;
        p.cpu = cpu;
        p.governor = read_opt(fs, base + "/cpufreq/scaling_governor");
        if (auto states = fs.list(base + "/cpuidle")) {
            std::vector<std::pair<unsigned, std::string>> order;
            for (const auto& s : *states) {
                if (s.rfind("state", 0) == 0) {
                    if (auto k = parse_num<unsigned>(std::string_view(s).substr(5))) {
                        order.emplace_back(*k, s);
                    }
                }
            }
            std::sort(order.begin(), order.end());
            for (const auto& [k, s] : order) {
                idle_state st;
                st.name = read_opt(fs, base + "/cpuidle/" + s + "/name").value_or(s);
                st.latency_us = read_num<std::uint64_t>(fs, base + "/cpuidle/" + s + "/latency");
                st.disabled = read_num<int>(fs, base + "/cpuidle/" + s + "/disable").value_or(0) != 0;
                p.idle_states.push_back(std::move(st));
            }
        }
        rep.cpu_power.push_back(std::move(p));
    }

    // Governors other than performance, grouped by governor.
    std::vector<std::pair<std::string, cpu_set>> govs;
    // Deepest enabled idle state over the threshold, grouped by (name, latency).
    std::vector<std::pair<std::pair<std::string, std::uint64_t>, cpu_set>> deep;
    for (const auto& p : rep.cpu_power) {
        if (p.governor && *p.governor != "performance") {
            auto it = std::find_if(govs.begin(), govs.end(), [&](const auto& g) { return g.first == *p.governor; });
            if (it == govs.end()) {
                govs.push_back({*p.governor, cpu_set{}});
                it = govs.end() - 1;
            }
            it->second.set(p.cpu);
        }
        const idle_state* worst = nullptr;
        for (const auto& s : p.idle_states) {
            if (!s.disabled && s.latency_us && *s.latency_us > deep_idle_latency_us &&
                (worst == nullptr || *s.latency_us > *worst->latency_us)) {
                worst = &s;
            }
        }
        if (worst != nullptr) {
            const auto key = std::make_pair(worst->name, *worst->latency_us);
            auto it = std::find_if(deep.begin(), deep.end(), [&](const auto& g) { return g.first == key; });
            if (it == deep.end()) {
                deep.push_back({key, cpu_set{}});
                it = deep.end() - 1;
            }
            it->second.set(p.cpu);
        }
    }
    for (const auto& [gov, set] : govs) {
        rep.warnings.push_back(warning{
            "cpufreq",
            cpus_word(set) + " use the " + gov + " cpufreq governor: frequency changes add latency and "
                "make dispatch timing depend on load",
            "cpupower -c " + set.to_list() + " frequency-set -g performance (or echo performance > "
                "/sys/devices/system/cpu/cpuN/cpufreq/scaling_governor for each)",
            false});
    }
    for (const auto& [key, set] : deep) {
        rep.warnings.push_back(warning{
            "cpuidle",
            cpus_word(set) + " may enter idle state " + key.first + " with an exit latency of " +
                std::to_string(key.second) + " us",
            "hold /dev/cpu_dma_latency at 0 while dispatching (qrtd run does), or disable the state under "
            "/sys/devices/system/cpu/cpuN/cpuidle/stateK/disable",
            false});
    }
}

}  // namespace

kernel_report probe_kernel(const host_fs& fs, const cpu_set& isolated) {
    kernel_report rep;
    rep.isolated_requested = isolated;
    rep.online = parse_sys_list(read_opt(fs, "/sys/devices/system/cpu/online"));
    if (rep.online && rep.online->empty()) {
        rep.online.reset();
    }

    probe_version(fs, rep);
    if (rep.preempt_rt == tristate::no) {
        std::string fix = "boot a PREEMPT_RT kernel (Debian: apt-get install linux-image-rt-amd64)";
        if (rep.preempt_model.rfind("PREEMPT_DYNAMIC", 0) == 0 && rep.preempt_model != "PREEMPT_DYNAMIC (full)") {
            fix += "; short of that, add preempt=full to the kernel command line";
        }
        rep.warnings.push_back(warning{
            "kernel",
            "kernel is not PREEMPT_RT (preempt model: " + rep.preempt_model +
                "): wakeup latency on isolated CPUs is bounded only by the longest non-preemptible kernel section",
            fix, true});
    }

    if (rep.online && !isolated.is_subset_of(*rep.online)) {
        rep.warnings.push_back(warning{
            "cpu", "isolated " + cpus_word(isolated - *rep.online) + " not online (online CPUs: " +
                       rep.online->to_list() + ")",
            "bring them online (echo 1 > /sys/devices/system/cpu/cpuN/online) or plan again", false});
    }

    probe_boot_knobs(fs, rep);
    warn_boot_knobs(rep);

    // Per-CPU checks look at the isolated CPUs, or every online CPU when
    // nothing is isolated yet.
    const cpu_set cpus = !isolated.empty() ? isolated : rep.online.value_or(cpu_set{});
    probe_sched(fs, rep, cpus);
    probe_cgroups(fs, rep);
    probe_features(fs, rep);
    probe_hypervisor(fs, rep);
    probe_process(fs, rep);
    probe_power(fs, rep, cpus);
    return rep;
}

std::string format_kernel_report(const kernel_report& r) {
    auto opt = [](const std::optional<std::string>& s) { return s ? *s : std::string("unknown"); };
    auto optn = [](const auto& v) { return v ? std::to_string(*v) : std::string("unknown"); };
    auto knob = [&](const char* name, const boot_knob& k) {
        return std::string(name) + ": cmdline " + (k.cmdline_value ? *k.cmdline_value : std::string("absent")) +
               ", in effect " + list_or_none(k.effective()) + "\n";
    };
    std::string out;
    out += "kernel: " + opt(r.release) + " " + opt(r.version) + "\n";
    out += "preempt_rt: " + std::string(to_string(r.preempt_rt)) + " (model " + r.preempt_model + ")\n";
    out += "online cpus: " + (r.online ? r.online->to_list() : std::string("unknown")) + "\n";
    out += knob("isolcpus", r.isolcpus);
    out += knob("nohz_full", r.nohz_full);
    out += knob("rcu_nocbs", r.rcu_nocbs);
    out += knob("irqaffinity", r.irqaffinity);
    out += "sched_rt_runtime_us: " + optn(r.sched_rt_runtime_us) + " / sched_rt_period_us: " +
           optn(r.sched_rt_period_us) + "\n";
    out += "fair server: " + std::string(to_string(r.fair_server)) + "\n";
    auto mnt = [&](const std::optional<std::string>& m) {
        return m ? *m : std::string(r.mounts_read ? "not mounted" : "unknown");
    };
    out += "cgroup v1 cpuset: " + mnt(r.cgroup_v1_cpuset_mount) + ", cgroup v2: " + mnt(r.cgroup_v2_mount) +
           " (cpuset " + to_string(r.cgroup_v2_cpuset) + ")\n";
    out += "btf: " + std::string(to_string(r.btf)) + ", io_uring: " + to_string(r.io_uring) + "\n";
    out += "hypervisor: " + std::string(to_string(r.hypervisor)) + ", steal since boot: " +
           (r.steal_fraction ? percent(*r.steal_fraction) : std::string("unknown")) + "\n";
    out += "timer slack: " + (r.timer_slack_ns ? std::to_string(*r.timer_slack_ns) + " ns" : std::string("unknown")) +
           "\n";
    out += "irqbalance: " + std::string(to_string(r.irqbalance)) +
           (r.irqbalance_pid ? " (pid " + std::to_string(*r.irqbalance_pid) + ")" : std::string()) + "\n";
    out += "cpuidle driver: " + opt(r.cpuidle_driver) + "\n";
    for (const auto& w : r.warnings) {
        out += "warning: " + w.subsystem + ": " + w.message + "\n  fix: " + w.fix +
               (w.needs_reboot ? " [needs reboot]" : "") + "\n";
    }
    return out;
}

}  // namespace rtcore
