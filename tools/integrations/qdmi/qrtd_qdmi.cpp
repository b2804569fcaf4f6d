// libqrtd-qdmi.so: the QDMI device interface (v1.x, symbol prefix QRTD)
// over libqrt-client.  One QDMI device session is one connection to qrtd's
// control socket and one of its QPUs; a QDMI job is one qrtd job.
//
// Session parameters (QRTD_QDMI_device_session_set_parameter), all text:
//   BASEURL  the qrtd socket: a path or unix:///path (default $QRT_SOCKET,
//            else the built-in /run/qrtd/qrtd.sock)
//   CUSTOM1  a reservation id booked beforehand (qrtctl slots reserve, or
//            the Slurm step's QRT_RESERVATION_ID): the session's job goes
//            into that slot.  QDMI has no call that books a future window;
//            this is how one is carried.  Without CUSTOM1, a set
//            QRT_RESERVATION_ID (inside a Slurm step) is used.
//   CUSTOM2  that reservation's fencing token (default $QRT_FENCING_TOKEN)
//   CUSTOM3  the QPU's name (default: the reservation's QPU, else the first
//            QPU qpus.list names)
// Programs: 1 to 256 OpenQASM 3 texts per job (QASM3), sent as the circuits
// of one qrtd job envelope (qrtd(8), "Job payloads"); results per program
// are histograms (HIST_KEYS, HIST_VALUES).
// Job parameters: SHOTSNUM (size_t) and, for a job placed by qrtd itself
// (no reservation), text CUSTOM1 not_before_ns, CUSTOM2 deadline_ns,
// CUSTOM3 duration_ns (default 10 ms), CUSTOM4 min_fidelity, CUSTOM5
// priority: the parameters of jobs.submit.
//
// The device facts (qubits, basis gates, coupling map, gate durations,
// max shots) come from qpus.list's "device" of the QPU; status is
// CALIBRATION while no calibration window is in force (a blackout) or a
// calibration block is (qpus.list's "calibrating").
//
// Every entry point catches everything: no C++ exception crosses the C ABI.
// A refusal that QDMI can only report as an error code is also written as
// one line on stderr ("qrtd-qdmi: ..."), naming what qrtd said.

#include "qrtd_qdmi/device.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "qrt/client.h"
#include "rtcore/base64.hpp"

#ifndef QRTD_QDMI_VERSION
#define QRTD_QDMI_VERSION "0.0.0"
#endif
#ifndef QRTD_QDMI_SPEC_VERSION
#define QRTD_QDMI_SPEC_VERSION "1.4.0"
#endif

using nlohmann::json;

struct QRTD_QDMI_Site_impl_d {
    std::size_t index = 0;
    std::string name;
};

struct QRTD_QDMI_Operation_impl_d {
    std::string name;
    std::optional<std::size_t> qubits;  // unknown gate: not stated
    std::size_t params = 0;
    std::optional<std::uint64_t> duration_ns;
    std::vector<QRTD_QDMI_Site> sites;  // flattened tuples of `qubits` sites
};

namespace {

constexpr std::int64_t k_default_duration_ns = 10'000'000;
constexpr std::size_t k_default_shots = 1024;
constexpr std::size_t k_max_shots = 1'000'000;  // qrtd's own ceiling (handover)
constexpr int k_call_timeout_ms = 10'000;
constexpr std::size_t k_max_programs = 256;  // circuits per qrtd job envelope

std::atomic<bool> g_initialized{false};

void say(const std::string& line) noexcept { std::fprintf(stderr, "qrtd-qdmi: %s\n", line.c_str()); }

std::int64_t now_ns() noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// A text parameter's value: NUL-terminated or not, at most size bytes.
std::string text_of(std::size_t size, const void* value) {
    const auto* p = static_cast<const char*>(value);
    std::size_t n = 0;
    while (n < size && p[n] != '\0') {
        ++n;
    }
    return std::string(p, n);
}

template <typename T>
std::optional<T> number_of(std::string_view s) {
    T v{};
    const char* end = s.data() + s.size();
    const auto r = std::from_chars(s.data(), end, v);
    if (r.ec != std::errc() || r.ptr != end || s.empty()) {
        return std::nullopt;
    }
    return v;
}

// The size-query convention: value NULL asks only for the size; a buffer
// smaller than the data is an invalid argument.
int give_bytes(const void* src, std::size_t n, std::size_t size, void* value, std::size_t* size_ret) {
    if (value != nullptr) {
        if (size < n) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (n != 0) {
            std::memcpy(value, src, n);
        }
    }
    if (size_ret != nullptr) {
        *size_ret = n;
    }
    return QDMI_SUCCESS;
}

int give_string(const std::string& s, std::size_t size, void* value, std::size_t* size_ret) {
    return give_bytes(s.c_str(), s.size() + 1, size, value, size_ret);
}

template <typename T>
int give(const T& v, std::size_t size, void* value, std::size_t* size_ret) {
    return give_bytes(&v, sizeof(T), size, value, size_ret);
}

template <typename T>
int give_list(const std::vector<T>& v, std::size_t size, void* value, std::size_t* size_ret) {
    return give_bytes(v.data(), v.size() * sizeof(T), size, value, size_ret);
}

bool is_custom(long v) noexcept { return v >= 999999995 && v <= 999999999; }

// Qubit and parameter counts of the OpenQASM 3 standard gates (stdgates.inc)
// and of measure/reset/delay, for the operations the QPU's basis names.
struct gate_shape {
    std::string_view name;
    std::size_t qubits;
    std::size_t params;
};
constexpr gate_shape k_gates[] = {
    {"id", 1, 0},    {"x", 1, 0},     {"y", 1, 0},     {"z", 1, 0},     {"h", 1, 0},
    {"s", 1, 0},     {"sdg", 1, 0},   {"t", 1, 0},     {"tdg", 1, 0},   {"sx", 1, 0},
    {"sxdg", 1, 0},  {"rx", 1, 1},    {"ry", 1, 1},    {"rz", 1, 1},    {"p", 1, 1},
    {"phase", 1, 1}, {"u1", 1, 1},    {"u2", 1, 2},    {"u3", 1, 3},    {"u", 1, 3},
    {"U", 1, 3},     {"measure", 1, 0}, {"reset", 1, 0}, {"delay", 1, 1}, {"cx", 2, 0},
    {"CX", 2, 0},    {"cy", 2, 0},    {"cz", 2, 0},    {"ch", 2, 0},    {"swap", 2, 0},
    {"ecr", 2, 0},   {"iswap", 2, 0}, {"crx", 2, 1},   {"cry", 2, 1},   {"crz", 2, 1},
    {"cp", 2, 1},    {"cphase", 2, 1}, {"cu1", 2, 1},  {"cu", 2, 4},    {"rxx", 2, 1},
    {"ryy", 2, 1},   {"rzz", 2, 1},   {"rzx", 2, 1},   {"ccx", 3, 0},   {"cswap", 3, 0},
};

const gate_shape* shape_of(std::string_view name) noexcept {
    for (const auto& g : k_gates) {
        if (g.name == name) {
            return &g;
        }
    }
    return nullptr;
}

}  // namespace

struct QRTD_QDMI_Device_Session_impl_d {
    bool initialized = false;
    std::string socket;  // empty: qrt_default_socket()
    std::optional<std::uint64_t> reservation_id;
    std::optional<std::uint64_t> fencing_token;
    std::string qpu;

