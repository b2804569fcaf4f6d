// bench_json_dump: ways of appending a serialised nlohmann::json to a reused
// reply buffer: no nlohmann::detail in the agent, so the speed is kept
// through a public API, and the RPC benchmark decides which.
//   detail    nlohmann::detail::serializer over an output_adapter (what
//             json_rpc.cpp did; here only as the reference)
//   dump      out += j.dump(...)  (public; one temporary string per call)
//   qrt       qrt::rpc::dump_to: public API only; integers, booleans, null
//             and plain-ASCII strings written directly, everything else
//             through j.dump()
// Inputs: a request id, the members of a slots.query candidate, a
// slots.reserve-like result object.  CPU time per call.
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>

#include "qrt/rpc/json_rpc.hpp"

using nlohmann::json;

namespace {

void via_detail(std::string& out, const json& j) {
    nlohmann::detail::serializer<json> ser(nlohmann::detail::output_adapter<char, std::string>(out), ' ',
                                           json::error_handler_t::replace);
    ser.dump(j, false, false, 0);
}
void via_dump(std::string& out, const json& j) { out += j.dump(-1, ' ', false, json::error_handler_t::replace); }
void via_qrt(std::string& out, const json& j) { qrt::rpc::dump_to(out, j); }

const json& id_value() {
    static const json v = 12345;
    return v;
}
const std::vector<json>& candidate_members() {
    static const std::vector<json> v = {json(std::int64_t{1200000000}), json("cal-000042"),
                                        json(std::int64_t{1764633600123456789}), json(0.9876543210123),
                                        json("qpu0"), json(0.5), json(std::int64_t{1764633600023456789}),
                                        json(std::int64_t{1764634200000000000})};
    return v;
}
const json& reserve_result() {
    static const json v = {{"reservation_id", "r-00000000000012345"},
                           {"qpu", "qpu0"},
                           {"start_ns", std::int64_t{1764633600023456789}},
                           {"end_ns", std::int64_t{1764633600123456789}},
                           {"calibration_id", "cal-000042"},
                           {"fencing_token", 77},
                           {"lease_expires_ns", std::int64_t{1764633630023456789}},
                           {"state", "reserved"},
                           {"predicted_fidelity", 0.9876543210123},
                           {"idempotent_replay", false}};
    return v;
}

template <void (*F)(std::string&, const json&)>
void bm_id(benchmark::State& st) {
    std::string out;
    out.reserve(4096);
    for (auto _ : st) {
        out.clear();
        F(out, id_value());
        benchmark::DoNotOptimize(out.data());
    }
}
template <void (*F)(std::string&, const json&)>
void bm_candidate(benchmark::State& st) {
    std::string out;
    out.reserve(4096);
    for (auto _ : st) {
        out.clear();
        for (const auto& m : candidate_members()) {
            F(out, m);
        }
        benchmark::DoNotOptimize(out.data());
    }
}
template <void (*F)(std::string&, const json&)>
void bm_object(benchmark::State& st) {
    std::string out;
    out.reserve(4096);
    for (auto _ : st) {
        out.clear();
        F(out, reserve_result());
        benchmark::DoNotOptimize(out.data());
    }
}

}  // namespace

BENCHMARK(bm_id<via_detail>)->Name("id/detail");
BENCHMARK(bm_id<via_dump>)->Name("id/dump");
BENCHMARK(bm_id<via_qrt>)->Name("id/qrt");
BENCHMARK(bm_candidate<via_detail>)->Name("query_candidate/detail");
BENCHMARK(bm_candidate<via_dump>)->Name("query_candidate/dump");
BENCHMARK(bm_candidate<via_qrt>)->Name("query_candidate/qrt");
BENCHMARK(bm_object<via_detail>)->Name("reserve_result/detail");
BENCHMARK(bm_object<via_dump>)->Name("reserve_result/dump");
BENCHMARK(bm_object<via_qrt>)->Name("reserve_result/qrt");
BENCHMARK_MAIN();
