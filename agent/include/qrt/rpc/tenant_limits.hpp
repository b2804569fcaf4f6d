#pragma once
// What one tenant may do on the socket, so that tenants cannot hurt each
// other (qrtd.toml [tenants]):
//
//   priority ceiling   per role (scheduler, admin) or per principal; a
//                      request above it is refused.  A tenant a delegate
//                      books for (on_behalf_of) has delegated_max_priority
//   reservations       live (held, committed, dispatched) reservations
//   booked time        their summed durations
//   near term          their time within the next near_term_ns, so that
//                      one tenant cannot book all of what is soon to come
//   payload bytes      their payloads
//   requests per s     a token bucket per tenant, over all its connections,
//                      charged for every line (engine::set_admission)
//
// Every refusal is an rpc_failure with the stable reason quota_exceeded and
// data {"quota": <name>, "limit": N, "used": N}; the engine counts them by
// quota (qrt_rpc_quota_exceeded_total).  Admins are exempt from the quotas
// and the request rate, not from their priority ceiling.
//
// Single-threaded (the event loop).  The bucket table holds one entry per
// tenant seen recently: buckets that have refilled are dropped once more than
// max_tracked_tenants are held, so it stays bounded.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "qrt/rpc/auth.hpp"
#include "qrt/rpc/engine.hpp"
#include "qrt/timeline/ledger.hpp"

namespace qrt::rpc {

// The quota names data.quota takes.
inline constexpr std::string_view quota_priority = "priority";
inline constexpr std::string_view quota_reservations = "reservations";
inline constexpr std::string_view quota_booked_time = "booked_time";
inline constexpr std::string_view quota_near_term = "near_term";
inline constexpr std::string_view quota_payload_bytes = "payload_bytes";
inline constexpr std::string_view quota_requests = "requests";
inline constexpr std::string_view quota_delegated_tenants = "delegated_tenants";

struct tenant_policy {
    std::int32_t scheduler_max_priority = 0;
    std::int32_t admin_max_priority = INT32_MAX;
    // "PRINCIPAL=N" as in tenants.priority_ceilings, already split.
    std::vector<std::pair<std::string, std::int32_t>> priority_ceilings;
    std::size_t max_reservations = 1000;
    std::int64_t max_booked_ns = 3'600'000'000'000;
    // Of the next near_term_ns, what one tenant may hold (summed over QPUs).
    std::int64_t near_term_ns = 600'000'000'000;
    std::int64_t max_near_term_ns = 120'000'000'000;
    std::uint64_t max_payload_bytes = 64ULL << 20;
    std::uint32_t max_requests_per_s = 0;  // 0: unlimited
    std::uint32_t request_burst = 1;
    // A request line costs one request per started request_bytes bytes
    // (the engine's engine_limits::request_bytes; here for the message).
    std::uint32_t request_bytes = 16384;
    // tenants.delegates: principals that may act on_behalf_of a tenant
    // named in the call, and how many such tenants each may hold bookings
    // for at once.
    std::vector<std::string> delegates;
    std::size_t max_delegated_tenants = 256;
    // The priority ceiling of a tenant a delegate books for: its own, not
    // the delegate's (neither its role's nor a priority_ceilings entry that
    // matches the delegate's principal).
    std::int32_t delegated_max_priority = 0;
};

class tenant_limits {
public:
    static constexpr std::size_t max_tracked_tenants = 1024;

    // Fails naming the entry when a principal does not parse or its group
    // does not exist.
    static rtcore::result<tenant_limits> compile(const tenant_policy& policy);

    const tenant_policy& policy() const noexcept { return _policy; }

    // The highest priority this caller may ask for (a delegated session:
    // delegated_max_priority, whatever matches the delegate itself).
    std::int32_t priority_ceiling(const session& s) const;
    // Throws quota_exceeded when priority is above the caller's ceiling.
    void check_priority(const session& s, std::int32_t priority) const;
    // Throws quota_exceeded when `count` more reservations of duration_ns
    // each, carrying payload_bytes each, would take the caller's tenant
    // past a quota.  Admins pass.
    void check_booking(const session& s, const timeline::tenant_usage& used, std::size_t count,
                       std::int64_t duration_ns, std::uint64_t payload_bytes) const;
    // May a booking whose earliest start is not_before_ns land in the near
    // term (so that check_near_term must see the caller's near-term usage)?
    bool near_term_applies(const session& s, std::int64_t not_before_ns, std::int64_t now_ns) const;
    // Throws quota_exceeded (quota "near_term", data.not_before_ns: the
    // earliest start asked for that would pass) when `count` more
    // reservations of duration_ns each would take the caller's time booked
    // within [now_ns, now_ns + near_term_ns) -- booked_near_ns -- past
    // max_near_term_ns.  Admins pass.
    void check_near_term(const session& s, std::int64_t booked_near_ns, std::size_t count,
                         std::int64_t duration_ns, std::int64_t now_ns) const;
    // Takes `requests` tokens (at most the burst: a line costing more
    // empties a full bucket) from the caller's tenant bucket or throws
    // quota_exceeded, taking none.  now_ns: a monotonic clock.  Admins pass.
    void admit(const session& s, std::int64_t now_ns, std::uint64_t requests = 1);

    std::size_t tracked_tenants() const noexcept { return _buckets.size(); }

    // Is this caller one of tenants.delegates?
    bool may_delegate(const session& s) const noexcept;
    // The session a delegate's call with on_behalf_of=name runs as: tenant
    // "DELEGATE/name", the delegate's roles less admin, delegate set.
    // Throws invalid_params (field on_behalf_of) on a bad name and
    // permission_denied when the caller is no delegate.
    session delegated(const session& s, std::string_view name) const;
    // Throws quota_exceeded (quota "delegated_tenants") when a delegated
    // session would book for one tenant more than max_delegated_tenants;
    // holding is how many of the delegate's tenants hold bookings, and
    // holds_self whether the session's tenant is one of them.
    void check_delegated_tenants(const session& s, std::size_t holding, bool holds_self) const;

private:
    struct bucket {
        double tokens = 0;
        std::int64_t refilled_ns = 0;
    };
    void prune(std::int64_t now_ns);

    tenant_policy _policy;
    std::vector<std::pair<principal, std::int32_t>> _ceilings;
    std::vector<principal> _delegates;
    std::unordered_map<std::string, bucket> _buckets;
};

}  // namespace qrt::rpc