    std::mutex mu;  // one qrt_client per session; jobs share it
    qrt_client* client = nullptr;
    std::string agent_version;
    bool has_device = false;
    std::optional<std::size_t> max_shots;
    std::vector<std::unique_ptr<QRTD_QDMI_Site_impl_d>> site_store;
    std::vector<QRTD_QDMI_Site> sites;
    std::vector<std::unique_ptr<QRTD_QDMI_Operation_impl_d>> op_store;
    std::vector<QRTD_QDMI_Operation> ops;
    std::vector<QRTD_QDMI_Site> coupling;  // flattened pairs
    bool reservation_used = false;

    ~QRTD_QDMI_Device_Session_impl_d() { qrt_close(client); }

    // One JSON-RPC call under the session's lock.  0 or a negative errno;
    // err says what went wrong.
    int call(const char* method, const json& params, json* out, qrt_error* err) {
        std::lock_guard<std::mutex> lock(mu);
        char* text = nullptr;
        const std::string p = params.dump();
        const int rc = qrt_call(client, method, p.c_str(), out != nullptr ? &text : nullptr, err);
        if (rc == 0 && out != nullptr) {
            *out = json::parse(text != nullptr ? text : "null", nullptr, false);
        }
        qrt_free(text);
        return rc;
    }

    bool site_known(QRTD_QDMI_Site s) const {
        return std::find(sites.begin(), sites.end(), s) != sites.end();
    }
    bool op_known(QRTD_QDMI_Operation o) const { return std::find(ops.begin(), ops.end(), o) != ops.end(); }
};

namespace {

// QDMI code for a libqrt-client failure, saying it on stderr.
int fail_call(const char* what, int rc, const qrt_error& err) {
    say(std::string(what) + ": " + (err.reason[0] != '\0' ? err.reason : "error") + ": " + err.message);
    if (rc == -EREMOTEIO && (std::strcmp(err.reason, "permission_denied") == 0 ||
                             std::strcmp(err.reason, "not_owner") == 0)) {
        return QDMI_ERROR_PERMISSIONDENIED;
    }
    if (rc == -ETIMEDOUT) {
        return QDMI_ERROR_TIMEOUT;
    }
    return QDMI_ERROR_FATAL;
}

// The QPU's entry of qpus.list, or null.
json qpu_entry(QRTD_QDMI_Device_Session s, qrt_error* err, int* rc) {
    json list;
    *rc = s->call("qpus.list", json::object(), &list, err);
    if (*rc != 0 || !list.is_object() || !list.contains("qpus") || !list["qpus"].is_array()) {
        return nullptr;
    }
    for (const auto& q : list["qpus"]) {
        if (q.is_object() && q.value("name", std::string()) == s->qpu) {
            return q;
        }
    }
    return nullptr;
}

// Sites, operations and coupling map from qpus.list's "device" facts.
void load_device(QRTD_QDMI_Device_Session s, const json& device) {
    if (!device.is_object() || !device.contains("qubits") || !device["qubits"].is_number_unsigned()) {
        return;
    }
    s->has_device = true;
    const auto n = device["qubits"].get<std::size_t>();
    for (std::size_t i = 0; i < n; ++i) {
        auto site = std::make_unique<QRTD_QDMI_Site_impl_d>();
        site->index = i;
        site->name = "q" + std::to_string(i);
        s->sites.push_back(site.get());
        s->site_store.push_back(std::move(site));
    }
    if (device.contains("max_shots") && device["max_shots"].is_number_unsigned()) {
        s->max_shots = device["max_shots"].get<std::size_t>();
    }
    std::vector<QRTD_QDMI_Site> pairs;
    if (device.contains("coupling_map") && device["coupling_map"].is_array()) {
        for (const auto& e : device["coupling_map"]) {
            if (e.is_array() && e.size() == 2 && e[0].is_number_unsigned() && e[1].is_number_unsigned()) {
                const auto a = e[0].get<std::size_t>();
                const auto b = e[1].get<std::size_t>();
                if (a < n && b < n) {
                    pairs.push_back(s->sites[a]);
                    pairs.push_back(s->sites[b]);
                }
            }
        }
    }
    s->coupling = pairs;
    const json durations = device.value("gate_durations_ns", json::object());
    if (device.contains("basis_gates") && device["basis_gates"].is_array()) {
        for (const auto& g : device["basis_gates"]) {
            if (!g.is_string()) {
                continue;
            }
            auto op = std::make_unique<QRTD_QDMI_Operation_impl_d>();
            op->name = g.get<std::string>();
            if (const gate_shape* shape = shape_of(op->name); shape != nullptr) {
                op->qubits = shape->qubits;
                op->params = shape->params;
                if (shape->qubits == 1) {
                    op->sites = s->sites;
                } else if (shape->qubits == 2) {
                    op->sites = pairs;
                }
            }
            if (durations.is_object() && durations.contains(op->name) &&
                durations[op->name].is_number_unsigned()) {
                op->duration_ns = durations[op->name].get<std::uint64_t>();
            }
            s->ops.push_back(op.get());
            s->op_store.push_back(std::move(op));
        }
    }
}

template <typename Fn>
int guarded(Fn&& fn) noexcept {
    try {
        return fn();
    } catch (const std::bad_alloc&) {
        return QDMI_ERROR_OUTOFMEM;
    } catch (const std::exception& e) {
        say(std::string("unexpected failure: ") + e.what());
        return QDMI_ERROR_FATAL;
    } catch (...) {
        return QDMI_ERROR_FATAL;
    }
}

}  // namespace

struct QRTD_QDMI_Device_Job_impl_d {
    QRTD_QDMI_Device_Session session = nullptr;
    bool retrieved = false;
    std::vector<std::string> programs;  // without their NUL; empty: not set
    std::size_t shots = k_default_shots;
    std::optional<std::int64_t> not_before_ns;
    std::optional<std::int64_t> deadline_ns;
    std::int64_t duration_ns = k_default_duration_ns;
    std::optional<double> min_fidelity;
    std::optional<std::int32_t> priority;

    std::uint64_t job_id = 0;  // 0: not submitted
    QDMI_Job_Status status = QDMI_JOB_STATUS_CREATED;
    std::string state;   // qrtd's
    std::string reason;  // qrtd's, for a job that ended without a result
    bool results_loaded = false;
    struct histogram {
        std::string keys;  // comma-separated
        std::vector<std::size_t> values;
    };
    std::vector<histogram> results;  // per program, in input order
};

