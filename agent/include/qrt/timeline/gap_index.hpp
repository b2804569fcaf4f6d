#pragma once
// Free time of one QPU: the calibration windows minus the busy intervals,
// kept as disjoint gaps that never cross a window boundary.  A treap keyed by
// gap start, each node augmented with the longest gap in its subtree, answers
// "leftmost gap starting at or after t that is at least len long" in
// O(log n), which is what keeps a query at 100k reservations about as cheap
// as one at 1k.

#include <cstdint>
#include <optional>
#include <vector>

namespace qrt::timeline {

class gap_index {
public:
    struct gap {
        std::int64_t start_ns = 0;
        std::int64_t end_ns = 0;
        std::int64_t length_ns() const noexcept { return end_ns - start_ns; }
        bool operator==(const gap&) const = default;
    };

    explicit gap_index(std::uint64_t seed = 0x9e3779b97f4a7c15ULL) : _rng(seed | 1U) {}

    void clear();
    std::size_t size() const noexcept { return _size; }
    // The caller guarantees start < end and no overlap with existing gaps.
    void insert(gap g);
    bool erase(std::int64_t start_ns);
    std::optional<gap> find(std::int64_t start_ns) const;
    // The gap with start <= t < end.
    std::optional<gap> containing(std::int64_t t_ns) const;
    // The leftmost gap with start >= min_start_ns and length >= len_ns.
    std::optional<gap> first_fit(std::int64_t min_start_ns, std::int64_t len_ns) const;
    std::optional<gap> first() const;
    std::vector<gap> to_vector() const;

private:
    struct node {
        std::int64_t start_ns;
        std::int64_t end_ns;
        std::int64_t max_len_ns;
        std::uint32_t prio;
        std::int32_t left;
        std::int32_t right;
    };
    std::int32_t alloc(gap g);
    void update(std::int32_t n) noexcept;
    std::int64_t max_len(std::int32_t n) const noexcept;
    // l gets keys < key, r gets keys >= key.
    void split(std::int32_t t, std::int64_t key, std::int32_t& l, std::int32_t& r);
    std::int32_t merge(std::int32_t l, std::int32_t r);
    std::int32_t first_fit_at(std::int32_t n, std::int64_t min_start_ns, std::int64_t len_ns) const;
    node& at(std::int32_t n) { return _nodes[static_cast<std::size_t>(n)]; }
    const node& at(std::int32_t n) const { return _nodes[static_cast<std::size_t>(n)]; }

    std::vector<node> _nodes;
    std::vector<std::int32_t> _free;
    std::int32_t _root = -1;
    std::size_t _size = 0;
    std::uint64_t _rng;
};

}  // namespace qrt::timeline
