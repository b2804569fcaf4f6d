// libqrtd-qdmi.so: the device's facts (qrtd_qdmi.hpp says which file holds
// what).  Sites, operations, coupling map, gate durations and max shots come
// from qpus.list's "device" of the QPU; status and queue length are read
// from qrtd at each query.

#include "qrtd_qdmi.hpp"

namespace qrtd_qdmi {

namespace {

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

}  // namespace qrtd_qdmi

using namespace qrtd_qdmi;

extern "C" {

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
                    if (!in_window) {
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

}  // extern "C"