namespace {

QDMI_Job_Status status_of(std::string_view state) noexcept {
    if (state == "held" || state == "committed") {
        return QDMI_JOB_STATUS_QUEUED;
    }
    if (state == "dispatched" || state == "sent") {
        return QDMI_JOB_STATUS_RUNNING;
    }
    if (state == "completed") {
        return QDMI_JOB_STATUS_DONE;
    }
    if (state == "cancelled") {
        return QDMI_JOB_STATUS_CANCELED;
    }
    return QDMI_JOB_STATUS_FAILED;  // failed, missed, expired, released, displaced
}

bool terminal(QDMI_Job_Status s) noexcept {
    return s == QDMI_JOB_STATUS_DONE || s == QDMI_JOB_STATUS_CANCELED || s == QDMI_JOB_STATUS_FAILED;
}

// jobs.status -> job->status.  0 or a QDMI error.
int refresh(QRTD_QDMI_Device_Job job) {
    if (job->job_id == 0 || terminal(job->status)) {
        return QDMI_SUCCESS;
    }
    qrt_error err{};
    json st;
    const int rc = job->session->call("jobs.status", json{{"job_id", job->job_id}}, &st, &err);
    if (rc != 0) {
        return fail_call("jobs.status", rc, err);
    }
    job->state = st.value("state", std::string());
    job->status = status_of(job->state);
    if (job->status == QDMI_JOB_STATUS_FAILED && job->reason.empty()) {
        job->reason = st.value("reason", std::string());
        say("job " + std::to_string(job->job_id) + " ended " + job->state +
            (job->reason.empty() ? std::string() : ": " + job->reason));
    }
    return QDMI_SUCCESS;
}

using counts_t = std::vector<std::pair<std::string, std::size_t>>;

bool read_counts(const json& counts, counts_t& out) {
    if (!counts.is_object()) {
        return false;
    }
    for (const auto& [k, v] : counts.items()) {
        if (!v.is_number_unsigned()) {
            return false;
        }
        out.emplace_back(k, v.get<std::size_t>());
    }
    return true;
}

// The histograms of a result, one per program: the envelope's answer
// {"format": "qasm3-counts", "results": [{"name", "shots", "counts"}...]}
// (qpu-aer), or lines "bits count" (qpu-sim: one histogram).
bool parse_results(std::string_view bytes, std::vector<counts_t>& out) {
    const json j = json::parse(bytes.begin(), bytes.end(), nullptr, false);
    if (!j.is_discarded() && j.is_object()) {
        if (j.contains("results") && j["results"].is_array()) {
            for (const auto& r : j["results"]) {
                counts_t c;
                if (!r.is_object() || !r.contains("counts") || !read_counts(r["counts"], c)) {
                    return false;
                }
                out.push_back(std::move(c));
            }
            return !out.empty();
        }
        counts_t c;
        if (!j.contains("counts") || !read_counts(j["counts"], c)) {
            return false;
        }
        out.push_back(std::move(c));
        return true;
    }
    counts_t c;
    std::size_t pos = 0;
    while (pos < bytes.size()) {
        std::size_t eol = bytes.find('\n', pos);
        if (eol == std::string_view::npos) {
            eol = bytes.size();
        }
        const std::string_view line = bytes.substr(pos, eol - pos);
        pos = eol + 1;
        if (line.empty()) {
            continue;
        }
        const std::size_t sp = line.find(' ');
        if (sp == std::string_view::npos || sp == 0) {
            return false;
        }
        const auto n = number_of<std::size_t>(line.substr(sp + 1));
        const std::string_view key = line.substr(0, sp);
        if (!n || key.find_first_not_of("01") != std::string_view::npos) {
            return false;
        }
        c.emplace_back(std::string(key), *n);
    }
    out.push_back(std::move(c));
    return true;
}

int load_results(QRTD_QDMI_Device_Job job) {
    if (job->results_loaded) {
        return QDMI_SUCCESS;
    }
    void* data = nullptr;
    std::size_t len = 0;
    qrt_error err{};
    int rc = 0;
    {
        std::lock_guard<std::mutex> lock(job->session->mu);
        rc = qrt_jobs_result(job->session->client, job->job_id, &data, &len, nullptr, &err);
    }
    if (rc != 0) {
        return fail_call("jobs.result", rc, err);
    }
    std::vector<counts_t> all;
    const bool ok = parse_results(std::string_view(static_cast<const char*>(data), len), all);
    qrt_free(data);
    if (!ok) {
        say("job " + std::to_string(job->job_id) + ": the endpoint's result is not a histogram");
        return QDMI_ERROR_FATAL;
    }
    job->results.clear();
    for (auto& counts : all) {
        std::sort(counts.begin(), counts.end());
        QRTD_QDMI_Device_Job_impl_d::histogram h;
        for (const auto& [k, n] : counts) {
            if (!h.keys.empty()) {
                h.keys += ',';
            }
            h.keys += k;
            h.values.push_back(n);
        }
        job->results.push_back(std::move(h));
    }
    job->results_loaded = true;
    return QDMI_SUCCESS;
}

// Skip whitespace and comments of an OpenQASM text from pos.
std::size_t skip_blank(std::string_view t, std::size_t pos) {
    while (pos < t.size()) {
        if (t[pos] == ' ' || t[pos] == '\t' || t[pos] == '\r' || t[pos] == '\n') {
            ++pos;
        } else if (t.substr(pos, 2) == "//") {
            const std::size_t eol = t.find('\n', pos);
            pos = eol == std::string_view::npos ? t.size() : eol + 1;
        } else if (t.substr(pos, 2) == "/*") {
            const std::size_t end = t.find("*/", pos + 2);
            pos = end == std::string_view::npos ? t.size() : end + 2;
        } else {
            break;
        }
    }
    return pos;
}

// What the program asks of the QPU before anything is sent: an OpenQASM 3
// header, and no more qubits than the QPU has (declared qubit registers,
// physical $k).  An empty string when it is acceptable, else why not.
// qubits 0: the QPU states no qubit count.  *used: the qubits the program
// declares (registers, or the highest physical $k + 1; at least 1).
std::string check_program(std::string_view text, std::size_t qubits, std::size_t* used) {
    *used = 1;
    const std::size_t start = skip_blank(text, 0);
    if (text.substr(start, 8) != "OPENQASM" ||
        text.substr(skip_blank(text, start + 8), 1) != "3") {
        return "the program is not OpenQASM 3 (it must begin with 'OPENQASM 3')";
    }
    std::size_t declared = 0;
    std::size_t physical = 0;
    std::size_t line_no = 1;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\n') {
            ++line_no;
            continue;
        }
        const bool word_start = i == 0 || !(std::isalnum(static_cast<unsigned char>(text[i - 1])) ||
                                            text[i - 1] == '_');
        if (text[i] == '$') {
            std::size_t j = i + 1;
            while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) {
                ++j;
            }
            if (const auto k = number_of<std::size_t>(text.substr(i + 1, j - i - 1))) {
                physical = std::max(physical, *k + 1);
                if (qubits != 0 && *k >= qubits) {
                    return "line " + std::to_string(line_no) + ": physical qubit $" + std::to_string(*k) +
                           " does not exist (the QPU has " + std::to_string(qubits) + " qubits)";
                }
            }
        } else if (word_start && text.substr(i, 5) == "qubit") {
            std::size_t j = skip_blank(text, i + 5);
            std::size_t size = 1;
            if (j < text.size() && text[j] == '[') {
                const std::size_t close = text.find(']', j);
                const auto n = close == std::string_view::npos
                                   ? std::nullopt
                                   : number_of<std::size_t>(text.substr(j + 1, close - j - 1));
                if (!n) {
                    continue;  // a size the device cannot read here: the endpoint judges it
                }
                size = *n;
            } else if (j < text.size() && !std::isalpha(static_cast<unsigned char>(text[j])) &&
                       text[j] != '_') {
                continue;  // not a declaration
            }
            declared += size;
            if (qubits != 0 && declared > qubits) {
                return "line " + std::to_string(line_no) + ": the program declares " +
                       std::to_string(declared) + " qubits, the QPU has " + std::to_string(qubits);
            }
        }
    }
    *used = std::max<std::size_t>({*used, declared, physical});
    return {};
}

