#pragma once
// How each dispatch thread submits its write at T, chosen from the host's
// partition when dispatch.submit_mode = "auto" (the default).
//
// Measured (bench/README.md "load", qrt-wakeup-trace): in syscall mode the
// send at T wakes the endpoint's reader on another CPU inside the RT thread's
// io_uring_enter; when that CPU is busy the wake-up is an IPI (a VM exit on a
// guest), once per job, and it is most of the send's cost.  With SQPOLL the
// RT thread only publishes the SQE and the kernel poller pays the wake-up;
// a poller sharing the dispatch CPU, though, has to be switched in after
// the RT thread sleeps, which delays every arrival.  So:
//   - an isolated CPU that dispatches no QPU (preferably an SMT sibling of
//     the dispatch CPU: the plan isolates whole cores) gets the poller, and
//     the RT thread no longer pays for a reader it does not control;
//   - without one, the RT thread makes the system call (the frame leaves
//     at once) and pays the wake-up.
#include <string>
#include <vector>

#include "qrt/dispatch/dispatcher.hpp"
#include "rtcore/cpu_set.hpp"
#include "rtcore/topology.hpp"

namespace qrt::dispatch {

enum class submit_request { syscall, sqpoll, automatic };

struct submit_choice {
    submit_mode mode = submit_mode::syscall;
    int poller_cpu = -1;  // sqpoll: the poller's CPU (-1: the dispatch CPU)
    std::string why;      // one sentence for the log and agent.status
};

// A spare isolated CPU per dispatch CPU (index = QPU index; a CPU >=
// cpu_set::max_cpus means the QPU has none), or -1: first an
// isolated SMT sibling of that dispatch CPU, then the lowest isolated CPU
// that dispatches nothing and is no other QPU's spare.  topo may be null
// (no sibling preference).
std::vector<int> spare_poller_cpus(const std::vector<unsigned>& dispatch_cpus, const rtcore::cpu_set& isolated,
                                   const rtcore::topology* topo);

// The submit mode of QPU qpu_index.  sqpoll_cpu is dispatch.sqpoll_cpu (-1:
// unset).  tuned = false (untuned dispatch) always gives syscall.
submit_choice choose_submit(submit_request requested, int sqpoll_cpu, bool tuned, std::size_t qpu_index,
                            const std::vector<unsigned>& dispatch_cpus, const rtcore::cpu_set& isolated,
                            const rtcore::topology* topo);

}  // namespace qrt::dispatch
