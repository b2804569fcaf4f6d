#pragma once
// qrtd's configuration: the plain struct every module reads, and the loader.
//
// The options themselves (name, type, default, range, meaning) live in ONE
// table, qrt/config_table.hpp.  That table drives parsing, `qrtd
// check-config`, the commented reference (`qrtd config-reference`, which is
// byte-equal to config/qrtd.toml) and the option list of qrtd.toml(5).
//
// Loading never throws and never touches the host.  Every problem becomes a
// config_diagnostic naming the file, the line, the option, the value and what
// was allowed:
//   qrtd.toml:12: dispatch.priority = 150 is out of range 1..99
// and the loader reports all of them, not just the first.

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "qrt/log_level.hpp"
#include "rtcore/cpu_set.hpp"
#include "rtcore/error.hpp"

namespace qrt {

// ---- enumerations (names are the config spelling, in declaration order) ---

// log_level: qrt/log_level.hpp (the logger's own; its spelling is below).
enum class isolation_mode { automatic, cgroup2, cgroup1, fence, none };
enum class dispatch_mode { tuned, untuned };
enum class submit_mode { syscall, sqpoll, automatic };
enum class placement_policy { fifo, edf_backfill, priority_preempt, fidelity_aware };
enum class calibration_change { replace, fail };
enum class calibration_preempt { never, held };
enum class calibration_source { periodic, pushed };
enum class probe_flavour { automatic, raw_tp };
enum class require_rt_mode { automatic, always, never };

template <typename E>
struct enum_names;
template <>
struct enum_names<log_level> {
    static constexpr std::array<std::string_view, 7> names{
        "trace", "debug", "info", "warn", "error", "critical", "off"};
};
template <>
struct enum_names<isolation_mode> {
    static constexpr std::array<std::string_view, 5> names{
        "auto", "cgroup2", "cgroup1", "fence", "none"};
};
template <>
struct enum_names<dispatch_mode> {
    static constexpr std::array<std::string_view, 2> names{"tuned", "untuned"};
};
template <>
struct enum_names<submit_mode> {
    static constexpr std::array<std::string_view, 3> names{"syscall", "sqpoll", "auto"};
};
template <>
struct enum_names<placement_policy> {
    static constexpr std::array<std::string_view, 4> names{
        "fifo", "edf-backfill", "priority-preempt", "fidelity-aware"};
};
template <>
struct enum_names<calibration_change> {
    static constexpr std::array<std::string_view, 2> names{"replace", "fail"};
};
template <>
struct enum_names<calibration_preempt> {
    static constexpr std::array<std::string_view, 2> names{"never", "held"};
};
template <>
struct enum_names<calibration_source> {
    static constexpr std::array<std::string_view, 2> names{"periodic", "pushed"};
};
template <>
struct enum_names<probe_flavour> {
    static constexpr std::array<std::string_view, 2> names{"auto", "raw_tp"};
};
template <>
struct enum_names<require_rt_mode> {
    static constexpr std::array<std::string_view, 3> names{"auto", "always", "never"};
};

template <typename E>
constexpr std::string_view to_string(E value) noexcept {
    return enum_names<E>::names[static_cast<std::size_t>(value)];
}
template <typename E>
constexpr std::optional<E> enum_from_string(std::string_view text) noexcept {
    const auto& names = enum_names<E>::names;
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (names[i] == text) {
            return static_cast<E>(i);
        }
    }
    return std::nullopt;
}

// ---- value types with their own syntax -----------------------------------

// A QPU control endpoint:
//   unix:///run/qpu0.sock     AF_UNIX stream socket (absolute path, < 108 bytes)
//   tcp://127.0.0.1:9000      IPv4 literal and port (no host names: no DNS)
//   tcp://[::1]:9000          IPv6 literal in brackets
//   file:///dev/qpu0          a character device under /dev
struct endpoint {
    enum class kind { unix_socket, tcp, device_file };
    kind type = kind::unix_socket;
    std::string path;        // unix_socket, device_file
    std::string host;        // tcp: the address literal, without brackets
    std::uint16_t port = 0;  // tcp
    std::string uri;         // as written
    bool operator==(const endpoint&) const = default;
};
// Error message says what is wrong ("scheme must be unix://, tcp:// or file://").
rtcore::result<endpoint> parse_endpoint(std::string_view uri);

