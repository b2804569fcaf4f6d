// libqrtd-qdmi.so: a QDMI job is one qrtd job (qrtd_qdmi.hpp says which
// file holds what): its parameters and programs, submit (into the
// session's reservation, or placed by qrtd), check, wait (woken by qrtd's
// events), cancel and results.

#include "qrtd_qdmi.hpp"

#include "qrt/proto/protocol.hpp"
#include "rtcore/base64.hpp"

namespace qrtd_qdmi {

// The QDMI status of a qrtd state, by the protocol's table (qrt/proto): of
// the states that occupy QPU time, dispatched is running and the others are
// queued; of the final ones, completed is done, and so is sent (written on
// time to a write-only endpoint, which gives no result back: its results
// are refused, saying so), cancelled is cancelled, the rest failed.  A
// state this library does not know (a newer qrtd's): failed.
QDMI_Job_Status status_of(std::string_view name) noexcept {
    using qrt::proto::state;
    const auto st = qrt::proto::state_from_string(name);
    if (!st) {
        return QDMI_JOB_STATUS_FAILED;
    }
    if (qrt::proto::is_active(*st)) {
        return *st == state::dispatched ? QDMI_JOB_STATUS_RUNNING : QDMI_JOB_STATUS_QUEUED;
    }
    switch (*st) {
        case state::completed:
        case state::sent:
            return QDMI_JOB_STATUS_DONE;
        case state::cancelled:
            return QDMI_JOB_STATUS_CANCELED;
        default:
            return QDMI_JOB_STATUS_FAILED;  // failed, missed, expired, released, displaced
    }
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

namespace {

int load_results(QRTD_QDMI_Device_Job job) {
    if (job->results_loaded) {
        return QDMI_SUCCESS;
    }
    if (job->state == qrt::proto::to_string(qrt::proto::state::sent)) {
        say("job " + std::to_string(job->job_id) + " ended " + job->state +
            ": its QPU's endpoint is write-only, and no result comes back");
        return QDMI_ERROR_NOTSUPPORTED;
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
    std::string why;
    const std::string payload = make_payload(job->programs, job->shots, &why);
    if (payload.empty()) {
        say("the job envelope would be refused: " + why);
        return QDMI_ERROR_INVALIDARGUMENT;
    }
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

}  // namespace qrtd_qdmi

using namespace qrtd_qdmi;

extern "C" {

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
        if (format != QDMI_PROGRAM_FORMAT_QASM3 || count > qrt::proto::envelope::max_circuits) {
            if (programs != nullptr) {
                say(format != QDMI_PROGRAM_FORMAT_QASM3
                        ? std::string("only OpenQASM 3 programs (QASM3) are accepted")
                        : std::to_string(count) + " programs: a qrtd job holds at most " +
                              std::to_string(qrt::proto::envelope::max_circuits));
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
