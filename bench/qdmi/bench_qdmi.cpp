// bench_qdmi: what libqrtd-qdmi.so adds to a job, against the same job
// submitted with libqrt-client in the same run.
//
// Run inside a lab (tests/integration/qdmi/qdmi_lab.py names the socket in
// QRTD_QDMI_SOCKET):
//   python3 tests/integration/qdmi/qdmi_lab.py build/bench/qdmi/bench_qdmi [--jobs N]
//
// Each round submits one 2-qubit Bell job (100 shots, duration 10 ms) both
// ways, one after the other, in alternating order:
//   qdmi: create job, set shots and program, submit, wait, read the
//         histogram keys and values (QRTD_QDMI_device_*);
//   c:    jobs.submit (one-shot, the same parameters) with qrt_call, wait
//         for its job.finished event on a connection subscribed beforehand,
//         jobs.result with qrt_jobs_result.
// The figure per job is "submit to results, minus the slot wait": the time
// from the job's slot start (start_ns, CLOCK_REALTIME, stated by qrtd) to
// the results in hand; both paths share the slot's lead and duration, so
// the difference of their percentiles is what QDMI adds.  Ends with one
// JSON line: {"bench":"qdmi_overhead",...,"added_p50_ms":...,"pass":...}
// (goal: <= 5 ms added at p50).

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "qrt/client.h"
#include "qrtd_qdmi/device.h"
#include "rtcore/base64.hpp"

namespace {

using nlohmann::json;

std::int64_t now_ns() {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

const char* const k_bell =
    "OPENQASM 3.0;\ninclude \"stdgates.inc\";\nqubit[2] q;\nbit[2] c;\nh q[0];\ncx q[0], q[1];\nc = measure q;\n";

[[noreturn]] void die(const std::string& what) {
    std::fprintf(stderr, "bench_qdmi: %s\n", what.c_str());
    std::exit(1);
}

json call(qrt_client* c, const char* method, const json& params) {
    char* out = nullptr;
    qrt_error err{};
    if (qrt_call(c, method, params.dump().c_str(), &out, &err) != 0) {
        die(std::string(method) + ": " + err.reason + ": " + err.message);
    }
    json r = json::parse(out);
    qrt_free(out);
    return r;
}

std::int64_t start_of(qrt_client* c, std::uint64_t id) {
    return call(c, "jobs.status", {{"job_id", id}}).value("start_ns", std::int64_t{0});
}

// One job through QDMI: ns from its slot start to the histogram in hand.
double qdmi_job(QRTD_QDMI_Device_Session s, qrt_client* c) {
    QRTD_QDMI_Device_Job j = nullptr;
    if (QRTD_QDMI_device_session_create_device_job(s, &j) != QDMI_SUCCESS) {
        die("create_device_job");
    }
    const std::size_t shots = 100;
    const std::size_t size = std::strlen(k_bell) + 1;
    const void* programs[] = {k_bell};
    if (QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_SHOTSNUM, sizeof shots, &shots) != 0 ||
        QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 1, &size, programs) != 0 ||
        QRTD_QDMI_device_job_submit(j) != QDMI_SUCCESS || QRTD_QDMI_device_job_wait(j, 60) != QDMI_SUCCESS) {
        die("qdmi job did not run");
    }
    std::size_t kn = 0;
    std::size_t vn = 0;
    QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_KEYS, 0, nullptr, &kn);
    std::string keys(kn, '\0');
    QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_VALUES, 0, nullptr, &vn);
    std::vector<std::size_t> values(vn / sizeof(std::size_t));
    if (QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_KEYS, kn, keys.data(), nullptr) != 0 ||
        QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_VALUES, vn, values.data(), nullptr) != 0) {
        die("qdmi results");
    }
    const std::int64_t done = now_ns();
    char id[32] = {};
    QRTD_QDMI_device_job_query_property(j, QDMI_DEVICE_JOB_PROPERTY_ID, sizeof id, id, nullptr);
    QRTD_QDMI_device_job_free(j);
    return static_cast<double>(done - start_of(c, std::strtoull(id, nullptr, 10)));
}

