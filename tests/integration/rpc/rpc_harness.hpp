#pragma once
// The control socket's test harness: a real ledger (with a SQLite store),
// engine, server on a temporary UNIX socket and the event loop on a thread;
// real client sockets talk to it (qrt_test/rpc_client.hpp).  Shared by the
// server's tests (server_test.cpp) and the calibration blocks' (calibration_test.cpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "qrt/event_loop.hpp"
#include "qrt/rpc/methods.hpp"
#include "qrt/rpc/server.hpp"
#include "qrt/rpc/timeline_methods.hpp"
#include "qrt/timeline/ledger.hpp"
#include "qrt_test/rpc_client.hpp"
#include "rtcore/clock.hpp"

namespace qrt::testing::rpc_harness {

using qrt::rpc::json;
namespace rpc = qrt::rpc;
namespace tl = qrt::timeline;


constexpr std::int64_t s_ns = 1'000'000'000;

// The raw JSON-RPC client of the tests (qrt_test/rpc_client.hpp).
using client = qrt::testing::rpc_client;
using qrt::testing::reason_of;

// The periodic QPU: cycles of 10 s, the first 1 s of each is calibration.
constexpr std::int64_t period_ns = 10 * s_ns;
constexpr std::int64_t blackout_ns = 1 * s_ns;

struct harness_options {
    rpc::role_map roles;
    rpc::server_options server;
    bool with_store = true;
    std::filesystem::path dir;  // reuse (and keep) this state directory
    // [tenants] limits; the request-rate bucket runs on a clock frozen at
    // 0 (no refill), so what it refuses does not depend on timing.
    std::optional<rpc::tenant_policy> tenants;
    // The request-rate bucket on CLOCK_MONOTONIC instead (it refills).
    bool tenants_real_clock = false;
    // qpus.list's extra per-QPU details ("device", as the daemon serves it).
    std::function<json(std::string_view)> qpu_details;
    // Changes to the ledger's options (calibration blocks' policy, ...).
    std::function<void(tl::ledger_options&)> tune_ledger;
};

// Ledger + engine + server + loop thread.
class harness {
public:
    explicit harness(harness_options o = {}) {
        static std::atomic<int> counter{0};
        keep_dir = !o.dir.empty();
        dir = keep_dir ? o.dir
                       : std::filesystem::temp_directory_path() /
                             fmt::format("qrt-rpc-{}-{}", ::getpid(), counter++);
        std::filesystem::create_directories(dir);
        socket_path = (dir / "qrtd.sock").string();

        std::vector<tl::qpu_spec> qpus;
        qpus.push_back(tl::qpu_spec{"q0", tl::periodic_calibration{period_ns, blackout_ns, 0, 0.99, 0}});
        qpus.push_back(tl::qpu_spec{"q1", tl::periodic_calibration{period_ns, blackout_ns, 0, 0.99, 0}});
        qpus.push_back(tl::qpu_spec{"qp", tl::pushed_calibration{}});
        tl::ledger_options lo;
        lo.policy = "edf-backfill";
        if (o.tune_ledger) {
            o.tune_ledger(lo);
        }
        auto l = tl::ledger::open(std::move(qpus), lo,
                                  o.with_store ? (dir / "ledger.db").string() : std::string(),
                                  now());
        if (!l) {
            throw std::runtime_error("ledger::open: " + l.err().message);
        }
        ledger = std::move(*l);

        auto a = rpc::authorizer::compile(o.roles);
        if (!a) {
            throw std::runtime_error(a.err().message);
        }
        auth = std::make_unique<rpc::authorizer>(std::move(*a));
        rpc::engine_limits lim;
        lim.max_line_bytes = o.server.max_line_bytes;
        lim.max_batch = o.server.max_batch;
        lim.max_depth = o.server.max_depth;
        eng = std::make_unique<rpc::engine>(lim);
        o.server.socket_path = socket_path;
        o.server.socket_activation = false;
        srv = std::make_unique<rpc::server>(loop, *eng, *auth, o.server);
        hooks.status = [] { return json{{"health", "ok"}, {"probes", "unavailable (test)"}}; };
        hooks.transport = [this] { return srv->stats(); };
        rpc::register_agent_methods(*eng, hooks);
        rpc::timeline_options to;
        to.now_ns = [this] { return now(); };
        to.max_payload_bytes = 4096;
        to.qpu_details = o.qpu_details;
        if (o.tenants) {
            auto t = rpc::tenant_limits::compile(*o.tenants);
            if (!t) {
                throw std::runtime_error(t.err().message);
            }
            auto limits = std::make_shared<rpc::tenant_limits>(std::move(*t));
            to.limits = limits;
            const bool real_clock = o.tenants_real_clock;
            eng->set_admission([limits, real_clock](rpc::session& s, std::uint64_t requests) {
                limits->admit(s, real_clock ? rtcore::monotonic_now_ns() : 0, requests);
            });
        }
        rpc::register_timeline_methods(*eng, *ledger, to);
        srv->set_metrics_source([this] { return rpc::metrics_text(*eng, hooks); });
        auto st = srv->start();
        if (!st) {
            throw std::runtime_error(st.err().message);
        }
        thread = std::thread([this] { loop.run(); });
    }

    ~harness() {
        std::promise<void> done;
        loop.post([&] {
            srv->stop();
            done.set_value();
        });
        done.get_future().wait();
        loop.stop();
        thread.join();
        srv.reset();
        if (!keep_dir) {
            std::filesystem::remove_all(dir);
        }
    }

    // The test clock: real time plus a skew the test can advance.
    std::int64_t now() const { return rtcore::realtime_now_ns() + skew_ns.load(); }

    // Run f on the loop thread and wait for it.
    template <typename F>
    auto on_loop(F&& f) -> decltype(f()) {
        std::packaged_task<decltype(f())()> task(std::forward<F>(f));
        auto fut = task.get_future();
        loop.post([&task] { task(); });
        return fut.get();
    }

    // Start of a calibration window about `ahead` from now (inside it, past
    // the blackout).
    std::int64_t window_start(std::int64_t ahead_ns) const {
        const std::int64_t t = now() + ahead_ns;
        return (t / period_ns + 1) * period_ns + blackout_ns;
    }

    std::filesystem::path dir;
    bool keep_dir = false;
    std::string socket_path;
    std::atomic<std::int64_t> skew_ns{0};
    qrt::event_loop loop;
    std::unique_ptr<tl::ledger> ledger;
    std::unique_ptr<rpc::authorizer> auth;
    std::unique_ptr<rpc::engine> eng;
    rpc::agent_hooks hooks;
    std::unique_ptr<rpc::server> srv;
    std::thread thread;
};

inline rpc::role_map only(const std::string& role_name, const std::string& who) {
    rpc::role_map m;
    if (role_name == "reader") {
        m.reader = {who};
    } else if (role_name == "scheduler") {
        m.scheduler = {who};
    } else if (role_name == "calibration") {
        m.calibration = {who};
    } else if (role_name == "admin") {
        m.admin = {who};
    }
    return m;
}

inline std::string me() { return fmt::format("uid:{}", ::getuid()); }

inline harness_options admin_options() {
    harness_options o;
    o.roles = only("admin", me());
    return o;
}

inline json request_at(std::int64_t start_ns, std::int64_t duration_ns, const std::string& qpu = "q0") {
    return json{{"duration_ns", duration_ns},
                {"not_before_ns", start_ns},
                {"deadline_ns", start_ns + duration_ns},
                {"qpus", {qpu}}};
}


}  // namespace qrt::testing::rpc_harness
