#include "rtcore/partition_plan.hpp"

#include <algorithm>
#include <tuple>
#include <utility>

namespace rtcore {

namespace {

std::string cores_word(std::size_t n) { return n == 1 ? "core" : "cores"; }

std::string cpus_word(const cpu_set& s) {
    return (s.count() == 1 ? "CPU " : "CPUs ") + s.to_list();
}

std::string core_name(const topology& topo, const topo_core& c) {
    std::string out = "core " + std::to_string(c.index) + " (" + cpus_word(c.cpus);
    if (topo.packages().size() > 1) {
        out += ", package " + std::to_string(c.package);
    }
    return out + ")";
}

error refuse(std::string why) { return error::invalid("plan: " + std::move(why)); }

}  // namespace

std::string recommended_kernel_cmdline(const cpu_set& isolated, const cpu_set& housekeeping) {
    const std::string iso = isolated.to_list();
    return "isolcpus=managed_irq,domain," + iso + " nohz_full=" + iso + " rcu_nocbs=" + iso +
           " irqaffinity=" + housekeeping.to_list();
}

result<partition_plan> plan_partition(const topology& topo, const plan_request& req) {
    partition_plan plan;
    plan.online = topo.online_cpus();
    const auto& cores = topo.cores();
    const std::string online_list = plan.online.to_list();

    if (req.min_housekeeping_cores < 1) {
        return refuse("min_housekeeping_cores is 0; at least 1 whole core must stay housekeeping");
    }
    if (req.rt_cpu_count < 1) {
        return refuse("rt_cpu_count is 0; at least 1 RT thread needs an isolated CPU");
    }
    if (!req.rt_cpus.empty() && req.rt_cpus.size() != req.rt_cpu_count) {
        return refuse(std::to_string(req.rt_cpus.size()) + " RT CPUs given for " +
                      std::to_string(req.rt_cpu_count) + " RT threads; give one per RT thread or none");
    }
    for (std::size_t q = 0; q < req.rt_cpus.size(); ++q) {
        const unsigned cpu = req.rt_cpus[q];
        if (!plan.online.test(cpu)) {
            return refuse("RT CPU " + std::to_string(cpu) + " of RT thread " + std::to_string(q) +
                          " is not online (online CPUs: " + online_list + ")");
        }
        for (std::size_t p = 0; p < q; ++p) {
            if (req.rt_cpus[p] == cpu) {
                return refuse("RT CPU " + std::to_string(cpu) + " is requested for RT thread " +
                              std::to_string(p) + " and RT thread " + std::to_string(q) +
                              "; each RT thread needs a CPU of its own");
            }
        }
    }
    if (cores.size() <= req.min_housekeeping_cores) {
        return refuse("topology " + topo.source() + " has " + std::to_string(cores.size()) + " " +
                      cores_word(cores.size()) + " (" + cpus_word(plan.online) + ") and " +
                      std::to_string(req.min_housekeeping_cores) + " must stay housekeeping, so no " +
                      "whole core is left to isolate; an RT CPU needs a host with at "
                      "least " + std::to_string(req.min_housekeeping_cores + 1) + " cores");
    }

    // Locality hint.
    if (req.near_device) {
        auto near = topo.cpus_near_device(*req.near_device);
        if (!near) {
            return refuse("locality hint: " + near.err().message);
        }
        plan.near_device_cpus = *near;
        if (plan.near_device_cpus == plan.online) {
            plan.reasons.push_back("device " + *req.near_device + " is equally near every CPU (" +
                                   online_list + "), so locality does not narrow the choice");
        } else {
            plan.reasons.push_back("device " + *req.near_device + " is local to " +
                                   cpus_word(plan.near_device_cpus) +
                                   "; cores there are preferred so the RT threads avoid the cross-socket "
                                   "interconnect");
        }
    }
    const bool locality = !plan.near_device_cpus.empty() && !(plan.near_device_cpus == plan.online);
    auto is_near = [&](const topo_core& c) { return locality && c.cpus.is_subset_of(plan.near_device_cpus); };

    // Isolated cores, best first, for handing out RT CPUs.
    std::vector<const topo_core*> choice_order;
    if (req.isolated) {
        // Explicit list.
        const cpu_set& wanted = *req.isolated;
        if (wanted.empty()) {
            return refuse("the isolated CPU list is empty");
        }
        const cpu_set unknown = wanted - plan.online;
        if (!unknown.empty()) {
            return refuse("isolated " + cpus_word(unknown) + (unknown.count() == 1 ? " is" : " are") +
                          " not online (online CPUs: " + online_list + ")");
        }
        plan.isolated = wanted;
        for (const auto& c : cores) {
            if (!c.cpus.intersects(wanted) || c.cpus.is_subset_of(wanted)) {
                continue;
            }
            const cpu_set in = c.cpus & wanted;
            const cpu_set out = c.cpus - wanted;
            if (req.on_split_core == plan_request::split_core::refuse) {
                return refuse("isolated list " + wanted.to_list() + " splits " + core_name(topo, c) +
                              ": " + cpus_word(in) + " would be isolated while SMT sibling " +
                              cpus_word(out) + " runs housekeeping work on the same execution units "
                              "and L1/L2 cache; list the whole core (" + c.cpus.to_list() +
                              ") or allow widening");
            }
            plan.isolated |= c.cpus;
            plan.reasons.push_back("widened the isolated list to the whole of " + core_name(topo, c) +
                                   ": " + cpus_word(in) + " was listed without SMT sibling " +
                                   cpus_word(out) + ", which would share its execution units and "
                                   "L1/L2 cache with housekeeping work");
        }
        plan.reasons.push_back("isolated " + cpus_word(plan.isolated) + " as requested");
        if (locality && !plan.isolated.is_subset_of(plan.near_device_cpus)) {
            plan.reasons.push_back("note: isolated " + cpus_word(plan.isolated - plan.near_device_cpus) +
                                   " not near device " + *req.near_device +
                                   "; its traffic crosses the interconnect");
        }
    } else {
        // Choose whole cores.
        std::vector<const topo_core*> chosen;
        for (std::size_t q = 0; q < req.rt_cpus.size(); ++q) {
            const topo_core* c = topo.core_of(req.rt_cpus[q]);
            if (std::find(chosen.begin(), chosen.end(), c) == chosen.end()) {
                chosen.push_back(c);
                plan.reasons.push_back("isolated " + core_name(topo, *c) + ": it holds CPU " +
                                       std::to_string(req.rt_cpus[q]) +
                                       ", requested as the CPU of RT thread " + std::to_string(q));
            }
        }
        const std::size_t want = req.isolate_cores ? *req.isolate_cores
                                                   : std::max<std::size_t>(req.rt_cpu_count, chosen.size());
        if (want == 0) {
            return refuse("isolate_cores is 0: nothing to isolate");
        }
        if (want < chosen.size()) {
            return refuse("isolate_cores is " + std::to_string(want) + " but the requested RT CPUs " +
                          "lie on " + std::to_string(chosen.size()) + " different cores");
        }
        const std::size_t can = cores.size() - req.min_housekeeping_cores;
        if (want > can) {
            return refuse("cannot isolate " + std::to_string(want) + " " + cores_word(want) + ": topology " +
                          topo.source() + " has " + std::to_string(cores.size()) + " cores and " +
                          std::to_string(req.min_housekeeping_cores) + " must stay housekeeping, so at most " +
                          std::to_string(can) + " can be isolated");
        }
        if (!req.isolate_cores) {
            plan.reasons.push_back("isolating " + std::to_string(want) + " whole " + cores_word(want) +
                                   ": one per RT thread (" + std::to_string(req.rt_cpu_count) +
                                   " RT thread" + (req.rt_cpu_count == 1 ? "" : "s") + ")");
        }
        // Rank the remaining cores: CPU 0 last, near the device first, then
        // from the highest-numbered core down (low CPUs stay housekeeping).
        std::vector<const topo_core*> rest;
        for (const auto& c : cores) {
            if (std::find(chosen.begin(), chosen.end(), &c) == chosen.end()) {
                rest.push_back(&c);
            }
        }
        std::stable_sort(rest.begin(), rest.end(), [&](const topo_core* a, const topo_core* b) {
            const auto key = [&](const topo_core* c) {
                return std::make_tuple(c->cpus.test(0) ? 1 : 0, is_near(*c) ? 0 : 1, -c->cpus.first());
            };
            return key(a) < key(b);
        });
        for (const topo_core* c : rest) {
            if (chosen.size() >= want) {
                break;
            }
            chosen.push_back(c);
            std::string why;
            if (c->cpus.test(0)) {
                why = "it holds CPU 0, but " + std::to_string(want) + " " + cores_word(want) +
                      " were asked for and no other core was free";
            } else if (is_near(*c)) {
                why = "it is near device " + *req.near_device;
            } else if (locality) {
                why = "no free core near device " + *req.near_device + " was left; highest-numbered free core";
            } else {
                why = "highest-numbered free core, so low-numbered CPUs stay housekeeping";
            }
            plan.reasons.push_back("isolated " + core_name(topo, *c) + ": " + why);
        }
        for (const topo_core* c : chosen) {
            plan.isolated |= c->cpus;
        }
        choice_order = chosen;
        if (topo.has_smt()) {
            plan.reasons.push_back("isolated whole cores: SMT siblings share execution units and L1/L2 "
                                   "cache, so no sibling of an isolated CPU runs housekeeping work");
        }
    }

    // RT CPUs must be isolated (explicit list case).
    for (std::size_t q = 0; q < req.rt_cpus.size(); ++q) {
        if (!plan.isolated.test(req.rt_cpus[q])) {
            return refuse("RT CPU " + std::to_string(req.rt_cpus[q]) + " of RT thread " +
                          std::to_string(q) + " is not in the isolated set " + plan.isolated.to_list());
        }
    }

    if (plan.online.is_subset_of(plan.isolated)) {
        return refuse("isolated set " + plan.isolated.to_list() + " covers every online CPU (" + online_list +
                      "); at least " + std::to_string(req.min_housekeeping_cores) +
                      " whole core must stay housekeeping");
    }
    std::size_t hk_cores = 0;
    for (const auto& c : cores) {
        if (!c.cpus.intersects(plan.isolated)) {
            ++hk_cores;
        }
    }
    if (hk_cores < req.min_housekeeping_cores) {
        return refuse("isolated set " + plan.isolated.to_list() + " leaves " + std::to_string(hk_cores) +
                      " housekeeping " + cores_word(hk_cores) + ", fewer than the " +
                      std::to_string(req.min_housekeeping_cores) + " required");
    }
    plan.housekeeping = plan.online - plan.isolated;

    if (plan.isolated.test(0)) {
        plan.reasons.push_back("CPU 0 is isolated as requested, although it usually carries the timekeeping "
                               "tick, boot-time IRQs and unmovable kthreads");
    } else {
        plan.reasons.push_back("CPU 0 stays housekeeping: it usually carries the timekeeping tick, "
                               "boot-time IRQs and unmovable kthreads");
    }

    // RT CPUs.
    if (!req.rt_cpus.empty()) {
        plan.rt_cpus = req.rt_cpus;
        for (std::size_t q = 0; q < req.rt_cpus.size(); ++q) {
            plan.reasons.push_back("RT thread " + std::to_string(q) + " runs on CPU " +
                                   std::to_string(req.rt_cpus[q]) + " as requested");
        }
    } else {
        // One CPU per isolated core first, best core first (the order the
        // cores were chosen; for an explicit list, near cores first), then
        // the siblings.
        std::vector<const topo_core*> iso = choice_order;
        if (iso.empty()) {
            for (const auto& c : cores) {
                if (c.cpus.is_subset_of(plan.isolated)) {
                    iso.push_back(&c);
                }
            }
            std::stable_sort(iso.begin(), iso.end(), [&](const topo_core* a, const topo_core* b) {
                return (is_near(*a) ? 0 : 1) < (is_near(*b) ? 0 : 1);
            });
        }
        std::vector<unsigned> order;
        for (const topo_core* c : iso) {
            order.push_back(static_cast<unsigned>(c->cpus.first()));
        }
        for (const topo_core* c : iso) {
            for (unsigned cpu : c->cpus.cpus()) {
                if (std::find(order.begin(), order.end(), cpu) == order.end()) {
                    order.push_back(cpu);
                }
            }
        }
        if (order.size() < req.rt_cpu_count) {
            return refuse(std::to_string(req.rt_cpu_count) + " RT threads need a CPU each but the isolated set " +
                          plan.isolated.to_list() + " has only " + std::to_string(order.size()));
        }
        for (unsigned q = 0; q < req.rt_cpu_count; ++q) {
            const unsigned cpu = order[q];
            plan.rt_cpus.push_back(cpu);
            const topo_core* c = topo.core_of(cpu);
            const cpu_set others = c->cpus - cpu_set{cpu};
            std::string line = "RT thread " + std::to_string(q) + " runs on CPU " + std::to_string(cpu) +
                               ", the first CPU of isolated " + core_name(topo, *c);
            if (q >= iso.size()) {
                line = "RT thread " + std::to_string(q) + " runs on CPU " + std::to_string(cpu) +
                       ", sharing " + core_name(topo, *c) + " with another RT thread's CPU because "
                       "there are fewer isolated cores than RT threads";
            } else if (!others.empty()) {
                line += "; its SMT sibling " + cpus_word(others) + " stays idle";
            }
            plan.reasons.push_back(line);
        }
    }

    plan.reasons.push_back("housekeeping " + cpus_word(plan.housekeeping) + " (" + std::to_string(hk_cores) +
                           " " + cores_word(hk_cores) + ")" + (plan.housekeeping.count() == 1 ? " runs" : " run") +
                           " the event loop, RPC server, IRQs and every other task");
    plan.kernel_cmdline.args = recommended_kernel_cmdline(plan.isolated, plan.housekeeping);
    plan.kernel_cmdline.needs_reboot = true;
    plan.reasons.push_back("boot-only knobs isolcpus, nohz_full, rcu_nocbs and irqaffinity take effect only "
                           "after a reboot with: " + plan.kernel_cmdline.args);
    return plan;
}

std::string format_plan(const partition_plan& plan,
                        const std::function<std::string(std::size_t)>& rt_cpu_label) {
    std::string out;
    out += "online:       " + plan.online.to_list() + "\n";
    out += "isolated:     " + plan.isolated.to_list() + "\n";
    out += "housekeeping: " + plan.housekeeping.to_list() + "\n";
    for (std::size_t q = 0; q < plan.rt_cpus.size(); ++q) {
        const std::string label = rt_cpu_label ? rt_cpu_label(q) : "rt thread " + std::to_string(q) + " cpu";
        out += label + ": " + std::to_string(plan.rt_cpus[q]) + "\n";
    }
    if (!plan.near_device_cpus.empty()) {
        out += "near device:  " + plan.near_device_cpus.to_list() + "\n";
    }
    out += "kernel command line (needs reboot): " + plan.kernel_cmdline.args + "\n";
    out += "why:\n";
    for (const auto& r : plan.reasons) {
        out += "  - " + r + "\n";
    }
    return out;
}

}  // namespace rtcore