// A role member: "user:NAME", "group:NAME", "uid:N" or "gid:N".  Names are
// resolved to ids when a peer connects, not at load time, so a config can be
// checked on a machine without those accounts.
struct principal {
    enum class kind { user, group, uid, gid };
    kind type = kind::user;
    std::string name;      // user, group
    std::uint32_t id = 0;  // uid, gid
    std::string text;      // as written
    bool operator==(const principal&) const = default;
};
rtcore::result<principal> parse_principal(std::string_view text);

// A per-tenant priority ceiling: "PRINCIPAL=N", e.g. "user:alice=50" or
// "group:physics=10" (N a signed 32-bit integer).
struct priority_ceiling {
    principal who;
    std::int32_t max_priority = 0;
    std::string text;      // as written
    bool operator==(const priority_ceiling&) const = default;
};
rtcore::result<priority_ceiling> parse_priority_ceiling(std::string_view text);

// ---- the configuration ----------------------------------------------------

struct agent_config {
    std::string state_dir;
    std::string user;    // qrtd run drops to it when started as root
    std::string group;   // "" the user's primary group
    log_level level = log_level::info;
    bool watchdog = true;
    bool operator==(const agent_config&) const = default;
};

struct host_config {
    bool apply_on_run = true;
    // nullopt: "auto" (planned from the topology).
    std::optional<rtcore::cpu_set> isolated_cpus;
    unsigned housekeeping_min_cores = 1;
    isolation_mode isolation = isolation_mode::automatic;
    bool pin_irqs = true;
    unsigned irq_verify_interval_s = 0;   // 0: never re-verify
    std::string journal_dir;              // root-owned: what root replays
    unsigned lock_wait_s = 0;             // wait for the host lock
    std::string locality_device;          // PCI bus id or interface; "" none
    // The runtime knobs of tuned's cpu-partitioning profile to apply
    // (rtcore/knob_catalogue.hpp names), and whether to turn RT throttling off.
    std::vector<std::string> runtime_knobs;
    bool disable_rt_throttling = false;
    bool operator==(const host_config&) const = default;
};

struct dispatch_config {
    dispatch_mode mode = dispatch_mode::tuned;
    int priority = 0;
    std::int64_t lead_min_ns = 0;
    std::int64_t lead_max_ns = 0;
    double lead_quantile = 0;
    std::int64_t lead_margin_ns = 0;
    std::int64_t miss_tolerance_ns = 0;
    std::int64_t handover_margin_ns = 0;  // part of the minimum lead (services.cpp, handover_timing)
    std::uint32_t ring_capacity = 0;
    std::uint32_t max_payload_bytes = 0;
    bool cpu_dma_latency = true;
    submit_mode submit = submit_mode::automatic;
    int sqpoll_cpu = -1;                 // -1: each QPU's dispatch CPU
    std::uint32_t sqpoll_idle_ms = 0;
    // tuned: QPUs that may share one isolated CPU and one dispatch thread
    // when the host cannot spare a core per QPU (1: never share).
    std::uint32_t qpus_per_cpu = 1;
    require_rt_mode require_rt = require_rt_mode::automatic;  // auto: always when systemd started us
    bool operator==(const dispatch_config&) const = default;
};

struct timeline_config {
    placement_policy policy = placement_policy::fifo;
    calibration_change on_calibration_change = calibration_change::replace;
    std::int64_t default_lease_ns = 0;
    std::int64_t horizon_ns = 0;
    std::int64_t retention_ns = 0;       // terminal reservations and results are kept this long
    std::uint32_t max_windows = 0;       // calibration windows per QPU ahead of now (2x in all)
    std::uint32_t commit_group_max = 0;      // changes per transaction (1: commit each at once)
    std::uint32_t commit_group_wait_us = 0;  // how long a group may wait to fill
    std::uint32_t commit_queue_max = 0;      // changes waiting for their commit before refusing
    std::int64_t endpoint_down_horizon_ns = 0;  // endpoint down: no start sooner than this
    // calibration blocks: what a holder that did not yield comes to, how
    // long it has, and the live blocks per QPU
    qrt::calibration_preempt calibration_preempt = qrt::calibration_preempt::never;
    std::int64_t calibration_yield_ns = 0;
    std::uint32_t max_calibration_blocks = 0;
    bool operator==(const timeline_config&) const = default;
};

