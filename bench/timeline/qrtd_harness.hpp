#pragma once
// What the benches that drive the real daemon share (qrt-durable-reserve,
// qrt-near-term-reserve): start `qrtd run` (untuned, host untouched, a
// write-only file:///dev/null endpoint, state on disk) on a fresh state
// directory, and pipeline slots.reserve through its UNIX socket.

#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace qrt::bench {

struct qrtd_process {
    pid_t pid = -1;
    std::string sock;
};

// The daemon's config: one QPU (period 1 s, blackout 100 ms), the caller's
// uid a reader and scheduler (never admin), the request rate unlimited and
// max_reservations 1,000,000; `timeline` and `tenants` are appended to
// those sections ("key = value" lines).
struct qrtd_config {
    std::string policy = "fifo";
    std::string horizon_ns = "600_000_000_000";  // timeline.horizon_ns
    std::size_t group_max = 256;    // timeline.commit_group_max
    std::size_t max_inflight = 64;  // rpc.max_inflight
    std::string timeline;
    std::string tenants;
};

// Starts qrtd on dir (removed first) and waits for its socket; pid -1 when
// it did not come up (its log is dir/qrtd.log).
qrtd_process start_qrtd(const std::string& qrtd, const std::filesystem::path& dir, const qrtd_config& cfg);
void stop_qrtd(qrtd_process& d);

// One pipelined client: keeps `window` slots.reserve in flight until
// `count` replies came back.  Each request's params are
// {"duration_ns":1000000,"idempotency_key":"KEY-k-i"} plus `extra` (a JSON
// member list, e.g. "\"not_before_ns\":5", or "").  Returns the error
// replies (-1: the connection broke).
long reserve_pipelined(const std::string& sock, int k, std::size_t count, std::size_t window,
                       const std::string& key, const std::string& extra = "");

// `clients` such clients at once; returns acknowledged reservations per
// second of wall time and adds the errors to `errors`.
double reserve_rate(const std::string& sock, int clients, std::size_t count, std::size_t window,
                    const std::string& key, std::size_t& errors, const std::string& extra = "");

double median(std::vector<double> v);

}  // namespace qrt::bench
