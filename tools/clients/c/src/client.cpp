// libqrt-client: the C ABI over qrt::client::connection.  Every entry point
// catches everything: no C++ exception crosses into C.

#include "qrt/client.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "base64.hpp"
#include "connection.hpp"
#include "place_best.hpp"

struct qrt_client {
    std::unique_ptr<qrt::client::connection> conn;
};

namespace {

using qrt::client::call_error;
using qrt::client::json;

#ifndef QRT_CLIENT_VERSION
#define QRT_CLIENT_VERSION "0.0.0"
#endif

void copy_str(char* dst, std::size_t cap, std::string_view src) noexcept {
    const std::size_t n = std::min(cap - 1, src.size());
    std::memcpy(dst, src.data(), n);
    dst[n] = '\0';
}

void clear(qrt_error* err) noexcept {
    if (err != nullptr) {
        err->code = 0;
        err->sys_errno = 0;
        err->reason[0] = '\0';
        err->message[0] = '\0';
    }
}

// Fill err and return the negative errno for this failure.
int report(const call_error& e, qrt_error* err) noexcept {
    if (err != nullptr) {
        err->code = e.code;
        err->sys_errno = e.sys_errno;
        copy_str(err->reason, sizeof(err->reason), e.reason);
        copy_str(err->message, sizeof(err->message), e.message);
    }
    if (!e.is_local()) {
        return -EREMOTEIO;
    }
    return e.sys_errno > 0 ? -e.sys_errno : -EIO;
}

int local_fail(int errnum, std::string_view reason, std::string_view message,
               qrt_error* err) noexcept {
    if (err != nullptr) {
        err->code = 0;
        err->sys_errno = errnum;
        copy_str(err->reason, sizeof(err->reason), reason);
        copy_str(err->message, sizeof(err->message), message);
    }
    return -errnum;
}

int invalid(std::string_view message, qrt_error* err) noexcept {
    return local_fail(EINVAL, qrt::client::local_reason::client_error, message, err);
}

// A malloc'ed copy for the caller (freed with qrt_free).
char* c_string(const std::string& s) noexcept {
    char* p = static_cast<char*>(std::malloc(s.size() + 1));
    if (p != nullptr) {
        std::memcpy(p, s.data(), s.size());
        p[s.size()] = '\0';
    }
    return p;
}

int give_json(const json& j, char** out, qrt_error* err) {
    if (out == nullptr) {
        return 0;
    }
    *out = c_string(j.dump(-1, ' ', false, json::error_handler_t::replace));
    if (*out == nullptr) {
        return local_fail(ENOMEM, qrt::client::local_reason::client_error, "out of memory", err);
    }
    return 0;
}

// Runs fn, translating any exception into a negative errno.
template <typename Fn>
int guarded(qrt_error* err, Fn&& fn) noexcept {
    try {
        clear(err);
        return fn();
    } catch (const std::bad_alloc&) {
        return local_fail(ENOMEM, qrt::client::local_reason::client_error, "out of memory", err);
    } catch (const std::exception& e) {
        return local_fail(EPROTO, qrt::client::local_reason::protocol_error, e.what(), err);
    } catch (...) {
        return local_fail(EPROTO, qrt::client::local_reason::protocol_error,
                          "unexpected failure", err);
    }
}

int do_call(qrt_client* c, std::string_view method, const json& params, json* result,
            qrt_error* err) {
    if (c == nullptr || !c->conn) {
        return invalid("qrt client is NULL", err);
    }
    auto r = c->conn->call(method, params);
    if (!r) {
        return report(r.error(), err);
    }
    if (result != nullptr) {
        *result = std::move(r).result();
    }
    return 0;
}

json request_params(const qrt_slot_request* req) {
    json p{{"duration_ns", req->duration_ns}};
    if (req->not_before_ns != 0) {
        p["not_before_ns"] = req->not_before_ns;
    }
    if (req->deadline_ns != 0) {
        p["deadline_ns"] = req->deadline_ns;
    }
    if (req->priority != 0) {
        p["priority"] = req->priority;
    }
    if (req->min_fidelity > 0.0) {
        p["min_fidelity"] = req->min_fidelity;
    }
    if (req->qpu != nullptr && req->qpu[0] != '\0') {
        p["qpus"] = json::array({std::string(req->qpu)});
    }
    return p;
}

template <typename T>
T num_or(const json& j, const char* key, T fallback) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number()) {
        return fallback;
    }
    return it->get<T>();
}

