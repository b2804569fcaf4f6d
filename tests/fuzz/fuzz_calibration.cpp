// libFuzzer target for the calibration update path: `calibration.update`
// requests go through the JSON-RPC engine into the real handler (strict
// params, read_window's per-window checks) and ledger::update_calibration
// (validation, merge with the history, re-placing or displacing the
// reservations whose window changed), with reservations, gangs and the
// passing of time in between.  The bytes drive a short session (at most 12
// steps):
//   update (structured)  windows built from the bytes, mostly plausible:
//                        overlapping, duplicate ids, zero-length, f0 and
//                        tau edges, a wrong type or an unknown member now
//                        and then; on qa, qb, the periodic qp or no QPU;
//   update (raw)         the bytes are the params text itself;
//   reserve              slots.reserve on qa/qb, single or as a gang of two;
//   time                 the clock moves on and housekeeping runs.
// The first byte picks the policy and the on-change rule (replace / fail).
// Checked after every step:
//   - every reply is one line of JSON-RPC 2.0, errors with data.reason;
//   - the ledger's invariants hold (every active reservation inside a window
//     of its calibration_id, gangs aligned, indexes consistent);
//   - after an accepted update, calibration.get returns exactly the pushed
//     windows that end after now, in order.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

#include "qrt/rpc/engine.hpp"
#include "qrt/rpc/timeline_methods.hpp"
#include "qrt/timeline/ledger.hpp"

namespace {

namespace rpc = qrt::rpc;
namespace tl = qrt::timeline;
using rpc::json;

constexpr std::int64_t s_ns = 1'000'000'000;
constexpr std::int64_t min_ns = 60 * s_ns;
constexpr std::int64_t base_now_ns = 1'800'000'000LL * s_ns;

[[noreturn]] void fail(const char* what, std::string_view detail) {
    std::fprintf(stderr, "fuzz_calibration: %s: %.*s\n", what, static_cast<int>(detail.size()),
                 detail.data());
    std::abort();
}

// The reply as JSON, after checking it is one JSON-RPC 2.0 response line.
json check_reply(std::string_view text) {
    if (text.empty() || text.back() != '\n' || text.find('\n') != text.size() - 1) {
        fail("a reply must be exactly one line", text);
    }
    json r = json::parse(text, nullptr, false);
    if (r.is_discarded() || !r.is_object() || r.value("jsonrpc", "") != "2.0" ||
        (r.contains("result") == r.contains("error"))) {
        fail("not a JSON-RPC 2.0 response", text);
    }
    if (r.contains("error") && (!r["error"].contains("code") || !r["error"]["code"].is_number_integer() ||
                                !r["error"].contains("data") || !r["error"]["data"].is_object() ||
                                !r["error"]["data"].contains("reason") ||
                                !r["error"]["data"]["reason"].is_string())) {
        fail("an error without code or data.reason", text);
    }
    return r;
}

struct world {
    std::unique_ptr<tl::ledger> ledger;
    rpc::engine eng;
    rpc::session admin;
    rpc::session sched;
    std::int64_t now = base_now_ns;
    std::uint64_t next_id = 1;

    json call(rpc::session& s, std::string_view method, const std::string& params_text) {
        std::string line = R"({"jsonrpc":"2.0","id":)" + std::to_string(next_id++) +
                           R"(,"method":")" + std::string(method) + R"(","params":)" + params_text +
                           "}";
        const rpc::line_reply r = eng.handle_line(line, s);
        eng.drain_event_sources();
        if (r.text.empty()) {
            fail("a request with an id got no reply", line);
        }
        return check_reply(r.text);
    }

