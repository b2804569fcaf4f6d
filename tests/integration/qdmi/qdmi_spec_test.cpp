// The QDMI device interface of libqrtd-qdmi.so against a real qrtd and its
// endpoint (tests/integration/qdmi/qdmi_lab.py starts them and names the
// socket in QRTD_QDMI_SOCKET): calls before initialization, NULL arguments,
// unsupported properties and parameters, the size-query convention and
// too-small buffers, the job life cycle (submit, check, wait, results,
// cancel, free), a wait that times out in a blackout, bad programs and
// shot counts refused before anything is sent, a booked reservation
// carried in CUSTOM1/CUSTOM2, and retrieving a job by its id.
//
// The tests run in one process, in the order written: the first one checks
// what the library says before QRTD_QDMI_device_initialize.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "qrt/client.h"
#include "qrtd_qdmi/device.h"

namespace {

using nlohmann::json;

constexpr std::int64_t k_s = 1'000'000'000;

const char* socket_path() {
    const char* s = std::getenv("QRTD_QDMI_SOCKET");
    return s != nullptr ? s : "";
}
bool with_device() {
    const char* d = std::getenv("QRTD_QDMI_DEVICE");
    return d != nullptr && std::string(d) == "1";
}
bool with_aer() {
    const char* e = std::getenv("QRTD_QDMI_ENDPOINT");
    return e != nullptr && std::string(e) == "aer";
}

// The slot a job books: qpu-aer simulates in Python, and qrtd waits 1 s past
// a job's end for its result; on a loaded host that needs a longer slot.
std::int64_t job_duration_ns() { return with_aer() ? 3 * k_s : 10'000'000; }

std::int64_t now_ns() {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * k_s + ts.tv_nsec;
}

// One JSON-RPC call to the lab's qrtd (as the test, not through QDMI).
json rpc(const char* method, const json& params) {
    qrt_client* c = nullptr;
    qrt_error err{};
    if (qrt_connect(socket_path(), &c, &err) != 0) {
        ADD_FAILURE() << "connect: " << err.message;
        return nullptr;
    }
    char* out = nullptr;
    const int rc = qrt_call(c, method, params.dump().c_str(), &out, &err);
    json r = rc == 0 ? json::parse(out) : json{{"error", err.reason}, {"message", err.message}};
    qrt_free(out);
    qrt_close(c);
    return r;
}

// qpu0's calibration: windows [from_s, until_s) seconds from now.
void push_windows(std::vector<std::pair<double, double>> ws) {
    const std::int64_t t = now_ns();
    json arr = json::array();
    std::uint64_t id = static_cast<std::uint64_t>(t / k_s);
    for (const auto& [a, b] : ws) {
        arr.push_back({{"calibration_id", ++id},
                       {"valid_from_ns", t + static_cast<std::int64_t>(a * 1e9)},
                       {"valid_until_ns", t + static_cast<std::int64_t>(b * 1e9)},
                       {"f0", 0.99},
                       {"tau_ns", 3600 * k_s}});
    }
    const json r = rpc("calibration.update", {{"qpu", "qpu0"}, {"windows", arr}});
    ASSERT_TRUE(r.contains("windows")) << r.dump();
}

std::size_t queued_jobs() {
    const json r = rpc("qpus.list", json::object());
    return r["qpus"][0].value("queued_jobs", std::size_t{0});
}

const char* const k_bell =
    "OPENQASM 3.0;\ninclude \"stdgates.inc\";\nqubit[2] q;\nbit[2] c;\nh q[0];\ncx q[0], q[1];\nc = measure q;\n";

int set_text(QRTD_QDMI_Device_Session s, QDMI_Device_Session_Parameter p, const std::string& v) {
    return QRTD_QDMI_device_session_set_parameter(s, p, v.size() + 1, v.c_str());
}

QRTD_QDMI_Device_Session open_session(const std::string& reservation = {}, const std::string& token = {}) {
    QRTD_QDMI_Device_Session s = nullptr;
    EXPECT_EQ(QRTD_QDMI_device_session_alloc(&s), QDMI_SUCCESS);
    EXPECT_EQ(set_text(s, QDMI_DEVICE_SESSION_PARAMETER_BASEURL, std::string("unix://") + socket_path()),
              QDMI_SUCCESS);
    if (!reservation.empty()) {
        EXPECT_EQ(set_text(s, QDMI_DEVICE_SESSION_PARAMETER_CUSTOM1, reservation), QDMI_SUCCESS);
        EXPECT_EQ(set_text(s, QDMI_DEVICE_SESSION_PARAMETER_CUSTOM2, token), QDMI_SUCCESS);
    }
    EXPECT_EQ(QRTD_QDMI_device_session_init(s), QDMI_SUCCESS);
    return s;
}

std::string string_prop(QRTD_QDMI_Device_Session s, QDMI_Device_Property p) {
    std::size_t n = 0;
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, p, 0, nullptr, &n), QDMI_SUCCESS);
    std::string v(n, '\0');
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, p, n, v.data(), nullptr), QDMI_SUCCESS);
    if (!v.empty()) {
        v.pop_back();
    }
    return v;
}

QDMI_Device_Status status_of(QRTD_QDMI_Device_Session s) {
    QDMI_Device_Status st = QDMI_DEVICE_STATUS_ERROR;
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_STATUS, sizeof st, &st,
                                                             nullptr),
              QDMI_SUCCESS);
    return st;
}

QRTD_QDMI_Device_Job bell_job(QRTD_QDMI_Device_Session s, std::size_t shots) {
    QRTD_QDMI_Device_Job j = nullptr;
    EXPECT_EQ(QRTD_QDMI_device_session_create_device_job(s, &j), QDMI_SUCCESS);
    EXPECT_EQ(QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_SHOTSNUM, sizeof shots, &shots),
              QDMI_SUCCESS);
    const std::size_t size = std::strlen(k_bell) + 1;
    const void* programs[] = {k_bell};
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 1, &size, programs), QDMI_SUCCESS);
    const std::string d = std::to_string(job_duration_ns());
    // A session with a reservation refuses placement parameters: its slot is fixed.
    (void)QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_CUSTOM3, d.size() + 1, d.c_str());
    return j;
}

