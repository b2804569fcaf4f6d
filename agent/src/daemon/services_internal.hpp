#pragma once
// What the parts of the services share (private to agent/src/daemon):
//   services.cpp         wiring: start-up in order, stop in reverse
//   services_status.cpp  agent.status, telemetry.snapshot, the probes' feed
//   control_socket.cpp   the control socket: its settings from [rpc], and
//                        start_server (engine, methods, tenants, roles)
// The hand-over between the ledger and the dispatch threads (the job pump,
// outcomes, calibration) is agent/src/handover's room.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "services.hpp"

#ifdef QRT_HAVE_BPF
#include "outlier_feed.hpp"
#include "qrt_bpf/probe_set.hpp"
#endif

namespace qrt {

namespace services_detail {

constexpr std::int64_t k_ms = 1'000'000;

inline std::string tl_error(const timeline::error& e) { return e.reason + ": " + e.message; }

// Does NSS know a group of this name?
bool group_exists(const std::string& name);

}  // namespace services_detail

// ------------------------------------------------------------------ per QPU

struct services::qpu_runtime {
    std::uint32_t index = 0;
    std::string name;
    std::string endpoint;
    int dispatch_cpu = -1;
    std::int64_t tolerance_ns = 0;
    std::unique_ptr<dispatch::qpu_link> link;
    std::string endpoint_state = "connecting";
    std::uint64_t placement_lost_logged = 0;  // the dispatch thread's found_moved count last logged
};

// ------------------------------------------------------------------- probes

struct services::probes_state {
#ifdef QRT_HAVE_BPF
    explicit probes_state(qrt_bpf::probe_set p) : set(std::move(p)) {}
    qrt_bpf::probe_set set;
    std::optional<outlier_feed> outliers;  // when probe 3 loaded
    int outlier_fd = -1;                    // its ring buffer's epoll fd, in the loop
    std::uint64_t intrusion_keys_pruned = 0;
    std::size_t intrusion_map_keys = 0;
    std::size_t intrusion_exited_rows = 0;
#endif
};

}  // namespace qrt
