// libFuzzer target for the control-socket request path: bytes go through the
// server's line framer, then the JSON-RPC engine (parse, validation, batches,
// role checks) into the real method registry, whose ledger-backed methods run
// on an in-memory ledger.  Checked on every input:
//   - every reply is exactly one line of valid JSON-RPC 2.0;
//   - the ledger's invariants hold afterwards.
//
// The first input byte picks the caller's roles, so role checks are fuzzed
// too; the rest is the byte stream a client would send.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "qrt/rpc/engine.hpp"
#include "qrt/rpc/framing.hpp"
#include "qrt/rpc/methods.hpp"
#include "qrt/rpc/timeline_methods.hpp"
#include "qrt/timeline/ledger.hpp"

namespace {

namespace rpc = qrt::rpc;
namespace tl = qrt::timeline;

constexpr std::int64_t s_ns = 1'000'000'000;
// A fixed clock: every run is deterministic.
constexpr std::int64_t base_now_ns = 1'800'000'000LL * s_ns;
constexpr std::int64_t horizon_ns = 24 * 3600 * s_ns;

[[noreturn]] void fail(const char* what, std::string_view detail) {
    std::fprintf(stderr, "fuzz_rpc_request: %s: %.*s\n", what, static_cast<int>(detail.size()),
                 detail.data());
    std::abort();
}

void check_reply_line(std::string_view text) {
    if (text.empty() || text.back() != '\n' || text.find('\n') != text.size() - 1) {
        fail("a reply must be exactly one line", text);
    }
    const auto j = rpc::json::parse(text, nullptr, false);
    if (j.is_discarded()) {
        fail("a reply is not valid JSON", text);
    }
    const auto check_one = [&](const rpc::json& r) {
        if (!r.is_object() || r.value("jsonrpc", "") != "2.0" || !r.contains("id") ||
            (r.contains("result") == r.contains("error"))) {
            fail("not a JSON-RPC 2.0 response", text);
        }
        if (r.contains("error")) {
            const auto& e = r.at("error");
            if (!e.at("code").is_number_integer() || !e.at("data").at("reason").is_string()) {
                fail("an error without code or data.reason", text);
            }
            // A handler that threw something other than an rpc_failure: bad
            // input must get an error naming the problem, not this.
            if (e.at("data").at("reason") == "internal_error") {
                fail("an internal error", text);
            }
        }
    };
    if (j.is_array()) {
        if (j.empty()) {
            fail("an empty batch reply", text);
        }
        for (const auto& r : j) {
            check_one(r);
        }
    } else {
        check_one(j);
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    spdlog::set_level(spdlog::level::off);  // denied-call warnings are expected
    return 0;
}

namespace {

// The ledger and the engine an input runs against, built once per policy
// and rebuilt only after an input that changed the ledger: most inputs are
// refused (parse errors, bad params, roles) and leave it as it was, and
// building it (windows, gaps, the method registry) was a fifth of every
// execution.  ledger::generation() moves on every change of a reservation
// or a window, so an unchanged generation means the next input starts from
// the same state as a fresh one.  The periodic cycles start on the half
// hour: the clock's millisecond ticks (base_now_ns + n ms) never reach a
// new cycle at the horizon, so reading the clock generates no window.
struct world {
    std::unique_ptr<tl::ledger> ledger;
    rpc::agent_hooks hooks;  // the methods keep a pointer to it
    rpc::engine eng;
    std::int64_t tick = 0;
    std::uint64_t generation = 0;

    explicit world(const char* policy) : eng(limits()) {
        std::vector<tl::qpu_spec> qpus;
        qpus.push_back(tl::qpu_spec{"q0", tl::periodic_calibration{3600 * s_ns, 60 * s_ns, 1800 * s_ns,
                                                                   0.99, 7200 * s_ns}});
        qpus.push_back(tl::qpu_spec{"qp", tl::pushed_calibration{}});
        tl::ledger_options lo;
        lo.policy = policy;
        // A day ahead, not the default week: 24 periodic windows instead of
        // 168.  Windows and gaps are the same code either way, and requests
        // beyond the horizon still meet "no window".
        lo.horizon_ns = horizon_ns;
        auto opened = tl::ledger::open(std::move(qpus), lo, "", base_now_ns);
        if (!opened) {
            fail("ledger::open", opened.err().message);
        }
        ledger = std::move(*opened);
        hooks.status = [] { return rpc::json{{"health", "ok"}}; };
        rpc::register_agent_methods(eng, hooks);
        rpc::timeline_options to;
        to.now_ns = [this] { return base_now_ns + (tick++) * 1'000'000; };
        to.max_payload_bytes = 1024;
        rpc::register_timeline_methods(eng, *ledger, to);
        generation = ledger->generation();
    }

    static rpc::engine_limits limits() {
        rpc::engine_limits lim;
        // Small, so the fuzzer reaches the limit with short inputs (-max_len
        // 16384): every byte of an input costs time in every execution.
        lim.max_line_bytes = 4096;
        lim.max_batch = 32;
        lim.max_depth = 32;
        return lim;
    }
};

std::unique_ptr<world> worlds[2];

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) {
        return 0;
    }
    std::unique_ptr<world>& slot = worlds[(data[0] & 0x10U) != 0 ? 1 : 0];
    if (!slot) {
        slot = std::make_unique<world>((data[0] & 0x10U) != 0 ? "priority-preempt" : "edf-backfill");
    }
    world& w = *slot;
    w.tick = 0;
    rpc::engine& eng = w.eng;
    const rpc::engine_limits lim = eng.limits();
    tl::ledger_options lo;  // the defaults world() keeps (max_lease_ns)

    rpc::session s;
    s.id = 1;
    s.peer.uid = 1000;
    s.peer.gid = 1000;
    s.peer.user_name = (data[0] & 0x20U) != 0 ? "alice" : "bob";
    s.tenant = s.peer.user_name;
    s.roles = rpc::role_set(static_cast<std::uint8_t>(data[0] & 0x0FU));
    std::size_t pushed = 0;
    s.push = [&pushed](std::string_view line) {
        if (line.empty() || line.back() != '\n' || line.find('\n') != line.size() - 1) {
            fail("a notification must be one line", line);
        }
        const auto j = rpc::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object() || j.contains("id") ||
            j.value("method", "") != "events.event") {
            fail("not an events.event notification", line);
        }
        ++pushed;
    };
    eng.attach(s);

