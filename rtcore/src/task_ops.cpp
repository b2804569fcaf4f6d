#include "rtcore/task_ops.hpp"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>

#include "rtcore/text.hpp"

namespace rtcore {

namespace {

constexpr std::uint64_t pf_kthread = 0x00200000;         // include/linux/sched.h
constexpr std::uint64_t pf_no_setaffinity = 0x04000000;  // include/linux/sched.h

}  // namespace

std::string cgroup_tasks_file(const host_fs& fs, std::string_view dir) {
    const std::string v1 = join_path(dir, "tasks");
    const std::string v2 = join_path(dir, "cgroup.threads");
    if (fs.exists(v1)) {
        return v1;
    }
    if (fs.exists(v2)) {
        return v2;
    }
    // Not created yet (dry run): a child has the files of its parent's version.
    std::string parent(dir);
    while (!parent.empty() && parent.back() == '/') {
        parent.pop_back();
    }
    parent = parent.substr(0, parent.rfind('/'));
    return fs.exists(join_path(parent, "tasks")) ? v1 : v2;
}

result<task_info> parse_proc_stat(std::string_view line) {
    const auto open = line.find('(');
    const auto close = line.rfind(')');
    if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
        return error::invalid("/proc stat line has no (comm): \"" + std::string(line.substr(0, 64)) + "\"");
    }
    task_info t;
    const auto tid = parse_decimal<pid_t>(line.substr(0, open == 0 ? 0 : open - 1));
    if (!tid) {
        return error::invalid("/proc stat line: bad pid in \"" + std::string(line.substr(0, 64)) + "\"");
    }
    t.tid = *tid;
    t.comm = std::string(line.substr(open + 1, close - open - 1));
    // Fields after ") ": state(3) ppid(4) ... flags(9) ... starttime(22).
    std::vector<std::string_view> f;
    std::string_view rest = line.substr(close + 1);
    while (!rest.empty()) {
        while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\n')) {
            rest.remove_prefix(1);
        }
        const auto sp = rest.find_first_of(" \n");
        if (!rest.empty()) {
            f.push_back(rest.substr(0, sp));
        }
        if (sp == std::string_view::npos) {
            break;
        }
        rest.remove_prefix(sp);
    }
    const auto flags = f.size() < 20 ? std::nullopt : parse_decimal<std::uint64_t>(f[6]);
    const auto start = f.size() < 20 ? std::nullopt : parse_decimal<std::uint64_t>(f[19]);
    if (!flags || !start) {
        return error::invalid("/proc/" + std::to_string(t.tid) + "/stat: too few or bad fields");
    }
    t.start_ticks = *start;
    t.kernel_thread = (*flags & pf_kthread) != 0;
    t.per_cpu = (*flags & pf_no_setaffinity) != 0;
    t.tgid = t.tid;
    return t;
}

// ---------------------------------------------------------------- real

namespace {

// The first number after "<key>" at the start of a line of
// /proc/<tid>/status ("Tgid:\t812", "Uid:\t999\t999\t999\t999").
template <typename T>
std::optional<T> status_number(std::string_view status, std::string_view key) {
    std::size_t pos = 0;
    while (pos < status.size()) {
        const auto nl = status.find('\n', pos);
        auto line = status.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
        if (line.substr(0, key.size()) == key) {
            line.remove_prefix(key.size());
            while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) {
                line.remove_prefix(1);
            }
            return parse_decimal<T>(line.substr(0, line.find_first_of(" \t")));
        }
        if (nl == std::string_view::npos) {
            break;
        }
        pos = nl + 1;
    }
    return std::nullopt;
}

}  // namespace

result<std::vector<task_info>> real_task_ops::list_tasks(const host_fs& fs) {
    auto pids = fs.list("/proc");
    if (!pids) {
        return pids.err();
    }
    std::vector<task_info> out;
    for (const auto& pid_name : *pids) {
        const auto tgid = parse_decimal<unsigned>(pid_name);  // digits only: no sign
        if (!tgid) {
            continue;
        }
        auto tids = fs.list("/proc/" + pid_name + "/task");
        if (!tids) {
            continue;  // exited meanwhile
        }
        for (const auto& tid_name : *tids) {
            auto stat = fs.read("/proc/" + pid_name + "/task/" + tid_name + "/stat");
            if (!stat) {
                continue;
            }
            auto t = parse_proc_stat(*stat);
            if (!t) {
                return t.err();
            }
            t->tgid = static_cast<pid_t>(*tgid);
            out.push_back(std::move(*t));
        }
    }
    return out;
}

result<task_info> real_task_ops::task(const host_fs& fs, pid_t tid) {
    auto stat = fs.read("/proc/" + std::to_string(tid) + "/stat");
    if (!stat) {
        return error::from_errno(ESRCH, "task " + std::to_string(tid));
    }
    auto t = parse_proc_stat(*stat);
    if (!t) {
        return t.err();
    }
    if (auto st = fs.read("/proc/" + std::to_string(tid) + "/status")) {
        if (const auto tgid = status_number<pid_t>(*st, "Tgid:")) {
            t->tgid = *tgid;
        }
    }
    return t;
}