std::string job_id(QRTD_QDMI_Device_Job j) {
    std::size_t n = 0;
    EXPECT_EQ(QRTD_QDMI_device_job_query_property(j, QDMI_DEVICE_JOB_PROPERTY_ID, 0, nullptr, &n), QDMI_SUCCESS);
    std::string v(n, '\0');
    EXPECT_EQ(QRTD_QDMI_device_job_query_property(j, QDMI_DEVICE_JOB_PROPERTY_ID, n, v.data(), nullptr),
              QDMI_SUCCESS);
    v.pop_back();
    return v;
}

// The histogram of a finished job.
std::vector<std::pair<std::string, std::size_t>> histogram(QRTD_QDMI_Device_Job j) {
    std::size_t kn = 0;
    std::size_t vn = 0;
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_KEYS, 0, nullptr, &kn), QDMI_SUCCESS);
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_VALUES, 0, nullptr, &vn), QDMI_SUCCESS);
    std::string keys(kn, '\0');
    std::vector<std::size_t> values(vn / sizeof(std::size_t));
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_KEYS, kn, keys.data(), nullptr),
              QDMI_SUCCESS);
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_VALUES, vn, values.data(), nullptr),
              QDMI_SUCCESS);
    keys.pop_back();
    std::vector<std::pair<std::string, std::size_t>> out;
    std::size_t pos = 0;
    for (std::size_t v : values) {
        const std::size_t comma = keys.find(',', pos);
        out.emplace_back(keys.substr(pos, comma - pos), v);
        pos = comma == std::string::npos ? keys.size() : comma + 1;
    }
    EXPECT_EQ(pos, keys.size()) << "as many keys as values";
    return out;
}

class Env : public ::testing::Environment {
public:
    void SetUp() override {
        if (socket_path()[0] == '\0') {
            GTEST_SKIP() << "QRTD_QDMI_SOCKET is not set: run through qdmi_lab.py (ctest qdmi.spec)";
        }
    }
};

// Before QRTD_QDMI_device_initialize nothing is served.
TEST(QdmiSpec, CallsBeforeInitializeAreRefused) {
    QRTD_QDMI_Device_Session s = nullptr;
    EXPECT_EQ(QRTD_QDMI_device_session_alloc(&s), QDMI_ERROR_BADSTATE);
    EXPECT_EQ(s, nullptr);
    ASSERT_EQ(QRTD_QDMI_device_initialize(), QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_session_alloc(&s), QDMI_SUCCESS);
    // A session is used only once initialized.
    std::size_t n = 0;
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_NAME, 0, nullptr, &n),
              QDMI_ERROR_BADSTATE);
    QRTD_QDMI_Device_Job j = nullptr;
    EXPECT_EQ(QRTD_QDMI_device_session_create_device_job(s, &j), QDMI_ERROR_BADSTATE);
    EXPECT_EQ(j, nullptr);
    // A socket nobody listens on: init fails, naming it on stderr.
    EXPECT_EQ(set_text(s, QDMI_DEVICE_SESSION_PARAMETER_BASEURL, "/nonexistent/qrtd.sock"), QDMI_SUCCESS);
    EXPECT_EQ(QRTD_QDMI_device_session_init(s), QDMI_ERROR_FATAL);
    // A failed init may be tried again with the right socket.
    EXPECT_EQ(set_text(s, QDMI_DEVICE_SESSION_PARAMETER_BASEURL, socket_path()), QDMI_SUCCESS);
    EXPECT_EQ(QRTD_QDMI_device_session_init(s), QDMI_SUCCESS);
    QRTD_QDMI_device_session_free(s);
    // Parameters are set before init, and init happens once.
    s = open_session();
    EXPECT_EQ(set_text(s, QDMI_DEVICE_SESSION_PARAMETER_BASEURL, socket_path()), QDMI_ERROR_BADSTATE);
    EXPECT_EQ(QRTD_QDMI_device_session_init(s), QDMI_ERROR_BADSTATE);
    QRTD_QDMI_device_session_free(s);
}

TEST(QdmiSpec, NullArgumentsAreInvalid) {
    EXPECT_EQ(QRTD_QDMI_device_session_alloc(nullptr), QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(set_text(nullptr, QDMI_DEVICE_SESSION_PARAMETER_BASEURL, "/x"), QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_session_init(nullptr), QDMI_ERROR_INVALIDARGUMENT);
    std::size_t n = 0;
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(nullptr, QDMI_DEVICE_PROPERTY_NAME, 0, nullptr, &n),
              QDMI_ERROR_INVALIDARGUMENT);
    QRTD_QDMI_device_session_free(nullptr);  // fine
    QRTD_QDMI_device_job_free(nullptr);

    QRTD_QDMI_Device_Session s = open_session();
    EXPECT_EQ(QRTD_QDMI_device_session_query_site_property(s, nullptr, QDMI_SITE_PROPERTY_INDEX, 0, nullptr, &n),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_session_query_operation_property(s, nullptr, 0, nullptr, 0, nullptr,
                                                                QDMI_OPERATION_PROPERTY_NAME, 0, nullptr, &n),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_session_create_device_job(s, nullptr), QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_session_retrieve_device_job_by_id(s, nullptr, nullptr), QDMI_ERROR_INVALIDARGUMENT);
    const std::size_t shots = 10;
    EXPECT_EQ(QRTD_QDMI_device_job_set_parameter(nullptr, QDMI_DEVICE_JOB_PARAMETER_SHOTSNUM, sizeof shots, &shots),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(nullptr, QDMI_PROGRAM_FORMAT_QASM3, 1, nullptr, nullptr),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_job_submit(nullptr), QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_job_cancel(nullptr), QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_job_wait(nullptr, 1), QDMI_ERROR_INVALIDARGUMENT);
    QDMI_Job_Status st{};
    EXPECT_EQ(QRTD_QDMI_device_job_check(nullptr, &st), QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(nullptr, 0, QDMI_JOB_RESULT_HIST_KEYS, 0, nullptr, &n),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_job_query_property(nullptr, QDMI_DEVICE_JOB_PROPERTY_ID, 0, nullptr, &n),
              QDMI_ERROR_INVALIDARGUMENT);

    QRTD_QDMI_Device_Job j = nullptr;
    ASSERT_EQ(QRTD_QDMI_device_session_create_device_job(s, &j), QDMI_SUCCESS);
    EXPECT_EQ(QRTD_QDMI_device_job_check(j, nullptr), QDMI_ERROR_INVALIDARGUMENT);
    // A program list needs its sizes and no NULL program.
    const void* none[] = {nullptr};
    const std::size_t size = 5;
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 1, nullptr, none),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 1, &size, none),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 0, &size, none),
              QDMI_ERROR_INVALIDARGUMENT);
    // Nothing to submit yet.
    EXPECT_EQ(QRTD_QDMI_device_job_submit(j), QDMI_ERROR_BADSTATE);
    QRTD_QDMI_device_job_free(j);
    QRTD_QDMI_device_session_free(s);
}