// The same job with libqrt-client.
double c_job(qrt_client* c, qrt_client* events, int n) {
    const std::string payload =
        json{{"format", "qasm3"},
             {"shots", 100},
             {"circuits", json::array({{{"name", "bell"}, {"qubits", 2}, {"qasm", k_bell}}})}}
            .dump();
    const json r = call(c, "jobs.submit",
                        {{"duration_ns", 10'000'000},
                         {"qpus", json::array({"qpu0"})},
                         {"idempotency_key", "bench-c-" + std::to_string(now_ns()) + "-" + std::to_string(n)},
                         {"payload", rtcore::base64_encode(payload)}});
    const auto id = r.value("reservation_id", std::uint64_t{0});
    for (int i = 0; i < 600; ++i) {
        char* ev = nullptr;
        qrt_error err{};
        if (qrt_next_event(events, 100, &ev, &err) == 0) {
            char jid[32] = {};
            char type[64] = {};
            const bool ours = qrt_json_get(ev, "/data/job_id", jid, sizeof jid) == 0 &&
                              std::strtoull(jid, nullptr, 10) == id &&
                              qrt_json_get(ev, "/type", type, sizeof type) == 0 &&
                              std::string(type) == "job.finished";
            qrt_free(ev);
            if (ours) {
                break;
            }
        }
    }
    void* data = nullptr;
    std::size_t len = 0;
    qrt_error err{};
    if (qrt_jobs_result(c, id, &data, &len, nullptr, &err) != 0) {
        die(std::string("jobs.result: ") + err.message);
    }
    const std::int64_t done = now_ns();
    qrt_free(data);
    return static_cast<double>(done - start_of(c, id));
}

double pct(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    const auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
    int jobs = 100;
    for (int i = 1; i < argc; ++i) {
        if (std::string(argv[i]) == "--jobs" && i + 1 < argc) {
            jobs = std::max(1, std::atoi(argv[++i]));
        } else if (std::string(argv[i]) == "--help") {
            std::puts("usage: qdmi_lab.py bench_qdmi [--jobs N]   (default 100 rounds)");
            return 0;
        }
    }
    const char* sock = std::getenv("QRTD_QDMI_SOCKET");
    if (sock == nullptr) {
        die("QRTD_QDMI_SOCKET is not set: run it through tests/integration/qdmi/qdmi_lab.py");
    }
    qrt_client* c = nullptr;
    qrt_client* events = nullptr;
    qrt_error err{};
    if (qrt_connect(sock, &c, &err) != 0 || qrt_connect(sock, &events, &err) != 0) {
        die(err.message);
    }
    const std::int64_t t = now_ns();
    call(c, "calibration.update",
         {{"qpu", "qpu0"},
          {"windows", json::array({{{"calibration_id", 900},
                                    {"valid_from_ns", t - 1'000'000'000},
                                    {"valid_until_ns", t + 3'600'000'000'000},
                                    {"f0", 0.99},
                                    {"tau_ns", 3'600'000'000'000}}})}});
    call(events, "events.subscribe", {{"topics", json::array({"job.finished"})}});

    QRTD_QDMI_device_initialize();
    QRTD_QDMI_Device_Session s = nullptr;
    const std::string url = std::string("unix://") + sock;
    QRTD_QDMI_device_session_alloc(&s);
    QRTD_QDMI_device_session_set_parameter(s, QDMI_DEVICE_SESSION_PARAMETER_BASEURL, url.size() + 1, url.c_str());
    if (QRTD_QDMI_device_session_init(s) != QDMI_SUCCESS) {
        die("QDMI session init");
    }
    std::vector<double> q;
    std::vector<double> cc;
    for (int i = 0; i < jobs; ++i) {
        if (i % 2 == 0) {
            q.push_back(qdmi_job(s, c));
            cc.push_back(c_job(c, events, i));
        } else {
            cc.push_back(c_job(c, events, i));
            q.push_back(qdmi_job(s, c));
        }
    }
    QRTD_QDMI_device_session_free(s);
    QRTD_QDMI_device_finalize();
    qrt_close(events);
    qrt_close(c);

    const double ms = 1e6;
    const double added_p50 = (pct(q, 0.5) - pct(cc, 0.5)) / ms;
    const double added_p99 = (pct(q, 0.99) - pct(cc, 0.99)) / ms;
    std::printf("slot start -> results, %d jobs each way\n", jobs);
    std::printf("  qdmi: p50 %.2f ms  p99 %.2f ms\n", pct(q, 0.5) / ms, pct(q, 0.99) / ms);
    std::printf("  c:    p50 %.2f ms  p99 %.2f ms\n", pct(cc, 0.5) / ms, pct(cc, 0.99) / ms);
    std::printf("  QDMI adds %.2f ms at p50, %.2f ms at p99 (goal <= 5 ms at p50): %s\n", added_p50, added_p99,
                added_p50 <= 5.0 ? "PASS" : "FAIL");
    const json out{{"bench", "qdmi_overhead"},
                   {"jobs", jobs},
                   {"qdmi_p50_ms", pct(q, 0.5) / ms},
                   {"qdmi_p99_ms", pct(q, 0.99) / ms},
                   {"c_p50_ms", pct(cc, 0.5) / ms},
                   {"c_p99_ms", pct(cc, 0.99) / ms},
                   {"added_p50_ms", added_p50},
                   {"added_p99_ms", added_p99},
                   {"pass", added_p50 <= 5.0}};
    std::puts(out.dump().c_str());
    return 0;
}
