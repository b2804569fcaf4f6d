#include "qrt/dispatch/submit_choice.hpp"

#include <fmt/format.h>

namespace qrt::dispatch {

std::vector<int> spare_poller_cpus(const std::vector<unsigned>& dispatch_cpus, const rtcore::cpu_set& isolated,
                                   const rtcore::topology* topo) {
    rtcore::cpu_set taken;
    for (const unsigned c : dispatch_cpus) {
        if (c < rtcore::cpu_set::max_cpus) {
            taken.set(c);
        }
    }
    std::vector<int> spare(dispatch_cpus.size(), -1);
    // Siblings first, for every QPU, so a later QPU's sibling is never
    // handed to an earlier one as "the lowest free CPU".
    if (topo != nullptr) {
        for (std::size_t i = 0; i < dispatch_cpus.size(); ++i) {
            if (dispatch_cpus[i] >= rtcore::cpu_set::max_cpus) {
                continue;
            }
            const rtcore::cpu_set free_siblings = (topo->siblings_of(dispatch_cpus[i]) & isolated) - taken;
            if (const int s = free_siblings.first(); s >= 0) {
                spare[i] = s;
                taken.set(static_cast<unsigned>(s));
            }
        }
    }
    for (std::size_t i = 0; i < dispatch_cpus.size(); ++i) {
        if (spare[i] >= 0 || dispatch_cpus[i] >= rtcore::cpu_set::max_cpus) {
            continue;
        }
        if (const int s = (isolated - taken).first(); s >= 0) {
            spare[i] = s;
            taken.set(static_cast<unsigned>(s));
        }
    }
    return spare;
}

submit_choice choose_submit(submit_request requested, int sqpoll_cpu, bool tuned, std::size_t qpu_index,
                            const std::vector<unsigned>& dispatch_cpus, const rtcore::cpu_set& isolated,
                            const rtcore::topology* topo) {
    submit_choice c;
    if (!tuned) {
        c.why = "untuned dispatch submits with a system call";
        return c;
    }
    if (requested == submit_request::syscall) {
        c.why = "dispatch.submit_mode = \"syscall\"";
        return c;
    }
    if (requested == submit_request::sqpoll) {
        c.mode = submit_mode::sqpoll;
        c.poller_cpu = sqpoll_cpu;
        c.why = sqpoll_cpu >= 0 ? fmt::format("dispatch.submit_mode = \"sqpoll\", poller on CPU {}", sqpoll_cpu)
                                : "dispatch.submit_mode = \"sqpoll\", poller on the dispatch CPU";
        return c;
    }
    // automatic
    if (qpu_index >= dispatch_cpus.size() || dispatch_cpus[qpu_index] >= rtcore::cpu_set::max_cpus) {
        c.why = "auto: the QPU has no dispatch CPU in the partition, so no spare CPU for a poller: syscall";
        return c;
    }
    if (sqpoll_cpu >= 0) {  // an operator's placement wins
        c.mode = submit_mode::sqpoll;
        c.poller_cpu = sqpoll_cpu;
        c.why = fmt::format("auto: dispatch.sqpoll_cpu = {} is set: sqpoll with the poller there", sqpoll_cpu);
        return c;
    }
    const std::vector<int> spare = spare_poller_cpus(dispatch_cpus, isolated, topo);
    const unsigned dcpu = dispatch_cpus[qpu_index];
    if (spare[qpu_index] >= 0) {
        c.mode = submit_mode::sqpoll;
        c.poller_cpu = spare[qpu_index];
        const bool sibling = topo != nullptr && topo->siblings_of(dcpu).test(static_cast<unsigned>(c.poller_cpu));
        c.why = fmt::format("auto: isolated CPU {} ({}) dispatches no QPU: its SQPOLL poller sends at T while the "
                            "dispatch thread on CPU {} only publishes the write, so the reader's wake-up (an IPI, a "
                            "VM exit on a guest) is not paid on the RT thread",
                            c.poller_cpu, sibling ? "SMT sibling of the dispatch CPU" : "spare", dcpu);
        return c;
    }
    c.why = fmt::format("auto: no isolated CPU is free for a poller (isolated {}, dispatch CPUs taken): the dispatch "
                        "thread on CPU {} makes the system call and pays the reader's wake-up, because a poller "
                        "sharing its CPU delays every arrival; isolate one more core to move the send off it",
                        isolated.empty() ? std::string("none") : isolated.to_list(), dcpu);
    return c;
}

}  // namespace qrt::dispatch