TEST(QdmiSpec, UnsupportedAndInvalidValues) {
    QRTD_QDMI_Device_Session s = nullptr;
    ASSERT_EQ(QRTD_QDMI_device_session_alloc(&s), QDMI_SUCCESS);
    EXPECT_EQ(set_text(s, QDMI_DEVICE_SESSION_PARAMETER_TOKEN, "secret"), QDMI_ERROR_NOTSUPPORTED);
    EXPECT_EQ(QRTD_QDMI_device_session_set_parameter(s, QDMI_DEVICE_SESSION_PARAMETER_TOKEN, 0, nullptr),
              QDMI_ERROR_NOTSUPPORTED);
    EXPECT_EQ(QRTD_QDMI_device_session_set_parameter(s, QDMI_DEVICE_SESSION_PARAMETER_CUSTOM1, 0, nullptr),
              QDMI_SUCCESS);  // a support check
    EXPECT_EQ(QRTD_QDMI_device_session_set_parameter(s, QDMI_DEVICE_SESSION_PARAMETER_MAX, 2, "x"),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_session_set_parameter(s, QDMI_DEVICE_SESSION_PARAMETER_BASEURL, 0, "x"),
              QDMI_ERROR_INVALIDARGUMENT);  // a value of size 0
    EXPECT_EQ(set_text(s, QDMI_DEVICE_SESSION_PARAMETER_BASEURL, "https://example.invalid/"),
              QDMI_ERROR_INVALIDARGUMENT);  // not a socket path
    EXPECT_EQ(set_text(s, QDMI_DEVICE_SESSION_PARAMETER_CUSTOM1, "twelve"), QDMI_ERROR_INVALIDARGUMENT);
    QRTD_QDMI_device_session_free(s);

    s = open_session();
    std::size_t n = 0;
    for (auto p : {QDMI_DEVICE_PROPERTY_LENGTHUNIT, QDMI_DEVICE_PROPERTY_MINATOMDISTANCE,
                   QDMI_DEVICE_PROPERTY_CHILDDEVICES, QDMI_DEVICE_PROPERTY_CUSTOM4}) {
        EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, p, 0, nullptr, &n), QDMI_ERROR_NOTSUPPORTED)
            << "property " << p;
    }
    // A removed property's reserved value is unsupported, not invalid.
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, static_cast<QDMI_Device_Property>(8), 0, nullptr,
                                                             &n),
              QDMI_ERROR_NOTSUPPORTED);
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_MAX, 0, nullptr, &n),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, static_cast<QDMI_Device_Property>(12345), 0,
                                                             nullptr, &n),
              QDMI_ERROR_INVALIDARGUMENT);

    QRTD_QDMI_Device_Job j = nullptr;
    ASSERT_EQ(QRTD_QDMI_device_session_create_device_job(s, &j), QDMI_SUCCESS);
    const std::size_t size = std::strlen(k_bell) + 1;
    const void* programs[] = {k_bell};
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM2, 1, &size, programs),
              QDMI_ERROR_NOTSUPPORTED);
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 257, nullptr, nullptr),
              QDMI_ERROR_NOTSUPPORTED);  // at most 256 circuits per qrtd job
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 2, nullptr, nullptr),
              QDMI_SUCCESS);
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 1, nullptr, nullptr),
              QDMI_SUCCESS);  // a support check
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, static_cast<QDMI_Program_Format>(6), 1, nullptr, nullptr),
              QDMI_ERROR_NOTSUPPORTED);  // a removed format
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, static_cast<QDMI_Program_Format>(777), 1, nullptr, nullptr),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_job_set_parameter(j, static_cast<QDMI_Device_Job_Parameter>(0), 0, nullptr),
              QDMI_ERROR_NOTSUPPORTED);  // the removed program format parameter
    EXPECT_EQ(QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_MAX, 0, nullptr),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_job_query_property(j, QDMI_DEVICE_JOB_PROPERTY_QUEUEPOSITION, 0, nullptr, &n),
              QDMI_ERROR_NOTSUPPORTED);
    EXPECT_EQ(QRTD_QDMI_device_job_query_property(j, QDMI_DEVICE_JOB_PROPERTY_ID, 0, nullptr, &n),
              QDMI_ERROR_BADSTATE);  // qrtd names a job when it takes it
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_SHOTS, 0, nullptr, &n),
              QDMI_ERROR_NOTSUPPORTED);
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_STATEVECTOR_DENSE, 0, nullptr, &n),
              QDMI_ERROR_NOTSUPPORTED);
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_MAX, 0, nullptr, &n),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 1, QDMI_JOB_RESULT_HIST_KEYS, 0, nullptr, &n),
              QDMI_ERROR_OUTOFRANGE);
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_KEYS, 0, nullptr, &n),
              QDMI_ERROR_BADSTATE);  // not done
    QRTD_QDMI_device_job_free(j);
    QRTD_QDMI_device_session_free(s);
}