// The payload qrtd hands to the endpoint: the job envelope of qrtd(8)
// ("Job payloads"), {"format": "qasm3", "shots": N, "circuits": [{"name",
// "qubits", "qasm"}...]}, one circuit per program in input order.
std::string make_payload(const std::vector<std::string>& programs, std::size_t shots) {
    json circuits = json::array();
    for (std::size_t i = 0; i < programs.size(); ++i) {
        std::size_t used = 1;
        (void)check_program(programs[i], 0, &used);
        circuits.push_back({{"name", "qdmi-" + std::to_string(i)}, {"qubits", used}, {"qasm", programs[i]}});
    }
    return json{{"format", "qasm3"}, {"shots", shots}, {"circuits", std::move(circuits)}}.dump();
}

std::string idempotency_key() {
    static std::atomic<std::uint64_t> counter{0};
    static const std::uint64_t salt = [] {
        std::random_device rd;
        return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    }();
    char buf[96];
    std::snprintf(buf, sizeof buf, "qdmi-%ld-%016llx-%llu", static_cast<long>(::getpid()),
                  static_cast<unsigned long long>(salt),
                  static_cast<unsigned long long>(counter.fetch_add(1) + 1));
    return buf;
}

int submit(QRTD_QDMI_Device_Job job) {
    auto* s = job->session;
    const std::string payload = make_payload(job->programs, job->shots);
    qrt_error err{};
    if (s->reservation_id) {
        if (s->reservation_used) {
            say("the session's reservation " + std::to_string(*s->reservation_id) +
                " already holds a job (one job per reservation; open a new session for another)");
            return QDMI_ERROR_BADSTATE;
        }
        qrt_reservation r{};
        int rc = 0;
        {
            std::lock_guard<std::mutex> lock(s->mu);
            rc = qrt_jobs_submit(s->client, *s->reservation_id, s->fencing_token.value_or(0),
                                 payload.data(), payload.size(), &r, &err);
        }
        if (rc != 0) {
            return fail_call("jobs.submit into the reservation", rc, err);
        }
        s->reservation_used = true;
        job->job_id = r.reservation_id;
        job->state = r.state;
    } else {
        json p{{"duration_ns", job->duration_ns},
               {"qpus", json::array({s->qpu})},
               {"idempotency_key", idempotency_key()},
               {"payload", rtcore::base64_encode(payload)}};
        if (job->not_before_ns) {
            p["not_before_ns"] = *job->not_before_ns;
        }
        if (job->deadline_ns) {
            p["deadline_ns"] = *job->deadline_ns;
        }
        if (job->min_fidelity) {
            p["min_fidelity"] = *job->min_fidelity;
        }
        if (job->priority) {
            p["priority"] = *job->priority;
        }
        json r;
        const int rc = s->call("jobs.submit", p, &r, &err);
        if (rc != 0) {
            return fail_call("jobs.submit", rc, err);
        }
        job->job_id = r.value("reservation_id", std::uint64_t{0});
        job->state = r.value("state", std::string());
    }
    job->status = job->job_id == 0 ? QDMI_JOB_STATUS_FAILED : status_of(job->state);
    return job->job_id == 0 ? QDMI_ERROR_FATAL : QDMI_SUCCESS;
}

int set_job_custom(QRTD_QDMI_Device_Job job, QDMI_Device_Job_Parameter param, std::size_t size,
                   const void* value) {
    if (job->session->reservation_id) {
        // The reservation fixes the slot.
        if (value != nullptr) {
            say("job CUSTOM parameters place a job; the session's reservation already fixes its slot");
        }
        return QDMI_ERROR_NOTSUPPORTED;
    }
    if (value == nullptr) {
        return QDMI_SUCCESS;
    }
    const std::string t = text_of(size, value);
    bool ok = false;
    switch (param) {
        case QDMI_DEVICE_JOB_PARAMETER_CUSTOM1:
            if (const auto v = number_of<std::int64_t>(t); v && *v >= 0) {
                job->not_before_ns = *v;
                ok = true;
            }
            break;
        case QDMI_DEVICE_JOB_PARAMETER_CUSTOM2:
            if (const auto v = number_of<std::int64_t>(t); v && *v > 0) {
                job->deadline_ns = *v;
                ok = true;
            }
            break;
        case QDMI_DEVICE_JOB_PARAMETER_CUSTOM3:
            if (const auto v = number_of<std::int64_t>(t); v && *v > 0) {
                job->duration_ns = *v;
                ok = true;
            }
            break;
        case QDMI_DEVICE_JOB_PARAMETER_CUSTOM4: {
            char* end = nullptr;
            const double f = std::strtod(t.c_str(), &end);
            if (!t.empty() && end == t.c_str() + t.size() && f >= 0.0 && f <= 1.0) {
                job->min_fidelity = f;
                ok = true;
            }
            break;
        }
        default:
            if (const auto v = number_of<std::int32_t>(t)) {
                job->priority = *v;
                ok = true;
            }
            break;
    }
    if (!ok) {
        say("job parameter CUSTOM" + std::to_string(static_cast<long>(param) - 999999994) + ": '" + t +
            "' is not valid (CUSTOM1 not_before_ns, CUSTOM2 deadline_ns, CUSTOM3 duration_ns: "
            "integers in ns; CUSTOM4 min_fidelity in [0, 1]; CUSTOM5 priority)");
        return QDMI_ERROR_INVALIDARGUMENT;
    }
    return QDMI_SUCCESS;
}

// A connection subscribed to the events that end a job (finished,
// cancelled, displaced, expired), for QRTD_QDMI_device_job_wait.
class event_feed {
public:
    explicit event_feed(const std::string& socket) {
        qrt_error err{};
        if (qrt_connect(socket.empty() ? nullptr : socket.c_str(), &_c, &err) != 0) {
            _c = nullptr;
            return;
        }
        const char* topics = R"({"topics":["job.finished","reservation.cancelled",)"
                             R"("reservation.displaced","reservation.expired"]})";
        if (qrt_call(_c, "events.subscribe", topics, nullptr, &err) != 0) {
            qrt_close(_c);
            _c = nullptr;
        }
    }
    ~event_feed() { qrt_close(_c); }
    event_feed(const event_feed&) = delete;
    event_feed& operator=(const event_feed&) = delete;

    bool ok() const noexcept { return _c != nullptr; }

    // Until an event names job_id or the slice is over.
    void wait_for(std::uint64_t job_id, std::chrono::milliseconds slice) {
        if (_c == nullptr) {
            std::this_thread::sleep_for(slice);
            return;
        }
        const auto until = std::chrono::steady_clock::now() + slice;
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                until - std::chrono::steady_clock::now());
            if (left.count() <= 0) {
                return;
            }
            char* ev = nullptr;
            qrt_error err{};
            const int rc = qrt_next_event(_c, static_cast<int>(left.count()), &ev, &err);
            if (rc == -ETIMEDOUT) {
                return;
            }
            if (rc != 0) {
                qrt_close(_c);  // the feed is gone: back to polling
                _c = nullptr;
                return;
            }
            char id[32] = {};
            const bool ours = qrt_json_get(ev, "/data/job_id", id, sizeof id) == 0 &&
                              number_of<std::uint64_t>(id) == job_id;
            qrt_free(ev);
            if (ours) {
                return;
            }
        }
    }

private:
    qrt_client* _c = nullptr;
};

}  // namespace