    void check_ledger() const {
        const auto broken = ledger->check_invariants();
        if (!broken.empty()) {
            fail("ledger invariant", broken.front());
        }
    }
};

const char* const qpu_names[] = {"qa", "qb", "qp", "nope"};

// A structured update: windows on a 5-minute grid around now.
json make_update(FuzzedDataProvider& fdp, std::int64_t now, std::string& qpu,
                 std::vector<tl::calibration_window>& windows, bool& well_typed) {
    qpu = qpu_names[fdp.ConsumeIntegralInRange<unsigned>(0, 3)];
    json jw = json::array();
    const unsigned n = fdp.ConsumeIntegralInRange<unsigned>(0, 6);
    well_typed = true;
    for (unsigned i = 0; i < n; ++i) {
        tl::calibration_window w;
        w.calibration_id = fdp.ConsumeIntegralInRange<std::uint64_t>(0, 9);
        w.valid_from_ns = now + fdp.ConsumeIntegralInRange<std::int64_t>(-24, 48) * 5 * min_ns +
                          fdp.ConsumeIntegralInRange<std::int64_t>(-1, 1);
        w.valid_until_ns =
            w.valid_from_ns + fdp.ConsumeIntegralInRange<std::int64_t>(-1, 36) * 5 * min_ns;
        static constexpr double f0s[] = {1.0, 0.99, 0.9, 0.5, 1e-9, 0.0, 1.0000001, -0.5};
        w.f0 = f0s[fdp.ConsumeIntegralInRange<unsigned>(0, 7)];
        w.tau_ns = fdp.ConsumeIntegralInRange<std::int64_t>(-1, 4) * 30 * min_ns;
        json o{{"calibration_id", w.calibration_id},
               {"valid_from_ns", w.valid_from_ns},
               {"valid_until_ns", w.valid_until_ns}};
        const unsigned shape = fdp.ConsumeIntegralInRange<unsigned>(0, 15);
        if (shape != 1) {
            o["f0"] = w.f0;
        }
        if (shape != 2) {
            o["tau_ns"] = w.tau_ns;
        }
        if (shape == 1) {
            w.f0 = 1.0;  // the default when omitted
        }
        if (shape == 2) {
            w.tau_ns = 0;
        }
        if (shape == 3) {
            o["valid_from_ns"] = std::to_string(w.valid_from_ns);
            well_typed = false;
        } else if (shape == 4) {
            o["extra"] = true;
            well_typed = false;
        } else if (shape == 5) {
            o.erase("calibration_id");
            well_typed = false;
        } else if (shape == 6) {
            o["tau_ns"] = 1.5;
            well_typed = false;
        }
        jw.push_back(std::move(o));
        windows.push_back(w);
    }
    return json{{"qpu", qpu}, {"windows", std::move(jw)}};
}

// What the ledger must accept: a pushed QPU, ids > 0 and distinct, windows
// forward, f0 in (0, 1], tau >= 0, no overlaps.
bool acceptable(const std::string& qpu, const std::vector<tl::calibration_window>& ws) {
    if (qpu != "qa" && qpu != "qb") {
        return false;
    }
    std::vector<tl::calibration_window> sorted = ws;
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& a, const auto& b) { return a.valid_from_ns < b.valid_from_ns; });
    for (std::size_t i = 0; i < sorted.size(); ++i) {
        const auto& w = sorted[i];
        if (w.calibration_id == 0 || w.valid_until_ns <= w.valid_from_ns || !(w.f0 > 0.0 && w.f0 <= 1.0) ||
            w.tau_ns < 0) {
            return false;
        }
        for (std::size_t j = 0; j < i; ++j) {
            if (sorted[j].calibration_id == w.calibration_id) {
                return false;
            }
        }
        if (i > 0 && w.valid_from_ns < sorted[i - 1].valid_until_ns) {
            return false;
        }
    }
    return true;
}