struct rpc_config {
    std::string socket_path;
    std::string socket_group;
    unsigned socket_mode = 0;   // permission bits, e.g. 0660
    unsigned max_connections = 0;
    unsigned max_connections_per_uid = 0;  // admins exempt
    unsigned reserved_connections = 0;     // of max_connections, for admin and calibration
    unsigned max_inflight = 0;
    unsigned idle_timeout_s = 0;   // 0: never
    unsigned nss_timeout_ms = 0;   // how long a connection waits for NSS
    std::uint32_t max_line_bytes = 0;
    std::string metrics_textfile;  // "" off
    // The network listener: "tcp://ADDR:PORT", "" off; MUNGE-authenticated.
    std::string listen;
    std::vector<std::string> listen_aliases;  // other addresses clients dial (NAT)
    unsigned max_connections_per_host = 0;
    unsigned max_unauthenticated = 0;           // network connections before authentication
    unsigned max_unauthenticated_per_host = 0;  // the same from one peer address
    unsigned auth_silent_timeout_ms = 0;        // one that has sent nothing is closed after this
    unsigned auth_timeout_ms = 0;
    std::string munge_socket;
    bool operator==(const rpc_config&) const = default;
};

struct roles_config {
    std::vector<principal> reader;
    std::vector<principal> scheduler;
    std::vector<principal> calibration;
    std::vector<principal> admin;
    bool operator==(const roles_config&) const = default;
};

// What one tenant may do, so that tenants cannot hurt each other.  Admins are exempt from the
// quotas and the request rate; their priority has its own ceiling.
struct tenants_config {
    std::int32_t scheduler_max_priority = 0;
    std::int32_t admin_max_priority = 0;
    std::vector<priority_ceiling> priority_ceilings;   // override the role's ceiling
    std::uint32_t max_reservations = 0;     // held + committed + dispatched, per tenant
    std::int64_t max_booked_ns = 0;         // their summed durations, per tenant
    std::int64_t near_term_ns = 0;          // the near term: from now, this long
    std::int64_t max_near_term_ns = 0;      // a tenant's booked time within it
    std::int64_t max_payload_bytes = 0;     // payloads of those jobs, per tenant
    std::uint32_t max_requests_per_s = 0;   // 0: unlimited
    std::uint32_t request_burst = 0;
    std::uint32_t request_bytes = 0;        // a line costs one request per started this many bytes
    std::vector<principal> delegates;       // may book on_behalf_of a named tenant
    std::uint32_t max_delegated_tenants = 0;  // tenants one delegate may hold bookings for
    std::int32_t delegated_max_priority = 0;  // the ceiling of a tenant a delegate books for
    bool operator==(const tenants_config&) const = default;
};

struct probes_config {
    bool enabled = true;
    std::int64_t outlier_threshold_ns = 0;
    probe_flavour flavour = probe_flavour::automatic;
    bool operator==(const probes_config&) const = default;
};

// What a QPU is, for SDKs ([qpu.device], optional): served by qpus.list as
// "device" so a Qiskit backend or a QDMI device can build its target.  The
// limits are in device_limits below and in qrtd.toml(5).
struct qpu_device {
    std::uint32_t qubits = 0;
    std::string technology;
    std::vector<std::string> basis_gates;
    std::vector<std::array<std::uint32_t, 2>> coupling_map;
    // In file order; a gate named once.
    std::vector<std::pair<std::string, std::int64_t>> gate_durations_ns;
    std::uint32_t max_shots = 100000;
    bool operator==(const qpu_device&) const = default;
};

struct device_limits {
    static constexpr std::uint32_t max_qubits = 1024;
    static constexpr std::size_t max_technology_chars = 64;
    static constexpr std::size_t max_basis_gates = 64;
    static constexpr std::size_t max_gate_name_chars = 32;
    static constexpr std::size_t max_coupling_pairs = 4096;
    static constexpr std::int64_t max_gate_duration_ns = 3'600'000'000'000;  // an hour
    static constexpr std::uint32_t default_max_shots = 100000;
    static constexpr std::uint32_t max_shots_limit = 1'000'000;  // what the dispatch path carries
};