result<uid_t> real_task_ops::real_uid(const host_fs& fs, pid_t tid) {
    auto st = fs.read("/proc/" + std::to_string(tid) + "/status");
    if (!st) {
        return error::from_errno(ESRCH, "task " + std::to_string(tid));
    }
    const auto uid = status_number<uid_t>(*st, "Uid:");
    if (!uid) {
        return error{EINVAL, "/proc/" + std::to_string(tid) + "/status has no Uid: line"};
    }
    return *uid;
}

result<cpu_set> real_task_ops::affinity(pid_t tid) {
    cpu_set_t* set = CPU_ALLOC(cpu_set::max_cpus);
    if (set == nullptr) {
        return error::from_errno(ENOMEM, "CPU_ALLOC");
    }
    const std::size_t size = CPU_ALLOC_SIZE(cpu_set::max_cpus);
    CPU_ZERO_S(size, set);
    if (::sched_getaffinity(tid, size, set) < 0) {
        const int e = errno;
        CPU_FREE(set);
        return error::from_errno(e, "sched_getaffinity " + std::to_string(tid));
    }
    cpu_set out;
    for (unsigned c = 0; c < cpu_set::max_cpus; ++c) {
        if (CPU_ISSET_S(c, size, set)) {
            out.set(c);
        }
    }
    CPU_FREE(set);
    return out;
}

status real_task_ops::set_affinity(pid_t tid, const cpu_set& cpus) {
    cpu_set_t* set = CPU_ALLOC(cpu_set::max_cpus);
    if (set == nullptr) {
        return error::from_errno(ENOMEM, "CPU_ALLOC");
    }
    const std::size_t size = CPU_ALLOC_SIZE(cpu_set::max_cpus);
    CPU_ZERO_S(size, set);
    for (unsigned c : cpus.cpus()) {
        CPU_SET_S(c, size, set);
    }
    const int rc = ::sched_setaffinity(tid, size, set);
    const int e = errno;
    CPU_FREE(set);
    if (rc < 0) {
        return error::from_errno(e, "sched_setaffinity " + std::to_string(tid) + " " + cpus.to_list());
    }
    return ok();
}

result<std::vector<pid_t>> real_task_ops::cgroup_tasks(const host_fs& fs, std::string_view dir) {
    const std::string file = cgroup_tasks_file(fs, dir);
    auto text = fs.read(file);
    if (!text) {
        return text.err();
    }
    std::vector<pid_t> out;
    std::string_view rest = *text;
    while (!rest.empty()) {
        const auto nl = rest.find('\n');
        const auto line = rest.substr(0, nl);
        if (!line.empty()) {
            const auto tid = parse_decimal<pid_t>(line);
            if (!tid) {
                return error::invalid(file + ": \"" + std::string(line) + "\" is not a thread id");
            }
            out.push_back(*tid);
        }
        if (nl == std::string_view::npos) {
            break;
        }
        rest.remove_prefix(nl + 1);
    }
    return out;
}

status real_task_ops::attach(host_fs& fs, std::string_view dir, pid_t tid) {
    return fs.write(cgroup_tasks_file(fs, dir), std::to_string(tid));
}

status real_task_ops::make_cgroup(host_fs& fs, std::string_view dir) {
    return fs.make_dir(dir);
}

status real_task_ops::remove_cgroup(host_fs& fs, std::string_view dir) {
    return fs.remove_dir(dir);
}

// ---------------------------------------------------------------- fake

void fake_task_ops::add_task(pid_t tid, std::string comm, cpu_set affinity, std::string cgroup,
                             bool kernel_thread, bool pinned_kthread) {
    fake_task t;
    t.info.tid = tid;
    t.info.tgid = tid;
    t.info.start_ticks = 1000 + static_cast<std::uint64_t>(tid);
    t.info.comm = std::move(comm);
    t.info.kernel_thread = kernel_thread;
    t.info.per_cpu = pinned_kthread;
    t.affinity = affinity;
    t.cgroup = std::move(cgroup);
    t.pinned_kthread = pinned_kthread;
    _tasks[tid] = std::move(t);
}

void fake_task_ops::mutation() {
    ++_mutations;
    if (before_mutation) {
        before_mutation(_mutations);
    }
}

result<std::vector<task_info>> fake_task_ops::list_tasks(const host_fs&) {
    std::vector<task_info> out;
    for (const auto& [tid, t] : _tasks) {
        out.push_back(t.info);
    }
    return out;
}

result<task_info> fake_task_ops::task(const host_fs&, pid_t tid) {
    auto it = _tasks.find(tid);
    if (it == _tasks.end()) {
        return error::from_errno(ESRCH, "task " + std::to_string(tid));
    }
    return it->second.info;
}

result<uid_t> fake_task_ops::real_uid(const host_fs&, pid_t tid) {
    auto it = _tasks.find(tid);
    if (it == _tasks.end()) {
        return error::from_errno(ESRCH, "task " + std::to_string(tid));
    }
    return it->second.uid;
}

result<cpu_set> fake_task_ops::affinity(pid_t tid) {
    auto it = _tasks.find(tid);
    if (it == _tasks.end()) {
        return error::from_errno(ESRCH, "sched_getaffinity " + std::to_string(tid));
    }
    return it->second.affinity;
}

