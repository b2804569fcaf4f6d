// libqrtd-qdmi.so: the QDMI device interface (v1.x, symbol prefix QRTD)
// over libqrt-client.  One QDMI device session is one connection to qrtd's
// control socket and one of its QPUs; a QDMI job is one qrtd job.
//
// Session parameters (QRTD_QDMI_device_session_set_parameter), all text:
//   BASEURL  the qrtd socket: a path or unix:///path, or tcp://HOST:PORT for
//            another node's qrtd (its rpc.listen; libqrt-client authenticates
//            with the local munged, $QRT_MUNGE_SOCKET), default $QRT_SOCKET,
//            else the built-in /run/qrtd/qrtd.sock
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
// CALIBRATION while no calibration window is in force (a blackout).
//
// Every entry point catches everything: no C++ exception crosses the C ABI.
// A refusal that QDMI can only report as an error code is also written as
// one line on stderr ("qrtd-qdmi: ..."), naming what qrtd said.
//
// The library's files (this header is theirs alone, not an interface):
//   session.cpp  the library's state, sessions (parameters, init), creating
//                and retrieving jobs, how a failed call is told
//   device.cpp   the device's facts from qpus.list: sites, operations,
//                coupling map, status, queue length
//   job.cpp      a job: parameters, submit, check, wait, cancel, results
//   program.cpp  what a job's programs are checked for before they are
//                sent (OpenQASM 3: qrt_proto's test; the QPU's qubits), the
//                job envelope they go out in (checked by qrt_proto), and
//                the histograms that come back

#pragma once

#include "qrtd_qdmi/device.h"  // QDMI's, QRTD-prefixed at build time

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

namespace qrtd_qdmi {

constexpr std::int64_t k_default_duration_ns = 10'000'000;
constexpr std::size_t k_default_shots = 1024;
constexpr std::size_t k_max_shots = 1'000'000;  // qrtd's own ceiling (handover)
constexpr int k_call_timeout_ms = 10'000;

// Whether QRTD_QDMI_device_initialize was called (and not finalize since).
extern std::atomic<bool> g_initialized;

inline void say(const std::string& line) noexcept { std::fprintf(stderr, "qrtd-qdmi: %s\n", line.c_str()); }

inline std::int64_t now_ns() noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// A text parameter's value: NUL-terminated or not, at most size bytes.
inline std::string text_of(std::size_t size, const void* value) {
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
inline int give_bytes(const void* src, std::size_t n, std::size_t size, void* value, std::size_t* size_ret) {
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

inline int give_string(const std::string& s, std::size_t size, void* value, std::size_t* size_ret) {
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

inline bool is_custom(long v) noexcept { return v >= 999999995 && v <= 999999999; }

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

// QDMI code for a libqrt-client failure, saying it on stderr (session.cpp).
int fail_call(const char* what, int rc, const qrt_error& err);

// device.cpp: the QPU's entry of qpus.list, or null; its "device" facts
// into the session.
json qpu_entry(QRTD_QDMI_Device_Session s, qrt_error* err, int* rc);
void load_device(QRTD_QDMI_Device_Session s, const json& device);

// job.cpp: the QDMI status of a qrtd state; whether a status is final;
// jobs.status -> job->status (0 or a QDMI error).
QDMI_Job_Status status_of(std::string_view state) noexcept;
bool terminal(QDMI_Job_Status s) noexcept;
int refresh(QRTD_QDMI_Device_Job job);

// program.cpp: what is wrong with a program for a QPU of `qubits` qubits
// (empty: nothing; qubits 0: unknown) and the qubits it uses; the job
// envelope of programs (empty when qrt_proto refuses it: why says why);
// the histograms of an endpoint's result, one per program.
std::string check_program(std::string_view text, std::size_t qubits, std::size_t* used);
std::string make_payload(const std::vector<std::string>& programs, std::size_t shots, std::string* why);
using counts_t = std::vector<std::pair<std::string, std::size_t>>;
bool parse_results(std::string_view bytes, std::vector<counts_t>& out);

}  // namespace qrtd_qdmi

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

struct QRTD_QDMI_Device_Job_impl_d {
    QRTD_QDMI_Device_Session session = nullptr;
    bool retrieved = false;
    std::vector<std::string> programs;  // without their NUL; empty: not set
    std::size_t shots = qrtd_qdmi::k_default_shots;
    std::optional<std::int64_t> not_before_ns;
    std::optional<std::int64_t> deadline_ns;
    std::int64_t duration_ns = qrtd_qdmi::k_default_duration_ns;
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
