#include "rtcore/irq.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <set>

#include "rtcore/text.hpp"

namespace rtcore {

namespace {

std::string irq_dir(unsigned irq) { return "/proc/irq/" + std::to_string(irq); }
std::string list_path(unsigned irq) { return irq_dir(irq) + "/smp_affinity_list"; }

// A managed IRQ keeps its mask, but the kernel delivers it to one CPU of it
// (effective_affinity_list): say when that one is isolated.
void note_managed_landing(host_fs& fs, irq_outcome& o, const cpu_set& isolated) {
    auto eff = fs.read_line(irq_dir(o.irq) + "/effective_affinity_list");
    if (!eff) {
        return;
    }
    auto e = cpu_set::parse_list(*eff);
    if (!e || !e->intersects(isolated)) {
        return;
    }
    o.lands_on_isolated = (*e & isolated).to_list();
    o.detail += "; delivered to isolated CPU " + o.lands_on_isolated +
                " (effective_affinity_list): its every interrupt lands there until a boot with isolcpus=managed_irq";
}
constexpr const char* default_path = "/proc/irq/default_smp_affinity";

// "/proc/irq/36/smp_affinity_list" -> 36
std::optional<unsigned> irq_of_path(std::string_view p) {
    constexpr std::string_view prefix = "/proc/irq/";
    constexpr std::string_view suffix = "/smp_affinity_list";
    if (p.size() <= prefix.size() + suffix.size() || p.substr(0, prefix.size()) != prefix ||
        p.substr(p.size() - suffix.size()) != suffix) {
        return std::nullopt;
    }
    return parse_decimal<unsigned>(p.substr(prefix.size(), p.size() - prefix.size() - suffix.size()));
}

std::string unquote(std::string s) {
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
        s.pop_back();
    }
    if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) {
        s = s.substr(1, s.size() - 2);
    }
    return s;
}

// KEY=VALUE pairs of a shell-style defaults file (comments and quotes handled).
std::map<std::string, std::string> parse_env_file(std::string_view text) {
    std::map<std::string, std::string> out;
    std::size_t pos = 0;
    while (pos < text.size()) {
        auto nl = text.find('\n', pos);
        auto line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
        pos = nl == std::string_view::npos ? text.size() : nl + 1;
        while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) {
            line.remove_prefix(1);
        }
        if (line.empty() || line.front() == '#') {
            continue;
        }
        if (line.substr(0, 7) == "export ") {
            line.remove_prefix(7);
        }
        const auto eq = line.find('=');
        if (eq == std::string_view::npos) {
            continue;
        }
        out[std::string(line.substr(0, eq))] = unquote(std::string(line.substr(eq + 1)));
    }
    return out;
}

std::optional<cpu_set> banned_from(const std::map<std::string, std::string>& env) {
    if (auto it = env.find("IRQBALANCE_BANNED_CPULIST"); it != env.end()) {
        if (auto s = cpu_set::parse_list(it->second)) {
            return *s;
        }
    }
    if (auto it = env.find("IRQBALANCE_BANNED_CPUS"); it != env.end()) {
        if (auto s = cpu_set::parse_mask(it->second)) {
            return *s;
        }
    }
    return std::nullopt;
}

struct irq_state {
    bool present = false;
    std::string raw;  // exact bytes
    cpu_set cpus;
};

result<irq_state> read_irq(const host_fs& fs, unsigned irq) {
    irq_state s;
    auto text = fs.read(list_path(irq));
    if (!text) {
        if (text.err().code == ENOENT) {
            return s;
        }
        return text.err();
    }
    auto cpus = cpu_set::parse_list(*text);
    if (!cpus) {
        return error::invalid("read " + list_path(irq) + ": " + cpus.err().message);
    }
    s.present = true;
    s.raw = std::move(*text);
    s.cpus = *cpus;
    return s;
}

std::set<unsigned> managed_in(const restore_journal& j) {
    std::set<unsigned> out;
    for (const auto& r : j.records()) {
        if (const auto* m = std::get_if<rec::managed>(&r)) {
            out.insert(m->irq);
        }
    }
    return out;
}