status fake_task_ops::set_affinity(pid_t tid, const cpu_set& cpus) {
    mutation();
    ++_set_affinity_calls;
    const std::string what = "sched_setaffinity " + std::to_string(tid) + " " + cpus.to_list();
    auto it = _tasks.find(tid);
    if (it == _tasks.end()) {
        return error::from_errno(ESRCH, what);
    }
    if (it->second.pinned_kthread || cpus.empty()) {
        return error::from_errno(EINVAL, what);
    }
    it->second.affinity = cpus;
    return ok();
}

result<std::vector<pid_t>> fake_task_ops::cgroup_tasks(const host_fs& fs, std::string_view dir) {
    if (!fs.is_dir(dir)) {
        return error::from_errno(ENOENT, "open " + cgroup_tasks_file(fs, dir));
    }
    std::vector<pid_t> out;
    for (const auto& [tid, t] : _tasks) {
        if (t.cgroup == dir) {
            out.push_back(tid);
        }
    }
    return out;
}

status fake_task_ops::attach(host_fs& fs, std::string_view dir, pid_t tid) {
    if (fs.dry_run()) {
        return fs.write(cgroup_tasks_file(fs, dir), std::to_string(tid));
    }
    mutation();
    const std::string what = "write " + cgroup_tasks_file(fs, dir) + " " + std::to_string(tid);
    if (!fs.is_dir(dir)) {
        return error::from_errno(ENOENT, what);
    }
    auto it = _tasks.find(tid);
    if (it == _tasks.end()) {
        return error::from_errno(ESRCH, what);
    }
    if (it->second.pinned_kthread) {
        return error::from_errno(EINVAL, what);
    }
    // A v1 cpuset sets the task's affinity to its CPUs on attach.
    const std::string cpus_file = std::string(dir) + "/cpuset.cpus";
    if (fs.exists(std::string(dir) + "/tasks") && fs.exists(cpus_file)) {
        auto text = fs.read_line(cpus_file);
        if (!text) {
            return text.err();
        }
        auto cpus = cpu_set::parse_list(*text);
        if (!cpus) {
            return cpus.err();
        }
        if (cpus->empty()) {
            return error::from_errno(ENOSPC, what);
        }
        it->second.affinity = *cpus;
    }
    it->second.cgroup = std::string(dir);
    return ok();
}

status fake_task_ops::make_cgroup(host_fs& fs, std::string_view dir) {
    if (fs.dry_run()) {
        return fs.make_dir(dir);
    }
    mutation();
    namespace sfs = std::filesystem;
    const sfs::path p = fs.resolve(dir);
    std::error_code ec;
    if (sfs::is_directory(p, ec)) {
        return ok();
    }
    if (!sfs::create_directory(p, ec)) {
        return error::from_errno(ec ? ec.value() : EIO, "mkdir " + std::string(dir));
    }
    const bool v2 = sfs::exists(p.parent_path() / "cgroup.controllers");
    std::vector<std::pair<const char*, const char*>> files;
    if (v2) {
        files = {{"cgroup.procs", ""},           {"cgroup.threads", ""},
                 {"cgroup.controllers", "cpuset\n"}, {"cgroup.subtree_control", "\n"},
                 {"cpuset.cpus", "\n"},           {"cpuset.mems", "\n"},
                 {"cpuset.cpus.partition", "member\n"}};
    } else {
        files = {{"tasks", ""},
                 {"cgroup.procs", ""},
                 {"cpuset.cpus", "\n"},
                 {"cpuset.mems", "\n"},
                 {"cpuset.cpu_exclusive", "0\n"},
                 {"cpuset.mem_exclusive", "0\n"},
                 {"cpuset.sched_load_balance", "1\n"}};
    }
    for (const auto& [name, content] : files) {
        std::ofstream(p / name, std::ios::binary) << content;
    }
    return ok();
}

status fake_task_ops::remove_cgroup(host_fs& fs, std::string_view dir) {
    if (fs.dry_run()) {
        return fs.remove_dir(dir);
    }
    mutation();
    namespace sfs = std::filesystem;
    const sfs::path p = fs.resolve(dir);
    std::error_code ec;
    if (!sfs::is_directory(p, ec)) {
        return ok();
    }
    for (const auto& [tid, t] : _tasks) {
        if (t.cgroup == dir) {
            return error::from_errno(EBUSY, "rmdir " + std::string(dir));
        }
    }
    for (const auto& ent : sfs::directory_iterator(p, ec)) {
        if (ent.is_directory()) {
            return error::from_errno(EBUSY, "rmdir " + std::string(dir));
        }
    }
    std::vector<sfs::path> files;
    for (const auto& ent : sfs::directory_iterator(p, ec)) {
        files.push_back(ent.path());
    }
    for (const auto& f : files) {
        sfs::remove(f, ec);
    }
    if (!sfs::remove(p, ec)) {
        return error::from_errno(ec ? ec.value() : EIO, "rmdir " + std::string(dir));
    }
    return ok();
}

}  // namespace rtcore
