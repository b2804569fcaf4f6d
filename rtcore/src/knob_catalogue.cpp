// The catalogue of runtime knobs: see knob_catalogue.hpp.

#include "rtcore/knob_catalogue.hpp"

#include <algorithm>
#include <charconv>
#include <system_error>

#include "rtcore/cpu_set.hpp"
#include "rtcore/text.hpp"

namespace rtcore {

using namespace knob_path;

namespace {

// "<prefix><middle><suffix>" with middle accepted by ok.
bool shaped(std::string_view p, std::string_view prefix, std::string_view suffix, bool (*ok)(std::string_view)) {
    if (p.size() <= prefix.size() + suffix.size() || p.substr(0, prefix.size()) != prefix ||
        p.substr(p.size() - suffix.size()) != suffix) {
        return false;
    }
    return ok(p.substr(prefix.size(), p.size() - prefix.size() - suffix.size()));
}

}  // namespace

bool workqueue_name(std::string_view s) {
    if (s.empty() || s.size() > 64 || s.front() == '.' || s == "power" || s == "subsystem") {
        return false;
    }
    return std::all_of(s.begin(), s.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
               c == '-' || c == '.' || c == ':';
    });
}

bool enable_knob(knob_options& o, std::string_view name) {
    if (name == "workqueues") {
        o.workqueues = true;
    } else if (name == "kthreads") {
        o.kthreads = true;
    } else if (name == "vm_stat_interval") {
        o.vm_stat_interval = true;
    } else if (name == "timer_migration") {
        o.timer_migration = true;
    } else if (name == "watchdog_cpumask") {
        o.watchdog_cpumask = true;
    } else if (name == "mce_ignore_ce") {
        o.mce_ignore_ce = true;
    } else {
        return false;
    }
    return true;
}

std::optional<knob_path_info> knob_at(std::string_view p) {
    if (p == wq_global) {
        return knob_path_info{"workqueue cpumask", knob_form::cpumask};
    }
    if (shaped(p, "/sys/devices/virtual/workqueue/", "/cpumask", workqueue_name)) {
        return knob_path_info{"workqueue cpumask", knob_form::cpumask};
    }
    if (p == stat_interval) {
        return knob_path_info{"vm.stat_interval", knob_form::integer};
    }
    if (p == timer_migration) {
        return knob_path_info{"kernel.timer_migration", knob_form::integer};
    }
    if (p == watchdog_cpumask) {
        return knob_path_info{"kernel.watchdog_cpumask", knob_form::cpulist};
    }
    if (p == rt_runtime) {
        return knob_path_info{"kernel.sched_rt_runtime_us", knob_form::integer};
    }
    if (shaped(p, "/sys/devices/system/machinecheck/machinecheck", "/ignore_ce", decimal_id)) {
        return knob_path_info{"machinecheck ignore_ce", knob_form::integer};
    }
    if (shaped(p, "/sys/kernel/debug/sched/fair_server/cpu", "/runtime", decimal_id)) {
        return knob_path_info{"fair server runtime", knob_form::integer};
    }
    return std::nullopt;
}

bool same_knob_value(knob_form form, std::string_view a, std::string_view b) {
    a = trim(a);
    b = trim(b);
    if (a == b) {
        return true;
    }
    switch (form) {
        case knob_form::cpumask: {
            auto x = cpu_set::parse_mask(a);
            auto y = cpu_set::parse_mask(b);
            return x && y && *x == *y;
        }
        case knob_form::cpulist: {
            auto x = cpu_set::parse_list(a);
            auto y = cpu_set::parse_list(b);
            return x && y && *x == *y;
        }
        case knob_form::integer: {
            long long x = 0;
            long long y = 0;
            auto [pa, ea] = std::from_chars(a.data(), a.data() + a.size(), x);
            auto [pb, eb] = std::from_chars(b.data(), b.data() + b.size(), y);
            return ea == std::errc{} && eb == std::errc{} && pa == a.data() + a.size() &&
                   pb == b.data() + b.size() && x == y;
        }
    }
    return false;
}

}  // namespace rtcore