extern "C" {

int QRTD_QDMI_device_initialize(void) {
    g_initialized.store(true);
    return QDMI_SUCCESS;
}

int QRTD_QDMI_device_finalize(void) {
    g_initialized.store(false);
    return QDMI_SUCCESS;
}

int QRTD_QDMI_device_session_alloc(QRTD_QDMI_Device_Session* session) {
    return guarded([&]() -> int {
        if (session == nullptr) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (!g_initialized.load()) {
            return QDMI_ERROR_BADSTATE;
        }
        *session = new QRTD_QDMI_Device_Session_impl_d;
        return QDMI_SUCCESS;
    });
}

int QRTD_QDMI_device_session_set_parameter(QRTD_QDMI_Device_Session session,
                                           QDMI_Device_Session_Parameter param, size_t size,
                                           const void* value) {
    return guarded([&]() -> int {
        const long p = static_cast<long>(param);
        if (session == nullptr || p < 0 || (p >= QDMI_DEVICE_SESSION_PARAMETER_MAX && !is_custom(p)) ||
            (value != nullptr && size == 0)) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        const bool supported = param == QDMI_DEVICE_SESSION_PARAMETER_BASEURL ||
                               param == QDMI_DEVICE_SESSION_PARAMETER_CUSTOM1 ||
                               param == QDMI_DEVICE_SESSION_PARAMETER_CUSTOM2 ||
                               param == QDMI_DEVICE_SESSION_PARAMETER_CUSTOM3;
        if (!supported) {
            return QDMI_ERROR_NOTSUPPORTED;
        }
        if (session->initialized) {
            return QDMI_ERROR_BADSTATE;
        }
        if (value == nullptr) {
            return QDMI_SUCCESS;
        }
        std::string t = text_of(size, value);
        switch (param) {
            case QDMI_DEVICE_SESSION_PARAMETER_BASEURL:
                if (t.rfind("unix://", 0) == 0) {
                    t = t.substr(7);
                }
                if (t.empty() || t[0] != '/') {
                    say("BASEURL '" + t + "' is not a socket path (/path or unix:///path)");
                    return QDMI_ERROR_INVALIDARGUMENT;
                }
                session->socket = t;
                return QDMI_SUCCESS;
            case QDMI_DEVICE_SESSION_PARAMETER_CUSTOM1:
            case QDMI_DEVICE_SESSION_PARAMETER_CUSTOM2: {
                const auto v = number_of<std::uint64_t>(t);
                if (!v || *v == 0) {
                    say(std::string(param == QDMI_DEVICE_SESSION_PARAMETER_CUSTOM1 ? "CUSTOM1 (reservation id)"
                                                                               : "CUSTOM2 (fencing token)") +
                        " '" + t + "' is not a positive integer");
                    return QDMI_ERROR_INVALIDARGUMENT;
                }
                (param == QDMI_DEVICE_SESSION_PARAMETER_CUSTOM1 ? session->reservation_id
                                                                : session->fencing_token) = *v;
                return QDMI_SUCCESS;
            }
            default:
                if (t.empty() || t.size() > 127) {
                    say("CUSTOM3 (QPU name) must be 1 to 127 bytes");
                    return QDMI_ERROR_INVALIDARGUMENT;
                }
                session->qpu = t;
                return QDMI_SUCCESS;
        }
    });
}

int QRTD_QDMI_device_session_init(QRTD_QDMI_Device_Session session) {
    return guarded([&]() -> int {
        if (session == nullptr) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (!g_initialized.load() || session->initialized) {
            return QDMI_ERROR_BADSTATE;
        }
        // Inside a Slurm step, the step's reservation.
        if (!session->reservation_id) {
            if (const char* e = std::getenv("QRT_RESERVATION_ID"); e != nullptr && e[0] != '\0') {
                std::string_view ids(e);
                session->reservation_id = number_of<std::uint64_t>(ids.substr(0, ids.find(',')));
            }
        }
        if (session->reservation_id && !session->fencing_token) {
            if (const char* e = std::getenv("QRT_FENCING_TOKEN"); e != nullptr) {
                session->fencing_token = number_of<std::uint64_t>(e);
            }
        }
        // A session whose init failed may try again: start from nothing.
        qrt_close(session->client);
        session->client = nullptr;
        session->has_device = false;
        session->sites.clear();
        session->site_store.clear();
        session->ops.clear();
        session->op_store.clear();
        session->coupling.clear();
        qrt_error err{};
        const int rc = qrt_connect(session->socket.empty() ? nullptr : session->socket.c_str(),
                                   &session->client, &err);
        if (rc != 0) {
            say(std::string("cannot reach qrtd at ") +
                (session->socket.empty() ? qrt_default_socket() : session->socket.c_str()) + ": " +
                err.message);
            return rc == -EACCES ? QDMI_ERROR_PERMISSIONDENIED : QDMI_ERROR_FATAL;
        }
        qrt_set_timeout(session->client, k_call_timeout_ms);
        json hello;
        int r = session->call("agent.hello", json{{"client", "libqrtd-qdmi/" QRTD_QDMI_VERSION}}, &hello, &err);
        if (r != 0) {
            return fail_call("agent.hello", r, err);
        }
        session->agent_version = hello.is_object() ? hello.value("agent_version", hello.value("version", std::string()))
                                                   : std::string();
        if (session->reservation_id) {
            json st;
            r = session->call("jobs.status", json{{"job_id", *session->reservation_id}}, &st, &err);
            if (r != 0) {
                return fail_call("the session's reservation (CUSTOM1)", r, err);
            }
            const std::string rq = st.value("qpu", std::string());
            if (session->qpu.empty()) {
                session->qpu = rq;
            } else if (session->qpu != rq) {
                say("reservation " + std::to_string(*session->reservation_id) + " is on QPU '" + rq +
                    "', not '" + session->qpu + "' (CUSTOM3)");
                return QDMI_ERROR_INVALIDARGUMENT;
            }
            if (!session->fencing_token) {
                say("reservation " + std::to_string(*session->reservation_id) +
                    " needs its fencing token (CUSTOM2 or QRT_FENCING_TOKEN)");
                return QDMI_ERROR_PERMISSIONDENIED;
            }
        }
        json list;
        r = session->call("qpus.list", json::object(), &list, &err);
        if (r != 0) {
            return fail_call("qpus.list", r, err);
        }
        const json qpus = list.is_object() ? list.value("qpus", json::array()) : json::array();
        const json* entry = nullptr;
        for (const auto& q : qpus) {
            if (q.is_object() && (session->qpu.empty() || q.value("name", std::string()) == session->qpu)) {
                entry = &q;
                break;
            }
        }
        if (entry == nullptr) {
            say(session->qpu.empty() ? std::string("qrtd serves no QPU")
                                     : "qrtd has no QPU named '" + session->qpu + "' (CUSTOM3)");
            return QDMI_ERROR_NOTFOUND;
        }
        session->qpu = entry->value("name", std::string());
        load_device(session, entry->value("device", json()));
        session->initialized = true;
        return QDMI_SUCCESS;
    });
}

void QRTD_QDMI_device_session_free(QRTD_QDMI_Device_Session session) { delete session; }

int QRTD_QDMI_device_session_query_device_property(QRTD_QDMI_Device_Session session,
                                                   QDMI_Device_Property prop, size_t size,
                                                   void* value, size_t* size_ret) {
    return guarded([&]() -> int {
        const long p = static_cast<long>(prop);
        if (session == nullptr || p < 0 || (p >= QDMI_DEVICE_PROPERTY_MAX && !is_custom(p))) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (!session->initialized) {
            return QDMI_ERROR_BADSTATE;
        }
        auto* s = session;
        switch (prop) {
            case QDMI_DEVICE_PROPERTY_NAME:
                return give_string("qrtd/" + s->qpu, size, value, size_ret);
            case QDMI_DEVICE_PROPERTY_VERSION:
                return give_string(s->agent_version.empty() ? std::string("unknown") : s->agent_version, size,
                                   value, size_ret);
            case QDMI_DEVICE_PROPERTY_LIBRARYVERSION:
                return give_string(QRTD_QDMI_SPEC_VERSION, size, value, size_ret);
            case QDMI_DEVICE_PROPERTY_QUBITSNUM:
                if (!s->has_device) {
                    return QDMI_ERROR_NOTSUPPORTED;
                }
                return give(s->sites.size(), size, value, size_ret);
            case QDMI_DEVICE_PROPERTY_SITES:
                if (!s->has_device) {
                    return QDMI_ERROR_NOTSUPPORTED;
                }
                return give_list(s->sites, size, value, size_ret);
            case QDMI_DEVICE_PROPERTY_OPERATIONS:
                if (!s->has_device) {
                    return QDMI_ERROR_NOTSUPPORTED;
                }
                return give_list(s->ops, size, value, size_ret);
            case QDMI_DEVICE_PROPERTY_COUPLINGMAP:
                if (!s->has_device) {
                    return QDMI_ERROR_NOTSUPPORTED;
                }
                return give_list(s->coupling, size, value, size_ret);
            case QDMI_DEVICE_PROPERTY_DURATIONUNIT:
                return give_string("ns", size, value, size_ret);
            case QDMI_DEVICE_PROPERTY_DURATIONSCALEFACTOR:
                return give(1.0, size, value, size_ret);
            case QDMI_DEVICE_PROPERTY_SUPPORTEDPROGRAMFORMATS:
                return give_list(std::vector<QDMI_Program_Format>{QDMI_PROGRAM_FORMAT_QASM3}, size, value,
                                 size_ret);
            case QDMI_DEVICE_PROPERTY_STATUS:
            case QDMI_DEVICE_PROPERTY_QUEUELENGTH: {
                // Both are read now, from qrtd.
                if (value != nullptr && size < (prop == QDMI_DEVICE_PROPERTY_STATUS ? sizeof(QDMI_Device_Status)
                                                                                    : sizeof(std::size_t))) {
                    return QDMI_ERROR_INVALIDARGUMENT;
                }
                qrt_error err{};
                int rc = 0;
                const json q = qpu_entry(s, &err, &rc);
                if (rc != 0) {
                    return fail_call("qpus.list", rc, err);
                }
                if (q.is_null()) {
                    say("QPU '" + s->qpu + "' is no longer served by qrtd");
                    return QDMI_ERROR_FATAL;
                }
                if (prop == QDMI_DEVICE_PROPERTY_QUEUELENGTH) {
                    if (!q.contains("queued_jobs") || !q["queued_jobs"].is_number_unsigned()) {
                        return QDMI_ERROR_NOTSUPPORTED;
                    }
                    return give(q["queued_jobs"].get<std::size_t>(), size, value, size_ret);
                }
                QDMI_Device_Status st = QDMI_DEVICE_STATUS_IDLE;
                if (!q.value("endpoint_up", true)) {
                    st = QDMI_DEVICE_STATUS_OFFLINE;
                } else {
                    bool in_window = false;
                    if (q.contains("window")) {
                        in_window = !q["window"].is_null();
                    } else {
                        json cal;
                        rc = s->call("calibration.get", json{{"qpu", s->qpu}}, &cal, &err);
                        if (rc != 0) {
                            return fail_call("calibration.get", rc, err);
                        }
                        const std::int64_t t = now_ns();
                        for (const auto& w : cal.value("windows", json::array())) {
                            if (w.value("valid_from_ns", std::int64_t{0}) <= t &&
                                t < w.value("valid_until_ns", std::int64_t{0})) {
                                in_window = true;
                                break;
                            }
                        }
                    }
                    // A blackout, or inside a calibration block qrtd granted
                    // (qrtd(8), CALIBRATION BLOCKS): calibrating.
                    if (!in_window || q.value("calibrating", false)) {
                        st = QDMI_DEVICE_STATUS_CALIBRATION;
                    } else if (q.value("queued_jobs", std::size_t{0}) > 0) {
                        st = QDMI_DEVICE_STATUS_BUSY;
                    }
                }
                return give(st, size, value, size_ret);
            }
            default:
                return QDMI_ERROR_NOTSUPPORTED;  // reserved, custom and the rest
        }
    });
}

int QRTD_QDMI_device_session_query_site_property(QRTD_QDMI_Device_Session session, QRTD_QDMI_Site site,
                                                 QDMI_Site_Property prop, size_t size, void* value,
                                                 size_t* size_ret) {
    return guarded([&]() -> int {
        const long p = static_cast<long>(prop);
        if (session == nullptr || site == nullptr || p < 0 ||
            (p >= QDMI_SITE_PROPERTY_MAX && !is_custom(p))) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (!session->initialized) {
            return QDMI_ERROR_BADSTATE;
        }
        if (!session->site_known(site)) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        switch (prop) {
            case QDMI_SITE_PROPERTY_INDEX:
                return give(site->index, size, value, size_ret);
            case QDMI_SITE_PROPERTY_NAME:
                return give_string(site->name, size, value, size_ret);
            case QDMI_SITE_PROPERTY_ISZONE:
                return give(false, size, value, size_ret);
            default:
                return QDMI_ERROR_NOTSUPPORTED;
        }
    });
}

int QRTD_QDMI_device_session_query_operation_property(QRTD_QDMI_Device_Session session,
                                                      QRTD_QDMI_Operation operation, size_t num_sites,
                                                      const QRTD_QDMI_Site* sites, size_t num_params,
                                                      const double* params, QDMI_Operation_Property prop,
                                                      size_t size, void* value, size_t* size_ret) {
    return guarded([&]() -> int {
        const long p = static_cast<long>(prop);
        if (session == nullptr || operation == nullptr || p < 0 ||
            (p >= QDMI_OPERATION_PROPERTY_MAX && !is_custom(p))) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (!session->initialized) {
            return QDMI_ERROR_BADSTATE;
        }
        if (!session->op_known(operation)) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (sites != nullptr) {
            // The facts are site-independent: the sites must be a valid tuple.
            if (operation->qubits && num_sites != *operation->qubits) {
                return QDMI_ERROR_INVALIDARGUMENT;
            }
            for (std::size_t i = 0; i < num_sites; ++i) {
                if (!session->site_known(sites[i])) {
                    return QDMI_ERROR_INVALIDARGUMENT;
                }
            }
        }
        (void)num_params;
        (void)params;
        switch (prop) {
            case QDMI_OPERATION_PROPERTY_NAME:
                return give_string(operation->name, size, value, size_ret);
            case QDMI_OPERATION_PROPERTY_QUBITSNUM:
                if (!operation->qubits) {
                    return QDMI_ERROR_NOTSUPPORTED;
                }
                return give(*operation->qubits, size, value, size_ret);
            case QDMI_OPERATION_PROPERTY_PARAMETERSNUM:
                return give(operation->params, size, value, size_ret);
            case QDMI_OPERATION_PROPERTY_DURATION:
                if (!operation->duration_ns) {
                    return QDMI_ERROR_NOTSUPPORTED;
                }
                return give(*operation->duration_ns, size, value, size_ret);
            case QDMI_OPERATION_PROPERTY_ISZONED:
                return give(false, size, value, size_ret);
            case QDMI_OPERATION_PROPERTY_SITES:
                if (!operation->qubits || operation->sites.empty()) {
                    return QDMI_ERROR_NOTSUPPORTED;
                }
                return give_list(operation->sites, size, value, size_ret);
            default:
                return QDMI_ERROR_NOTSUPPORTED;
        }
    });
}

int QRTD_QDMI_device_session_create_device_job(QRTD_QDMI_Device_Session session, QRTD_QDMI_Device_Job* job) {
    return guarded([&]() -> int {
        if (session == nullptr || job == nullptr) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (!session->initialized) {
            return QDMI_ERROR_BADSTATE;
        }
        auto* j = new QRTD_QDMI_Device_Job_impl_d;
        j->session = session;
        if (session->max_shots) {
            j->shots = std::min(j->shots, *session->max_shots);
        }
        *job = j;
        return QDMI_SUCCESS;
    });
}

int QRTD_QDMI_device_session_retrieve_device_job_by_id(QRTD_QDMI_Device_Session session, const char* job_id,
                                                       QRTD_QDMI_Device_Job* job) {
    return guarded([&]() -> int {
        if (session == nullptr || job_id == nullptr || job == nullptr || job_id[0] == '\0') {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (!session->initialized) {
            return QDMI_ERROR_BADSTATE;
        }
        const auto id = number_of<std::uint64_t>(job_id);
        if (!id || *id == 0) {
            return QDMI_ERROR_NOTFOUND;
        }
        qrt_error err{};
        json st;
        const int rc = session->call("jobs.status", json{{"job_id", *id}}, &st, &err);
        if (rc == -EREMOTEIO && std::strcmp(err.reason, "not_found") == 0) {
            return QDMI_ERROR_NOTFOUND;
        }
        if (rc != 0) {
            return fail_call("jobs.status", rc, err);
        }
        auto j = std::make_unique<QRTD_QDMI_Device_Job_impl_d>();
        j->session = session;
        j->retrieved = true;
        j->job_id = *id;
        j->state = st.value("state", std::string());
        j->status = status_of(j->state);
        *job = j.release();
        return QDMI_SUCCESS;
    });
}

int QRTD_QDMI_device_job_set_parameter(QRTD_QDMI_Device_Job job, QDMI_Device_Job_Parameter param, size_t size,
                                       const void* value) {
    return guarded([&]() -> int {
        const long p = static_cast<long>(param);
        if (job == nullptr || p < 0 || (p >= QDMI_DEVICE_JOB_PARAMETER_MAX && !is_custom(p)) ||
            (value != nullptr && size == 0)) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (param != QDMI_DEVICE_JOB_PARAMETER_SHOTSNUM && !is_custom(p)) {
            return QDMI_ERROR_NOTSUPPORTED;  // the reserved, removed values
        }
        if (value != nullptr && (job->retrieved || job->job_id != 0)) {
            return QDMI_ERROR_BADSTATE;
        }
        if (is_custom(p)) {
            return set_job_custom(job, param, size, value);
        }
        if (value == nullptr) {
            return QDMI_SUCCESS;
        }
        if (size != sizeof(std::size_t)) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        std::size_t shots = 0;
        std::memcpy(&shots, value, sizeof shots);
        const std::size_t most = job->session->max_shots.value_or(k_max_shots);
        if (shots == 0 || shots > most) {
            say("shots " + std::to_string(shots) + " is not accepted: 1 to " + std::to_string(most) +
                (job->session->max_shots ? " (the QPU's max_shots)" : ""));
            return QDMI_ERROR_NOTSUPPORTED;
        }
        job->shots = shots;
        return QDMI_SUCCESS;
    });
}

int QRTD_QDMI_device_job_set_programs(QRTD_QDMI_Device_Job job, QDMI_Program_Format format, size_t count,
                                      const size_t* sizes, const void* const* programs) {
    return guarded([&]() -> int {
        const long f = static_cast<long>(format);
        if (job == nullptr || count == 0 || f < 0 || (f >= QDMI_PROGRAM_FORMAT_MAX && !is_custom(f))) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (format != QDMI_PROGRAM_FORMAT_QASM3 || count > k_max_programs) {
            if (programs != nullptr) {
                say(format != QDMI_PROGRAM_FORMAT_QASM3
                        ? std::string("only OpenQASM 3 programs (QASM3) are accepted")
                        : std::to_string(count) + " programs: a qrtd job holds at most " +
                              std::to_string(k_max_programs));
            }
            return QDMI_ERROR_NOTSUPPORTED;
        }
        if (programs == nullptr) {
            return QDMI_SUCCESS;
        }
        if (sizes == nullptr) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        for (std::size_t i = 0; i < count; ++i) {
            const auto* text = static_cast<const char*>(programs[i]);
            if (text == nullptr || sizes[i] == 0 || text[sizes[i] - 1] != '\0' ||
                std::memchr(text, '\0', sizes[i] - 1) != nullptr) {
                return QDMI_ERROR_INVALIDARGUMENT;  // a text program ends in exactly one NUL
            }
        }
        if (job->retrieved || job->job_id != 0) {
            return QDMI_ERROR_BADSTATE;
        }
        const std::size_t qubits = job->session->has_device ? job->session->sites.size() : 0;
        std::vector<std::string> list;
        for (std::size_t i = 0; i < count; ++i) {
            const std::string_view program(static_cast<const char*>(programs[i]), sizes[i] - 1);
            std::size_t used = 0;
            if (const std::string why = check_program(program, qubits, &used); !why.empty()) {
                say(count == 1 ? why : "program " + std::to_string(i) + ": " + why);
                return QDMI_ERROR_NOTSUPPORTED;
            }
            list.emplace_back(program);
        }
        job->programs = std::move(list);  // the list changes only when all of it is good
        return QDMI_SUCCESS;
    });
}

int QRTD_QDMI_device_job_get_program(QRTD_QDMI_Device_Job job, size_t program_index, size_t size, void* data,
                                     size_t* size_ret) {
    return guarded([&]() -> int {
        if (job == nullptr) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (job->retrieved) {
            return QDMI_ERROR_NOTSUPPORTED;  // qrtd does not give a job's payload back
        }
        if (job->programs.empty()) {
            return QDMI_ERROR_BADSTATE;
        }
        if (program_index >= job->programs.size()) {
            return QDMI_ERROR_OUTOFRANGE;
        }
        return give_string(job->programs[program_index], size, data, size_ret);
    });
}

int QRTD_QDMI_device_job_get_program_status(QRTD_QDMI_Device_Job job, size_t program_index,
                                            QDMI_Job_Status* status) {
    (void)status;
    if (job == nullptr) {
        return QDMI_ERROR_INVALIDARGUMENT;
    }
    if (job->programs.empty() && !job->retrieved) {
        return QDMI_ERROR_BADSTATE;
    }
    if (!job->retrieved && program_index >= job->programs.size()) {
        return QDMI_ERROR_OUTOFRANGE;
    }
    return QDMI_ERROR_NOTSUPPORTED;  // the programs of a job share one outcome: the job's
}

int QRTD_QDMI_device_job_query_property(QRTD_QDMI_Device_Job job, QDMI_Device_Job_Property prop, size_t size,
                                        void* value, size_t* size_ret) {
    return guarded([&]() -> int {
        const long p = static_cast<long>(prop);
        if (job == nullptr || p < 0 || (p >= QDMI_DEVICE_JOB_PROPERTY_MAX && !is_custom(p))) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        switch (prop) {
            case QDMI_DEVICE_JOB_PROPERTY_ID:
                if (job->job_id == 0) {
                    return QDMI_ERROR_BADSTATE;  // qrtd names a job when it accepts it
                }
                return give_string(std::to_string(job->job_id), size, value, size_ret);
            case QDMI_DEVICE_JOB_PROPERTY_PROGRAMFORMAT:
                if (job->retrieved) {
                    return QDMI_ERROR_NOTSUPPORTED;
                }
                if (job->programs.empty()) {
                    return QDMI_ERROR_BADSTATE;
                }
                return give(QDMI_PROGRAM_FORMAT_QASM3, size, value, size_ret);
            case QDMI_DEVICE_JOB_PROPERTY_SHOTSNUM:
                if (job->retrieved) {
                    return QDMI_ERROR_NOTSUPPORTED;
                }
                return give(job->shots, size, value, size_ret);
            case QDMI_DEVICE_JOB_PROPERTY_PROGRAMSNUM:
                if (job->retrieved) {
                    // Known once its results are: one histogram per program.
                    if (const int rc = refresh(job); rc != QDMI_SUCCESS) {
                        return rc;
                    }
                    if (job->status != QDMI_JOB_STATUS_DONE) {
                        return QDMI_ERROR_NOTSUPPORTED;
                    }
                    if (const int rc = load_results(job); rc != QDMI_SUCCESS) {
                        return rc;
                    }
                    return give(job->results.size(), size, value, size_ret);
                }
                if (job->programs.empty()) {
                    return QDMI_ERROR_BADSTATE;
                }
                return give(job->programs.size(), size, value, size_ret);
            default:
                return QDMI_ERROR_NOTSUPPORTED;  // queue position: qrtd places by time, not by queue
        }
    });
}

int QRTD_QDMI_device_job_submit(QRTD_QDMI_Device_Job job) {
    return guarded([&]() -> int {
        if (job == nullptr) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (job->retrieved || job->job_id != 0 || job->programs.empty()) {
            return QDMI_ERROR_BADSTATE;
        }
        return submit(job);
    });
}

int QRTD_QDMI_device_job_cancel(QRTD_QDMI_Device_Job job) {
    return guarded([&]() -> int {
        if (job == nullptr) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (job->job_id == 0) {
            if (job->status == QDMI_JOB_STATUS_CREATED) {
                job->status = QDMI_JOB_STATUS_CANCELED;  // never left this process
                return QDMI_SUCCESS;
            }
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (const int rc = refresh(job); rc != QDMI_SUCCESS) {
            return rc;
        }
        if (job->status == QDMI_JOB_STATUS_DONE) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (job->status == QDMI_JOB_STATUS_CANCELED) {
            return QDMI_SUCCESS;
        }
        qrt_error err{};
        int rc = 0;
        {
            std::lock_guard<std::mutex> lock(job->session->mu);
            rc = qrt_jobs_cancel(job->session->client, job->job_id, &err);
        }
        if (rc != 0) {
            // "Too late": the job is already on its way to the QPU.
            return fail_call("jobs.cancel", rc, err);
        }
        job->status = QDMI_JOB_STATUS_CANCELED;
        job->state = "cancelled";
        return QDMI_SUCCESS;
    });
}

int QRTD_QDMI_device_job_check(QRTD_QDMI_Device_Job job, QDMI_Job_Status* status) {
    return guarded([&]() -> int {
        if (job == nullptr || status == nullptr) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (const int rc = refresh(job); rc != QDMI_SUCCESS) {
            return rc;
        }
        *status = job->status;
        return QDMI_SUCCESS;
    });
}

int QRTD_QDMI_device_job_wait(QRTD_QDMI_Device_Job job, size_t timeout) {
    return guarded([&]() -> int {
        if (job == nullptr) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        if (job->job_id == 0) {
            return terminal(job->status) ? QDMI_SUCCESS : QDMI_ERROR_BADSTATE;  // never submitted
        }
        if (const int rc = refresh(job); rc != QDMI_SUCCESS || terminal(job->status)) {
            return rc;
        }
        using clock = std::chrono::steady_clock;
        const auto until = clock::now() + std::chrono::seconds(timeout);
        // Woken by qrtd's events for the job on a connection of its own;
        // jobs.status at least every second all the same (and every 100 ms
        // when events cannot be had).
        event_feed feed(job->session->socket);
        if (const int rc = refresh(job); rc != QDMI_SUCCESS || terminal(job->status)) {
            return rc;  // finished before the subscription took
        }
        for (;;) {
            const auto t = clock::now();
            if (timeout != 0 && t >= until) {
                return QDMI_ERROR_TIMEOUT;
            }
            auto slice = std::chrono::milliseconds(feed.ok() ? 1000 : 100);
            if (timeout != 0) {
                slice = std::min(slice, std::chrono::duration_cast<std::chrono::milliseconds>(until - t) +
                                            std::chrono::milliseconds(1));
            }
            feed.wait_for(job->job_id, slice);
            if (const int rc = refresh(job); rc != QDMI_SUCCESS) {
                return rc;
            }
            if (terminal(job->status)) {
                return QDMI_SUCCESS;
            }
        }
    });
}

int QRTD_QDMI_device_job_get_results(QRTD_QDMI_Device_Job job, size_t program_index, QDMI_Job_Result result,
                                     size_t size, void* data, size_t* size_ret) {
    return guarded([&]() -> int {
        const long r = static_cast<long>(result);
        if (job == nullptr || r < 0 || (r >= QDMI_JOB_RESULT_MAX && !is_custom(r))) {
            return QDMI_ERROR_INVALIDARGUMENT;
        }
        // The job's own programs say how many results there are (none set:
        // one, not yet run); a retrieved job's results say it.
        const std::size_t known = job->retrieved ? 0 : std::max<std::size_t>(job->programs.size(), 1);
        if (!job->retrieved && program_index >= known) {
            return QDMI_ERROR_OUTOFRANGE;
        }
        if (result != QDMI_JOB_RESULT_HIST_KEYS && result != QDMI_JOB_RESULT_HIST_VALUES) {
            return QDMI_ERROR_NOTSUPPORTED;  // the endpoint returns counts, not single shots
        }
        if (const int rc = refresh(job); rc != QDMI_SUCCESS) {
            return rc;
        }
        if (job->status != QDMI_JOB_STATUS_DONE) {
            return QDMI_ERROR_BADSTATE;
        }
        if (const int rc = load_results(job); rc != QDMI_SUCCESS) {
            return rc;
        }
        if (program_index >= job->results.size()) {
            if (job->retrieved) {
                return QDMI_ERROR_OUTOFRANGE;
            }
            say("job " + std::to_string(job->job_id) + ": the endpoint answered " +
                std::to_string(job->results.size()) + " histogram(s) for " + std::to_string(known) + " programs");
            return QDMI_ERROR_FATAL;
        }
        const auto& h = job->results[program_index];
        if (result == QDMI_JOB_RESULT_HIST_KEYS) {
            return give_string(h.keys, size, data, size_ret);
        }
        return give_list(h.values, size, data, size_ret);
    });
}

void QRTD_QDMI_device_job_free(QRTD_QDMI_Device_Job job) { delete job; }

}  // extern "C"