// One write of the housekeeping list to an IRQ, classified.  Returns an
// error only for failures that must stop apply (EROFS, EACCES, ...).
result<irq_outcome> write_irq(host_fs& fs, restore_journal& journal, unsigned irq, const std::string& name,
                              const std::string& before, const cpu_set& isolated, const cpu_set& housekeeping,
                              irq_outcome::action success) {
    irq_outcome o;
    o.irq = irq;
    o.name = name;
    o.before = before;
    auto st = fs.write(list_path(irq), housekeeping.to_list());
    if (!st) {
        const int e = st.err().code;
        if (e == EIO || e == EPERM) {
            o.act = irq_outcome::action::managed;
            o.after = before;
            o.detail = st.err().message + " (kernel-managed IRQ; recorded, not retried)";
            note_managed_landing(fs, o, isolated);
            if (auto a = journal.append(rec::managed{irq}); !a) {
                return a.err();
            }
            return o;
        }
        if (e == EINVAL) {
            o.act = irq_outcome::action::refused;
            o.after = before;
            o.detail = st.err().message + " (the IRQ chip refuses this mask)";
            return o;
        }
        if (e == ENOENT) {
            o.act = irq_outcome::action::gone;
            o.detail = "went away before it could be pinned";
            return o;
        }
        return error{e, st.err().message + " (IRQ " + std::to_string(irq) +
                            (name.empty() ? "" : " " + name) + ")"};
    }
    o.act = success;
    if (fs.dry_run()) {
        o.after = housekeeping.to_list();
        o.detail = "dry run";
        return o;
    }
    auto back = fs.read_line(list_path(irq));
    o.after = back ? *back : housekeeping.to_list();
    // The effective affinity follows at the next interrupt on some IRQ chips.
    if (auto eff = fs.read_line(irq_dir(irq) + "/effective_affinity_list")) {
        if (auto e = cpu_set::parse_list(*eff); e && e->intersects(isolated)) {
            o.detail = "effective affinity still " + e->to_list() + "; it moves at the next interrupt";
        }
    }
    return o;
}

// default_smp_affinity: journaled and moved when it reaches an isolated CPU.
status pin_default(host_fs& fs, restore_journal& journal, const cpu_set& isolated, const cpu_set& housekeeping,
                   irq_report& rep, bool journal_first) {
    auto text = fs.read(default_path);
    if (!text) {
        if (text.err().code == ENOENT) {
            rep.lines.push_back("irq: no " + std::string(default_path) + "; skipped");
            return ok();
        }
        return text.err();
    }
    auto mask = cpu_set::parse_mask(*text);
    if (!mask) {
        return error::invalid("read " + std::string(default_path) + ": " + mask.err().message);
    }
    rep.default_before = std::string(trim(*text));
    rep.default_after = rep.default_before;
    if (!mask->intersects(isolated)) {
        rep.lines.push_back("irq: default_smp_affinity " + rep.default_before +
                            " already keeps new IRQs off the isolated CPUs");
        return ok();
    }
    if (journal_first) {
        if (auto st = journal.save_file(fs, default_path); !st) {
            return st;
        }
    }
    const std::string want = housekeeping.to_mask(cpumask_bits(fs));
    if (auto st = fs.write(default_path, want); !st) {
        return st;
    }
    rep.default_after = want;
    rep.lines.push_back("irq: default_smp_affinity " + rep.default_before + " -> " + want +
                        " (new IRQs start on CPUs " + housekeeping.to_list() + ")");
    return ok();
}

}  // namespace

const char* to_string(irq_outcome::action a) {
    switch (a) {
        case irq_outcome::action::pinned: return "pinned";
        case irq_outcome::action::already_ok: return "already off the isolated CPUs";
        case irq_outcome::action::managed: return "managed";
        case irq_outcome::action::refused: return "refused";
        case irq_outcome::action::gone: return "gone";
        case irq_outcome::action::repinned: return "drifted, re-pinned";
        case irq_outcome::action::new_pinned: return "new, pinned";
        case irq_outcome::action::left_to_irqbalance: return "moved back by irqbalance, not re-pinned";
        case irq_outcome::action::moved_within: return "moved within the housekeeping CPUs";
    }
    return "?";
}

std::string irq_outcome::line() const {
    std::string s = "irq " + std::to_string(irq);
    if (!name.empty()) {
        s += " (" + name + ")";
    }
    s += ": ";
    s += to_string(act);
    if (!before.empty() || !after.empty()) {
        s += " " + (before.empty() ? std::string("-") : std::string(trim(before))) + " -> " +
             (after.empty() ? std::string("-") : std::string(trim(after)));
    }
    if (!detail.empty()) {
        s += "; " + detail;
    }
    return s;
}