TEST(QdmiSpec, SizeQueriesAndTooSmallBuffers) {
    QRTD_QDMI_Device_Session s = open_session();
    std::size_t n = 0;
    ASSERT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_NAME, 0, nullptr, &n),
              QDMI_SUCCESS);
    EXPECT_EQ(n, std::strlen("qrtd/qpu0") + 1);
    std::vector<char> buf(n, 'x');
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_NAME, n - 1, buf.data(),
                                                             nullptr),
              QDMI_ERROR_INVALIDARGUMENT);
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_NAME, n, buf.data(), nullptr),
              QDMI_SUCCESS);
    EXPECT_STREQ(buf.data(), "qrtd/qpu0");
    EXPECT_EQ(string_prop(s, QDMI_DEVICE_PROPERTY_LIBRARYVERSION).substr(0, 2), "1.");
    EXPECT_FALSE(string_prop(s, QDMI_DEVICE_PROPERTY_VERSION).empty());
    EXPECT_EQ(string_prop(s, QDMI_DEVICE_PROPERTY_DURATIONUNIT), "ns");
    QDMI_Device_Status st{};
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_STATUS, sizeof st - 1, &st,
                                                             nullptr),
              QDMI_ERROR_INVALIDARGUMENT);
    std::size_t q = 0;
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_QUEUELENGTH, 1, &q, nullptr),
              QDMI_ERROR_INVALIDARGUMENT);
    ASSERT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_SUPPORTEDPROGRAMFORMATS, 0,
                                                             nullptr, &n),
              QDMI_SUCCESS);
    ASSERT_EQ(n, sizeof(QDMI_Program_Format));
    QDMI_Program_Format f{};
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_SUPPORTEDPROGRAMFORMATS, n, &f,
                                                             nullptr),
              QDMI_SUCCESS);
    EXPECT_EQ(f, QDMI_PROGRAM_FORMAT_QASM3);
    if (with_device()) {
        ASSERT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_SITES, 0, nullptr, &n),
                  QDMI_SUCCESS);
        EXPECT_EQ(n, 5 * sizeof(QRTD_QDMI_Site));
        std::vector<QRTD_QDMI_Site> sites(5);
        EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_SITES, n - 1, sites.data(),
                                                                 nullptr),
                  QDMI_ERROR_INVALIDARGUMENT);
        std::size_t idx = 0;
        EXPECT_EQ(QRTD_QDMI_device_session_query_site_property(s, sites[0], QDMI_SITE_PROPERTY_INDEX, 1, &idx,
                                                               nullptr),
                  QDMI_ERROR_INVALIDARGUMENT);
    }
    QRTD_QDMI_device_session_free(s);
}

TEST(QdmiSpec, DeviceFactsFromQpusList) {
    if (!with_device()) {
        GTEST_SKIP() << "this qrtd serves no [qpu.device] facts";
    }
    QRTD_QDMI_Device_Session s = open_session();
    std::size_t qubits = 0;
    ASSERT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_QUBITSNUM, sizeof qubits,
                                                             &qubits, nullptr),
              QDMI_SUCCESS);
    EXPECT_EQ(qubits, 5U);
    std::vector<QRTD_QDMI_Site> sites(5);
    ASSERT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_SITES,
                                                             sites.size() * sizeof(QRTD_QDMI_Site), sites.data(),
                                                             nullptr),
              QDMI_SUCCESS);
    for (std::size_t i = 0; i < sites.size(); ++i) {
        std::size_t idx = 99;
        EXPECT_EQ(QRTD_QDMI_device_session_query_site_property(s, sites[i], QDMI_SITE_PROPERTY_INDEX, sizeof idx,
                                                               &idx, nullptr),
                  QDMI_SUCCESS);
        EXPECT_EQ(idx, i);
    }
    std::size_t n = 0;
    EXPECT_EQ(QRTD_QDMI_device_session_query_site_property(s, sites[0], QDMI_SITE_PROPERTY_T1, 0, nullptr, &n),
              QDMI_ERROR_NOTSUPPORTED);
    ASSERT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_COUPLINGMAP, 0, nullptr, &n),
              QDMI_SUCCESS);
    EXPECT_EQ(n, 16 * sizeof(QRTD_QDMI_Site));  // 8 directed pairs
    ASSERT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_OPERATIONS, 0, nullptr, &n),
              QDMI_SUCCESS);
    std::vector<QRTD_QDMI_Operation> ops(n / sizeof(QRTD_QDMI_Operation));
    ASSERT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_OPERATIONS, n, ops.data(),
                                                             nullptr),
              QDMI_SUCCESS);
    std::vector<std::string> names;
    for (auto* op : ops) {
        char name[32] = {};
        ASSERT_EQ(QRTD_QDMI_device_session_query_operation_property(s, op, 0, nullptr, 0, nullptr,
                                                                    QDMI_OPERATION_PROPERTY_NAME, sizeof name, name,
                                                                    nullptr),
                  QDMI_SUCCESS);
        names.emplace_back(name);
        if (names.back() == "cx") {
            std::size_t nq = 0;
            std::uint64_t d = 0;
            EXPECT_EQ(QRTD_QDMI_device_session_query_operation_property(s, op, 0, nullptr, 0, nullptr,
                                                                        QDMI_OPERATION_PROPERTY_QUBITSNUM, sizeof nq,
                                                                        &nq, nullptr),
                      QDMI_SUCCESS);
            EXPECT_EQ(nq, 2U);
            EXPECT_EQ(QRTD_QDMI_device_session_query_operation_property(s, op, 0, nullptr, 0, nullptr,
                                                                        QDMI_OPERATION_PROPERTY_DURATION, sizeof d,
                                                                        &d, nullptr),
                      QDMI_SUCCESS);
            EXPECT_EQ(d, 300U);
            EXPECT_EQ(QRTD_QDMI_device_session_query_operation_property(s, op, 0, nullptr, 0, nullptr,
                                                                        QDMI_OPERATION_PROPERTY_SITES, 0, nullptr, &n),
                      QDMI_SUCCESS);
            EXPECT_EQ(n, 16 * sizeof(QRTD_QDMI_Site));
            EXPECT_EQ(QRTD_QDMI_device_session_query_operation_property(s, op, 0, nullptr, 0, nullptr,
                                                                        QDMI_OPERATION_PROPERTY_FIDELITY, 0, nullptr,
                                                                        &n),
                      QDMI_ERROR_NOTSUPPORTED);
        }
    }
    EXPECT_EQ(names, (std::vector<std::string>{"rz", "sx", "x", "cx", "measure"}));
    QRTD_QDMI_device_session_free(s);
}

