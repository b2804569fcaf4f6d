// libqrtd-qdmi.so: the library's state and its sessions (qrtd_qdmi.hpp says
// which file holds what): initialize and finalize, a session's parameters
// and init (one connection to qrtd, one of its QPUs), creating and
// retrieving jobs; and how a failed call to qrtd is told.

#include "qrtd_qdmi.hpp"
#include <qrt/names.h>

namespace qrtd_qdmi {

std::atomic<bool> g_initialized{false};

// QDMI code for a libqrt-client failure, saying it on stderr.
int fail_call(const char* what, int rc, const qrt_error& err) {
    say(std::string(what) + ": " + (err.reason[0] != '\0' ? err.reason : "error") + ": " + err.message);
    if (rc == -EREMOTEIO && (std::strcmp(err.reason, QRT_REASON_PERMISSION_DENIED) == 0 ||
                             std::strcmp(err.reason, QRT_REASON_NOT_OWNER) == 0)) {
        return QDMI_ERROR_PERMISSIONDENIED;
    }
    if (rc == -ETIMEDOUT) {
        return QDMI_ERROR_TIMEOUT;
    }
    return QDMI_ERROR_FATAL;
}

}  // namespace qrtd_qdmi

using namespace qrtd_qdmi;

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
                if (t.rfind("tcp://", 0) == 0) {
                    // Another node's qrtd, as libqrt-client reaches it (MUNGE):
                    // tcp://HOST:PORT, an IPv6 host in brackets.
                    const std::size_t colon = t.rfind(':');
                    const std::string_view port = colon > 5 ? std::string_view(t).substr(colon + 1) : "";
                    const auto port_no = number_of<std::uint16_t>(port);
                    if (colon <= 6 || !port_no || *port_no == 0) {
                        say("BASEURL '" + t + "' is not tcp://HOST:PORT");
                        return QDMI_ERROR_INVALIDARGUMENT;
                    }
                } else if (t.empty() || t[0] != '/') {
                    say("BASEURL '" + t + "' is not a socket path (/path or unix:///path) nor tcp://HOST:PORT");
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
        if (rc == -EREMOTEIO && std::strcmp(err.reason, QRT_REASON_NOT_FOUND) == 0) {
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

}  // extern "C"