std::string irqbalance_status::line() const {
    switch (st) {
        case state::not_running: return "irqbalance: not running";
        case state::coordinated:
            return "irqbalance: running (pid " + std::to_string(pid) + ") with banned CPUs " +
                   banned_in_effect->to_list() + ": coordinated";
        case state::needs_restart:
        case state::not_configured: return "irqbalance: " + advice;
    }
    return "irqbalance: ?";
}

std::size_t irq_report::count(irq_outcome::action a) const {
    return static_cast<std::size_t>(
        std::count_if(irqs.begin(), irqs.end(), [a](const irq_outcome& o) { return o.act == a; }));
}

irqbalance_status probe_irqbalance(const host_fs& fs, const cpu_set& isolated) {
    irqbalance_status s;
    for (const char* p : {"/etc/default/irqbalance", "/etc/sysconfig/irqbalance"}) {
        if (fs.exists(p)) {
            s.config_path = p;
            break;
        }
    }
    std::optional<cpu_set> configured;
    if (!s.config_path.empty()) {
        if (auto text = fs.read(s.config_path)) {
            configured = banned_from(parse_env_file(*text));
        }
    }
    if (auto pids = fs.list("/proc")) {
        for (const auto& name : *pids) {
            const auto pid = parse_decimal<unsigned>(name);
            if (!pid) {
                continue;
            }
            auto comm = fs.read_line("/proc/" + name + "/comm");
            if (comm && *comm == "irqbalance") {
                s.pid = static_cast<pid_t>(*pid);
                break;
            }
        }
    }
    if (s.pid == 0) {
        return s;
    }
    if (auto env = fs.read("/proc/" + std::to_string(s.pid) + "/environ")) {
        std::map<std::string, std::string> vars;
        std::string_view rest = *env;
        while (!rest.empty()) {
            const auto z = rest.find('\0');
            const auto item = rest.substr(0, z);
            const auto eq = item.find('=');
            if (eq != std::string_view::npos) {
                vars[std::string(item.substr(0, eq))] = std::string(item.substr(eq + 1));
            }
            if (z == std::string_view::npos) {
                break;
            }
            rest.remove_prefix(z + 1);
        }
        s.banned_in_effect = banned_from(vars);
    }
    const std::string file = s.config_path.empty() ? std::string("/etc/default/irqbalance") : s.config_path;
    const std::string pid_text = "(pid " + std::to_string(s.pid) + ")";
    if (s.banned_in_effect && isolated.is_subset_of(*s.banned_in_effect)) {
        s.st = irqbalance_status::state::coordinated;
    } else if (configured && isolated.is_subset_of(*configured)) {
        s.st = irqbalance_status::state::needs_restart;
        s.advice = "running " + pid_text + " without the banned CPUs that " + file + " sets (" +
                   configured->to_list() + "); run `systemctl restart irqbalance` (qrtd does not restart "
                   "services); until then it may move IRQs back onto CPUs " + isolated.to_list();
    } else {
        s.st = irqbalance_status::state::not_configured;
        s.advice = "running " + pid_text + " and not banning the isolated CPUs: set "
                   "IRQBALANCE_BANNED_CPULIST=" + isolated.to_list() + " in " + file +
                   " (irqbalance >= 1.8; older versions: IRQBALANCE_BANNED_CPUS=" +
                   isolated.to_mask(cpumask_bits(fs)) + ") and run `systemctl restart irqbalance`; "
                   "qrtd does not restart services, and will not fight irqbalance over IRQs it moves back";
    }
    return s;
}

result<std::vector<unsigned>> list_irqs(const host_fs& fs) {
    auto names = fs.list("/proc/irq");
    if (!names) {
        return names.err();
    }
    std::vector<unsigned> out;
    for (const auto& n : *names) {
        if (const auto irq = parse_decimal<unsigned>(n); irq && fs.exists(list_path(*irq))) {
            out.push_back(*irq);
        }
    }
    std::sort(out.begin(), out.end());
    return out;
}