int fill_reservation(const json& r, qrt_reservation* out, qrt_error* err) {
    if (!r.is_object()) {
        return local_fail(EPROTO, qrt::client::local_reason::protocol_error,
                          "reservation reply is not an object", err);
    }
    if (out == nullptr) {
        return 0;
    }
    *out = qrt_reservation{};
    out->reservation_id = num_or<std::uint64_t>(r, "reservation_id", 0);
    out->fencing_token = num_or<std::uint64_t>(r, "fencing_token", 0);
    out->start_ns = num_or<std::int64_t>(r, "start_ns", 0);
    out->end_ns = num_or<std::int64_t>(r, "end_ns", 0);
    out->lease_expires_ns = num_or<std::int64_t>(r, "lease_expires_ns", 0);
    out->calibration_id = num_or<std::uint64_t>(r, "calibration_id", 0);
    copy_str(out->qpu, sizeof(out->qpu), r.value("qpu", std::string()));
    copy_str(out->state, sizeof(out->state), r.value("state", std::string()));
    return 0;
}

thread_local std::string default_path_storage;

}  // namespace

extern "C" {

const char* qrt_client_version(void) { return QRT_CLIENT_VERSION; }

const char* qrt_default_socket(void) {
    try {
        default_path_storage = qrt::client::resolve_socket_path({});
        return default_path_storage.c_str();
    } catch (...) {
        return "/run/qrtd/qrtd.sock";
    }
}

int qrt_connect_timeout(const char* path, int connect_timeout_ms, qrt_client** out,
                        qrt_error* err) {
    return guarded(err, [&]() -> int {
        if (out == nullptr) {
            return invalid("qrt_connect: out is NULL", err);
        }
        *out = nullptr;
        if (connect_timeout_ms <= 0) {
            return invalid("qrt_connect: connect_timeout_ms must be > 0", err);
        }
        qrt::client::connect_options opts;
        opts.connect_timeout = std::chrono::milliseconds(connect_timeout_ms);
        const std::string p = qrt::client::resolve_socket_path(path != nullptr ? path : "");
        auto r = qrt::client::connection::open(p, opts);
        if (auto* e = std::get_if<call_error>(&r)) {
            return report(*e, err);
        }
        auto* c = new qrt_client;
        c->conn = std::move(std::get<0>(r));
        *out = c;
        return 0;
    });
}

int qrt_connect(const char* path, qrt_client** out, qrt_error* err) {
    return qrt_connect_timeout(path, 2000, out, err);
}

int qrt_set_timeout(qrt_client* c, int timeout_ms) {
    if (c == nullptr || timeout_ms <= 0) {
        return -EINVAL;
    }
    c->conn->set_call_timeout(std::chrono::milliseconds(timeout_ms));
    return 0;
}

int qrt_fd(const qrt_client* c) { return c == nullptr ? -EINVAL : c->conn->fd(); }

int qrt_call(qrt_client* c, const char* method, const char* params_json, char** result_json,
             qrt_error* err) {
    return guarded(err, [&]() -> int {
        if (result_json != nullptr) {
            *result_json = nullptr;
        }
        if (method == nullptr || method[0] == '\0') {
            return invalid("qrt_call: method is NULL or empty", err);
        }
        json params = json::object();
        if (params_json != nullptr && params_json[0] != '\0') {
            params = json::parse(params_json, nullptr, false);
            if (params.is_discarded() || !params.is_object()) {
                return invalid(std::string("qrt_call(") + method +
                                   "): params_json is not a JSON object",
                               err);
            }
        }
        json result;
        if (const int rc = do_call(c, method, params, &result, err); rc < 0) {
            return rc;
        }
        return give_json(result, result_json, err);
    });
}

int qrt_hello(qrt_client* c, char** result_json, qrt_error* err) {
    return guarded(err, [&]() -> int {
        if (result_json != nullptr) {
            *result_json = nullptr;
        }
        json result;
        const json params{{"client", std::string("libqrt-client/") + QRT_CLIENT_VERSION}};
        if (const int rc = do_call(c, "agent.hello", params, &result, err); rc < 0) {
            return rc;
        }
        return give_json(result, result_json, err);
    });
}

int qrt_slots_query(qrt_client* c, const qrt_slot_request* req, char** result_json,
                    qrt_error* err) {
    return guarded(err, [&]() -> int {
        if (result_json != nullptr) {
            *result_json = nullptr;
        }
        if (req == nullptr || req->duration_ns <= 0) {
            return invalid("qrt_slots_query: request is NULL or duration_ns <= 0", err);
        }
        json result;
        if (const int rc = do_call(c, "slots.query", request_params(req), &result, err); rc < 0) {
            return rc;
        }
        return give_json(result, result_json, err);
    });
}

int qrt_slots_reserve(qrt_client* c, const qrt_slot_request* req, const char* idempotency_key,
                      int64_t lease_ns, qrt_reservation* out, qrt_error* err) {
    return guarded(err, [&]() -> int {
        if (req == nullptr || req->duration_ns <= 0) {
            return invalid("qrt_slots_reserve: request is NULL or duration_ns <= 0", err);
        }
        if (idempotency_key == nullptr || idempotency_key[0] == '\0') {
            return invalid("qrt_slots_reserve: idempotency_key is required", err);
        }
        json params = request_params(req);
        params["idempotency_key"] = idempotency_key;
        if (lease_ns > 0) {
            params["lease_ns"] = lease_ns;
        }
        json result;
        if (const int rc = do_call(c, "slots.reserve", params, &result, err); rc < 0) {
            return rc;
        }
        return fill_reservation(result, out, err);
    });
}

int qrt_slots_heartbeat(qrt_client* c, uint64_t reservation_id, uint64_t fencing_token,
                        qrt_reservation* out, qrt_error* err) {
    return guarded(err, [&]() -> int {
        json result;
        const json params{{"reservation_id", reservation_id}, {"fencing_token", fencing_token}};
        if (const int rc = do_call(c, "slots.heartbeat", params, &result, err); rc < 0) {
            return rc;
        }
        return fill_reservation(result, out, err);
    });
}

int qrt_slots_release(qrt_client* c, uint64_t reservation_id, uint64_t fencing_token,
                      qrt_error* err) {
    return guarded(err, [&]() -> int {
        const json params{{"reservation_id", reservation_id}, {"fencing_token", fencing_token}};
        return do_call(c, "slots.release", params, nullptr, err);
    });
}

int qrt_jobs_submit(qrt_client* c, uint64_t reservation_id, uint64_t fencing_token,
                    const void* payload, size_t payload_len, qrt_reservation* out,
                    qrt_error* err) {
    return guarded(err, [&]() -> int {
        if (payload == nullptr && payload_len != 0) {
            return invalid("qrt_jobs_submit: payload is NULL with a non-zero length", err);
        }
        if (payload == nullptr) {
            payload = "";
        }
        json result;
        const json params{{"reservation_id", reservation_id},
                          {"fencing_token", fencing_token},
                          {"payload", qrt::client::base64_encode(std::string_view(
                              static_cast<const char*>(payload), payload_len))}};
        if (const int rc = do_call(c, "jobs.submit", params, &result, err); rc < 0) {
            return rc;
        }
        return fill_reservation(result, out, err);
    });
}

int qrt_place_best(qrt_client* const* agents, size_t n, const qrt_slot_request* req,
                   const char* idempotency_key, int64_t lease_ns, size_t* chosen,
                   qrt_reservation* out, int* per_agent, qrt_error* err) {
    return guarded(err, [&]() -> int {
        if (agents == nullptr || n == 0 || n > qrt::client::k_max_agents) {
            return invalid("qrt_place_best: agents is NULL or n is not 1..16", err);
        }
        if (req == nullptr || req->duration_ns <= 0) {
            return invalid("qrt_place_best: request is NULL or duration_ns <= 0", err);
        }
        if (idempotency_key == nullptr || idempotency_key[0] == '\0') {
            return invalid("qrt_place_best: idempotency_key is required", err);
        }
        std::vector<qrt::client::connection*> conns(n, nullptr);
        for (std::size_t i = 0; i < n; ++i) {
            if (agents[i] == nullptr || !agents[i]->conn) {
                return invalid("qrt_place_best: agents[" + std::to_string(i) + "] is NULL", err);
            }
            conns[i] = agents[i]->conn.get();
        }
        json params = request_params(req);
        params["idempotency_key"] = idempotency_key;
        if (lease_ns > 0) {
            params["lease_ns"] = lease_ns;
        }
        const qrt::client::placement p = qrt::client::place_best(conns, params);
        const call_error* first_remote = nullptr;
        const call_error* first_local = nullptr;
        for (std::size_t i = 0; i < n; ++i) {
            const auto& e = p.errors[i];
            if (per_agent != nullptr) {
                per_agent[i] = e ? (e->is_local() ? -(e->sys_errno > 0 ? e->sys_errno : EIO)
                                                  : -EREMOTEIO)
                                 : 0;
            }
            if (e && !e->is_local() && first_remote == nullptr) {
                first_remote = &*e;
            }
            if (e && e->is_local() && first_local == nullptr) {
                first_local = &*e;
            }
        }
        if (p.chosen == qrt::client::placement::none) {
            return report(first_remote != nullptr ? *first_remote : *first_local, err);
        }
        if (chosen != nullptr) {
            *chosen = p.chosen;
        }
        const json& r = p.reservation.contains("gang") ? p.reservation["gang"][0] : p.reservation;
        return fill_reservation(r, out, err);
    });
}

int qrt_jobs_status(qrt_client* c, uint64_t job_id, qrt_reservation* out, qrt_error* err) {
    return guarded(err, [&]() -> int {
        json result;
        if (const int rc = do_call(c, "jobs.status", json{{"job_id", job_id}}, &result, err);
            rc < 0) {
            return rc;
        }
        return fill_reservation(result, out, err);
    });
}

int qrt_jobs_cancel(qrt_client* c, uint64_t job_id, qrt_error* err) {
    return guarded(err, [&]() -> int {
        return do_call(c, "jobs.cancel", json{{"job_id", job_id}}, nullptr, err);
    });
}

int qrt_jobs_cancel_fenced(qrt_client* c, uint64_t job_id, uint64_t fencing_token,
                           qrt_error* err) {
    return guarded(err, [&]() -> int {
        return do_call(c, "jobs.cancel",
                       json{{"job_id", job_id}, {"fencing_token", fencing_token}}, nullptr, err);
    });
}

int qrt_slots_reserve_gang(qrt_client* c, const qrt_slot_request* req, size_t k,
                           const char* idempotency_key, int64_t lease_ns, qrt_reservation* out,
                           size_t out_cap, qrt_error* err) {
    return guarded(err, [&]() -> int {
        if (req == nullptr || req->duration_ns <= 0) {
            return invalid("qrt_slots_reserve_gang: request is NULL or duration_ns <= 0", err);
        }
        if (k < 1 || k > 64) {
            return invalid("qrt_slots_reserve_gang: k must be in [1, 64]", err);
        }
        if (k > 1 && req->qpu != nullptr && req->qpu[0] != '\0') {
            return invalid("qrt_slots_reserve_gang: req->qpu must be NULL for a gang (qrtd picks "
                           "the QPUs)",
                           err);
        }
        if (out == nullptr || out_cap < k) {
            return local_fail(ENOSPC, qrt::client::local_reason::client_error,
                              "qrt_slots_reserve_gang: out holds fewer than k reservations", err);
        }
        if (idempotency_key == nullptr || idempotency_key[0] == '\0') {
            return invalid("qrt_slots_reserve_gang: idempotency_key is required", err);
        }
        json params = request_params(req);
        params["idempotency_key"] = idempotency_key;
        if (lease_ns > 0) {
            params["lease_ns"] = lease_ns;
        }
        if (k > 1) {
            params["gang_size"] = k;
        }
        json result;
        if (const int rc = do_call(c, "slots.reserve", params, &result, err); rc < 0) {
            return rc;
        }
        if (k == 1) {
            const int rc = fill_reservation(result, out, err);
            return rc < 0 ? rc : 1;
        }
        const auto it = result.find("gang");
        if (it == result.end() || !it->is_array() || it->size() != k) {
            return local_fail(EPROTO, qrt::client::local_reason::protocol_error,
                              "slots.reserve with gang_size: the reply has no 'gang' array of k "
                              "members",
                              err);
        }
        for (std::size_t i = 0; i < k; ++i) {
            if (const int rc = fill_reservation((*it)[i], &out[i], err); rc < 0) {
                return rc;
            }
        }
        return static_cast<int>(k);
    });
}

int qrt_jobs_result(qrt_client* c, uint64_t job_id, void** result, size_t* result_len,
                    qrt_reservation* out, qrt_error* err) {
    return guarded(err, [&]() -> int {
        if (result == nullptr || result_len == nullptr) {
            return invalid("qrt_jobs_result: result and result_len are required", err);
        }
        *result = nullptr;
        *result_len = 0;
        json reply;
        if (const int rc = do_call(c, "jobs.result", json{{"job_id", job_id}}, &reply, err);
            rc < 0) {
            return rc;
        }
        const auto text = reply.find("result");
        if (text == reply.end() || !text->is_string()) {
            return local_fail(EPROTO, qrt::client::local_reason::protocol_error,
                              "jobs.result reply has no 'result' string", err);
        }
        auto bytes = qrt::client::base64_decode(text->get_ref<const std::string&>());
        if (!bytes) {
            return local_fail(EPROTO, qrt::client::local_reason::protocol_error,
                              "jobs.result 'result' is not canonical base64", err);
        }
        auto* p = static_cast<char*>(std::malloc(bytes->size() + 1));
        if (p == nullptr) {
            return local_fail(ENOMEM, qrt::client::local_reason::client_error, "out of memory",
                              err);
        }
        if (!bytes->empty()) {
            std::memcpy(p, bytes->data(), bytes->size());
        }
        p[bytes->size()] = '\0';
        *result = p;
        *result_len = bytes->size();
        if (out != nullptr) {
            *out = qrt_reservation{};
            out->reservation_id = num_or<std::uint64_t>(reply, "job_id", job_id);
            copy_str(out->state, sizeof(out->state), reply.value("state", std::string()));
        }
        return 0;
    });
}

int qrt_json_get(const char* text, const char* pointer, char* buf, size_t len) {
    try {
        if (text == nullptr || pointer == nullptr || buf == nullptr || len == 0) {
            return -EINVAL;
        }
        buf[0] = '\0';
        const json j = json::parse(text, nullptr, false);
        if (j.is_discarded()) {
            return -EINVAL;
        }
        json::json_pointer ptr{std::string(pointer)};
        if (!j.contains(ptr)) {
            return -ENOENT;
        }
        const json& v = j.at(ptr);
        const std::string s =
            v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, json::error_handler_t::replace);
        copy_str(buf, len, s);
        return s.size() < len ? 0 : -ENOSPC;
    } catch (const json::exception&) {
        return -EINVAL;  // a malformed pointer, or an index into a non-array
    } catch (...) {
        return -ENOMEM;
    }
}