TEST(QdmiSpec, StatusIsCalibrationInABlackout) {
    push_windows({{3, 600}});
    QRTD_QDMI_Device_Session s = open_session();
    EXPECT_EQ(status_of(s), QDMI_DEVICE_STATUS_CALIBRATION);
    push_windows({{-1, 600}});
    EXPECT_EQ(status_of(s), QDMI_DEVICE_STATUS_IDLE);
    QRTD_QDMI_device_session_free(s);
}

TEST(QdmiSpec, JobRunsAndGivesItsHistogram) {
    push_windows({{-1, 600}});
    QRTD_QDMI_Device_Session s = open_session();
    QRTD_QDMI_Device_Job j = bell_job(s, 1000);
    QDMI_Job_Status st{};
    ASSERT_EQ(QRTD_QDMI_device_job_check(j, &st), QDMI_SUCCESS);
    EXPECT_EQ(st, QDMI_JOB_STATUS_CREATED);
    ASSERT_EQ(QRTD_QDMI_device_job_submit(j), QDMI_SUCCESS);
    EXPECT_EQ(QRTD_QDMI_device_job_submit(j), QDMI_ERROR_BADSTATE);  // once
    const std::size_t shots = 5;
    EXPECT_EQ(QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_SHOTSNUM, sizeof shots, &shots),
              QDMI_ERROR_BADSTATE);
    const std::string id = job_id(j);
    EXPECT_FALSE(id.empty());
    ASSERT_EQ(QRTD_QDMI_device_job_wait(j, 60), QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_job_check(j, &st), QDMI_SUCCESS);
    ASSERT_EQ(st, QDMI_JOB_STATUS_DONE);
    EXPECT_EQ(QRTD_QDMI_device_job_cancel(j), QDMI_ERROR_INVALIDARGUMENT);  // already done
    const auto h = histogram(j);
    std::size_t total = 0;
    for (const auto& [k, v] : h) {
        EXPECT_EQ(k.size(), 2U) << k;
        total += v;
    }
    EXPECT_EQ(total, 1000U);
    if (with_aer()) {
        for (const auto& [k, v] : h) {
            EXPECT_TRUE(k == "00" || k == "11") << k;
            EXPECT_GE(v, 350U) << k;
        }
    }
    // A too-small buffer for the keys.
    std::size_t kn = 0;
    ASSERT_EQ(QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_KEYS, 0, nullptr, &kn), QDMI_SUCCESS);
    std::string keys(kn, '\0');
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_KEYS, kn - 1, keys.data(), nullptr),
              QDMI_ERROR_INVALIDARGUMENT);

    // The same job, by its id, in another session.
    QRTD_QDMI_Device_Session s2 = open_session();
    QRTD_QDMI_Device_Job again = nullptr;
    ASSERT_EQ(QRTD_QDMI_device_session_retrieve_device_job_by_id(s2, id.c_str(), &again), QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_job_check(again, &st), QDMI_SUCCESS);
    EXPECT_EQ(st, QDMI_JOB_STATUS_DONE);
    EXPECT_EQ(histogram(again), h);
    EXPECT_EQ(QRTD_QDMI_device_job_submit(again), QDMI_ERROR_BADSTATE);
    QRTD_QDMI_Device_Job missing = nullptr;
    EXPECT_EQ(QRTD_QDMI_device_session_retrieve_device_job_by_id(s2, "987654321", &missing), QDMI_ERROR_NOTFOUND);
    QRTD_QDMI_device_job_free(again);
    QRTD_QDMI_device_session_free(s2);
    QRTD_QDMI_device_job_free(j);
    QRTD_QDMI_device_session_free(s);
}

TEST(QdmiSpec, WaitTimesOutInABlackoutAndCancelKeepsTheJobFromTheQpu) {
    push_windows({{8, 600}});
    QRTD_QDMI_Device_Session s = open_session();
    QRTD_QDMI_Device_Job j = bell_job(s, 100);
    ASSERT_EQ(QRTD_QDMI_device_job_submit(j), QDMI_SUCCESS);
    EXPECT_EQ(status_of(s), QDMI_DEVICE_STATUS_CALIBRATION);
    std::size_t q = 0;
    EXPECT_EQ(QRTD_QDMI_device_session_query_device_property(s, QDMI_DEVICE_PROPERTY_QUEUELENGTH, sizeof q, &q,
                                                             nullptr),
              QDMI_SUCCESS);
    EXPECT_GE(q, 1U);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(QRTD_QDMI_device_job_wait(j, 1), QDMI_ERROR_TIMEOUT);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    QDMI_Job_Status st{};
    ASSERT_EQ(QRTD_QDMI_device_job_check(j, &st), QDMI_SUCCESS);
    EXPECT_EQ(st, QDMI_JOB_STATUS_QUEUED);
    ASSERT_EQ(QRTD_QDMI_device_job_cancel(j), QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_job_check(j, &st), QDMI_SUCCESS);
    EXPECT_EQ(st, QDMI_JOB_STATUS_CANCELED);
    EXPECT_EQ(QRTD_QDMI_device_job_wait(j, 1), QDMI_SUCCESS);  // terminal
    std::size_t n = 0;
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_KEYS, 0, nullptr, &n),
              QDMI_ERROR_BADSTATE);
    const json rec = rpc("jobs.status", {{"job_id", std::stoull(job_id(j))}});
    EXPECT_EQ(rec.value("state", ""), "cancelled") << rec.dump();
    EXPECT_FALSE(rec.contains("dispatched_ns") && !rec["dispatched_ns"].is_null()) << rec.dump();
    QRTD_QDMI_device_job_free(j);
    QRTD_QDMI_device_session_free(s);
}