std::map<unsigned, std::string> irq_names(const host_fs& fs) {
    std::map<unsigned, std::string> out;
    if (auto text = fs.read("/proc/interrupts")) {
        std::string_view rest = *text;
        while (!rest.empty()) {
            const auto nl = rest.find('\n');
            auto line = rest.substr(0, nl);
            rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
            while (!line.empty() && line.front() == ' ') {
                line.remove_prefix(1);
            }
            const auto colon = line.find(':');
            const auto irq = colon == std::string_view::npos ? std::nullopt
                                                             : parse_decimal<unsigned>(line.substr(0, colon));
            if (!irq) {
                continue;
            }
            // The kernel prints the action names after two spaces; the fields
            // before them (counts, chip, hwirq, type) are padded.  So the names
            // are what follows the last run of two or more spaces, provided
            // that is not a per-CPU count.
            while (!line.empty() && line.back() == ' ') {
                line.remove_suffix(1);
            }
            const auto gap = line.rfind("  ");
            if (gap == std::string_view::npos || gap < colon) {
                continue;
            }
            auto names = line.substr(gap + 2);
            if (names.empty() || parse_decimal<unsigned>(names)) {
                continue;
            }
            out[*irq] = std::string(names);
        }
    }
    if (auto irqs = list_irqs(fs)) {
        for (unsigned irq : *irqs) {
            if (out.count(irq) != 0) {
                continue;
            }
            // Fallback: each action has a directory /proc/irq/<n>/<name>.
            if (auto ents = fs.list(irq_dir(irq))) {
                std::string names;
                for (const auto& e : *ents) {
                    if (fs.is_dir(irq_dir(irq) + "/" + e)) {
                        names += (names.empty() ? "" : ", ") + e;
                    }
                }
                if (!names.empty()) {
                    out[irq] = names;
                }
            }
        }
    }
    return out;
}

unsigned cpumask_bits(const host_fs& fs) {
    for (const char* p : {"/sys/devices/system/cpu/possible", "/sys/devices/system/cpu/online"}) {
        if (auto text = fs.read_line(p)) {
            if (auto s = cpu_set::parse_list(*text); s && !s->empty()) {
                return static_cast<unsigned>(s->last()) + 1;
            }
        }
    }
    return 32;
}

result<irq_report> pin_irqs(host_fs& fs, restore_journal& journal, const cpu_set& isolated,
                            const cpu_set& housekeeping) {
    irq_report rep;
    rep.irqbalance = probe_irqbalance(fs, isolated);
    auto irqs = list_irqs(fs);
    if (!irqs) {
        return irqs.err();
    }
    const auto names = irq_names(fs);
    const auto managed = managed_in(journal);

    // Read everything first, journal every original in one durable batch,
    // and only then write.
    std::vector<std::pair<unsigned, irq_state>> todo;
    std::vector<std::string> originals;
    for (unsigned irq : *irqs) {
        auto s = read_irq(fs, irq);
        if (!s) {
            return s.err();
        }
        const auto name_it = names.find(irq);
        const std::string name = name_it == names.end() ? std::string() : name_it->second;
        if (!s->present) {
            continue;
        }
        if (!s->cpus.intersects(isolated)) {
            rep.irqs.push_back(irq_outcome{irq, name, irq_outcome::action::already_ok, s->raw, s->raw, ""});
            continue;
        }
        if (managed.count(irq) != 0) {
            rep.irqs.push_back(irq_outcome{irq, name, irq_outcome::action::managed, s->raw, s->raw,
                                           "recorded as kernel-managed earlier; not retried"});
            note_managed_landing(fs, rep.irqs.back(), isolated);
            continue;
        }
        originals.push_back(list_path(irq));
        todo.emplace_back(irq, std::move(*s));
    }
    if (fs.exists(default_path)) {
        originals.insert(originals.begin(), default_path);
    }
    if (auto st = journal.save_files(fs, originals); !st) {
        return st.err();
    }
    if (auto st = pin_default(fs, journal, isolated, housekeeping, rep, false); !st) {
        return st.err();
    }
    for (auto& [irq, s] : todo) {
        const auto name_it = names.find(irq);
        auto o = write_irq(fs, journal, irq, name_it == names.end() ? std::string() : name_it->second, s.raw,
                           isolated, housekeeping, irq_outcome::action::pinned);
        if (!o) {
            return o.err();
        }
        rep.irqs.push_back(std::move(*o));
    }
    std::sort(rep.irqs.begin(), rep.irqs.end(),
              [](const irq_outcome& a, const irq_outcome& b) { return a.irq < b.irq; });
    for (const auto& o : rep.irqs) {
        rep.lines.push_back(o.line());
    }
    rep.lines.push_back("irq: " + std::to_string(rep.count(irq_outcome::action::pinned)) + " pinned to CPUs " +
                        housekeeping.to_list() + ", " + std::to_string(rep.count(irq_outcome::action::managed)) +
                        " managed, " + std::to_string(rep.count(irq_outcome::action::refused)) + " refused, " +
                        std::to_string(rep.count(irq_outcome::action::already_ok)) + " already off CPUs " +
                        isolated.to_list());
    rep.lines.push_back(rep.irqbalance.line());
    return rep;
}