void check_get(world& w, const std::string& qpu, const std::vector<tl::calibration_window>& pushed) {
    const json r = w.call(w.admin, "calibration.get", json{{"qpu", qpu}}.dump());
    if (!r.contains("result")) {
        fail("calibration.get failed after an accepted update", r.dump());
    }
    std::vector<tl::calibration_window> want;
    for (const auto& x : pushed) {
        if (x.valid_until_ns > w.now) {
            want.push_back(x);
        }
    }
    std::sort(want.begin(), want.end(),
              [](const auto& a, const auto& b) { return a.valid_from_ns < b.valid_from_ns; });
    const json& got = r["result"]["windows"];
    if (got.size() != want.size()) {
        fail("calibration.get does not return the pushed windows", r.dump());
    }
    for (std::size_t i = 0; i < want.size(); ++i) {
        if (got[i].value("calibration_id", std::uint64_t{0}) != want[i].calibration_id ||
            got[i].value("valid_from_ns", std::int64_t{0}) != want[i].valid_from_ns ||
            got[i].value("valid_until_ns", std::int64_t{0}) != want[i].valid_until_ns ||
            got[i].value("tau_ns", std::int64_t{-1}) != want[i].tau_ns ||
            got[i].value("f0", -1.0) != want[i].f0) {
            fail("calibration.get differs from the update", r.dump());
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    spdlog::set_level(spdlog::level::off);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) {
        return 0;
    }
    FuzzedDataProvider fdp(data, size);
    const auto mode = fdp.ConsumeIntegral<std::uint8_t>();

    std::vector<tl::qpu_spec> qpus;
    qpus.push_back(tl::qpu_spec{"qa", tl::pushed_calibration{}});
    qpus.push_back(tl::qpu_spec{"qb", tl::pushed_calibration{}});
    // Hour-long cycles keep the periodic horizon small.
    qpus.push_back(tl::qpu_spec{"qp", tl::periodic_calibration{3600 * s_ns, 60 * s_ns, 0, 0.99,
                                                               7200 * s_ns}});
    tl::ledger_options lo;
    lo.policy = (mode & 1U) != 0 ? "priority-preempt" : "edf-backfill";
    lo.calibration_change = (mode & 2U) != 0 ? tl::on_calibration_change::fail
                                             : tl::on_calibration_change::replace;
    lo.horizon_ns = 24 * 3600 * s_ns;
    auto opened = tl::ledger::open(std::move(qpus), lo, "", base_now_ns);
    if (!opened) {
        fail("ledger::open", opened.err().message);
    }
    world w{std::move(*opened), rpc::engine(rpc::engine_limits{}), {}, {}};
    rpc::timeline_options to;
    to.now_ns = [&w] { return w.now; };
    to.max_payload_bytes = 64;
    rpc::register_timeline_methods(w.eng, *w.ledger, to);
    w.admin.id = 1;
    w.admin.tenant = "ops";
    w.admin.roles = rpc::role_set(0x0F);  // every role
    w.sched.id = 2;
    w.sched.tenant = "alice";
    w.sched.roles = rpc::role_set().with(rpc::role::scheduler);

    // Start from two hours of windows on each pushed QPU.
    for (const char* q : {"qa", "qb"}) {
        std::vector<tl::calibration_window> ws{
            {1, base_now_ns - 10 * min_ns, base_now_ns + 60 * min_ns, 0.99, 3600 * s_ns},
            {2, base_now_ns + 60 * min_ns, base_now_ns + 120 * min_ns, 0.98, 0}};
        if (!w.ledger->update_calibration(q, std::move(ws), w.now)) {
            fail("seeding the windows failed", q);
        }
    }

    for (int step = 0; step < 12 && fdp.remaining_bytes() > 0; ++step) {
        switch (fdp.ConsumeIntegralInRange<unsigned>(0, 4)) {
        case 0:
        case 1: {
            std::string qpu;
            std::vector<tl::calibration_window> ws;
            bool well_typed = true;
            const json params = make_update(fdp, w.now, qpu, ws, well_typed);
            const json r = w.call(w.admin, "calibration.update", params.dump());
            const bool ok = r.contains("result");
            if (well_typed && ok != acceptable(qpu, ws)) {
                fail(ok ? "an invalid update was accepted" : "a valid update was rejected", r.dump());
            }
            if (ok) {
                check_get(w, qpu, ws);
            }
            break;
        }
        case 2: {
            const std::string text = fdp.ConsumeRandomLengthString(512);
            const json r = w.call(w.admin, "calibration.update", text.empty() ? "{}" : text);
            if (r.contains("error") && r["error"]["data"]["reason"] == "internal_error") {
                fail("an internal error", r.dump());
            }
            break;
        }
        case 3: {
            const bool gang = fdp.ConsumeBool();
            json p{{"duration_ns", fdp.ConsumeIntegralInRange<std::int64_t>(1, 40) * min_ns},
                   {"idempotency_key", "k" + std::to_string(step)},
                   {"min_fidelity", fdp.ConsumeBool() ? 0.97 : 0.0}};
            if (gang) {
                p["gang_size"] = 2;
                p["qpus"] = json::array({"qa", "qb"});
            } else {
                p["qpus"] = json::array({fdp.ConsumeBool() ? "qa" : "qb"});
            }
            (void)w.call(w.sched, "slots.reserve", p.dump());
            break;
        }
        default:
            w.now += fdp.ConsumeIntegralInRange<std::int64_t>(0, 36) * 5 * min_ns;
            rpc::ledger_housekeeping(w.eng, *w.ledger, w.now);
            break;
        }
        w.check_ledger();
    }
    return 0;
}