TEST(QdmiSpec, BadProgramsAndShotsAreRefusedBeforeAnythingIsSent) {
    push_windows({{-1, 600}});
    QRTD_QDMI_Device_Session s = open_session();
    const std::size_t before = queued_jobs();
    QRTD_QDMI_Device_Job j = nullptr;
    ASSERT_EQ(QRTD_QDMI_device_session_create_device_job(s, &j), QDMI_SUCCESS);
    std::size_t shots = 0;
    EXPECT_EQ(QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_SHOTSNUM, sizeof shots, &shots),
              QDMI_ERROR_NOTSUPPORTED);
    shots = with_device() ? 100'001 : 1'000'001;  // past the QPU's max_shots / qrtd's ceiling
    EXPECT_EQ(QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_SHOTSNUM, sizeof shots, &shots),
              QDMI_ERROR_NOTSUPPORTED);
    EXPECT_EQ(QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_SHOTSNUM, 4, &shots),
              QDMI_ERROR_INVALIDARGUMENT);  // not a size_t
    auto set = [&](const std::string& text) {
        const std::size_t size = text.size() + 1;
        const void* p[] = {text.c_str()};
        return QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 1, &size, p);
    };
    EXPECT_EQ(set("qreg q[2]; h q[0];"), QDMI_ERROR_NOTSUPPORTED);  // not OpenQASM 3
    EXPECT_EQ(set("OPENQASM 2.0;\nqreg q[2];\n"), QDMI_ERROR_NOTSUPPORTED);
    if (with_device()) {
        EXPECT_EQ(set("OPENQASM 3.0;\nqubit[9] q;\n"), QDMI_ERROR_NOTSUPPORTED);  // 9 > 5 qubits
        EXPECT_EQ(set("OPENQASM 3.0;\nqubit[3] a;\nqubit[3] b;\n"), QDMI_ERROR_NOTSUPPORTED);
        EXPECT_EQ(set("OPENQASM 3.0;\nx $7;\n"), QDMI_ERROR_NOTSUPPORTED);
        EXPECT_EQ(set("OPENQASM 3.0;\nqubit[5] q;\n"), QDMI_SUCCESS);
    }
    // A text program ends in exactly one NUL.
    const char raw[] = {'O', 'P', 'E', 'N'};
    const std::size_t raw_size = sizeof raw;
    const void* rp[] = {raw};
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 1, &raw_size, rp),
              QDMI_ERROR_INVALIDARGUMENT);
    // A placement parameter that is not a number.
    EXPECT_EQ(QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_CUSTOM1, 4, "soon"),
              QDMI_ERROR_INVALIDARGUMENT);
    // A deadline no slot meets: qrtd refuses at submit, nothing is queued.
    ASSERT_EQ(set(k_bell), QDMI_SUCCESS);
    const std::string deadline = std::to_string(now_ns() - k_s);
    EXPECT_EQ(QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_CUSTOM2, deadline.size() + 1,
                                                 deadline.c_str()),
              QDMI_SUCCESS);
    EXPECT_EQ(QRTD_QDMI_device_job_submit(j), QDMI_ERROR_FATAL);
    std::size_t n = 0;
    EXPECT_EQ(QRTD_QDMI_device_job_query_property(j, QDMI_DEVICE_JOB_PROPERTY_ID, 0, nullptr, &n),
              QDMI_ERROR_BADSTATE);
    EXPECT_EQ(queued_jobs(), before);
    QRTD_QDMI_device_job_free(j);
    QRTD_QDMI_device_session_free(s);
}

TEST(QdmiSpec, AReservationBookedBeforeCarriesTheJob) {
    push_windows({{-1, 600}});
    // Booked ahead (as qrtctl slots reserve or the Slurm prolog would), in
    // a window 2 s from now.
    qrt_client* c = nullptr;
    qrt_error err{};
    ASSERT_EQ(qrt_connect(socket_path(), &c, &err), 0) << err.message;
    qrt_slot_request req{};
    req.duration_ns = job_duration_ns();
    req.not_before_ns = now_ns() + 2 * k_s;
    req.qpu = "qpu0";
    qrt_reservation r{};
    ASSERT_EQ(qrt_slots_reserve(c, &req, "qdmi-spec-reservation", 0, &r, &err), 0) << err.message;
    qrt_close(c);

    // A wrong fencing token: refused at submit, by qrtd.
    QRTD_QDMI_Device_Session bad = open_session(std::to_string(r.reservation_id),
                                                std::to_string(r.fencing_token + 1000));
    QRTD_QDMI_Device_Job bj = bell_job(bad, 100);
    EXPECT_EQ(QRTD_QDMI_device_job_submit(bj), QDMI_ERROR_FATAL);
    QRTD_QDMI_device_job_free(bj);
    QRTD_QDMI_device_session_free(bad);

    QRTD_QDMI_Device_Session s = open_session(std::to_string(r.reservation_id), std::to_string(r.fencing_token));
    QRTD_QDMI_Device_Job j = bell_job(s, 200);
    // Placement parameters do not apply: the reservation fixes the slot.
    EXPECT_EQ(QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_CUSTOM1, 2, "1"),
              QDMI_ERROR_NOTSUPPORTED);
    ASSERT_EQ(QRTD_QDMI_device_job_submit(j), QDMI_SUCCESS);
    EXPECT_EQ(job_id(j), std::to_string(r.reservation_id));
    ASSERT_EQ(QRTD_QDMI_device_job_wait(j, 60), QDMI_SUCCESS);
    QDMI_Job_Status st{};
    ASSERT_EQ(QRTD_QDMI_device_job_check(j, &st), QDMI_SUCCESS);
    EXPECT_EQ(st, QDMI_JOB_STATUS_DONE);
    const json rec = rpc("jobs.status", {{"job_id", r.reservation_id}});
    EXPECT_GE(rec.value("start_ns", std::int64_t{0}), req.not_before_ns) << rec.dump();
    std::size_t total = 0;
    for (const auto& [k, v] : histogram(j)) {
        total += v;
    }
    EXPECT_EQ(total, 200U);
    // One job per reservation.
    QRTD_QDMI_Device_Job second = bell_job(s, 10);
    EXPECT_EQ(QRTD_QDMI_device_job_submit(second), QDMI_ERROR_BADSTATE);
    QRTD_QDMI_device_job_free(second);
    QRTD_QDMI_device_job_free(j);
    QRTD_QDMI_device_session_free(s);
}

