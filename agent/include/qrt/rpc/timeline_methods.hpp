#pragma once
// The ledger-backed methods.  Each handler makes ONE ledger call.  A change
// (calibration.update, slots.reserve/heartbeat/release, jobs.submit/cancel)
// is answered only once it is durable: at once without a writer, else when
// the writer's group holding it committed (the server holds the reply; a
// failed commit turns it into store_error).  Past timeline.commit_queue_max
// changes waiting, a change is refused with unavailable/commit_backlog.
// Reads are answered from memory at once.  The ledger's stable reason
// strings become data.reason verbatim.
//
//   method              role         params (strict; unknown members rejected)
//   qpus.list           reader       {}
//   calibration.get     reader       {qpu}
//   calibration.update  calibration  {qpu, windows:[{calibration_id,
//                                     valid_from_ns, valid_until_ns, f0?, tau_ns?}]}
//   slots.query         reader       request fields + max_candidates?
//   slots.reserve       scheduler    request fields + idempotency_key,
//                                    lease_ns?, gang_size?
//   slots.heartbeat     scheduler    {reservation_id, fencing_token}
//   slots.release       scheduler    {reservation_id, fencing_token}
//   jobs.submit         scheduler    {reservation_id, fencing_token, payload}
//                                    or request fields + idempotency_key + payload
//   jobs.status         scheduler    {job_id}
//   jobs.result         scheduler    {job_id}
//   jobs.cancel         scheduler    {job_id}
// request fields: duration_ns (required), not_before_ns?, deadline_ns?,
// priority?, min_fidelity?, qpus? ([names]).  payload: standard base64.
// A scheduler acts on its own tenant's reservations; an admin on anyone's.
// With opts.limits, a priority above the caller's ceiling (query, reserve,
// submit) and a reserve or submit past the tenant's quotas are refused with
// quota_exceeded; a retry with a known idempotency key is not a new booking.
// Job ids and reservation ids are the same number.

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "qrt/event_loop.hpp"
#include "qrt/rpc/engine.hpp"
#include "qrt/rpc/tenant_limits.hpp"
#include "qrt/timeline/ledger.hpp"

namespace qrt::rpc {

struct timeline_options {
    std::size_t max_payload_bytes = 512U * 1024U;  // decoded
    // CLOCK_REALTIME ns when unset (tests inject a clock).
    std::function<std::int64_t()> now_ns;
    // Extra per-QPU details for qpus.list (endpoint, dispatch CPU...).
    std::function<json(std::string_view qpu)> qpu_details;
    // Priority ceilings and per-tenant quotas ([tenants]); null: none.
    std::shared_ptr<const tenant_limits> limits;
    // Told of every calibration change, per QPU, as its event is drained
    // (the daemon re-reads the windows its dispatch guards follow).
    std::function<void(std::string_view qpu)> on_calibration;
};

// Registers the methods above and an event source draining the ledger.
// The ledger outlives the engine.
void register_timeline_methods(engine& rpc, timeline::ledger& ledger, timeline_options opts = {});

// The ledger's events as socket events (type "reservation.*", "job.*",
// "calibration.changed"; tenant-scoped except calibration).
std::vector<event> to_rpc_events(const std::vector<timeline::event>& evs);

json to_json(const timeline::reservation& r);

// The answer to the request that made a job whose commit became durable too
// late for its start (the hand-over room withdrew it, ledger::withdraw_late)
// instead of its acknowledgement: `unavailable`, data.cause "commit_late",
// with the job, its start and the next possible start (0: none fits).
rpc_failure late_commit_refusal(const timeline::late_job& j);

// expire_leases + mark_missed, then the resulting events are published.  The
// daemon calls this from a periodic loop timer (see install_housekeeping).
void ledger_housekeeping(engine& rpc, timeline::ledger& ledger, std::int64_t now_ns,
                         std::int64_t missed_tolerance_ns = 0);
rtcore::result<event_loop::timer_id> install_housekeeping(event_loop& loop, engine& rpc,
                                                          timeline::ledger& ledger,
                                                          std::chrono::milliseconds period,
                                                          std::function<std::int64_t()> now_ns = {});

}  // namespace qrt::rpc