    rpc::line_framer framer(lim.max_line_bytes);
    // Feed the stream in uneven pieces, as recv() would.
    std::size_t off = 1;
    std::size_t piece = 1 + (data[0] >> 6U) * 97U;
    while (off < size) {
        const std::size_t n = std::min(piece, size - off);
        framer.append(std::string_view(reinterpret_cast<const char*>(data + off), n));
        off += n;
        piece = piece * 3 + 1;
        bool closed = false;
        while (true) {
            const auto it = framer.next();
            if (it.st == rpc::line_framer::status::need_more) {
                break;
            }
            if (it.st == rpc::line_framer::status::too_long) {
                check_reply_line(eng.line_too_long_reply(it.seen_bytes));
                closed = true;  // the server closes the connection here
                break;
            }
            const rpc::line_reply r = eng.handle_line(it.line, s);
            if (!r.text.empty()) {
                check_reply_line(r.text);
            }
            eng.drain_event_sources();
        }
        if (closed) {
            break;
        }
        framer.compact();
    }
    // Housekeeping as the daemon runs it, past the horizon and the longest
    // lease: every lease expires, every undispatched job is missed, events
    // flow.  Only after an input that changed the ledger: on an unchanged
    // one it has nothing to expire.
    const bool changed = w.ledger->generation() != w.generation;
    if (changed) {
        rpc::ledger_housekeeping(eng, *w.ledger, base_now_ns + horizon_ns + 2 * lo.max_lease_ns);
        const auto broken = w.ledger->check_invariants();
        if (!broken.empty()) {
            fail("ledger invariant", broken.front());
        }
    }
    eng.detach(s);
    if (changed) {
        slot.reset();  // the next input starts from a fresh ledger
    }
    (void)pushed;
    return 0;
}