result<irq_report> verify_irqs(host_fs& fs, restore_journal& journal, const cpu_set& isolated,
                               const cpu_set& housekeeping, bool repin_despite_irqbalance) {
    irq_report rep;
    rep.irqbalance = probe_irqbalance(fs, isolated);
    const bool irqbalance_fights = !repin_despite_irqbalance &&
                                   (rep.irqbalance.st == irqbalance_status::state::needs_restart ||
                                    rep.irqbalance.st == irqbalance_status::state::not_configured);
    auto irqs = list_irqs(fs);
    if (!irqs) {
        return irqs.err();
    }
    const auto names = irq_names(fs);
    const auto managed = managed_in(journal);
    std::set<unsigned> known;
    for (const auto& r : journal.records()) {
        if (const auto* f = std::get_if<rec::file>(&r)) {
            if (auto n = irq_of_path(f->path)) {
                known.insert(*n);
            }
        }
    }
    // default_smp_affinity first, so IRQs created meanwhile land right.
    if (auto st = pin_default(fs, journal, isolated, housekeeping, rep, true); !st) {
        return st.err();
    }
    std::set<unsigned> present;
    for (unsigned irq : *irqs) {
        present.insert(irq);
        auto s = read_irq(fs, irq);
        if (!s) {
            return s.err();
        }
        if (!s->present) {
            continue;
        }
        const auto name_it = names.find(irq);
        const std::string name = name_it == names.end() ? std::string() : name_it->second;
        const bool is_known = known.count(irq) != 0;
        if (!s->cpus.intersects(isolated)) {
            if (is_known && !(s->cpus == housekeeping)) {
                rep.irqs.push_back(irq_outcome{irq, name, irq_outcome::action::moved_within, housekeeping.to_list(),
                                               s->raw, "harmless: still off the isolated CPUs"});
            }
            continue;
        }
        if (managed.count(irq) != 0) {
            rep.irqs.push_back(irq_outcome{irq, name, irq_outcome::action::managed, s->raw, s->raw,
                                           "kernel-managed; not retried"});
            note_managed_landing(fs, rep.irqs.back(), isolated);
            continue;
        }
        if (is_known && irqbalance_fights) {
            rep.irqs.push_back(irq_outcome{irq, name, irq_outcome::action::left_to_irqbalance, housekeeping.to_list(),
                                           s->raw, "irqbalance " + rep.irqbalance.advice});
            continue;
        }
        if (!is_known) {
            if (auto st = journal.save_file(fs, list_path(irq)); !st) {
                return st.err();
            }
        }
        auto o = write_irq(fs, journal, irq, name, s->raw, isolated, housekeeping,
                           is_known ? irq_outcome::action::repinned : irq_outcome::action::new_pinned);
        if (!o) {
            return o.err();
        }
        rep.irqs.push_back(std::move(*o));
    }
    for (unsigned irq : known) {
        if (present.count(irq) == 0) {
            rep.irqs.push_back(irq_outcome{irq, "", irq_outcome::action::gone, "", "", "no longer in /proc/irq"});
        }
    }
    for (const auto& o : rep.irqs) {
        rep.lines.push_back(o.line());
    }
    rep.lines.push_back("irq: verify: " + std::to_string(rep.count(irq_outcome::action::repinned)) +
                        " drifted and re-pinned, " + std::to_string(rep.count(irq_outcome::action::new_pinned)) +
                        " new and pinned, " + std::to_string(rep.count(irq_outcome::action::left_to_irqbalance)) +
                        " left to irqbalance, " + std::to_string(rep.count(irq_outcome::action::managed)) +
                        " managed on isolated CPUs");
    rep.lines.push_back(rep.irqbalance.line());
    return rep;
}

}  // namespace rtcore
