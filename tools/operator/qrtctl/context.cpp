// qrtctl's command context: see context.hpp.

#include "context.hpp"

#include <cerrno>
#include <chrono>
#include <ostream>
#include <utility>

#include "place_best.hpp"
#include "units.hpp"

namespace qrtctl {

int context::usage(const std::string& message) {
    _err << "qrtctl: " << message << '\n';
    if (opt.json) {
        print_error_json(call_error{0, EINVAL, "client_error", message, nullptr});
    }
    return exit_usage;
}

connection* context::conn(int& exit_code) {
    if (_conn) {
        return _conn.get();
    }
    qrt::client::connect_options co;
    co.connect_timeout = std::chrono::milliseconds(_connect_timeout_ns / 1'000'000);
    co.call_timeout = std::chrono::milliseconds(_timeout_ns / 1'000'000);
    const std::string path = qrt::client::resolve_socket_path(opt.socket);
    auto r = connection::open(path, co);
    if (auto* e = std::get_if<call_error>(&r)) {
        exit_code = fail("", *e);
        return nullptr;
    }
    _conn = std::move(std::get<0>(r));
    return _conn.get();
}

std::optional<int> context::prepare() {
    auto t = parse_duration_ns(opt.timeout);
    auto ct = parse_duration_ns(opt.connect_timeout);
    if (!t.value || *t.value < 1'000'000) {
        return usage("--timeout " + (t.value ? opt.timeout + " is under 1ms" : t.error));
    }
    if (!ct.value || *ct.value < 1'000'000) {
        return usage("--connect-timeout " +
                     (ct.value ? opt.connect_timeout + " is under 1ms" : ct.error));
    }
    _timeout_ns = *t.value;
    _connect_timeout_ns = *ct.value;
    return std::nullopt;
}

int context::fail(std::string_view method, const call_error& e) {
    _err << "qrtctl: ";
    if (!method.empty()) {
        _err << method << ": ";
    }
    _err << e.message;
    if (!e.is_local() || e.reason != qrt::client::local_reason::unreachable) {
        _err << " (" << e.reason;
        if (!e.is_local()) {
            _err << ", code " << e.code;
        }
        _err << ")";
    }
    if (e.data.is_object() && e.data.contains("field")) {
        _err << " [field " << qrtctl::show(e.data["field"], shown_as::text) << "]";
    }
    _err << '\n';
    if (opt.json) {
        print_error_json(e);
    }
    return qrt::client::exit_code_for(e.reason);
}

std::optional<json> context::call(std::string_view method, const json& params, int& exit_code) {
    connection* c = conn(exit_code);
    if (c == nullptr) {
        return std::nullopt;
    }
    auto r = c->call(method, params);
    if (!r) {
        exit_code = fail(method, r.error());
        return std::nullopt;
    }
    return std::move(r).result();
}

int context::call_and_show(std::string_view method, const json& params,
                           const std::function<void(const json&)>& human) {
    int rc = exit_ok;
    auto res = call(method, params, rc);
    if (!res) {
        return rc;
    }
    if (opt.json) {
        print_json(*res);
    } else {
        human(*res);
    }
    return exit_ok;
}

int context::place_best(const json& params) {
    qrt::client::connect_options co;
    co.connect_timeout = std::chrono::milliseconds(_connect_timeout_ns / 1'000'000);
    co.call_timeout = std::chrono::milliseconds(_timeout_ns / 1'000'000);
    std::vector<std::unique_ptr<connection>> owned(opt.sockets.size());
    std::vector<connection*> agents(opt.sockets.size(), nullptr);
    std::vector<std::optional<call_error>> unreachable(opt.sockets.size());
    for (std::size_t i = 0; i < opt.sockets.size(); ++i) {
        auto r = connection::open(opt.sockets[i], co);
        if (auto* e = std::get_if<call_error>(&r)) {
            unreachable[i] = *e;
            continue;
        }
        owned[i] = std::move(std::get<0>(r));
        agents[i] = owned[i].get();
    }
    std::vector<connection*> live;
    std::vector<std::size_t> index;
    for (std::size_t i = 0; i < agents.size(); ++i) {
        if (agents[i] != nullptr) {
            live.push_back(agents[i]);
            index.push_back(i);
        }
    }
    const qrt::client::placement p = qrt::client::place_best(live, params);
    std::vector<std::optional<call_error>> errors = unreachable;
    for (std::size_t k = 0; k < index.size(); ++k) {
        errors[index[k]] = p.errors[k];
    }
    for (std::size_t i = 0; i < errors.size(); ++i) {
        if (errors[i]) {
            _err << "qrtctl: " << opt.sockets[i] << ": slots.reserve: " << errors[i]->message
                 << " (" << errors[i]->reason << ")\n";
        }
    }
    if (p.chosen == qrt::client::placement::none) {
        const call_error* first = nullptr;
        for (const auto& e : errors) {
            if (e && (first == nullptr || (first->is_local() && !e->is_local()))) {
                first = &*e;
            }
        }
        return fail("slots.reserve", *first);
    }
    const std::size_t winner = index[p.chosen];
    if (opt.json) {
        json agents_json = json::array();
        for (std::size_t i = 0; i < errors.size(); ++i) {
            agents_json.push_back(json{{"socket", opt.sockets[i]},
                                       {"held", !errors[i].has_value()},
                                       {"reason", errors[i] ? errors[i]->reason : ""}});
        }
        print_json(json{{"socket", opt.sockets[winner]},
                        {"chosen", winner},
                        {"reservation", p.reservation},
                        {"agents", agents_json}});
    } else {
        _out << "socket          " << opt.sockets[winner] << " (best of "
             << opt.sockets.size() << ")\n";
        show_reserved(p.reservation);
    }
    return exit_ok;
}

void context::print_error_json(const call_error& e) {
    json err{{"code", e.code}, {"reason", e.reason}, {"message", e.message},
             {"exit_code", qrt::client::exit_code_for(e.reason)}};
    if (!e.data.is_null()) {
        err["data"] = e.data;
    }
    if (e.is_local()) {
        err["errno"] = e.sys_errno;
    }
    print_json(json{{"error", std::move(err)}});
}

}  // namespace qrtctl
