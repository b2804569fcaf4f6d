#include "qrt/rpc/tenant_limits.hpp"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

namespace qrt::rpc {

namespace {

[[noreturn]] void refuse(std::string_view quota, std::string message, json limit, json used) {
    throw rpc_failure("quota_exceeded", std::move(message),
                      json{{"quota", std::string(quota)}, {"limit", std::move(limit)}, {"used", std::move(used)}});
}

}  // namespace

rtcore::result<tenant_limits> tenant_limits::compile(const tenant_policy& policy) {
    tenant_limits t;
    t._policy = policy;
    t._policy.request_burst = std::max<std::uint32_t>(1, policy.request_burst);
    for (const auto& [text, max] : policy.priority_ceilings) {
        auto p = resolve_principal(text);
        if (!p) {
            return rtcore::error::invalid(
                fmt::format("tenants.priority_ceilings: {}", p.err().message));
        }
        t._ceilings.emplace_back(std::move(*p), max);
    }
    for (const auto& text : policy.delegates) {
        auto p = resolve_principal(text);
        if (!p) {
            return rtcore::error::invalid(fmt::format("tenants.delegates: {}", p.err().message));
        }
        t._delegates.push_back(std::move(*p));
    }
    t._policy.max_delegated_tenants = std::max<std::size_t>(1, policy.max_delegated_tenants);
    return t;
}

std::int32_t tenant_limits::priority_ceiling(const session& s) const {
    if (!s.delegate.empty()) {
        // The session's peer is the delegate's: what names that peer is the
        // delegate's own ceiling, never one for every tenant it books for.
        return _policy.delegated_max_priority;
    }
    std::optional<std::int32_t> best;
    for (const auto& [who, max] : _ceilings) {
        if (principal_matches(who, s.peer)) {
            best = best ? std::max(*best, max) : max;
        }
    }
    if (best) {
        return *best;
    }
    return s.roles.holds(role::admin) ? _policy.admin_max_priority
                                      : _policy.scheduler_max_priority;
}

void tenant_limits::check_priority(const session& s, std::int32_t priority) const {
    const std::int32_t ceiling = priority_ceiling(s);
    if (priority > ceiling) {
        refuse(quota_priority,
               fmt::format("priority {} is above tenant {}'s ceiling {} (tenants.{})", priority,
                           s.tenant, ceiling,
                           !s.delegate.empty()           ? "delegated_max_priority"
                           : s.roles.holds(role::admin) ? "admin_max_priority or priority_ceilings"
                                                        : "scheduler_max_priority or "
                                                          "priority_ceilings"),
               ceiling, priority);
    }
}

void tenant_limits::check_booking(const session& s, const timeline::tenant_usage& used,
                                  std::size_t count, std::int64_t duration_ns,
                                  std::uint64_t payload_bytes) const {
    if (s.roles.holds(role::admin)) {
        return;
    }
    if (count > 0 && used.reservations + count > _policy.max_reservations) {
        refuse(quota_reservations,
               fmt::format("tenant {} holds {} reservations; {} more would pass its quota of {} "
                           "(tenants.max_reservations)",
                           s.tenant, used.reservations, count, _policy.max_reservations),
               _policy.max_reservations, used.reservations);
    }
    const auto n = static_cast<std::int64_t>(count);
    if (count > 0 && duration_ns > 0 &&
        (duration_ns > _policy.max_booked_ns / n ||
         used.booked_ns + duration_ns * n > _policy.max_booked_ns)) {
        refuse(quota_booked_time,
               fmt::format("tenant {} has {} ns of QPU time booked; {} ns more would pass its "
                           "quota of {} ns (tenants.max_booked_ns)",
                           s.tenant, used.booked_ns, duration_ns * n, _policy.max_booked_ns),
               _policy.max_booked_ns, used.booked_ns);
    }
    if (payload_bytes > 0 &&
        (payload_bytes > _policy.max_payload_bytes ||
         used.payload_bytes + payload_bytes * std::max<std::size_t>(count, 1) >
             _policy.max_payload_bytes)) {
        refuse(quota_payload_bytes,
               fmt::format("tenant {}'s jobs hold {} payload bytes; {} more would pass its quota "
                           "of {} (tenants.max_payload_bytes)",
                           s.tenant, used.payload_bytes, payload_bytes, _policy.max_payload_bytes),
               _policy.max_payload_bytes, used.payload_bytes);
    }
}

bool tenant_limits::near_term_applies(const session& s, std::int64_t not_before_ns,
                                      std::int64_t now_ns) const {
    return !s.roles.holds(role::admin) && not_before_ns < now_ns + _policy.near_term_ns;
}

void tenant_limits::check_near_term(const session& s, std::int64_t booked_near_ns, std::size_t count,
                                    std::int64_t duration_ns, std::int64_t now_ns) const {
    if (s.roles.holds(role::admin) || count == 0 || duration_ns <= 0) {
        return;
    }
    // A reservation longer than the near term fills at most all of it.
    const std::int64_t each = std::min(duration_ns, _policy.near_term_ns);
    const auto n = static_cast<std::int64_t>(count);
    if (each <= (_policy.max_near_term_ns - booked_near_ns) / n) {
        return;
    }
    const std::int64_t past = now_ns + _policy.near_term_ns;
    throw rpc_failure(
        "quota_exceeded",
        fmt::format("tenant {} has {} ns booked within the next {} ns; {} ns more would pass its "
                    "near-term share of {} ns (tenants.max_near_term_ns, tenants.near_term_ns): "
                    "ask for not_before_ns >= {}",
                    s.tenant, booked_near_ns, _policy.near_term_ns, each * n,
                    _policy.max_near_term_ns, past),
        json{{"quota", std::string(quota_near_term)},
             {"limit", _policy.max_near_term_ns},
             {"used", booked_near_ns},
             {"not_before_ns", past}});
}

void tenant_limits::admit(const session& s, std::int64_t now_ns, std::uint64_t requests) {
    if (_policy.max_requests_per_s == 0 || s.roles.holds(role::admin)) {
        return;
    }
    const double burst = _policy.request_burst;
    const double rate_per_ns = _policy.max_requests_per_s / 1e9;
    auto it = _buckets.find(s.tenant);
    if (it == _buckets.end()) {
        if (_buckets.size() >= max_tracked_tenants) {
            prune(now_ns);
        }
        it = _buckets.emplace(s.tenant, bucket{burst, now_ns}).first;
    }
    bucket& b = it->second;
    if (now_ns > b.refilled_ns) {
        b.tokens = std::min(burst, b.tokens + static_cast<double>(now_ns - b.refilled_ns) * rate_per_ns);
        b.refilled_ns = now_ns;
    }
    const double cost = std::min(burst, static_cast<double>(std::max<std::uint64_t>(1, requests)));
    if (b.tokens < cost) {
        refuse(quota_requests,
               fmt::format("tenant {} sends more than {} requests per second (burst {}; every "
                           "line counts, one request per started {} bytes; "
                           "tenants.max_requests_per_s)",
                           s.tenant, _policy.max_requests_per_s, _policy.request_burst,
                           _policy.request_bytes),
               _policy.max_requests_per_s, nullptr);
    }
    b.tokens -= cost;
}

bool tenant_limits::may_delegate(const session& s) const noexcept {
    return std::any_of(_delegates.begin(), _delegates.end(),
                       [&](const principal& who) { return principal_matches(who, s.peer); });
}

session tenant_limits::delegated(const session& s, std::string_view name) const {
    // A Kubernetes namespace is a DNS label: what it may hold is all a
    // tenant named here may hold, so that the name cannot reach into
    // another delegate's tenants, a user's, or a log line.
    const bool label = !name.empty() && name.size() <= 63 && name.front() != '-' &&
                       name.back() != '-' &&
                       std::all_of(name.begin(), name.end(), [](char c) {
                           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
                       });
    if (!label) {
        throw invalid_params("on_behalf_of",
                             fmt::format("on_behalf_of must be 1 to 63 of [a-z0-9-], not starting "
                                         "or ending with '-' (a Kubernetes namespace); got '{}'",
                                         name.substr(0, 80)));
    }
    if (!s.delegate.empty() || !may_delegate(s)) {
        throw rpc_failure("permission_denied",
                          fmt::format("on_behalf_of needs the caller in tenants.delegates; uid {} "
                                      "({}) is not",
                                      s.peer.uid, s.tenant),
                          json{{"field", "on_behalf_of"}});
    }
    session acting;
    acting.id = s.id;
    acting.peer = s.peer;
    acting.roles = role_set(static_cast<std::uint8_t>(s.roles.bits() &
                                                      ~static_cast<std::uint8_t>(role::admin)));
    acting.tenant = fmt::format("{}/{}", s.tenant, name);
    acting.delegate = s.tenant;
    return acting;
}

void tenant_limits::check_delegated_tenants(const session& s, std::size_t holding,
                                            bool holds_self) const {
    if (s.delegate.empty() || holds_self || holding < _policy.max_delegated_tenants) {
        return;
    }
    refuse(quota_delegated_tenants,
           fmt::format("delegate {} holds bookings for {} tenants; {} would pass its limit of {} "
                       "(tenants.max_delegated_tenants)",
                       s.delegate, holding, s.tenant, _policy.max_delegated_tenants),
           _policy.max_delegated_tenants, holding);
}

void tenant_limits::prune(std::int64_t now_ns) {
    // A bucket that has refilled holds nothing a new one would not.
    const double burst = _policy.request_burst;
    const double rate_per_ns = _policy.max_requests_per_s / 1e9;
    std::erase_if(_buckets, [&](const auto& kv) {
        const bucket& b = kv.second;
        return b.tokens + static_cast<double>(now_ns - b.refilled_ns) * rate_per_ns >= burst;
    });
    if (_buckets.size() >= max_tracked_tenants) {
        // Every tracked tenant is busy: drop the fullest, which loses the
        // least of what they owe.
        auto fullest = std::max_element(_buckets.begin(), _buckets.end(), [](const auto& a, const auto& b) {
            return a.second.tokens < b.second.tokens;
        });
        _buckets.erase(fullest);
    }
}

}  // namespace qrt::rpc