struct qpu_config {
    std::string name;
    endpoint target;
    int dispatch_cpu = -1;                 // -1: chosen by the partition plan
    std::string locality_device;           // "" inherits host.locality_device
    calibration_source calibration = calibration_source::periodic;
    std::int64_t period_ns = 0;
    std::int64_t blackout_ns = 0;
    std::int64_t phase_ns = 0;
    double fidelity_f0 = 0;
    std::int64_t fidelity_tau_ns = 0;      // 0: no decay
    std::int64_t job_tolerance_ns = -1;    // -1 inherits dispatch.miss_tolerance_ns
    int wire = 1;                          // the endpoint wire's version: 1 JOB at T, 2 ARM ahead + FIRE at T
    std::int64_t arm_lead_ns = 0;          // wire 2: the ARM goes out at least this long before T
    std::optional<qpu_device> device;      // [qpu.device]; nullopt: not stated

    // The tolerance that applies to this QPU's jobs.
    std::int64_t effective_job_tolerance_ns(const struct config& cfg) const;
    bool operator==(const qpu_config&) const = default;
};

struct config {
    agent_config agent;
    host_config host;
    dispatch_config dispatch;
    timeline_config timeline;
    rpc_config rpc;
    roles_config roles;
    tenants_config tenants;
    probes_config probes;
    std::vector<qpu_config> qpus;
    bool operator==(const config&) const = default;
};

inline std::int64_t qpu_config::effective_job_tolerance_ns(const config& cfg) const {
    return job_tolerance_ns >= 0 ? job_tolerance_ns : cfg.dispatch.miss_tolerance_ns;
}

// ---- loading --------------------------------------------------------------

struct config_diagnostic {
    std::string file;      // as given to the loader
    unsigned line = 0;     // 1-based; 0 when the problem has no place
    unsigned column = 0;   // 1-based; set for malformed TOML only
    std::string option;    // "dispatch.priority", "qpu[1].endpoint", "" for none
    std::string message;   // "dispatch.priority = 150 is out of range 1..99"

    // "qrtd.toml:12: <message>", "qrtd.toml:3:14: <message>" or "qrtd.toml: <message>".
    std::string to_string() const;
};

struct config_load_options {
    // When set, host.isolated_cpus and qpu.dispatch_cpu are checked against
    // these online CPUs (unknown CPUs, an isolated set that leaves no
    // housekeeping CPU).  check-config and run pass the host's online set.
    std::optional<rtcore::cpu_set> online_cpus;
};

struct config_load_result {
    config cfg;                                // meaningful only when ok()
    std::vector<config_diagnostic> errors;     // in file order
    bool ok() const { return errors.empty(); }
    std::string error_text() const;            // one diagnostic per line
};

// Parse TOML text; source_name is what diagnostics call the file.
config_load_result parse_config(std::string_view toml_text, std::string source_name,
                                const config_load_options& opts = {});
// Read and parse a file; an unreadable file is a single diagnostic
// ("/etc/qrtd/qrtd.toml: cannot read: No such file or directory").
config_load_result load_config_file(const std::filesystem::path& path,
                                    const config_load_options& opts = {});

// The configuration of the reference file: every default, and the example
// [[qpu]] it declares.
const config& default_config();

// The commented TOML for cfg: every option, with its meaning, type and range,
// at cfg's value.  reference_toml() == render_config(default_config()) is
// what `qrtd config-reference` prints and what config/qrtd.toml holds.
std::string render_config(const config& cfg);
std::string reference_toml();

// The option list of qrtd.toml(5) in roff (.SS per section, .TP per option).
std::string reference_roff();

// [qpu.device] as qpus.list and check-config --json serve it: an object
// with exactly the keys of the sub-table, or null when absent.
nlohmann::json device_to_json(const std::optional<qpu_device>& device);

// The configuration as JSON, one member per section, keyed like the TOML
// (for `qrtd check-config --json`).
nlohmann::json config_to_json(const config& cfg);

// Why the journal directory may not be where it is relative to the state
// directory (the same, or inside it: the daemon's user could rename it
// away), or nullopt.  Lexical; also used for --journal-dir/--state-dir.
std::optional<std::string> journal_dir_apart(const std::string& journal_dir, const std::string& state_dir);

// Bytes of one QPU's dispatch frame pool: dispatch.ring_capacity (rounded up
// to a power of two) frames of dispatch.max_payload_bytes, what each
// dispatcher registers with io_uring, which locks it.
std::uint64_t frame_pool_bytes(const config& cfg);

}  // namespace qrt