// Two programs in one job: one qrtd job whose envelope holds both circuits;
// each program has its own histogram, in input order.
TEST(QdmiSpec, TwoProgramsInOneJobEachGetTheirCounts) {
    push_windows({{-1, 600}});
    QRTD_QDMI_Device_Session s = open_session();
    QRTD_QDMI_Device_Job j = nullptr;
    ASSERT_EQ(QRTD_QDMI_device_session_create_device_job(s, &j), QDMI_SUCCESS);
    const std::string x1 = "OPENQASM 3.0;\ninclude \"stdgates.inc\";\nqubit[2] q;\nbit[2] c;\nx q[1];\nc = measure q;\n";
    const std::size_t sizes[] = {std::strlen(k_bell) + 1, x1.size() + 1};
    const void* programs[] = {k_bell, x1.c_str()};
    const std::size_t shots = 300;
    ASSERT_EQ(QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_SHOTSNUM, sizeof shots, &shots),
              QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 2, sizes, programs), QDMI_SUCCESS);
    const std::string d = std::to_string(job_duration_ns());
    ASSERT_EQ(QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_CUSTOM3, d.size() + 1, d.c_str()),
              QDMI_SUCCESS);
    std::size_t count = 0;
    ASSERT_EQ(QRTD_QDMI_device_job_query_property(j, QDMI_DEVICE_JOB_PROPERTY_PROGRAMSNUM, sizeof count, &count,
                                                  nullptr),
              QDMI_SUCCESS);
    EXPECT_EQ(count, 2U);
    char back[256] = {};
    ASSERT_EQ(QRTD_QDMI_device_job_get_program(j, 1, sizeof back, back, nullptr), QDMI_SUCCESS);
    EXPECT_EQ(std::string(back), x1);
    std::size_t n = 0;
    EXPECT_EQ(QRTD_QDMI_device_job_get_program(j, 2, 0, nullptr, &n), QDMI_ERROR_OUTOFRANGE);
    ASSERT_EQ(QRTD_QDMI_device_job_submit(j), QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_job_wait(j, 60), QDMI_SUCCESS);
    QDMI_Job_Status st{};
    ASSERT_EQ(QRTD_QDMI_device_job_check(j, &st), QDMI_SUCCESS);
    ASSERT_EQ(st, QDMI_JOB_STATUS_DONE);
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 2, QDMI_JOB_RESULT_HIST_KEYS, 0, nullptr, &n),
              QDMI_ERROR_OUTOFRANGE);
    if (!with_aer()) {
        QRTD_QDMI_device_job_free(j);
        QRTD_QDMI_device_session_free(s);
        GTEST_SKIP() << "qpu-sim answers one histogram per job; the per-program counts need qpu-aer";
    }
    const auto bell = histogram(j);
    for (const auto& [k, v] : bell) {
        EXPECT_TRUE(k == "00" || k == "11") << k;
    }
    // Program 1: X on qubit 1 reads "10" (qubit 0 is the rightmost bit).
    std::size_t kn = 0;
    ASSERT_EQ(QRTD_QDMI_device_job_get_results(j, 1, QDMI_JOB_RESULT_HIST_KEYS, 0, nullptr, &kn), QDMI_SUCCESS);
    std::string keys(kn, '\0');
    ASSERT_EQ(QRTD_QDMI_device_job_get_results(j, 1, QDMI_JOB_RESULT_HIST_KEYS, kn, keys.data(), nullptr),
              QDMI_SUCCESS);
    keys.pop_back();
    EXPECT_EQ(keys, "10");
    std::size_t v = 0;
    ASSERT_EQ(QRTD_QDMI_device_job_get_results(j, 1, QDMI_JOB_RESULT_HIST_VALUES, sizeof v, &v, nullptr),
              QDMI_SUCCESS);
    EXPECT_EQ(v, 300U);
    QRTD_QDMI_device_job_free(j);
    QRTD_QDMI_device_session_free(s);
}

// "Is this OpenQASM 3" is qrtd's question, asked where qrtd asks it
// (qrt_proto): a header qrtd would refuse at jobs.submit is refused when the
// program is set, before anything is sent, and one it accepts is accepted.
TEST(QdmiSpec, ProgramsAreOpenQasm3ExactlyWhenQrtdSaysSo) {
    push_windows({{-1, 600}});
    QRTD_QDMI_Device_Session s = open_session();
    const std::size_t before = queued_jobs();
    for (const char* text : {"OPENQASM /* version */ 3;\nqubit q;\n", "OPENQASM\n3;\nqubit q;\n",
                             "OPENQASM 2.0;\nqreg q[1];\n"}) {
        QRTD_QDMI_Device_Job j = nullptr;
        ASSERT_EQ(QRTD_QDMI_device_session_create_device_job(s, &j), QDMI_SUCCESS);
        const std::size_t size = std::strlen(text) + 1;
        const void* programs[] = {text};
        EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 1, &size, programs),
                  QDMI_ERROR_NOTSUPPORTED)
            << text;
        EXPECT_EQ(QRTD_QDMI_device_job_submit(j), QDMI_ERROR_BADSTATE) << "no program was set: " << text;
        QRTD_QDMI_device_job_free(j);
    }
    EXPECT_EQ(queued_jobs(), before);
    const char* fine = "\t// a comment\n/* and another */ OPENQASM\t3.0;\nqubit q;\nbit c;\nc = measure q;\n";
    QRTD_QDMI_Device_Job j = nullptr;
    ASSERT_EQ(QRTD_QDMI_device_session_create_device_job(s, &j), QDMI_SUCCESS);
    const std::size_t size = std::strlen(fine) + 1;
    const void* programs[] = {fine};
    EXPECT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 1, &size, programs), QDMI_SUCCESS);
    const std::string d = std::to_string(job_duration_ns());
    ASSERT_EQ(QRTD_QDMI_device_job_set_parameter(j, QDMI_DEVICE_JOB_PARAMETER_CUSTOM3, d.size() + 1, d.c_str()),
              QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_job_submit(j), QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_job_wait(j, 60), QDMI_SUCCESS);
    QDMI_Job_Status st{};
    ASSERT_EQ(QRTD_QDMI_device_job_check(j, &st), QDMI_SUCCESS);
    EXPECT_EQ(st, QDMI_JOB_STATUS_DONE);
    QRTD_QDMI_device_job_free(j);
    QRTD_QDMI_device_session_free(s);
}

