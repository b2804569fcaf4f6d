#pragma once
// Each tenant's booked time, kept as reservations are placed and vacated,
// for the near-term share of [tenants] (ledger::booked_within): the time of
// a tenant's placed reservations inside any window [from, until), in
// O(log n) of that tenant's reservations, whatever the window -- so the
// near term may slide with the clock, and step back with it, and nothing
// is recounted.
//
// Per tenant, the starts and the ends of its intervals, each in an ordered
// tree whose nodes also hold their subtree's count and sum of times
// (libstdc++'s policy-based tree, __gnu_pbds, with a node update of its
// own).  The time of [s, e) inside [a, b) is clamp(e, a, b) - clamp(s, a, b),
// and a sum of clamps over a set X is a * |X below a| + (sum of X in [a, b))
// + b * |X from b on|: four prefix queries.  Sums are taken modulo 2^64
// (CLOCK_REALTIME nanoseconds summed over thousands of intervals pass
// 2^63); the result, at most the tenant's booked time, is exact.
//
// The ledger calls add() where it puts a reservation in a QPU's busy map
// and remove() where it takes it out (occupy/vacate, the reload), with the
// same id, start and end: the index holds exactly the placed reservations
// (ledger::check_invariants compares it with a recount).
//
// Single-threaded (the event loop), like the ledger.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace qrt::timeline {

class booked_time {
public:
    booked_time();
    ~booked_time();
    booked_time(booked_time&&) noexcept;
    booked_time& operator=(booked_time&&) noexcept;
    booked_time(const booked_time&) = delete;
    booked_time& operator=(const booked_time&) = delete;

    // [start_ns, end_ns) of reservation id, booked by tenant.  Adding an
    // interval held already, or removing one not held, changes nothing.
    void add(std::string_view tenant, std::uint64_t id, std::int64_t start_ns, std::int64_t end_ns);
    void remove(std::string_view tenant, std::uint64_t id, std::int64_t start_ns, std::int64_t end_ns);
    void clear() noexcept;

    // The tenant's booked time inside [from_ns, until_ns) (0 when empty).
    std::int64_t within(std::string_view tenant, std::int64_t from_ns, std::int64_t until_ns) const;

    // Intervals held, over every tenant; tenants holding one.
    std::size_t intervals() const noexcept;
    std::size_t tenants() const noexcept;

private:
    struct impl;
    std::unique_ptr<impl> _impl;
};

}  // namespace qrt::timeline