int qrt_next_event(qrt_client* c, int timeout_ms, char** event_json, qrt_error* err) {
    return guarded(err, [&]() -> int {
        if (event_json == nullptr) {
            return invalid("qrt_next_event: event_json is NULL", err);
        }
        *event_json = nullptr;
        if (c == nullptr || !c->conn) {
            return invalid("qrt client is NULL", err);
        }
        auto r = c->conn->next_notification(std::chrono::milliseconds(timeout_ms < 0 ? -1 : timeout_ms));
        if (auto* e = std::get_if<call_error>(&r)) {
            return report(*e, err);
        }
        auto& ev = std::get<0>(r);
        if (!ev) {
            return local_fail(ETIMEDOUT, qrt::client::local_reason::timeout,
                              "no event within the timeout", err);
        }
        return give_json(*ev, event_json, err);
    });
}

int qrt_yield_request_read(const char* event_json, qrt_yield_request* out) {
    try {
        if (event_json == nullptr || out == nullptr) {
            return -EINVAL;
        }
        *out = qrt_yield_request{};
        const json ev = json::parse(event_json, nullptr, false);
        if (ev.is_discarded() || !ev.is_object() || !ev.contains("type") || !ev.at("type").is_string()) {
            return -EINVAL;
        }
        if (ev.at("type").get<std::string>() != qrt::proto::event::reservation_yield_requested) {
            return -ENOENT;
        }
        const auto data = ev.find("data");
        if (data == ev.end() || !data->is_object() || !data->contains("reservation_id") ||
            !data->at("reservation_id").is_number_unsigned() || !data->contains("deadline_ns") ||
            !data->at("deadline_ns").is_number_integer()) {
            return -EINVAL;
        }
        const json& d = *data;
        out->reservation_id = d.at("reservation_id").get<std::uint64_t>();
        out->deadline_ns = d.at("deadline_ns").get<std::int64_t>();
        out->start_ns = num_or<std::int64_t>(d, "start_ns", 0);
        out->free_start_ns = num_or<std::int64_t>(d, "free_start_ns", 0);
        const auto str = [](const json& j, const char* key) {
            const auto it = j.find(key);
            return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
        };
        copy_str(out->qpu, sizeof(out->qpu), str(d, "qpu"));
        copy_str(out->at_deadline, sizeof(out->at_deadline), str(d, "at_deadline"));
        copy_str(out->reason, sizeof(out->reason), str(d, "reason"));
        if (const auto b = d.find("block"); b != d.end() && b->is_object()) {
            out->block_id = num_or<std::uint64_t>(*b, "block_id", 0);
            out->block_start_ns = num_or<std::int64_t>(*b, "start_ns", 0);
            out->block_end_ns = num_or<std::int64_t>(*b, "end_ns", 0);
            copy_str(out->step, sizeof(out->step), str(*b, "step"));
        }
        return 0;
    } catch (const json::exception&) {
        return -EINVAL;
    } catch (...) {
        return -ENOMEM;
    }
}

void qrt_free(void* p) { std::free(p); }

void qrt_close(qrt_client* c) { delete c; }

int qrt_exit_code_for_reason(const char* reason) {
    if (reason == nullptr) {
        return 1;
    }
    return qrt::client::exit_code_for(reason);
}

}  // extern "C"