// A QPU whose endpoint is write-only (qpu1: file:///dev/null): its job ends
// `sent`, which ends the job (the protocol's table says so), so wait returns
// and the job is done; its results are refused, saying so.
TEST(QdmiSpec, AJobOnAWriteOnlyQpuEndsAndWaitReturns) {
    QRTD_QDMI_Device_Session s = nullptr;
    ASSERT_EQ(QRTD_QDMI_device_session_alloc(&s), QDMI_SUCCESS);
    ASSERT_EQ(set_text(s, QDMI_DEVICE_SESSION_PARAMETER_BASEURL, socket_path()), QDMI_SUCCESS);
    ASSERT_EQ(set_text(s, QDMI_DEVICE_SESSION_PARAMETER_CUSTOM3, "qpu1"), QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_session_init(s), QDMI_SUCCESS);
    QRTD_QDMI_Device_Job j = nullptr;
    ASSERT_EQ(QRTD_QDMI_device_session_create_device_job(s, &j), QDMI_SUCCESS);
    const std::size_t size = std::strlen(k_bell) + 1;
    const void* programs[] = {k_bell};
    ASSERT_EQ(QRTD_QDMI_device_job_set_programs(j, QDMI_PROGRAM_FORMAT_QASM3, 1, &size, programs), QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_job_submit(j), QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_job_wait(j, 60), QDMI_SUCCESS);
    QDMI_Job_Status st{};
    ASSERT_EQ(QRTD_QDMI_device_job_check(j, &st), QDMI_SUCCESS);
    EXPECT_EQ(st, QDMI_JOB_STATUS_DONE);
    const json rec = rpc("jobs.status", {{"job_id", std::stoull(job_id(j))}});
    EXPECT_EQ(rec.value("state", ""), "sent") << rec.dump();
    std::size_t n = 0;
    EXPECT_EQ(QRTD_QDMI_device_job_get_results(j, 0, QDMI_JOB_RESULT_HIST_KEYS, 0, nullptr, &n),
              QDMI_ERROR_NOTSUPPORTED);
    QRTD_QDMI_device_job_free(j);
    QRTD_QDMI_device_session_free(s);
}

// A compute node reaches the QPU node's qrtd over tcp:// (README, Cluster:
// QRT_SOCKET=tcp://...): BASEURL takes the address, the session and its
// job's wait speak MUNGE-authenticated TCP (libqrt-client), and the job
// is this user's.
TEST(QdmiSpec, ASessionOverTcpRunsAJob) {
    const char* url = std::getenv("QRTD_QDMI_URL");
    if (url == nullptr || url[0] == '\0') {
        GTEST_SKIP() << "munged or mungekey is not installed (tools/dev/deps.sh installs munge): "
                        "the lab's qrtd has no tcp:// listener";
    }
    push_windows({{-1, 600}});
    QRTD_QDMI_Device_Session bad = nullptr;
    ASSERT_EQ(QRTD_QDMI_device_session_alloc(&bad), QDMI_SUCCESS);
    for (const char* wrong : {"tcp://", "tcp://127.0.0.1", "tcp://:7470", "https://example.invalid/"}) {
        EXPECT_EQ(set_text(bad, QDMI_DEVICE_SESSION_PARAMETER_BASEURL, wrong), QDMI_ERROR_INVALIDARGUMENT) << wrong;
    }
    QRTD_QDMI_device_session_free(bad);

    QRTD_QDMI_Device_Session s = nullptr;
    ASSERT_EQ(QRTD_QDMI_device_session_alloc(&s), QDMI_SUCCESS);
    ASSERT_EQ(set_text(s, QDMI_DEVICE_SESSION_PARAMETER_BASEURL, url), QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_session_init(s), QDMI_SUCCESS);
    EXPECT_EQ(string_prop(s, QDMI_DEVICE_PROPERTY_NAME), "qrtd/qpu0");
    QRTD_QDMI_Device_Job j = bell_job(s, 200);
    ASSERT_EQ(QRTD_QDMI_device_job_submit(j), QDMI_SUCCESS);
    ASSERT_EQ(QRTD_QDMI_device_job_wait(j, 60), QDMI_SUCCESS);
    QDMI_Job_Status st{};
    ASSERT_EQ(QRTD_QDMI_device_job_check(j, &st), QDMI_SUCCESS);
    ASSERT_EQ(st, QDMI_JOB_STATUS_DONE);
    std::size_t total = 0;
    for (const auto& [k, v] : histogram(j)) {
        total += v;
    }
    EXPECT_EQ(total, 200U);
    const json rec = rpc("jobs.status", {{"job_id", std::stoull(job_id(j))}});
    EXPECT_EQ(rec.value("state", ""), "completed") << rec.dump();
    QRTD_QDMI_device_job_free(j);
    QRTD_QDMI_device_session_free(s);
}

TEST(QdmiSpec, FinalizeEndsService) {
    ASSERT_EQ(QRTD_QDMI_device_finalize(), QDMI_SUCCESS);
    QRTD_QDMI_Device_Session s = nullptr;
    EXPECT_EQ(QRTD_QDMI_device_session_alloc(&s), QDMI_ERROR_BADSTATE);
}

}  // namespace

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    ::testing::AddGlobalTestEnvironment(new Env);
    return RUN_ALL_TESTS();
}
